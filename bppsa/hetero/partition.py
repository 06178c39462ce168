"""Batch partitioning by speed and weighted gradient averaging (Moreno-Álvarez et al., 2022).

Replica i at speed s_i gets b_i ≈ B·s_i/Σs samples (integers summing to B, at least
``min_per_replica`` each, largest-remainder rounding in exact integer arithmetic, so any finite
magnitude and any B work); the global gradient is g = Σ_i (b_i/B)·g_i, with g_i the mean
gradient over replica i's b_i samples — exactly the full-batch mean gradient. Plain averaging (1/P)·Σ_i g_i
over-weights each sample on replica i by B/(P·b_i).
"""

from __future__ import annotations

from fractions import Fraction
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from bppsa.errors import as_int

__all__ = ["partition", "weighted_mean", "plain_mean", "sample_weights"]


def _check_speeds(speeds) -> np.ndarray:
    try:
        s = np.asarray(speeds, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"speeds must be a non-empty 1-D sequence of positive numbers; got {speeds!r}") from None
    if s.ndim != 1 or s.size == 0:
        raise ValueError(f"speeds must be a non-empty 1-D sequence of positive numbers; got shape {s.shape}")
    bad = ~np.isfinite(s) | (s <= 0)
    if bad.any():
        i = int(np.argmax(bad))
        raise ValueError(f"speeds must be finite and > 0; got speeds[{i}] = {s[i]!r} in {s.tolist()}")
    return s


def partition(speeds: Sequence[float] | np.ndarray, batch_size: int, min_per_replica: int = 1) -> np.ndarray:
    """Split ``batch_size`` samples over replicas in proportion to their ``speeds``.

    Every replica gets at least ``min_per_replica`` samples (default 1: no replica starves, so
    every one keeps contributing gradients and timings). Replicas whose proportional quota falls
    below that minimum are pinned at it, and the others share the rest in proportion to their
    speeds (repeated until no quota is below the minimum). The shares are then rounded by largest
    remainder: floors first, the remaining units one each to the largest fractional parts (ties
    to the lower replica index, so every process computes the same split).

    Only the ratios of the speeds matter, and all arithmetic is on integers (each double speed is an
    exact ratio of integers), so the split is exact for any magnitudes (1e-308 to 1e308) and any
    integer B (2**60 + 1 included).

    Args:
      speeds: (P,) each replica's speed s_i (samples/s or any other unit: only the ratios matter);
        finite and > 0.
      batch_size: B, the number of samples to split: an int >= 0 (numpy and JAX integer scalars too).
      min_per_replica: the fewest samples any replica gets, an int >= 0.

    Returns:
      b (P,) int64 (object, of Python ints, when B does not fit in an int64) with Σ b = B,
      b_i ≥ min_per_replica, faster replicas never getting fewer samples, and :math:`|b_i - q_i| < 1` for the
      unpinned replicas' quotas q_i (all of them when ``min_per_replica = 0``, the plain
      proportional rule, where a slow replica may get 0).

    Examples:
      >>> from bppsa import hetero
      >>> hetero.partition([1.0, 2.0, 1.0], 16).tolist()
      [4, 8, 4]
      >>> hetero.partition([1.0, 3.0], 10).tolist()         # quotas 2.5 and 7.5, by largest remainder
      [3, 7]
      >>> hetero.partition([1.0, 1000.0], 10).tolist()      # at least min_per_replica = 1 each
      [1, 9]

    Raises:
      ValueError: for speeds that are empty, not 1-D, NaN, infinite, zero or negative, a batch_size or
      min_per_replica that is not an int >= 0, and when B < P·min_per_replica.
    """
    s = _check_speeds(speeds)
    B, m, P = as_int(batch_size), as_int(min_per_replica), s.size  # numpy and JAX integer scalars too
    if B is None:
        raise ValueError(f"batch_size must be an int >= 0; got {batch_size!r} of type {type(batch_size).__name__}")
    if B < 0:
        raise ValueError(f"batch_size must be >= 0; got {batch_size}")
    if m is None or m < 0:
        raise ValueError(f"min_per_replica must be an int >= 0; got {min_per_replica!r}")
    if m * P > B:
        raise ValueError(f"batch_size {B} cannot give each of the {P} replicas min_per_replica = {m} samples "
                         f"(needs batch_size >= {m * P}); use a larger batch or min_per_replica=0")
    w = _integer_weights(s)
    pinned = [False] * P
    while True:  # at most P rounds: each one pins at least one more replica or stops
        free = [i for i in range(P) if not pinned[i]]
        rest = B - m * (P - len(free))
        total = sum(w[i] for i in free)
        low = [i for i in free if rest * w[i] < m * total]  # quota rest·w_i/total below m (exactly)
        if not low:
            break
        for i in low:
            pinned[i] = True
    b = [m] * P
    remainder = {}
    for i in free:
        b[i], remainder[i] = divmod(rest * w[i], total)  # floor of the quota (>= m) and its remainder·total
    short = rest - sum(b[i] for i in free)  # < len(free): one unit each to the largest remainders
    for i in sorted(free, key=lambda i: (-remainder[i], i))[:short]:  # ties to the lowest index
        b[i] += 1
    return np.array(b, dtype=np.int64 if B <= np.iinfo(np.int64).max else object)


