"""Scans that solve the back-propagation recurrence of a chain (BPPSA, Wang et al., MLSys 2020).

The backward pass of a chain h_t = f(h_{t-1}, x_t) is the linear recurrence (row vectors,
one per batch element) g_{t-1} = g_t @ M_t + c_{t-1}, g_T = c_T. In *scan order* (latest step
first) it is a prefix scan of [v, e_1, ..., e_n], v = g_T, e_k = (M_k, d_k) the affine map
x -> x @ M_k + d_k. Every scan here takes

    v:  (B, S)        the root vector,
    Ms: (n, B, S, S)  the matrices of e_1 ... e_n, in scan order,
    ds: (n, B, S)     their offsets (None: all zero),

and returns ``(prefixes, total)``: prefixes (n, B, S) with prefixes[k] = v ∘ e_1 ∘ ... ∘ e_k
(prefixes[0] = v), total (B, S) = v ∘ e_1 ∘ ... ∘ e_n.

- :func:`blelloch_scan`: the paper's modified Blelloch scan (vector root, operands reversed in
  the down-sweep, no identity matrices), Θ(log n) levels;
- :func:`associative_scan`: ``jax.lax.associative_scan`` of the affine maps;
- :func:`sequential_scan`: the reference loop, n dependent steps;
- :func:`up_sweep`, :func:`down_sweep`: the two halves of the Blelloch scan, with the products
  as a parameter (:class:`Products`; :data:`DENSE` the reference ones), as the paper writes them;
- :func:`diagonal_scan`: the same scans for diagonal maps (:data:`DIAGONAL` products:
  elementwise), and :func:`block_scan`, which sends (n, R, 1, 1) blocks there and (k, k) blocks
  to :func:`scan` (the structured cells' and the quasi-Newton forward's scans).
- :func:`trust_region_solve`: the parallel forward's trust-region (ELK) step, the MAP smoother of
  a linear-Gaussian chain (a Kalman filter and a Rauch–Tung–Striebel smoother, each one
  ``lax.associative_scan``: Särkkä and García-Fernández's temporal parallelisation).
- :func:`lyapunov_from_jacobians`: the largest Lyapunov exponent of a chain of Jacobians, the average
  log growth of their product, in Θ(√n) dependent steps (chunks' products vmapped, then one vector
  through them).
"""

from __future__ import annotations

import math

import jax.numpy as jnp
from jax import Array, lax

from bppsa._scan import (
    DENSE,
    SCANS,
    Products,
    associative_scan,
    blelloch_scan,
    down_sweep,
    scan,
    sequential_scan,
    up_sweep,
    vecmat,
)
from bppsa.errors import UsageError

__all__ = ["SCANS", "scan", "blelloch_scan", "associative_scan", "sequential_scan", "up_sweep", "down_sweep",
           "vecmat", "Products", "DENSE", "DIAGONAL", "diagonal_scan", "block_scan",
           "trust_region_solve", "lyapunov_from_jacobians"]

#: The products of diagonal maps x -> x ⊙ a + d, stored as their diagonals a (same shape as x).
DIAGONAL = Products(compose=jnp.multiply, push=jnp.multiply, push_all=jnp.multiply)


def diagonal_scan(v: Array, a: Array, d: Array | None = None, method: str = "blelloch") -> tuple[Array, Array]:
    """:func:`scan` of diagonal maps: v (R,), a (n, R) the diagonals, d (n, R) or None the offsets
    -> (prefixes (n, R), total (R,)), elementwise: Θ(n·R) work. "blelloch": :func:`up_sweep` and
    :func:`down_sweep` with :data:`DIAGONAL`; "associative": ``lax.associative_scan``;
    "sequential": a ``lax.scan``."""
    if method == "blelloch":
        levels = up_sweep(v, a, d, products=DIAGONAL)
        return down_sweep(levels, products=DIAGONAL), levels[-1][0]
    d = jnp.zeros_like(a) if d is None else d
    if method == "associative":
        A, D = lax.associative_scan(lambda l, r: (l[0] * r[0], l[1] * r[0] + r[1]), (a, d))
        inclusive = v * A + D
        return jnp.concatenate([v[None], inclusive[:-1]], axis=0), inclusive[-1]
    if method == "sequential":
        total, prefixes = lax.scan(lambda x, e: (x * e[0] + e[1], x), v, (a, d))
        return prefixes, total
    raise ValueError(f"scan must be one of {sorted(SCANS)}; got {method!r}")


