"""The runner never loses a file (issue 25, part A): bppsa deletes or overwrites only files that this
run (or the run it resumes) created, inside its work directory, and never two runs at once in one
directory; odd paths, bad metrics lines and non-finite losses; user errors are one line, exit code 2."""

import json
import os
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest

from experiments import cli, runner, train, workdir
from bppsa.errors import UsageError
from tests.helpers import file_tree, toy_classifier, toy_data

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = cli.config_paths()  # {name: experiments/<paper>/configs/name.py}
RNN_TRAIN = CONFIGS["rnn_train"]
ENV = dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu")


pytestmark = pytest.mark.usefixtures("float32_as_in_bppsa_run")  # float64 off, as `bppsa run` runs


# --------------------------------------------------------------------------------------------
# Item 1 (and tests/experiments/test_faults.py::test_a_config_json_alone_without_the_marker_is_never_replaced):
# a folder bppsa did not mark is never modified.
# --------------------------------------------------------------------------------------------

def test_a_folder_bppsa_did_not_mark_is_refused_and_left_as_it_is(one_error_line, task_config, tmp_path, capsys):
    d = tmp_path / "mine"
    d.mkdir()
    (d / "config.json").write_text('{"mine": true}')
    (d / "rnn.json").write_text("my results")
    cfg = task_config("steps_task", steps=2, name="rnn")
    before = file_tree(d, text=True)
    assert cli.main(["run", str(cfg), "--workdir", str(d)]) == 2
    line = one_error_line()
    assert "not a bppsa work directory" in line and "config.json" in line
    assert file_tree(d, text=True) == before and sorted(os.listdir(d)) == ["config.json", "rnn.json"]


def test_an_empty_folder_is_taken(task_config, tmp_path):
    cfg = task_config("steps_task", steps=2, name="rnn")
    (tmp_path / "empty").mkdir()
    assert runner.run(cfg, workdir=tmp_path / "empty") == {"x": 14}


def test_a_task_never_overwrites_a_file_the_user_put_in_a_marked_folder(one_error_line, task_config, tmp_path, capsys):
    """The user's rnn.json sits in a bppsa work directory; a later run's task would write rnn.json."""
    cfg = task_config("steps_task", steps=2, name="other")
    d = tmp_path / "d"
    runner.run(cfg, workdir=d)
    (d / "rnn.json").write_text("mine")
    cfg2 = task_config("steps_task", steps=2, name="rnn")
    assert cli.main(["run", str(cfg2), "--workdir", str(d), "--restart"]) == 2
    assert "'rnn.json'" in one_error_line() and (d / "rnn.json").read_text() == "mine"


# --------------------------------------------------------------------------------------------
# Item 2: --restart after kill -9 keeps what the user added after the kill (also
# tests/experiments/test_faults.py::test_restart_after_a_sigkilled_run_still_knows_what_bppsa_wrote).
# The lock of the killed run is taken over with one line (item 7).
# --------------------------------------------------------------------------------------------

