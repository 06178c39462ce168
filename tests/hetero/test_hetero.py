"""Heterogeneity-aware data parallelism: partition, weighted averaging, SPMD gradients."""

from fractions import Fraction

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from bppsa.hetero import (
    data_mesh, make_spmd_grad, partition, plain_mean, replica_batches, sample_weights, weighted_mean,
)
from tests.tolerance import max_tree_diff


# ---------------------------------------------------------------- partition

@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(1e-3, 1e3), min_size=1, max_size=9), st.integers(0, 500))
def test_partition_sums_exactly_and_is_proportional(speeds, B):
    b = partition(speeds, B, min_per_replica=0)
    s = np.asarray(speeds)
    assert b.dtype.kind == "i" and b.shape == (len(speeds),)
    assert b.sum() == B and (b >= 0).all()
    assert np.all(np.abs(b - B * s / s.sum()) < 1)


FINITE_POSITIVE = st.floats(min_value=5e-324, max_value=1.7976931348623157e308, allow_nan=False,
                            allow_infinity=False)  # subnormal to the largest double


@settings(max_examples=300, deadline=None)
@given(st.lists(FINITE_POSITIVE, min_size=1, max_size=8), st.integers(0, 10_000))
def test_partition_any_magnitude_sums_exactly_and_is_proportional(speeds, B):
    """Exact shares (rational arithmetic) for speeds from 5e-324 to 1.8e308, mixed in one list."""
    b = partition(speeds, B, min_per_replica=0)
    assert b.sum() == B and (b >= 0).all()
    total = sum(Fraction(x) for x in speeds)
    for bi, x in zip(b.tolist(), speeds):
        assert abs(bi - B * Fraction(x) / total) < 1, (bi, x, speeds, B)


def test_partition_huge_and_tiny_speeds():
    np.testing.assert_array_equal(partition([1e308, 1e308], 64), [32, 32])  # their sum is inf
    np.testing.assert_array_equal(partition([1.7e308, 1.7e308, 1.7e308, 1.7e308], 10), [3, 3, 2, 2])
    np.testing.assert_array_equal(partition([1e-320, 3e-320], 8), [2, 6])  # subnormal
    np.testing.assert_array_equal(partition([5e-324, 1e308], 7, min_per_replica=0), [0, 7])
    np.testing.assert_array_equal(partition([5e-324, 1e308], 7), [1, 6])  # the default minimum of 1


@pytest.mark.parametrize("B", [2**53 + 1, 2**60 + 1, 2**63 - 1, 2**64 + 7, 10**30 + 3])
def test_partition_sums_exactly_for_huge_batches(B):
    """Integer arithmetic: 2**60 + 1 over three equal replicas used to sum to B - 62 (floats)."""
    b = partition([1, 1, 1], B)
    assert sum(int(x) for x in b) == B and int(b[0]) == -(-B // 3) and int(b[2]) == B // 3  # ties: lowest index
    speeds = (1.0, 2.5, 1e20, 3e-300)
    b = partition(speeds, B, min_per_replica=0)
    total = sum(Fraction(x) for x in speeds)
    assert sum(int(x) for x in b) == B
    assert all(abs(int(bi) - B * Fraction(x) / total) < 1 for bi, x in zip(b, speeds))
    assert b.dtype == (np.int64 if B < 2**63 else object)


def test_partition_examples():
    np.testing.assert_array_equal(partition([1, 1, 2, 4], 64), [8, 8, 16, 32])
    np.testing.assert_array_equal(partition([1, 1, 2, 4], 10), [1, 1, 3, 5])  # 1.25 1.25 2.5 5
    np.testing.assert_array_equal(partition([3.0], 17), [17])                 # one replica
    np.testing.assert_array_equal(partition([1, 2], 0, min_per_replica=0), [0, 0])


def test_partition_ties_go_to_the_lowest_index():
    # quotas 2.5, 2.5, 2.5, 2.5 -> two extra units, to replicas 0 and 1
    np.testing.assert_array_equal(partition([1, 1, 1, 1], 10), [3, 3, 2, 2])
    np.testing.assert_array_equal(partition([1, 1, 1], 2, min_per_replica=0), [1, 1, 0])
    # quotas 0.5, 1, 1, 1.5: one unit left, tied remainders 0.5 of replicas 0 and 3 -> replica 0
    np.testing.assert_array_equal(partition([1, 2, 2, 3], 4), [1, 1, 1, 1])
    # quotas 1.125, 1.875: the larger remainder wins, not the lower index
    np.testing.assert_array_equal(partition([3, 5], 3), [1, 2])


def test_partition_zero_sample_replicas_only_without_a_minimum():
    b = partition([1, 100, 100], 5, min_per_replica=0)
    assert b[0] == 0 and b.sum() == 5
    np.testing.assert_array_equal(partition([1, 100, 100], 5), [1, 2, 2])  # default: nobody starves


def test_partition_minimum_pins_slow_replicas_and_splits_the_rest_proportionally():
    # quotas 0.6, 0.6, 58.8 at speeds 1:1:98 -> the two slow ones pinned at 2, the fast one takes the rest
    np.testing.assert_array_equal(partition([1, 1, 98], 60, min_per_replica=2), [2, 2, 56])
    # pinning one can push another under the minimum: quotas 0.5, 2.5, 97 -> 3 pinned, then 1 more
    np.testing.assert_array_equal(partition([1, 5, 194], 100, min_per_replica=3), [3, 3, 94])
    # every replica exactly at the minimum
    np.testing.assert_array_equal(partition([1, 2, 3], 6, min_per_replica=2), [2, 2, 2])
    # speeds a rounding error apart with B = m·P: no one dips below m
    np.testing.assert_array_equal(partition([1 / 3, 1 / 3, 1 / 3], 3), [1, 1, 1])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(1e-6, 1e6), min_size=1, max_size=9), st.integers(0, 5), st.integers(0, 400))
