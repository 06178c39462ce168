"""Speed profiling: a fitted time model per replica, speeds from it, dynamic re-balancing.

Each replica's step time is modelled as t(b) = α + β·b (a fixed cost plus a per-sample cost),
fitted by least squares to robust timings (:func:`robust_median`: outliers beyond 3 scaled MADs
dropped) at a few probe batch sizes; its speed at batch b is the throughput b / t(b) — a
functional performance model in the sense of Lastovetsky & Reddy: speed depends on the problem
size. Speeds for the split are the throughput at the nominal batch B/P (:func:`nominal_speeds`,
as Moreno-Álvarez et al. do), checked against the replicas' median (:func:`bound_speeds`);
:func:`balanced_speeds` instead iterates partition ↔ speed-at-the-assigned-size to a fixed point.
:class:`Rebalancer` re-estimates speeds from the step times observed during training.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from bppsa.hetero.partition import partition

__all__ = ["TimeModel", "fit_time_model", "robust_median", "profile_replica", "nominal_speeds", "bound_speeds",
           "balanced_speeds", "Rebalancer", "slowdowns_from_mix"]


def slowdowns_from_mix(mix) -> list[float]:
    """Speed ratios (e.g. 1:1:2:4) -> slowdown factors relative to the fastest (4, 4, 2, 1).

    Args:
      mix: (P,) the replicas' speed ratios, one per replica, > 0.

    Returns:
      A list of P floats, max(mix) / mix_i for replica i (1.0 for the fastest).

    Raises:
      ValueError: when ``mix`` is not a non-empty 1-D sequence of positive numbers.
    """
    s = np.asarray(mix, np.float64)
    if s.ndim != 1 or s.size == 0 or (s <= 0).any():
        raise ValueError(f"a speed mix must be positive ratios, one per replica; got {mix!r}")
    return (s.max() / s).tolist()


@dataclass(frozen=True)
class TimeModel:
    """t(b) = alpha + beta·b seconds for a step on b > 0 samples (0 for b = 0).

    Attributes:
      alpha: α, the fixed cost of a step (seconds).
      beta: β, the cost per sample (seconds).
    """
    alpha: float
    beta: float

    def time(self, b):
        b = np.asarray(b, dtype=np.float64)
        return np.where(b > 0, self.alpha + self.beta * b, 0.0)

    def speed(self, b) -> float:
        """Throughput (samples/s) at batch size b (b ≥ 1)."""
        b = max(float(b), 1.0)
        return b / float(self.alpha + self.beta * b)

    def scaled(self, factor: float) -> "TimeModel":
        return TimeModel(self.alpha * factor, self.beta * factor)


def fit_time_model(batch_sizes: Sequence[float] | np.ndarray, times: Sequence[float] | np.ndarray) -> TimeModel:
    """Least-squares fit of t = α + β·b with α ≥ 0 and β > 0.

    Args:
      batch_sizes: (n,) the batch sizes b timed (> 0).
      times: (n,) the step time at each (seconds, finite and > 0).

    Returns:
      The fitted :class:`TimeModel`. With a single distinct batch size, α = 0 and β = mean(t/b); a
      fitted β ≤ 0 (timing noise swamping the per-sample cost) falls back to α = 0, β = median(t/b),
      and a fitted α < 0 to the least-squares line through the origin.

    Raises:
      ValueError: for arrays that are not 1-D of one non-zero length, or values that are not > 0 (or
      times that are not finite).
    """
    b = np.asarray(batch_sizes, dtype=np.float64)
    t = np.asarray(times, dtype=np.float64)
    if b.shape != t.shape or b.ndim != 1 or b.size == 0:
        raise ValueError(f"batch_sizes and times must be 1-D of the same non-zero length; got {b.shape} and {t.shape}")
    if (b <= 0).any() or not np.all(np.isfinite(t)) or (t <= 0).any():
        raise ValueError(f"batch sizes and times must be > 0; got batch_sizes={b.tolist()}, times={t.tolist()}")
    if np.unique(b).size >= 2:
        beta, alpha = np.polyfit(b, t, 1)
    else:
        alpha, beta = 0.0, float(np.mean(t / b))
    if beta <= 0:  # timing noise swamped the per-sample cost: fall back to pure throughput
        alpha, beta = 0.0, float(np.median(t / b))
    if alpha < 0:
        alpha, beta = 0.0, float(np.sum(b * t) / np.sum(b * b))
    return TimeModel(float(alpha), float(beta))


def robust_median(samples, k: float = 3.0) -> dict:
    r"""Median of ``samples`` after dropping outliers, with its spread.

    An outlier lies more than ``k`` scaled MADs (:math:`1.4826 \cdot \mathrm{median}\,|x - \mathrm{median}|`, the
    normal-consistent
    spread) from the median; with a MAD of 0 nothing is dropped. A step that hit a busy host is
    dropped instead of moving the estimate.

    Args:
      samples: the measurements, e.g. step times in seconds (any shape: flattened; finite).
      k: the rejection threshold, in scaled MADs.

    Returns:
      A dict with "median" (of the kept samples), "spread" (the scaled MAD of the kept samples,
      relative to their median; 0 for a median of 0), "kept" and "rejected" (counts).

    Raises:
      ValueError: for no samples or a non-finite one.
    """
    x = np.asarray(samples, np.float64).ravel()
    if x.size == 0 or not np.all(np.isfinite(x)):
        raise ValueError(f"samples must be a non-empty list of finite numbers; got {x.tolist()}")
    med = np.median(x)
    mad = 1.4826 * np.median(np.abs(x - med))
    keep = x if mad == 0 else x[np.abs(x - med) <= k * mad]
    m = float(np.median(keep))
    spread = 1.4826 * float(np.median(np.abs(keep - m))) / abs(m) if m else 0.0
    return {"median": m, "spread": spread, "kept": int(keep.size), "rejected": int(x.size - keep.size)}


def profile_replica(step_time: Callable[[int], float], probe_batches: Sequence[int], repeats: int = 3) -> TimeModel:
    """Time ``step_time(b)`` (seconds for one warmed-up step at batch b) and fit a :class:`TimeModel`.

    Takes the outlier-rejecting median (:func:`robust_median`) of ``repeats`` timings per probe size.

    Args:
      step_time: ``step_time(b) -> seconds``, one timed step at batch size b (an int).
      probe_batches: the batch sizes to time (each >= 1; two distinct ones or more to fit α).
      repeats: timings per probe size (>= 1).

    Returns:
      The :class:`TimeModel` fitted (:func:`fit_time_model`) to the median time at each probe size.

    Raises:
      ValueError: for no probe sizes, a size < 1, repeats < 1, or a step time that is not finite and > 0.
    """
    if not probe_batches or min(probe_batches) < 1:
        raise ValueError(f"probe_batches must be a non-empty list of sizes >= 1; got {list(probe_batches)}")
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1; got {repeats}")
    times = [robust_median([step_time(int(b)) for _ in range(repeats)])["median"] for b in probe_batches]
    return fit_time_model(list(probe_batches), times)


def nominal_speeds(models: Sequence[TimeModel], batch_size: int) -> np.ndarray:
    """Each replica's throughput (samples/s) at the nominal batch B/P — the paper's speed estimate.

    Args:
      models: the P replicas' :class:`TimeModel`.
      batch_size: B, the global batch size.

    Returns:
      (P,) float64, ``models[i].speed(max(B / P, 1))`` for each replica i.

    Raises:
      ValueError: for an empty ``models``.
    """
    if not models:
        raise ValueError("models must be a non-empty list of TimeModel")
    b = max(batch_size / len(models), 1.0)
    return np.array([m.speed(b) for m in models])


def bound_speeds(speeds, max_ratio: float = 16.0) -> tuple[np.ndarray, list[int]]:
    """Clip speeds to [median/max_ratio, median·max_ratio]; returns (speeds, indices clipped).

    A sanity bound: an estimate that far from the other replicas' is more likely a measurement
    gone wrong (a replica profiled while the host was busy) than a real device, and left alone it
    would push the split to an extreme.

    Args:
      speeds: (P,) the speed estimates (finite and > 0).
      max_ratio: the largest factor allowed between a speed and the median (>= 1).

    Returns:
      A pair (the (P,) float64 clipped speeds, the list of the indices of the replicas clipped).

    Raises:
      ValueError: for speeds that are not a non-empty 1-D sequence of finite numbers > 0, or a
      max_ratio below 1.
    """
    s = np.asarray(speeds, np.float64)
    if s.ndim != 1 or s.size == 0 or not np.all(np.isfinite(s)) or (s <= 0).any():
        raise ValueError(f"speeds must be a non-empty 1-D sequence of finite numbers > 0; got {s.tolist()}")
    if not max_ratio >= 1:
        raise ValueError(f"max_ratio must be >= 1; got {max_ratio!r}")
    med = float(np.median(s))
    out = np.clip(s, med / max_ratio, med * max_ratio)
    return out, [int(i) for i in np.flatnonzero(out != s)]


def balanced_speeds(models: Sequence[TimeModel], batch_size: int, iters: int = 20) -> np.ndarray:
    """Speeds s_i (samples/s) such that ``partition(s, B)`` roughly equalises the step times.

    Starts from the throughput at B/P and re-evaluates each replica's throughput at its
    assigned size until the partition stops changing (a partition seen before), for at most
    ``iters`` rounds.

    Args:
      models: the P replicas' :class:`TimeModel`.
      batch_size: B, the global batch size (>= P: :func:`partition` gives every replica a sample).
      iters: the most partition rounds.

    Returns:
      (P,) float64 speeds (samples/s), those of the iterate with the smallest slowest-replica time
      max_i t_i(b_i).

    Raises:
      ValueError: for an empty ``models``, and (from :func:`partition`) a batch_size below P.
    """
    speeds = nominal_speeds(models, batch_size)
    best, best_time, seen = speeds, np.inf, set()
    for _ in range(iters):
        b = partition(speeds, batch_size)
        slowest = max(float(m.time(bi)) for m, bi in zip(models, b))
        if slowest < best_time:
            best, best_time = speeds, slowest
        if tuple(b) in seen:
            break
        seen.add(tuple(b))
        speeds = np.array([m.speed(max(bi, 1)) for m, bi in zip(models, b)])
    return best


@dataclass
class Rebalancer:
    """Dynamic load balancing from the step times observed during training.

    ``observe(counts, times)`` records one step (per-replica batch sizes and busy times, seconds).
    With ``every = K > 0``, each call of ``maybe_repartition(step, batch_size, counts)`` after at
    least K steps since the last switch re-estimates every replica's speed as b / (its per-sample
    time's median over the last K steps — the upper median, so a drift is seen once it covers
    half the window, and one slow step is never enough), and returns new counts when the new
    partition's predicted step time, max_i b_i/s_i, beats the current one's by more than
    ``tolerance`` (hysteresis against timing noise), else None. A switch is logged in ``log``
    and starts a fresh window. So a replica that slows down is noticed within K steps.
    Replicas that held no samples keep their previous estimate. ``every = 0`` disables it.

    Attributes:
      speeds: (P,) the current speed estimates (samples/s); replaced at each switch.
      every: K, the window (in steps) the speeds are re-estimated from, and so the fewest steps between
        two switches; 0 disables re-balancing.
      tolerance: the fraction by which a new partition's predicted step time must beat the current
        one's.
      min_per_replica: the fewest samples a new partition gives any replica (:func:`partition`).
      log: one dict per switch, with "step", "from" and "to" (the counts) and "speeds" (the new
        estimates).
    """
    speeds: np.ndarray
    every: int = 0
    tolerance: float = 0.05
    min_per_replica: int = 1
    log: list = field(default_factory=list)
    _window: list = field(default_factory=list)

    def observe(self, counts, times):
        counts, times = np.asarray(counts, np.float64), np.asarray(times, np.float64)
        per_sample = np.where((counts > 0) & (times > 0), times / np.maximum(counts, 1), np.nan)
        self._window = (self._window + [per_sample])[-max(self.every, 1):]

    def maybe_repartition(self, step: int, batch_size: int, counts) -> np.ndarray | None:
        if not self.every or len(self._window) < self.every:
            return None
        w = np.array(self._window)
        new = np.array(self.speeds, np.float64)
        for i in range(w.shape[1]):
            col = w[:, i][np.isfinite(w[:, i])]
            if col.size:
                new[i] = 1.0 / float(np.quantile(col, 0.5, method="higher"))
        b = partition(new, batch_size, self.min_per_replica)
        predicted = lambda c: float(np.max(np.asarray(c) / new))  # noqa: E731
        if np.array_equal(b, counts) or predicted(b) > (1 - self.tolerance) * predicted(counts):
            return None
        self.speeds, self._window = new, []
        self.log.append({"step": step, "from": [int(v) for v in counts], "to": [int(v) for v in b],
                         "speeds": [float(v) for v in new]})
        return b