def test_restart_after_kill_keeps_the_users_later_files_and_takes_over_the_lock(task_config, tmp_path, capsys):
    cfg = task_config("steps_task", steps=5, name="toy")
    d = tmp_path / "d"
    proc = subprocess.run([sys.executable, "-m", "experiments.cli", "run", str(cfg), "--workdir", str(d)],
                          env=dict(ENV, BPPSA_TEST_KILL_AFTER="3"), cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == -9, proc.stderr
    assert workdir.read_marker(d)["written"] == ["config.json", "train"]
    holder = json.loads((d / workdir.LOCK).read_text())
    (d / "notes.txt").write_text("my notes")
    (d / "analysis").mkdir()
    (d / "analysis" / "plot.py").write_text("print(1)")
    assert cli.main(["run", str(cfg), "--workdir", str(d), "--restart"]) == 0
    err = capsys.readouterr().err
    assert f"took over the lock of {str(d)!r} from pid {holder['pid']} on {holder['host']}" in err
    assert (d / "notes.txt").read_text() == "my notes" and (d / "analysis" / "plot.py").read_text() == "print(1)"
    assert json.loads((d / "toy.json").read_text()) == {"x": 422, "steps": 5}
    assert not (d / workdir.LOCK).exists()  # released


# --------------------------------------------------------------------------------------------
# Item 7: never two runs at once in one work directory.
# --------------------------------------------------------------------------------------------

def test_a_second_run_on_a_busy_work_directory_is_refused(one_error_line, task_config, tmp_path, capsys):
    release = tmp_path / "release"
    cfg = task_config("wait_task", release=str(release))
    d = tmp_path / "d"
    first = subprocess.Popen([sys.executable, "-m", "experiments.cli", "run", str(cfg), "--workdir", str(d)],
                             env=ENV, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not (d / "started").exists() and first.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert (d / "started").exists(), first.communicate()
        marker = (d / workdir.MARKER).read_text()
        assert cli.main(["run", str(cfg), "--workdir", str(d)]) == 2
        line = one_error_line()
        assert f"in use by another bppsa run (pid {first.pid} on " in line
        assert cli.main(["run", str(cfg), "--workdir", str(d), "--restart"]) == 2  # nor deleted under it
        assert "in use" in one_error_line() and (d / workdir.MARKER).read_text() == marker
    finally:
        release.write_text("")
        out, err = first.communicate(timeout=120)
    assert first.returncode == 0, err
    assert json.loads((d / "summary.json").read_text())["summary"] == {"released": True}


# --------------------------------------------------------------------------------------------
# Item 4: config.name is a plain file name.
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name, why", [("../notes", "'/'"), ("a/b", "'/'"), ("", "empty"), ("x" * 300, "200 bytes"),
                                       (".hidden", "leading '.'"), ("config", "runner's own"), ("a\nb", "control")])
def test_a_name_that_is_not_a_plain_file_name_is_refused_before_anything_is_written(one_error_line, tmp_path, capsys, name, why):
    (tmp_path / "notes.json").write_text("the user's")
    w = tmp_path / "w"
    assert cli.main(["reproduce", "rnn-train", "--smoke", f"--config.name={name}", "--workdir", str(w)]) == 2
    line = one_error_line()
    assert "config.name must be a plain file name" in line and why in line and len(line) < 400
    assert not w.exists() and (tmp_path / "notes.json").read_text() == "the user's"


# --------------------------------------------------------------------------------------------
# Item 5: paths are never put into URLs unescaped.
# --------------------------------------------------------------------------------------------

def test_a_work_directory_with_odd_characters_resumes(tmp_path):
    x, y = toy_data()
    kw = dict(batch_size=8, checkpoint_every=3, progress=False)
    straight = train.fit(toy_classifier(), x, y, steps=8, **kw)
    odd = tmp_path / "a #b?c %41 d é ü 日本"
    train.fit(toy_classifier(), x, y, steps=6, workdir=odd, **kw)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no checkpoint judged corrupt
        resumed = train.fit(toy_classifier(), x, y, steps=8, workdir=odd, **kw)
    assert [r["loss"] for r in resumed] == [r["loss"] for r in straight]
    assert sorted(p.name for p in (odd / "checkpoints").iterdir()) == ["6", "8"]


# --------------------------------------------------------------------------------------------
# Item 6: metrics.jsonl is append-only.
# --------------------------------------------------------------------------------------------

class Killed(Exception):
    pass


def test_a_bad_metrics_line_is_skipped_and_nothing_on_disk_is_rewritten_away(tmp_path, monkeypatch):
    x, y = toy_data()
    kw = dict(batch_size=8, checkpoint_every=3, progress=False)
    straight = train.fit(toy_classifier(), x, y, steps=8, **kw)

    def kill(step):
        if step == 5:
            raise Killed

    monkeypatch.setattr(train, "after_step", kill)
    with pytest.raises(Killed):  # checkpoint at 3, records of steps 1..5
        train.fit(toy_classifier(), x, y, steps=8, workdir=tmp_path, **kw)
    monkeypatch.setattr(train, "after_step", lambda step: None)
    path = tmp_path / "metrics.jsonl"
    lines = path.read_text().splitlines()
    lines[1] = '{"step": 2, "loss": 0.69'  # garbled in the middle
    path.write_text("\n".join(lines) + "\n")
    with pytest.warns(UserWarning, match=r"metrics.jsonl' line 2 is not a JSON metrics record; skipped"):
        resumed = train.fit(toy_classifier(), x, y, steps=8, workdir=tmp_path, **kw)
    assert [r["step"] for r in resumed] == [1, 3, 4, 5, 6, 7, 8]  # the records after the bad line are kept
    assert [r["loss"] for r in resumed] == [r["loss"] for r in straight if r["step"] != 2]
    on_disk = path.read_text().splitlines()
    assert on_disk[:3] == lines[:3]  # the bad line and what precedes it: not rewritten
    assert [json.loads(line)["step"] for line in on_disk[2:]] == [3, 4, 5, 6, 7, 8]
    aside = (tmp_path / "metrics.superseded.jsonl").read_text().splitlines()
    assert aside == lines[3:]  # steps 4 and 5 of the killed run, redone: set aside, not deleted


