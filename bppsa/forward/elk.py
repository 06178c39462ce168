"""The parallel forward's trust-region (ELK) step: the MAP smoother of a linear-Gaussian chain (a
Kalman filter and a Rauch–Tung–Striebel smoother, each one ``lax.associative_scan``: Särkkä and
García-Fernández's temporal parallelisation), on (k, k) blocks as batch rows."""

from __future__ import annotations

import jax.numpy as jnp
from jax import Array, lax

__all__ = ["trust_region_solve"]


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
    r"""The states h_1 … h_n minimising

    .. math::

        \sum_t \|h_t - h_{t-1} M_t - d_t\|^2 + \lambda \sum_t \|h_t - y_t\|^2, \qquad h_0 = v,

    for batches of rows: v (R, k), Ms (n, R, k, k), ds (n, R, k), y (n, R, k) -> (n, R, k). This is
    the Levenberg–Marquardt (trust-region) step of the parallel forward around the iterate y (ELK:
    Gonzalez et al., 2024): λ = 0 is the Newton step (the affine recurrence), λ → ∞ no step. It is
    the MAP estimate of a linear-Gaussian chain (dynamics h_t = h_{t-1} @ M_t + d_t with unit
    process noise, y_t an observation of h_t with noise variance 1/λ), computed exactly by a Kalman
    filter and a Rauch–Tung–Striebel smoother, each one ``lax.associative_scan`` (Θ(log n) levels)
    of Särkkä and García-Fernández's elements; k = 1 (diagonal, quasi) is elementwise. Work Θ(n·R·k³)
    (a few (k, k) solves per element), so the dense step costs more than Newton's scan.

    Args:
      v: (R, k) the initial state h_0.
      Ms: (n, R, k, k) the maps' matrices M_t (row-vector convention), earliest first.
      ds: (n, R, k) their offsets d_t.
      y: (n, R, k) the iterate the step stays near.
      lam: λ >= 0, a scalar.

    Returns:
      (n, R, k) the states h_1 … h_n.
    """
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

