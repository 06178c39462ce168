"""A property of the runner (issue 25): random sequences of run / kill -9 / the user writes a file /
--restart / resume / a part of the task fails / the work directory is removed under the run, in one
work directory, never lose a user file (except those removed with the folder), a failed run never
exits 0, every run that ends well ends with the results of an uninterrupted run of its config, and the
same command on a run that ended well runs nothing and changes nothing.

Two drivers: a toy resumable task (``tests.runner_tasks:steps_task``, a checkpoint every step; the
default suite, a few examples) and ``experiments/paper_bppsa/configs/rnn_train.py:smoke`` itself (both methods,
orbax checkpoints every 3 steps; slow). A kill is a real SIGKILL of a ``bppsa run`` process after its
K-th training step (``tests/runner_tasks.py``); the other runs are ``bppsa run`` in this process.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from experiments import cli, workdir
from tests.helpers import file_tree

ROOT = Path(__file__).resolve().parents[2]
ENV = dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu")
KILL = [sys.executable, str(ROOT / "tests" / "runner_tasks.py")]
SKIP = {workdir.LOCK}


pytestmark = pytest.mark.usefixtures("float32_as_in_bppsa_run")  # float64 off, as `bppsa run` runs


class Toy:
    """steps_task: n steps, a checkpoint after every step. Results: toy.json and the metrics lines."""
    variants, max_kill = (3, 5), 6
    faults = (None, "part", "rmdir")  # see tests.runner_tasks.steps_task

    def __init__(self, tmp: Path):
        self.config = tmp / "toy.py"
        self.config.write_text("import ml_collections\ndef get_config(arg=None):\n    return ml_collections."
                               "ConfigDict({'task': 'tests.runner_tasks:steps_task', 'name': 'toy', 'steps': 3})\n")

    def argv(self, n: int) -> list[str]:
        return ["run", str(self.config), f"--config.steps={n}"]

    def kill(self, k: int, argv: list[str]):
        return [sys.executable, "-m", "experiments.cli", *argv], dict(ENV, BPPSA_TEST_KILL_AFTER=str(k))

    def results(self, d: Path):
        return (d / "toy.json").read_text(), (d / "train" / "metrics.jsonl").read_text()


class RnnTrain:
    """rnn_train.py:smoke (both methods, no timing table), steps 6 or 10, a checkpoint every 3 steps."""
    variants, max_kill = (6, 10), 20
    faults = (None,)
    DROP = ("step_time", "time", "warmup", "median_step_s", "train_time_s")

    def __init__(self, tmp: Path):
        self.config = ROOT / "experiments" / "paper_bppsa" / "configs" / "rnn_train.py"

    def argv(self, n: int) -> list[str]:
        return ["run", f"{self.config}:smoke", "--config.timing.lengths=()", f"--config.steps={n}"]

    def kill(self, k: int, argv: list[str]):
        return [*KILL, str(k), *argv], ENV

    def _plain(self, obj):
        if isinstance(obj, dict):
            return {k: self._plain(v) for k, v in obj.items() if k not in self.DROP}
        return [self._plain(v) for v in obj] if isinstance(obj, list) else obj

    def results(self, d: Path):
        record = json.loads((d / "rnn_train.json").read_text())
        metrics = {m: [self._plain(json.loads(line)) for line in (d / m / "metrics.jsonl").read_text().splitlines()]
                   for m in ("bptt", "bppsa")}
        return self._plain({k: record[k] for k in ("curves", "final", "max_loss_diff", "diverge_step")}), metrics


def _ops(driver):
    n = st.sampled_from(driver.variants)
    run = st.tuples(st.just("run"), n, st.none() | st.integers(1, driver.max_kill), st.booleans(),
                    st.sampled_from(driver.faults))
    write = st.tuples(st.just("write"), st.sampled_from(["notes.txt", "analysis/plot.py", "ünïcode #?.md"]),
                      st.text(max_size=20))
    return st.lists(run | write, min_size=1, max_size=5)


def _drive(driver_cls, ops, straight: dict, max_kills: int = 2) -> None:
    """One sequence of operations in a fresh work directory, checked against the model after each."""
    tmp = Path(tempfile.mkdtemp(prefix="bppsa-prop-"))
    try:
        driver, d = driver_cls(tmp), tmp / "work dir"
        user: dict[str, str] = {}
        config, done, kills = None, False, 0  # the config of the run in d (None: no run yet); done: it ended well
        for op in ops:
            if op[0] == "write":
                _, name, text = op
                (d / name).parent.mkdir(parents=True, exist_ok=True)
                (d / name).write_bytes(text.encode())  # bytes: read_text would turn "\r" into "\n"
                user[name] = text
                continue
            _, n, kill, restart, fault = op
            kill = kill if kills < max_kills and fault is None else None  # processes killed: each starts JAX
            argv = driver.argv(n) + ["--workdir", str(d)] + (["--restart"] if restart else [])
            # refused: a folder of the user's only; a run of another config (or a damaged one) without --restart
            refused = (config is None and bool(user)) or (not restart and config not in (None, n))
            # the same command on a run that ended well runs nothing (no kill, no fault: the task does not run)
            finished = done and not restart and not refused
            before = file_tree(d, skip=SKIP)
            if kill is not None:
                kills += 1
                cmd, env = driver.kill(kill, argv)
                proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
                rc = proc.returncode
                assert rc in ((2,) if refused else (0,) if finished else (0, -9)), proc.stderr
            else:
                os.environ.pop("BPPSA_TEST_FAULT", None)
                if fault:
                    os.environ["BPPSA_TEST_FAULT"] = fault
                try:
                    rc = cli.main(argv)
                finally:
                    os.environ.pop("BPPSA_TEST_FAULT", None)
                assert rc == (2 if refused else 1 if fault and not finished else 0), (op, rc)
            if refused or finished:
                assert file_tree(d, skip=SKIP) == before  # nothing changed
            if not refused:
                config, done = n, rc == 0
                if rc == 0:
                    assert driver.results(d) == straight[n]
                    assert not (d / workdir.LOCK).exists()
                elif rc == 1:
                    marker = json.loads((d / workdir.MARKER).read_text())
                    assert marker["status"] == "failed"
                    if fault == "rmdir":  # the user's files went with the folder; the run is damaged
                        assert "removed or replaced" in marker["damaged"]
                        user, config = {}, "damaged"
            for name, text in user.items():
                assert (d / name).read_bytes() == text.encode(), f"lost the user's {name} after {op}"
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _straight(driver_cls, tmp: Path) -> dict:
    driver, out = driver_cls(tmp), {}
    for n in driver_cls.variants:
        assert cli.main(driver.argv(n) + ["--workdir", str(tmp / f"straight-{n}")]) == 0
        out[n] = driver.results(tmp / f"straight-{n}")
    return out


@pytest.fixture(scope="module")
def toy_straight(tmp_path_factory):
    return _straight(Toy, tmp_path_factory.mktemp("toy"))


def test_the_runner_never_loses_a_file_and_resumes_exactly(toy_straight):
    """The default suite's version: the toy task, a few fixed examples."""
    @settings(max_examples=2, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow])
    @given(_ops(Toy))
    @example([("run", 5, 2, False, None), ("write", "notes.txt", "mine"), ("write", "analysis/plot.py", "x"),
              ("run", 3, None, True, None), ("run", 5, None, False, None), ("run", 5, None, True, None)])
    @example([("run", 3, None, False, "part"), ("write", "notes.txt", "mine"), ("run", 3, None, False, None),
              ("run", 3, None, False, "rmdir"), ("run", 3, None, False, None), ("write", "notes.txt", "x"),
              ("run", 5, None, True, None), ("run", 5, None, False, "part"), ("run", 5, None, False, None)])
    def prop(ops):
        _drive(Toy, ops, toy_straight, max_kills=1)
    prop()


@pytest.mark.slow
def test_the_runner_never_loses_a_file_and_resumes_exactly_rnn_train(tmp_path_factory):
    """rnn_train.py:smoke itself, more and random sequences (each kill is a process: ~20 s)."""
    import jax
    jax.config.update("jax_enable_x64", False)
    straight = _straight(RnnTrain, tmp_path_factory.mktemp("rnn"))

    @settings(max_examples=8, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
    @given(_ops(RnnTrain))
    @example([("run", 10, 14, False, None), ("write", "notes.txt", "mine"), ("run", 10, None, False, None),
              ("run", 6, 4, True, None), ("write", "analysis/plot.py", "x"), ("run", 6, None, False, None)])
    def prop(ops):
        _drive(RnnTrain, ops, straight)
    prop()
