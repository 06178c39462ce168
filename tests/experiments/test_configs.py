"""Experiment configs and the runner: every smoke variant runs, config errors are clear, and a
run killed mid-way and resumed ends bit-identical to an uninterrupted one."""

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import ml_collections
import numpy as np
import pytest

from experiments import RunFailed, cli, runner, train
from experiments.runner import ConfigError

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = list(cli.config_paths().values())  # experiments/<paper>/configs/*.py
RNN_TRAIN = ROOT / "experiments" / "paper_bppsa" / "configs" / "rnn_train.py"
# The smoke variant without its timing table (the training shapes stay those of the smoke run,
# so the compiled steps are shared by all tests): both methods, 10 steps, a checkpoint every 3.
TINY = {"timing.lengths": "()"}
assert runner.load_config(RNN_TRAIN, "smoke").steps == 10


pytestmark = pytest.mark.usefixtures("float32_as_in_bppsa_run")  # float64 off, as `bppsa run` runs


def test_configs_found():
    assert RNN_TRAIN in CONFIGS


# The default run keeps an end-to-end run of every task and of each of its parts, here or in another
# default test; the slow run runs every config's smoke variant exactly as documented.
#
# Configs whose task another default test already runs at smoke size: rnn_sweep's sweep_task
# (tests/experiments/test_bench.py::test_sweep_task_smoke_writes_json_markdown_and_plot), irmas:run (the irmas
# config below), irmas:shapes_task (a loop over bench.bench_point:
# tests/experiments/test_bench.py::test_bench_point_records_auto_choice_and_baselines) and the Ray run
# (tests/sync/test_sync_ray.py::test_ray_bsp_trains_and_survives_a_killed_worker). Their smoke runs are in
# the slow run; their presets are checked by test_every_preset_of_every_config_passes_its_tasks_checks
# (tests/experiments/test_faults.py) and their docstrings by test_config_documents_its_command.
SAME_TASK_AS_ANOTHER = ("rnn_sweep", "irmas_grid", "irmas_train", "irmas_timing",
                        "sync_ray")
# Configs whose task's pieces another default test runs, kept out of the default run for its time
# (the suite's budget): bptt_unroll (BPTT's unroll baselines: tests/experiments/test_baselines.py),
# newton_memory (the Newton training step with return_info: tests/forward/test_newton.py), order_effect
# (the timing protocol: tests/experiments/test_bench.py). The slow run runs their smoke variants.
SAME_TASK_AS_ANOTHER += ("bptt_unroll", "newton_memory", "order_effect")
# newton_training (a jitted training step through bppsa.rnn(forward=..., return_info=True) and the IRMAS stand-in:
# tests/forward/test_auto_forward.py, tests/forward/test_newton.py, tests/experiments/test_irmas_experiment.py)
SAME_TASK_AS_ANOTHER += ("newton_training",)
# and, for the same budget, configs whose every piece another default test runs at test size: parallel_step
# (the Newton forward: tests/forward/test_newton.py; its config's parts: the notebook 06 is its slow twin),
# sparse_vgg (tests/sparse/test_sparse_vgg.py), flax_rnn (tests/nn/test_flax_dropin.py, test_flax_suite.py),
# pararnn_peer (bppsa's side: tests/core/test_structured.py), user_script (tests/plan/test_cost.py's auto) and
# scaling (tests/parallel/test_parallel.py). The default run keeps one smoke run per paper folder and kind:
# rnn_train, core_accuracy, hetero_dp, sync and zipline.
SAME_TASK_AS_ANOTHER += ("parallel_step", "sparse_vgg", "flax_rnn", "pararnn_peer", "user_script", "scaling",
                         "irmas")  # irmas: make reproduce's job; its pieces: tests/experiments/test_irmas_experiment.py
# Configs whose default run leaves out a part that another default test runs at a similar size (none now: the
# slow run runs every config's full smoke variant).
DEFAULT_RUN_OVERRIDES: dict[str, dict[str, str]] = {}


