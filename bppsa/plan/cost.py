"""What each backward pass costs, and ``backward="auto"``'s choice between them.

A :class:`CostModel` predicts the backward-pass seconds of BPTT and of BPPSA from a handful of
problem features (:func:`cost_features`), with non-negative coefficients fitted per device
(:meth:`CostModel.fit`; the probe that times the real backward is the harness's probe, ``bppsa bench --calibrate``).
A calibrated model is cached per device (:func:`cache_path`, :func:`load`, :func:`save`).

:func:`choose_backward` is the whole policy, among tuned BPTT and BPPSA with the Blelloch or the
sequential scan: on CPU the elementwise BPPSA for cells with 1×1 Jacobian blocks (measured), else
the model passed in (``bppsa.rnn(..., backward="auto", cost_model=model)``), else the calibration
cached for this device, else the model shipped with bppsa for this backend
(:func:`shipped_cost_model`, package data ``bppsa/plan/cost_models/{cpu,gpu}.json``), else tuned BPTT.
Nothing is installed globally.

BPTT's own tuning (the ``lax.scan`` unroll per shape and backend, :func:`bptt_unroll`) and the chunk
sizing of the BPPSA backward (:func:`auto_chunk_size`: the number of dependent levels, a cost feature,
depends on it) live here too; so do ``forward="auto"``'s choice (:func:`choose_forward`) and the
mesh's cross-device step (:func:`choose_combine`). Every one of these is consulted from one place,
:meth:`bppsa.plan.options.Options.plan`, before anything runs.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.resources
import json
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import jax
import jax.numpy as jnp
import numpy as np
import scipy.optimize

from bppsa.errors import UsageError
from bppsa.host import cpu_model
from bppsa.scan import dense as scan_lib

if TYPE_CHECKING:
    from bppsa.cells import Cell

__all__ = ["CHUNK_BYTES", "auto_chunk_size", "chunk_lengths", "ELEMENTWISE_CHUNK_BYTES", "elementwise_plan",
           "backward_levels",
           "cost_features", "CostModel", "COST_MODEL_VERSION", "device_key", "cache_path", "load", "save",
           "default_cost_model", "shipped_cost_model", "choose_backward", "METHODS", "UNROLLS", "bptt_unroll",
           "NEWTON_ITERATIONS", "break_even_iterations", "FORWARD_CONSTANTS", "forward_seconds", "choose_forward",
           "choose_combine", "choose_kernels", "adjoint_in_loop", "ADJOINT_LOOP_MIN_BATCH", "hoist_inputs", "HOIST_MAX"]

# The methods a CostModel predicts and backward="auto" chooses among: name -> (backward, scan).
METHODS = {"bptt": ("bptt", None), "bppsa": ("bppsa", "blelloch"), "bppsa_sequential": ("bppsa", "sequential")}
_NFEAT = {"bptt": 3, "bppsa": 4, "bppsa_sequential": 3}

# chunk_size="auto" on CPU: chunks whose Jacobians take at most this many bytes, so that each
# chunk's scan works in cache (several times faster than one chunk, the best sizes flat around this
# bound: measurements: scan-optimisation); 5120 steps at B = 1, 320 at B = 16 (RNN H = 20).
CHUNK_BYTES = 8 << 20


def auto_chunk_size(T: int, B: int, S: int, itemsize: int, backend: str | None = None,
                    structured: bool = False, block: int | None = None) -> int | None:
    """The chunk length ``chunk_size="auto"`` uses: None (one chunk) off CPU or when everything
    fits in :data:`CHUNK_BYTES`; else the largest length of the form m·2^k (32 <= m < 64, so the
    Blelloch scan pads nothing) whose largest array fits in it, at least 64: the (B, S, S)
    Jacobians per step, or for a cell with diagonal structure (``structured``, see
    :attr:`bppsa.cells.Cell.has_diagonal_jacobian`) half of that, the first level's products (its
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
      cell: the cell (its Jacobian structure: ``jacobian_block_size``, ``has_diagonal_jacobian``).
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
    elementwise = cell.jacobian_block_size == 1 and not scan_given
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
        chunk = auto_chunk_size(T, B, S, states_itemsize, backend, block=cell.jacobian_block_size,
                                structured=method == "blelloch" and cell.has_diagonal_jacobian)
    if parallel:  # the iterations' Jacobians: diagonal (quasi) or the cell's blocks
        block = 1 if forward == "quasi" else cell.jacobian_block_size
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
        w = B * cell.gates * H * H
        if T * w <= _TINY_WORK:
            u = 1
        elif T <= 16:  # short sequences: no loop at all (measurements: bptt-unroll)
            u = T
        elif cell.elementwise_step:
            u = _elementwise_loop(cell, T, B, dtype, autodiff, H)[1]
        else:
            u = next((u for limit, b, u in _CPU_UNROLL if w <= limit and B <= b), 1)
    return max(1, min(u, int(T)))


