"""The weighted SPMD gradient across 2 real processes (`bppsa launch`'s launcher: jax.distributed
on 127.0.0.1, gloo)."""

import io
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

from bppsa.hetero import plain_mean
from bppsa.parallel.launch import launch
from test_hetero import make_data, full_grad, mlp_params, replica_grads

WORKER = str(Path(__file__).with_name("hetero_worker.py"))


CASES = [[5, 0], [2, 7]]  # uneven local batches, one of them empty


def _launch(argv, n, timeout):
    """Run ``python *argv`` as n processes of one job (one CPU device each); assert they all succeed."""
    out, err = io.StringIO(), io.StringIO()
    rc = launch([sys.executable, *argv], n, devices_per_process=1, timeout=timeout, out=out, err=err)
    assert rc == 0, f"launch failed ({rc}):\n{err.getvalue()}\n{out.getvalue()[-3000:]}"


@pytest.mark.timeout(240)
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


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_training_with_real_replica_processes(tmp_path):
    """2 replica processes at speeds 1:4 (the slow one really sleeps), every strategy, one epoch."""
    import json

    spec = {"task": "digits-cnn", "task_config": {"batch_size": 64, "learning_rate": 3e-3}, "mix": [1, 4],
            "strategies": ["uniform", "proportional-mean", "proportional-weighted"], "seeds": [0], "epochs": 1,
            "placement": "label", "probe_batches": [4, 16, 64], "profile_repeats": 2}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    _launch(["-m", "bppsa.hetero.worker", str(tmp_path / "spec.json")], 2, timeout=800)
    runs = {r["strategy"]: r for r in json.loads((tmp_path / "runs.json").read_text())}
    assert set(runs) == set(spec["strategies"])
    assert runs["uniform"]["initial_partition"] == [32, 32]
    for r in runs.values():
        assert sum(r["initial_partition"]) == 64 and len(r["history"]) == 2 and r["history"][-1]["time"] > 0
        assert r["final_accuracy"] > 0.1 or r["strategy"] == "proportional-mean"
    # profiling gave the slow replica (speed 1 of 1:4) the smaller batch
    b = runs["proportional-weighted"]["initial_partition"]
    assert b[0] < b[1]