def block_scan(v: Array, Ms: Array, ds: Array | None = None, method: str = "blelloch") -> tuple[Array, Array]:
    """:func:`scan` for batches of (k, k) blocks, Ms (n, R, k, k), v (R, k), ds (n, R, k): k = 1
    goes to :func:`diagonal_scan` (no 1×1 matrix products), larger k to :func:`scan`."""
    if Ms.shape[-1] != 1:
        return scan(v, Ms, ds, method)
    prefixes, total = diagonal_scan(v[..., 0], Ms[..., 0, 0], None if ds is None else ds[..., 0], method)
    return prefixes[..., None], total[..., None]


def _solve(X: Array, Y: Array) -> Array:
    """X⁻¹ Y for batches of (k, k) X and (k, m) Y: Gauss–Jordan elimination with partial pivoting in
    XLA ops (k = 1: a division). Not LAPACK's batched solve: on CPU (jax 0.10.2) a program with many
    of those sometimes never returned, and the k here are small."""
    k = X.shape[-1]
    if k == 1:
        return Y / X
    A = jnp.concatenate([X, Y], axis=-1)
    rows = jnp.arange(k)

    r_ax, c_ax = A.ndim - 2, A.ndim - 1
    at = rows[:, None]

    def pivot(i, A):
        col = lax.dynamic_slice_in_dim(A, i, 1, c_ax)  # (..., k, 1)
        p = jnp.argmax(jnp.where(at >= i, jnp.abs(col), -1), axis=-2, keepdims=True)  # the largest from row i down
        row_i, row_p = lax.dynamic_slice_in_dim(A, i, 1, r_ax), jnp.take_along_axis(A, p, axis=-2)
        A = jnp.where(at == i, row_p, jnp.where(at == p, row_i, A))  # rows i and p swapped
        row = lax.dynamic_slice_in_dim(A, i, 1, r_ax)
        row = row / lax.dynamic_slice_in_dim(row, i, 1, c_ax)
        return jnp.where(at == i, row, A - lax.dynamic_slice_in_dim(A, i, 1, c_ax) * row)

    return lax.fori_loop(0, k, pivot, A)[..., k:]


def _t(X: Array) -> Array:
    return jnp.swapaxes(X, -1, -2)


def _filter_combine(e1: tuple, e2: tuple) -> tuple:
    """Two parallel Kalman filter elements (A, b, C, η, J), e1 earlier, composed (column vectors:
    b (…, k, 1), η (…, k, 1))."""
    A1, b1, C1, n1, J1 = e1
    A2, b2, C2, n2, J2 = e2
    eye = jnp.eye(A1.shape[-1], dtype=A1.dtype)
    X = eye + C1 @ J2  # A2 (I + C1 J2)⁻¹ = (solve((I + C1 J2)ᵀ, A2ᵀ))ᵀ
    AX = _t(_solve(_t(X), _t(A2)))
    Y = eye + J2 @ C1  # A1ᵀ (I + J2 C1)⁻¹
    AY = _t(_solve(_t(Y), A1))
    return (AX @ A1, AX @ (b1 + C1 @ n2) + b2, AX @ C1 @ _t(A2) + C2,
            AY @ (n2 - J2 @ b1) + n1, AY @ J2 @ A1 + J1)