#: The sequential forward computes the inputs' part of every step before its loop (:func:`hoist_inputs`)
#: for BPTT on CPU while B·G·H <= this (beyond, the (T, B, G·H) arrays written and read once more cost
#: more than the products save; measurements: flax-parity).
HOIST_MAX = 1024
#: A loop of elementwise steps (``Cell.elementwise_step``: structured cells at head size 1) on CPU,
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
    G, width = cell.gates, B * cell.gates * H
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
    if cell.elementwise_step:
        return _elementwise_loop(cell, T, B, dtype, autodiff, H)[0]
    return not autodiff or B * cell.gates * H <= HOIST_MAX


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
    return B >= ADJOINT_LOOP_MIN_BATCH and B * cell.gates * _hidden(cell, state_size) > HOIST_MAX


def backward_levels(T: int, B: int = 1, S: int = 1, itemsize: int = 4, structured: bool = False) -> int:
    """Dependent levels of the BPPSA backward: 2⌈log₂(C + 1)⌉ per chunk of C steps (up-sweep +
    down-sweep), times the number of chunks ``chunk_size="auto"`` makes on this backend.

    Args:
      T: the number of steps.
      B: the batch size.
      S: the flat state size.
      itemsize: the bytes of one state entry.
      structured: the cell has diagonal structure (:func:`auto_chunk_size`).

    Returns:
      The number of dependent levels, an int.
    """
    C = auto_chunk_size(T, B, S, itemsize, structured=structured) or T
    return -(-T // C) * 2 * max(1, int(C).bit_length())


def cost_features(cell: Cell, T: int, B: int, itemsize: int = 4) -> dict:
    """The model's features for one problem (S = ``cell.state_size``, G = ``cell.gates``).

    BPTT:  t = a_step · T + a_batch · T·[B > 1] + a_flop · T·B·G·S²   (T dependent steps)
    BPPSA: t = b_level · levels + b_dense · T·B·S³·[dense] + b_diag · T·B·S³·[diagonal] + b_mem · T·B·G·S²
    levels = 2⌈log₂(C + 1)⌉ dependent levels per chunk of C steps (:func:`backward_levels`);
    T·B·S³ is the up-sweep's matrix–matrix work, counted in one of two features: cells whose
    Jacobians are formed (dense) and cells with diagonal structure
    (:attr:`bppsa.cells.Cell.has_diagonal_jacobian`, the RNN), whose first level is one large
    GEMM from vectors; T·B·G·S² the Jacobian generation, vector products and contraction (memory
    bound). a_batch: XLA's per-step cost jumps from B = 1 to B = 2 on the CPU, more than the flops
    explain (what the probe measured is kept in ``cost_models/cpu.json``).
    BPPSA, sequential scan: t = c_step · T + c_jac · T·B·S² + c_mem · T·B·G·S²  (T dependent
    vector–matrix products over the (T, B, S, S) Jacobians, which are always formed).

    Args:
      cell: the cell (S, G and its Jacobian structure).
      T: the number of steps.
      B: the batch size.
      itemsize: the bytes of one state entry (the chunking of the levels).

    Returns:
      The features by method, ``{"bptt": [3 floats], "bppsa": [4 floats], "bppsa_sequential": [3 floats]}``,
      each list in the order of its formula's terms above.
    """
    S, G = cell.state_size, cell.gates
    diag = cell.has_diagonal_jacobian
    work = float(T) * B * S ** 3
    return {"bptt": [float(T), float(T) * (B > 1), float(T) * B * G * S * S],
            "bppsa": [float(backward_levels(T, B, S, itemsize, diag)), 0.0 if diag else work,
                      work if diag else 0.0, float(T) * B * G * S * S],
            "bppsa_sequential": [float(T), float(T) * B * S * S, float(T) * B * G * S * S]}


def _nnls(A: Any, y: Any) -> np.ndarray:
    """Non-negative least squares on relative error: min ‖A x / y − 1‖ over x >= 0
    (``scipy.optimize.nnls``, Lawson–Hanson).

    Where the probe cannot tell features apart (a feature's column lies in the span of the
    chosen ones: with only G = 1 cells probed, the G·S² terms are collinear with the S² and S³
    ones), nnls hands all the weight to one of them. The minimum-norm least-squares solution over
    the chosen and such collinear features is taken instead when it is non-negative and fits as
    well (the same residual), so that a refit does not move the choices for cells the probe did
    not cover (GRU, LSTM: G = 3, 4) on a numerical tie-break.
    """
    A = np.asarray(A, float) / np.asarray(y, float)[:, None]
    b = np.ones(len(y))
    x, rnorm = scipy.optimize.nnls(A, b)
    chosen = x > 0
    if chosen.any():
        basis = A[:, chosen]
        proj = basis @ np.linalg.lstsq(basis, A, rcond=None)[0]  # every column projected on the chosen ones
        tied = chosen | (np.linalg.norm(proj - A, axis=0) <= 1e-9 * np.linalg.norm(A, axis=0))
        if tied.sum() > chosen.sum():
            x_tied = np.zeros_like(x)
            x_tied[tied] = np.linalg.lstsq(A[:, tied], b, rcond=None)[0]
            if x_tied.min() >= 0 and np.linalg.norm(A @ x_tied - b) <= rnorm * (1 + 1e-9) + 1e-12:
                return x_tied
    return x


class CostModel:
    """Predicted backward-pass seconds of each method of :data:`METHODS` from :func:`cost_features`.

    ``coef = {"bptt": [a_step, a_batch, a_flop], "bppsa": [b_level, b_dense, b_diag, b_mem],
    "bppsa_sequential": [c_step, c_jac, c_mem]}`` (seconds per unit; "bppsa_sequential" is optional:
    a model without it never picks the sequential scan), fitted by :meth:`fit`. ``choose`` picks the
    method (a :data:`METHODS` key) with the smallest prediction (``backward="auto", cost_model=model``).

    Args:
      coef: the coefficients by method, as above: 3 numbers for "bptt", 4 for "bppsa", optionally 3 for
        "bppsa_sequential" (other keys are dropped).
      meta: what the model was fitted on (``meta["device"]``: the :func:`device_key` it is valid for).

    Raises:
      ValueError: a method's coefficients missing or of the wrong count.
    """

    def __init__(self, coef: dict, meta: dict | None = None):
        for k, n in _NFEAT.items():
            if (k in coef or k != "bppsa_sequential") and len(coef.get(k) or ()) != n:
                raise ValueError(f"coef[{k!r}] must be a list of {n} numbers; got {coef.get(k)!r}")
        self.coef = {k: [float(c) for c in v] for k, v in coef.items() if k in _NFEAT}
        self.meta = dict(meta or {})

    @classmethod
    def fit(cls, features: dict, seconds: dict, meta: dict | None = None) -> "CostModel":
        """Fit non-negative coefficients, minimising the relative error: ``features[k]``, a list of
        :func:`cost_features` rows, ``seconds[k]`` the measured backward seconds of method k ("bptt",
        "bppsa", optionally "bppsa_sequential") at each.

        Args:
          features: ``{method: [feature rows]}``, rows of :func:`cost_features` for "bptt" and "bppsa"
            (and "bppsa_sequential" to fit it).
          seconds: ``{method: [seconds]}``, one measurement per row of ``features[method]``.
          meta: the new model's ``meta``.

        Returns:
          The fitted :class:`CostModel`.

        Raises:
          ValueError: a method's features and seconds empty or of different lengths.
        """
        keys = [k for k in _NFEAT if k != "bppsa_sequential" or k in features]
        for k in keys:
            if len(features.get(k, ())) != len(seconds.get(k, ())) or not features.get(k):
                raise ValueError(f"features[{k!r}] and seconds[{k!r}] must be non-empty lists of the same "
                                 f"length; got {len(features.get(k, ()))} and {len(seconds.get(k, ()))}")
        return cls({k: _nnls(features[k], seconds[k]).tolist() for k in keys}, meta)

    def predict(self, cell: Cell, T: int, B: int, dtype: Any = None) -> dict:
        """The predicted backward seconds of each method the model has, for one problem.

        Args:
          cell: the cell.
          T: the number of steps.
          B: the batch size.
          dtype: the states' dtype (None: float32).

        Returns:
          ``{method: seconds}`` for the keys of ``coef``.
        """
        f = cost_features(cell, T, B, 4 if dtype is None else jnp.dtype(dtype).itemsize)
        return {k: float(np.dot(c, f[k])) for k, c in self.coef.items()}

    def choose(self, cell: Cell, T: int, B: int, dtype: Any = None) -> str:
        """The :data:`METHODS` key predicted fastest (ties: the earlier key).

        Args:
          cell: the cell.
          T: the number of steps.
          B: the batch size.
          dtype: the states' dtype (None: float32).

        Returns:
          "bptt", "bppsa" or "bppsa_sequential".
        """
        p = self.predict(cell, T, B, dtype)
        return min(p, key=lambda k: (p[k], list(METHODS).index(k)))

    __call__ = choose

    def to_json(self) -> dict:
        """The model as a JSON-serialisable dict ``{"coef": ..., "meta": ...}`` (:meth:`from_json` reads it)."""
        return {"coef": self.coef, "meta": self.meta}

    @classmethod
    def from_json(cls, rec: dict) -> "CostModel":
        """The model a :meth:`to_json` dict ``rec`` describes (``meta`` optional).

        Raises:
          ValueError: coefficients missing or of the wrong count (:class:`CostModel`).
        """
        return cls(rec["coef"], rec.get("meta"))


COST_MODEL_VERSION = 6  # 2: storage-order Blelloch scan, chunk_size="auto"; 3: BPTT's B > 1 term;
# 4: the RNN's diagonal-structure scan, dense and diagonal S^3 terms; 5: tuned BPTT unroll, the
# sequential scan as a third method; 6: GRU and LSTM in the probe


def device_key() -> str:
    """Backend, device kind (the CPU model on CPU), jax version and :data:`COST_MODEL_VERSION`:
    a model calibrated under another key (older backward implementation) is not used.

    Returns:
      The key, ``"backend|device kind|jax version|model version"``.
    """
    kind = jax.devices()[0].device_kind if jax.default_backend() != "cpu" else cpu_model()
    return f"{jax.default_backend()}|{kind}|jax {jax.__version__}|model {COST_MODEL_VERSION}"


def cache_path() -> Path:
    """Where the calibrated model is cached: $BPPSA_CACHE_DIR or ~/.cache/bppsa, one file per device.

    Returns:
      The path of this device's file, ``cost_model-<hash of device_key()>.json`` in that folder.
    """
    root = Path(os.environ.get("BPPSA_CACHE_DIR") or Path.home() / ".cache" / "bppsa")
    digest = hashlib.sha1(device_key().encode()).hexdigest()[:12]
    return root / f"cost_model-{digest}.json"


def load(path: str | os.PathLike | None = None) -> CostModel | None:
    """The cached :class:`CostModel` for this device (default: :func:`cache_path`), or None when
    there is none, it is unreadable or it was calibrated under another :func:`device_key`.

    Args:
      path: the JSON file to read (None: :func:`cache_path`).

    Returns:
      The :class:`CostModel`, or None.
    """
    try:
        rec = json.loads(Path(path or cache_path()).read_text())
        if rec.get("meta", {}).get("device") == device_key():
            return CostModel.from_json(rec)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass
    return None


def save(model: CostModel, path: str | os.PathLike | None = None) -> Path:
    """Write ``model`` to ``path`` (default: :func:`cache_path`); returns the path.

    Args:
      model: the :class:`CostModel` (its ``meta["device"]`` should be :func:`device_key` for :func:`load`
        to take it).
      path: the JSON file to write (None: :func:`cache_path`); its folder is created.

    Returns:
      The path written. :func:`default_cost_model` looks again at its next call.
    """
    path = Path(path or cache_path())
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(model.to_json(), indent=1) + "\n")
    default_cost_model.cache_clear()
    return path


