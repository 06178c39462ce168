"""ZipLine: choose the next ElasticBSP barrier (Zhao et al., ICDM 2019; Machine Learning 2021).

Given each worker's next R predicted push times, ``times: (n, R)`` with every row sorted
ascending, pick one time per worker so that ``max − min`` of the chosen set is smallest (the
"smallest range covering one element from each of n sorted lists"). The barrier is then at the
max of the chosen set, and worker p runs ``indices[p] + 1`` iterations before it.

Every solver returns ``(indices, range)``: ``indices: (n,)`` int, the chosen column per row, and
``range = times[p, indices[p]].max() − .min()`` as a float.

Exact solvers (all return an optimal range; they may pick different optimal index sets on ties):

- :func:`zipline_paper` — the paper's ZipLine: merge the n·R points in time order and slide a
  time-ordered window holding one (the latest) point per worker; each incoming point replaces its
  worker's older point, found by a linear search of the window, O(R·n²); when the window covers
  every worker its range is incoming − leftmost.
- :func:`zipline_opt` — ZipLineOpt: the linear search is skipped when the incoming point's worker
  is the window's leftmost (the old point is then the left end, removed directly).
- :func:`zipline_bsearch` — the binary-search variant: the window's times are kept sorted; the
  replaced point is found by binary search, O(R·n·log n) comparisons.
- :func:`zipline_window` — a count-per-worker two-pointer window over the merged points, with the
  merge done by numpy; the fastest, and the default of :func:`zipline`.
- :func:`brute_force` — enumerate all Rⁿ choices (tests only; refuses large inputs).

Heuristics (never better than optimal; used as baselines):

- :func:`grid_scan` — candidate barriers are the slowest worker's predicted pushes (its row is the
  "grid"); every worker takes its latest push at or before the candidate (its first push if none).
- :func:`full_grid_scan` — candidate barriers are all n·R points; every worker takes the push
  nearest to the candidate (earliest on a tie), which can overshoot the candidate.
"""

from __future__ import annotations

import bisect
import itertools

import numpy as np

__all__ = ["zipline", "zipline_paper", "zipline_opt", "zipline_bsearch", "zipline_window",
           "brute_force", "grid_scan", "full_grid_scan", "ZIPLINE_METHODS", "selection_range"]


def _check(times) -> np.ndarray:
    t = np.asarray(times, dtype=np.float64)
    if t.ndim != 2 or t.shape[0] < 1 or t.shape[1] < 1:
        raise ValueError(f"times must have shape (n, R) with n >= 1 and R >= 1; got shape {t.shape}")
    if not np.all(np.isfinite(t)):
        raise ValueError("times must be finite; got NaN or inf")
    if t.shape[1] > 1 and np.any(np.diff(t, axis=1) < 0):
        bad = int(np.nonzero(np.any(np.diff(t, axis=1) < 0, axis=1))[0][0])
        raise ValueError(f"each row of times must be sorted ascending; row {bad} is not: {t[bad].tolist()}")
    return t


def selection_range(times, indices) -> float:
    """max − min of ``times[p, indices[p]]`` over the rows p.

    Args:
      times: (n, R) predicted push times.
      indices: (n,) ints, the column chosen in each row.

    Returns:
      The range, a float.
    """
    t = np.asarray(times, dtype=np.float64)
    sel = t[np.arange(t.shape[0]), np.asarray(indices)]
    return float(sel.max() - sel.min())