def test_partition_with_a_minimum_sums_exactly_and_is_monotone(speeds, m, extra):
    B = m * len(speeds) + extra
    b = partition(speeds, B, min_per_replica=m)
    s = np.asarray(speeds)
    assert b.sum() == B and (b >= m).all()
    order = np.argsort(s, kind="stable")
    assert (np.diff(b[order]) >= 0).all() or len(set(s.tolist())) < len(s), (b, s)  # faster never gets fewer
    # the replicas above the minimum share the rest proportionally (each within one unit)
    free = b > m
    if free.any():
        rest = B - m * (~free).sum()
        q = rest * s[free] / s[free].sum()
        assert np.all(np.abs(b[free] - q) < 1 + 1e-9), (b, q)
    if m == 0:
        np.testing.assert_array_equal(b, partition(speeds, B, min_per_replica=0))


def test_partition_rejects_a_batch_too_small_for_the_minimum():
    with pytest.raises(ValueError, match=r"batch_size 2 cannot give each of the 3 replicas min_per_replica = 1"):
        partition([1, 2, 3], 2)
    with pytest.raises(ValueError, match="min_per_replica"):
        partition([1, 2], 8, min_per_replica=-1)


@pytest.mark.parametrize("speeds", [[], [1, 0], [0, 0], [1, -2], [1, np.nan], [np.inf, 1], [[1, 2]],
                                    ["fast", 1], [[1], [1, 2]]])
def test_partition_rejects_bad_speeds(speeds):
    with pytest.raises(ValueError, match="speeds"):
        partition(speeds, 8)


@pytest.mark.parametrize("B", [-1, 2.5, "8", True])
def test_partition_rejects_bad_batch_size(B):
    with pytest.raises(ValueError, match="batch_size"):
        partition([1, 2], B)


# ---------------------------------------------------------------- a small model for gradients

def mlp_params(key, din=5, dh=7, dout=3):
    k1, k2, k3 = jax.random.split(key, 3)
    return {"w1": jax.random.normal(k1, (din, dh)) / np.sqrt(din), "b1": jnp.zeros(dh),
            "w2": jax.random.normal(k2, (dh, dout)) / np.sqrt(dh), "b2": 0.1 * jax.random.normal(k3, (dout,))}


def per_sample_loss(p, x, y):
    logits = jnp.tanh(x @ p["w1"] + p["b1"]) @ p["w2"] + p["b2"]
    return -jnp.take_along_axis(jax.nn.log_softmax(logits), y[:, None], axis=1)[:, 0]


def make_data(B, seed=0, din=5, dout=3):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(B, din)), rng.integers(0, dout, size=B).astype(np.int32)


@jax.jit
def full_grad(params, x, y):
    return jax.grad(lambda p: per_sample_loss(p, x, y).mean())(params)


def replica_grads(params, x, y, counts):
    edges = np.concatenate([[0], np.cumsum(counts)])
    return [full_grad(params, x[a:b], y[a:b]) if b > a else jax.tree.map(jnp.zeros_like, params)
            for a, b in zip(edges[:-1], edges[1:])]


