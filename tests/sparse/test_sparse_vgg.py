"""BPPSA over VGG-style chains with sparse transposed Jacobians, against autodiff (float64)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bppsa import sparse
from bppsa.sparse import vgg

SMALL = (3, "M", 4, "M")  # conv-relu-pool-conv-relu-pool


def small_net(seed=0, in_shape=(2, 8, 12), hidden=(5,), cfg=SMALL, B=3):
    layers, params = vgg.make_vgg(jax.random.key(seed), cfg, in_shape, hidden=hidden, num_classes=4,
                                  dtype=jnp.float64)
    x = jax.random.normal(jax.random.key(seed + 1), (B,) + in_shape)
    y = jnp.arange(B) % 4
    return layers, params, x, y


def autodiff(layers, params, x, y):
    ref_value, ref = jax.value_and_grad(lambda p: vgg.loss(layers, p, x, y))(params)
    return ref_value, ref, jax.grad(lambda x: vgg.loss(layers, params, x, y))(x)


def assert_grads_equal(layers, params, x, y, levels, reference=None):
    value, grads, dx = vgg.bppsa_value_and_grad(layers, params, x, y, levels)
    ref_value, ref, ref_dx = reference or autodiff(layers, params, x, y)
    np.testing.assert_allclose(float(value), float(ref_value), rtol=1e-13)
    assert jax.tree.structure(grads) == jax.tree.structure(ref)
    for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(ref)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-10, atol=1e-13)
    np.testing.assert_allclose(np.asarray(dx), np.asarray(ref_dx), rtol=1e-10, atol=1e-13)
    return grads


@pytest.mark.parametrize("every", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_every_L_m_equals_autodiff(every):
    """L_m = 0 (plain BP) through beyond full depth: all equal autodiff, on a non-square input
    (the default run: plain BP, a partial scan and the full one; the slow run: every L_m)."""
    layers, params, x, y = small_net()
    depth = sparse.scan_depth(len(layers))
    assert depth == 4  # 10 layers -> 11 blocks
    reference = autodiff(layers, params, x, y)
    for levels in (list(range(depth + 2)) + [None] if every else [0, 2, None]):
        assert_grads_equal(layers, params, x, y, levels, reference)


@pytest.mark.slow  # ~10 s; the default run prunes (test_magnitude_prune_and_bad_input) and checks every level
@pytest.mark.parametrize("B", [1, 2])
def test_pruned_network_batch_sizes(B):
    """Pruned weights (stored zeros dropped), one sample (two in the slow run), no hidden layer."""
    layers, params, x, y = small_net(seed=3, in_shape=(1, 8, 4), hidden=(), B=B)
    pruned, masks = vgg.magnitude_prune(params, 0.6)
    grads = assert_grads_equal(layers, pruned, x, y, None)
    # The pruned Jacobians really are sparser.
    hs = vgg.forward(layers, pruned, x)
    dense_nnz = sum(J.nse for J in vgg.transposed_jacobians(layers, pruned, hs, drop_zeros=False))
    sparse_nnz = sum(J.nse for J in vgg.transposed_jacobians(layers, pruned, hs))
    assert sparse_nnz < dense_nnz
    assert all(jnp.all(m["w"] * 0 == 0) for m in masks if m)
    assert len(grads) == len(layers)


@pytest.mark.slow  # strided convolutions' Jacobians: tests/sparse/test_sparse.py's CONV_CASES in the default run
def test_strided_conv_chain():
    """A chain with a stride-2, padding-0 conv (built by hand) also matches autodiff."""
    layers = (vgg.Layer("conv", stride=2, padding=0), vgg.Layer("relu"), vgg.Layer("conv", padding=1),
              vgg.Layer("maxpool"), vgg.Layer("flatten"), vgg.Layer("linear"))
    k = jax.random.split(jax.random.key(5), 4)
    params = [{"w": jax.random.normal(k[0], (3, 2, 3, 3)), "b": jax.random.normal(k[1], (3,))}, {},
              {"w": jax.random.normal(k[2], (2, 3, 3, 3)), "b": jnp.zeros(2)}, {}, {},
              {"w": jax.random.normal(k[3], (4, 2 * 2 * 3)), "b": jnp.zeros(4)}]
    x = jax.random.normal(jax.random.key(6), (2, 2, 9, 13))  # conv -> (4, 6), pool -> (2, 3)
    y = jnp.array([1, 3])
    reference = autodiff(layers, params, x, y)
    for levels in (0, 2, None):
        assert_grads_equal(layers, params, x, y, levels, reference)


def test_flop_analysis_consistent():
    layers, params, x, y = small_net(B=1)
    pruned, _ = vgg.magnitude_prune(params, 0.5)
    Js = vgg.transposed_jacobians(layers, pruned, vgg.forward(layers, pruned, x))
    seq = vgg.flop_analysis(Js, 0)
    assert seq["bp_flops"] == 2 * sum(J.nse for J in Js)
    assert seq["bppsa_flops"] == seq["bp_flops"] == seq["bppsa_critical"]  # L_m = 0 is plain BP
    full = vgg.flop_analysis(Js)
    assert full["levels"] == sparse.scan_depth(len(Js))
    assert full["bppsa_critical"] <= full["bppsa_flops"]
    # The up-sweep's SpGEMM FLOPs, recomputed with the BCOO products.
    up1 = next(r for r in full["records"] if r["phase"] == "up" and r["level"] == 1)
    As = Js[::-1]
    pairs = [sparse.spgemm_flops(As[j + 1], As[j]) for j in range(1, len(As) - 1, 2)]
    assert up1["flops"] == 2 * As[0].nse + sum(pairs)


def test_magnitude_prune_and_bad_input():
    layers, params, _, _ = small_net()
    pruned, masks = vgg.magnitude_prune(params, 0.75)
    for p, q, m in zip(params, pruned, masks):
        if p:
            kept = int(m["w"].sum())
            assert kept == p["w"].size - round(0.75 * p["w"].size)
            assert float(jnp.abs(q["w"]).min()) == 0.0 or kept == p["w"].size
            # kept weights are the largest in magnitude
            assert float(jnp.abs(p["w"])[m["w"] == 1].min()) >= float(jnp.abs(p["w"])[m["w"] == 0].max())
    with pytest.raises(ValueError, match="sparsity"):
        vgg.magnitude_prune(params, 1.0)
    with pytest.raises(ValueError, match="even spatial sizes"):
        vgg.make_vgg(jax.random.key(0), (2, "M"), (1, 5, 4))
    with pytest.raises(ValueError, match="kind"):
        vgg.Layer("dropout")


def test_digits_data():
    from bppsa.tasks.digits import load_digits
    xtr, ytr, xte, yte = load_digits(size=16)
    assert xtr.shape[1:] == (16, 16) and len(xtr) + len(xte) == 1797
    assert xtr.dtype == np.float32 and 0.0 <= xtr.min() and xtr.max() <= 1.0
    assert set(np.unique(ytr)) == set(range(10))