@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_config_documents_its_command(path):
    import importlib.util
    spec = importlib.util.spec_from_file_location(f"_cfg_{path.stem}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.__doc__ and "bppsa run " + path.relative_to(ROOT).as_posix() in mod.__doc__, \
        f"{path.name}: the docstring must give the exact command"


def test_the_suite_names_only_existing_configs():
    stems = {p.stem for p in CONFIGS}
    assert set(SAME_TASK_AS_ANOTHER) <= stems and set(DEFAULT_RUN_OVERRIDES) <= stems
    assert not set(SAME_TASK_AS_ANOTHER) & set(DEFAULT_RUN_OVERRIDES)


def _smoke_runs(path, tmp_path, overrides):
    """Run ``path``'s smoke variant (with ``overrides``) through the runner; check what it recorded."""
    t0 = time.perf_counter()
    summary = runner.run(path, "smoke", overrides, workdir=tmp_path / "w")
    elapsed = time.perf_counter() - t0
    saved = json.loads((tmp_path / "w" / "summary.json").read_text())
    config = runner.load_config(path, "smoke")
    runner.apply_overrides(config, overrides)
    assert saved["config"] == json.loads((tmp_path / "w" / "config.json").read_text())
    assert saved["config"]["task"] == config.task
    for key in overrides:  # the run used the overridden values
        value = config
        recorded = saved["config"]
        for part in key.split("."):
            value, recorded = value[part], recorded[part]
        assert recorded == json.loads(json.dumps(value, default=list)), (key, recorded)
    # the summary on disk is the one returned (NaN compares equal as text)
    assert json.dumps(saved["summary"], sort_keys=True) == \
        json.dumps(json.loads(json.dumps(summary, default=float)), sort_keys=True)
    assert 0 < saved["run_time_s"] <= elapsed  # the task's own time, inside the call
    assert saved["provenance"]["jax"]
    assert saved["provenance"]["command"].startswith("bppsa run " + shlex.quote(f"{path}:smoke"))
    # the task made every entry of the work directory through the run's writer: all of them are bppsa's
    made = set(os.listdir(tmp_path / "w")) - {runner.MARKER}
    assert made <= set(runner.read_marker(tmp_path / "w")["written"]), made
    return summary, saved


@pytest.mark.parametrize("path", [p for p in CONFIGS if p.stem not in SAME_TASK_AS_ANOTHER],
                         ids=[p.stem for p in CONFIGS if p.stem not in SAME_TASK_AS_ANOTHER])
def test_config_smoke_variant_runs(path, tmp_path):
    """Every task runs through the runner: each config's smoke variant (a smaller one for the
    configs in DEFAULT_RUN_OVERRIDES); configs in SAME_TASK_AS_ANOTHER only in the slow run."""
    summary, saved = _smoke_runs(path, tmp_path, DEFAULT_RUN_OVERRIDES.get(path.stem, {}))
    if path == RNN_TRAIN:
        w, run_time_s = tmp_path / "w", saved["run_time_s"]
        record = json.loads((w / "rnn_train.json").read_text())
        assert set(record["curves"]) == {"bptt", "bppsa"}
        assert [r["step"] for r in record["curves"]["bptt"]] == list(range(1, 11))
        # the same initial parameters and batches: the two backward passes give the same training run
        assert summary["max_loss_diff"] < 1e-4
        assert record["final"]["bptt"]["param_abs_sum"] == pytest.approx(record["final"]["bppsa"]["param_abs_sum"],
                                                                          rel=1e-4)
        assert record["backward_times"][0]["T"] == 16
        assert 0 < record["backward_times"][0]["bppsa_s"] < run_time_s  # seconds, a part of the run
        assert "| BPTT |" in (w / "rnn_train.md").read_text()
        assert (w / "rnn_train.png").read_bytes()[:4] == b"\x89PNG"
        assert record["provenance"]["command"].startswith("bppsa run ")


SLOW_ONLY = [p for p in CONFIGS if p.stem in SAME_TASK_AS_ANOTHER or p.stem in DEFAULT_RUN_OVERRIDES]


@pytest.mark.slow
@pytest.mark.parametrize("path", SLOW_ONLY, ids=[p.stem for p in SLOW_ONLY])
def test_config_full_smoke_variant_runs(path, tmp_path):
    """The smoke variants that the default run skips or shrinks, exactly as documented."""
    _smoke_runs(path, tmp_path, {})


# --------------------------------------------------------------------------------------------
# Config errors.
# --------------------------------------------------------------------------------------------

def test_overrides_are_parsed_by_the_fields_type():
    c = runner.load_config(RNN_TRAIN, "smoke")
    runner.apply_overrides(c, {"steps": "7", "learning_rate": "1e-2", "progress": "False",
                               "timing.lengths": "16,32", "methods": "[bptt]", "scan": "associative"})
    assert (c.steps, c.learning_rate, c.progress, c.timing.lengths, c.methods, c.scan) == \
        (7, 0.01, False, (16, 32), ("bptt",), "associative")
    runner.apply_overrides(c, {"learning_rate": "1"})
    assert isinstance(c.learning_rate, float)
    # an empty default says nothing of its elements: numbers are numbers, words stay words
    c = runner.load_config(cli.config_path("rnn_sweep"), "B")
    assert c.T_values == ()
    runner.apply_overrides(c, {"T_values": "100,300", "grid_T": "(7,)", "grid_B": "[]"})
    assert (c.T_values, c.grid_T, c.grid_B) == ((100, 300), (7,), ())
    c = runner.load_config(RNN_TRAIN, "smoke")
    runner.apply_overrides(c, {"timing.lengths": "()"})
    runner.apply_overrides(c, {"timing.lengths": "8,1.5,x"})
    assert c.timing.lengths == (8, 1.5, "x")


@pytest.mark.parametrize("key, value, needles", [
    ("stepz", "3", ["stepz", "unknown", "steps"]),
    ("timing.nope", "3", ["timing.nope", "unknown"]),
    ("steps", "many", ["steps", "many", "int"]),
    ("steps", "1.5", ["steps", "1.5", "int"]),
    ("learning_rate", "fast", ["learning_rate", "fast", "float"]),
    ("progress", "maybe", ["progress", "maybe", "bool"]),
    ("timing.lengths", "8,x", ["timing.lengths", "int"]),
    ("timing", "3", ["timing", "group"]),
])
def test_bad_overrides_are_clear_errors(key, value, needles):
    c = runner.load_config(RNN_TRAIN, "smoke")
    with pytest.raises(ConfigError) as e:
        runner.apply_overrides(c, {key: value})
    for n in needles:
        assert n in str(e.value), (n, str(e.value))


def test_locked_config_rejects_new_keys_and_wrong_types():
    c = runner.load_config(RNN_TRAIN)
    with pytest.raises(AttributeError):
        c.new_key = 1
    with pytest.raises(TypeError):
        c.steps = "ten"


def test_config_file_errors(tmp_path):
    with pytest.raises(ConfigError, match="existing .py file"):
        runner.load_config(tmp_path / "missing.py")
    (tmp_path / "noget.py").write_text("x = 1\n")
    with pytest.raises(ConfigError, match="get_config"):
        runner.load_config(tmp_path / "noget.py")
    (tmp_path / "notask.py").write_text("import ml_collections\n"
                                        "def get_config(arg=None):\n    return ml_collections.ConfigDict({'a': 1})\n")
    with pytest.raises(ConfigError, match="task"):
        runner.load_config(tmp_path / "notask.py")
    (tmp_path / "badtask.py").write_text("import ml_collections\n"
                                         "def get_config(arg=None):\n"
                                         "    return ml_collections.ConfigDict({'task': 'bppsa.nope:run'})\n")
    with pytest.raises(ConfigError, match="bppsa.nope:run"):
        runner.run(tmp_path / "badtask.py", workdir=tmp_path / "w")
    with pytest.raises(ValueError, match="smok"):
        runner.load_config(RNN_TRAIN, "smok")


def test_split_spec():
    assert runner.split_spec("experiments/paper_bppsa/configs/rnn_train.py:smoke") == (Path("experiments/paper_bppsa/configs/rnn_train.py"), "smoke")
    assert runner.split_spec("experiments/paper_bppsa/configs/rnn_train.py") == (Path("experiments/paper_bppsa/configs/rnn_train.py"), None)


def test_cli_reports_config_errors(tmp_path, capsys):
    rc = cli.main(["run", str(RNN_TRAIN) + ":smoke", "--config.stepz=3", "--workdir", str(tmp_path)])
    assert rc == 2
    err = capsys.readouterr().err
    assert "stepz" in err and "unknown config key" in err
    assert cli.main(["run", str(RNN_TRAIN), "oops"]) == 2


def test_workdir_with_a_different_config_is_refused(tmp_path):
    cfg = tmp_path / "echo.py"
    cfg.write_text("import ml_collections\n"
                   "def get_config(arg=None):\n"
                   "    return ml_collections.ConfigDict({'task': 'tests.runner_tasks:echo_task', 'n': 1})\n")
    assert runner.run(cfg, workdir=tmp_path / "w") == {"n": 1}
    with pytest.raises(ConfigError, match=r"n: 1 -> 2"):
        runner.run(cfg, overrides={"n": "2"}, workdir=tmp_path / "w")
    assert runner.run(cfg, overrides={"n": "2"}, workdir=tmp_path / "w", restart=True) == {"n": 2}


# --------------------------------------------------------------------------------------------
# Resume.
# --------------------------------------------------------------------------------------------

def _final_params(workdir: Path, method: str) -> dict:
    import orbax.checkpoint as ocp
    mgr = ocp.CheckpointManager(workdir / method / "checkpoints")
    step = mgr.latest_step()
    state = mgr.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore()))
    mgr.close()
    return step, {k: np.asarray(v) for k, v in state.state.items()}


