"""Heterogeneous data-parallel training: profiling, sampling, re-balancing, the three strategies."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from bppsa.hetero import partition
from experiments.paper_hetero.hetero_dp import summarize
from bppsa.hetero.profile import (
    Rebalancer, TimeModel, balanced_speeds, bound_speeds, fit_time_model, nominal_speeds, profile_replica,
    robust_median, slowdowns_from_mix,
)
from bppsa.hetero.train import STRATEGIES, ShardSampler, SimulatedReplicas, train
from bppsa.tasks import nnx_task


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
    assert r.maybe_repartition(1, 12, counts) is None  # fewer than `every` steps observed
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


def test_rebalancer_ignores_one_slow_step_and_sees_a_drift_within_its_window():
    r = Rebalancer(np.array([1.0, 1.0]), every=5)
    counts = np.array([6, 6])
    times = [[6.0, 6.0]] * 4 + [[6.0, 60.0]] + [[6.0, 6.0]] * 5  # one hiccup: replica 1 10x slow once
    for step, t in enumerate(times, 1):
        r.observe(counts, t)
        assert r.maybe_repartition(step, 12, counts) is None
    for step in range(11, 16):  # replica 1 now 3x slower for good: seen once 3 of the 5 steps show it
        r.observe(counts, [6.0, 18.0])
        new = r.maybe_repartition(step, 12, counts)
        if new is not None:
            break
    assert step == 13 and new.tolist() == [9, 3] and r.log[0]["step"] == 13
    # a fresh window after the switch: no decision until `every` new steps
    r.observe(new, [9.0, 9.0])
    assert r.maybe_repartition(14, 12, new) is None
    # every replica keeps at least min_per_replica samples, however slow it looks
    r = Rebalancer(np.array([1.0, 1.0, 1.0]), every=1, min_per_replica=2)
    r.observe([4, 4, 4], [4.0, 4.0, 400.0])
    assert r.maybe_repartition(1, 12, np.array([4, 4, 4])).tolist() == [5, 5, 2]


def test_robust_median_drops_outliers_and_reports_the_spread():
    st = robust_median([1.0, 1.1, 0.9, 1.0, 9.0])
    assert st["median"] == 1.0 and st["rejected"] == 1 and st["kept"] == 4
    assert 0 < st["spread"] < 0.2
    assert robust_median([2.0, 2.0, 2.0])["spread"] == 0 and robust_median([3.0])["median"] == 3.0
    with pytest.raises(ValueError, match="samples"):
        robust_median([])
    with pytest.raises(ValueError, match="samples"):
        robust_median([1.0, np.nan])


def test_nominal_speeds_and_the_sanity_bound():
    models = [TimeModel(1e-3, 4e-3), TimeModel(1e-3, 1e-3)]  # at B/P = 8: 33 ms and 9 ms
    np.testing.assert_allclose(nominal_speeds(models, 16), [8 / 33e-3, 8 / 9e-3])
    s, clipped = bound_speeds([1.0, 1.2, 0.9, 100.0], max_ratio=8)
    assert clipped == [3] and s[3] == pytest.approx(8 * 1.1) and s[:3].tolist() == [1.0, 1.2, 0.9]
    assert bound_speeds([1.0, 2.0, 4.0])[1] == []
    with pytest.raises(ValueError, match="speeds"):
        bound_speeds([1.0, 0.0])
    with pytest.raises(ValueError, match="max_ratio"):
        bound_speeds([1.0], max_ratio=0.5)


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


@pytest.fixture(scope="module")
def toy():
    rng = np.random.default_rng(0)
    centers = rng.normal(size=(3, 6)) * 2
    y = rng.integers(0, 3, size=320).astype(np.int32)
    x = (centers[y] + rng.normal(size=(320, 6))).astype(np.float32)
    task = nnx_task("toy", x[:256], y[:256], x[256:], y[256:], _MLP)
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
    # steps 0-3 run at the old speeds; after steps 4 and 5 the drift covers half of the 4-step window
    # (steps 2-5), its upper median flips, and the re-partition comes at step 6: within K = 4 steps
    expected = partition([1, 1, 2, 1], 32).tolist()
    assert expected == [7, 6, 13, 6]
    assert r["repartitions"] == [{"step": 6, "from": [4, 4, 8, 16], "to": expected,
                                  "speeds": [2500.0, 2500.0, 5000.0, 2500.0]}]
    assert r["final_partition"] == expected
    assert any("re-partition" in line for line in logs)
    assert len(r["step_times"]) == 2 * 8 and np.isclose(sum(r["step_times"]), r["history"][-1]["time"])
    # the modelled clock recovers: before the drift replica 3 set the pace at 16 units, after the switch 28
    # units (7 samples at f = 4) instead of the 64 (16 at f = 4) it would take without re-balancing
    np.testing.assert_allclose(r["step_times"][-1], 28e-4)
    np.testing.assert_allclose(r["step_times"][:4], 16e-4)
    with pytest.raises(ValueError, match="strategy"):
        train(task, replicas, strategy="fastest", batch_size=32, epochs=1)
    with pytest.raises(ValueError, match="speeds"):
        train(task, replicas, strategy="proportional-mean", batch_size=32, epochs=1, speeds=[1, 2])


def test_tables_say_which_times_are_measured_and_which_are_modelled():
    from experiments.paper_hetero.hetero_dp import drift_summary, markdown

    def run(strategy, tpe, model=None, **kw):
        r = {"task": "gru", "scenario": "1:3, label, real processes", "strategy": strategy, "final_accuracy": 0.5,
             "time_per_epoch": tpe, "initial_partition": [8, 8] if strategy == "uniform" else [4, 12]}
        if model is not None:
            r["time_per_epoch_model"] = model
        return {**r, **kw}

    real = summarize([run("uniform", 2.0, 1.9), run("proportional-weighted", 1.0, 1.1),
                      run("proportional-weighted", 1.2, 1.1)])
    w = {r["strategy"]: r for r in real}["proportional-weighted"]
    assert w["seeds"] == 2 and np.isclose(w["time_per_epoch_mean"], 1.1) and np.isclose(w["model_error"], 0.0)
    assert np.isclose(w["speedup_vs_uniform"], 2.0 / 1.1) and w["min_samples"] == 4
    sim = summarize([dict(run("proportional-mean", 0.5), scenario="1:3, label")])  # no uniform: no speed-up
    assert sim[0]["speedup_vs_uniform"] is None and "model_error" not in sim[0]
    drift = {"strategy": "proportional-weighted", "epochs": 2, "initial_partition": [4, 12], "final_partition": [8, 8],
             "final_accuracy": 0.5, "drift": {"replica": 1, "factor": 3.0, "at_step": 4}, "rebalance_every": 2,
             "step_times": [1.0] * 4 + [3.0, 3.0, 2.0, 2.0], "repartitions": [{"step": 6, "from": [4, 12], "to": [8, 8]}],
             "history": [{"time": 0.0}, {"time": 4.0}, {"time": 14.0}]}
    d = drift_summary([drift])[0]
    assert d["step_s_before"] == 1.0 and d["step_s_last_epoch"] == 2.5 and d["epoch_times"] == [4.0, 10.0]
    md = markdown(sim, real, title="t", drift_rows=[d], process_info={"tau_s": 4e-3})
    assert md.index("Real replica processes") < md.index("Drift on real processes") < md.index("Simulated replicas")
    assert "time / epoch (s), measured | time / epoch (s), time model | model error" in md
    assert "| 1.100 | 1.100 | +0.0 % | 1.82× |" in md and "τ = 4.000 ms" in md
    assert "| every 2 steps | 1000.0 | 2500.0 | 4.00, 10.00 | 6: [4, 12] → [8, 8] | 0.5000 |" in md
    assert "speed-up vs uniform, time model |" in md and "| - |" in md  # the simulated row without uniform


def test_replicas_programs_do_not_outlive_what_their_loss_closes_over(toy):
    """A loss reading an array it closes over, rebound between two SimulatedReplicas: each gets the
    gradient of its own array (a module-level cache keyed on the loss kept the first one's)."""
    task, per_sample = toy
    box = {"scale": jnp.asarray(1.0)}
    loss_fn = lambda p, x, y: box["scale"] * per_sample(p, x, y)  # noqa: E731
    params = task.init(jax.random.key(0))
    x, y = jnp.asarray(task.x_train[:8]), jnp.asarray(task.y_train[:8])
    mask = jnp.ones((8,), bool)
    grads = []
    for scale in (1.0, 3.0):
        box["scale"] = jnp.asarray(scale)
        replicas = SimulatedReplicas(loss_fn, [1, 1], TimeModel(0.0, 1e-4), jitter=0.0)
        grads.append(replicas.grad_fns["weighted"](params, x, y, mask)[0])
    for a, b in zip(jax.tree.leaves(grads[0]), jax.tree.leaves(grads[1])):
        np.testing.assert_allclose(3.0 * np.asarray(a), b, rtol=1e-5, atol=1e-6)