# --------------------------------------------------------------------------------------------
# Item 8: a non-finite loss stops the run with one line; no summary claims agreement over NaN.
# --------------------------------------------------------------------------------------------

def test_a_non_finite_loss_stops_the_run_with_one_line(one_error_line, tmp_path, capsys):
    w = tmp_path / "w"
    tiny = ["--config.timing.lengths=()", "--config.steps=4"]
    assert cli.main(["reproduce", "rnn-train", "--smoke", "--config.learning_rate=1e38", *tiny,
                     "--workdir", str(w)]) == 2
    line = one_error_line()
    assert "of bptt became nan at step" in line and "smaller --config.learning_rate" in line
    assert not (w / "summary.json").exists() and not (w / "rnn_train.md").exists()
    assert cli.main(["reproduce", "rnn-train", "--smoke", "--config.learning_rate=1e-3", *tiny, "--config.methods=bptt",
                     "--workdir", str(w)]) == 0  # the corrected command runs (the NaN run never finished)
    capsys.readouterr()
    assert cli.main(["reproduce", "rnn-train", "--smoke", "--config.learning_rate=inf", "--workdir",
                     str(tmp_path / "w2")]) == 2
    assert "config.learning_rate must be a finite number > 0; got inf" in one_error_line()


def test_the_table_claims_no_agreement_over_nan():
    from experiments.paper_bppsa.rnn_train import rnn_train_table
    c = {"hidden_size": 4, "length": 8, "batch_size": 2, "steps": 3, "learning_rate": 1e38, "dtype": "float32"}
    final = {"train_loss": float("nan"), "loss": float("nan"), "accuracy": 0.1, "median_step_s": 0.0,
             "train_time_s": 0.0}
    text = rnn_train_table({"config": c, "max_loss_diff": float("nan"), "diverge_step": None,
                            "final": {"bptt": final, "bppsa": final}, "backward_times": []})
    assert "agree" not in text.replace("nothing is claimed to agree", "") and "not finite" in text


# --------------------------------------------------------------------------------------------
# Item 14: tuples inside dicts compare equal to their JSON lists: the same command resumes.
# --------------------------------------------------------------------------------------------

def test_the_same_command_with_tuples_inside_dicts_is_not_a_different_config(task_config, tmp_path):
    cfg = task_config("echo_task", n=1,
                  policies=(("bsp", {}), ("ssp", {"s": 3})), models=({"task": {"channels": (4, 8)}},))
    assert runner.run(cfg, workdir=tmp_path / "w") == {"n": 1}
    assert runner.run(cfg, workdir=tmp_path / "w") == {"n": 1}


@pytest.mark.parametrize("arg", [None, "smoke"])
def test_the_same_sync_command_on_a_finished_run_is_not_refused(tmp_path, arg):
    """sync.py's own configs (tuples of dicts holding tuples), with a task that only echoes."""
    cfg = tmp_path / "sync_echo.py"
    cfg.write_text("import importlib.util\n"
                   f"spec = importlib.util.spec_from_file_location('sync_cfg', {str(CONFIGS['sync'])!r})\n"
                   "sync = importlib.util.module_from_spec(spec)\nspec.loader.exec_module(sync)\n"
                   "def get_config(arg=None):\n    c = sync.get_config(arg)\n"
                   "    c.task = 'tests.runner_tasks:echo_task'\n    c.n = 1\n    return c\n")
    assert runner.run(cfg, arg, workdir=tmp_path / "w") == {"n": 1}
    assert runner.run(cfg, arg, workdir=tmp_path / "w") == {"n": 1}


