"""ZipLine and its variants against a brute-force oracle (ties and equal times included)."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from bppsa import sync
from bppsa.sync.zipline import brute_force

EXACT = ["window", "zipline", "zipline_opt", "bsearch"]
HEURISTICS = ["grid_scan", "full_grid_scan"]


def _oracle_lower_end(t):
    """Independent exact answer: for each point as the lower end L, each row takes its first point >= L."""
    best = np.inf
    for L in np.unique(t):
        firsts = []
        for row in t:
            j = np.searchsorted(row, L, side="left")
            if j == len(row):
                break
            firsts.append(row[j])
        else:
            best = min(best, max(firsts) - L)
    return best


@st.composite
def sorted_matrices(draw, max_n=5, max_R=5, max_value=6):
    n = draw(st.integers(1, max_n))
    R = draw(st.integers(1, max_R))
    vals = draw(st.lists(st.integers(0, max_value), min_size=n * R, max_size=n * R))
    return np.sort(np.asarray(vals, dtype=float).reshape(n, R), axis=1)


@settings(max_examples=300, deadline=None)
@given(sorted_matrices())
def test_all_variants_match_brute_force_small_integers(t):
    _, best = brute_force(t)
    assert best == _oracle_lower_end(t)
    for m in EXACT:
        idx, r = sync.zipline(t, m)
        assert idx.shape == (t.shape[0],) and idx.dtype == np.int64
        assert np.all((0 <= idx) & (idx < t.shape[1]))
        assert r == best, (m, t, idx, r, best)
        assert sync.selection_range(t, idx) == r
    for m in HEURISTICS:
        idx, r = sync.zipline(t, m)
        assert sync.selection_range(t, idx) == r
        assert r >= best


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 4), st.integers(1, 6), st.integers(0, 2**31 - 1))
def test_variants_match_brute_force_continuous(n, R, seed):
    rng = np.random.default_rng(seed)
    t = np.cumsum(rng.exponential(size=(n, R)), axis=1) + rng.normal(size=(n, 1))
    _, best = brute_force(t)
    for m in EXACT:
        idx, r = sync.zipline(t, m)
        assert r == pytest.approx(best, abs=1e-12)
        assert sync.selection_range(t, idx) == pytest.approx(r, abs=1e-12)
    for m in HEURISTICS:
        assert sync.zipline(t, m)[1] >= best - 1e-12


@pytest.mark.parametrize("seed", range(5))
def test_exact_variants_agree_on_larger_inputs(seed):
    rng = np.random.default_rng(seed)
    n, R = 40, 25
    start = rng.uniform(0, 1, size=(n, 1))
    interval = rng.uniform(0.5, 3.0, size=(n, 1))
    t = start + interval * np.arange(1, R + 1)  # ElasticBSP's predictions: arithmetic rows
    expect = _oracle_lower_end(t)
    for m in EXACT:
        idx, r = sync.zipline(t, m)
        assert r == pytest.approx(expect, abs=1e-12)
        assert sync.selection_range(t, idx) == pytest.approx(r, abs=1e-12)
    for m in HEURISTICS:
        assert sync.zipline(t, m)[1] >= expect - 1e-12


def test_equal_times_and_single_row_or_column():
    t = np.full((5, 3), 2.0)
    for m in EXACT + HEURISTICS:
        idx, r = sync.zipline(t, m)
        assert r == 0.0 and sync.selection_range(t, idx) == 0.0
    one = np.array([[1.0, 4.0, 9.0]])
    for m in EXACT:
        assert sync.zipline(one, m)[1] == 0.0
    col = np.array([[3.0], [1.0], [7.0]])
    for m in EXACT:
        idx, r = sync.zipline(col, m)
        assert r == 6.0 and idx.tolist() == [0, 0, 0]


def test_known_example():
    # worker 0 every 1 s, worker 1 every 2.4 s from t = 2.5: best pair is (4.5, 4.9)
    t = np.array([[3.5, 4.5, 5.5, 6.5], [4.9, 7.3, 9.7, 12.1]])
    for m in EXACT:
        idx, r = sync.zipline(t, m)
        assert idx.tolist() == [1, 0]
        assert r == pytest.approx(0.4)


def test_bad_input_is_a_clear_error():
    with pytest.raises(ValueError, match="shape"):
        sync.zipline(np.zeros(3))
    with pytest.raises(ValueError, match="sorted ascending"):
        sync.zipline(np.array([[1.0, 0.0]]))
    with pytest.raises(ValueError, match="finite"):
        sync.zipline(np.array([[np.nan, 1.0]]))
    with pytest.raises(ValueError, match="method"):
        sync.zipline(np.zeros((2, 2)), "nope")
    with pytest.raises(ValueError, match="brute_force"):
        brute_force(np.zeros((30, 10)))
