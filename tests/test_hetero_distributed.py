"""The weighted SPMD gradient across 2 real processes (jax.distributed on 127.0.0.1, gloo)."""

from pathlib import Path

import jax
import numpy as np
import pytest

from bppsa.hetero import plain_mean
from bppsa.hetero.launch import spawn
from test_hetero import _data, _full_grad, _mlp_params, _replica_grads

WORKER = str(Path(__file__).with_name("hetero_worker.py"))


CASES = [[5, 0], [2, 7]]  # uneven local batches, one of them empty


@pytest.mark.timeout(240)
def test_weighted_gradient_across_two_processes(tmp_path):
    seed = 3
    res = spawn([WORKER, str(tmp_path), str(seed), ";".join(",".join(map(str, c)) for c in CASES)], 2,
                timeout=180)
    for r in res:
        assert r.returncode == 0, f"process {r.process_id} failed ({r.returncode}):\n{r.output[-3000:]}"
    params = _mlp_params(jax.random.key(seed))
    for case, counts in enumerate(CASES):
        x, y = _data(sum(counts), seed=seed)
        full = _full_grad(params, x, y)
        plain = plain_mean(_replica_grads(params, x, y, np.array(counts)), counts)
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
