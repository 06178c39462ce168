"""Speed profiling: a fitted time model per replica, speeds from it, dynamic re-balancing.

Each replica's step time is modelled as t(b) = α + β·b (a fixed cost plus a per-sample cost),
fitted by least squares to timings at a few probe batch sizes; its speed at batch b is the
throughput b / t(b) — a functional performance model in the sense of Lastovetsky & Reddy:
speed depends on the problem size. :func:`balanced_speeds` iterates partition ↔ speed-at-the-
assigned-size to a fixed point, so replicas with a large fixed cost get fewer samples than
their asymptotic speed suggests.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from .partition import partition

__all__ = ["TimeModel", "fit_time_model", "profile_replica", "balanced_speeds", "Rebalancer", "slowdowns_from_mix"]


def slowdowns_from_mix(mix) -> list[float]:
    """Speed ratios (e.g. 1:1:2:4) -> slowdown factors relative to the fastest (4, 4, 2, 1)."""
    s = np.asarray(mix, np.float64)
    if s.ndim != 1 or s.size == 0 or (s <= 0).any():
        raise ValueError(f"a speed mix must be positive ratios, one per replica; got {mix!r}")
    return (s.max() / s).tolist()


@dataclass(frozen=True)
class TimeModel:
    """t(b) = alpha + beta·b seconds for a step on b > 0 samples (0 for b = 0)."""
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


def fit_time_model(batch_sizes: Sequence[float], times: Sequence[float]) -> TimeModel:
    """Least-squares fit of t = α + β·b with α ≥ 0 and β > 0 (b: (n,), times: (n,) seconds)."""
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


def profile_replica(step_time: Callable[[int], float], probe_batches: Sequence[int], repeats: int = 3) -> TimeModel:
    """Time ``step_time(b)`` (seconds for one warmed-up step at batch b) and fit a :class:`TimeModel`.

    Takes the median of ``repeats`` timings per probe size.
    """
    if not probe_batches or min(probe_batches) < 1:
        raise ValueError(f"probe_batches must be a non-empty list of sizes >= 1; got {list(probe_batches)}")
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1; got {repeats}")
    times = [float(np.median([step_time(int(b)) for _ in range(repeats)])) for b in probe_batches]
    return fit_time_model(list(probe_batches), times)


def balanced_speeds(models: Sequence[TimeModel], batch_size: int, iters: int = 20) -> np.ndarray:
    """Speeds s_i (samples/s) such that ``partition(s, B)`` roughly equalises the step times.

    Starts from the throughput at B/P and re-evaluates each replica's throughput at its
    assigned size until the partition stops changing; returns the speeds of the iterate with
    the smallest slowest-replica time.
    """
    if not models:
        raise ValueError("models must be a non-empty list of TimeModel")
    P = len(models)
    speeds = np.array([m.speed(max(batch_size / P, 1)) for m in models])
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
    """Dynamic load balancing: every ``every`` steps, re-estimate speeds from observed step times.

    ``observe(counts, times)`` records one step (per-replica batch sizes and busy times);
    ``maybe_repartition(step, batch_size, counts)`` returns new counts when the new partition's
    predicted step time, max_i b_i/s_i, beats the current one's by more than ``tolerance``
    (hysteresis against timing noise), else None, and logs the switch in ``log``. Replicas
    without samples keep their previous speed estimate. ``every = 0`` disables it.
    """
    speeds: np.ndarray
    every: int = 0
    tolerance: float = 0.05
    log: list = field(default_factory=list)
    _b: np.ndarray | None = None
    _t: np.ndarray | None = None

    def observe(self, counts, times):
        counts, times = np.asarray(counts, np.float64), np.asarray(times, np.float64)
        self._b = counts if self._b is None else self._b + counts
        self._t = times if self._t is None else self._t + times

    def maybe_repartition(self, step: int, batch_size: int, counts) -> np.ndarray | None:
        if not self.every or step % self.every or self._b is None:
            return None
        seen = (self._b > 0) & (self._t > 0)
        new = np.array(self.speeds, np.float64)
        new[seen] = self._b[seen] / self._t[seen]
        self._b = self._t = None
        self.speeds = new
        b = partition(new, batch_size)
        predicted = lambda c: float(np.max(np.asarray(c) / new))  # noqa: E731
        if np.array_equal(b, counts) or predicted(b) > (1 - self.tolerance) * predicted(counts):
            return None
        self.log.append({"step": step, "from": [int(v) for v in counts], "to": [int(v) for v in b],
                         "speeds": [float(v) for v in new]})
        return b
