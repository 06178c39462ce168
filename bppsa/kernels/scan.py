"""The scan of affine maps as three fused Pallas kernels, whatever the sequence length: BPPSA's
backward scan and the Newton forward's linear solve without ~2·log₂ n levels of separate kernels.

The maps are those of :mod:`bppsa.scan`: element k acts on a row vector as g ↦ g @ M_k + d_k, in
scan order; the result is the exclusive prefixes (prefixes[0] = v, prefixes[k + 1] = prefixes[k] @
M_k + d_k) and the total. Because the root v is a vector, only the chunks' own maps ever multiply
matrices. Over equal chunks of C elements:

1. **reduce** (one program per chunk and row): the chunk's product M_first ⋯ M_last and its
   offset (the chunk's maps applied to 0), sequentially, in registers;
2. **carry** (one program per row): the chunks' aggregates applied in order from v: the vector
   entering each chunk, and the total (n/C vector–matrix products);
3. **apply** (one program per chunk and row): each chunk's maps applied from the vector entering
   it, every prefix written out.

Three launches whatever n is, against ~2·log₂ n levels of a few kernels each for the Blelloch scan
in XLA. Phases 2 and 3 are one vector–matrix product a step, latency-bound: their dense programs
run at :func:`apply_warps` (1 warp up to Kp = 32: the product's reductions stay in a warp, fewer
barriers a step) and load the next step's operands a step ahead, in the loop's carry.

Work: phase 1 is C·k³ a chunk for (k, k) matrices (the BPPSA price, as in the Blelloch
scan's up-sweep), phases 2 and 3 vector–matrix products only. :func:`chunk_length` balances the
sequential lengths of phases 1–3 (C ≈ √n).

Three forms of the matrices:

- :func:`chunked_scan` with (k, k) blocks, k <= :data:`LANE_BLOCK` (the Block cells'
  diagonal, k = 1, and small blocks; the quasi-Newton forward): rows sit in the lanes of a program
  (:data:`ROW_TILE` rows each) and the k² products of a block are unrolled elementwise; no matrix
  unit, which such small blocks could not fill;
- :func:`chunked_scan` with larger blocks, up to :data:`MAX_BLOCK` (a dense cell's S × S
  Jacobians: GRU, LSTM, any cell): one program per row, (Kp, Kp) products (Kp = k padded to a
  power of two >= 16, Triton's smallest product; the padding is zero and leaves the real entries
  alone);
- :func:`chunked_scan_factored` for M_k = Σ_q diag(A_{q,k}) @ Wt_q (an Elman RNN's transposed
  Jacobians, Q = 1; a GRU's, Q = 4; an LSTM's, Q = 5: :class:`bppsa.cells.Factored`):
  the matrices are formed inside the kernels from the step's factors and the Q resident matrices,
  so memory carries Q·S numbers a step instead of the S² of a matrix (and XLA never writes the
  (n, B, S, S) Jacobians), for Q products a step in phase 1 instead of one.

Elements past n (the last chunk's padding) are masked: they leave the carried values alone.
Products are IEEE float32 on the GPU (``Precision.HIGHEST``, not TF32); 16-bit inputs are computed
in float32 (:func:`bppsa.kernels.recurrence.compute_dtype`) and rounded back. Backend: Pallas's Triton
backend, as for :mod:`bppsa.kernels.recurrence` (which says why). ``interpret=True`` runs the same
kernels in Pallas's interpret mode on any backend (tests, debugging; float64 too).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax import Array, lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pl_triton

from bppsa.kernels.lowering import gpu_only
from bppsa.kernels.recurrence import compute_dtype, dot, pad_to, padded_size

__all__ = ["LANE_BLOCK", "MAX_BLOCK", "ROW_TILE", "ROWS", "COLUMNS", "chunk_length", "reduce_warps", "apply_warps",
           "chunked_scan",
           "chunked_scan_factored"]

#: The largest block size scanned in lanes (elementwise, k³ products unrolled a step).
LANE_BLOCK = 8
#: The largest block (or dense state) size the kernels take: a GRU's S = H at H = 64, an LSTM's
#: S = 2H at H = 32. At 128 (an LSTM at H = 64) the compiled reduce spills registers whatever its
#: tiles and warps (84/76 B at best; the factored form's 39/58 KB and 361 KiB of shared memory,
#: more than a block may have), and so does the factored apply (3.1 KB).
MAX_BLOCK = 64
#: Rows a program of the lane kernels owns (a power of two).
ROW_TILE = 128
#: The dense reduce's tile of a chunk's product: ROWS rows a program, in column tiles of at most
#: COLUMNS (:func:`_dense_reduce`); at Kp = 128 one program's (128, 128) @ (128, 128) product
#: spilled 105 KB of registers (now refused, :data:`MAX_BLOCK`), at Kp = 64 0.9 KB, the factored one
#: at Kp = 64 79 KB; tiled, none.
ROWS, COLUMNS = 16, 32


def chunk_length(n: int) -> int:
    """The chunk length C for n elements: ⌈√n⌉, which balances phase 1's and 3's C sequential steps
    against phase 2's ⌈n / C⌉.

    Args:
      n: the number of elements (>= 1).

    Returns:
      C, 1 <= C <= n.
    """
    return max(1, math.ceil(math.sqrt(n)))


def _params(num_warps: int | None, default: int = 4):
    return pl_triton.CompilerParams(num_warps=num_warps or default, num_stages=1)


def reduce_warps(Kp: int, factors: int) -> int:
    """The warps of the dense reduce's programs: 8 for the factored form at Kp = 64 (its Q products
    a step spill registers at 4 warps: 6.7 KB at Q = 5), else 4 (the dense form at Kp = 64 spills at 8).

    Args:
      Kp: the padded block size.
      factors: Q, or 0 for stored matrices.

    Returns:
      4 or 8.
    """
    return 8 if factors and Kp > 32 else 4


def apply_warps(Kp: int, factors: int = 0) -> int:
    """The warps of the dense carry's and apply's programs (phases 2 and 3: one vector–matrix product
    a step): the fewest (1, 2, 4 or 8) that hold their resident matrices in at most 160 numbers a
    thread: the Q (Kp, Kp) matrices of the factored form, or a stored matrix and the next step's
    (loaded a step ahead). One warp keeps the product's reductions in a warp (5 barriers a step at
    the GRU's factored apply, Kp = 32, instead of 22 at 4 warps); beyond the bound they spill (a
    stored (64, 64) matrix at 1 warp: 120/104 B; Q = 4 and 5 at Kp = 64 at 2 warps: 164/152 and
    480/464 B).

    Args:
      Kp: the padded block size.
      factors: Q, or 0 for stored matrices (the carry's aggregates, :func:`chunked_scan`'s).

    Returns:
      1, 2, 4 or 8.
    """
    numbers = (factors or 2) * Kp * Kp
    return next((w for w in (1, 2, 4) if numbers <= 160 * 32 * w), 8)


# -- lanes: (k, k) blocks with k <= LANE_BLOCK, rows in the lanes -----------------------------------
# A block is k² planes of ROW_TILE lanes: Mp[t, i, j] (ROW_TILE,) = M_t[row, i, j] over the tile's rows.


def _lane_vecmat(g, M):
    """(g @ M) per lane: g a tuple of k lane vectors, M a tuple of k tuples of k."""
    k = len(g)
    return tuple(sum((g[i] * M[i][j] for i in range(1, k)), g[0] * M[0][j]) for j in range(k))


def _lane_load(m_ref, d_ref, t):
    k = d_ref.shape[1]
    return tuple(tuple(m_ref[t, i, j] for j in range(k)) for i in range(k)), tuple(d_ref[t, i] for i in range(k))


def _lane_reduce(m_ref, d_ref, p_ref, l_ref, *, C: int, n: int):
    k, c = d_ref.shape[1], pl.program_id(0)
    zero = jnp.zeros(d_ref.shape[2:], d_ref.dtype)
    one = jnp.ones_like(zero)
    eye = tuple(tuple(one if i == j else zero for j in range(k)) for i in range(k))

    def body(t, carry):
        P, loc = carry
        M, d = _lane_load(m_ref, d_ref, t)
        keep = c * C + t < n
        P2 = tuple(_lane_vecmat(row, M) for row in P)
        loc2 = tuple(a + b for a, b in zip(_lane_vecmat(loc, M), d, strict=True))
        pick = lambda new, old: jnp.where(keep, new, old)  # noqa: E731
        return (tuple(tuple(map(pick, r2, r)) for r2, r in zip(P2, P, strict=True)), tuple(map(pick, loc2, loc)))

    P, loc = lax.fori_loop(0, C, body, (eye, (zero,) * k))
    for i in range(k):
        l_ref[i] = loc[i]
        for j in range(k):
            p_ref[i, j] = P[i][j]


def _lane_carry(p_ref, l_ref, v_ref, c_ref, total_ref, *, chunks: int):
    k = v_ref.shape[0]

    def body(c, carry):
        g, (P, loc) = carry
        ahead = _lane_load(p_ref, l_ref, jnp.minimum(c + 1, chunks - 1))  # the next chunk's, a step ahead
        for i in range(k):
            c_ref[c, i] = g[i]
        return tuple(a + b for a, b in zip(_lane_vecmat(g, P), loc, strict=True)), ahead

    g, _ = lax.fori_loop(0, chunks, body, (tuple(v_ref[i] for i in range(k)), _lane_load(p_ref, l_ref, 0)))
    for i in range(k):
        total_ref[i] = g[i]


def _lane_apply(m_ref, d_ref, g_ref, out_ref, *, C: int, n: int):
    k, c = d_ref.shape[1], pl.program_id(0)

    def body(t, g):  # loaded in the step: a step ahead was 441 instructions, not 383, 128 registers, no faster
        for i in range(k):
            out_ref[t, i] = g[i]
        M, d = _lane_load(m_ref, d_ref, t)
        keep = c * C + t < n
        return tuple(jnp.where(keep, a + b, x) for a, b, x in zip(_lane_vecmat(g, M), d, g, strict=True))

    lax.fori_loop(0, C, body, tuple(g_ref[i] for i in range(k)))


def _lane_scan(v, Ms, ds, C, interpret, num_warps):
    n, R, k, _ = Ms.shape
    chunks, Rp, dtype = -(-n // C), ROW_TILE * -(-R // ROW_TILE), v.dtype
    N, tiles = chunks * C, Rp // ROW_TILE
    Mp = pad_to(jnp.transpose(Ms, (0, 2, 3, 1)), (N, k, k, Rp))  # (N, k, k, Rp) planes
    dp = pad_to(jnp.transpose(ds, (0, 2, 1)), (N, k, Rp))
    vp = pad_to(v.T, (k, Rp))
    m_chunk = pl.BlockSpec((C, k, k, ROW_TILE), lambda c, r: (c, 0, 0, r))
    d_chunk = pl.BlockSpec((C, k, ROW_TILE), lambda c, r: (c, 0, r))
    p_one = pl.BlockSpec((None, k, k, ROW_TILE), lambda c, r: (c, 0, 0, r))
    l_one = pl.BlockSpec((None, k, ROW_TILE), lambda c, r: (c, 0, r))
    P, L = pl.pallas_call(
        functools.partial(_lane_reduce, C=C, n=n), grid=(chunks, tiles), in_specs=[m_chunk, d_chunk],
        out_specs=[p_one, l_one], out_shape=[jax.ShapeDtypeStruct((chunks, k, k, Rp), dtype),
                                             jax.ShapeDtypeStruct((chunks, k, Rp), dtype)],
        interpret=interpret, compiler_params=_params(num_warps))(Mp, dp)
    row = pl.BlockSpec((k, ROW_TILE), lambda r: (0, r))
    carries, total = pl.pallas_call(
        functools.partial(_lane_carry, chunks=chunks), grid=(tiles,),
        in_specs=[pl.BlockSpec((chunks, k, k, ROW_TILE), lambda r: (0, 0, 0, r)),
                  pl.BlockSpec((chunks, k, ROW_TILE), lambda r: (0, 0, r)), row],
        out_specs=[pl.BlockSpec((chunks, k, ROW_TILE), lambda r: (0, 0, r)), row],
        out_shape=[jax.ShapeDtypeStruct((chunks, k, Rp), dtype), jax.ShapeDtypeStruct((k, Rp), dtype)],
        interpret=interpret, compiler_params=_params(num_warps))(P, L, vp)
    out = pl.pallas_call(
        functools.partial(_lane_apply, C=C, n=n), grid=(chunks, tiles), in_specs=[m_chunk, d_chunk, l_one],
        out_specs=d_chunk, out_shape=jax.ShapeDtypeStruct((N, k, Rp), dtype),
        interpret=interpret, compiler_params=_params(num_warps))(Mp, dp, carries)
    return jnp.transpose(out[:n, :, :R], (0, 2, 1)), total[:, :R].T


# -- dense: one row a program, (Kp, Kp) matrices or diag(A) @ Wt formed in the kernel ------------------


def _vecmat(g, M):
    """g (Kp,) @ M (Kp, Kp), as a broadcast product and a reduction (one row: no matrix unit)."""
    return jnp.sum(g[:, None] * M, axis=0)


def _split(refs, factors: int):
    """The kernel's input refs: the stored matrices (factors = 0), or the Q factors' A_q refs and
    their Q resident matrices (loaded); then the offsets' ref and the rest."""
    if not factors:
        return (refs[0],), None, refs[1], refs[2:]
    return refs[:factors], tuple(r[...] for r in refs[factors:2 * factors]), refs[2 * factors], refs[2 * factors + 1:]