def shipped_cost_model(backend: str | None = None) -> CostModel | None:
    """The model shipped with bppsa for ``backend`` (default: ``jax.default_backend()``): package
    data ``bppsa/plan/cost_models/cpu.json`` (fitted from a calibration on a 2-core x86 CPU) or
    ``gpu.json`` (a prior from published H200 figures, not measured: its ``meta["measured"]`` is
    false); None for other backends or a file written for another :data:`COST_MODEL_VERSION`.

    Args:
      backend: "cpu", or "gpu", "cuda" or "rocm" (None: ``jax.default_backend()``).

    Returns:
      The shipped :class:`CostModel`, or None.
    """
    backend = backend or jax.default_backend()
    name = "cpu" if backend == "cpu" else "gpu" if backend in ("gpu", "cuda", "rocm") else None
    if name is None:
        return None
    try:
        rec = json.loads(importlib.resources.files("bppsa.plan").joinpath("cost_models", f"{name}.json")
                         .read_text())
        if rec.get("meta", {}).get("model_version") == COST_MODEL_VERSION:
            return CostModel.from_json(rec)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass
    return None


@functools.lru_cache(maxsize=None)
def default_cost_model() -> CostModel | None:
    """The calibration cached for this device (:func:`load`), else :func:`shipped_cost_model`;
    looked up once per process (``default_cost_model.cache_clear()`` looks again).

    Returns:
      The :class:`CostModel`, or None when there is neither.
    """
    return load() or shipped_cost_model()


