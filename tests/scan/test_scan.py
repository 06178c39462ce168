"""The three scans agree on random affine elements (float64), for any length."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from tests.props import property_pair

from bppsa.scan import dense as S  # the dense scans: their storage-order internals are tested here too


_scan = jax.jit(S.scan, static_argnames="method")  # one compile per shape instead of per eager op


def _elements(rng, n, B, H, with_d):
    Ms = jnp.asarray(rng.normal(size=(n, B, H, H)) / np.sqrt(H))
    ds = jnp.asarray(rng.normal(size=(n, B, H))) if with_d else None
    v = jnp.asarray(rng.normal(size=(B, H)))
    return v, Ms, ds


def _reference(v, Ms, ds):
    """Plain Python loop: x_k = x_{k-1} @ M_k + d_k."""
    x = np.asarray(v)
    out = []
    for k in range(Ms.shape[0]):
        out.append(x)
        x = np.einsum("bi,bij->bj", x, np.asarray(Ms[k])) + (0 if ds is None else np.asarray(ds[k]))
    return np.stack(out), x


@pytest.mark.parametrize("method", sorted(S.SCANS))
@pytest.mark.parametrize("n", [1, 2, 7, 33, 100] + [pytest.param(n, marks=pytest.mark.slow)
                                                   for n in (3, 4, 9, 16, 63, 64, 65, 129)])
@pytest.mark.parametrize("with_d", [False, True])
def test_scan_matches_python_loop(method, n, with_d):
    rng = np.random.default_rng(n)
    v, Ms, ds = _elements(rng, n, 2, 3, with_d)
    prefixes, total = _scan(v, Ms, ds, method=method)
    ref_p, ref_t = _reference(v, Ms, ds)
    assert prefixes.shape == (n, 2, 3) and total.shape == (2, 3)
    np.testing.assert_allclose(prefixes, ref_p, rtol=1e-11, atol=1e-12)
    np.testing.assert_allclose(total, ref_t, rtol=1e-11, atol=1e-12)


@property_pair(
    5, 15, n=st.one_of(st.integers(1, 40), st.integers(64, 300)), B=st.integers(1, 3), H=st.integers(1, 5),
    with_d=st.booleans(), seed=st.integers(0, 2**31 - 1))
def test_blelloch_equals_sequential_property(n, B, H, with_d, seed):
    v, Ms, ds = _elements(np.random.default_rng(seed), n, B, H, with_d)
    p_b, t_b = _scan(v, Ms, ds, method="blelloch")
    p_s, t_s = _scan(v, Ms, ds, method="sequential")
    np.testing.assert_allclose(p_b, p_s, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(t_b, t_s, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("n", [1, 2, 5, 8, 13, 300])
def test_up_sweep_levels_and_root(n):
    v, Ms, ds = _elements(np.random.default_rng(0), n, 1, 2, True)
    levels = jax.jit(S.up_sweep)(v, Ms, ds)
    # ⌈log2(n + 1)⌉ reduce levels above level 0, each halving the block count (rounding up).
    assert len(levels) == math.ceil(math.log2(n + 1)) + 1
    blocks = n + 1
    for vec, M, d in levels:
        assert M.shape[0] == blocks - 1 and d.shape[0] == blocks - 1 and vec.shape == (1, 2)
        blocks = (blocks + 1) // 2
    assert levels[-1][1].shape[0] == 0
    np.testing.assert_allclose(levels[-1][0], _reference(v, Ms, ds)[1], rtol=1e-10)
    assert jax.jit(S.down_sweep)(levels).shape == (n, 1, 2)


def test_matrix_products_only_away_from_the_root():
    """Up-sweep matrix-matrix products: n - ⌈log2(n+1)⌉ - (carried blocks), never more than n."""
    v, Ms, _ = _elements(np.random.default_rng(1), 1000, 1, 2, False)
    levels = jax.eval_shape(S.up_sweep, v, Ms, None)
    assert sum(lv[1].shape[0] for lv in levels[1:]) < 1000


@pytest.mark.parametrize("n", [9, pytest.param(100, marks=pytest.mark.slow)])
def test_float32_stays_float32(n):
    v, Ms, ds = _elements(np.random.default_rng(2), n, 2, 3, True)
    p, t = S.blelloch_scan(v.astype(jnp.float32), Ms.astype(jnp.float32), ds.astype(jnp.float32))
    assert p.dtype == jnp.float32 and t.dtype == jnp.float32


@pytest.mark.parametrize("n", [11, 100])  # 100: bottom levels and padding under vmap
def test_jit_and_vmap_compose(n):
    rng = np.random.default_rng(3)
    problems = [_elements(rng, n, 2, 3, True) for _ in range(3)]
    v, Ms, ds = (jnp.stack(parts) for parts in zip(*problems))  # a leading axis of 3 problems
    p, t = jax.vmap(jax.jit(S.blelloch_scan))(v, Ms, ds)
    for i, prob in enumerate(problems):
        ref_p, ref_t = _reference(*prob)
        np.testing.assert_allclose(p[i], ref_p, rtol=1e-11)
        np.testing.assert_allclose(t[i], ref_t, rtol=1e-11)


def test_bad_inputs():
    v, Ms, ds = _elements(np.random.default_rng(4), 3, 2, 3, True)
    with pytest.raises(ValueError, match="scan must be one of"):
        S.scan(v, Ms, ds, "kogge-stone")
    with pytest.raises(ValueError, match=r"Ms must have shape \(n, B, S, S\)"):
        S.blelloch_scan(v, Ms[..., :2], ds)
    with pytest.raises(ValueError, match=r"v must have shape \(B, S\)"):
        S.sequential_scan(v[:1], Ms, ds)
    with pytest.raises(ValueError, match=r"ds must have shape \(n, B, S\)"):
        S.associative_scan(v, Ms, ds[:2])
    with pytest.raises(ValueError, match="n >= 1"):
        S.blelloch_scan(v, Ms[:0], None)


# --------------------------------------------------------------------------------------------
# The fast Blelloch scan's storage order (bottom levels on contiguous halves).
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("n", [1, 2, 63, 64, 65, 100, 1000, 1025, 4097, 10000, 30001])
def test_bottom_layout_bounds(n):
    k, m, N = S.bottom_layout(n)
    assert N == m << k and N >= n and N - n < (1 << k)
    if k:  # enough blocks left for the top scan, and at most ~3 % padding
        assert 32 <= m <= 64 and (N - n) <= n / 32
    else:
        assert N == n and n < 64


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 5000))
def test_bottom_order_pairs_adjacent_blocks_as_contiguous_halves(n):
    """At every bottom level, position q (first half) and q + half (second half) hold adjacent
    blocks, left then right; after k levels the m blocks are in natural order."""
    k, m, N = S.bottom_layout(n)
    order, inverse = S.bottom_order(n)
    assert sorted(order) == list(range(N)) and np.array_equal(order[inverse], np.arange(n))
    start, end = order.copy(), order + 1  # each position holds the interval of elements it covers
    for _ in range(k):
        h = start.shape[0] // 2
        assert np.array_equal(end[:h], start[h:])
        start, end = start[:h], end[h:]
    assert np.array_equal(start, np.arange(m) << k) and np.array_equal(end, (np.arange(m) + 1) << k)


@property_pair(
    8, 30, n=st.integers(1, 3000), rest=st.sampled_from([(), (2,), (1, 3)]))
def test_to_storage_round_trip(n, rest):
    x = jnp.arange(n * int(np.prod(rest, dtype=int)), dtype=jnp.float64).reshape((n,) + rest)
    y = S.to_storage(x, n)
    k, m, N = S.bottom_layout(n)
    order, _ = S.bottom_order(n)
    assert y.shape == (N,) + rest
    padded = np.concatenate([np.asarray(x), np.zeros((N - n,) + rest)])
    np.testing.assert_array_equal(y, padded[order])  # the padding rows are zero
    np.testing.assert_array_equal(S.from_storage(y, n), x)


@pytest.mark.parametrize("n", [71, 1000])
def test_stored_scan_replaces_padding_with_identity(n):
    """Whatever the padding rows hold (NaN here) is replaced by the identity map."""
    v, Ms, ds = _elements(np.random.default_rng(n), n, 2, 3, True)
    k, m, N = S.bottom_layout(n)
    assert N > n
    pad = jnp.asarray(S.bottom_order(n)[0] >= n)
    Mp = jnp.where(pad[:, None, None, None], jnp.nan, S.to_storage(Ms, n))
    dp = jnp.where(pad[:, None, None], jnp.nan, S.to_storage(ds, n))
    ref_p, ref_t = _reference(v, Ms, ds)
    p, t = jax.jit(S.blelloch_scan_stored, static_argnums=3)(v, Mp, dp, n)
    np.testing.assert_allclose(p, ref_p, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(t, ref_t, rtol=1e-10, atol=1e-12)
    # the backward's promise: zero offset padding (to_storage's), not masked again
    p, t = jax.jit(lambda v, M, d: S.blelloch_scan_stored(v, M, d, n, zero_padded_offsets=True))(
        v, Mp, S.to_storage(ds, n))
    np.testing.assert_allclose(t, ref_t, rtol=1e-10, atol=1e-12)
    with pytest.raises(ValueError, match=f"N = {N} rows"):
        S.blelloch_scan_stored(v, Ms, ds, n)


def test_storage_helpers_reject_bad_input():
    x = jnp.zeros((100, 2))
    with pytest.raises(ValueError, match="n = 99 or N = 100 rows"):
        S.to_storage(x[:, None][:50], 99)
    with pytest.raises(ValueError, match="N = 100 rows"):
        S.from_storage(x[:99], 99)
    with pytest.raises(ValueError, match="pad must be"):
        S.to_storage(x, 100, pad="reflect")
    with pytest.raises(ValueError, match="static Python int"):
        S.bottom_layout(2.5)
    assert S.bottom_layout(np.int64(100)) == S.bottom_layout(100)
    edge = S.to_storage(jnp.arange(1.0, 72.0), 71, pad="edge")  # N = 72: one padding row
    assert float(edge[S.bottom_order(71)[1]].max()) == 71.0 and sorted(np.asarray(edge))[-2:] == [71.0, 71.0]


def test_scan_beyond_the_fused_product_size():
    """S > FMA_MAX: the flat-GEMM products, through a whole scan with bottom levels."""
    S_ = S.FMA_MAX + 1
    v, Ms, ds = _elements(np.random.default_rng(7), 70, 1, S_, True)
    p, t = _scan(v, Ms, ds, method="blelloch")
    ref_p, ref_t = _reference(v, Ms, ds)
    np.testing.assert_allclose(p, ref_p, rtol=1e-9, atol=1e-10)
    np.testing.assert_allclose(t, ref_t, rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("size", [3, 20, S.FMA_MAX, S.FMA_MAX + 1])
@pytest.mark.parametrize("lead", [(3, 2), (S.FMA_MIN_PRODUCTS // 8, 8)])
def test_products_in_both_forms(size, lead):
    """Fused multiply-adds for S <= FMA_MAX and at least FMA_MIN_PRODUCTS products, a flat batched
    GEMM otherwise: both are the product, and each is the form chosen (on CPU; a GEMM elsewhere)."""
    rng = np.random.default_rng(size)
    L, R = (jnp.asarray(rng.normal(size=lead + (size, size))) for _ in range(2))
    w = jnp.asarray(rng.normal(size=lead + (size,)))
    np.testing.assert_allclose(jax.jit(S.batched_matmul)(L, R), np.einsum("pbik,pbkj->pbij", L, R), rtol=1e-11, atol=1e-12)
    np.testing.assert_allclose(jax.jit(S.batched_vecmat)(w, R), np.einsum("pbi,pbij->pbj", w, R), rtol=1e-11, atol=1e-12)
    fma = size <= S.FMA_MAX and np.prod(lead) >= S.FMA_MIN_PRODUCTS and jax.default_backend() == "cpu"
    for f, args in ((S.batched_matmul, (L, R)), (S.batched_vecmat, (w, R))):
        assert ("dot_general" in str(jax.make_jaxpr(f)(*args))) is not fma


# ---------------------------------------------------------------------------------------------
# The diagonal-structure scan (M_k = diag(A_k) @ Wt, the RNN's Jacobian): same results, no matrices.
# ---------------------------------------------------------------------------------------------

def _diag_elements(rng, n, B, H, with_d):
    A = jnp.asarray(rng.uniform(0.0, 1.0, size=(n, B, H)))  # like tanh' = 1 - h^2
    Wt = jnp.asarray(rng.normal(size=(H, H)) / np.sqrt(H))
    ds = jnp.asarray(rng.normal(size=(n, B, H))) if with_d else None
    v = jnp.asarray(rng.normal(size=(B, H)))
    return v, A, Wt, ds


def _diag_scan(v, A, Wt, ds, n, pad_with=None):
    """Storage order, then the diagonal scan; ``pad_with`` overwrites the padding rows."""
    Ap = S.to_storage(A, n, pad="edge")
    dp = None if ds is None else S.to_storage(ds, n)
    if pad_with is not None:
        pad = jnp.asarray(S.bottom_order(n)[0] >= n)[:, None, None]
        Ap = jnp.where(pad, pad_with, Ap)
        dp = None if dp is None else jnp.where(pad, pad_with, dp)
    return jax.jit(S.blelloch_scan_stored_diag, static_argnums=4)(v, Ap, Wt, dp, n)


@pytest.mark.parametrize("n", [1, 2, 64, 129] + [pytest.param(n, marks=pytest.mark.slow)
                                                 for n in (3, 63, 65, 127, 128, 200, 1000, 1025)])
@pytest.mark.parametrize("with_d", [False, True])
def test_diagonal_scan_matches_python_loop(close, n, with_d):
    v, A, Wt, ds = _diag_elements(np.random.default_rng(n), n, 2, 3, with_d)
    Ms = A[..., None] * Wt
    ref_p, ref_t = _reference(v, Ms, ds)
    p, t = _diag_scan(v, A, Wt, ds, n)
    assert p.shape == (n, 2, 3) and t.shape == (2, 3)
    close((p, t), (ref_p, ref_t), 1e-10, 1e-12)


@property_pair(5, 15, n=st.one_of(st.integers(1, 70), st.integers(64, 2100)), B=st.integers(1, 3),
               H=st.integers(1, 6), with_d=st.booleans(), seed=st.integers(0, 2**31 - 1))
def test_diagonal_scan_equals_dense_stored_scan_property(close, n, B, H, with_d, seed):
    v, A, Wt, ds = _diag_elements(np.random.default_rng(seed), n, B, H, with_d)
    p_d, t_d = _diag_scan(v, A, Wt, ds, n)
    Ms = A[..., None] * Wt
    p_s, t_s = _scan(v, Ms, ds, method="sequential")
    close((p_d, t_d), (p_s, t_s), 1e-9, 1e-12)


@pytest.mark.parametrize("n", [71, 1000, pytest.param(4097, marks=pytest.mark.slow)])
def test_diagonal_scan_ignores_padding_rows(close, n):
    """Padding elements are the latest in scan order: whatever they hold (NaN, inf) reaches
    neither a real prefix nor the total."""
    v, A, Wt, ds = _diag_elements(np.random.default_rng(n), n, 2, 3, True)
    assert S.bottom_layout(n)[2] > n
    ref_p, ref_t = _reference(v, A[..., None] * Wt, ds)
    for bad in (jnp.nan, jnp.inf):
        p, t = _diag_scan(v, A, Wt, ds, n, pad_with=bad)
        close((p, t), (ref_p, ref_t), 1e-10, 1e-12)


def test_diagonal_scan_float32_and_vmap():
    n = 300
    v, A, Wt, ds = _diag_elements(np.random.default_rng(5), n, 1, 20, True)
    ref_p, ref_t = _reference(v, A[..., None] * Wt, ds)
    f32 = lambda x: x.astype(jnp.float32)
    p, t = _diag_scan(f32(v), f32(A), f32(Wt), f32(ds), n)
    assert p.dtype == jnp.float32
    np.testing.assert_allclose(p, ref_p, rtol=2e-4, atol=2e-5)
    # a batch of independent scans under vmap (the shared factor per scan)
    vs, As, ds2 = (jnp.stack([x, 2 * x]) for x in (v, A, ds))
    p2, t2 = jax.vmap(lambda v, a, d: _diag_scan(v, a, Wt, d, n))(vs, As, ds2)
    np.testing.assert_allclose(p2[0], ref_p, rtol=1e-9, atol=1e-12)
    ref_p2, ref_t2 = _reference(2 * v, (2 * A)[..., None] * Wt, 2 * ds)
    np.testing.assert_allclose(p2[1], ref_p2, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(t2[1], ref_t2, rtol=1e-9, atol=1e-12)


def test_diagonal_scan_rejects_bad_input():
    n = 71  # N = 72
    k, m, N = S.bottom_layout(n)
    v, A, Wt, ds = _diag_elements(np.random.default_rng(0), N, 2, 3, True)
    with pytest.raises(ValueError, match=f"A must have shape \\(N, B, S\\) with N = {N}"):
        S.blelloch_scan_stored_diag(v, A[:n], Wt, ds, n)
    with pytest.raises(ValueError, match="Wt must have shape"):
        S.blelloch_scan_stored_diag(v, A, Wt[:2], ds, n)
    with pytest.raises(ValueError, match="v must have shape"):
        S.blelloch_scan_stored_diag(v[:1], A, Wt, ds, n)
    with pytest.raises(ValueError, match="ds must have shape"):
        S.blelloch_scan_stored_diag(v, A, Wt, ds[:, :1], n)


def test_the_scan_package_is_its_modules_curated_face():
    import bppsa.scan as public
    from bppsa.scan import blocks
    curated = ["SCANS", "scan", "blelloch_scan", "associative_scan", "sequential_scan", "up_sweep", "down_sweep",
               "vecmat", "Products", "DENSE"]
    # the diagonal products of the same sweep and the block scans, from bppsa.scan.blocks
    block_names = ["DIAGONAL", "diagonal_scan", "block_scan"]
    assert sorted(public.__all__) == sorted(curated + block_names + ["dense", "blocks", "layout"])
    for name in curated:
        assert getattr(public, name) is getattr(S, name)
    for name in block_names:
        assert getattr(public, name) is getattr(blocks, name)
    assert not hasattr(public, "to_storage")  # the storage-order machinery stays in bppsa.scan.dense


@pytest.mark.parametrize("method", ["blelloch", "associative", "sequential"])
@pytest.mark.parametrize("n", [1, 6, pytest.param(37, marks=pytest.mark.slow)])  # 6: odd levels and padding too
def test_diagonal_and_block_scans_equal_the_dense_scan_of_diagonal_matrices(method, n):
    """bppsa.scan.diagonal_scan (elementwise, the DIAGONAL products) and block_scan with 1×1 blocks
    give what the dense scan gives for the diagonal matrices diag(a_k), float64."""
    import bppsa.scan as public
    k = jax.random.split(jax.random.key(n), 3)
    R = 5
    a = jax.random.normal(k[0], (n, R), jnp.float64)
    d = jax.random.normal(k[1], (n, R), jnp.float64)
    v = jax.random.normal(k[2], (R,), jnp.float64)
    dense = public.scan(v[None], jax.vmap(jnp.diag)(a)[:, None], d[:, None], method)
    for got in (public.diagonal_scan(v, a, d, method),
                jax.tree.map(lambda x: x[..., 0], public.block_scan(v[:, None], a[..., None, None], d[..., None], method))):
        np.testing.assert_allclose(got[0], dense[0][:, 0], rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(got[1], dense[1][0], rtol=1e-12, atol=1e-12)