def _merged(t: np.ndarray):
    """The n·R points in time order (ties by worker, then column): (time, worker, column) lists."""
    R = t.shape[1]
    flat = t.ravel()
    order = np.argsort(flat, kind="stable")  # row-major flat index: ties stay in (worker, column) order
    return flat[order].tolist(), (order // R).tolist(), (order % R).tolist()


def zipline_paper(times):
    """The paper's ZipLine, O(R·n²): a time-ordered window holding each worker's latest point.

    Each incoming point (the largest time so far) is appended on the right after the same worker's
    older point is found by a linear search of the window and removed; once the window holds every
    worker, its range is the new point minus the window's leftmost point.

    Args:
      times: (n, R) each worker's next R predicted push times, every row sorted ascending (finite).

    Returns:
      The pair (indices (n,) int64, the chosen column of each row; range, their times' max − min).

    Raises:
      ValueError: for times that are not (n, R) with n, R >= 1, not finite, or a row not sorted.
    """
    return _zipline_list(times, skip_leftmost=False)


def zipline_opt(times):
    """ZipLineOpt: as :func:`zipline_paper`, but the linear search is skipped when the incoming
    point's worker holds the window's leftmost point (it is removed from the left end directly).

    Args:
      times: (n, R) each worker's next R predicted push times, every row sorted ascending (finite).

    Returns:
      The pair (indices (n,) int64, the chosen column of each row; range, their times' max − min).

    Raises:
      ValueError: for times that are not (n, R) with n, R >= 1, not finite, or a row not sorted.
    """
    return _zipline_list(times, skip_leftmost=True)


def _zipline_list(times, skip_leftmost):
    t = _check(times)
    n = t.shape[0]
    vals, wks, cols = _merged(t)
    win_w: list[int] = []  # workers of the window's points, in time order
    win_t: list[float] = []
    latest_c = [-1] * n
    best, best_idx = np.inf, None
    for x, w, c in zip(vals, wks, cols):
        if latest_c[w] >= 0:
            if skip_leftmost and win_w[0] == w:
                k = 0
            else:
                k = win_w.index(w)  # linear search, O(n)
            del win_w[k], win_t[k]
        win_w.append(w)
        win_t.append(x)
        latest_c[w] = c
        if len(win_w) == n and x - win_t[0] < best:
            best, best_idx = x - win_t[0], list(latest_c)
    return np.asarray(best_idx, dtype=np.int64), float(best)


def zipline_bsearch(times):
    """Binary-search ZipLine, O(R·n·log n) comparisons: the window's times kept sorted.

    Args:
      times: (n, R) each worker's next R predicted push times, every row sorted ascending (finite).

    Returns:
      The pair (indices (n,) int64, the chosen column of each row; range, their times' max − min).

    Raises:
      ValueError: for times that are not (n, R) with n, R >= 1, not finite, or a row not sorted.
    """
    t = _check(times)
    n = t.shape[0]
    vals, wks, cols = _merged(t)
    latest_t = [0.0] * n
    latest_c = [-1] * n
    window = []  # sorted times of the window's points, one per worker seen so far
    best, best_idx = np.inf, None
    for x, w, c in zip(vals, wks, cols):
        if latest_c[w] >= 0:
            del window[bisect.bisect_left(window, latest_t[w])]
        # x is the largest time so far, so it belongs at the end
        window.append(x)
        latest_t[w], latest_c[w] = x, c
        if len(window) == n and x - window[0] < best:
            best, best_idx = x - window[0], list(latest_c)
    return np.asarray(best_idx, dtype=np.int64), float(best)


def zipline_window(times):
    """Count-per-worker sliding window over the merged points (two pointers), O(n·R·log(n·R)) for the sort.

    Args:
      times: (n, R) each worker's next R predicted push times, every row sorted ascending (finite).

    Returns:
      The pair (indices (n,) int64, the chosen column of each row; range, their times' max − min).

    Raises:
      ValueError: for times that are not (n, R) with n, R >= 1, not finite, or a row not sorted.
    """
    t = _check(times)
    n, R = t.shape
    vals, wks, cols = _merged(t)
    count = [0] * n
    covered = 0
    lo = 0
    best, best_lo, best_hi = np.inf, 0, 0
    for hi, w in enumerate(wks):
        if count[w] == 0:
            covered += 1
        count[w] += 1
        if covered == n:
            # shrink from the left while the window still covers every worker
            while count[wks[lo]] > 1:
                count[wks[lo]] -= 1
                lo += 1
            r = vals[hi] - vals[lo]
            if r < best:
                best, best_lo, best_hi = r, lo, hi
    idx = np.full(n, -1, dtype=np.int64)
    for k in range(best_hi, best_lo - 1, -1):  # the latest point of each worker inside the best window
        if idx[wks[k]] < 0:
            idx[wks[k]] = cols[k]
    return idx, float(best)


def brute_force(times, max_combinations: int = 2_000_000):
    """Enumerate every choice of one column per row (the test oracle); refuses more than ``max_combinations``.

    Args:
      times: (n, R) each worker's next R predicted push times, every row sorted ascending (finite).
      max_combinations: the most choices (R**n) it enumerates.

    Returns:
      The pair (indices (n,) int64, the chosen column of each row; range, their times' max − min).

    Raises:
      ValueError: for times that are not (n, R) with n, R >= 1, not finite, or a row not sorted, and
      when R**n exceeds ``max_combinations``.
    """
    t = _check(times)
    n, R = t.shape
    if R ** n > max_combinations:
        raise ValueError(f"brute_force would enumerate R**n = {R}**{n} choices; expected at most {max_combinations}")
    best, best_idx = np.inf, None
    rows = range(n)
    for idx in itertools.product(range(R), repeat=n):
        sel = [t[p, idx[p]] for p in rows]
        r = max(sel) - min(sel)
        if r < best:
            best, best_idx = r, idx
    return np.asarray(best_idx, dtype=np.int64), float(best)


def grid_scan(times):
    """Heuristic: barrier candidates on the slowest worker's grid; each worker takes its latest push ≤ it.

    The slowest worker is the one whose R pushes span the longest time (with R = 1, the latest).

    Args:
      times: (n, R) each worker's next R predicted push times, every row sorted ascending (finite).

    Returns:
      The pair (indices (n,) int64, the chosen column of each row; range, their times' max − min) of
      the best candidate (not always optimal).

    Raises:
      ValueError: for times that are not (n, R) with n, R >= 1, not finite, or a row not sorted.
    """
    t = _check(times)
    n, R = t.shape
    slow = int(np.argmax(t[:, -1] - t[:, 0])) if R > 1 else int(np.argmax(t[:, 0]))
    best, best_idx = np.inf, None
    for b in t[slow]:
        idx = np.maximum(np.array([np.searchsorted(row, b, side="right") - 1 for row in t]), 0)
        r = selection_range(t, idx)
        if r < best:
            best, best_idx = r, idx
    assert best_idx is not None  # _check: times finite and non-empty, so the first candidate's range < inf
    return best_idx.astype(np.int64), float(best)


def full_grid_scan(times):
    """Heuristic: every point is a barrier candidate; each worker takes the push nearest to it.

    Args:
      times: (n, R) each worker's next R predicted push times, every row sorted ascending (finite).

    Returns:
      The pair (indices (n,) int64, the chosen column of each row; range, their times' max − min) of
      the best candidate (not always optimal).

    Raises:
      ValueError: for times that are not (n, R) with n, R >= 1, not finite, or a row not sorted.
    """
    t = _check(times)
    n, R = t.shape
    rows = np.arange(n)
    best, best_idx = np.inf, None
    for b in np.unique(t):
        idx = np.argmin(np.abs(t - b), axis=1)  # first (earliest) minimiser on a tie
        sel = t[rows, idx]
        r = float(sel.max() - sel.min())
        if r < best:
            best, best_idx = r, idx
    assert best_idx is not None  # _check: times finite and non-empty, so the first candidate's range < inf
    return best_idx.astype(np.int64), float(best)


ZIPLINE_METHODS = {
    "window": zipline_window,
    "zipline": zipline_paper,
    "zipline_opt": zipline_opt,
    "bsearch": zipline_bsearch,
    "grid_scan": grid_scan,
    "full_grid_scan": full_grid_scan,
    "brute_force": brute_force,
}


def zipline(times, method: str = "window"):
    """The optimal next barrier: ``times: (n, R)`` rows sorted ascending -> ``(indices (n,), range)``.

    ``method``: "window" (default, fastest) | "zipline" | "zipline_opt" | "bsearch" (exact), or
    "grid_scan" | "full_grid_scan" (heuristics) | "brute_force" (tiny inputs only).

    Args:
      times: (n, R) each worker's next R predicted push times, every row sorted ascending (finite).
      method: the solver, a key of :data:`ZIPLINE_METHODS`.

    Returns:
      The pair (indices (n,) int64, the chosen column of each row; range, their times' max − min); worker p runs
      ``indices[p] + 1`` iterations before the barrier.

    Raises:
      ValueError: for an unknown method, times that are not (n, R) with n, R >= 1, not finite, or a
      row not sorted, and (brute_force) too many choices.

    Examples:
      Three workers' next three predicted push times; the barrier that keeps them closest:

      >>> import numpy as np
      >>> from bppsa import sync
      >>> times = np.array([[1.0, 2.0, 3.0],
      ...                   [1.5, 2.6, 3.9],
      ...                   [2.1, 3.0, 4.2]])
      >>> indices, rng = sync.zipline(times)
      >>> indices.tolist(), round(float(rng), 2)          # pushes 2.6 and 3.0 after 3.0 and 3.0: range 0.4
      ([2, 1, 1], 0.4)
      >>> sync.zipline(times, method="bsearch")[0].tolist()
      [2, 1, 1]
    """
    if method not in ZIPLINE_METHODS:
        raise ValueError(f"method must be one of {sorted(ZIPLINE_METHODS)}; got {method!r}")
    return ZIPLINE_METHODS[method](times)