# --------------------------------------------------------------------------------------------
# Item 3: `bppsa results --root DIR` never overwrites a README.md it did not write.
# --------------------------------------------------------------------------------------------

def test_results_never_overwrites_a_readme_it_did_not_write(one_error_line, tmp_path, capsys):
    (tmp_path / "README.md").write_text("# My project\n")
    assert cli.main(["results", "--root", str(tmp_path)]) == 2
    assert "not written by `bppsa results`" in one_error_line()
    assert (tmp_path / "README.md").read_text() == "# My project\n"
    (tmp_path / "README.md").unlink()
    assert cli.main(["results", "--root", str(tmp_path)]) == 0  # its own index it rewrites
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "x.json").write_text("{}")
    assert cli.main(["results", "--root", str(tmp_path)]) == 0
    assert "### x" in (tmp_path / "README.md").read_text()


# --------------------------------------------------------------------------------------------
# Tracebacks for user errors: one line, exit code 2.
# --------------------------------------------------------------------------------------------

SMOKE = ["reproduce", "rnn-train", "--smoke"]
RUNNER_ERRORS = {
    "workdir-is-a-file": ([*SMOKE, "--workdir", "{tmp}/afile"], "is a file, not a folder"),
    "seed-2**64": ([*SMOKE, "--config.seed=18446744073709551616", "--workdir", "{tmp}/w"],
                   "config.seed must be an int in 0..4294967295"),
    "results-root-missing": (["results", "--root", "{tmp}/missing"], "is not a folder"),
    "task-module-raises": (["run", "{tmp}/task.py", "--workdir", "{tmp}/w"],
                           "importing broken_task_module failed: RuntimeError: this module fails at import"),
    "100k-value": ([*SMOKE, "--config.steps=" + "9" * 100_000 + "x", "--workdir", "{tmp}/w"],
                   "(100016 characters): expected an int"),
    "100k-unknown-key": ([*SMOKE, "--config.stepz=" + "x" * 100_000, "--workdir", "{tmp}/w"], "unknown config key"),
}


@pytest.mark.parametrize("case", RUNNER_ERRORS)
def test_user_errors_of_the_runner_are_one_line(one_error_line, task_config, tmp_path, capsys, monkeypatch, case):
    (tmp_path / "afile").write_text("x")
    code = tmp_path / "code"
    code.mkdir()
    (code / "broken_task_module.py").write_text("raise RuntimeError('this module fails at import')\n")
    monkeypatch.syspath_prepend(str(code))
    task_config("task", module="broken_task_module")  # tmp_path/task.py: a config whose task fails at import
    argv, needle = RUNNER_ERRORS[case]
    assert cli.main([a.replace("{tmp}", str(tmp_path)) for a in argv]) == 2
    line = one_error_line()
    assert needle in line and len(line) < 1500, line[:300]
    assert not (tmp_path / "w").exists()


def test_a_seed_out_of_range_is_refused_for_every_task(task_config, tmp_path):
    cfg = task_config("echo_task", n=1, seed=0)
    with pytest.raises(UsageError, match=r"config.seed must be an int in 0\.\.4294967295 .*; got 18446744073709551616"):
        runner.run(cfg, overrides={"seed": str(2 ** 64)}, workdir=tmp_path / "w")
    assert not (tmp_path / "w").exists()


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_a_read_only_work_directory_is_one_line(one_error_line, task_config, tmp_path, capsys):
    d = tmp_path / "ro"
    d.mkdir()
    d.chmod(0o555)
    try:
        assert cli.main(["run", str(task_config("steps_task", steps=1, name="t")), "--workdir", str(d)]) == 2
        assert "not writable" in one_error_line()
    finally:
        d.chmod(0o755)


def test_a_work_directory_that_cannot_be_written_is_one_line(one_error_line, task_config, tmp_path, capsys, monkeypatch):
    """As a read-only folder does for a non-root user (the tests may run as root): opening the lock fails."""
    real_open = os.open

    def read_only(path, flags, *a, **k):
        if str(path).endswith(workdir.LOCK):
            raise PermissionError(13, "Permission denied")
        return real_open(path, flags, *a, **k)

    monkeypatch.setattr(os, "open", read_only)
    (tmp_path / "ro").mkdir()
    cfg = task_config("steps_task", steps=1, name="t")
    assert cli.main(["run", str(cfg), "--workdir", str(tmp_path / "ro")]) == 2
    assert "is not writable (Permission denied)" in one_error_line()
    assert os.listdir(tmp_path / "ro") == []


