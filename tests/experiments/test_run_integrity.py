"""A failed run never reports success: a failed part of a task, a work directory removed under a run,
a full disk or a damaged resume end in a non-zero exit status and one line; ``--publish`` replaces a
committed result only with a complete one, all of its files or none."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bppsa.errors import UsageError
from experiments import RunFailed, cli, publish, runner, train
from experiments.provenance import device_label
from experiments.workdir import MARKER
from tests.helpers import file_tree

ROOT = Path(__file__).resolve().parents[2]
ENV = dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu")


def _marker(d: Path) -> dict:
    return json.loads((d / MARKER).read_text())


def _committed(tmp_path: Path) -> Path:
    """A results folder holding a committed "pub" result with an old companion, and another result."""
    dest = tmp_path / "results" / device_label()
    dest.mkdir(parents=True)
    for name, text in {"pub.json": '{"n": 0}', "pub.md": "old", "pub.png": "old png", "pub_drift.png": "old",
                       "pub_real.json": "{}", "pub_real.png": "theirs", "pub_real_drift.png": "theirs"}.items():
        (dest / name).write_text(text)
    return dest


PUB = dict(name="pub", n=1, fail_part=False, extra=False, keep_partial=False)


# --------------------------------------------------------------------------------------------
# A failed part fails the run, unless the config keeps partial results (then they say so).
# --------------------------------------------------------------------------------------------

def test_a_failed_part_fails_the_run_and_publishes_nothing(one_error_line, task_config, tmp_path, capsys):
    dest = _committed(tmp_path)
    before = file_tree(dest)
    cfg = task_config("part_task", **PUB)
    with pytest.raises(RunFailed, match="replica 2 failed: killed by SIGKILL"):
        runner.run(cfg, None, {"fail_part": "True"}, workdir=tmp_path / "w", publish=True,
                   results_root=tmp_path / "results")
    assert file_tree(dest) == before
    assert _marker(tmp_path / "w")["status"] == "failed"
    assert "replica 2 failed" in json.loads((tmp_path / "w" / "summary.json").read_text())["failed"]
    assert cli.main(["run", str(cfg), "--config.fail_part=True", "--workdir", str(tmp_path / "w2")]) == 1
    line = one_error_line("bppsa run: failed: replica 2 failed")
    assert "--config.keep_partial=True" in line


def test_kept_partial_results_say_so_and_are_never_published(task_config, tmp_path, capsys):
    dest = _committed(tmp_path)
    before = file_tree(dest)
    cfg = task_config("part_task", **PUB)
    w = tmp_path / "w"
    assert cli.main(["run", str(cfg), "--config.fail_part=True", "--config.keep_partial=True",
                     "--workdir", str(w)]) == 0
    assert "results are partial" in capsys.readouterr().err
    summary = json.loads((w / "summary.json").read_text())["summary"]
    assert summary["partial"] is True and summary["failed_parts"][0]["part"] == "replica 2"
    assert _marker(w)["status"] == "partial"
    with pytest.raises(RunFailed, match="partial results .*nothing was published"):
        runner.run(cfg, None, {"fail_part": "True", "keep_partial": "True"}, workdir=w, publish=True,
                   results_root=tmp_path / "results")
    assert file_tree(dest) == before


def test_hetero_real_run_with_failing_replicas_and_publish_changes_no_committed_file(tmp_path):
    """The issue's case: the :real config, replicas that time out, --publish: exit 1, results untouched."""
    results = tmp_path / "experiments" / "results" / device_label()
    results.mkdir(parents=True)
    committed = {"hetero_dp_real.json": '{"old": 1}', "hetero_dp_real.md": "old table",
                 "hetero_dp_real.png": "old png", "hetero_dp_real_drift.png": "old drift"}
    for name, text in committed.items():
        (results / name).write_text(text)
    config = ROOT / "experiments" / "paper_hetero" / "configs" / "hetero_dp.py"
    proc = subprocess.run([sys.executable, "-m", "experiments.cli", "run", f"{config}:real", "--workdir",
                           str(tmp_path / "w"), "--config.processes.timeout_s=2", "--publish"],
                          cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stderr
    assert "the real-process block failed" in proc.stderr and "Traceback" not in proc.stderr
    assert {p.name: p.read_text() for p in results.iterdir()} == committed
    assert _marker(tmp_path / "w")["status"] == "failed"


# --------------------------------------------------------------------------------------------
# --publish: all files of a complete result or none; stale companions go.
# --------------------------------------------------------------------------------------------

def test_publish_replaces_every_file_and_removes_stale_companions_only(task_config, tmp_path, capsys):
    dest = _committed(tmp_path)
    cfg = task_config("part_task", **PUB)
    out = runner.run(cfg, workdir=tmp_path / "w", publish=True, results_root=tmp_path / "results")
    assert out["published"] == [str(dest / "pub.json"), str(dest / "pub.md")]
    assert sorted(p.name for p in dest.iterdir()) == ["pub.json", "pub.md", "pub_real.json", "pub_real.png",
                                                     "pub_real_drift.png"]  # the other result's files stay
    assert (dest / "pub.json").read_text() == '{"n": 1}' and (dest / "pub_real.png").read_text() == "theirs"
    assert "removed" in capsys.readouterr().err
    runner.run(cfg, None, {"extra": "True"}, workdir=tmp_path / "w2", publish=True,
               results_root=tmp_path / "results")
    assert (dest / "pub_extra.png").read_bytes() == b"png 1"


def test_a_publish_that_fails_midway_changes_nothing(task_config, tmp_path, monkeypatch):
    import errno
    dest = _committed(tmp_path)
    before = file_tree(dest)
    cfg = task_config("part_task", **{**PUB, "extra": True})
    copies = []

    def copy_then_fill(src, dst, *a, **k):
        copies.append(dst)
        if len(copies) == 2:
            raise OSError(errno.ENOSPC, "No space left on device", str(dst))
        return shutil.copy2(src, dst, *a, **k)

    monkeypatch.setattr(publish.shutil, "copy2", copy_then_fill)
    with pytest.raises(RunFailed, match="No space left on device; nothing was published"):
        runner.run(cfg, workdir=tmp_path / "w", publish=True, results_root=tmp_path / "results")
    assert file_tree(dest) == before  # no file replaced, no staged copy left behind


# --------------------------------------------------------------------------------------------
# The work directory removed or altered: the run fails; the next run says so in one line.
# --------------------------------------------------------------------------------------------

def test_a_work_directory_removed_during_the_run_fails_it(one_error_line, task_config, tmp_path, capsys):
    cfg = task_config("vanish_task", n=1)
    w = tmp_path / "w"
    assert cli.main(["run", str(cfg), "--workdir", str(w)]) == 1
    one_error_line("bppsa run: failed: the work directory")
    marker = _marker(w)  # the run recreated part of it: its marker says what happened
    assert marker["status"] == "failed" and "removed or replaced" in marker["damaged"]
    before = file_tree(w)
    for argv in ([], ["--config.n=2"]):  # resumed or changed: refused in one line, nothing changed
        assert cli.main(["run", str(cfg), *argv, "--workdir", str(w)]) == 2
        assert "--restart" in one_error_line("bppsa run: error: the last run in")
        assert file_tree(w) == before
    assert cli.main(["run", str(cfg), "--workdir", str(w), "--restart"]) == 1  # the task removes it again
    capsys.readouterr()


def test_an_entry_removed_after_a_run_is_one_line_on_the_next_run(one_error_line, task_config, tmp_path, capsys):
    cfg = task_config("part_task", **PUB)
    w = tmp_path / "w"
    assert cli.main(["run", str(cfg), "--workdir", str(w)]) == 0
    (w / "pub.md").unlink()
    capsys.readouterr()
    assert cli.main(["run", str(cfg), "--workdir", str(w)]) == 2
    line = one_error_line("bppsa run: error: 'pub.md' of the work directory")
    assert "is gone since the last run ended" in line
    assert cli.main(["run", str(cfg), "--workdir", str(w), "--restart"]) == 0
    assert (w / "pub.md").exists()


def test_a_removed_metrics_file_is_one_line_not_an_index_error(tmp_path):
    """The issue's case: a finished training run's metrics.jsonl deleted, then the same command again."""
    from flax import nnx

    from bppsa import cells
    from bppsa.nn import SequenceClassifier
    from bppsa.tasks.bitstream import make_bitstream
    x, y = make_bitstream(32, 8)

    def model():
        return SequenceClassifier(cells.RNN(1, 8), 10, backward="bptt", rngs=nnx.Rngs(0))

    train.fit(model(), x, y, steps=3, batch_size=8, workdir=tmp_path / "m", progress=False)
    (tmp_path / "m" / "metrics.jsonl").unlink()
    with pytest.raises(UsageError, match="metrics.jsonl' is gone, but the checkpoint at step 3"):
        train.fit(model(), x, y, steps=3, batch_size=8, workdir=tmp_path / "m", progress=False)


# --------------------------------------------------------------------------------------------
# A full disk: one line naming the path, the resume hint; the same command resumes.
# --------------------------------------------------------------------------------------------

def _with_file_size_limit(limit: int, cmd: list[str]) -> list[str]:
    """``cmd`` run with RLIMIT_FSIZE = ``limit`` bytes: a write past it fails with EFBIG (Python ignores
    SIGXFSZ), as a full disk fails one with ENOSPC."""
    return [sys.executable, "-c", "import os, resource, sys; resource.setrlimit(resource.RLIMIT_FSIZE, "
            f"({limit}, {limit})); os.execv(sys.argv[1], sys.argv[1:])", *cmd]


def test_a_full_disk_is_one_line_and_the_same_command_resumes(task_config, tmp_path):
    """Files may grow to 600 bytes (RLIMIT_FSIZE: a real OS write error, EFBIG): the toy's metrics file
    outgrows it; the run fails in one line naming it; without the limit the same command finishes it."""
    cfg, w = task_config("steps_task", name="toy", steps=60), tmp_path / "w"
    cmd = [sys.executable, "-m", "experiments.cli", "run", str(cfg), "--workdir", str(w)]
    proc = subprocess.run(_with_file_size_limit(600, cmd), cwd=ROOT, env=ENV, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert f"cannot write in {str(w)!r}: File too large" in lines[0]  # Python's write error names no file
    assert "re-run the same command to resume" in lines[0]
    assert subprocess.run(cmd, cwd=ROOT, env=ENV, capture_output=True, timeout=120).returncode == 0
    straight = tmp_path / "straight"
    assert cli.main(["run", str(cfg), "--workdir", str(straight)]) == 0
    for name in ("toy.json", "train/metrics.jsonl"):
        assert (w / name).read_text() == (straight / name).read_text()


@pytest.mark.slow
def test_a_full_disk_under_orbax_is_one_line(tmp_path):
    """rnn_train's orbax checkpoints outgrow a 2000-byte file limit: one line, not orbax's ~300."""
    cfg = ROOT / "experiments" / "paper_bppsa" / "configs" / "rnn_train.py"
    cmd = [sys.executable, "-m", "experiments.cli", "run", f"{cfg}:smoke", "--config.timing.lengths=()",
           "--workdir", str(tmp_path / "w")]
    # not the test session's persistent XLA cache (conftest.py): its writes hit the same limit and JAX
    # warns once per entry, which is JAX's report about the test harness's cache, not the run's
    env = {k: v for k, v in ENV.items() if k != "JAX_COMPILATION_CACHE_DIR"}
    proc = subprocess.run(_with_file_size_limit(2000, cmd), cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "File too large" in lines[0] and str(tmp_path / "w") in lines[0], proc.stderr
    assert subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, timeout=300).returncode == 0


# --------------------------------------------------------------------------------------------
# One-line errors: a config missing a key its task reads, a dangling symlink, `bppsa results`.
# --------------------------------------------------------------------------------------------

def test_a_config_missing_a_key_the_task_reads_is_one_line(one_error_line, task_config, tmp_path, capsys):
    cfg = task_config("missing_key_task", n=1)
    assert cli.main(["run", str(cfg), "--workdir", str(tmp_path / "w")]) == 2
    line = one_error_line("bppsa run: error: the task 'tests.runner_tasks:missing_key_task' reads config key ")
    assert "'learning_rate'" in line


def test_a_dangling_symlink_work_directory_is_named_as_such(one_error_line, task_config, tmp_path, capsys):
    (tmp_path / "w").symlink_to(tmp_path / "nowhere")
    assert cli.main(["run", str(task_config("echo_task", n=1)), "--workdir", str(tmp_path / "w")]) == 2
    line = one_error_line("bppsa run: error: --workdir")
    assert "symbolic link to" in line and "which does not exist" in line
    assert not (tmp_path / "nowhere").exists()


@pytest.mark.parametrize("content, needle", [
    (b'{"provenance": ', "is not valid JSON (Expecting value at line 1"),
    (b'{"x": "\xff\xfe"}', "is not UTF-8 text (byte 7)"),
    (b'{"provenance": [1, 2]}', '"provenance" is a JSON list; it is an object'),
    (b'[1, 2]', "holds a JSON list; a result's record is a JSON object"),
])
def test_bppsa_results_on_a_damaged_result_is_one_line(one_error_line, tmp_path, capsys, content, needle):
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "bad.json").write_bytes(content)
    assert cli.main(["results", "--root", str(tmp_path)]) == 2
    line = one_error_line("bppsa results: error: ")
    assert needle in line and "bad.json" in line