def _losses(workdir: Path, method: str):
    recs = [json.loads(l) for l in (workdir / method / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r["loss"], r["accuracy"], r.get("eval_loss")) for r in recs]


class Killed(Exception):
    pass


@pytest.fixture(scope="module")
def straight_run(tmp_path_factory):
    """The uninterrupted TINY run that both kills are compared with (float64 off, as in `bppsa run`)."""
    import jax
    previous = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", False)
    try:
        workdir = tmp_path_factory.mktemp("straight")
        runner.run(RNN_TRAIN, "smoke", TINY, workdir=workdir)
    finally:
        jax.config.update("jax_enable_x64", previous)
    return workdir


@pytest.mark.parametrize("kill_at", [5, pytest.param(10 + 8, marks=pytest.mark.slow)], ids=["bptt-step5", "bppsa-step8"])
def test_killed_and_resumed_run_is_bit_identical(tmp_path, monkeypatch, kill_at, straight_run):
    """Kill (an exception after global step k, past the last checkpoint), re-run the same command."""
    calls = {"n": 0}

    def kill(step):
        calls["n"] += 1
        if calls["n"] == kill_at:
            raise Killed(f"killed after step {step}")

    monkeypatch.setattr(train, "after_step", kill)
    with pytest.raises(Killed):
        runner.run(RNN_TRAIN, "smoke", TINY, workdir=tmp_path / "resumed")
    assert not (tmp_path / "resumed" / "summary.json").exists()
    killed_method = "bptt" if kill_at <= 10 else "bppsa"
    # metrics went past the last checkpoint (step 3 or 6); the resume must drop and redo them
    assert _losses(tmp_path / "resumed", killed_method)[-1][0] == (kill_at - 1) % 10 + 1
    monkeypatch.setattr(train, "after_step", lambda step: None)
    runner.run(RNN_TRAIN, "smoke", TINY, workdir=tmp_path / "resumed")

    for method in ("bptt", "bppsa"):
        s1, p1 = _final_params(straight_run, method)
        s2, p2 = _final_params(tmp_path / "resumed", method)
        assert s1 == s2 == 10 and p1.keys() == p2.keys()
        for k in p1:
            np.testing.assert_array_equal(p1[k], p2[k])  # bit-identical
        assert _losses(straight_run, method) == _losses(tmp_path / "resumed", method)
    a = json.loads((straight_run / "rnn_train.json").read_text())["final"]
    b = json.loads((tmp_path / "resumed" / "rnn_train.json").read_text())["final"]
    assert a["bppsa"]["param_abs_sum"] == b["bppsa"]["param_abs_sum"]