def choose_backward(cell: Cell, T: int, B: int, dtype: Any = None, *, cost_model: CostModel | None = None,
                    scan: str | None = None, devices: int | None = None, backend: str | None = None) -> tuple:
    """What ``backward="auto"`` runs: ``(backward, scan)``, a value of :data:`METHODS`. On CPU, one
    device (``devices`` None), 1×1 Jacobian blocks (the structured cells at head size 1), ``scan`` open:
    :func:`elementwise_plan`'s BPPSA, measured not modelled (T·B·S Jacobians and scan work where the
    model's features count S×S matrices: it picks BPTT, 1.03-3.18x slower there, measured in
    measurements: diagonal-auto). Else ``cost_model``, else :func:`default_cost_model`, else BPTT.

    Args:
      cell: the cell.
      T: the number of steps.
      B: the batch size.
      dtype: the states' dtype (None: float32).
      cost_model: the :class:`CostModel` that decides (None: :func:`default_cost_model`).
      scan: the scan the user named (None: open).
      devices: the size of the mesh axis the time is split over; None: one device.
      backend: the backend (None: ``jax.default_backend()``).

    Returns:
      (backward, scan), ("bptt", None), ("bppsa", "blelloch") or ("bppsa", "sequential").

    Raises:
      bppsa.errors.UsageError: ``cost_model`` neither a :class:`CostModel` nor None.
    """
    if cost_model is not None and not isinstance(cost_model, CostModel):
        raise UsageError(f"cost_model must be a bppsa.CostModel (e.g. bppsa.plan.cost.default_cost_model()) or "
                         f"None; got {cost_model!r} of type {type(cost_model).__name__}")
    cpu = (backend or jax.default_backend()) == "cpu"
    if cpu and devices is None and scan is None and cell.jacobian_block_size == 1:
        return METHODS["bppsa_sequential"]
    model = default_cost_model() if cost_model is None else cost_model
    return METHODS["bptt" if model is None else model.choose(cell, T, B, dtype)]


