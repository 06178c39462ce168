r"""Scans that solve the back-propagation recurrence of a chain (BPPSA, Wang et al., MLSys 2020).

The backward pass of a chain :math:`h_t = f(h_{t-1}, x_t)` is the linear recurrence (row vectors,
one per batch element)

.. math::

    g_{t-1} = g_t M_t + c_{t-1}, \qquad g_T = c_T,

with :math:`M_t` the (S, S) transposed Jacobian of step t acting from the right and :math:`c_t` the
direct loss gradient at step t. Written in *scan order* (latest step first) it is a prefix scan of

.. math::

    [v, e_1, e_2, \dots, e_n], \qquad v = g_T \text{ (a vector)}, \qquad
    e_k = (M_k, d_k): x \mapsto x M_k + d_k,

under composition :math:`(M_1, d_1)` then :math:`(M_2, d_2)` = :math:`(M_1 M_2,\; d_1 M_2 + d_2)`, which is
associative and not
commutative. Every function here takes ::

    v:  (B, S)        the root vector,
    Ms: (n, B, S, S)  the matrices of e_1 ... e_n, in scan order,
    ds: (n, B, S)     their offsets (None: all zero),

and returns ``(prefixes, total)`` with ::

    prefixes: (n, B, S)   prefixes[k] = v ∘ e_1 ∘ ... ∘ e_k   (exclusive of e_{k+1}; prefixes[0] = v),
    total:    (B, S)      v ∘ e_1 ∘ ... ∘ e_n.

For a chain of T steps, n = T, e_k holds M_{T-k+1} and c_{T-k}; then prefixes[k] = g_{T-k} and
total = g_0 (see :mod:`bppsa.backward.pipeline`). The scans know nothing about cells or devices.
The dense scans of :mod:`bppsa.scan`, their Blelloch sweeps and the tuned storage order.
"""

from __future__ import annotations

import operator
from typing import Any, Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array, lax

__all__ = ["SCANS", "scan", "blelloch_scan", "associative_scan", "sequential_scan", "Products", "DENSE",
           "FUSED", "up_sweep", "down_sweep", "vecmat", "batched_matmul", "batched_vecmat", "FMA_MAX",
           "FMA_MIN_PRODUCTS", "diagonal_products", "bottom_layout", "bottom_order", "to_storage", "from_storage",
           "blelloch_scan_stored", "blelloch_scan_stored_diag"]


def vecmat(v: Array, M: Array) -> Array:
    """(..., B, S) @ (..., B, S, S) -> (..., B, S): one row vector times one matrix per batch row
    (the reference product; :func:`batched_vecmat` is the tuned one).

    Args:
      v: (..., B, S) row vectors.
      M: (..., B, S, S) matrices, one per row of ``v`` (leading axes broadcast).

    Returns:
      (..., B, S), each row of ``v`` times its matrix.
    """
    return jnp.einsum("...i,...ij->...j", v, M)


def _check(v, Ms, ds):
    if Ms.ndim != 4 or Ms.shape[-1] != Ms.shape[-2]:
        raise ValueError(f"Ms must have shape (n, B, S, S); got {Ms.shape}")
    n, B, S, _ = Ms.shape
    if v.shape != (B, S):
        raise ValueError(f"v must have shape (B, S) = {(B, S)}; got {v.shape}")
    if ds is not None and ds.shape != (n, B, S):
        raise ValueError(f"ds must have shape (n, B, S) = {(n, B, S)}; got {ds.shape}")
    if n == 0:
        raise ValueError("the scan needs at least one element (n >= 1); got n = 0")


# --------------------------------------------------------------------------------------------
# Sequential reference.
# --------------------------------------------------------------------------------------------