def test_batch_indices_are_epoch_permutations():
    per_epoch = [train.batch_indices(10, 3, 0, s) for s in range(3)]
    seen = np.concatenate(per_epoch)
    assert len(set(seen.tolist())) == 9  # no repeats within an epoch
    assert not np.array_equal(train.batch_indices(10, 3, 0, 0), train.batch_indices(10, 3, 0, 3))
    np.testing.assert_array_equal(train.batch_indices(10, 3, 1, 4), train.batch_indices(10, 3, 1, 4))
    with pytest.raises(ValueError, match="batch_size"):
        train.batch_indices(2, 3, 0, 0)


@pytest.mark.slow
def test_sigkilled_subprocess_resumes_bit_identical(tmp_path):
    """A real `bppsa run` process killed with SIGKILL mid-run, then the same command again."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu")
    over = [f"--config.{k}={v}" for k, v in (TINY | {"steps": "400", "checkpoint_every": "25",
                                                      "methods": "bptt", "eval_every": "0"}).items()]

    def cmd(w):
        return [sys.executable, "-m", "experiments.cli", "run", f"{RNN_TRAIN}:smoke", *over, "--workdir", str(w)]

    subprocess.run(cmd(tmp_path / "straight"), env=env, check=True, cwd=ROOT, capture_output=True)
    proc = subprocess.Popen(cmd(tmp_path / "resumed"), env=env, cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    metrics = tmp_path / "resumed" / "bptt" / "metrics.jsonl"
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None:
        if metrics.exists() and len(metrics.read_text().splitlines()) > 60:
            proc.send_signal(signal.SIGKILL)
            break
        time.sleep(0.05)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the run finished before it could be killed"
    subprocess.run(cmd(tmp_path / "resumed"), env=env, check=True, cwd=ROOT, capture_output=True)
    s1, p1 = _final_params(tmp_path / "straight", "bptt")
    s2, p2 = _final_params(tmp_path / "resumed", "bptt")
    assert s1 == s2 == 400
    for k in p1:
        np.testing.assert_array_equal(p1[k], p2[k])


def test_experiments_readme_maps_every_config():
    text = (ROOT / "experiments" / "README.md").read_text()
    for path in CONFIGS:
        assert f"`{path.name}`" in text and f"bppsa run {path.relative_to(ROOT).as_posix()}" in text, \
            f"experiments/README.md does not list {path.name}"


def test_fit_extends_a_finished_run_and_refuses_to_shrink_it(tmp_path):
    from flax import nnx

    from bppsa import cells
    from bppsa.tasks.bitstream import make_bitstream
    from bppsa.nn import SequenceClassifier

    x, y = make_bitstream(32, 16)

    def model():
        return SequenceClassifier(cells.RNN(1, 20), 10, backward="bptt", rngs=nnx.Rngs(0))

    straight = train.fit(model(), x, y, steps=6, batch_size=8, workdir=tmp_path / "a", progress=False)
    train.fit(model(), x, y, steps=4, batch_size=8, workdir=tmp_path / "b", progress=False)
    extended = train.fit(model(), x, y, steps=6, batch_size=8, workdir=tmp_path / "b", progress=False)
    assert [r["loss"] for r in extended] == [r["loss"] for r in straight]
    assert [r.get("warmup", False) for r in extended] == [True, False, False, False, True, False]
    with pytest.raises(ValueError, match="past steps = 3"):
        train.fit(model(), x, y, steps=3, batch_size=8, workdir=tmp_path / "b", progress=False)


def test_publish_copies_the_task_outputs(tmp_path, capsys):
    cfg = tmp_path / "pub.py"
    cfg.write_text("import ml_collections\n"
                   "def get_config(arg=None):\n"
                   "    return ml_collections.ConfigDict({'task': 'tests.runner_tasks:pub_task', "
                   "'name': 'pub', 'write': True})\n")
    out = runner.run(cfg, workdir=tmp_path / "w", publish=True, results_root=tmp_path / "results")
    from experiments.provenance import device_label
    dest = tmp_path / "results" / device_label()
    assert sorted(p.name for p in dest.iterdir()) == ["pub.json", "pub.md"]
    assert out["published"] == [str(dest / "pub.json"), str(dest / "pub.md")]
    with pytest.raises(RunFailed, match="wrote no pub.json"):
        runner.run(cfg, None, {"write": "false"}, workdir=tmp_path / "w2", publish=True,
                   results_root=tmp_path / "results")
    assert cli.main(["run", str(cfg), "--workdir", str(tmp_path / "w3")]) == 0
    assert '"wrote": true' in capsys.readouterr().out


# --------------------------------------------------------------------------------------------
# `bppsa reproduce NAME` is `bppsa run experiments/<paper>/configs/NAME.py`.
# --------------------------------------------------------------------------------------------

def test_reproduce_names_are_the_config_files():
    names = cli.reproduce_names()
    assert names == sorted(p.stem.replace("_", "-") for p in CONFIGS)
    assert {"rnn-train", "rnn-sweep", "irmas", "sparse-vgg", "scaling"} <= set(names)


def test_reproduce_is_run_of_the_config(tmp_path):
    assert cli.reproduce_argv(["rnn-train"]) == [str(RNN_TRAIN)]
    assert cli.reproduce_argv(["rnn-train", "--quick", "--config.steps=3", "--workdir", "w"]) == \
        [str(RNN_TRAIN) + ":quick", "--config.steps=3", "--workdir", "w"]
    args = ["--config.timing.lengths=()", "--config.steps=4"]
    assert cli.main(["reproduce", "rnn-train", "--quick", *args, "--workdir", str(tmp_path / "a")]) == 0
    assert cli.main(["run", str(RNN_TRAIN) + ":quick", *args, "--workdir", str(tmp_path / "b")]) == 0
    a, b = (json.loads((tmp_path / w / "summary.json").read_text()) for w in "ab")
    assert a["config"] == b["config"] and a["config"]["steps"] == 4
    assert a["summary"]["bppsa_train_loss"] == b["summary"]["bppsa_train_loss"]


def test_reproduce_unknown_name_lists_the_names(capsys):
    with pytest.raises(ValueError, match="unknown NAME 'no-such-result'; expected one of: .*rnn-train"):
        cli.reproduce_argv(["no-such-result"])
    assert cli.main(["reproduce", "no-such-result"]) == 2
    err = capsys.readouterr().err
    assert "unknown NAME 'no-such-result'" in err and "irmas" in err and "rnn-sweep" in err
    assert cli.main(["frobnicate"]) == 2


from hypothesis import given, settings, strategies as st  # noqa: E402


@settings(max_examples=50, deadline=None)
@given(n=st.integers(-10**12, 10**12), x=st.floats(allow_nan=False, allow_infinity=False),
       b=st.booleans(), ts=st.lists(st.integers(1, 10**6), max_size=5))
def test_override_round_trip(n, x, b, ts):
    c = ml_collections.ConfigDict({"n": 1, "x": 1.0, "b": False, "ts": (1,), "s": "a"})
    c.lock()
    runner.apply_overrides(c, {"n": str(n), "x": repr(x), "b": str(b), "ts": ",".join(map(str, ts)),
                               "s": f"{n}"})
    assert (c.n, c.x, c.b, c.ts, c.s) == (n, x, b, tuple(ts), str(n))


@settings(max_examples=50, deadline=None)
@given(n=st.integers(1, 200), b=st.integers(1, 200), seed=st.integers(0, 2**31), epoch=st.integers(0, 50))
def test_batch_indices_cover_each_epoch_without_repeats(n, b, seed, epoch):
    if b > n:
        with pytest.raises(ValueError):
            train.batch_indices(n, b, seed, 0)
        return
    per_epoch = n // b
    batches = [train.batch_indices(n, b, seed, epoch * per_epoch + k) for k in range(per_epoch)]
    assert all(len(x) == b for x in batches)
    seen = np.concatenate(batches)
    assert len(np.unique(seen)) == per_epoch * b and seen.min() >= 0 and seen.max() < n