#: The forward model's expected Newton iterations (measurements: parallel-step: newton 3-4 at random
#: weights, 11-27 for the trained IRMAS GRU, mean 5.4; quasi mean 11) and per-backend constants: a ``lax.scan``
#: step's and a scan level's latency (s; GPU's fitted to measurements: h200), products' flop/s.
NEWTON_ITERATIONS = {"newton": 5, "quasi": 11}
FORWARD_CONSTANTS = {"cpu": {"step": 2e-6, "level": 2e-5, "flops": 2e10},
                     "gpu": {"step": 2.2e-6, "level": 3e-5, "flops": 2e13}}


def forward_seconds(cell: Cell, T: int, B: int, forward: str, backend: str | None = None,
                    iterations: float | None = None) -> float:
    """Predicted seconds of one forward: "sequential" = T dependent steps, each its latency plus
    its work (B·G·S·(I + S) multiply-adds) at the backend's throughput; "newton"/"quasi" =
    ``iterations`` (None: :data:`NEWTON_ITERATIONS`) × (2⌈log₂ T⌉ scan levels' latency + the
    iteration's work: the steps, their Jacobians (B·S²·G) and the scan's block products (about
    2·B·S·k² per step for k×k blocks: k = S dense, the cell's block size, 1 for quasi)).

    Args:
      cell: the cell (S, G, I and its Jacobian block size).
      T: the number of steps.
      B: the batch size.
      forward: "sequential", "newton" or "quasi".
      backend: the backend whose :data:`FORWARD_CONSTANTS` apply (None: ``jax.default_backend()``;
        unknown ones: the GPU's).
      iterations: the Newton iterations (None: :data:`NEWTON_ITERATIONS`).

    Returns:
      The predicted seconds, a float.
    """
    c = FORWARD_CONSTANTS.get(backend or jax.default_backend(), FORWARD_CONSTANTS["gpu"])
    S, G, I = cell.state_size, getattr(cell, "gates", 1), cell.input_size or cell.state_size
    step_work = 2.0 * B * G * S * (I + S)
    if forward == "sequential":
        return T * (c["step"] + step_work / c["flops"])
    k = 1 if forward == "quasi" else (cell.jacobian_block_size or S)
    iteration = T * (2 * step_work + 2.0 * B * G * S * S + 4.0 * B * S * k * k) / c["flops"]
    n = NEWTON_ITERATIONS["newton" if cell.jacobian_block_size == 1 else forward] if iterations is None else iterations
    return n * (2 * max(1, int(np.ceil(np.log2(max(T, 2))))) * c["level"] + iteration)