def trust_region_solve(v: Array, Ms: Array, ds: Array, y: Array, lam: float | Array) -> Array:
    """The states h_1 … h_n minimising

        Σ_t |h_t − h_{t-1} @ M_t − d_t|² + λ Σ_t |h_t − y_t|²,   h_0 = v,

    for batches of rows: v (R, k), Ms (n, R, k, k), ds (n, R, k), y (n, R, k) -> (n, R, k). This is
    the Levenberg–Marquardt (trust-region) step of the parallel forward around the iterate y (ELK:
    Gonzalez et al., 2024): λ = 0 is the Newton step (the affine recurrence), λ → ∞ no step. It is
    the MAP estimate of a linear-Gaussian chain (dynamics h_t = h_{t-1} @ M_t + d_t with unit
    process noise, y_t an observation of h_t with noise variance 1/λ), computed exactly by a Kalman
    filter and a Rauch–Tung–Striebel smoother, each one ``lax.associative_scan`` (Θ(log n) levels)
    of Särkkä and García-Fernández's elements; k = 1 (diagonal, quasi) is elementwise. Work Θ(n·R·k³)
    (a few (k, k) solves per element), so the dense step costs more than Newton's scan."""
    n, R, k = ds.shape
    dtype = ds.dtype
    lam = jnp.asarray(lam, dtype)
    a, b = 1 / (1 + lam), lam / (1 + lam)  # the gain: h_t's weight on the prediction and on y_t
    F = _t(Ms)  # column form: h_t = F_t h_{t-1} + d_t
    d, yc = ds[..., None], y[..., None]
    eye = jnp.broadcast_to(jnp.eye(k, dtype=dtype), (n, R, k, k))
    first = jnp.zeros((n, 1, 1, 1), dtype).at[0].set(1)  # the first step: its prior is v, exactly
    pred = d + first * (F @ v[..., None])  # the first element absorbs h_0 = v
    Fn = (1 - first) * F  # and depends on nothing before it
    elems = (a * Fn, a * pred + b * yc, a * eye, b * _t(Fn) @ (yc - d), b * _t(Fn) @ Fn)
    _, m, P, _, _ = lax.associative_scan(_filter_combine, elems)  # filtered means and covariances
    if n == 1:
        return m[..., 0]
    # RTS: s_t = G_t s_{t+1} + g_t, G_t = P_t F_{t+1}ᵀ (F_{t+1} P_t F_{t+1}ᵀ + I)⁻¹, s_n = m_n
    Fnext, dnext, Pt, mt = F[1:], d[1:], P[:-1], m[:-1]
    Z = Fnext @ Pt @ _t(Fnext) + eye[1:]
    G = _t(_solve(Z, Fnext @ Pt))  # Z and P symmetric
    g = mt - G @ (Fnext @ mt + dnext)
    Gs = jnp.concatenate([G, jnp.zeros_like(eye[:1])], axis=0)[::-1]  # latest first
    gs = jnp.concatenate([g, m[-1:]], axis=0)[::-1]
    _, s = lax.associative_scan(lambda e1, e2: (e2[0] @ e1[0], e2[0] @ e1[1] + e2[1]), (Gs, gs))
    return s[::-1][..., 0]


def lyapunov_from_jacobians(blocks: Array, chunk: int | None = None) -> Array:
    """The largest Lyapunov exponent of each independent product in ``blocks`` (T, R, k, k), the
    Jacobians J_t of R systems (batch rows, or blocks of a block-diagonal Jacobian): (R,), the
    average log growth per step of J_T ⋯ J_1 v from v = (1, …, 1)/√k. ``chunk``: the steps per
    chunk (None: ⌈√T⌉)."""
    T, R, k = blocks.shape[0], blocks.shape[1], blocks.shape[-1]
    if T == 0:
        raise UsageError("a Lyapunov exponent needs at least one step; got T = 0")
    if k == 1:  # scalar products: the mean log growth, log|J_t| summed (-inf where a J_t is 0)
        return jnp.sum(jnp.log(jnp.abs(blocks[:, :, 0, 0])), axis=0) / T
    L = max(1, math.isqrt(T - 1) + 1) if chunk is None else min(chunk, T)
    n = -(-T // L)  # chunks; the product of each is formed side by side: one batch axis of n·R
    eye = jnp.eye(k, dtype=blocks.dtype)  # (a dot with two batch axes runs 1.4-2.4x slower on CPU)
    pad = jnp.broadcast_to(eye, (n * L - T, R, k, k))  # identity steps change nothing
    J = jnp.concatenate([blocks, pad], axis=0).reshape((n, L, R, k, k)).swapaxes(0, 1).reshape((L, n * R, k, k))

    def step(carry, Jt):  # one step of every chunk: (n·R, k, k) normalised, (n·R,) their log scales
        P, logs = carry
        P = jnp.matmul(Jt, P)
        s = jnp.sqrt(jnp.sum(P * P, axis=(-2, -1)))
        s = jnp.where(s > 0, s, 1)
        return (P / s[:, None, None], logs + jnp.log(s)), None

    init = (jnp.broadcast_to(eye, (n * R, k, k)), jnp.zeros((n * R,), blocks.dtype))
    (Ps, logs), _ = lax.scan(step, init, J)
    Ps, logs = Ps.reshape((n, R, k, k)), logs.reshape((n, R))

    def through(carry, chunk_):
        v, total = carry
        P, log_scale = chunk_
        v = jnp.einsum("rij,rj->ri", P, v)
        nv = jnp.sqrt(jnp.sum(v * v, axis=-1))
        dead = nv == 0  # the product annihilated v: growth -inf
        nv = jnp.where(dead, 1, nv)
        return (v / nv[:, None], jnp.where(dead, -jnp.inf, total + jnp.log(nv) + log_scale)), None

    v0 = jnp.full((R, k), 1 / math.sqrt(k), blocks.dtype)
    (_, total), _ = lax.scan(through, (v0, jnp.zeros((R,), blocks.dtype)), (Ps, logs))
    return total / T
