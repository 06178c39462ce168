"""The rules the plan applies, each measured: the chunk lengths of the BPPSA backward and of the
parallel forward's solves (:func:`chunk_lengths`, :func:`auto_chunk_size`, :func:`elementwise_plan`),
BPTT's and every sequential loop's ``lax.scan`` unroll (:func:`bptt_unroll`), whether the loop hoists
the input products (:func:`hoist_inputs`), whether the analytic adjoint sums the parameter gradients in
its loop (:func:`adjoint_in_loop`), ``kernels="auto"`` (:func:`choose_kernels`) and the mesh's
cross-device step (:func:`choose_combine`). Each is consulted from one place,
:meth:`bppsa.plan.options.Options.plan`, before anything runs.

The cost model that chooses the backward and the forward is :mod:`bppsa.plan.cost`; its calibration,
:mod:`bppsa.plan.calibration`.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, cast

import jax
import numpy as np

from bppsa.cells.base import gate_count
from bppsa.cells.structure import Scaled, block_size, elementwise, structure_of
from bppsa.errors import UsageError
from bppsa.scan import dense as scan_lib

if TYPE_CHECKING:
    from bppsa.cells import Cell

__all__ = ["CHUNK_BYTES", "auto_chunk_size", "ELEMENTWISE_CHUNK_BYTES", "elementwise_plan",
           "chunk_lengths", "UNROLLS", "GPU_UNROLL", "bptt_unroll", "HOIST_MAX", "hoist_inputs",
           "ADJOINT_LOOP_MIN_BATCH", "adjoint_in_loop", "choose_kernels", "choose_combine"]

# chunk_size="auto" on CPU: chunks whose Jacobians take at most this many bytes, so that each
# chunk's scan works in cache (several times faster than one chunk, the best sizes flat around this
# bound: measurements: scan-optimisation); 5120 steps at B = 1, 320 at B = 16 (RNN H = 20).
CHUNK_BYTES = 8 << 20


def auto_chunk_size(T: int, B: int, S: int, itemsize: int, backend: str | None = None,
                    structured: bool = False, block: int | None = None) -> int | None:
    """The chunk length ``chunk_size="auto"`` uses: None (one chunk) off CPU or when everything
    fits in :data:`CHUNK_BYTES`; else the largest length of the form m·2^k (32 <= m < 64, so the
    Blelloch scan pads nothing) whose largest array fits in it, at least 64: the (B, S, S)
    Jacobians per step, or for a cell with diagonal structure (``structured``: a
    :class:`bppsa.cells.Scaled` cell) half of that, the first level's products (its
    Jacobians are never formed); ``block`` k: block-diagonal Jacobians, B·S·k per step.

    Decided at trace time from ``jax.default_backend()`` and the shapes the backward sees.

    Args:
      T: the number of steps.
      B: the batch size.
      S: the flat state size.
      itemsize: the bytes of one state entry.
      backend: the backend (None: ``jax.default_backend()``).
      structured: the cell has diagonal structure (its first level's products are what is stored).
      block: k, the size of the Jacobians' diagonal blocks (None: dense, k = S).

    Returns:
      The chunk length (an int < T), or None for one chunk.
    """
    if (backend or jax.default_backend()) != "cpu":
        return None
    per_step = B * S * (block or S) * itemsize  # block: (k, k) blocks on the diagonal (heads)
    if structured:
        per_step = max(1, per_step // 2)
    if T * per_step <= CHUNK_BYTES:
        return None
    c = max(64, CHUNK_BYTES // per_step)
    k, m, _ = scan_lib.bottom_layout(c)
    c = max(64, (c >> k) << k)  # m·2^k steps: the Blelloch scan needs no padding in a full chunk
    return None if c >= T else int(c)


#: On CPU, the elementwise scans of cells with 1×1 Jacobian blocks (:func:`elementwise_plan`) run over
#: chunks whose (chunk, B, S) arrays hold at most this many bytes, so that the dozen such arrays a
#: chunk's backward makes stay in cache (measured, one core: measurements: diagonal-newton).
ELEMENTWISE_CHUNK_BYTES = 256 << 10


def elementwise_plan(T: int, B: int, S: int, itemsize: int, backend: str | None = None) -> tuple[str, int | None]:
    """``(scan, chunk_size)`` for a cell whose Jacobian blocks are 1×1 (diagonal): on CPU the
    sequential scan (the same Θ(T·B·S) work as Blelloch's, half the passes over memory) and, for
    the BPPSA backward, chunks of the largest power of two of steps (at least 16) whose (chunk, B,
    S) array fits in :data:`ELEMENTWISE_CHUNK_BYTES` (None: one chunk, when T fits); the Newton
    solves stream in one piece (they make no intermediates to keep in cache, and a chunked solve
    pays its padding and loop: 5x slower measured). Elsewhere ("blelloch", None).

    Args:
      T: the number of steps.
      B: the batch size.
      S: the flat state size.
      itemsize: the bytes of one state entry.
      backend: the backend (None: ``jax.default_backend()``).

    Returns:
      (scan, chunk_size), the scan's name and the BPPSA backward's chunk length, or None for one chunk.
    """
    if (backend or jax.default_backend()) != "cpu":
        return "blelloch", None
    c = max(16, 1 << max(0, (ELEMENTWISE_CHUNK_BYTES // max(1, B * S * itemsize)).bit_length() - 1))
    return "sequential", (None if c >= T else c)


def chunk_lengths(cell: Cell, T: int, B: int, S: int, *, backward: str, forward: str, scan: str, scan_given: bool,
                  chunk_size: int | str | None, states_itemsize: int, solve_itemsize: int,
                  backend: str | None = None) -> tuple[str, int | None, int | None]:
    """The rule for the scan and the chunk lengths on one device: (scan, the BPPSA backward's chunk
    length, the parallel forward's solves' chunk length), None where there is one piece or none.

    Args:
      cell: the cell (its Jacobian structure, :attr:`bppsa.cells.Cell.jacobian_structure`: blocks or scaled).
      T, B, S: the steps, the batch and the flat state size.
      backward: "bppsa" or "bptt" (resolved); forward: "sequential", "newton" or "quasi" (resolved).
      scan: the resolved scan's name; scan_given: whether the user named it (else a cell with 1×1
        Jacobian blocks gets the elementwise rule's scan, :func:`elementwise_plan`).
      chunk_size: the user's chunk length (an int or None: kept) or "auto" (sized here).
      states_itemsize: the bytes of one state entry (the backward's chunks); solve_itemsize: the
        parallel forward's (its iterate's dtype).
      backend: the backend the plan is for (default: ``jax.default_backend()``).

    Returns:
      (scan, chunk, solve_chunk). The backward's chunks exist for BPPSA and for a parallel forward's
      backward (BPTT by the sequential loop has none); the solves' only for a parallel forward. An
      elementwise cell's backward is chunked for its many intermediates, its solves stream in one piece.
    """
    parallel = forward != "sequential"
    chunked_backward = backward == "bppsa" or parallel
    elementwise = block_size(cell) == 1 and not scan_given
    backward_chunk = None
    if elementwise:
        scan, backward_chunk = elementwise_plan(T, B, S, states_itemsize, backend)
    if chunk_size != "auto":
        given = cast(int | None, chunk_size)
        return scan, given if chunked_backward else None, given if parallel else None
    if elementwise:
        return scan, backward_chunk if chunked_backward else None, None
    chunk = solve_chunk = None
    method = "sequential" if backward == "bptt" else scan
    if chunked_backward:
        chunk = auto_chunk_size(T, B, S, states_itemsize, backend, block=block_size(cell),
                                structured=method == "blelloch" and isinstance(structure_of(cell), Scaled))
    if parallel:  # the iterations' Jacobians: diagonal (quasi) or the cell's blocks
        block = 1 if forward == "quasi" else block_size(cell)
        solve_chunk = auto_chunk_size(T, B, S, solve_itemsize, backend, block=block)
    return scan, chunk, solve_chunk


UNROLLS = (1, 2, 4, 8, 16, 32)  # the lax.scan unroll factors bppsa's baselines try

# BPTT's unroll on CPU by the per-step work w = B·G·H² and the batch B, measured (jax.grad through
# lax.scan, float32, every unroll in UNROLLS interleaved: measurements: bptt-unroll):
# cheap steps gain most (RNN B = 1: 16; GRU / LSTM B = 1: 4); up to B = 8 unroll 2; from B = 16 the
# plain loop. Rows (largest w, largest B, unroll), first match; otherwise 1. At most _TINY_WORK
# multiply-adds in all (T·w): unroll 1 (an unrolled body costs more compile time than it saves).
_CPU_UNROLL = ((500, 1, 16), (4000, 1, 4), (math.inf, 8, 2))
_TINY_WORK = 20_000
# Off CPU: 8, a prior (H200: tuned u8 beat every plain unroll, measurements: h200; u > 8 unmeasured).
GPU_UNROLL = 8


def _hidden(cell: Cell, state_size: int | None) -> int:
    """H for BPTT's rules: the cell's hidden size, else the flat state width (``Generic``), else 1."""
    return cell.hidden_size or state_size or 1


def bptt_unroll(cell: Cell, T: int, B: int, dtype: Any = None, backend: str | None = None,
                state_size: int | None = None, backward: str = "bptt") -> int:
    """The ``lax.scan`` unroll of BPTT and of every sequential forward: on CPU by the step's work w =
    B·G·H² (``_CPU_UNROLL``; 1 if T·w <= 2·10⁴; T if T <= 16; an elementwise step by ``backward``, "bptt"
    or a forward alone), elsewhere :data:`GPU_UNROLL`; never more than T. ``state_size``: flat width S.

    Args:
      cell: the cell the loop steps.
      T: the number of steps.
      B: the batch size.
      dtype: the inputs' dtype (None: float32).
      backend: the backend (None: ``jax.default_backend()``).
      state_size: the flat state width S (read where the cell has no hidden size, ``Generic``).
      backward: "bptt" (autodiff differentiates the loop), "bppsa" or "forward" (a forward alone).

    Returns:
      The unroll factor, an int in [1, T].

    Raises:
      bppsa.errors.UsageError: ``backward`` none of "bptt", "bppsa", "forward".
    """
    autodiff = _autodiff(backward)
    if (backend or jax.default_backend()) != "cpu":
        u = GPU_UNROLL
    else:
        H = _hidden(cell, state_size)
        w = B * gate_count(cell) * H * H
        if T * w <= _TINY_WORK:
            u = 1
        elif T <= 16:  # short sequences: no loop at all (measurements: bptt-unroll)
            u = T
        elif elementwise(cell):
            u = _elementwise_loop(cell, T, B, dtype, autodiff, H)[1]
        else:
            u = next((u for limit, b, u in _CPU_UNROLL if w <= limit and B <= b), 1)
    return max(1, min(u, int(T)))


#: The sequential forward computes the inputs' part of every step before its loop (:func:`hoist_inputs`)
#: for BPTT on CPU while B·G·H <= this (beyond, the (T, B, G·H) arrays written and read once more cost
#: more than the products save; measurements: flax-parity).
HOIST_MAX = 1024
#: A loop of elementwise steps (:func:`bppsa.cells.structure.elementwise`: Block cells at head size 1) on CPU,
#: measured per gate count G (measurements: elementwise-rule): a forward alone hoists the
#: input product while its T·B·G·H numbers fit in ELEMENTWISE_HOIST_BYTES, the RNN's (G = 1) always;
#: BPTT hoists the RNN's, the GRU's (G = 3) for H < 48 and B·G·H <= HOIST_MAX within twice those
#: bytes, the LSTM's never. Unroll 2 for the LSTM, the RNN's forward, tiny steps (B·G·H <=
#: ELEMENTWISE_UNROLL2_MAX) hoisted and, in BPTT, B = 1 in the loop; else 1.
ELEMENTWISE_HOIST_BYTES = 2 << 20
ELEMENTWISE_UNROLL2_MAX = 64


def _autodiff(backward: str) -> bool:
    """Whether autodiff differentiates the loop (backward "bptt") or it is a forward alone ("bppsa", "forward")."""
    if backward not in ("bptt", "bppsa", "forward"):
        raise UsageError(f"backward must be 'bptt' (autodiff through the loop), 'bppsa' or 'forward'; got {backward!r}")
    return backward == "bptt"


def _elementwise_loop(cell: Cell, T: int, B: int, dtype: Any, autodiff: bool, H: int) -> tuple[bool, int]:
    """(hoist, unroll) of a loop of elementwise steps on CPU: the rule above."""
    G = gate_count(cell)
    width = B * G * H
    nbytes = T * width * np.dtype(dtype or np.float32).itemsize
    if G != 3:  # the RNN hoists, the LSTM hoists only in a forward alone (within the bytes)
        hoist = G == 1 or (not autodiff and nbytes <= ELEMENTWISE_HOIST_BYTES)
        return hoist, 1 if G == 1 and autodiff else 2
    if not autodiff:
        hoist = nbytes <= ELEMENTWISE_HOIST_BYTES
        return hoist, 2 if hoist and width <= ELEMENTWISE_UNROLL2_MAX else 1
    hoist = H < 48 and width <= HOIST_MAX and nbytes <= 2 * ELEMENTWISE_HOIST_BYTES
    return hoist, 2 if width <= ELEMENTWISE_UNROLL2_MAX or (B == 1 and not hoist) else 1


def hoist_inputs(cell: Cell, T: int, B: int, dtype: Any = None, backward: str = "bptt", backend: str | None = None,
                 state_size: int | None = None) -> bool:
    """Whether the sequential forward computes ``cell.project`` for all steps before its loop (True)
    or in each step. On CPU: an elementwise step by :data:`ELEMENTWISE_HOIST_BYTES`' rule, other cells
    with BPTT while B·G·H <= :data:`HOIST_MAX`, else always. Elsewhere always (one large product).

    Args:
      cell: the cell the loop steps.
      T: the number of steps.
      B: the batch size.
      dtype: the inputs' dtype (None: float32).
      backward: "bptt" (autodiff differentiates the loop), "bppsa" or "forward" (a forward alone).
      backend: the backend (None: ``jax.default_backend()``).
      state_size: the flat state width S (read where the cell has no hidden size, ``Generic``).

    Returns:
      True to hoist the input products out of the loop.

    Raises:
      bppsa.errors.UsageError: ``backward`` none of "bptt", "bppsa", "forward".
    """
    autodiff = _autodiff(backward)
    if (backend or jax.default_backend()) != "cpu":
        return True
    H = _hidden(cell, state_size)
    if elementwise(cell):
        return _elementwise_loop(cell, T, B, dtype, autodiff, H)[0]
    return not autodiff or B * gate_count(cell) * H <= HOIST_MAX


#: BPTT by a cell's analytic adjoint (:func:`bppsa.backward.adjoint.sequential_adjoint`) sums the parameter
#: gradients in its loop, as autodiff's BPTT does, on CPU from this batch size on when B·G·H >
#: :data:`HOIST_MAX`; otherwise its loop writes each step's cotangents out and each gradient is one
#: product after it. Measured: measurements: analytic-bptt.
ADJOINT_LOOP_MIN_BATCH = 32


def adjoint_in_loop(cell: Cell, B: int, backend: str | None = None, state_size: int | None = None) -> bool:
    """Whether BPTT by a cell's analytic adjoint sums the parameter gradients inside its loop: on
    CPU when B >= :data:`ADJOINT_LOOP_MIN_BATCH` and B·G·H > :data:`HOIST_MAX`; elsewhere never (one
    large product each after the loop).

    Args:
      cell: the cell (its gate count G and hidden size H).
      B: the batch size.
      backend: the backend (None: ``jax.default_backend()``).
      state_size: the flat state width S (read where the cell has no hidden size, ``Generic``).

    Returns:
      True to sum the parameter gradients in the loop.
    """
    if (backend or jax.default_backend()) != "cpu":
        return False
    return B >= ADJOINT_LOOP_MIN_BATCH and B * gate_count(cell) * _hidden(cell, state_size) > HOIST_MAX


def choose_kernels(cell: Cell, backend: str | None = None) -> str:
    """What ``kernels="auto"`` runs: the fused kernels (:mod:`bppsa.kernels`) only where a committed
    GPU measurement shows them the fastest path for this cell; none has been measured yet, so XLA's
    kernels ("xla") everywhere, and on the CPU always.

    Args:
      cell: the cell.
      backend: the backend (default: ``jax.default_backend()``).

    Returns:
      "xla".
    """
    del cell, backend  # the rule reads them once a GPU measurement exists
    return "xla"


def choose_combine(P: int) -> str:
    """``combine="auto"`` over P devices (:mod:`bppsa.parallel.sequence`): P <= 8, one all-gather
    of at most 7 (Π, δ) pairs, no matrix products; beyond, log-step rounds, ⌈log₂ P⌉ latencies and
    products (measurements: scaling).

    Args:
      P: the number of devices along the mesh's sequence axis.

    Returns:
      "allgather" or "logstep".
    """
    return "allgather" if P <= 8 else "logstep"