def break_even_iterations(cell: Cell, T: int, B: int, backend: str | None = None) -> float:
    """The most Newton iterations at which the parallel forward is predicted faster than the
    sequential one (:func:`forward_seconds`) on ``backend``: ``forward="auto"``'s limit for the
    iterations :func:`bppsa.forward.newton.predicted_iterations` foresees.

    Args:
      cell: the cell.
      T: the number of steps.
      B: the batch size.
      backend: the backend (None: ``jax.default_backend()``).

    Returns:
      The break-even iteration count, a float (the sequential forward's seconds over one iteration's).
    """
    return forward_seconds(cell, T, B, "sequential", backend) / forward_seconds(cell, T, B, "newton", backend, 1)


def choose_forward(cell: Cell, T: int, B: int, dtype: Any = None,
                   backend: str | None = None) -> tuple[str, float | None]:
    """What ``forward="auto"`` runs: ("sequential", None) where the parallel forward cannot pay
    here (on CPU always: the sequential loop wins at every point of measurements: parallel-step;
    elsewhere where even two iterations are predicted slower: :func:`break_even_iterations`),
    else ("newton", the break-even iteration count): the solver then estimates the Lyapunov
    exponent at its first iterate and runs on only if it is negative and the iterations it
    predicts (:func:`bppsa.forward.newton.predicted_iterations`) are within the break-even count.

    Args:
      cell: the cell.
      T: the number of steps.
      B: the batch size.
      dtype: the states' dtype (not used: the constants are float32's).
      backend: the backend (None: ``jax.default_backend()``).

    Returns:
      (forward, gate), ("sequential", None) or ("newton", the break-even iteration count).
    """
    del dtype  # the constants are float32's; the choice does not hinge on it
    backend = backend or jax.default_backend()
    if backend == "cpu":  # measured, not modelled: the sequential forward at every CPU point
        return "sequential", None
    gate = float(break_even_iterations(cell, T, B, backend))
    return ("newton", gate) if gate >= 2 else ("sequential", None)


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
