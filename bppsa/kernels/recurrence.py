"""The fused sequential recurrence: the whole time loop of an RNN, GRU or LSTM in one Pallas kernel.

An XLA ``lax.scan`` launches its step's kernels once per time step (about 3 µs each on a GPU, whatever
they compute); this kernel runs all T steps in one launch. Each program owns a tile of
:data:`BATCH_TILE` batch rows: it loads the recurrent matrices W_h (one (H, H) block per gate) and
their biases once, keeps them resident for the whole loop, and per step multiplies the state by
them, applies the cell's gates and writes the new state out. The input's part of every step,
x W_x + b_x, is one large product before the kernel (:meth:`bppsa.cells.Affine.project`), as the
sequential forward hoists it; the kernel loads step t + 1's part during step t (it travels in the
loop's carry), so the load's latency hides behind a step's work instead of starting it.

The kernel is the forward of the BPPSA training step (:func:`bppsa.backward.rule.bppsa_states`):
its states are what the backward linearises at, and the backward is the same rule as without it,
so the gradients are exact (``jax.grad`` does not linearise a ``pallas_call``; it never has to).

Backend: Pallas's Triton backend (``jax.experimental.pallas.triton``). Mosaic GPU, the default GPU
backend from JAX 0.11, has no float32 register matrix product (``dot_general`` does not lower; its
``wgmma`` takes 16-bit operands), which a float32 recurrence needs every step; the Triton backend
is deprecated from JAX 0.11 but present in 0.11 and 0.12. Triton's shapes are powers of two and
its products at least 16 wide: H is padded to :func:`padded_size` (zero rows and columns, which
leave the real units alone) and B to a multiple of :data:`BATCH_TILE`; the products are float32
(``Precision.HIGHEST``: IEEE, not TF32). ``interpret=True`` runs the same kernel in Pallas's
interpret mode on any backend (tests, debugging; float64 too).
"""

from __future__ import annotations

import functools
import math
from typing import Any, Callable, cast

import jax
import jax.numpy as jnp
from jax import Array, lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pl_triton

from bppsa.cells import GRU, LSTM, RNN, Affine, Cell, gate_count, split_gates
from bppsa.kernels.lowering import gpu_only

__all__ = ["BATCH_TILE", "MIN_SIZE", "MAX_HIDDEN", "HIDDEN_LIMITS", "step", "max_hidden", "warps_for", "supports",
           "padded_size", "pad_to", "operands",
           "compute_dtype", "dot", "fused_states"]

#: Batch rows a program owns (Triton's products need at least 16 rows).
BATCH_TILE = 16
#: The smallest padded hidden size (Triton's products need at least 16 columns).
MIN_SIZE = 16
#: The largest hidden size the kernel takes: G resident (H, H) blocks of W_h per program (an LSTM at
#: H = 64: 64 KiB of float32), beyond which they no longer fit a program's registers and shared memory.
MAX_HIDDEN = 64
#: The largest hidden size per cell (:func:`max_hidden`), where the compiled kernels (forward and
#: adjoint, sm_90a, Triton 3.6) spill no register: the GRU's at H = 64 spill at 4, 8 and 16 warps
#: (5.7 KB at four warps; its three products tiled in (16, 32) or (16, 16) column tiles, W_h read
#: from memory each step, spill as much), so the GRU stops at 32.
HIDDEN_LIMITS = {RNN: MAX_HIDDEN, GRU: 32, LSTM: MAX_HIDDEN}
_CELLS = (RNN, GRU, LSTM)


def max_hidden(cell: Cell) -> int:
    """The largest hidden size the fused recurrence and adjoint take for ``cell``'s kind
    (:data:`HIDDEN_LIMITS`; :data:`MAX_HIDDEN` for a kind they do not run).

    Args:
      cell: any cell (its :attr:`bppsa.cells.Cell.kernel_cell` decides).

    Returns:
      The limit on ``hidden_size``.
    """
    return HIDDEN_LIMITS.get(type(cell.kernel_cell), MAX_HIDDEN)


def warps_for(Hp: int, gates: int = 4) -> int:
    """The warps a program of the sequential kernels runs with: 4 while the G resident (Hp, Hp) blocks
    of W_h hold at most 4096 numbers (every cell at Hp <= 32; an RNN at Hp = 64: 577 µs predicted
    for its forward at T = 1000 against 623 at eight warps, its adjoint 484 against 527), else 8 (at
    four warps an LSTM's (16, 64) @ (64, 64) products keep more operands in registers than a thread
    has: 5.0 KB of spills in the forward, 12.2 KB in the adjoint; none at eight).

    Args:
      Hp: the padded hidden size.
      gates: G, the cell's gates (default 4: an LSTM's, the most).

    Returns:
      4 or 8.
    """
    return 4 if gates * Hp * Hp <= 4096 else 8


def supports(cell: Cell) -> bool:
    """Whether :func:`fused_states` runs ``cell``: a :class:`bppsa.cells.RNN`, ``GRU`` or ``LSTM``
    (not a subclass: its step could differ) with ``hidden_size`` <= :func:`max_hidden` (RNN and
    LSTM 64, GRU 32).

    Args:
      cell: any cell.

    Returns:
      True where the kernel computes exactly ``cell``'s steps.
    """
    core = cell.kernel_cell
    return type(core) in _CELLS and core.hidden_size <= max_hidden(cell)


