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
"""

from __future__ import annotations

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

__all__ = ["SCANS", "scan", "blelloch_scan", "associative_scan", "sequential_scan", "up_sweep", "down_sweep",
           "vecmat", "Products", "DENSE", "DIAGONAL", "diagonal_scan", "block_scan"]

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