def _integer_weights(s: np.ndarray) -> list[int]:
    """Positive finite doubles as Python ints in the same exact ratios (each is n_i / 2^k_i)."""
    fractions = [Fraction(float(x)) for x in s]
    denominator = max(f.denominator for f in fractions)  # powers of two: the largest is a common multiple
    return [f.numerator * (denominator // f.denominator) for f in fractions]


def _check_counts(counts, n) -> np.ndarray:
    c = np.asarray(counts)
    if c.shape != (n,):
        raise ValueError(f"counts must have shape ({n},) (one per gradient); got shape {c.shape}")
    if not np.all(np.isfinite(c)) or (c < 0).any():
        raise ValueError(f"counts must be finite and >= 0; got {c.tolist()}")
    if c.sum() <= 0:
        raise ValueError(f"counts must not all be zero; got {c.tolist()}")
    return c.astype(np.float64)


def weighted_mean(grads: Sequence, counts: Sequence[float]):
    """g = Σ_i (b_i / Σb)·g_i over a list of gradient pytrees g_i (each a mean over b_i samples).

    Replicas with b_i = 0 contribute nothing (their g_i may be anything finite, e.g. zeros).

    Args:
      grads: the P replicas' gradient pytrees g_i, all of one structure (leaves array-like).
      counts: (P,) b_i, the number of samples each g_i is the mean over (finite, >= 0, not all 0).

    Returns:
      The pytree Σ_i (b_i / Σb)·g_i, of the gradients' structure, with JAX arrays as leaves.

    Raises:
      ValueError: for an empty ``grads``, and for counts that are not of shape (P,), finite and >= 0,
      or are all zero.

    Examples:
      Two replicas' mean gradients over 1 and 3 samples: the full-batch mean, not the plain average:

      >>> import jax.numpy as jnp
      >>> from bppsa import hetero
      >>> g = hetero.weighted_mean([{"w": jnp.array(1.0)}, {"w": jnp.array(5.0)}], counts=[1, 3])
      >>> float(g["w"])                                      # (1·1 + 3·5) / 4
      4.0
      >>> float(hetero.plain_mean([{"w": jnp.array(1.0)}, {"w": jnp.array(5.0)}])["w"])
      3.0
    """
    grads = list(grads)
    if not grads:
        raise ValueError("grads must be a non-empty list of gradient pytrees; got an empty list")
    c = _check_counts(counts, len(grads))
    w = c / c.sum()
    return jax.tree.map(lambda *gs: sum(wi * jnp.asarray(g) for wi, g in zip(w, gs) if wi > 0), *grads)


def plain_mean(grads: Sequence, counts: Sequence[float] | None = None):
    """(1/P)·Σ_i g_i: the plain average data-parallel frameworks use (biased for unequal b_i).

    With ``counts``, replicas holding no samples are left out (P counts the non-empty ones).

    Args:
      grads: the P replicas' gradient pytrees g_i, all of one structure (leaves array-like).
      counts: None (every replica counts), or (P,) b_i, the samples each replica holds (finite,
        >= 0, not all 0).

    Returns:
      The pytree (1/P)·Σ_i g_i over the counted replicas, of the gradients' structure, with JAX
      arrays as leaves.

    Raises:
      ValueError: for an empty ``grads``, and for counts that are not of shape (P,), finite and >= 0,
      or are all zero.
    """
    grads = list(grads)
    if not grads:
        raise ValueError("grads must be a non-empty list of gradient pytrees; got an empty list")
    if counts is not None:
        c = _check_counts(counts, len(grads))
        grads = [g for g, ci in zip(grads, c) if ci > 0]
    return jax.tree.map(lambda *gs: sum(jnp.asarray(g) for g in gs) / len(gs), *grads)


def sample_weights(counts, average: str = "weighted") -> np.ndarray:
    """The weight each sample on replica i gets in the global gradient: (P,) float.

    "weighted": 1/B for everyone; "mean": 1/(P'·b_i) with P' the number of non-empty replicas
    (0 where b_i = 0).

    Args:
      counts: (P,) b_i, the samples each replica holds (finite, >= 0, not all 0); B = Σ b_i.
      average: "weighted" (:func:`weighted_mean`) or "mean" (:func:`plain_mean`).

    Returns:
      (P,) float64, the weight of one sample on each replica.

    Raises:
      ValueError: for counts that are not 1-D, finite and >= 0, or are all zero, and for an unknown
      ``average``.
    """
    c = _check_counts(counts, len(np.asarray(counts)))
    if average == "weighted":
        return np.full(c.shape, 1.0 / c.sum())
    if average == "mean":
        return np.where(c > 0, 1.0 / ((c > 0).sum() * np.maximum(c, 1)), 0.0)
    raise ValueError(f"average must be 'weighted' or 'mean'; got {average!r}")
