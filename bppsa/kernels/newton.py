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
the guess, the inputs and the new iterate; nothing (T, B, S) more. The input projection is made once
per sequence (:func:`newton_operands`), before the Newton loop, and each iteration
(:func:`fused_newton_iteration`) reads it. As in pararnn-torch's fused
kernel (grid (B, T/128, H/32)), the grid runs over chunks of time, batch rows and units: a program
owns a tile of 32 elements (:func:`tile`: one warp, (1, 32) or (2, 16)) and a chunk of steps, and
the chunks are short enough for :data:`MIN_WAVES` waves of resident programs where at most
:data:`MAX_CHUNKS` chunks reach them (:func:`chunking`: 32 768 programs, 7.76 waves, at T = 4096,
B = 16, H = 256), else for four programs an SM (1024 at H = 20, where one tile of all units and 16
rows a program gave 64). Each step's operands (its projected inputs and the guess's state) are
loaded a step ahead, behind the current step's arithmetic, and the guess's
state after a step is loaded once: it is the next step's previous state. The carry loads its
chunks' maps :data:`CARRY_BLOCK` at a time, the next block's while it chains the current one.

The convergence test's pieces come from the kernels too, each where its operands are anyway: the
reduce kernel (:func:`fused_newton_reduce`) evaluates every step f(h_{t-1}, x_t) at its guess H, so
with the tolerances it also reduces H's residual :math:`|h_t - f(h_{t-1}, x_t)|` in the tolerances' units
and the first step whose residual misses the tolerance (:class:`Residual`); the apply kernel
(:func:`fused_newton_apply`: carry, then apply) reduces, as it makes each new state h'_t, the step
h'_t − h_t in the tolerances' units and :math:`|h'_t|` (:class:`StepSize`): a (programs,) array each, which
:func:`bppsa.forward.newton.iterate` reduces instead of a parallel XLA pass over (T, B, S) an
iteration; it still decides when to stop. The new iterate's residual is the next reduce's: the loop
runs the reduce once before it, then apply and the reduce at the new iterate each iteration,
carrying the reduce's aggregates (:class:`Aggregates`) to the next step; nothing evaluates a step
twice. The decisions are XLA's up to rounding: the kernels evaluate the step with their own
operands, so a residual within rounding of the tolerance could be judged otherwise (not seen: the
tests' iteration counts are XLA's).
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple, cast

import jax
import jax.numpy as jnp
from jax import Array, lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pl_triton

from bppsa.cells import BlockGRU, BlockRNN, Cell, gate_count
from bppsa.kernels.lowering import gpu_only
from bppsa.kernels.recurrence import compute_dtype, operands, pad_to, padded_size, step
from bppsa.kernels.scan import chunk_length

__all__ = ["MAX_UNITS", "TILE_ELEMENTS", "SMS", "RESIDENT", "MIN_WAVES", "MIN_PROGRAMS", "MIN_CHUNK", "MAX_CHUNKS",
           "CARRY_BLOCK", "supports", "tile", "chunking",
           "Residual", "StepSize", "Measures", "Aggregates", "Operands", "newton_operands", "measures_fuse",
           "fused_newton_reduce", "fused_newton_apply", "fused_newton_iteration", "fused_newton_step"]