def test_weighted_mean_equals_full_batch_gradient(close):
    params = mlp_params(jax.random.key(0))
    x, y = make_data(13)
    counts = np.array([1, 0, 4, 8])
    grads = replica_grads(params, x, y, counts)
    close(weighted_mean(grads, counts), full_grad(params, x, y), 1e-12, 1e-14)
    assert max_tree_diff(plain_mean(grads, counts), full_grad(params, x, y)) > 1e-3


def test_weighted_mean_rejects_bad_counts():
    g = [{"a": jnp.ones(2)}] * 2
    with pytest.raises(ValueError, match="counts"):
        weighted_mean(g, [1])
    with pytest.raises(ValueError, match="counts"):
        weighted_mean(g, [0, 0])
    with pytest.raises(ValueError, match="counts"):
        weighted_mean(g, [1, -1])
    with pytest.raises(ValueError, match="grads"):
        weighted_mean([], [])


def test_sample_weights_show_the_bias_of_plain_averaging():
    # b = 8, 8, 16, 32 of B = 64: plain averaging gives slow replicas' samples B/(P·b_i) times the weight
    w = sample_weights([8, 8, 16, 32], "mean")
    np.testing.assert_allclose(w * 64, [2, 2, 1, 0.5])
    np.testing.assert_allclose(sample_weights([8, 8, 16, 32], "weighted") * 64, 1)
    np.testing.assert_allclose((w * [8, 8, 16, 32]).sum(), 1)


# ---------------------------------------------------------------- SPMD over 4 simulated devices

_GRAD_FNS = {}


def _spmd_grad(average):
    if average not in _GRAD_FNS:  # built once per session, so the compiled code is reused
        _GRAD_FNS[average] = make_spmd_grad(per_sample_loss, data_mesh(4), average=average)
    return _GRAD_FNS[average]


@pytest.mark.parametrize("counts", [[3, 0, 5, 1], [1, 1, 2, 4], [0, 0, 0, 7], [1, 0, 0, 0], [4, 4, 4, 4]])
def test_spmd_weighted_gradient_equals_full_batch(close, counts):
    assert jax.device_count() >= 4
    params = mlp_params(jax.random.key(1))
    x, y = make_data(int(np.sum(counts)), seed=sum(counts))
    xp, yp, mask = replica_batches(x, y, counts, b_max=8)  # one shape: compile once for all cases
    g, loss, n = _spmd_grad("weighted")(params, xp, yp, mask)
    assert g["w1"].dtype == jnp.float64 and int(n) == sum(counts)
    close(g, full_grad(params, x, y), 1e-12, 1e-14)
    np.testing.assert_allclose(loss, per_sample_loss(params, x, y).mean(), rtol=1e-13)

    g_mean, loss_mean, _ = _spmd_grad("mean")(params, xp, yp, mask)
    close(g_mean, plain_mean(replica_grads(params, x, y, counts), counts), 1e-12, 1e-14)
    np.testing.assert_allclose(loss_mean, loss, rtol=1e-13)
    uneven = len(set(c for c in counts if c > 0)) > 1
    assert (max_tree_diff(g_mean, g) > 1e-4) == uneven  # plain mean is biased exactly when the b_i differ


def test_replica_batches_layout_and_errors():
    x, y = make_data(5)
    xp, yp, mask = replica_batches(x, y, [2, 0, 3])
    assert xp.shape == (9, 5) and mask.tolist() == [1, 1, 0, 0, 0, 0, 1, 1, 1]
    np.testing.assert_array_equal(xp[6:], x[2:])
    with pytest.raises(ValueError, match="counts must sum"):
        replica_batches(x, y, [2, 2])
    with pytest.raises(ValueError, match="counts"):
        replica_batches(x, y, [6, -1])
    with pytest.raises(ValueError, match="b_max"):
        replica_batches(x, y, [2, 3], b_max=2)
    with pytest.raises(ValueError, match="average"):
        make_spmd_grad(per_sample_loss, data_mesh(2), average="median")


def test_partition_takes_numpy_and_jax_integer_batch_sizes():
    """A JAX integer (a 0-d array, e.g. a batch size read from an array's shape arithmetic) or a
    numpy one is the int it equals (jnp.int32(64) was refused); bools and floats are not."""
    want = partition([1.0, 3.0], 64)
    for B in (np.int64(64), jnp.int32(64), jnp.array(64), np.array(64)):
        np.testing.assert_array_equal(partition([1.0, 3.0], B), want)
        np.testing.assert_array_equal(partition([1.0, 3.0], B, min_per_replica=jnp.int32(1)), want)
    for B in (np.bool_(True), jnp.float32(64), jnp.array([64])):
        with pytest.raises(ValueError, match="batch_size must be an int >= 0"):
            partition([1.0, 3.0], B)