def sequential_scan(v: Array, Ms: Array, ds: Array | None = None) -> tuple[Array, Array]:
    """The reference: a ``lax.scan`` over the elements. Work Θ(n·B·S²), depth Θ(n).

    Args:
      v: (B, S) the root vector.
      Ms: (n, B, S, S) the matrices of e_1 … e_n, in scan order.
      ds: (n, B, S) their offsets, or None (all zero).

    Returns:
      (prefixes, total), prefixes (n, B, S) the exclusive prefixes (prefixes[0] = v) and total (B, S)
      v ∘ e_1 ∘ … ∘ e_n, as the module docstring says.

    Raises:
      ValueError: shapes other than the module docstring's, or n = 0.

    Examples:
      >>> import jax, jax.numpy as jnp
      >>> from bppsa.scan import sequential_scan, sequential_scan
      >>> n, B, S = 5, 2, 3
      >>> v = jnp.ones((B, S))
      >>> Ms = 0.5 * jax.random.normal(jax.random.key(0), (n, B, S, S))
      >>> prefixes, total = sequential_scan(v, Ms)
      >>> prefixes.shape, total.shape
      ((5, 2, 3), (2, 3))
      >>> bool(jnp.allclose(prefixes[0], v))                # exclusive: prefixes[0] = v
      True
      >>> ref = v[:, None] @ Ms[0] @ Ms[1] @ Ms[2] @ Ms[3] @ Ms[4]  # v ∘ e_1 ∘ … ∘ e_5, row vectors
      >>> bool(jnp.allclose(total, ref[:, 0], atol=1e-5))
      True
    """
    _check(v, Ms, ds)

    def step(x, e):
        M, d = e
        y = vecmat(x, M)
        return (y if d is None else y + d), x

    total, prefixes = lax.scan(step, v, (Ms, ds))
    return prefixes, total


# --------------------------------------------------------------------------------------------
# jax.lax.associative_scan with an affine combine.
# --------------------------------------------------------------------------------------------

def associative_scan(v: Array, Ms: Array, ds: Array | None = None) -> tuple[Array, Array]:
    """Inclusive ``jax.lax.associative_scan`` of the affine maps, then one vector product each.

    Work Θ(n·B·S³) (matrix–matrix products, about 2n of them in XLA's odd/even recursion),
    depth Θ(log n) combine levels, plus one parallel level of vector–matrix products.

    Args:
      v: (B, S) the root vector.
      Ms: (n, B, S, S) the matrices of e_1 … e_n, in scan order.
      ds: (n, B, S) their offsets, or None (all zero).

    Returns:
      (prefixes, total), prefixes (n, B, S) and total (B, S) as :func:`sequential_scan`.

    Raises:
      ValueError: shapes other than the module docstring's, or n = 0.

    Examples:
      >>> import jax, jax.numpy as jnp
      >>> from bppsa.scan import associative_scan, sequential_scan
      >>> n, B, S = 5, 2, 3
      >>> v = jnp.ones((B, S))
      >>> Ms = 0.5 * jax.random.normal(jax.random.key(0), (n, B, S, S))
      >>> prefixes, total = associative_scan(v, Ms)
      >>> prefixes.shape, total.shape
      ((5, 2, 3), (2, 3))
      >>> bool(jnp.allclose(prefixes[0], v))                # exclusive: prefixes[0] = v
      True
      >>> ref = v[:, None] @ Ms[0] @ Ms[1] @ Ms[2] @ Ms[3] @ Ms[4]  # v ∘ e_1 ∘ … ∘ e_5, row vectors
      >>> bool(jnp.allclose(total, ref[:, 0], atol=1e-5))
      True
      >>> bool(jnp.allclose(prefixes, sequential_scan(v, Ms)[0], atol=1e-5))
      True
    """
    _check(v, Ms, ds)
    if ds is None:
        P = lax.associative_scan(jnp.matmul, Ms)
        inclusive = vecmat(v, P)
    else:
        def combine(a, b):  # a precedes b in scan order
            Ma, da = a
            Mb, db = b
            return Ma @ Mb, vecmat(da, Mb) + db

        P, q = lax.associative_scan(combine, (Ms, ds))
        inclusive = vecmat(v, P) + q
    prefixes = jnp.concatenate([v[None], inclusive[:-1]], axis=0)
    return prefixes, inclusive[-1]


# --------------------------------------------------------------------------------------------
# The modified Blelloch scan with the vector at the root: one up-sweep and one down-sweep,
# parameterised by their products (dense, fused small-S, sparse lists: see bppsa.sparse).
# --------------------------------------------------------------------------------------------

class Products(NamedTuple):
    """The products a sweep is made of, and the sequences it stores elements and vectors in.

    Offsets (``ds``) are added with ``+``. :data:`DENSE` and :data:`FUSED` work on stacked arrays
    (leading axis = sequence); :func:`bppsa.sparse.products` on Python lists of sparse matrices.

    Attributes:
      compose: ``compose(L, R)``, equal-length sequences of elements -> the compositions "L_j then R_j".
      push: ``push(x, M)``, one vector through one element (block 0 absorbing block 1).
      push_all: ``push_all(X, M)``, a sequence of vectors, each through its element.
      concat: ``concat(parts)``, one sequence from a list of sequences (default: concatenated along axis 0).
      interleave: ``interleave(a, b)``, the sequence [a_0, b_0, a_1, b_1, ...] (default: of stacked arrays).
      one: ``one(v)``, the sequence holding just v (default: ``v[None]``).
    """
    compose: Callable
    push: Callable
    push_all: Callable
    concat: Callable = lambda parts: jnp.concatenate(parts, axis=0)
    interleave: Callable = lambda a, b: jnp.stack([a, b], axis=1).reshape((2 * a.shape[0],) + a.shape[1:])
    one: Callable = lambda v: v[None]


