"""bppsa — back-propagation as a parallel scan, in JAX.

    import jax, bppsa
    from bppsa import cells
    cell = cells.GRU(input_size=24, hidden_size=20)
    params = cell.init(jax.random.key(0))
    hs = bppsa.rnn(cell, params, xs, h0, backward="bppsa", scan="blelloch")

Importing the package changes nothing in the process. On CPU the first :func:`rnn` call applies
:func:`bppsa.host.tune_allocator` (``BPPSA_MALLOC_TUNING=0`` switches it off).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from bppsa import backprop, backward, cells, forward, host, parallel, plan, scan, structured
from bppsa.forward.info import NewtonInfo
from bppsa.forward.lyapunov import lyapunov
from bppsa.plan.calibration import choose_backward
from bppsa.plan.cost import CostModel
from bppsa.plan.options import BACKWARDS, FORWARDS, Options, Plan
from bppsa.scan import SCANS, associative_scan, blelloch_scan, sequential_scan

if TYPE_CHECKING:  # for type checkers; at run time imported on first access (below)
    from bppsa import hetero, kernels, nn, sparse, sync, tasks  # noqa: F401

__version__ = "0.1.0"  # the one source: pyproject.toml, docs/conf.py and `bppsa --version` read it

# Subpackages reachable as attributes after a plain ``import bppsa``, imported on first use
# (PEP 562): flax, the feed-forward chains and the distributed parts stay out of ``import bppsa``.
_LAZY = ("nn", "sparse", "tasks", "hetero", "sync", "kernels")

__all__ = [
    "rnn", "Options", "Plan", "NewtonInfo", "lyapunov", "cells", "scan", "forward", "backward", "plan", "host",
    "parallel", "structured", "backprop", "BACKWARDS",
    "FORWARDS", "SCANS", "CostModel", "nn", "sparse", "tasks", "hetero", "sync", "kernels",
    "choose_backward", "blelloch_scan", "associative_scan", "sequential_scan",
]


def rnn(cell, params, xs, h0, options: Options | None = None, *, mesh=None, seq_axis: str = "seq",
        batch_axis: str | None = None, guess=None, return_info: bool = False,
        **fields: Any) -> Any:
    """Run ``cell`` over a sequence; differentiable w.r.t. ``params``, ``xs`` and ``h0`` (``jax.grad``,
    ``jax.jvp``, Hessian-vector products), exactly for every choice of the options.

    Without ``mesh``: :func:`bppsa.backprop.rnn` (one device). With a ``jax.sharding.Mesh``:
    :func:`bppsa.parallel.rnn`, the time axis split over ``mesh[seq_axis]`` and the batch over
    ``mesh[batch_axis]``.

    Args:
      cell: a cell (:mod:`bppsa.cells`, :mod:`bppsa.structured`, or your own: docs/guides/cells.md).
      params: the cell's parameter pytree (``cell.init(key)``).
      xs: (T, B, I) inputs, time-major.
      h0: (B, H) the initial state; for an LSTM the pair (h0, c0), each (B, H).
      options: a :class:`bppsa.Options` (default ``Options()``).
      mesh: a ``jax.sharding.Mesh`` to split the sequence over (None: one device).
      seq_axis: the mesh axis the time is split over.
      batch_axis: the mesh axis the batch is split over (None: not split).
      guess: the parallel forward's first iterate, shaped like the result (:mod:`bppsa.forward.newton`).
      return_info: also return the parallel forward's :class:`bppsa.NewtonInfo`.
      **fields: :class:`bppsa.Options` fields as keywords (``backward``, ``forward``, ``scan``,
        ``chunk_size``, ``precision``, ``tol``, ``atol``, ``rtol``, ``max_iter``, ``damping``,
        ``on_fail``, ``cost_model``, ``combine``, ``unroll``, ``kernels``), overriding ``options``'s.

    Returns:
      The state sequence hs (T, B, H), hs[t] = h_{t+1} [LSTM: the pair (hs, cs)];
      ``cell.hidden(out)`` is hs for every cell. With ``return_info``: (states, info).

    Raises:
      bppsa.errors.UsageError: bad input, one line naming the argument and what was expected.
    """
    if mesh is None:
        return backprop.rnn(cell, params, xs, h0, options, guess=guess, return_info=return_info, **fields)
    return parallel.rnn(cell, params, xs, h0, options, mesh=mesh, seq_axis=seq_axis, batch_axis=batch_axis,
                        guess=guess, return_info=return_info, **fields)


def __getattr__(name: str) -> Any:
    """``bppsa.nn`` (and ``sparse``, ``tasks``, ``hetero``, ``sync``) imported on first access."""
    if name in _LAZY:
        import importlib
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