def padded_size(n: int) -> int:
    """The hidden size the kernel computes with: the next power of two, at least :data:`MIN_SIZE`.

    Args:
      n: the cell's hidden size H.

    Returns:
      Hp >= max(H, MIN_SIZE), a power of two.
    """
    return max(MIN_SIZE, 1 << max(0, math.ceil(math.log2(n))))


def compute_dtype(dtype: Any) -> Any:
    """The dtype a kernel computes in for arrays of ``dtype``: float32 for 16-bit floats (Triton
    lowers neither their divisions nor their transcendentals; cuDNN's 16-bit RNNs compute in
    float32 too), else ``dtype`` itself. Results are rounded back to ``dtype``.

    Args:
      dtype: the dtype of the caller's arrays.

    Returns:
      ``jnp.promote_types(dtype, float32)``.
    """
    return jnp.promote_types(dtype, jnp.float32)


def dot(a: Array, b: Array) -> Array:
    """a @ b with full-precision products (IEEE float32 on the GPU, not TF32), accumulated in at
    least float32 (16-bit operands too: Triton's products of them accumulate in float32) and
    rounded back to ``a``'s dtype.

    Args:
      a: (m, k) the left operand.
      b: (k, n) the right operand.

    Returns:
      (m, n), in ``a``'s dtype.
    """
    acc = jnp.promote_types(a.dtype, jnp.float32)
    return jnp.dot(a, b, precision=lax.Precision.HIGHEST, preferred_element_type=acc).astype(a.dtype)


def step(cell: Cell, ws: tuple[Array, ...], bs: tuple[Array, ...], us: tuple[Array, ...], state: tuple[Array, ...],
         product: Callable[[Array, Array], Array] = dot) -> tuple[Array, ...]:
    """One step of ``cell`` inside the kernels: the recurrent products computed here, the rest the
    cell's own maths (its ``gate_step``: :meth:`bppsa.cells.GRU.gate_step`), written once for the XLA
    paths and every kernel. The forward runs it; the adjoint kernel (:mod:`bppsa.kernels.adjoint`)
    pulls cotangents back through it; the Newton kernel (:mod:`bppsa.kernels.newton`) differentiates it.

    Args:
      cell: a cell with a ``gate_step`` (an RNN, GRU or LSTM; the Newton kernel's diagonal block cells).
      ws: the G padded blocks of W_h, each (Hp, Hp) (the diagonal cells: (Hp,) vectors).
      bs: their biases, each (Hp,).
      us: the G projected inputs of the step, each (bt, Hp).
      state: the state's parts (h; an LSTM: h, c), each (bt, Hp).
      product: ``product(h, w)``, the recurrent product (default :func:`dot`; the diagonal cells'
        kernel passes an elementwise one).

    Returns:
      The new state's parts, as ``state``.
    """
    h = state[0]
    gh = tuple(product(h, w) + b for w, b in zip(ws, bs, strict=True))
    new = cast(Any, cell).gate_step(state if len(state) > 1 else h, us, gh)
    return tuple(new) if isinstance(new, tuple) else (new,)


def _kernel(*refs, cell: Cell, T: int, gates: int, parts: int):
    """One program: the refs are the G projected inputs (T, bt, Hp), the G blocks of W_h (Hp, Hp),
    their biases (Hp,), the initial state's parts (bt, Hp) [h; LSTM: h, c], then the outputs, the
    states' parts (T, bt, Hp)."""
    u_refs, w_refs, b_refs = refs[:gates], refs[gates:2 * gates], refs[2 * gates:3 * gates]
    s0_refs, out_refs = refs[3 * gates:3 * gates + parts], refs[3 * gates + parts:]
    ws = tuple(r[...] for r in w_refs)  # resident for the whole loop
    bs = tuple(r[...] for r in b_refs)

    def body(t, carry):
        state, us = carry
        ahead = tuple(r[jnp.minimum(t + 1, T - 1)] for r in u_refs)  # the next step's, issued a step ahead
        state = step(cell, ws, bs, us, state)
        for ref, part in zip(out_refs, state, strict=True):
            ref[t] = part
        return state, ahead

    lax.fori_loop(0, T, body, (tuple(r[...] for r in s0_refs), tuple(r[0] for r in u_refs)))


def pad_to(a: Array, shape: tuple[int, ...]) -> Array:
    """``a`` padded with zeros at the end of each axis to ``shape`` (the kernels' padded sizes).

    Args:
      a: any array.
      shape: a shape at least as large as ``a``'s along every axis.

    Returns:
      ``a`` zero-padded to ``shape``.
    """
    return jnp.pad(a, [(0, n - m) for m, n in zip(a.shape, shape, strict=True)])


