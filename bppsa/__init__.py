"""bppsa — back-propagation as a parallel scan, in JAX.

    import jax, bppsa
    from bppsa import cells
    cell = cells.GRU(input_size=24, hidden_size=20)
    params = cell.init(jax.random.key(0))
    hs = bppsa.rnn(cell, params, xs, h0, backward="bppsa", scan="blelloch")
"""

from . import host

host.tune_allocator()  # keep XLA CPU's large temporaries in the heap (see bppsa.host)

from . import cells, scan  # noqa: E402
from .backprop import BACKWARDS, choose_backward, rnn, set_auto_policy  # noqa: E402
from .scan import SCANS, associative_scan, blelloch_scan, sequential_scan  # noqa: E402

__version__ = "0.1.0"

__all__ = [
    "cells", "scan", "rnn", "BACKWARDS", "SCANS", "choose_backward", "set_auto_policy",
    "blelloch_scan", "associative_scan", "sequential_scan",
]
