"""Real multi-process runs: `bppsa launch` starts processes that join one JAX job with
jax.distributed on a free 127.0.0.1 port (gloo CPU collectives). Two processes × two devices
give the gradients of one process; a peer that dies or never joins is reported within the timeout."""

import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import pytest
from jax import lax

from bppsa.parallel import launch
from bppsa.parallel.selfcheck import loss_of_states, problem
from experiments.runner import load_config


def _launch(args, timeout):
    cmd = [sys.executable, "-m", "experiments.cli", "launch"] + args
    t0 = time.monotonic()
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    return out, time.monotonic() - t0


def test_two_processes_two_devices_each_give_single_process_gradients(tmp_path):
    path = tmp_path / "grads.npz"
    out, _ = _launch(["-n", "2", "--devices-per-process", "2", "--timeout", "150", "--grace", "20", "--",
                      sys.executable, "-m", "bppsa.parallel.selfcheck", "--out", str(path),
                      "--cell", "gru", "--T", "7", "--B", "2", "--combine", "logstep"], timeout=200)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "[0] process 0/2" in out.stdout and "[1] process 1/2" in out.stdout
    assert "4 devices, 2 local" in out.stdout

    cell, params, xs, h0 = problem("gru", T=7, B=2)

    def loss(p, x, h):
        return loss_of_states(cell, lax.scan(lambda s, xt: (cell.step(p, s, xt),) * 2, h, x)[1])

    value, (gp, gx, gh) = jax.value_and_grad(loss, argnums=(0, 1, 2))(params, xs, h0)
    saved = np.load(path)
    np.testing.assert_allclose(saved["loss"], value, rtol=1e-12)
    for name in ("W_x", "W_h", "b_x", "b_h"):
        np.testing.assert_allclose(saved[f"[0]['{name}']"], gp[name], rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(saved["[1]"], gx, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(saved["[2]"], gh, rtol=1e-10, atol=1e-12)


WORKER_DIES = (
    "import os, sys\n"
    "if os.environ['BPPSA_PROCESS_ID'] == '1':\n"
    "    sys.exit(3)  # dies before joining\n"
    "from bppsa.parallel import initialize\n"
    "initialize()\n"
    "print('joined without the peer?!')\n"
)


def test_peer_that_dies_before_joining_is_reported_within_the_grace_period():
    out, elapsed = _launch(["-n", "2", "--timeout", "60", "--grace", "3", "--",
                            sys.executable, "-c", WORKER_DIES], timeout=90)
    assert out.returncode == 1
    assert "process 1 of 2 exited with code 3" in out.stderr
    assert "processes [0] were still running" in out.stderr
    assert "joined without the peer" not in out.stdout
    assert elapsed < 45


WORKER_NEVER_JOINS = (
    "import os, time\n"
    "if os.environ['BPPSA_PROCESS_ID'] == '1':\n"
    "    time.sleep(600)  # alive but never joins\n"
    "from bppsa.parallel import initialize\n"
    "initialize(timeout=4)\n"
)


@pytest.mark.slow
def test_peer_that_never_joins_makes_the_others_fail_within_the_init_timeout():
    out, elapsed = _launch(["-n", "2", "--timeout", "60", "--grace", "2", "--",
                            sys.executable, "-c", WORKER_NEVER_JOINS], timeout=90)
    assert out.returncode == 1, out.stderr
    # process 0 gives up after its 4 s initialization timeout (JAX raises or aborts); 1 is stopped
    assert "process 0 of 2" in out.stderr and "processes [1] were still running" in out.stderr
    assert "DEADLINE_EXCEEDED" in out.stderr or "timed out" in out.stderr.lower()
    assert elapsed < 50


@pytest.mark.slow  # the default run: the launcher's timeout in test_launch_signals (held while a signal is handled)
def test_launcher_timeout_stops_everything():
    out, elapsed = _launch(["-n", "2", "--timeout", "2", "--",
                            sys.executable, "-c", "import time; time.sleep(600)"], timeout=60)
    assert out.returncode == 124
    assert "timed out after 2 s; processes [0, 1] were still running" in out.stderr
    assert elapsed < 30


def test_launcher_success_and_environment(capsys):
    code = ("import os; print(os.environ['BPPSA_PROCESS_ID'], os.environ['BPPSA_NUM_PROCESSES'], "
            "os.environ['JAX_COORDINATOR_ADDRESS'].startswith('127.0.0.1:'), os.environ['XLA_FLAGS'])")
    rc = launch.main(["-n", "3", "--devices-per-process", "5", "--timeout", "60", "--",
                      sys.executable, "-c", code])
    out = capsys.readouterr().out
    assert rc == 0
    for i in range(3):
        assert f"[{i}] {i} 3 True" in out
    assert out.count("--xla_force_host_platform_device_count=5") == 3


def test_launcher_bad_arguments():
    with pytest.raises(SystemExit):
        launch.main(["-n", "2"])  # no command
    with pytest.raises(SystemExit):
        launch.main(["-n", "0", "--", "true"])
    with pytest.raises(ValueError, match="n .number of processes. must be a positive int"):
        launch.launch(["true"], 0)
    assert 0 < launch.free_port() < 65536


SCALING = Path(__file__).resolve().parents[2] / "experiments" / "extensions" / "configs" / "scaling.py"


def test_scaling_config_shape():
    full, smoke = load_config(SCALING), load_config(SCALING, "smoke")
    assert full.task == "experiments.extensions.scaling:run_scaling"
    assert tuple(full.devices) == (1, 2, 4, 8) and all(full.T % p == 0 for p in full.devices)
    assert smoke.T < full.T and smoke.repeats < full.repeats


@pytest.mark.slow
def test_scaling_smoke_run_writes_results(tmp_path):
    """The experiments task end to end (a subprocess with 2 simulated devices when needed)."""
    from experiments.extensions.scaling import run_scaling
    summary = run_scaling(load_config(SCALING, "smoke"), tmp_path)
    assert [r["devices"] for r in summary["rows"]] == [1, 2]
    assert all(r["backward_logstep_s"] > 0 for r in summary["rows"])
    for ext in ("json", "md", "png"):
        assert (tmp_path / f"scaling.{ext}").stat().st_size > 0
    assert "provenance" in __import__("json").loads((tmp_path / "scaling.json").read_text())
