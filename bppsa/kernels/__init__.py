"""Fused Pallas kernels behind the core's seams, chosen by the plan (``kernels=``).

- :mod:`bppsa.kernels.recurrence`: the sequential recurrence of an RNN, GRU or LSTM, the whole time
  loop in one kernel (:func:`fused_states`): the forward of the BPPSA and BPTT training steps;
- :mod:`bppsa.kernels.adjoint`: BPTT's adjoint loop of the same cells in one kernel
  (:func:`fused_adjoint`);
- :mod:`bppsa.kernels.scan`: the scan of affine maps in three kernels whatever the length
  (:func:`chunked_scan`, :func:`chunked_scan_factored`): BPPSA's backward scan and the Newton
  forward's linear solve, for dense, diagonal and block-diagonal Jacobians;
- :mod:`bppsa.kernels.newton`: a diagonal cell's whole Newton step (the steps, their Jacobians
  and the scan) in three kernels (:func:`fused_newton_step`);
- :mod:`bppsa.kernels.lowering`: a kernel's CUDA lowering, checked on any machine
  (:func:`cuda_module`).

``bppsa.Options(kernels=...)``: "xla" (no kernel), "pallas" (the kernels, on a GPU; elsewhere a
clear error), "interpret" (the same kernels in Pallas's interpret mode, any backend: tests and
debugging), "auto" (the default: a kernel only where a committed GPU measurement shows it fastest;
none yet, so "xla" everywhere until one does). Which stage runs which kernel, and what a problem
needs for all of its stages to have one: :func:`unsupported`. May import :mod:`bppsa.cells` and
:mod:`bppsa.errors`; the forward and the backward import it, never the reverse.
"""

from __future__ import annotations

from bppsa.cells import GRU, Cell
from bppsa.cells.structure import block_size
from bppsa.kernels import adjoint, lowering, newton, recurrence, scan
from bppsa.kernels.adjoint import fused_adjoint
from bppsa.kernels.lowering import cuda_module
from bppsa.kernels.newton import fused_newton_step
from bppsa.kernels.recurrence import fused_states, supports
from bppsa.kernels.scan import chunked_scan, chunked_scan_factored

__all__ = ["recurrence", "adjoint", "scan", "newton", "lowering", "fused_states", "fused_adjoint",
           "chunked_scan", "chunked_scan_factored", "fused_newton_step", "supports", "unsupported", "cuda_module"]

def unsupported(cell: Cell, backward: str, forward: str, state_size: int, mesh: bool = False) -> list[str]:
    """Why the fused kernels cannot run every stage of a problem; empty where they can. The stages:

    - ``forward="sequential"``: :func:`fused_states` (RNN and LSTM with hidden_size <= 64, GRU <= 32:
      :func:`bppsa.kernels.recurrence.max_hidden`, the sizes whose compiled kernels spill no register);
    - ``forward="newton"`` or ``"quasi"``: a diagonal cell's (:func:`bppsa.kernels.newton.supports`)
      whole Newton step by :func:`fused_newton_step`; any other cell's linear solve by
      :func:`chunked_scan` (blocks of at most :data:`bppsa.kernels.scan.MAX_BLOCK`: the quasi
      step's diagonal, a block-diagonal cell's blocks, else the dense state), its steps and
      Jacobians at the guess one parallel XLA pass. The convergence test stays XLA's (one pass an
      iteration) but for the diagonal cells (their kernels measure each new iterate), and so does a
      damped step's solve;
    - ``backward="bppsa"``: the scan by :func:`chunked_scan` or :func:`chunked_scan_factored` (the
      same block limit);
    - ``backward="bptt"``: the adjoint loop by :func:`fused_adjoint` (the cells of the forward kernel);
    - a mesh: none (the sequence-parallel scan has no kernel).

    Args:
      cell: the cell.
      backward: the resolved backward, "bppsa" or "bptt".
      forward: the resolved forward, "sequential", "newton" or "quasi".
      state_size: S, the flat state's size (a shape-agnostic cell's is the initial state's).
      mesh: whether the problem runs over a mesh.

    Returns:
      One phrase per stage that has no kernel for this problem.
    """
    why = []
    if mesh:
        why.append("a mesh (the sequence-parallel scan has no kernel)")
    if forward == "sequential" and not supports(cell):
        why.append(f"forward='sequential' of {_recurrence_refusal(cell, 'the fused recurrence')}; forward='newton' "
                   f"runs the fused scan for other cells)")
    block = block_size(cell) or state_size
    if forward == "newton" and block > scan.MAX_BLOCK:  # quasi: the diagonal, any size
        why.append(f"forward={forward!r} with Jacobian blocks of {block} (the fused scan takes at most "
                   f"{scan.MAX_BLOCK}: larger ones spill registers on the GPU)")
    if backward == "bppsa" and block > scan.MAX_BLOCK:
        why.append(f"backward='bppsa' with Jacobian blocks of {block} (the fused scan takes at most {scan.MAX_BLOCK}: "
                   f"larger ones spill registers on the GPU)")
    if backward == "bptt" and not supports(cell):
        why.append(f"backward='bptt' of {_recurrence_refusal(cell, 'the fused adjoint loop')})")
    return why


def _recurrence_refusal(cell: Cell, kernel: str) -> str:
    """Why the fused recurrence or adjoint loop does not run ``cell``, truly: its size, or the kind of
    cell it runs as (an adapter that runs by autodiff, a user's cell); the phrase ends inside an
    open parenthesis."""
    core, limit = cell.kernel_cell, recurrence.max_hidden(cell)
    if type(core) in recurrence.HIDDEN_LIMITS:
        return (f"{cell.display_name} with hidden_size {core.hidden_size} ({kernel} runs hidden sizes up to "
                f"{limit} for a {type(core).__name__}: larger ones spill registers on the GPU")
    runs_as = "" if type(cell).__name__ == cell.display_name else f", run as {type(cell).__module__}." \
                                                                   f"{type(cell).__qualname__}"
    return (f"{cell.display_name}{runs_as} ({kernel} runs bppsa.cells.RNN and LSTM with hidden_size <= "
            f"{limit}, GRU <= {recurrence.HIDDEN_LIMITS[GRU]}, and cells that compute exactly one of their steps, "
            f"as bppsa.nn does flax's SimpleCell, GRUCell and LSTMCell where parameters, carry and computation "
            f"share one dtype")