def operands(cell: Cell, params: Any, xs: Array, dtype: Any, diagonal: bool = False, batch_tile: int = BATCH_TILE
             ) -> tuple[int, int, list[Array], list[Array], list[Array]]:
    """What every cell kernel reads, padded: the G projected inputs x W_x + b_x (one product for all
    steps, before the kernel), the G blocks of the recurrent weight and the G hidden biases.

    Args:
      cell: an affine cell (:class:`bppsa.cells.Affine`).
      params: its parameters.
      xs: (T, B, I) inputs.
      dtype: the kernel's dtype.
      diagonal: the recurrent weight as the G gates' diagonals ((Hp,) vectors; a diagonal cell's
        ``loop_params``), not (Hp, Hp) blocks.
      batch_tile: the batch is padded to a multiple of it (the rows a program owns).

    Returns:
      (Hp, Bp, us, ws, bs): the padded hidden size and batch, us the G (T, Bp, Hp) inputs, ws the
      G (Hp, Hp) blocks (or (Hp,) diagonals) of W_h and bs the G (Hp,) biases (zero without one).
    """
    T, B, _ = xs.shape
    H, G = cell.hidden_size, gate_count(cell)
    Hp, Bp = padded_size(H), batch_tile * -(-B // batch_tile)
    gx = cell.project(params, xs)
    us = [pad_to(u.astype(dtype), (T, Bp, Hp)) for u in (gx if G > 1 else (gx,))]
    if diagonal:
        w = cell.loop_params(params)["W_h"]  # (G, H): each gate's diagonal
        ws = [pad_to(w[q].astype(dtype), (Hp,)) for q in range(G)]
    else:
        ws = [pad_to(w.astype(dtype), (Hp, Hp)) for w in split_gates(params["W_h"], G)]
    b_h = params["b_h"] if cast(Affine, cell).hidden_bias else jnp.zeros((G * H,), dtype)
    bs = [pad_to(b.astype(dtype), (Hp,)) for b in split_gates(b_h, G)]
    return Hp, Bp, us, ws, bs


@functools.partial(jax.jit, static_argnames=("cell", "interpret", "num_warps"))
def fused_states(cell: Cell, params: Any, xs: Array, s0: Array, *, interpret: bool = False,
                 num_warps: int | None = None) -> Array:
    """The flat states of ``cell`` over xs from s0, as the sequential forward computes them, by one
    fused kernel (see the module docstring).

    Args:
      cell: a cell :func:`supports` accepts (its :attr:`bppsa.cells.Cell.kernel_cell` runs).
      params: its parameters (``cell.init``'s structure).
      xs: (T, B, I) inputs, time-major.
      s0: (B, S) the flat initial state (S = H; LSTM: S = 2H, [h, c]).
      interpret: run the kernel in Pallas's interpret mode (any backend) instead of compiling it
        for the GPU.
      num_warps: Triton warps per program (None: :func:`warps_for` the padded hidden size and gates).

    Returns:
      ss (T, B, S), ss[t] the flat state after step t + 1, in s0's dtype (computed in
      :func:`compute_dtype`'s).

    Raises:
      ValueError: a cell the kernel does not run (:func:`supports`).
    """
    if not supports(cell):
        raise ValueError(f"the fused recurrence runs bppsa.cells.RNN and LSTM with hidden_size <= {MAX_HIDDEN} "
                         f"and GRU with hidden_size <= {HIDDEN_LIMITS[GRU]}; got {cell.display_name} with "
                         f"hidden_size {cell.hidden_size}")
    cell, params = cell.kernel_cell, cell.kernel_params(params)
    T, B, _ = xs.shape
    if B == 0:  # no rows: no program to run
        return jnp.zeros((T, 0, s0.shape[-1]), s0.dtype)
    xs = xs if interpret else gpu_only(xs)
    H, G, dtype = cell.hidden_size, gate_count(cell), compute_dtype(s0.dtype)
    Hp, Bp, us, ws, bs = operands(cell, params, xs, dtype)
    state = cell.unflatten_state(s0.astype(dtype))
    parts = [pad_to(p, (Bp, Hp)) for p in (state if cell.pair_state else (state,))]

    seq_spec = pl.BlockSpec((T, BATCH_TILE, Hp), lambda i: (0, i, 0))
    specs = ([seq_spec] * G + [pl.BlockSpec((Hp, Hp), lambda i: (0, 0))] * G
             + [pl.BlockSpec((Hp,), lambda i: (0,))] * G
             + [pl.BlockSpec((BATCH_TILE, Hp), lambda i: (i, 0))] * len(parts))
    out = pl.pallas_call(
        functools.partial(_kernel, cell=cell, T=T, gates=G, parts=len(parts)),
        out_shape=[jax.ShapeDtypeStruct((T, Bp, Hp), dtype)] * len(parts),
        grid=(Bp // BATCH_TILE,),
        in_specs=specs,
        out_specs=[seq_spec] * len(parts),
        interpret=interpret,
        compiler_params=pl_triton.CompilerParams(num_warps=num_warps or warps_for(Hp, G), num_stages=1),
    )(*us, *ws, *bs, *parts)
    states = [o[:, :B, :H] for o in out]
    return cell.flatten_state(tuple(states) if cell.pair_state else states[0]).astype(s0.dtype)
