"""One Newton iteration of a diagonal cell as three fused Pallas kernels, ParaRNN-style: the steps
at the guess, their Jacobians and the scan of the linearised recurrence inside the same kernels.

For a cell whose recurrence is diagonal (:class:`bppsa.cells.BlockRNN` and
:class:`~bppsa.cells.BlockGRU` with ``head_size=1``: each unit sees only its own previous
value), one Newton step from the guess H solves h'_t = d_t (h'_{t-1} − h_{t-1}) + f_t, with f_t =
f(h_{t-1}, x_t) and d_t = ∂f/∂h at the guess's previous state h_{t-1}: an elementwise affine
recurrence. :mod:`bppsa.kernels.scan`'s three phases solve it, and here the maps are never stored:
phases 1 and 3 evaluate the step and its derivative themselves, per element, from the guess and
the projected inputs (x_t W_x + b_x, one product before the kernels), the derivative by JAX's
forward mode of the very step function the recurrence kernel runs
(:func:`bppsa.kernels.recurrence.step`, the cell's ``gate_step``, with an elementwise recurrent product). Memory carries
the guess, the inputs and the new iterate; nothing (T, B, S) more. As in pararnn-torch's fused
kernel (grid (B, T/128, H/32)), the grid runs over chunks of time, batch rows and units: a program
owns a tile of 32 elements (:func:`tile`: one warp, (1, 32) or (2, 16)) and a chunk of steps, and
the chunks are short enough for at least :data:`MIN_PROGRAMS` programs (:func:`chunking`: 1024 at
T = 4096, B = 16, H = 20, where one tile of all units and 16 rows a program gave 64).

The Newton loop itself (the convergence test: the residual and step size of each iterate, and
their reductions) stays :func:`bppsa.forward.newton.iterate`'s, one parallel XLA pass an
iteration, which also decides when to stop: the kernels replace its solve.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
from jax import Array, lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pl_triton

from bppsa.cells import BlockGRU, BlockRNN, Cell, gate_count
from bppsa.kernels.lowering import gpu_only
from bppsa.kernels.recurrence import compute_dtype, operands, pad_to, padded_size, step
from bppsa.kernels.scan import chunk_length

__all__ = ["MAX_UNITS", "TILE_ELEMENTS", "MIN_PROGRAMS", "MIN_CHUNK", "supports", "tile", "chunking",
           "fused_newton_step"]

#: The largest hidden size the kernels take.
MAX_UNITS = 1024
#: A program's tile: one warp, one element a thread (:func:`tile`). The kernels are elementwise,
#: so the grid can be as fine as the problem allows: programs are what fill an H100's 132 SMs.
TILE_ELEMENTS = 32
#: The programs the step's two parallel kernels should have at least: four per SM of an H100
#: (132 SMs), so that every SM has work in every phase (:func:`chunking`).
MIN_PROGRAMS = 4 * 132
#: The shortest chunk :func:`chunking` makes for more programs.
MIN_CHUNK = 8
_DIAGONAL = (BlockRNN, BlockGRU)  # the cells whose head_size=1 step fuses whole (their gate_step, elementwise)


def supports(cell: Cell) -> bool:
    """Whether :func:`fused_newton_step` runs ``cell``: a :class:`bppsa.cells.BlockRNN` or
    ``BlockGRU`` (not a subclass) with ``head_size=1`` and ``hidden_size`` <= :data:`MAX_UNITS`.

    Args:
      cell: any cell.

    Returns:
      True where the kernels compute exactly ``cell``'s Newton step.
    """
    return (type(cell) in _DIAGONAL and getattr(cell, "head_size", None) == 1
            and cell.hidden_size <= MAX_UNITS)


def tile(Hp: int) -> tuple[int, int]:
    """A program's tile (rows, units) at padded hidden size Hp: :data:`TILE_ELEMENTS` elements,
    min(Hp, 32) units of 32 // that many rows (ParaRNN's fused kernel also tiles units by 32).

    Args:
      Hp: the padded hidden size (a power of two, >= 16).

    Returns:
      (bt, ht): the rows and units of a tile; ht divides Hp.
    """
    ht = min(Hp, TILE_ELEMENTS)
    return TILE_ELEMENTS // ht, ht


def chunking(T: int, tiles: int, chunk: int | None = None) -> tuple[int, int]:
    """The chunk length C and number of chunks of T steps over ``tiles`` tiles: ⌈√T⌉ (which
    balances the reduce's and apply's C sequential steps against the carry's T / C), shortened
    until chunks × tiles >= :data:`MIN_PROGRAMS`, but not below :data:`MIN_CHUNK` (the carry would
    run nearly T sequential steps: a short sequence keeps fewer programs); ``chunk`` given: that
    length.

    Args:
      T: the number of steps (>= 1).
      tiles: the (rows, units) tiles of the problem.
      chunk: a fixed chunk length, or None.

    Returns:
      (C, chunks), chunks = ⌈T / C⌉.
    """
    if chunk is None:
        need = -(-MIN_PROGRAMS // tiles)  # chunks
        balanced = chunk_length(T)
        chunk = max(min(balanced, MIN_CHUNK), min(balanced, T // need))
    C = min(T, chunk)
    return C, -(-T // C)


def _evaluate(cell, idx, T, u_refs, ws, bs, h_ref, s0):
    """The step at the guess's state before step ``idx`` (s0 before the first), its derivative
    (elementwise: the recurrence is diagonal) and that previous state."""
    prev = jnp.where(idx == 0, s0, h_ref[jnp.maximum(idx - 1, 0)])
    us = tuple(r[jnp.minimum(idx, T - 1)] for r in u_refs)  # past T: masked by the caller
    f, d = jax.jvp(lambda h: step(cell, ws, bs, us, (h,), product=jnp.multiply)[0], (prev,), (jnp.ones_like(prev),))
    return f, d, prev


def _reduce(*refs, cell, T: int, C: int, gates: int):
    u_refs, w_refs, b_refs = refs[:gates], refs[gates:2 * gates], refs[2 * gates:3 * gates]
    h_ref, s0_ref, a_ref, l_ref = refs[3 * gates:]
    ws, bs, s0, c = tuple(r[...] for r in w_refs), tuple(r[...] for r in b_refs), s0_ref[...], pl.program_id(0)

    def body(t, carry):
        a, loc = carry
        idx = c * C + t
        f, d, prev = _evaluate(cell, idx, T, u_refs, ws, bs, h_ref, s0)
        keep = idx < T
        return jnp.where(keep, a * d, a), jnp.where(keep, loc * d + (f - d * prev), loc)

    a, loc = lax.fori_loop(0, C, body, (jnp.ones_like(s0), jnp.zeros_like(s0)))
    a_ref[...] = a
    l_ref[...] = loc


def _carry(a_ref, l_ref, s0_ref, g_ref, *, chunks: int):
    def body(c, g):
        g_ref[c] = g
        return g * a_ref[c] + l_ref[c]

    lax.fori_loop(0, chunks, body, s0_ref[...])


def _apply(*refs, cell, T: int, C: int, gates: int):
    u_refs, w_refs, b_refs = refs[:gates], refs[gates:2 * gates], refs[2 * gates:3 * gates]
    h_ref, s0_ref, g_ref, out_ref = refs[3 * gates:]
    ws, bs, s0, c = tuple(r[...] for r in w_refs), tuple(r[...] for r in b_refs), s0_ref[...], pl.program_id(0)

    def body(t, g):
        idx = c * C + t
        f, d, prev = _evaluate(cell, idx, T, u_refs, ws, bs, h_ref, s0)
        g = jnp.where(idx < T, d * (g - prev) + f, g)
        out_ref[t] = g
        return g

    lax.fori_loop(0, C, body, g_ref[...])


@functools.partial(jax.jit, static_argnames=("cell", "chunk", "interpret", "num_warps"))
def fused_newton_step(cell: Cell, params: Any, xs: Array, s0: Array, H: Array, *, chunk: int | None = None,
                      interpret: bool = False, num_warps: int = 1) -> Array:
    """One undamped Newton step of ``cell``'s chain from the guess H, by three fused kernels (the
    module docstring): what :func:`bppsa.forward.step.newton_step` computes.

    Args:
      cell: a cell :func:`supports` accepts.
      params: its parameters.
      xs: (T, B, I) inputs, time-major.
      s0: (B, H) the initial state.
      H: (T, B, H) the guess, H[t] the state after step t + 1.
      chunk: the chunk length (default: :func:`chunking`'s).
      interpret: run the kernels in Pallas's interpret mode (any backend).
      num_warps: Triton warps per program (one: a tile is :data:`TILE_ELEMENTS` elements).

    Returns:
      (T, B, H) the next iterate, in H's dtype.

    Raises:
      ValueError: a cell the kernels do not run.
    """
    if not supports(cell):
        raise ValueError(f"the fused Newton step runs bppsa.cells.BlockRNN and BlockGRU with head_size=1 "
                         f"and hidden_size <= {MAX_UNITS}; got {cell.display_name}")
    T, B, _ = xs.shape
    if B == 0:  # no rows: nothing to solve
        return H
    xs = xs if interpret else gpu_only(xs)
    Hs, G, dtype = cell.hidden_size, gate_count(cell), compute_dtype(H.dtype)
    bt, ht = tile(padded_size(Hs))
    Hp, Bp, us, ws, bs = operands(cell, params, xs, dtype, diagonal=True, batch_tile=bt)
    tiles = (Bp // bt, Hp // ht)
    C, chunks = chunking(T, tiles[0] * tiles[1], chunk)
    Hg, s0p = pad_to(H.astype(dtype), (T, Bp, Hp)), pad_to(s0.astype(dtype), (Bp, Hp))

    whole = pl.BlockSpec((T, bt, ht), lambda c, i, j: (0, i, j))  # indexed by step inside the kernels
    vec = pl.BlockSpec((ht,), lambda c, i, j: (j,))
    one_tile = pl.BlockSpec((bt, ht), lambda c, i, j: (i, j))
    one = pl.BlockSpec((None, bt, ht), lambda c, i, j: (c, i, j))
    specs = [whole] * G + [vec] * G + [vec] * G + [whole, one_tile]
    params_ = pl_triton.CompilerParams(num_warps=num_warps, num_stages=1)
    per_chunk = jax.ShapeDtypeStruct((chunks, Bp, Hp), dtype)
    kw = dict(cell=cell, T=T, C=C, gates=G)
    grid = (chunks, *tiles)
    A, L = pl.pallas_call(functools.partial(_reduce, **kw), grid=grid, in_specs=specs,
                          out_specs=[one, one], out_shape=[per_chunk, per_chunk], interpret=interpret,
                          compiler_params=params_)(*us, *ws, *bs, Hg, s0p)
    every = pl.BlockSpec((chunks, bt, ht), lambda i, j: (0, i, j))
    carries = pl.pallas_call(functools.partial(_carry, chunks=chunks), grid=tiles,
                             in_specs=[every, every, pl.BlockSpec((bt, ht), lambda i, j: (i, j))],
                             out_specs=every, out_shape=per_chunk, interpret=interpret,
                             compiler_params=params_)(A, L, s0p)
    out = pl.pallas_call(functools.partial(_apply, **kw), grid=grid, in_specs=[*specs, one],
                         out_specs=pl.BlockSpec((C, bt, ht), lambda c, i, j: (c, i, j)),
                         out_shape=jax.ShapeDtypeStruct((chunks * C, Bp, Hp), dtype), interpret=interpret,
                         compiler_params=params_)(*us, *ws, *bs, Hg, s0p, carries)
    return out[:T, :B, :Hs].astype(H.dtype)