DENSE = Products(compose=jnp.matmul, push=vecmat, push_all=vecmat)  # the reference products

def up_sweep(v: Any, Ms: Any, ds: Any = None, *, products: Products | None = None,
             levels: int | None = None) -> list[tuple[Any, Any, Any]]:
    """The reduce phase of the modified Blelloch scan.

    Level 0 has the N = n + 1 blocks [v, e_1, ..., e_n]; level L + 1 pairs adjacent blocks of
    level L (an odd block out is carried up unchanged). Block 0 always starts at element 0, so
    its value is a *vector* (vector @ matrix); every other block is an affine map (matrix @
    matrix). Returns one record per level, bottom first, each ``(vec, Ms, ds)`` where ``vec``
    (B, S) is block 0's value and ``Ms`` (N_L - 1, B, S, S), ``ds`` (N_L - 1, B, S) or None hold
    blocks 1 .. N_L - 1. With all levels (``levels=None``) the last record is the root: its
    ``vec`` is the total v ∘ e_1 ∘ … ∘ e_n. ``products`` (default :data:`DENSE`) does the products.

    Args:
      v: (B, S) the root vector.
      Ms: (n, B, S, S) the matrices of e_1 … e_n in scan order (or the sequence ``products`` stores).
      ds: (n, B, S) their offsets, or None (all zero).
      products: the :class:`Products` of the sweep (None: :data:`DENSE`).
      levels: build at most this many levels above level 0 (None: all, up to the root).

    Returns:
      The records ``(vec, Ms, ds)``, level 0 (the inputs) first, each with vec (B, S),
      Ms (N_L - 1, B, S, S) and ds (N_L - 1, B, S) or None.
    """
    pr = DENSE if products is None else products
    records = [(v, Ms, ds)]
    while len(Ms) >= 1 and (levels is None or len(records) - 1 < levels):  # more than one block
        P, carried = (len(Ms) - 1) // 2, len(Ms) % 2 == 0 and len(Ms) >= 2
        vec = pr.push(v, Ms[0]) if ds is None else pr.push(v, Ms[0]) + ds[0]  # block 0 absorbs block 1
        L, R = Ms[1:1 + 2 * P:2], Ms[2:2 + 2 * P:2]  # pairs (2j, 2j + 1), j >= 1: matrix-matrix
        new_M = pr.compose(L, R) if P else Ms[:0]
        new_d = None if ds is None else (pr.push_all(ds[1:1 + 2 * P:2], R) + ds[2:2 + 2 * P:2] if P else ds[:0])
        if carried:  # the last block has no partner: carry it up
            new_M = pr.concat([new_M, Ms[-1:]])
            new_d = None if ds is None else pr.concat([new_d, ds[-1:]])
        v, Ms, ds = vec, new_M, new_d
        records.append((v, Ms, ds))
    return records


def down_sweep(levels: Sequence[tuple[Any, Any, Any]], incoming: Any = None, *,
               products: Products | None = None) -> Any:
    """The distribute phase: exclusive prefixes of every level-0 block, top level first.

    ``incoming[j - 1]`` is the exclusive prefix of block j >= 1 at the top level of ``levels``
    (None: the root, which has no such block). Going down, a left child receives its parent's
    incoming prefix and a right child receives *incoming prefix ∘ left sibling's value* — prefix
    first, the reversal of the textbook down-sweep that a non-commutative operator needs. Every
    non-empty prefix starts with v, so it is a vector and every product here is vector @ matrix;
    the empty prefix of the leftmost path is never built (the right child of block 0 just copies
    block 0's vector). Returns (n, B, S): the exclusive prefix of e_1 … e_n.

    Args:
      levels: the records of :func:`up_sweep`, bottom first; the last is the top level.
      incoming: (m - 1, B, S) the exclusive prefixes of the top level's blocks 1 … m - 1 (m blocks),
        or None (the top level is the root).
      products: the :class:`Products` of the sweep (None: :data:`DENSE`).

    Returns:
      (n, B, S) the exclusive prefixes of e_1 … e_n in scan order (prefixes[0] = v), in the sequence
      type of ``products``.
    """
    pr = DENSE if products is None else products
    if incoming is None:
        incoming = pr.one(levels[-1][0])[:0]
    for vec, Ms, ds in reversed(levels[:-1]):
        P, carried = (len(Ms) - 1) // 2, len(Ms) % 2 == 0 and len(Ms) >= 2
        parts = [pr.one(vec)]  # block 1 = right child of block 0: incoming is empty, so it gets vec
        if P:  # block 2j gets its parent's prefix, block 2j + 1 that prefix ∘ value(2j)
            parent = incoming[:P]
            right = pr.push_all(parent, Ms[1:1 + 2 * P:2])
            parts.append(pr.interleave(parent, right if ds is None else right + ds[1:1 + 2 * P:2]))
        if carried:
            parts.append(incoming[P:P + 1])  # the carried block keeps its parent's prefix
        incoming = pr.concat(parts) if len(parts) > 1 else parts[0]
    return incoming