# --------------------------------------------------------------------------------------------
# Ownership by construction: the run's writer (WorkDir.entry / RunDir.entry) lists each entry
# before it exists and refuses what bppsa did not create; no audit hook, in any process.
# --------------------------------------------------------------------------------------------

def test_an_entry_is_listed_before_it_exists_even_when_the_run_is_killed_right_after(task_config, tmp_path, capsys):
    cfg = task_config("entry_then_die", entry="half")
    d = tmp_path / "d"
    proc = subprocess.run([sys.executable, "-m", "experiments.cli", "run", str(cfg), "--workdir", str(d)],
                          env=ENV, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == -9, proc.stderr
    assert workdir.read_marker(d)["written"] == ["config.json", "half"] and not (d / "half").exists()
    (d / "notes.txt").write_text("mine")
    cfg2 = task_config("write_task", n=1, die=False)
    assert cli.main(["run", str(cfg2), "--workdir", str(d), "--restart"]) == 0
    assert (d / "notes.txt").read_text() == "mine"


def test_the_writer_refuses_an_entry_bppsa_did_not_create_and_leaves_it(tmp_path):
    d = tmp_path / "d"
    d.mkdir()
    with workdir.WorkDir(d) as wd:
        wd.start(progress=False)
        (d / "notes.txt").write_text("mine")
        (d / "analysis").mkdir()
        marker = (d / workdir.MARKER).read_text()
        run_dir = wd.run_dir()
        for name in ("notes.txt", "analysis"):
            with pytest.raises(UsageError, match=f"the run tried to write '{name}' .* which bppsa did not create") as e:
                run_dir.entry(name)
            assert "\n" not in str(e.value)
        assert (d / workdir.MARKER).read_text() == marker  # nothing listed
        assert run_dir.entry("mine-next.json") == d / "mine-next.json"  # a new name: listed on disk first
        assert "mine-next.json" in workdir.read_marker(d)["written"] and not (d / "mine-next.json").exists()
        assert run_dir.entry("mine-next.json") == d / "mine-next.json"  # listed: handed out again
        wd.finish("done")
        with pytest.raises(RuntimeError, match="no run is active"):
            run_dir.entry("later.json")  # the run ended: nothing more is handed out
    assert (d / "notes.txt").read_text() == "mine" and sorted(os.listdir(d / "analysis")) == []


@pytest.mark.parametrize("name, why", [("../notes", "'/'"), ("a/b", "'/'"), ("", "empty"), (".", "leading '.'"),
                                       ("..", "leading '.'"), (workdir.MARKER, "leading '.'"),
                                       (workdir.LOCK, "leading '.'"), ("a\nb", "control"),
                                       ("x" * 300, "255 bytes"), (7, "not a string")])
def test_the_writer_refuses_odd_names(tmp_path, name, why):
    d = tmp_path / "d"
    (tmp_path / "notes").write_text("the user's")
    with workdir.WorkDir(d) as wd:
        wd.start(progress=False)
        marker = (d / workdir.MARKER).read_text()
        with pytest.raises(UsageError, match="plain names") as e:
            wd.run_dir().entry(name)
        assert why in str(e.value) and "\n" not in str(e.value) and len(str(e.value)) < 400
        assert (d / workdir.MARKER).read_text() == marker
        wd.finish("done")
    assert (tmp_path / "notes").read_text() == "the user's"


@pytest.mark.parametrize("name", ["config.json", "summary.json"])
def test_a_task_cannot_take_the_runners_own_files(tmp_path, name):
    with workdir.WorkDir(tmp_path / "d") as wd:
        wd.start(progress=False)
        with pytest.raises(UsageError, match="the runner's own file"):
            wd.run_dir().entry(name)
        wd.finish("done")


def test_an_entry_made_without_the_writer_is_never_counted_as_bppsas(task_config, tmp_path, capsys):
    cfg = task_config("bypass_task")
    d = tmp_path / "d"
    assert cli.main(["run", str(cfg), "--workdir", str(d)]) == 0
    err = capsys.readouterr().err
    assert "'raw.txt' appeared in" in err and "not counted as bppsa's" in err
    assert workdir.read_marker(d)["written"] == ["config.json", "out.txt", "summary.json"]
    cfg2 = task_config("write_task", n=1, die=False)
    assert cli.main(["run", str(cfg2), "--workdir", str(d), "--restart"]) == 0
    assert "raw.txt" not in workdir.read_marker(d)["written"] and not (d / "out.txt").exists()
    assert (d / "raw.txt").read_text() == "not through entry()"  # --restart kept it: not bppsa's


def test_fit_handed_the_run_directory_lists_its_entries_first(tmp_path):
    x, y = toy_data()
    d = tmp_path / "d"
    with workdir.WorkDir(d) as wd:
        wd.start(progress=False)
        train.fit(toy_classifier(), x, y, steps=2, batch_size=8, progress=False, workdir=wd.run_dir())
        wd.finish("done")
    assert workdir.read_marker(d)["written"] == sorted(
        ["metrics.jsonl", "metrics.superseded.jsonl", "checkpoints", "checkpoints-corrupt"])
    assert (d / "metrics.jsonl").exists() and (d / "checkpoints").is_dir()


# Wraps sys.addaudithook to record, for each hook added from Python, the file that added it and the
# file of the hook's code; a probe's last line is that list as JSON.
AUDIT_PROBE = """
import json, os, sys
added, real = [], sys.addaudithook
def _add(hook):
    code = getattr(getattr(hook, "__func__", hook), "__code__", None)
    added.append([os.path.abspath(sys._getframe(1).f_code.co_filename),
                  os.path.abspath(code.co_filename) if code is not None else ""])
    real(hook)
sys.addaudithook = _add
"""


def _audit_hooks(code: str) -> tuple[list, list]:
    """(every audit hook ``code`` adds, those added by bppsa's own modules): each hook as [the file that
    added it, the file of its code]; bppsa's when either file lies in bppsa/ or experiments/."""
    proc = subprocess.run([sys.executable, "-c", AUDIT_PROBE + code + "\nprint(json.dumps(added))\n"], env=ENV,
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    added = json.loads(proc.stdout.strip().splitlines()[-1])
    ours = [h for h in added if any(Path(f).is_relative_to(ROOT / d) for f in h if f
                                    for d in ("bppsa", "experiments"))]
    return added, ours


def test_no_audit_hook_anywhere(task_config, tmp_path):
    """Ownership is recorded by the writer: bppsa installs no audit hook (one can never be removed from
    a process, sees every open of it, and is blind to child processes and native writers). Libraries
    may add their own (the newest filelock does, on import): only hooks from bppsa's modules count."""
    assert not [p for p in [*(ROOT / "bppsa").rglob("*.py"), *(ROOT / "experiments").rglob("*.py")]
                if "addaudithook" in p.read_text()]
    cfg = task_config("steps_task", steps=2, name="toy")
    _, ours = _audit_hooks(f"from experiments import runner\n"
                           f"runner.run({str(cfg)!r}, workdir={str(tmp_path / 'd')!r})\n")
    assert ours == []
    assert json.loads((tmp_path / "d" / "toy.json").read_text()) == {"x": 14, "steps": 2}


def test_the_audit_hook_probe_tells_bppsas_hooks_from_a_librarys():
    """The probe above counts a hook added from a file of experiments/ and ignores one a library adds
    (code compiled under those file names stands in for the modules)."""
    library = "/site-packages/filelock/_core/_fork.py"
    bppsa_file = str(ROOT / "experiments" / "runner.py")
    hook = "import sys\nsys.addaudithook(lambda event, args: None)\n"
    added, ours = _audit_hooks(f"exec(compile({hook!r}, {library!r}, 'exec'))\n"
                               f"exec(compile({hook!r}, {bppsa_file!r}, 'exec'))\n"
                               f"import experiments.runner\n")
    assert added[:2] == [[library, library], [bppsa_file, bppsa_file]]  # then the real libraries' own, if any
    assert ours == [[bppsa_file, bppsa_file]]
