"""Analytic sparse transposed Jacobians against dense autodiff (jax.jacrev) in float64."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from jax import lax
from jax.experimental import sparse as jsparse

from bppsa import sparse
from tests.props import property_pair


def normal(seed, shape):
    """Standard-normal float64 test data from numpy: jax.random compiles once per shape, and the
    cases here have many shapes."""
    return jnp.asarray(np.random.default_rng(seed).normal(size=shape))


def dense_transposed_jacobian(f, x):
    """Jᵀ of f at x from jax.jacrev, as a (x.size, f(x).size) matrix."""
    y = f(x)
    return np.asarray(jax.jacrev(f)(x)).reshape(y.size, x.size).T


def conv(w, stride, padding):
    return lambda x: lax.conv_general_dilated(x, w, (stride, stride), [(padding, padding)] * 2,
                                              dimension_numbers=("NCHW", "OIHW", "NCHW"),
                                              precision="highest")


def maxpool(k):
    return lambda x: lax.reduce_window(x, -jnp.inf, lax.max, (1,) * (x.ndim - 2) + (k, k),
                                       (1,) * (x.ndim - 2) + (k, k), "VALID")


def assert_exact(J, dense):
    assert isinstance(J, jsparse.BCOO)
    assert J.shape == dense.shape
    np.testing.assert_allclose(np.asarray(J.todense()), dense, rtol=0, atol=1e-13)


CONV_CASES = [  # (B, C_in, H, W, C_out, kh, kw, stride, padding); the slow run adds two
    (1, 1, 5, 7, 2, 3, 3, 1, 1),   # non-square input
    pytest.param((1, 3, 6, 6, 4, 3, 3, 2, 1), marks=pytest.mark.slow),   # stride 2 (stride 3 below)
    (2, 2, 6, 5, 3, 3, 2, 2, 0),   # batch, padding 0, non-square kernel
    pytest.param((1, 4, 4, 4, 1, 5, 5, 1, 1), marks=pytest.mark.slow),   # kernel larger than the input
    (1, 2, 7, 5, 3, 1, 1, 1, 0),   # 1x1 conv
    (1, 2, 8, 6, 2, 3, 3, 3, 2),   # stride 3, padding 2
]


@pytest.mark.parametrize("case", CONV_CASES)
def test_conv_matches_jacrev(case):
    B, C, H, W, Co, kh, kw, s, p = case
    x = normal(sum(case), (B, C, H, W))
    w = normal(sum(case) + 1000, (Co, C, kh, kw))
    shape = (C, H, W) if B == 1 else (B, C, H, W)
    J = sparse.conv2d_transposed_jacobian(w, shape, stride=s, padding=p)
    assert_exact(J, dense_transposed_jacobian(conv(w, s, p), x))


def test_conv_rank3_equals_batch_of_one_and_is_jittable():
    w = normal(0, (3, 2, 3, 3))
    J1 = sparse.conv2d_transposed_jacobian(w, (2, 5, 4))
    J2 = jax.jit(sparse.conv2d_transposed_jacobian, static_argnums=(1, 2, 3))(w, (1, 2, 5, 4), 1, 1)
    np.testing.assert_array_equal(np.asarray(J1.todense()), np.asarray(J2.todense()))
    # Taps on the zero padding are not stored.
    assert J1.nse < w.size * 5 * 4


@pytest.mark.parametrize("shape", [(2, 3, 4, 6)] + [pytest.param(s, marks=pytest.mark.slow) for s in ((7,), (2, 3, 5))])
def test_relu_matches_jacrev(shape):
    x = normal(1, shape)
    x = x.at[(0,) * len(shape)].set(0.0)  # the derivative at 0 is 0, as for jax.nn.relu
    assert_exact(sparse.relu_transposed_jacobian(x), dense_transposed_jacobian(jax.nn.relu, x))


@pytest.mark.parametrize("shape,window", [((3, 2, 6, 4), 2), ((1, 6, 9), 3)] + [  # test-all: two more
    pytest.param(s, w, marks=pytest.mark.slow) for s, w in (((2, 4, 6), 2), ((2, 3, 3), 1))])
def test_maxpool_matches_jacrev(shape, window):
    x = normal(2, shape)
    assert_exact(sparse.maxpool2d_transposed_jacobian(x, window),
                 dense_transposed_jacobian(maxpool(window), x))


def test_maxpool_ties_follow_reduce_window():
    # After a ReLU whole windows are 0: the gradient goes to the first element in row-major order.
    x = jax.nn.relu(normal(3, (2, 3, 6, 4)) - 0.8)
    x = x.at[0, 0, 0:2, 0:2].set(1.5)  # a tie between non-zero maxima too
    assert_exact(sparse.maxpool2d_transposed_jacobian(x), dense_transposed_jacobian(maxpool(2), x))


@pytest.mark.parametrize("in_shape", [None, (4,), (3, 4)])
def test_linear_matches_jacrev(in_shape):
    W = normal(4, (5, 4))
    x = normal(5, (4,) if in_shape in (None, (4,)) else in_shape)
    assert_exact(sparse.linear_transposed_jacobian(W, in_shape), dense_transposed_jacobian(lambda x: x @ W.T, x))


def test_flatten_and_block_diag():
    x = normal(6, (2, 3, 4))
    assert_exact(sparse.flatten_transposed_jacobian(x.shape, x.dtype),
                 dense_transposed_jacobian(lambda x: x.reshape(-1), x))
    w = normal(7, (2, 3, 3, 3))
    J1 = sparse.conv2d_transposed_jacobian(w, (3, 4, 5))
    x = normal(8, (3, 3, 4, 5))
    assert_exact(sparse.block_diag(J1, 3), dense_transposed_jacobian(conv(w, 1, 1), x))


@pytest.mark.slow  # a jacrev compile per example; the parametrized cases above run by default
@settings(max_examples=12, deadline=None)
@given(B=st.integers(1, 2), C=st.integers(1, 3), Co=st.integers(1, 3), H=st.integers(2, 7), W=st.integers(2, 7),
       k=st.integers(1, 4), s=st.integers(1, 3), p=st.integers(0, 2), seed=st.integers(0, 2**16))
def test_conv_property(B, C, Co, H, W, k, s, p, seed):
    if k > H + 2 * p or k > W + 2 * p:
        with pytest.raises(ValueError, match="larger than the padded input"):
            sparse.conv2d_transposed_jacobian(jnp.ones((Co, C, k, k)), (B, C, H, W), s, p)
        return
    x = normal(seed, (B, C, H, W))
    w = normal(seed + 2**17, (Co, C, k, k))
    assert_exact(sparse.conv2d_transposed_jacobian(w, x.shape, s, p), dense_transposed_jacobian(conv(w, s, p), x))


@pytest.mark.slow  # a jacrev compile per example; the parametrized cases above run by default
@settings(max_examples=12, deadline=None)
@given(C=st.integers(1, 3), Ho=st.integers(1, 4), Wo=st.integers(1, 4), k=st.integers(1, 3),
       seed=st.integers(0, 2**16), relu_first=st.booleans())
def test_maxpool_property(C, Ho, Wo, k, seed, relu_first):
    x = normal(seed, (C, Ho * k, Wo * k))
    if relu_first:
        x = jax.nn.relu(x)
    assert_exact(sparse.maxpool2d_transposed_jacobian(x, k), dense_transposed_jacobian(maxpool(k), x))


# ------------------------------------------------------------------------------------------
# Bad input.
# ------------------------------------------------------------------------------------------

def test_bad_shapes_raise():
    w = jnp.ones((2, 3, 3, 3))
    with pytest.raises(ValueError, match=r"larger than the padded input"):
        sparse.conv2d_transposed_jacobian(jnp.ones((2, 3, 5, 5)), (3, 2, 2), padding=1)
    with pytest.raises(ValueError, match=r"\(C_out, C_in, kh, kw\).*\(3, 3, 3\)"):
        sparse.conv2d_transposed_jacobian(jnp.ones((3, 3, 3)), (3, 4, 4))
    with pytest.raises(ValueError, match=r"in_shape.*\(4, 4\)"):
        sparse.conv2d_transposed_jacobian(w, (4, 4))
    with pytest.raises(ValueError, match=r"4 channels.*C_in = 3"):
        sparse.conv2d_transposed_jacobian(w, (4, 5, 5))
    with pytest.raises(ValueError, match="stride"):
        sparse.conv2d_transposed_jacobian(w, (3, 5, 5), stride=0)
    with pytest.raises(ValueError, match="padding"):
        sparse.conv2d_transposed_jacobian(w, (3, 5, 5), padding=-1)
    with pytest.raises(ValueError, match=r"window 2 must divide.*\(3, 5, 4\)"):
        sparse.maxpool2d_transposed_jacobian(jnp.ones((3, 5, 4)), 2)
    with pytest.raises(ValueError, match=r"x must be.*\(5, 4\)"):
        sparse.maxpool2d_transposed_jacobian(jnp.ones((5, 4)), 2)
    with pytest.raises(ValueError, match=r"W must have shape \(out, in\).*\(2, 3, 4\)"):
        sparse.linear_transposed_jacobian(jnp.ones((2, 3, 4)))
    with pytest.raises(ValueError, match=r"in_shape.*\(5,\)"):
        sparse.linear_transposed_jacobian(jnp.ones((2, 3)), (5,))
    with pytest.raises(ValueError, match="floating-point"):
        sparse.relu_transposed_jacobian(jnp.ones(3, jnp.int32))
    with pytest.raises(ValueError, match=r"shape \(\)"):
        sparse.relu_transposed_jacobian(jnp.float64(1.0))


# ------------------------------------------------------------------------------------------
# Sparse products and the chain scan.
# ------------------------------------------------------------------------------------------

def random_sparse(rng, m, n, density):
    """A random (m, n) BCOO built from numpy (no per-shape compilation) and its dense twin."""
    dense = rng.normal(size=(m, n)) * (rng.uniform(size=(m, n)) < density)
    rows, cols = np.nonzero(dense)
    indices = jnp.asarray(np.stack([rows, cols], -1).astype(np.int32).reshape(-1, 2))
    return jsparse.BCOO((jnp.asarray(dense[rows, cols]), indices), shape=(m, n)), dense


@property_pair(
    5, 15, m=st.integers(1, 9), k=st.integers(1, 9), n=st.integers(1, 9), density=st.floats(0.0, 1.0),
    seed=st.integers(0, 2**16))
def test_spgemm_and_spmv_property(m, k, n, density, seed):
    rng = np.random.default_rng(seed)
    A, Ad = random_sparse(rng, m, k, density)
    B, Bd = random_sparse(rng, k, n, density)
    C = sparse.spgemm(A, B)
    np.testing.assert_allclose(np.asarray(C.todense()), Ad @ Bd, rtol=1e-13, atol=1e-13)
    assert C.nse <= m * n
    assert sparse.spgemm_flops(A, B) == 2 * int(((Ad != 0).astype(int).T.sum(1) * (Bd != 0).sum(1)).sum())
    x = rng.normal(size=k)
    np.testing.assert_allclose(np.asarray(sparse.spmv(A, jnp.asarray(x))), Ad @ x, rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8, 11])
def test_chain_scan_all_levels(n):
    """Every L_m from 0 (sequential) to beyond full depth gives the dense prefixes."""
    rng = np.random.default_rng(n)
    sizes = [int(s) for s in rng.integers(1, 7, n + 1)]  # S_0 .. S_n
    v = jnp.asarray(rng.normal(size=sizes[n]))
    As, dense = [], []
    for k in range(1, n + 1):  # A_k: (S_{n-k}, S_{n-k+1})
        A, Ad = random_sparse(rng, sizes[n - k], sizes[n - k + 1], 0.6)
        As.append(A)
        dense.append(Ad)
    want, x = [], np.asarray(v)
    for Ad in dense:
        want.append(x)
        x = Ad @ x
    for levels in list(range(sparse.scan_depth(n) + 2)) + [None]:
        prefixes, total = sparse.chain_scan(v, As, levels)
        assert len(prefixes) == n
        for got, ref in zip(prefixes, want):
            np.testing.assert_allclose(np.asarray(got), ref, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(np.asarray(total), x, rtol=1e-12, atol=1e-12)


def test_chain_scan_bad_input():
    A = jsparse.BCOO.fromdense(jnp.ones((3, 4)))
    with pytest.raises(ValueError, match="empty"):
        sparse.chain_scan(jnp.ones(4), [])
    with pytest.raises(ValueError, match=r"As\[1\].*\(S, 3\).*\(2, 4\)"):
        sparse.chain_scan(jnp.ones(4), [A, jsparse.BCOO.fromdense(jnp.ones((2, 4)))])
    with pytest.raises(ValueError, match="L_m"):
        sparse.chain_scan(jnp.ones(4), [A], levels=-1)
    with pytest.raises(ValueError, match="inner sizes"):
        sparse.spgemm(A, A)


def test_weight_grads_match_autodiff():
    for (s, p, kh, kw_) in [(1, 1, 3, 3), (2, 0, 3, 2)]:
        x = normal(9, (2, 3, 7, 6))
        w = normal(10, (4, 3, kh, kw_))
        y, vjp = jax.vjp(lambda w: conv(w, s, p)(x), w)
        g = normal(11, y.shape)
        dw, db = sparse.conv2d_weight_grad(x, g, w.shape, s, p)
        np.testing.assert_allclose(np.asarray(dw), np.asarray(vjp(g)[0]), rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(np.asarray(db), np.asarray(g.sum((0, 2, 3))), rtol=1e-12, atol=1e-12)
    x = normal(12, (3, 5))
    W = normal(13, (2, 5))
    g = normal(14, (3, 2))
    dW, db = sparse.linear_weight_grad(x, g)
    np.testing.assert_allclose(np.asarray(dW), np.asarray(jax.grad(lambda W: jnp.sum((x @ W.T) * g))(W)), rtol=1e-12)


def test_sizes_take_jax_integers():
    """A window or stride given as a JAX integer (a 0-d array) is the int it equals (it was refused
    as 'must be an integer'); floats are not."""
    x = normal(2, (2, 4, 6))
    assert_exact(sparse.maxpool2d_transposed_jacobian(x, jnp.int32(2)), dense_transposed_jacobian(maxpool(2), x))
    with pytest.raises(ValueError, match=r"window must be an integer >= 1; got Array\(2., dtype=float"):
        sparse.maxpool2d_transposed_jacobian(x, jnp.array(2.0))
