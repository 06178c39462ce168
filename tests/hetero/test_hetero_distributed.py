"""Heterogeneous data parallelism on 2 real processes (`bppsa launch`'s launcher: jax.distributed on
127.0.0.1, gloo): the weighted SPMD gradient, and training with profiling, the proportional split and
re-balancing under drift.

The default run asserts the mechanism (exact gradients, the split of the profiled speeds, the time
model against the recorded step times, the re-partition after a drift); the speed figures
(wall-clock ratios between processes sharing the host's cores) are in the slow run and the
hetero_dp experiment.
"""

import io
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

from bppsa.hetero import plain_mean
from bppsa.parallel.launch import launch
from tests.hetero.test_hetero import make_data, full_grad, mlp_params, replica_grads

WORKER = str(Path(__file__).with_name("hetero_worker.py"))


CASES = [[5, 0], [2, 5]]  # uneven local batches, one of them empty; one padded shape (5) for both cases


def _launch(argv, n, timeout):
    """Run ``python *argv`` as n processes of one job (one CPU device each); assert they all succeed."""
    out, err = io.StringIO(), io.StringIO()
    rc = launch([sys.executable, *argv], n, devices_per_process=1, timeout=timeout, out=out, err=err)
    assert rc == 0, f"launch failed ({rc}):\n{err.getvalue()}\n{out.getvalue()[-3000:]}"


@pytest.mark.slow  # ~11 s; the default run: the same weighting in one process (tests/hetero/test_hetero.py) and
@pytest.mark.timeout(240)  # real processes under drift (below)
def test_weighted_gradient_across_two_processes(tmp_path):
    seed = 3
    _launch([WORKER, str(tmp_path), str(seed), ";".join(",".join(map(str, c)) for c in CASES)], 2, timeout=180)
    params = mlp_params(jax.random.key(seed))
    for case, counts in enumerate(CASES):
        x, y = make_data(sum(counts), seed=seed)
        full = full_grad(params, x, y)
        plain = plain_mean(replica_grads(params, x, y, np.array(counts)), counts)
        for pid in range(2):
            got = np.load(tmp_path / f"grads_{case}_{pid}.npz")
            assert int(got["weighted/count"]) == sum(counts)
            np.testing.assert_allclose(got["weighted/loss"], got["mean/loss"], rtol=1e-13)
            for k in params:
                assert got[f"weighted/{k}"].dtype == np.float64
                np.testing.assert_allclose(got[f"weighted/{k}"], full[k], rtol=1e-12, atol=1e-14)
                np.testing.assert_allclose(got[f"mean/{k}"], plain[k], rtol=1e-12, atol=1e-14)
            # with both replicas holding samples, the plain mean is a different (biased) gradient
            diff = max(np.abs(got[f"mean/{k}"] - full[k]).max() for k in params)
            assert (diff > 1e-4) == (min(counts) > 0)


def _train_real(tmp_path, spec, n, timeout):
    import json

    (tmp_path / "spec.json").write_text(json.dumps(spec))
    _launch(["-m", "bppsa.hetero.worker", str(tmp_path / "spec.json")], n, timeout=timeout)
    return json.loads((tmp_path / "runs.json").read_text())


def _drift_spec(tau, num_samples, backward):
    """2 replica processes at speeds 1:3 (sleep emulation, τ seconds per sample), the GRU classifier
    (``backward``), uniform and proportional-weighted; then the fast replica becomes 5× slower halfway,
    with re-balancing every 3 steps and without."""
    return {"task": "gru", "task_config": {"data": "bitstream", "num_samples": num_samples, "length": 8,
                                           "hidden_size": 8, "num_classes": 4, "backward": backward,
                                           "batch_size": 16, "learning_rate": 1e-2},
            "mix": [1, 3], "strategies": ["uniform", "proportional-weighted"], "seeds": [0], "epochs": 2,
            "placement": "label", "probe_batches": [4, 8, 12], "profile_repeats": 3, "tau": tau,
            "drift": {"replica": 1, "factor": 5.0, "at": 0.5, "rebalance_every": 3, "tolerance": 0.25,
                      "strategy": "proportional-weighted", "seed": 0}}


