"""Heterogeneous data-parallel training: profiling, sampling, re-balancing, the three strategies."""

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from bppsa.hetero import partition
from bppsa.experiments.hetero_dp import summarize
from bppsa.hetero.profile import (Rebalancer, TimeModel, balanced_speeds, fit_time_model, profile_replica,
                                  slowdowns_from_mix)
from bppsa.hetero.tasks import nnx_task
from bppsa.hetero.train import STRATEGIES, ShardSampler, SimulatedReplicas, train


def test_fit_time_model_recovers_an_affine_model():
    b = np.array([4, 16, 64])
    m = fit_time_model(b, 2e-3 + 5e-5 * b)
    np.testing.assert_allclose([m.alpha, m.beta], [2e-3, 5e-5], rtol=1e-9)
    assert m.time(0) == 0 and np.isclose(m.speed(16), 16 / (2e-3 + 16 * 5e-5))
    m1 = fit_time_model([10], [0.5])  # one probe size: pure throughput
    assert m1.alpha == 0 and np.isclose(m1.beta, 0.05)
    m2 = fit_time_model([1, 2, 3], [3.0, 2.0, 1.0])  # decreasing (noise): still a positive per-sample cost
    assert m2.beta > 0 and m2.alpha >= 0
    with pytest.raises(ValueError, match="batch_sizes"):
        fit_time_model([1, 2], [1.0])
    with pytest.raises(ValueError, match="> 0"):
        fit_time_model([0, 2], [1.0, 1.0])
    with pytest.raises(ValueError, match="probe_batches"):
        profile_replica(lambda b: 1.0, [])


def test_profile_replica_times_each_probe():
    seen = []
    m = profile_replica(lambda b: seen.append(b) or 1e-3 * b, [2, 8], repeats=3)
    assert seen == [2, 2, 2, 8, 8, 8] and np.isclose(m.beta, 1e-3) and np.isclose(m.alpha, 0, atol=1e-12)


def test_balanced_speeds_equalise_step_times():
    # proportional replicas: speeds are the throughput ratios and the split is exact
    models = [TimeModel(0, 4.0), TimeModel(0, 4.0), TimeModel(0, 2.0), TimeModel(0, 1.0)]
    np.testing.assert_array_equal(partition(balanced_speeds(models, 64), 64), [8, 8, 16, 32])
    # a fixed cost per step: slow replicas get fewer samples than their throughput ratio says
    models = [TimeModel(4.0, 0.4), TimeModel(1.0, 0.1)]
    b = partition(balanced_speeds(models, 40), 40)
    naive = partition([m.speed(20) for m in models], 40)
    t = lambda bb: max(float(m.time(x)) for m, x in zip(models, bb))  # noqa: E731
    assert t(b) <= t(naive) and t(b) < t([20, 20])


def test_rebalancer_logs_the_switch():
    r = Rebalancer(np.array([1.0, 1.0]), every=2)
    counts = partition(r.speeds, 12)
    r.observe(counts, [6 * 1.0, 6 * 3.0])  # replica 1 became 3x slower
    assert r.maybe_repartition(1, 12, counts) is None  # not a multiple of `every`
    r.observe(counts, [6 * 1.0, 6 * 3.0])
    new = r.maybe_repartition(2, 12, counts)
    np.testing.assert_array_equal(new, [9, 3])
    assert r.log == [{"step": 2, "from": [6, 6], "to": [9, 3], "speeds": [1.0, 1 / 3]}]
    r.observe(new, [9.0, 9.0])
    r.observe(new, [9.0, 9.0])
    assert r.maybe_repartition(4, 12, new) is None and len(r.log) == 1  # balanced: no switch
    # timing noise: a 2 % gain is below the 5 % tolerance, so the partition stays
    r = Rebalancer(np.array([1.0, 1.0]), every=1)
    r.observe([50, 50], [50.0, 51.0])
    assert r.maybe_repartition(1, 100, np.array([50, 50])) is None and not r.log


@pytest.mark.parametrize("placement", ["iid", "label"])
def test_shard_sampler_epoch_covers_every_sample(placement):
    y = np.repeat(np.arange(4), 10)
    s = ShardSampler(y, [1, 1, 2, 4], placement, seed=0)
    assert [len(sh) for sh in s.shards] == [5, 5, 10, 20]
    seen = np.concatenate([np.concatenate(s.next()) for _ in range(5)])  # 5 steps of B = 8 = one epoch
    np.testing.assert_array_equal(np.sort(seen), np.arange(40))
    if placement == "label":  # shards are cut from label-sorted data
        assert set(y[s.shards[3]]) == {2, 3} and set(y[s.shards[0]]) == {0}
    s.set_counts([0, 0, 3, 5])
    idx = s.next()
    assert [len(i) for i in idx] == [0, 0, 3, 5]
    with pytest.raises(ValueError, match="placement"):
        ShardSampler(y, [1, 1], "random")


