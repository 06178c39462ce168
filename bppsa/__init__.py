"""bppsa — back-propagation as a parallel scan, in JAX.

Examples:
  A GRU over a sequence, and the gradient of a loss of its states, by BPPSA's scan:

  >>> import jax, jax.numpy as jnp, bppsa
  >>> from bppsa import cells
  >>> cell = cells.GRU(input_size=3, hidden_size=4)
  >>> params = cell.init(jax.random.key(0))
  >>> xs = jax.random.normal(jax.random.key(1), (8, 2, 3))  # (T, B, I), time-major
  >>> h0 = jnp.zeros((2, 4))                                # (B, H)
  >>> hs = bppsa.rnn(cell, params, xs, h0, backward="bppsa", scan="blelloch")
  >>> hs.shape                                              # (T, B, H)
  (8, 2, 4)
  >>> loss = lambda p: jnp.sum(bppsa.rnn(cell, p, xs, h0)[-1] ** 2)
  >>> grads = jax.grad(loss)(params)
  >>> jax.tree.map(jnp.shape, grads)["W_h"]
  (4, 12)

Importing the package changes nothing in the process. On CPU the first :func:`rnn` call applies
:func:`bppsa.host.tune_allocator` (``BPPSA_MALLOC_TUNING=0`` switches it off).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from jax.sharding import Mesh
from jax.typing import ArrayLike

from bppsa import backprop, backward, cells, forward, host, parallel, plan, scan
from bppsa.cells import Cell
from bppsa.forward.info import NewtonInfo
from bppsa.forward.lyapunov import lyapunov
from bppsa.plan.calibration import choose_backward
from bppsa.plan.cost import CostModel
from bppsa.plan.options import BACKWARDS, FORWARDS, Options, Plan
from bppsa.scan import SCANS, associative_scan, blelloch_scan, sequential_scan

if TYPE_CHECKING:  # for type checkers; at run time imported on first access (below)
    from bppsa import hetero, kernels, nn, sparse, sync, tasks  # noqa: F401

PyTree = Any  # a pytree of arrays (a JAX array, or tuples, lists and dicts of them)

__version__ = "0.1.0"  # the one source: pyproject.toml, docs/conf.py and `bppsa --version` read it

# Subpackages reachable as attributes after a plain ``import bppsa``, imported on first use
# (PEP 562): flax, the feed-forward chains and the distributed parts stay out of ``import bppsa``.
_LAZY = ("nn", "sparse", "tasks", "hetero", "sync", "kernels")

__all__ = [
    "rnn", "Options", "Plan", "NewtonInfo", "lyapunov", "cells", "scan", "forward", "backward", "plan", "host",
    "parallel", "backprop", "BACKWARDS",
    "FORWARDS", "SCANS", "CostModel", "nn", "sparse", "tasks", "hetero", "sync", "kernels",
    "choose_backward", "blelloch_scan", "associative_scan", "sequential_scan",
]


def rnn(cell: Cell, params: PyTree, xs: ArrayLike, h0: PyTree, options: Options | Plan | None = None, *,
        mesh: Mesh | None = None, seq_axis: str = "seq", batch_axis: str | None = None, guess: PyTree | None = None,
        return_info: bool = False, **fields: Any) -> PyTree | tuple[PyTree, NewtonInfo | None]:
    """Run ``cell`` over a sequence; differentiable w.r.t. ``params``, ``xs`` and ``h0`` (``jax.grad``,
    ``jax.jvp``, Hessian-vector products), exactly for every choice of the options.

    Without ``mesh``: :func:`bppsa.backprop.rnn` (one device). With a ``jax.sharding.Mesh``:
    :func:`bppsa.parallel.rnn`, the time axis split over ``mesh[seq_axis]`` and the batch over
    ``mesh[batch_axis]``.

    Args:
      cell: a cell (:mod:`bppsa.cells`, or your own: :doc:`/guides/cells`).
      params: the cell's parameter pytree (``cell.init(key)``).
      xs: (T, B, I) inputs, time-major.
      h0: (B, H) the initial state; for an LSTM the pair (h0, c0), each (B, H).
      options: a :class:`bppsa.Options` (default ``Options()``).
      mesh: a :class:`jax.sharding.Mesh` to split the sequence over (None: one device).
      seq_axis: the mesh axis the time is split over.
      batch_axis: the mesh axis the batch is split over (None: not split).
      guess: the parallel forward's first iterate, shaped like the result (:mod:`bppsa.forward.newton`).
      return_info: also return the parallel forward's :class:`bppsa.NewtonInfo`.
      **fields: :class:`bppsa.Options` fields as keywords (``backward``, ``forward``, ``scan``,
        ``chunk_size``, ``precision``, ``tol``, ``atol``, ``rtol``, ``max_iter``, ``damping``,
        ``on_fail``, ``cost_model``, ``combine``, ``unroll``, ``kernels``), overriding ``options``'s.

    Returns:
      The state sequence hs (T, B, H), ``hs[t]`` the state after step t + 1 (for an LSTM the
      pair (hs, cs)); ``cell.hidden(out)`` is hs for every cell. With ``return_info``, the pair
      (states, info), info a :class:`bppsa.NewtonInfo` (None for the sequential forward).

    Raises:
      bppsa.errors.UsageError: bad input, one line naming the argument and what was expected.

    Examples:
      >>> import jax, jax.numpy as jnp, bppsa
      >>> cell = bppsa.cells.RNN(input_size=3, hidden_size=4)
      >>> params = cell.init(jax.random.key(0))
      >>> xs, h0 = jnp.ones((16, 2, 3)), jnp.zeros((2, 4))
      >>> hs = bppsa.rnn(cell, params, xs, h0)
      >>> hs.shape, hs.dtype
      ((16, 2, 4), dtype('float32'))

      Every backward gives the same gradients; only the time differs:

      >>> def loss(p, backward):
      ...     return jnp.sum(bppsa.rnn(cell, p, xs, h0, backward=backward) ** 2)
      >>> g_scan = jax.grad(loss)(params, "bppsa")
      >>> g_bptt = jax.grad(loss)(params, "bptt")
      >>> bool(jnp.allclose(g_scan["W_h"], g_bptt["W_h"], atol=1e-5))
      True

      The parallel (Newton) forward, and what it did:

      >>> hs2, info = bppsa.rnn(cell, params, xs, h0, forward="newton", return_info=True)
      >>> bool(info.converged), bool(jnp.allclose(hs2, hs, atol=1e-5))
      (True, True)

      Bad input is one line naming the argument:

      >>> bppsa.rnn(cell, params, xs[:, :, :2], h0)
      Traceback (most recent call last):
      ...
      bppsa.errors.UsageError: ...
    """
    if mesh is None:
        return backprop.rnn(cell, params, xs, h0, options, guess=guess, return_info=return_info, **fields)
    return parallel.rnn(cell, params, xs, h0, options, mesh=mesh, seq_axis=seq_axis, batch_axis=batch_axis,
                        guess=guess, return_info=return_info, **fields)


def __getattr__(name: str) -> Any:
    """``bppsa.nn`` (and ``sparse``, ``tasks``, ``hetero``, ``sync``) imported on first access;
    ``bppsa.structured``, the Block cells' former module, is :mod:`bppsa.cells.block` (deprecated)."""
    import importlib
    if name in _LAZY:
        return importlib.import_module(f"{__name__}.{name}")
    if name == "structured":
        import warnings
        warnings.warn("bppsa.structured moved: the Block cells are bppsa.cells.BlockRNN, BlockGRU and BlockLSTM "
                      "(module bppsa.cells.block)", DeprecationWarning, stacklevel=2)
        return importlib.import_module("bppsa.cells.block")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