def _check_mechanism(out, spec):
    """What the real-process run must show whatever the load on the host: the profile, the split it
    gives, the bookkeeping of the recorded step times, the time model against them, the re-partition."""
    from bppsa.hetero import partition

    tau, B = spec["tau"], spec["task_config"]["batch_size"]
    assert out["calibration"]["tau_s"] == tau and out["calibration"]["allreduce_s"] > 0
    # the profile: each replica's step is its compute plus a sleep of τ·f_i·b (f = 3 for the slow
    # replica 0, 1 for replica 1), so every timing is at least that sleep, however busy the host
    slowdowns = (3.0, 1.0)
    assert [p["probe_batches"] for p in out["profile"]] == [spec["probe_batches"]] * 2
    for p, f in zip(out["profile"], slowdowns):
        assert all(t >= tau * f * b for t, b in zip(p["median_s"], p["probe_batches"])), (p, f)
    # the split is the partition of the profiled speeds
    runs = {r["strategy"]: r for r in out["runs"]}
    assert runs["uniform"]["initial_partition"] == [8, 8]
    b = runs["proportional-weighted"]["initial_partition"]
    assert b == partition(out["speeds"], B).tolist() and sum(b) == B and 1 <= b[0] < b[1], b
    steps = (spec["task_config"]["num_samples"] - round(0.2 * spec["task_config"]["num_samples"])) // B
    for r in runs.values():
        assert len(r["step_times"]) == steps * spec["epochs"] and len(r["history"]) == spec["epochs"] + 1
        np.testing.assert_allclose(r["time_per_epoch"], sum(r["step_times"]) / spec["epochs"], rtol=1e-9)
        # the time model (the profile's t_i(b_i), slowest replica, plus the all-reduce) against the
        # recorded step times: the sleeps dominate both, so it is close however busy the host is
        models = [(p["alpha_s"], p["beta_s"]) for p in out["profile"]]
        predicted = max(a + be * n for (a, be), n in zip(models, r["initial_partition"]) if n) \
            + out["calibration"]["allreduce_s"]
        np.testing.assert_allclose(r["time_per_epoch_model"], steps * predicted, rtol=1e-9)
        assert abs(predicted / np.median(r["step_times"]) - 1) < 0.5, (predicted, r["step_times"])
        # the step times are process 0's (replica 0's) clock: each step lasted at least its own sleep
        assert min(r["step_times"]) >= tau * slowdowns[0] * r["initial_partition"][0]
    # drift: the re-partition comes within two windows (of 3 steps) after it and gives the slowed
    # replica less. The drift (speeds 1:3 -> 1:0.6) makes the split a 4:12 or 5:11 partition had
    # about 2x too slow, far beyond the 25 % hysteresis that keeps timing noise from re-partitioning
    # (at 3x, a 27-33 % gain, a busy host's noise hid it for several steps); the second window
    # leaves room for a noisy first one
    on, off = out["drift_runs"]
    at, every = on["drift"]["at_step"], on["rebalance_every"]
    assert every == 3 and off["rebalance_every"] == 0 and not off["repartitions"]
    switch = next((x for x in on["repartitions"] if x["step"] > at), None)
    assert switch and switch["step"] <= at + 2 * every and switch["to"][1] < switch["from"][1], \
        (at, on["repartitions"])
    assert on["final_partition"] == on["repartitions"][-1]["to"]
    return runs, on, off


@pytest.mark.timeout(300)
def test_real_processes_profile_split_and_rebalance_under_drift(tmp_path):
    """The mechanism on real processes (no speed figures: those are the benchmarks'). BPTT: it compiles
    faster than BPPSA, and each process compiles one step per batch size."""
    spec = _drift_spec(tau=3e-3, num_samples=160, backward="bptt")
    _check_mechanism(_train_real(tmp_path, spec, 2, timeout=280), spec)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_real_processes_show_the_configured_speeds(tmp_path):
    """The same at τ = 4 ms per sample, with the speed figures: profiling finds the 1:3, the proportional
    split halves the epoch, the time model predicts it within 25 %, re-balancing pays after the drift.
    Wall-clock ratios between processes sharing the host's cores: a benchmark, so in the slow run only."""
    spec = _drift_spec(tau=4e-3, num_samples=240, backward="bppsa")
    out = _train_real(tmp_path, spec, 2, timeout=280)
    runs, on, off = _check_mechanism(out, spec)
    s = np.asarray(out["speeds"])
    assert 2.2 < s[1] / s[0] < 3.5, s  # profiled one at a time: close to the configured 1:3
    speedup = runs["uniform"]["time_per_epoch"] / runs["proportional-weighted"]["time_per_epoch"]
    assert speedup > 1.4, speedup  # ideal 2: 8·3 sleep units per step against 4·3
    for r in runs.values():
        assert abs(r["time_per_epoch_model"] / r["time_per_epoch"] - 1) < 0.25, r
    # after the switch the step is faster than without re-balancing
    assert np.median(on["step_times"][-4:]) < 0.85 * np.median(off["step_times"][-4:])
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_training_with_real_replica_processes(tmp_path):
    """2 replica processes at speeds 1:4 (the slow one really sleeps), every strategy, one epoch."""
    spec = {"task": "digits_cnn", "task_config": {"batch_size": 64, "learning_rate": 3e-3}, "mix": [1, 4],
            "strategies": ["uniform", "proportional-mean", "proportional-weighted"], "seeds": [0], "epochs": 1,
            "placement": "label", "probe_batches": [4, 16, 64], "profile_repeats": 2, "emulation": "stretch"}
    out = _train_real(tmp_path, spec, 2, timeout=800)
    runs = {r["strategy"]: r for r in out["runs"]}
    assert set(runs) == set(spec["strategies"])
    assert runs["uniform"]["initial_partition"] == [32, 32]
    for r in runs.values():
        assert sum(r["initial_partition"]) == 64 and len(r["history"]) == 2
        np.testing.assert_allclose(r["history"][-1]["time"], sum(r["step_times"]), rtol=1e-9)
        assert r["final_accuracy"] > 0.1 or r["strategy"] == "proportional-mean"
    # profiling gave the slow replica (speed 1 of 1:4) the smaller batch
    b = runs["proportional-weighted"]["initial_partition"]
    assert 1 <= b[0] < b[1]