def _times(g, ms, wts):
    """g @ M_t: the stored matrix ``ms[0]``, or Σ_q (g ⊙ A_{q,t}) @ Wt_q = g @ Σ_q diag(A_{q,t}) Wt_q
    from the step's factors ``ms`` and the resident matrices (M_t never formed)."""
    if wts is None:
        return _vecmat(g, ms[0])
    return functools.reduce(jnp.add, [_vecmat(g * a, wt) for a, wt in zip(ms, wts, strict=True)])


def _blocks(ref, index, width: int) -> list[list[Array]]:
    """``ref[*index]``, a (Kp, Kp) matrix, as its (width, width) blocks [k][j] (rows k, columns j)."""
    n = ref.shape[-1] // width
    return [[ref[(*index, pl.ds(k * width, width), pl.ds(j * width, width))] for j in range(n)] for k in range(n)]


def _dense_reduce(*refs, C: int, n: int, factors: int):
    """One program: row tile i of the chunk's product P (rows i·ROWS.., (ROWS, Kp)), or, for the
    last tile, the chunk's offset (every row of the tile the same vector). Both as column tiles of
    :data:`COLUMNS`: out tile j = Σ_k P_k @ M[k, j] (small products: a (ROWS, Kp) @ (Kp, Kp) one at
    Kp = 64 or 128 keeps more operands in registers than a thread has)."""
    if factors:
        m_refs, w_refs, d_ref, p_ref = refs[:factors], refs[factors:2 * factors], refs[2 * factors], refs[-1]
    else:
        m_refs, w_refs, d_ref, p_ref = refs[:1], (), refs[1], refs[-1]
    c, i, Kp = pl.program_id(0), pl.program_id(2), d_ref.shape[-1]
    rows, width = p_ref.shape[0], min(Kp, COLUMNS)
    is_loc = i == Kp // rows
    cols = lax.broadcasted_iota(jnp.int32, (rows, width), 1)
    row_ids = i * rows + lax.broadcasted_iota(jnp.int32, (rows, width), 0)
    dtype = d_ref.dtype
    P0 = tuple(jnp.where(row_ids == j * width + cols, 1.0, 0.0).astype(dtype) for j in range(Kp // width))

    def body(t, P):
        keep = c * C + t < n
        d = [d_ref[t, pl.ds(j * width, width)] for j in range(len(P))]
        if factors:  # P Σ_q diag(a_q) Wt_q = Σ_q (P ⊙ a_q) Wt_q: the matrix never formed
            terms = []
            for m_ref, w_ref in zip(m_refs, w_refs, strict=True):
                a = [m_ref[t, pl.ds(k * width, width)] for k in range(len(P))]
                terms.append(([p * a_k[None, :] for p, a_k in zip(P, a, strict=True)], _blocks(w_ref, (), width)))
        else:
            terms = [(list(P), _blocks(m_refs[0], (t,), width))]
        new = []
        for j in range(len(P)):
            acc = functools.reduce(jnp.add, [dot(x[k], w[k][j]) for x, w in terms for k in range(len(P))])
            new.append(jnp.where(keep, acc + jnp.where(is_loc, d[j][None, :], 0.0), P[j]))
        return tuple(new)

    P = lax.fori_loop(0, C, body, P0)
    for j, tile in enumerate(P):
        p_ref[:, pl.ds(j * width, width)] = tile


def _dense_carry(p_ref, l_ref, v_ref, c_ref, total_ref, *, chunks: int):
    def body(c, carry):
        g, P, loc = carry
        nxt = jnp.minimum(c + 1, chunks - 1)
        ahead = p_ref[nxt], l_ref[nxt]  # the next chunk's aggregate, issued a step ahead
        c_ref[c] = g
        return _vecmat(g, P) + loc, *ahead

    total_ref[...] = lax.fori_loop(0, chunks, body, (v_ref[...], p_ref[0], l_ref[0]))[0]


def _dense_apply(*refs, C: int, n: int, factors: int):
    m_refs, wts, d_ref, (g_ref, out_ref) = _split(refs, factors)
    c = pl.program_id(0)
    read = lambda t: (tuple(r[t] for r in m_refs), d_ref[t])  # noqa: E731

    def body(t, carry):
        g, (ms, d) = carry
        ahead = read(jnp.minimum(t + 1, C - 1))  # the next step's operands, issued a step ahead
        out_ref[t] = g
        new = _times(g, ms, wts) + d
        return jnp.where(c * C + t < n, new, g), ahead

    lax.fori_loop(0, C, body, (g_ref[...], read(0)))


def _dense_scan(v, Ms, ds, C, interpret, num_warps, Wt=None):
    """Ms (n, R, k, k), or with ``Wt`` (Q, k, k) the factors A (Q, n, R, k) of Σ_q diag(A_q) @ Wt_q."""
    n, R, k = ds.shape
    chunks, Kp, dtype = -(-n // C), padded_size(k), v.dtype
    N, factors = chunks * C, 0 if Wt is None else Wt.shape[0]
    if Wt is None:
        ms, extra = [pad_to(Ms, (N, R, Kp, Kp))], []
    else:
        ms = [pad_to(a, (N, R, Kp)) for a in Ms]
        extra = [pad_to(w, (Kp, Kp)) for w in Wt]
    dp, vp = pad_to(ds, (N, R, Kp)), pad_to(v, (R, Kp))
    w_spec = [pl.BlockSpec((Kp, Kp), lambda c, r: (0, 0))] * factors
    m_chunk = ([pl.BlockSpec((C, None, Kp), lambda c, r: (c, r, 0))] * factors if factors
               else [pl.BlockSpec((C, None, Kp, Kp), lambda c, r: (c, r, 0, 0))])
    d_chunk = pl.BlockSpec((C, None, Kp), lambda c, r: (c, r, 0))
    l_one = pl.BlockSpec((None, None, Kp), lambda c, r: (c, r, 0))
    tiles = Kp // ROWS + 1  # the product's row tiles, and the offset's
    r3 = lambda spec: pl.BlockSpec(spec.block_shape, lambda c, r, i: spec.index_map(c, r))  # noqa: E731
    PL = pl.pallas_call(
        functools.partial(_dense_reduce, C=C, n=n, factors=factors), grid=(chunks, R, tiles),
        in_specs=[*map(r3, m_chunk), *map(r3, w_spec), r3(d_chunk)],
        out_specs=pl.BlockSpec((None, None, ROWS, Kp), lambda c, r, i: (c, r, i, 0)),
        out_shape=jax.ShapeDtypeStruct((chunks, R, tiles * ROWS, Kp), dtype),
        interpret=interpret, compiler_params=_params(num_warps, reduce_warps(Kp, factors)))(*ms, *extra, dp)
    P, L = PL[:, :, :Kp], PL[:, :, Kp]
    row = pl.BlockSpec((None, Kp), lambda r: (r, 0))
    carries, total = pl.pallas_call(
        functools.partial(_dense_carry, chunks=chunks), grid=(R,),
        in_specs=[pl.BlockSpec((chunks, None, Kp, Kp), lambda r: (0, r, 0, 0)),
                  pl.BlockSpec((chunks, None, Kp), lambda r: (0, r, 0)), row],
        out_specs=[pl.BlockSpec((chunks, None, Kp), lambda r: (0, r, 0)), row],
        out_shape=[jax.ShapeDtypeStruct((chunks, R, Kp), dtype), jax.ShapeDtypeStruct((R, Kp), dtype)],
        interpret=interpret, compiler_params=_params(num_warps, apply_warps(Kp)))(P, L, vp)
    out = pl.pallas_call(
        functools.partial(_dense_apply, C=C, n=n, factors=factors), grid=(chunks, R),
        in_specs=[*m_chunk, *w_spec, d_chunk, l_one], out_specs=d_chunk,
        out_shape=jax.ShapeDtypeStruct((N, R, Kp), dtype),
        interpret=interpret, compiler_params=_params(num_warps, apply_warps(Kp, factors)))(*ms, *extra, dp, carries)
    return out[:n, :, :k], total[:, :k]


def _check(v: Array, ds: Array | None, n: int, R: int, k: int) -> None:
    if n == 0:
        raise ValueError("the scan needs at least one element (n >= 1); got n = 0")
    if v.shape != (R, k):
        raise ValueError(f"v must have shape (R, k) = {(R, k)}; got {v.shape}")
    if ds is not None and ds.shape != (n, R, k):
        raise ValueError(f"ds must have shape (n, R, k) = {(n, R, k)}; got {ds.shape}")
    if k > MAX_BLOCK:
        raise ValueError(f"the fused scan takes blocks of at most {MAX_BLOCK} (k = {k}): a larger one spills "
                         "registers on the GPU; kernels='xla' scans it")


def _run(kernels, v, Ms, ds, n, chunk, interpret, num_warps):
    """What both entry points do around their kernels: no launch for no rows, the arrays in the
    compute dtype (:func:`bppsa.kernels.recurrence.compute_dtype`), the chunk length, the results
    back in v's dtype. ``Ms``: the matrices or the factors; n: the number of elements."""
    R, k = v.shape
    if R == 0:  # no rows: no program to run
        return jnp.zeros((n, 0, k), v.dtype), v
    dtype = compute_dtype(v.dtype)
    v = v if interpret else gpu_only(v)
    ds = jnp.zeros((n, R, k), dtype) if ds is None else ds
    C = min(n, chunk or chunk_length(n))
    prefixes, total = kernels(v.astype(dtype), Ms.astype(dtype), ds.astype(dtype), C, interpret, num_warps)
    return prefixes.astype(v.dtype), total.astype(v.dtype)


@functools.partial(jax.jit, static_argnames=("chunk", "interpret", "num_warps"))
def chunked_scan(v: Array, Ms: Array, ds: Array | None = None, *, chunk: int | None = None,
                 interpret: bool = False, num_warps: int | None = None) -> tuple[Array, Array]:
    """The scan of the maps g ↦ g @ Ms[k] + ds[k] from v, in three fused kernels (the module
    docstring): the same result as :func:`bppsa.scan.blocks.block_scan` (and, for R = B rows
    of k = S, :func:`bppsa.scan.dense.scan`).

    Args:
      v: (R, k) the root vectors, one per row.
      Ms: (n, R, k, k) the maps' matrices, in scan order; k <= :data:`MAX_BLOCK`.
      ds: (n, R, k) their offsets, or None (all zero).
      chunk: the chunk length C (default :func:`chunk_length`).
      interpret: run the kernels in Pallas's interpret mode (any backend).
      num_warps: Triton warps per program (None: 4, the dense reduce's :func:`reduce_warps`, the dense
        carry's and apply's :func:`apply_warps`).

    Returns:
      (prefixes, total), prefixes (n, R, k) the exclusive prefixes (prefixes[0] = v) and total
      (R, k), in v's dtype.

    Raises:
      ValueError: shapes that do not match, n = 0, or k > :data:`MAX_BLOCK`.
    """
    n, R, k = Ms.shape[0], Ms.shape[1], Ms.shape[-1]
    if Ms.ndim != 4 or Ms.shape[-2] != k:
        raise ValueError(f"Ms must have shape (n, R, k, k); got {Ms.shape}")
    _check(v, ds, n, R, k)
    return _run(_lane_scan if k <= LANE_BLOCK else _dense_scan, v, Ms, ds, n, chunk, interpret, num_warps)


@functools.partial(jax.jit, static_argnames=("chunk", "interpret", "num_warps"))
def chunked_scan_factored(v: Array, A: Array, Wt: Array, ds: Array | None = None, *, chunk: int | None = None,
                          interpret: bool = False, num_warps: int | None = None) -> tuple[Array, Array]:
    """:func:`chunked_scan` for matrices made of per-step factors and shared matrices, M_k =
    Σ_q diag(A_{q,k}) @ Wt_q (an Elman RNN's transposed Jacobians: Q = 1; a GRU's, an LSTM's:
    :class:`bppsa.cells.Factored`), formed inside the kernels: the same result as
    ``chunked_scan(v, einsum("qnri,qij->nrij", A, Wt), ds)`` without the (n, R, S, S) matrices in
    memory (Q·S numbers a step instead of S²).

    Args:
      v: (R, S) the root vectors.
      A: (Q, n, R, S) the factors A_{q,k}, in scan order; or (n, R, S), one factor.
      Wt: (Q, S, S) the shared matrices; or (S, S) with a 3-axis ``A``. S <= :data:`MAX_BLOCK`.
      ds: (n, R, S) the offsets, or None (all zero).
      chunk: the chunk length C (default :func:`chunk_length`).
      interpret: run the kernels in Pallas's interpret mode (any backend).
      num_warps: Triton warps per program (None: 4, the dense reduce's :func:`reduce_warps`, the dense
        carry's and apply's :func:`apply_warps`).

    Returns:
      (prefixes, total), prefixes (n, R, S) and total (R, S), in v's dtype.

    Raises:
      ValueError: shapes that do not match, n = 0, or S > :data:`MAX_BLOCK`.
    """
    if A.ndim == 3:
        A, Wt = A[None], Wt[None]
    Q, n, R, S = A.shape
    if Wt.shape != (Q, S, S):
        raise ValueError(f"Wt must have shape (Q, S, S) = {(Q, S, S)} (or (S, S) with one factor); got {Wt.shape}")
    _check(v, ds, n, R, S)
    kernels = functools.partial(_dense_scan, Wt=Wt.astype(compute_dtype(v.dtype)))
    return _run(kernels, v, A, ds, n, chunk, interpret, num_warps)
