"""``--publish`` is name-safe and idempotent (issue 55, item 2): a preset's result (a smoke or quick run)
never takes the full run's name, so it never replaces a committed full result; the same ``--publish``
again on a finished work directory runs nothing and rewrites nothing."""

import importlib.util
import shutil
from pathlib import Path

import pytest

from experiments import cli, runner
from experiments.paper_bppsa import rnn_train
from experiments.provenance import device_label
from tests.helpers import file_tree

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = cli.config_paths()  # {name: experiments/<paper>/configs/name.py}
RNN_TRAIN = CONFIGS["rnn_train"]


pytestmark = pytest.mark.usefixtures("float32_as_in_bppsa_run")  # float64 off, as `bppsa run` runs


def _presets(path: Path) -> tuple[str, ...]:
    spec = importlib.util.spec_from_file_location(f"_presets_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.PRESETS


PRESETS = [(name, arg) for name, path in CONFIGS.items() for arg in _presets(path)]


CALLS: list[str] = []


def linked_task(config, workdir) -> dict:
    """Writes ``<name>.json``, ``<name>.md`` (which shows ``<name>.png``) and ``<name>.png``; counts its calls."""
    CALLS.append(config.name)
    workdir.entry(f"{config.name}.json").write_text('{"n": %d}' % config.n)
    workdir.entry(f"{config.name}.md").write_text(f"| n |\n|---|\n| {config.n} |\n\n![plot]({config.name}.png)\n")
    workdir.entry(f"{config.name}.png").write_bytes(b"png %d" % config.n)
    return {"n": config.n}


@pytest.mark.parametrize("name, arg", PRESETS, ids=[f"{n}:{a}" for n, a in PRESETS])
def test_a_presets_result_never_takes_the_full_runs_name(name, arg):
    path = CONFIGS[name]
    full = runner.publish_name(path, None, runner.load_config(path))
    assert runner.publish_name(path, arg, runner.load_config(path, arg)) != full
    # the full run's name set on purpose: still not the full run's result
    config = runner.load_config(path, arg)
    if "name" in config:
        runner.apply_overrides(config, {"name": full})
        assert runner.publish_name(path, arg, config) != full


def test_every_config_declares_its_presets_and_refuses_others():
    for path in CONFIGS.values():
        presets = _presets(path)
        assert isinstance(presets, tuple) and all(isinstance(a, str) and a for a in presets), path
        for arg in presets:
            runner.load_config(path, arg)
        with pytest.raises(runner.ConfigError, match="no preset 'nope'"):
            runner.load_config(path, "nope")


def test_a_preset_publishes_under_its_own_name_with_its_links(task_config, tmp_path):
    cfg = task_config("linked_task", "tests.experiments.test_publish", "PRESETS = ('smoke',)\n", name="pub", n=1)
    dest = tmp_path / "results" / device_label()
    out = runner.run(cfg, "smoke", workdir=tmp_path / "w", publish=True, results_root=tmp_path / "results")
    assert out["published"] == [str(dest / f"pub-smoke.{e}") for e in ("json", "md", "png")]
    assert (dest / "pub-smoke.md").read_text().endswith("![plot](pub-smoke.png)\n")
    assert not (dest / "pub.json").exists()


def test_the_same_publish_again_runs_nothing_and_rewrites_nothing(task_config, tmp_path, capsys):
    cfg = task_config("linked_task", "tests.experiments.test_publish", "PRESETS = ('smoke',)\n", name="pub", n=1)
    dest, w = tmp_path / "results" / device_label(), tmp_path / "w"
    CALLS.clear()
    runner.run(cfg, workdir=w, publish=False, results_root=tmp_path / "results")
    # run, look, then publish: what is published is what was measured, not a new measurement
    out = runner.run(cfg, workdir=w, publish=True, results_root=tmp_path / "results")
    assert CALLS == ["pub"] and out["published"] == [str(dest / f"pub.{e}") for e in ("json", "md", "png")]
    published, summary = file_tree(dest, mtime=True, recursive=False), (w / "summary.json").read_bytes()
    assert runner.run(cfg, workdir=w, publish=True, results_root=tmp_path / "results") == out
    assert CALLS == ["pub"] and file_tree(dest, mtime=True, recursive=False) == published and (w / "summary.json").read_bytes() == summary
    assert "finished already" in capsys.readouterr().err
    runner.run(cfg, workdir=w, restart=True, publish=True, results_root=tmp_path / "results")
    assert CALLS == ["pub", "pub"]  # --restart runs it again


def test_rnn_train_smoke_publish_leaves_the_committed_full_result_alone(tmp_path, monkeypatch):
    """The issue's case: ``bppsa run rnn_train.py:smoke --publish``, twice, in a copy of the repository's
    results: the full result's files keep their bytes; the second command measures nothing and writes nothing."""
    committed = ROOT / "experiments" / "results" / "cpu"
    dest = tmp_path / "experiments" / "results" / device_label()
    dest.mkdir(parents=True)
    for f in committed.glob("rnn_train*"):
        shutil.copy2(f, dest / f.name)
    full = {n: b for n, (b, _) in file_tree(dest, mtime=True, recursive=False).items()}
    assert set(full) == {"rnn_train.json", "rnn_train.md", "rnn_train.png"}
    calls = []
    measured = rnn_train.rnn_train

    def counted(config, workdir):
        calls.append(config.steps)
        return measured(config, workdir)
    counted.check = measured.check
    monkeypatch.setattr(rnn_train, "rnn_train", counted)
    monkeypatch.chdir(tmp_path)
    argv = ["run", f"{RNN_TRAIN}:smoke", "--workdir", str(tmp_path / "w"), "--publish"]
    assert cli.main(argv) == 0
    after = file_tree(dest, mtime=True, recursive=False)
    assert {n: after[n][0] for n in full} == full  # the full result: byte for byte
    assert set(after) - set(full) == {"rnn_train-smoke.json", "rnn_train-smoke.md", "rnn_train-smoke.png"}
    assert calls == [10]
    assert cli.main(argv) == 0
    assert calls == [10] and file_tree(dest, mtime=True, recursive=False) == after  # not measured again, no file rewritten