# --------------------------------------------------------------------------------------------
# The fast Blelloch scan: a bottom layout in which every level's pairs are contiguous halves.
# --------------------------------------------------------------------------------------------

# Measured on the 2-core CPU (bare batch of 5000 products of 20 x 20, GFLOP/s from the min time;
# measurements: scan-optimisation): the products written as S fused multiply-adds
# (one XLA loop fusion) reach 58-67, batched ``matmul`` 50, and either one falls to 25-29 when its
# operands are strided slices (every other matrix). So the bottom levels -- nearly all the work --
# never take strided slices: the elements are laid out so that at every bottom level the left
# operands are the first half of the array and the right operands the second half (only the last
# 32..64 blocks, in the generic sweep, are paired by strided slices), and on CPU the products are fused
# multiply-adds up to S = FMA_MAX (a batched GEMM beyond: from S = 32 their compile time, S terms a
# product, grew 2.5-4x for run times either way by shape) and from FMA_MIN_PRODUCTS products a call
# (the top levels, short scans and small batches are GEMMs, as fast there and faster to compile;
# scan-optimisation.md, "Compile time" and "Compile time of the small levels").
FMA_MAX, FMA_MIN_PRODUCTS = 24, 256
_TOP = 32  # the bottom levels stop when about _TOP..2*_TOP blocks are left


def _use_fma(M: Array, dtype) -> bool:
    """Fused multiply-adds for the (..., S, S) matrices M (S <= FMA_MAX, >= FMA_MIN_PRODUCTS of them,
    float32/float64, CPU: measured faster there); elsewhere the batched GEMM. Decided at trace time."""
    return (M.shape[-1] <= FMA_MAX and int(np.prod(M.shape[:-2])) >= FMA_MIN_PRODUCTS
            and jax.default_backend() == "cpu" and jnp.dtype(dtype) in (jnp.dtype(jnp.float32), jnp.dtype(jnp.float64)))


# XLA CPU runs a batched dot with several batch dimensions several-fold slower than with one
# (scan-optimisation.md): the GEMM forms below flatten every leading dimension into one.

def batched_matmul(L: Array, R: Array) -> Array:
    """Batched (..., S, S) @ (..., S, S): fused multiply-adds for small S and many products, one flat GEMM otherwise.

    Args:
      L: (..., S, S) the left factors.
      R: (..., S, S) the right factors, the same leading shape.

    Returns:
      (..., S, S), L @ R for each leading index.
    """
    S = L.shape[-1]
    if not _use_fma(L, jnp.result_type(L, R)):
        return jnp.matmul(L.reshape((-1, S, S)), R.reshape((-1, S, S))).reshape(L.shape)
    out = L[..., :, 0, None] * R[..., None, 0, :]
    for k in range(1, S):
        out = out + L[..., :, k, None] * R[..., None, k, :]
    return out


def batched_vecmat(v: Array, M: Array) -> Array:
    """(..., S) @ (..., S, S) -> (..., S): S fused multiply-adds for small S and many products (a
    multiply-and-sum reduction measured far slower with a batch axis of 1), one flat GEMM otherwise.

    Args:
      v: (..., S) row vectors.
      M: (..., S, S) matrices, the same leading shape.

    Returns:
      (..., S), v @ M for each leading index.
    """
    S = M.shape[-1]
    if not _use_fma(M, jnp.result_type(v, M)):
        return jnp.einsum("ni,nij->nj", v.reshape((-1, S)), M.reshape((-1, S, S))).reshape(v.shape)
    out = v[..., 0, None] * M[..., 0, :]
    for k in range(1, S):
        out = out + v[..., k, None] * M[..., k, :]
    return out