def test_slowdowns_from_mix():
    assert slowdowns_from_mix([1, 1, 2, 4]) == [4, 4, 2, 1]
    with pytest.raises(ValueError, match="mix"):
        slowdowns_from_mix([1, 0])


# ---------------------------------------------------------------- short training runs

class _MLP(nnx.Module):
    def __init__(self, rngs):
        self.l1 = nnx.Linear(6, 16, rngs=rngs)
        self.l2 = nnx.Linear(16, 3, rngs=rngs)

    def __call__(self, x):
        return self.l2(jnp.tanh(self.l1(x)))


def _toy_task():
    rng = np.random.default_rng(0)
    centers = rng.normal(size=(3, 6)) * 2
    y = rng.integers(0, 3, size=320).astype(np.int32)
    x = (centers[y] + rng.normal(size=(320, 6))).astype(np.float32)
    return nnx_task("toy", x[:256], y[:256], x[256:], y[256:], _MLP)


@pytest.fixture(scope="module")
def toy():
    task = _toy_task()
    return task, task.per_sample_loss


def test_training_with_each_strategy(toy):
    task, loss_fn = toy
    base = TimeModel(0.0, 1e-4)
    replicas = SimulatedReplicas(loss_fn, slowdowns_from_mix([1, 1, 2, 4]), base, jitter=0.0)
    runs = {}
    for strategy in STRATEGIES:
        r = train(task, replicas, strategy=strategy, batch_size=32, epochs=2, learning_rate=3e-2, seed=0,
                  probe_batches=(4, 16))
        runs[strategy] = r
        assert len(r["history"]) == 3 and r["history"][-1]["loss"] < r["history"][1]["loss"] * 1.5
        assert r["final_accuracy"] > 0.8  # well-separated clusters: every strategy learns them
        assert r["history"][0]["time"] == 0 and r["history"][-1]["time"] > 0
    assert runs["uniform"]["initial_partition"] == [8, 8, 8, 8]
    # profiling finds the 1:1:2:4 speeds (no jitter, proportional time model) -> b = 4, 4, 8, 16
    assert runs["proportional-weighted"]["initial_partition"] == [4, 4, 8, 16]
    # modelled clock: uniform waits for 4·8 units per step, proportional for 4·4 units: exactly 2x
    np.testing.assert_allclose(runs["uniform"]["time_per_epoch"], 2 * runs["proportional-mean"]["time_per_epoch"])
    np.testing.assert_allclose(runs["proportional-mean"]["time_per_epoch"],
                               runs["proportional-weighted"]["time_per_epoch"])
    rows = summarize([dict(r, task="toy", scenario="s") for r in runs.values()])
    assert {r["strategy"]: round(r["speedup_vs_uniform"], 6) for r in rows}["proportional-weighted"] == 2.0


def test_training_rebalances_when_speeds_drift(toy):
    task, loss_fn = toy
    # replica 3 is fast for 4 steps, then as slow as replica 0
    schedule = [(0, [4, 4, 2, 1]), (4, [4, 4, 2, 4])]
    replicas = SimulatedReplicas(loss_fn, schedule, TimeModel(0.0, 1e-4), jitter=0.0)
    logs = []
    r = train(task, replicas, strategy="proportional-weighted", batch_size=32, epochs=2, speeds=[1, 1, 2, 4],
              rebalance_every=4, log=logs.append)
    assert r["initial_partition"] == [4, 4, 8, 16]
    # steps 0-3 run at the old speeds; the window of steps 4-7 sees the drift and re-partitions at step 8
    expected = partition([1, 1, 2, 1], 32).tolist()
    assert expected == [7, 6, 13, 6]
    assert r["repartitions"] == [{"step": 8, "from": [4, 4, 8, 16], "to": expected,
                                  "speeds": [2500.0, 2500.0, 5000.0, 2500.0]}]
    assert r["final_partition"] == expected
    assert any("re-partition" in line for line in logs)
    with pytest.raises(ValueError, match="strategy"):
        train(task, replicas, strategy="fastest", batch_size=32, epochs=1)
    with pytest.raises(ValueError, match="speeds"):
        train(task, replicas, strategy="proportional-mean", batch_size=32, epochs=1, speeds=[1, 2])