#: The largest hidden size the kernels take.
MAX_UNITS = 1024
#: A program's tile: one warp, one element a thread (:func:`tile`). The kernels are elementwise,
#: so the grid can be as fine as the problem allows: programs are what fill an H100's 132 SMs.
TILE_ELEMENTS = 32
#: The SMs of an H100 and the one-warp programs each holds at once (its limit of 32 resident blocks):
#: a wave of these kernels is SMS × RESIDENT programs.
SMS, RESIDENT = 132, 32
#: The waves the step's two parallel kernels should have at least (:func:`chunking`).
MIN_WAVES = 4
#: The programs of :data:`MIN_WAVES` waves: 16 896.
MIN_PROGRAMS = MIN_WAVES * SMS * RESIDENT
#: The shortest chunk :func:`chunking` makes for more programs.
MIN_CHUNK = 8
#: The most chunks :func:`chunking` makes for more programs: the carry kernel runs one step a chunk,
#: one after another (by the machine-code model, 256 chunks' carry takes about 3 µs more than 64's).
MAX_CHUNKS = 256
#: The chunks the carry kernel loads at once, the next block's while it chains the current one.
CARRY_BLOCK = 16
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
    balances the reduce's and apply's C sequential steps against the carry's T / C), halved until
    chunks × tiles >= :data:`MIN_PROGRAMS` (:data:`MIN_WAVES` waves of resident one-warp programs),
    where that takes no chunk shorter than :data:`MIN_CHUNK` steps and no more than
    :data:`MAX_CHUNKS` chunks (the carry runs one step a chunk); where it would, the shorter chunks
    would cost carry steps without buying the waves, so ⌈√T⌉ is shortened only as far as
    :data:`MIN_WAVES` programs an SM (and not below :data:`MIN_CHUNK`); ``chunk`` given: that length.

    Args:
      T: the number of steps (>= 1).
      tiles: the (rows, units) tiles of the problem.
      chunk: a fixed chunk length, or None.

    Returns:
      (C, chunks), chunks = ⌈T / C⌉.
    """
    if chunk is None:
        balanced = chunk_length(T)
        shortest = max(MIN_CHUNK, -(-T // MAX_CHUNKS))
        chunk = balanced
        while chunk // 2 >= shortest and tiles * -(-T // chunk) < MIN_PROGRAMS:
            chunk //= 2
        if tiles * -(-T // chunk) < MIN_PROGRAMS:  # the waves are out of reach: a program an SM, four times
            need = -(-MIN_WAVES * SMS // tiles)  # chunks
            chunk = max(min(balanced, MIN_CHUNK), min(balanced, T // need))
    C = min(T, chunk)
    return C, -(-T // C)


def _inputs(u_refs, idx, T):
    """The projected inputs of step ``idx`` (past T: the last step's, masked by the caller)."""
    return tuple(r[jnp.minimum(idx, T - 1)] for r in u_refs)


def _guess(h_ref, idx, T):
    """The guess's state after step ``idx`` (past T: the last one's, masked by the caller)."""
    return h_ref[jnp.minimum(idx, T - 1)]


def _linearised(cell, ws, bs, us, prev):
    """The step at ``prev`` and its derivative (elementwise: the recurrence is diagonal)."""
    return jax.jvp(lambda h: step(cell, ws, bs, us, (h,), product=jnp.multiply)[0], (prev,), (jnp.ones_like(prev),))


def _chunk(cell, refs, gates: int, T: int, C: int, body, init):
    """Run ``body`` over the C steps of this program's chunk, each step's operands loaded a step
    ahead: ``body(idx, f, d, prev, cur, carry) -> carry`` sees step idx's value f and derivative d
    at the guess's previous state ``prev``, and ``cur``, the guess's state after step idx (the
    next step's previous state); the loads of step idx + 1's inputs and state are issued before
    step idx is evaluated, so they wait behind its arithmetic, not in front of it.

    Returns:
      The final ``carry``.
    """
    u_refs, w_refs, b_refs = refs[:gates], refs[gates:2 * gates], refs[2 * gates:3 * gates]
    h_ref, s0_ref = refs[3 * gates], refs[3 * gates + 1]
    ws, bs, c = tuple(r[...] for r in w_refs), tuple(r[...] for r in b_refs), pl.program_id(0)
    first = c * C
    prev = jnp.where(first == 0, s0_ref[...], h_ref[jnp.maximum(first - 1, 0)])

    def each(t, state):
        prev, cur, us, carry = state
        idx = first + t
        ahead = (_guess(h_ref, idx + 1, T), _inputs(u_refs, idx + 1, T))  # the next step's operands
        f, d = _linearised(cell, ws, bs, us, prev)
        return (cur, *ahead, body(idx, f, d, prev, cur, carry))

    return lax.fori_loop(0, C, each, (prev, _guess(h_ref, first, T), _inputs(u_refs, first, T), init))[3]


def _reduce(*refs, cell, T: int, C: int, gates: int, measure: tuple[float, float, int, int] | None = None):
    a_ref, l_ref, *m_refs = refs[3 * gates + 2:]
    s0 = refs[3 * gates + 1][...]
    one, zero = jnp.ones_like(s0), jnp.zeros_like(s0)
    if measure is None:
        def body(idx, f, d, prev, cur, carry):
            a, loc = carry
            keep = idx < T
            return jnp.where(keep, a * d, a), jnp.where(keep, loc * d + (f - d * prev), loc)

        a_ref[...], l_ref[...] = _chunk(cell, refs, gates, T, C, body, (one, zero))
        return
    # the convergence test's residual pieces (bppsa.forward.newton.iterate) of the guess H itself, as by-products
    # of its steps f(h_{t-1}, x_t): per element over the chunk, then over the tile, the largest residual
    # |h_t - f_t| in the tolerances' units and the first step whose residual misses the tolerance; each
    # step's state h_t is loaded once, the next step's previous state
    atol, rtol, B, Hs = measure
    bt, ht = s0.shape
    rows = pl.program_id(1) * bt + lax.broadcasted_iota(jnp.int32, (bt, ht), 0)
    units = pl.program_id(2) * ht + lax.broadcasted_iota(jnp.int32, (bt, ht), 1)
    real = (rows < B) & (units < Hs)
    none = jnp.full((bt, ht), jnp.iinfo(jnp.int32).max, jnp.int32)

    def measured(idx, f, d, prev, cur, carry):
        a, loc, over, front = carry
        keep = idx < T
        r = _over(cur - f, f, atol, rtol)
        ok = real & keep
        return (jnp.where(keep, a * d, a), jnp.where(keep, loc * d + (f - d * prev), loc),
                jnp.maximum(over, jnp.where(ok, r, zero)), jnp.minimum(front, jnp.where(ok & (r > 1), idx, none)))

    a, loc, over, front = _chunk(cell, refs, gates, T, C, measured, (one, zero, zero, none))
    a_ref[...] = a
    l_ref[...] = loc
    m_refs[0][...] = jnp.max(over)
    m_refs[1][...] = jnp.min(front)


def _carry(a_ref, l_ref, s0_ref, g_ref, *, chunks: int):
    """Phase 2: each chunk's incoming state, one chunk after another, in blocks of
    :data:`CARRY_BLOCK` chunks whose maps are loaded together, the next block's while the current
    one is chained (a loop of chunks / CARRY_BLOCK trips, as the machine code runs it)."""
    U = min(chunks, CARRY_BLOCK)
    blocks, rest = divmod(chunks, U)

    def load(base):
        return (tuple(a_ref[jnp.minimum(base + j, chunks - 1)] for j in range(U)),
                tuple(l_ref[jnp.minimum(base + j, chunks - 1)] for j in range(U)))

    def chain(base, g, maps, n):
        for j in range(n):
            g_ref[base + j] = g
            g = g * maps[0][j] + maps[1][j]
        return g

    def block(k, carry):
        g, maps = carry
        ahead = load((k + 1) * U)
        return chain(k * U, g, maps, U), ahead

    g, maps = lax.fori_loop(0, blocks, block, (s0_ref[...], load(0)))
    chain(blocks * U, g, maps, rest)  # the last chunks (fewer than a block), loaded by the last trip


def _over(d, ref, atol: float, rtol: float):
    """:func:`bppsa.forward.newton`'s test of d against the tolerances, elementwise: |d| / (atol +
    rtol·|ref|), 0 where d is 0, +inf where NaN."""
    r = jnp.where(d == 0, jnp.zeros_like(d), jnp.abs(d) / (atol + rtol * jnp.abs(ref)))
    return jnp.where(jnp.isnan(r), jnp.inf, r)


def _apply(*refs, cell, T: int, C: int, gates: int, measure: tuple[float, float, int, int] | None = None):
    s0_ref, g_ref, *rest = refs[3 * gates + 1:]
    exact_ref, out_ref, *m_refs = rest if measure is not None else (None, *rest)
    first = pl.program_id(0) * C

    def solve(idx, f, d, prev, g):
        new = jnp.where(idx < T, d * (g - prev) + f, g)
        out_ref[idx - first] = new
        return new

    if measure is None:
        _chunk(cell, refs, gates, T, C, lambda idx, f, d, prev, cur, g: solve(idx, f, d, prev, g), g_ref[...])
        return
    # the convergence test's step pieces (bppsa.forward.newton.iterate) of the new iterate H', per element
    # over the chunk, then over the tile: the step H' - H past the exact states, the largest |h'_t| (a
    # repair is due); its residual is the next reduce's (which evaluates the steps at H' anyway)
    atol, rtol, B, Hs = measure
    s0 = s0_ref[...]
    bt, ht = s0.shape
    rows = pl.program_id(1) * bt + lax.broadcasted_iota(jnp.int32, (bt, ht), 0)
    units = pl.program_id(2) * ht + lax.broadcasted_iota(jnp.int32, (bt, ht), 1)
    real, exact, zero = (rows < B) & (units < Hs), cast(Any, exact_ref)[0], jnp.zeros_like(s0)

    def body(idx, f, d, prev, cur, carry):
        g, dn, rel, size = carry
        new = solve(idx, f, d, prev, g)
        ok = real & (idx < T)
        step_ = jnp.where(idx > exact, new - cur, zero)
        big = jnp.where(jnp.isnan(new), jnp.inf, jnp.abs(new))
        return (new, jnp.maximum(dn, jnp.where(ok, _over(step_, new, atol, rtol), zero)),
                rel if atol == rtol else jnp.maximum(rel, jnp.where(ok, jnp.abs(step_) / (1 + jnp.abs(new)), zero)),
                jnp.maximum(size, jnp.where(ok, big, zero)))

    _, *ms = _chunk(cell, refs, gates, T, C, body, (g_ref[...], zero, zero, zero))
    for ref, m in zip(m_refs, ms, strict=True):
        ref[...] = jnp.max(m)


class Residual(NamedTuple):
    r"""The residual pieces of the convergence test of an iterate H, as
    :func:`bppsa.forward.newton.iterate` reduces them, here over the whole sequence (scalars), made
    by :func:`fused_newton_reduce` as it evaluates the steps at H.

    Attributes:
      over: :math:`\max_{t,b,s} |h_t - f(h_{t-1}, x_t)| / (\mathrm{atol} + \mathrm{rtol} |f|)`, the
        residual in the tolerance's units.
      front: the first step t whose residual misses the tolerance (int32; its max if none).
    """

    over: Array
    front: Array


class StepSize(NamedTuple):
    r"""The step pieces of the convergence test of a new iterate H' from the guess H (scalars), made by
    :func:`fused_newton_apply` as it writes H'.

    Attributes:
      step: :math:`\max |d| / (\mathrm{atol} + \mathrm{rtol} |h'_t|)` of the step d = H' − H (0 at the
        steps t <= ``exact``).
      step_rel: :math:`\max |d| / (1 + |h'_t|)` (0 where atol = rtol: then it is ``step`` times atol, as
        iterate takes it).
      size: :math:`\max |h'_t|` (+inf for NaN): above :func:`bppsa.forward.newton.bound`, H' needs a repair
        and these measures are not its repaired iterate's.
    """

    step: Array
    step_rel: Array
    size: Array


class Measures(NamedTuple):
    r"""The convergence test's pieces of a new iterate H' from the guess H (:func:`fused_newton_iteration`):
    its :class:`Residual`'s and the step's :class:`StepSize`'s fields (see those).

    Attributes:
      over: the residual of H' in the tolerance's units.
      step: the step's size in the tolerance's units.
      step_rel: the step's size in the reported units (0 where atol = rtol).
      size: :math:`\max |h'_t|` (+inf for NaN).
      front: the first step of H' whose residual misses the tolerance.
    """

    over: Array
    step: Array
    step_rel: Array
    size: Array
    front: Array


class Aggregates(NamedTuple):
    """What :func:`fused_newton_reduce` leaves for :func:`fused_newton_apply`: each chunk's affine
    map at the guess and the padded guess itself (the apply kernel reads it again).

    Attributes:
      A: (chunks, Bp, Hp) the chunks' products of the steps' derivatives.
      L: (chunks, Bp, Hp) the chunks' offsets.
      H: (T, Bp, Hp) the guess, padded, in the kernels' dtype.
    """

    A: Array
    L: Array
    H: Array


class Operands(NamedTuple):
    """What the kernels read besides the guess, made once per sequence (:func:`newton_operands`).

    Attributes:
      us: the G padded projected inputs x_t W_x + b_x of every step (one product), each (T, Bp, Hp).
      ws: the G padded diagonals of W_h, each (Hp,).
      bs: the G padded hidden biases, each (Hp,).
    """

    us: tuple[Array, ...]
    ws: tuple[Array, ...]
    bs: tuple[Array, ...]


def _check(cell: Cell) -> None:
    if not supports(cell):
        raise ValueError(f"the fused Newton step runs bppsa.cells.BlockRNN and BlockGRU with head_size=1 "
                         f"and hidden_size <= {MAX_UNITS}; got {cell.display_name}")


def newton_operands(cell: Cell, params: Any, xs: Array, dtype: Any, *, interpret: bool = False) -> Operands:
    """The kernels' operands (:class:`Operands`) for ``cell`` over xs (T, B, I): the input
    projection, computed here once, before the Newton loop, not in each iteration.

    Args:
      cell: a cell :func:`supports` accepts.
      params: its parameters.
      xs: (T, B, I) inputs, time-major.
      dtype: the states' dtype (the kernels compute in :func:`bppsa.kernels.recurrence.compute_dtype` of it).
      interpret: the kernels run in interpret mode (else xs is marked for the GPU only).

    Returns:
      The :class:`Operands`.

    Raises:
      ValueError: a cell the kernels do not run.
    """
    _check(cell)
    xs = xs if interpret else gpu_only(xs)
    bt, _ = tile(padded_size(cell.hidden_size))
    _, _, us, ws, bs = operands(cell, params, xs, compute_dtype(dtype), diagonal=True, batch_tile=bt)
    return Operands(tuple(us), tuple(ws), tuple(bs))


def measures_fuse(dtype: Any) -> bool:
    """Whether :func:`fused_newton_iteration` measures an iterate of ``dtype`` as
    :func:`bppsa.forward.newton.iterate` does: the kernels compute in that dtype (float32,
    float64), not in a wider one whose results are rounded afterwards (16-bit floats).

    Args:
      dtype: the states' dtype.

    Returns:
      A bool.
    """
    return jnp.dtype(compute_dtype(dtype)) == jnp.dtype(dtype)


def _layout(cell: Cell, ops: Operands, T: int, chunk: int | None):
    """(bt, ht, tiles, C, chunks): the tile, the tiles (rows, units) and the chunking of the kernels' grid."""
    bt, ht = tile(padded_size(cell.hidden_size))
    Bp, Hp = ops.us[0].shape[1:]
    tiles = (Bp // bt, Hp // ht)
    C, chunks = chunking(T, tiles[0] * tiles[1], chunk)
    return bt, ht, tiles, C, chunks


def _specs(cell: Cell, T: int, bt: int, ht: int) -> list[Any]:
    """The BlockSpecs of the reduce's and apply's common operands: (us, ws, bs, H, s0)."""
    whole = pl.BlockSpec((T, bt, ht), lambda c, i, j: (0, i, j))  # indexed by step inside the kernels
    vec = pl.BlockSpec((ht,), lambda c, i, j: (j,))
    G = gate_count(cell)
    return [whole] * G + [vec] * G + [vec] * G + [whole, pl.BlockSpec((bt, ht), lambda c, i, j: (i, j))]


def _tolerances(B: int, Hs: int, atol: float, rtol: float | None) -> tuple[float, float, int, int]:
    return float(atol), float(atol if rtol is None else rtol), B, Hs


@functools.partial(jax.jit, static_argnames=("cell", "atol", "rtol", "chunk", "interpret", "num_warps"))
def fused_newton_reduce(cell: Cell, ops: Operands, s0: Array, H: Array, *, atol: float | None = None,
                        rtol: float | None = None, chunk: int | None = None, interpret: bool = False,
                        num_warps: int = 1) -> tuple[Aggregates, Residual | None]:
    """Phase 1 of a Newton step from the guess H (the module docstring): the steps and their
    derivatives at H, each chunk's affine map, and, given the tolerances, H's own residual
    (:class:`Residual`), a by-product of the steps there.

    Args:
      cell: a cell :func:`supports` accepts.
      ops: its :class:`Operands` over the inputs (T, B, I).
      s0: (B, H) the initial state.
      H: (T, B, H) the guess, H[t] the state after step t + 1 (T, B >= 1).
      atol, rtol: the tolerances (atol None: no residual; rtol None: atol).
      chunk: the chunk length (default: :func:`chunking`'s).
      interpret: run the kernel in Pallas's interpret mode (any backend).
      num_warps: Triton warps per program.

    Returns:
      (aggregates, residual): the :class:`Aggregates` :func:`fused_newton_apply` reads, and H's
      :class:`Residual` (None without atol).

    Raises:
      ValueError: a cell the kernels do not run.
    """
    _check(cell)
    T, B, _ = H.shape
    Hs, dtype = cell.hidden_size, compute_dtype(H.dtype)
    bt, ht, tiles, C, chunks = _layout(cell, ops, T, chunk)
    Bp, Hp = ops.us[0].shape[1:]
    Hg, s0p = pad_to(H.astype(dtype), (T, Bp, Hp)), pad_to(s0.astype(dtype), (Bp, Hp))
    one = pl.BlockSpec((None, bt, ht), lambda c, i, j: (c, i, j))
    per_chunk = jax.ShapeDtypeStruct((chunks, Bp, Hp), dtype)
    grid = (chunks, *tiles)
    kw = dict(cell=cell, T=T, C=C, gates=gate_count(cell))
    params_ = pl_triton.CompilerParams(num_warps=num_warps, num_stages=1)
    args = (*ops.us, *ops.ws, *ops.bs, Hg, s0p)
    if atol is None:
        A, L = pl.pallas_call(functools.partial(_reduce, **kw), grid=grid, in_specs=_specs(cell, T, bt, ht),
                              out_specs=[one, one], out_shape=[per_chunk, per_chunk], interpret=interpret,
                              compiler_params=params_)(*args)
        return Aggregates(A, L, Hg), None
    scalar = pl.BlockSpec((None, None, None), lambda c, i, j: (c, i, j))  # one per program
    A, L, over, front = pl.pallas_call(
        functools.partial(_reduce, measure=_tolerances(B, Hs, atol, rtol), **kw), grid=grid,
        in_specs=_specs(cell, T, bt, ht), out_specs=[one, one, scalar, scalar],
        out_shape=[per_chunk, per_chunk, jax.ShapeDtypeStruct(grid, dtype), jax.ShapeDtypeStruct(grid, jnp.int32)],
        interpret=interpret, compiler_params=params_)(*args)
    return Aggregates(A, L, Hg), Residual(jnp.max(over), jnp.min(front))


@functools.partial(jax.jit, static_argnames=("cell", "atol", "rtol", "chunk", "interpret", "num_warps"))
def fused_newton_apply(cell: Cell, ops: Operands, s0: Array, agg: Aggregates, exact: Array | None = None, *,
                       atol: float | None = None, rtol: float | None = None, chunk: int | None = None,
                       interpret: bool = False, num_warps: int = 1) -> tuple[Array, StepSize | None]:
    """Phases 2 and 3 of a Newton step (the module docstring) from :func:`fused_newton_reduce`'s
    aggregates at the guess H: the chunks' incoming states, then the new iterate H' and, given the
    tolerances, the step's sizes (:class:`StepSize`; H''s residual is the next reduce's).

    Args:
      cell: a cell :func:`supports` accepts.
      ops: its :class:`Operands` over the inputs (T, B, I).
      s0: (B, H) the initial state.
      agg: the guess's :class:`Aggregates` (the same ``chunk``).
      exact: the steps t <= exact are left out of the step size (an int32 scalar; None: -1, none).
      atol, rtol: the tolerances (atol None: no measures; rtol None: atol).
      chunk: the chunk length (default: :func:`chunking`'s).
      interpret: run the kernels in Pallas's interpret mode (any backend).
      num_warps: Triton warps per program.

    Returns:
      (H', steps): H' (T, B, H) the next iterate in the kernels' dtype
      (:func:`bppsa.kernels.recurrence.compute_dtype`), steps its :class:`StepSize` (None without atol).

    Raises:
      ValueError: a cell the kernels do not run.
    """
    _check(cell)
    T, B, Hs = agg.H.shape[0], s0.shape[0], cell.hidden_size
    dtype = agg.H.dtype
    bt, ht, tiles, C, chunks = _layout(cell, ops, T, chunk)
    Bp, Hp = ops.us[0].shape[1:]
    s0p = pad_to(s0.astype(dtype), (Bp, Hp))
    params_ = pl_triton.CompilerParams(num_warps=num_warps, num_stages=1)
    per_chunk = jax.ShapeDtypeStruct((chunks, Bp, Hp), dtype)
    every = pl.BlockSpec((chunks, bt, ht), lambda i, j: (0, i, j))
    carries = pl.pallas_call(functools.partial(_carry, chunks=chunks), grid=tiles,
                             in_specs=[every, every, pl.BlockSpec((bt, ht), lambda i, j: (i, j))],
                             out_specs=every, out_shape=per_chunk, interpret=interpret,
                             compiler_params=params_)(agg.A, agg.L, s0p)
    one = pl.BlockSpec((None, bt, ht), lambda c, i, j: (c, i, j))
    out_spec = pl.BlockSpec((C, bt, ht), lambda c, i, j: (c, i, j))
    out_shape = jax.ShapeDtypeStruct((chunks * C, Bp, Hp), dtype)
    grid = (chunks, *tiles)
    kw = dict(cell=cell, T=T, C=C, gates=gate_count(cell))
    args = (*ops.us, *ops.ws, *ops.bs, agg.H, s0p, carries)
    if atol is None:
        out = pl.pallas_call(functools.partial(_apply, **kw), grid=grid, in_specs=[*_specs(cell, T, bt, ht), one],
                             out_specs=out_spec, out_shape=out_shape, interpret=interpret,
                             compiler_params=params_)(*args)
        return out[:T, :B, :Hs], None
    first = jnp.full((1,), -1 if exact is None else exact, jnp.int32)
    scalar = pl.BlockSpec((None, None, None), lambda c, i, j: (c, i, j))  # one per program
    out, *ms = pl.pallas_call(functools.partial(_apply, measure=_tolerances(B, Hs, atol, rtol), **kw), grid=grid,
                              in_specs=[*_specs(cell, T, bt, ht), one, pl.BlockSpec((1,), lambda c, i, j: (0,))],
                              out_specs=[out_spec] + [scalar] * 3,
                              out_shape=[out_shape, *[jax.ShapeDtypeStruct(grid, dtype)] * 3],
                              interpret=interpret, compiler_params=params_)(*args, first)
    step_, rel, size = ms
    return out[:T, :B, :Hs], StepSize(jnp.max(step_), jnp.max(rel), jnp.max(size))


@functools.partial(jax.jit, static_argnames=("cell", "atol", "rtol", "chunk", "interpret", "num_warps"))
def fused_newton_iteration(cell: Cell, ops: Operands, s0: Array, H: Array, exact: Array | None = None, *,
                           atol: float | None = None, rtol: float | None = None, chunk: int | None = None,
                           interpret: bool = False, num_warps: int = 1) -> tuple[Array, Measures | None]:
    """One undamped Newton step of ``cell``'s chain from the guess H by the three fused kernels
    (the module docstring: :func:`fused_newton_reduce` at H, then :func:`fused_newton_apply`), from
    operands made once (:func:`newton_operands`), and, given the tolerances, the convergence test's
    pieces of the new iterate (:class:`Measures`): its step's sizes from the apply kernel, its
    residual from a second reduce, at H' (:func:`bppsa.forward.newton.iterate` keeps that reduce's
    aggregates for its next step instead).

    Args:
      cell: a cell :func:`supports` accepts.
      ops: its :class:`Operands` over the inputs (T, B, I).
      s0: (B, H) the initial state.
      H: (T, B, H) the guess, H[t] the state after step t + 1.
      exact: the steps t <= exact are left out of the step size (an int32 scalar; None: -1, none).
      atol, rtol: the tolerances (atol None: no measures; rtol None: atol).
      chunk: the chunk length (default: :func:`chunking`'s).
      interpret: run the kernels in Pallas's interpret mode (any backend).
      num_warps: Triton warps per program (one: a tile is :data:`TILE_ELEMENTS` elements).

    Returns:
      (H', measures): H' (T, B, H) the next iterate, in H's dtype; measures its :class:`Measures`
      (None without atol).

    Raises:
      ValueError: a cell the kernels do not run.
    """
    _check(cell)
    T, B, _ = H.shape
    if B == 0 or T == 0:  # no states: nothing to solve
        zero = jnp.zeros((), compute_dtype(H.dtype))
        return H, None if atol is None else Measures(zero, zero, zero, zero, jnp.int32(jnp.iinfo(jnp.int32).max))
    kw = dict(chunk=chunk, interpret=interpret, num_warps=num_warps)
    agg, _ = fused_newton_reduce(cell, ops, s0, H, **kw)
    new, steps = fused_newton_apply(cell, ops, s0, agg, exact, atol=atol, rtol=rtol, **kw)
    new = new.astype(H.dtype)
    if steps is None:
        return new, None
    res = cast(Residual, fused_newton_reduce(cell, ops, s0, new, atol=atol, rtol=rtol, **kw)[1])
    return new, Measures(res.over, steps.step, steps.step_rel, steps.size, res.front)


@functools.partial(jax.jit, static_argnames=("cell", "chunk", "interpret", "num_warps"))
def fused_newton_step(cell: Cell, params: Any, xs: Array, s0: Array, H: Array, *, chunk: int | None = None,
                      interpret: bool = False, num_warps: int = 1) -> Array:
    """One undamped Newton step of ``cell``'s chain from the guess H, by three fused kernels (the
    module docstring): what :func:`bppsa.forward.step.newton_step` computes
    (:func:`newton_operands` then :func:`fused_newton_iteration`).

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
    _check(cell)
    if xs.shape[1] == 0:  # no rows: nothing to solve
        return H
    ops = newton_operands(cell, params, xs, H.dtype, interpret=interpret)
    return fused_newton_iteration(cell, ops, s0, H, chunk=chunk, interpret=interpret, num_warps=num_warps)[0]
