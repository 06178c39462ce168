"""The scans of structured maps: diagonal maps (elementwise products, Θ(n·R) work) and block-diagonal
maps, whose (k, k) blocks become batch rows (:mod:`bppsa.scan.layout`) and whose 1×1 blocks go to the
diagonal scan. The Block cells' backward, the quasi-Newton forward and the Newton step of a
block-diagonal cell run these."""

from __future__ import annotations

import jax.numpy as jnp
from jax import Array, lax

from bppsa.scan.dense import SCANS, Products, down_sweep, scan, up_sweep

__all__ = ["DIAGONAL", "diagonal_scan", "block_scan"]

#: The products of diagonal maps x -> x ⊙ a + d, stored as their diagonals a (same shape as x).
DIAGONAL = Products(compose=jnp.multiply, push=jnp.multiply, push_all=jnp.multiply)


def diagonal_scan(v: Array, a: Array, d: Array | None = None, method: str = "blelloch") -> tuple[Array, Array]:
    """:func:`scan` of diagonal maps, elementwise: Θ(n·R) work. "blelloch": :func:`up_sweep` and
    :func:`down_sweep` with :data:`DIAGONAL`; "associative": ``lax.associative_scan``;
    "sequential": a ``lax.scan``.

    Args:
      v: (R,) the root vector.
      a: (n, R) the maps' diagonals, in scan order.
      d: (n, R) their offsets, or None (all zero).
      method: "blelloch", "associative" or "sequential".

    Returns:
      (prefixes, total), prefixes (n, R) the exclusive prefixes (prefixes[0] = v) and total (R,).

    Raises:
      ValueError: an unknown ``method``.
    """
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
    """:func:`scan` for batches of (k, k) blocks: k = 1 goes to :func:`diagonal_scan` (no 1×1 matrix
    products), larger k to :func:`scan`.

    Args:
      v: (R, k) the root vectors, one per row.
      Ms: (n, R, k, k) the blocks, in scan order.
      ds: (n, R, k) their offsets, or None (all zero).
      method: "blelloch", "associative" or "sequential".

    Returns:
      (prefixes, total), prefixes (n, R, k) the exclusive prefixes (prefixes[0] = v) and total (R, k).

    Raises:
      ValueError: an unknown ``method``; for k > 1 also shapes that do not match (:func:`scan`).
    """
    if Ms.shape[-1] != 1:
        return scan(v, Ms, ds, method)
    prefixes, total = diagonal_scan(v[..., 0], Ms[..., 0, 0], None if ds is None else ds[..., 0], method)
    return prefixes[..., None], total[..., None]

