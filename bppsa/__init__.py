"""bppsa — back-propagation as a parallel scan, in JAX.

    import jax, bppsa
    from bppsa import cells
    cell = cells.GRU(input_size=24, hidden_size=20)
    params = cell.init(jax.random.key(0))
    hs = bppsa.rnn(cell, params, xs, h0, backward="bppsa", scan="blelloch")

Importing the package changes nothing in the process: entry points (the CLI, the benchmark
scripts) call :func:`bppsa.host.tune_allocator`; library users may opt in the same way.
"""

from . import backprop, cells, cost, host, parallel, scan
from .backprop import BACKWARDS
from .cost import CostModel, choose_backward
from .scan import SCANS, associative_scan, blelloch_scan, sequential_scan

__version__ = "0.1.0"

__all__ = [
    "cells", "scan", "cost", "host", "parallel", "rnn", "BACKWARDS", "SCANS", "CostModel", "choose_backward",
    "blelloch_scan", "associative_scan", "sequential_scan",
]


def rnn(cell, params, xs, h0, *, backward: str = "bppsa", scan: str | None = None,
        chunk_size: int | str | None = "auto", cost_model=None, mesh=None, seq_axis: str = "seq",
        batch_axis: str | None = None, precision="highest"):
    """Run ``cell`` over a sequence: xs (T, B, I), h0 (B, H) [LSTM: (h0, c0)] -> the state
    sequence hs (T, B, H) [LSTM: (hs, cs)]; ``cell.hidden(out)`` is hs for every cell.

    Without ``mesh``: :func:`bppsa.backprop.rnn` (one device; see it for ``backward``, ``scan``,
    ``chunk_size``, ``cost_model`` and ``precision``). With a ``jax.sharding.Mesh``: :func:`bppsa.parallel.rnn`,
    the time axis split over ``mesh[seq_axis]`` and the batch over ``mesh[batch_axis]``.
    """
    kw = dict(backward=backward, scan=scan, chunk_size=chunk_size, cost_model=cost_model, precision=precision)
    if mesh is None:
        return backprop.rnn(cell, params, xs, h0, **kw)
    return parallel.rnn(cell, params, xs, h0, mesh=mesh, seq_axis=seq_axis, batch_axis=batch_axis, **kw)
