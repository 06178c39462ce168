"""Faults and bad input, as a new user meets them: --restart deletes only what bppsa wrote, bad
values are refused before anything is written, user errors are one line with exit code 2
(--debug: the traceback), sync-ray's explicit flags win over its preset, and a corrupt checkpoint
falls back to the newest intact one."""

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from experiments import cli, runner, train
from bppsa.errors import UsageError
from tests.helpers import toy_classifier, toy_data

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = cli.config_paths()  # {name: experiments/<paper>/configs/name.py}
RNN_TRAIN = CONFIGS["rnn_train"]
ENV = dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu")


def _user_files(d: Path) -> None:
    d.mkdir(parents=True, exist_ok=True)
    (d / "important.txt").write_text("precious")
    (d / "notes").mkdir(exist_ok=True)
    (d / "notes" / "a.txt").write_text("mine")


def _assert_user_files(d: Path) -> None:
    assert (d / "important.txt").read_text() == "precious"
    assert (d / "notes" / "a.txt").read_text() == "mine"


# --------------------------------------------------------------------------------------------
# --restart deletes only what bppsa wrote.
# --------------------------------------------------------------------------------------------

def test_restart_keeps_the_users_files(task_config, tmp_path, capsys):
    cfg = task_config("write_task", n=1, die=False)
    d = tmp_path / "D"
    assert cli.main(["run", str(cfg), "--workdir", str(d)]) == 0
    _user_files(d)  # added to the work directory after the run (a folder bppsa did not mark is refused)
    marker = runner.read_marker(d)
    assert marker["status"] == "done"
    assert marker["written"] == ["config.json", "out.json", "state", "summary.json"]
    (d / "state" / "stale.txt").write_text("from the first run")
    assert cli.main(["run", str(cfg), "--config.n=2", "--workdir", str(d), "--restart"]) == 0
    _assert_user_files(d)
    assert not (d / "state" / "stale.txt").exists()  # bppsa's folder went, with everything in it
    assert json.loads((d / "out.json").read_text()) == {"n": 2}
    assert sorted(p.name for p in d.iterdir()) == sorted(
        [runner.MARKER, "config.json", "important.txt", "notes", "out.json", "state", "summary.json"])