FUSED = Products(compose=batched_matmul, push=batched_vecmat, push_all=batched_vecmat)  # the tuned ones


def bottom_layout(n: int) -> tuple[int, int, int]:
    """``(k, m, N)`` for a scan of n elements: k bottom levels, m blocks left above them, N = m·2^k.

    n is padded with N - n < 2^k <= n / _TOP identity elements (at most ~3 % extra work) so that
    the k bottom levels pair everything; short scans (n < 2·_TOP) have k = 0.

    Args:
      n: the number of scan elements, a static Python int >= 1.

    Returns:
      (k, m, N), the number of bottom levels, the blocks left above them and the padded length N >= n.

    Raises:
      ValueError: n is not a static int, or n < 1.
    """
    try:
        n = operator.index(n)
    except TypeError:
        raise ValueError(f"n must be a static Python int (a shape); got {n!r}") from None
    if n < 1:
        raise ValueError(f"the scan needs at least one element (n >= 1); got n = {n}")
    k = max(0, n.bit_length() - 1 - (_TOP.bit_length() - 1))
    m = -(-n // (1 << k))
    return k, m, m << k


def bottom_order(n: int) -> tuple[np.ndarray, np.ndarray]:
    """The storage order of the fast Blelloch scan: ``order[p]`` is the scan-order element stored
    at position p (values >= n are identity padding). Returns (order, inverse) as numpy arrays,
    ``inverse[i]`` the position of element i < n.

    Element i = c·2^k + r (r < 2^k) goes to position m·bitrev_k(r) + c. Then at every bottom
    level the pairs (2j, 2j + 1) are (position q, position q + half): left operands are the first
    half, right operands the second, and the products land in the order the next level needs.

    Args:
      n: the number of scan elements, a static Python int >= 1.

    Returns:
      (order, inverse), numpy int arrays, order (N,) the scan-order element at each storage position
      and inverse (n,) each real element's storage position (N from :func:`bottom_layout`).

    Raises:
      ValueError: n is not a static int, or n < 1.
    """
    k, m, N = bottom_layout(n)
    order = np.arange(N).reshape((m,) + (2,) * k).transpose(tuple(range(k, -1, -1))).reshape(N)
    inverse = np.empty(N, dtype=np.int64)
    inverse[order] = np.arange(N)
    return order, inverse[:n]


def to_storage(x: Array, n: int, pad: str = "zeros") -> Array:
    """Scan order -> the fast scan's storage order along axis 0 (see :func:`bottom_order`).

    ``x`` has n or N rows (N from :func:`bottom_layout`). With n rows, N - n padding rows are
    appended first: zeros (``pad="zeros"``, what offsets need) or copies of the last row
    (``pad="edge"``: real states, so that a cell's Jacobian at a padding step is finite; the scan
    replaces it by the identity anyway). A reshape and one transpose, no gather (XLA CPU's gather
    measured several times slower).

    Args:
      x: (n, ...) or (N, ...) rows in scan order, e.g. (n, B, S) states or (n, B, S, S) matrices.
      n: the number of scan elements (real rows).
      pad: "zeros" or "edge", what the N - n appended rows hold.

    Returns:
      (N, ...) the rows in storage order (:func:`bottom_order`).

    Raises:
      ValueError: x has neither n nor N rows, or ``pad`` is neither "zeros" nor "edge".
    """
    k, m, N = bottom_layout(n)
    if x.ndim < 1 or x.shape[0] not in (n, N):
        raise ValueError(f"x must have n = {n} or N = {N} rows along axis 0; got shape {x.shape}")
    if pad not in ("zeros", "edge"):
        raise ValueError(f"pad must be 'zeros' or 'edge'; got {pad!r}")
    if x.shape[0] == n and N > n:
        fill = (jnp.zeros((N - n,) + x.shape[1:], x.dtype) if pad == "zeros"
                else jnp.broadcast_to(x[-1:], (N - n,) + x.shape[1:]))
        x = jnp.concatenate([x, fill], axis=0)
    return _reverse_leading(x, (m,) + (2,) * k) if k else x


def from_storage(y: Array, n: int) -> Array:
    """The inverse of :func:`to_storage`: storage order (N rows) -> scan order (the first n rows).

    Args:
      y: (N, ...) rows in storage order (N from :func:`bottom_layout`).
      n: the number of scan elements (real rows).

    Returns:
      (n, ...) the real rows in scan order (the padding rows dropped).

    Raises:
      ValueError: y does not have N rows.
    """
    k, m, N = bottom_layout(n)
    if y.ndim < 1 or y.shape[0] != N:
        raise ValueError(f"y must have N = {N} rows (storage order for n = {n}); got shape {y.shape}")
    return (_reverse_leading(y, (2,) * k + (m,)) if k else y)[:n]


def _reverse_leading(x, lead):
    """Split axis 0 into ``lead``, reverse the order of those axes, merge them back."""
    y = x.reshape(lead + x.shape[1:])
    y = jnp.transpose(y, tuple(range(len(lead) - 1, -1, -1)) + tuple(range(len(lead), y.ndim)))
    return y.reshape(x.shape)


def blelloch_scan_stored(v: Array, Ms: Array, ds: Array | None, n: int, *,
                         zero_padded_offsets: bool = False) -> tuple[Array, Array]:
    """The fast modified Blelloch scan on elements already in storage order.

    ``Ms`` (N, B, S, S) and ``ds`` (N, B, S) or None are the n scan-order elements put through
    :func:`to_storage` (N - n padding rows, whatever they hold: they are replaced by the identity
    map here). Letting the caller do the permutation lets :mod:`bppsa.backprop` permute the cheap
    (T, B, S) state vectors and generate the Jacobians directly in storage order. Returns
    ``(prefixes, total)`` exactly as :func:`blelloch_scan`, prefixes in scan order.

    ``zero_padded_offsets=True`` promises that the padding rows of ds are already zero (as
    ``to_storage(ds, n)`` makes them) and skips masking them; :mod:`bppsa.backprop` uses it.

    Args:
      v: (B, S) the root vector.
      Ms: (N, B, S, S) the matrices in storage order.
      ds: (N, B, S) the offsets in storage order, or None (all zero).
      n: the number of real (scan-order) elements; N from :func:`bottom_layout`.
      zero_padded_offsets: the padding rows of ``ds`` are zero already (not masked here).

    Returns:
      (prefixes, total), prefixes (n, B, S) in scan order and total (B, S).

    Raises:
      ValueError: Ms does not have N rows or square matrices, or v, ds do not match it.
    """
    k, m, N = bottom_layout(n)
    if Ms.ndim != 4 or Ms.shape[0] != N or Ms.shape[-1] != Ms.shape[-2]:
        raise ValueError(f"Ms must have shape (N, B, S, S) with N = {N} rows in storage order for "
                         f"n = {n}; got {Ms.shape}")
    _check(v, Ms, ds)
    if N > n:  # the padding elements become identity maps
        pad = jnp.asarray(bottom_order(n)[0] >= n)
        Ms = jnp.where(pad[:, None, None, None], jnp.eye(Ms.shape[-1], dtype=Ms.dtype), Ms)
        if ds is not None and not zero_padded_offsets:
            ds = jnp.where(pad[:, None, None], jnp.zeros((), ds.dtype), ds)
    incoming, total = _blelloch_bottom(v, Ms, ds, k)
    return from_storage(incoming, n), total


def diagonal_products(aL: Array, aR: Array, Wt: Array) -> Array:
    """(diag(aL) Wt) @ (diag(aR) Wt) for (..., S) vectors aL, aR: diag(aL) · (aR @ K) with
    K[l, (i, j)] = Wt[i, l] Wt[l, j], one (·, S) @ (S, S²) GEMM for the whole batch of products.

    Args:
      aL: (..., S) the left factors' diagonals.
      aR: (..., S) the right factors' diagonals, the same shape.
      Wt: (S, S) the shared factor.

    Returns:
      (..., S, S), (diag(aL) Wt) @ (diag(aR) Wt) for each leading index.
    """
    S = Wt.shape[-1]
    K = (Wt.T[:, :, None] * Wt[:, None, :]).reshape((S, S * S))
    return aL[..., None] * jnp.dot(aR.reshape((-1, S)), K).reshape(aR.shape + (S,))


def blelloch_scan_stored_diag(v: Array, A: Array, Wt: Array, ds: Array | None, n: int) -> tuple[Array, Array]:
    """:func:`blelloch_scan_stored` for matrices with a shared factor, M_k = diag(A_k) @ Wt.

    That is an Elman RNN's transposed Jacobian (A_k = σ'(a_k), Wt = W_hᵀ). The structure removes
    the bottom level's memory traffic: the (N, B, S, S) matrices are never formed.

    * Products: diag(a) Wt · diag(b) Wt = diag(a) · Q(b), Q(b)[i, j] = Σ_l b_l Wt[i, l] Wt[l, j],
      i.e. all of the level's N/2 products are one (N/2·B, S) @ (S, S²) GEMM of the right
      operands' vectors with K[l, (i, j)] = Wt[i, l] Wt[l, j], rows scaled by the left vectors.
    * Offsets and the down-sweep: x @ diag(a) Wt = (x ⊙ a) @ Wt, one (N/2·B, S) @ (S, S) GEMM each.

    From level 1 up it is the generic scan on the products. ``A`` (N, B, S) and ``ds`` (N, B, S)
    or None are in storage order (:func:`to_storage`); their N - n padding rows may hold anything
    (the padding elements are the latest in scan order, so no real prefix depends on them, and
    ``total`` is recomputed from the last real element). Same result as
    ``blelloch_scan_stored(v, A[..., None] * Wt, ds, n)``; any n >= 1.

    Args:
      v: (B, S) the root vector.
      A: (N, B, S) the diagonals A_k in storage order.
      Wt: (S, S) the shared factor.
      ds: (N, B, S) the offsets in storage order, or None (all zero).
      n: the number of real (scan-order) elements; N from :func:`bottom_layout`.

    Returns:
      (prefixes, total), prefixes (n, B, S) in scan order and total (B, S).

    Raises:
      ValueError: A does not have N rows, or Wt, v, ds do not match it.
    """
    k, m, N = bottom_layout(n)
    if A.ndim != 3 or A.shape[0] != N:
        raise ValueError(f"A must have shape (N, B, S) with N = {N} rows in storage order for "
                         f"n = {n}; got {A.shape}")
    S = A.shape[-1]
    if Wt.shape != (S, S):
        raise ValueError(f"Wt must have shape (S, S) = {(S, S)}; got {Wt.shape}")
    if v.shape != A.shape[1:]:
        raise ValueError(f"v must have shape (B, S) = {A.shape[1:]}; got {v.shape}")
    if ds is not None and ds.shape != A.shape:
        raise ValueError(f"ds must have shape (N, B, S) = {A.shape}; got {ds.shape}")
    if k == 0:  # short scan: no bottom level to save
        return blelloch_scan_stored(v, A[..., None] * Wt, ds, n)
    dtype = jnp.result_type(v, A, Wt)
    v, A, Wt = v.astype(dtype), A.astype(dtype), Wt.astype(dtype)
    ds = None if ds is None else ds.astype(dtype)
    h = N // 2
    aL, aR = A[:h], A[h:]
    shared = lambda x: jnp.dot(x.reshape((-1, S)), Wt).reshape(x.shape)  # (..., S) @ Wt
    X = diagonal_products(aL, aR, Wt)
    DL = None if ds is None else ds[:h]
    D = None if ds is None else shared(ds[:h] * aR) + ds[h:]
    incoming, total = _blelloch_bottom(v, X, D, k - 1)
    right = shared(incoming * aL)  # level 0 of the down-sweep
    if DL is not None:
        right = right + DL
    incoming = jnp.concatenate([incoming, right], axis=0)
    if N > n:  # the total without the padding: the last real element applied to its prefix
        p = int(bottom_order(n)[1][n - 1])
        total = shared(incoming[p] * A[p])
        if ds is not None:
            total = total + ds[p]
    return from_storage(incoming, n), total


def _blelloch_bottom(v, X, D, k):
    """k bottom levels on contiguous halves, the top m blocks by :func:`up_sweep` and
    :func:`down_sweep` with :data:`FUSED` products, then the k down-sweep levels. Returns the exclusive
    prefixes in storage order (N, B, S) and the total."""
    lefts = []
    for _ in range(k):  # up-sweep: block (2j, 2j + 1) = positions (q, q + half)
        h = X.shape[0] // 2
        L, R = X[:h], X[h:]
        DL = None if D is None else D[:h]
        X = batched_matmul(L, R)
        D = None if D is None else batched_vecmat(D[:h], R) + D[h:]
        lefts.append((L, DL))
    top = up_sweep(v, X, D, products=FUSED)  # the top m blocks, pairs by strided slices
    incoming, total = down_sweep(top, products=FUSED), top[-1][0]
    # down-sweep: a left child gets its parent's prefix, a right child the parent's prefix composed
    # with its sibling
    for L, DL in reversed(lefts):
        right = batched_vecmat(incoming, L)
        if DL is not None:
            right = right + DL
        incoming = jnp.concatenate([incoming, right], axis=0)
    return incoming, total


def blelloch_scan(v: Array, Ms: Array, ds: Array | None = None) -> tuple[Array, Array]:
    """The paper's modified Blelloch scan (up-sweep, then down-sweep with reversed operands).

    Work: about n matrix–matrix products of S³ per batch row in the up-sweep (blocks away from
    the root), and about 2n vector–matrix products (S² each) for block 0 and the down-sweep —
    Θ(n·B·S³) in all. Depth: about 2⌈log₂(n + 1)⌉ levels, each one batched product. Any n >= 1.

    Same result as ``down_sweep(up_sweep(v, Ms, ds))``, organised for speed (see
    :func:`bottom_order`): the elements are permuted once (padded with < n/32 identities) so
    that every bottom level pairs the first half of its array with the second half — no strided
    slices — and its products are fused multiply-adds; the top ~32–64 blocks, with the vector
    root, go through :func:`up_sweep` and :func:`down_sweep`.

    Args:
      v: (B, S) the root vector.
      Ms: (n, B, S, S) the matrices of e_1 … e_n, in scan order.
      ds: (n, B, S) their offsets, or None (all zero).

    Returns:
      (prefixes, total), prefixes (n, B, S) and total (B, S) as :func:`sequential_scan`.

    Raises:
      ValueError: shapes other than the module docstring's, or n = 0.

    Examples:
      >>> import jax, jax.numpy as jnp
      >>> from bppsa.scan import blelloch_scan, sequential_scan
      >>> n, B, S = 5, 2, 3
      >>> v = jnp.ones((B, S))
      >>> Ms = 0.5 * jax.random.normal(jax.random.key(0), (n, B, S, S))
      >>> prefixes, total = blelloch_scan(v, Ms)
      >>> prefixes.shape, total.shape
      ((5, 2, 3), (2, 3))
      >>> bool(jnp.allclose(prefixes[0], v))                # exclusive: prefixes[0] = v
      True
      >>> ref = v[:, None] @ Ms[0] @ Ms[1] @ Ms[2] @ Ms[3] @ Ms[4]  # v ∘ e_1 ∘ … ∘ e_5, row vectors
      >>> bool(jnp.allclose(total, ref[:, 0], atol=1e-5))
      True
      >>> bool(jnp.allclose(prefixes, sequential_scan(v, Ms)[0], atol=1e-5))
      True
    """
    _check(v, Ms, ds)
    n = Ms.shape[0]
    return blelloch_scan_stored(v, to_storage(Ms, n), None if ds is None else to_storage(ds, n), n)


#: The scans by the name ``scan=`` takes: ``"blelloch"``, ``"associative"`` and ``"sequential"``.
SCANS = {"blelloch": blelloch_scan, "associative": associative_scan, "sequential": sequential_scan}


def scan(v: Array, Ms: Array, ds: Array | None = None, method: str = "blelloch") -> tuple[Array, Array]:
    """Dispatch to one of :data:`SCANS` by name; see the module docstring for shapes.

    Args:
      v: (B, S) the root vector.
      Ms: (n, B, S, S) the matrices of e_1 … e_n, in scan order.
      ds: (n, B, S) their offsets, or None (all zero).
      method: "blelloch", "associative" or "sequential".

    Returns:
      (prefixes, total), prefixes (n, B, S) and total (B, S) as :func:`sequential_scan`.

    Raises:
      ValueError: an unknown ``method``, shapes other than the module docstring's, or n = 0.

    Examples:
      With offsets: the recurrence :math:`g_{t-1} = g_t M_t + c_{t-1}` solved by each scan:

      >>> import jax, jax.numpy as jnp
      >>> from bppsa.scan import SCANS, scan
      >>> v = jnp.ones((2, 3))
      >>> Ms = 0.5 * jax.random.normal(jax.random.key(0), (6, 2, 3, 3))
      >>> ds = jnp.ones((6, 2, 3))
      >>> totals = [scan(v, Ms, ds, method=m)[1] for m in SCANS]
      >>> sorted(SCANS), all(bool(jnp.allclose(t, totals[0], atol=1e-5)) for t in totals)
      (['associative', 'blelloch', 'sequential'], True)
    """
    try:
        fn = SCANS[method]
    except KeyError:
        raise ValueError(f"scan must be one of {sorted(SCANS)}; got {method!r}") from None
    return fn(v, Ms, ds)
