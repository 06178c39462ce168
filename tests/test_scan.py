"""The three scans agree on random affine elements (float64), for any length."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from bppsa import scan as S

jax.config.update("jax_enable_x64", True)

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
@pytest.mark.parametrize("n", [1, 2, 3, 4, 7, 9, 16, 33, 100])
@pytest.mark.parametrize("with_d", [False, True])
def test_scan_matches_python_loop(method, n, with_d):
    rng = np.random.default_rng(n)
    v, Ms, ds = _elements(rng, n, 2, 3, with_d)
    prefixes, total = _scan(v, Ms, ds, method=method)
    ref_p, ref_t = _reference(v, Ms, ds)
    assert prefixes.shape == (n, 2, 3) and total.shape == (2, 3)
    np.testing.assert_allclose(prefixes, ref_p, rtol=1e-11, atol=1e-12)
    np.testing.assert_allclose(total, ref_t, rtol=1e-11, atol=1e-12)


@settings(max_examples=15, deadline=None)
@given(n=st.integers(1, 40), B=st.integers(1, 3), H=st.integers(1, 5), with_d=st.booleans(),
       seed=st.integers(0, 2**31 - 1))
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


def test_float32_stays_float32():
    v, Ms, ds = _elements(np.random.default_rng(2), 9, 2, 3, True)
    p, t = S.blelloch_scan(v.astype(jnp.float32), Ms.astype(jnp.float32), ds.astype(jnp.float32))
    assert p.dtype == jnp.float32 and t.dtype == jnp.float32


def test_jit_and_vmap_compose():
    rng = np.random.default_rng(3)
    problems = [_elements(rng, 11, 2, 3, True) for _ in range(3)]
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