def test_restart_after_a_sigkilled_run_still_knows_what_bppsa_wrote(task_config, tmp_path):
    cfg = task_config("write_task", n=1, die=True)
    d = tmp_path / "D"
    cmd = [sys.executable, "-m", "experiments.cli", "run", str(cfg), "--workdir", str(d)]
    proc = subprocess.run(cmd, env=ENV, cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == -9, proc.stderr  # killed inside the task: the marker still says "running"
    _user_files(d)  # the user's notes, added after the kill, are not bppsa's
    assert json.loads((d / runner.MARKER).read_text())["status"] == "running"
    assert runner.read_marker(d)["written"] == ["config.json", "out.json", "state"]
    assert runner.run(cfg, None, {"die": "false"}, workdir=d, restart=True) == {"n": 1}
    _assert_user_files(d)


def test_restart_refuses_a_folder_bppsa_did_not_mark(one_error_line, task_config, tmp_path, capsys):
    d = tmp_path / "D"
    _user_files(d)
    (d / "config.json").write_text("{}")  # looks like a run, but bppsa's marker is not there
    cfg = task_config("echo_task", n=1)
    assert cli.main(["run", str(cfg), "--workdir", str(d), "--restart"]) == 2
    line = one_error_line()
    assert str(d) in line and "not a bppsa work directory" in line
    _assert_user_files(d)
    assert (d / "config.json").read_text() == "{}"


# --------------------------------------------------------------------------------------------
# Values of the right type but out of range: refused before anything is written.
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("key, value, needle", [("methods", "foo", "config.methods must be"),
                                                ("steps", "-5", "config.steps must be an int >= 1; got -5"),
                                                ("batch_size", "0", "config.batch_size"),
                                                ("scan", "fast", "config.scan")])
def test_out_of_range_values_are_refused_before_anything_is_written(tmp_path, key, value, needle):
    with pytest.raises(UsageError, match=needle):
        runner.run(RNN_TRAIN, "smoke", {key: value}, workdir=tmp_path / "w")
    assert not (tmp_path / "w").exists()


def test_corrected_command_runs_after_a_refused_value(one_error_line, tmp_path, capsys):
    w = str(tmp_path / "w")
    assert cli.main(["reproduce", "rnn-train", "--smoke", "--config.steps=-5", "--workdir", w]) == 2
    assert "config.steps" in one_error_line()
    tiny = ["--config.steps=2", "--config.methods=bptt", "--config.timing.lengths=()"]
    assert cli.main(["reproduce", "rnn-train", "--smoke", *tiny, "--workdir", w]) == 0
    assert json.loads((tmp_path / "w" / "summary.json").read_text())["config"]["steps"] == 2


def test_a_run_that_never_started_takes_a_corrected_config(task_config, tmp_path, capsys):
    cfg = task_config("refusing_task", n=1)
    w = tmp_path / "w"
    with pytest.raises(UsageError, match="n = 0"):
        runner.run(cfg, None, {"n": "0"}, workdir=w)  # the task itself refuses (e.g. an empty data folder)
    assert runner.read_marker(w)["status"] == "refused"
    assert runner.run(cfg, None, {"n": "3"}, workdir=w) == {"n": 3}
    assert "never started" in capsys.readouterr().err
    with pytest.raises(UsageError, match="n: 3 -> 4"):  # this one did run: only the same config resumes
        runner.run(cfg, None, {"n": "4"}, workdir=w)
    (w / "REFUSE").write_text("")
    assert runner.run(cfg, None, {"n": "3"}, workdir=w) == {"n": 3}  # it finished: the task is not run again
    marker = json.loads((w / runner.MARKER).read_text())
    (w / runner.MARKER).write_text(json.dumps({**marker, "status": "running"}))  # as a kill mid-run leaves it
    # now the same config is refused by the task when it resumes (e.g. no intact checkpoint)...
    with pytest.raises(UsageError, match="n = 0"):
        runner.run(cfg, None, {"n": "3"}, workdir=w)
    with pytest.raises(UsageError, match="n: 3 -> 4"):  # ...which does not make the run "never started"
        runner.run(cfg, None, {"n": "4"}, workdir=w)
    assert (w / "summary.json").exists() and (w / "partial").is_dir()


# --------------------------------------------------------------------------------------------
# User errors: one line, exit code 2; --debug shows the traceback.
# --------------------------------------------------------------------------------------------

USER_ERRORS = {
    "syntax-error": (["run", "{tmp}/syntax.py"], "line 2: syntax error"),
    "name-error": (["run", "{tmp}/name.py"], "line 3: NameError"),
    "kill-flag": (["reproduce", "sync-ray", "--kill", "3"], "did you mean --config.kill=...?"),
    "kill-index": (["reproduce", "sync-ray", "--smoke", "--config.kill=3:1"], "config.kill"),
    "kill-no-time": (["reproduce", "sync-ray", "--config.kill=3"], "config.kill"),
    "policy": (["reproduce", "sync-ray", "--smoke", "--config.policies=ssp:s=x"], "'ssp:s=x'"),
    "unknown-policy": (["reproduce", "sync-ray", "--config.policies=bsp,fast"], "unknown policy 'fast'"),
    "delays": (["reproduce", "sync-ray", "--smoke", "--config.workers=3"], "config.delays must be 3 numbers"),
    "settings": (["reproduce", "irmas", "--smoke", "--config.settings=x"], "config.settings"),
    "settings-flag": (["reproduce", "irmas", "--settings", "x"], "unexpected argument '--settings'"),
    "methods": (["reproduce", "rnn-train", "--config.methods=foo"], "config.methods"),
    "unknown-name": (["reproduce", "no-such"], "unknown NAME 'no-such'"),
    "zipline-method": (["reproduce", "zipline", "--smoke", "--config.methods=zipline,fastest"], "config.methods"),
    "sweep-length": (["reproduce", "rnn-sweep", "--smoke", "--config.T_values=10,0"], "config.T_values"),
    "timing-setting": (["reproduce", "irmas-timing", "--config.settings=s,xl"], "config.settings"),
    "accuracy-batch": (["reproduce", "core-accuracy", "--config.batch_size=-1"], "config.batch_size"),
    "hetero-emulation": (["run", "experiments/paper_hetero/configs/hetero_dp.py:real", "--config.processes.emulation=nap"],
                         "config.processes.emulation"),
    "binary-config": (["run", "{tmp}/binary.py"], "is not Python source text (it holds a NUL byte at offset 7"),
    "task-signature": (["run", "{tmp}/signature.py"], "must take (config, workdir); its signature is "
                                                      "one_argument_task(config)"),
    "hetero-mixes": (["run", "experiments/paper_hetero/configs/hetero_dp.py:smoke", "--config.mixes.1:1:2:4=1,0,2,4"],
                     "config.mixes.1:1:2:4 must be >= 2 positive speed ratios"),
    "hetero-drift": (["run", "experiments/paper_hetero/configs/hetero_dp.py:real", "--config.processes.drift.replica=4"],
                     "config.processes.drift.replica must be an int in 0..3"),
}


def test_every_preset_of_every_config_passes_its_tasks_checks():
    checked = set()
    for path in CONFIGS.values():
        for arg in (None, "quick", "smoke", "real"):
            try:
                config = runner.load_config(path, arg)
            except UsageError:
                continue  # a config without this preset
            task = runner.resolve_task(config.task)
            if hasattr(task, "check"):
                task.check(config)
                checked.add(path.stem)
    assert {"rnn_train", "irmas", "irmas_timing", "rnn_sweep", "core_accuracy", "sync", "sync_ray", "zipline",
            "hetero_dp"} <= checked


@pytest.mark.parametrize("case", USER_ERRORS)
def test_user_errors_are_one_line_and_exit_code_2(one_error_line, tmp_path, capsys, case):
    (tmp_path / "syntax.py").write_text("import ml_collections\ndef get_config(arg=None)\n    return 1\n")
    (tmp_path / "name.py").write_text("import ml_collections\ndef get_config(arg=None):\n    return oops\n")
    (tmp_path / "binary.py").write_bytes(b"\x7fELF\x02\x01\x01\x00" + bytes(range(256)))
    (tmp_path / "signature.py").write_text("import ml_collections\ndef get_config(arg=None):\n    return ml_collections."
                                           "ConfigDict({'task': 'tests.runner_tasks:one_argument_task'})\n")
    argv, needle = USER_ERRORS[case]
    argv = [a.format(tmp=tmp_path) for a in argv] + ["--workdir", str(tmp_path / "w")]
    assert cli.main(argv) == 2
    line = one_error_line()
    assert line.startswith(f"bppsa {argv[0]}: error: ") and needle in line, line
    assert not (tmp_path / "w").exists()  # nothing written
    assert cli.main(["--debug", *argv]) == 2
    assert "Traceback" in capsys.readouterr().err
    assert cli.main([*argv[:2], "--debug", *argv[2:]]) == 2  # also after the command
    assert "Traceback" in capsys.readouterr().err


def test_debug_after_a_double_dash_belongs_to_the_other_program():
    assert cli.split_debug(["--debug", "run", "x"]) == (True, ["run", "x"])
    assert cli.split_debug(["launch", "-n", "2", "--", "prog", "--debug"]) == \
        (False, ["launch", "-n", "2", "--", "prog", "--debug"])


def _bppsa_command(tmp_path, *debug):
    """The installed console script (or ``python -m experiments.cli``) in a real process, a usage error."""
    script = Path(sys.executable).parent / "bppsa"
    exe = [str(script)] if script.exists() else [sys.executable, "-m", "experiments.cli"]
    args = ["reproduce", "sync-ray", "--smoke", "--config.kill=3", "--workdir", str(tmp_path / "w")]
    return subprocess.run(exe + [*debug] + args, env=ENV, cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_the_bppsa_command_prints_one_line_and_exits_2(tmp_path):
    proc = _bppsa_command(tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()] and "Traceback" not in proc.stderr
    assert "config.kill" in proc.stderr and not (tmp_path / "w").exists()


# make test-all: the default run checks --debug's traceback of a usage error in this process
# (test_user_errors_are_one_line_and_exit_code_2) and of a real process (tests/experiments/test_command.py's
# missing extra, tests/experiments/test_interrupt.py's Ctrl-C)
@pytest.mark.slow
def test_the_bppsa_command_with_debug_shows_the_traceback(tmp_path):
    proc = _bppsa_command(tmp_path, "--debug")
    assert proc.returncode == 2 and "Traceback" in proc.stderr and "UsageError" in proc.stderr


# --------------------------------------------------------------------------------------------
# sync-ray: explicit flags win over the preset (Ray itself is replaced: the test stops before it).
# --------------------------------------------------------------------------------------------

def test_sync_ray_explicit_flags_win_over_the_smoke_preset(tmp_path, monkeypatch, capsys):
    from bppsa.sync import ray_runtime
    calls = []

    def fake_run_ray(task, policy, **kw):
        calls.append({"task": task, "policy": policy, **kw})
        return {"curve": [{"accuracy": 0.5}], "version": 3, "barriers": 0, "wait": {0: 0.0}, "pushes": {0: 3},
                "dead": [], "detect_delay": None, "duplicates": [], "refused": [], "setup_s": 0.0}

    monkeypatch.setattr(ray_runtime, "init_ray", lambda *a, **k: None)
    monkeypatch.setattr(ray_runtime, "run_ray", fake_run_ray)
    rc = cli.main(["reproduce", "sync-ray", "--smoke", "--config.policies=dssp,ssp:s=2", "--config.workers=3",
                   "--config.delays=0,0.01,0.02", "--config.duration=1.5", "--config.kill=2:0.5",
                   "--workdir", str(tmp_path / "w")])
    assert rc == 0, capsys.readouterr().err
    assert [(c["policy"], c["policy_options"]) for c in calls] == [("dssp", {}), ("ssp", {"s": 2})]
    for c in calls:
        assert c["num_workers"] == 3 and c["delays"] == [0.0, 0.01, 0.02]
        assert c["duration_s"] == 1.5 and c["kill"] == (2, 0.5)
    assert calls[0]["task"] == {"name": "digits_cnn", "channels": [4, 8]}  # the preset's, not overridden


# --------------------------------------------------------------------------------------------
# Corrupt checkpoints: verified on restore, the newest intact one is used, the bad one moved aside.
# --------------------------------------------------------------------------------------------

def _corrupt(step_dir: Path, how: str) -> None:
    # the arrays sit in state/d/ (orbax merges the per-process files of state/ocdbt.process_0/ into it)
    files = sorted((step_dir / "state" / "d").iterdir(), key=lambda p: -p.stat().st_size)
    data = files[0].read_bytes()
    if how == "truncated":
        files[0].write_bytes(data[:len(data) // 2])
    elif how == "overwritten":  # same size, still decodes: only the stored SHA-256 catches it
        files[0].write_bytes(data[:100] + bytes(b ^ 0xFF for b in data[100:200]) + data[200:])
    else:  # "gone"
        for f in files:
            f.write_bytes(b"x")


@pytest.mark.parametrize("how", ["truncated", "overwritten"])
def test_corrupt_latest_checkpoint_falls_back_to_the_previous_one(tmp_path, how):
    x, y = toy_data()
    kw = dict(batch_size=8, checkpoint_every=3, progress=False)
    straight = train.fit(toy_classifier(), x, y, steps=8, **kw)
    train.fit(toy_classifier(), x, y, steps=6, workdir=tmp_path, **kw)
    _corrupt(tmp_path / "checkpoints" / "6", how)
    with pytest.warns(UserWarning, match=r"checkpoints/6' is corrupt.*moved it to .*checkpoints-corrupt/6.*"
                                         r"resuming from step 3"):
        resumed = train.fit(toy_classifier(), x, y, steps=8, workdir=tmp_path, **kw)
    assert [r["loss"] for r in resumed] == [r["loss"] for r in straight]  # steps 4..8 redone from step 3
    assert (tmp_path / "checkpoints-corrupt" / "6").is_dir()  # kept for the user, not deleted
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["6", "8"]


def test_no_intact_checkpoint_is_a_one_line_error_that_moves_nothing(tmp_path):
    x, y = toy_data()
    kw = dict(batch_size=8, checkpoint_every=3, progress=False)
    train.fit(toy_classifier(), x, y, steps=6, workdir=tmp_path, **kw)
    for step in ("3", "6"):
        _corrupt(tmp_path / "checkpoints" / step, "gone")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(UsageError, match=r"no intact checkpoint in .*checkpoints.*step 6: .*step 3: .*--restart") as e:
            train.fit(toy_classifier(), x, y, steps=8, workdir=tmp_path, **kw)
    assert "\n" not in str(e.value)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["3", "6"]
    assert not (tmp_path / "checkpoints-corrupt").exists()


def test_a_config_json_alone_without_the_marker_is_never_replaced(one_error_line, task_config, tmp_path, capsys):
    """A folder without bppsa's marker holding only a config.json (the user's, or an older bppsa's) is
    not "a run that never started": it is refused with one line and left as it is (issue 25, item 1)."""
    cfg = task_config("echo_task", n=1)
    w = tmp_path / "w"
    w.mkdir()
    (w / "config.json").write_text(json.dumps({"task": "tests.runner_tasks:echo_task", "n": -1}))
    for restart in ([], ["--restart"]):
        assert cli.main(["run", str(cfg), "--workdir", str(w), *restart]) == 2
        assert "not a bppsa work directory" in one_error_line()
    assert os.listdir(w) == ["config.json"]
    assert json.loads((w / "config.json").read_text())["n"] == -1
