"""experiments/results/README.md is generated from the committed results and kept in sync."""

import json
import shlex
import sys
import types
from pathlib import Path

import pytest

from experiments import index as results
from experiments.provenance import provenance

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "experiments" / "results"
PROVENANCE_KEYS = {"date", "command", "backend", "device_kind", "cpu", "jax", "jaxlib", "flax", "optax",
                   "git_commit"}


def test_results_index_is_in_sync():
    index = RESULTS / results.INDEX
    assert index.exists(), f"{index} is missing: run `bppsa results` (python -m experiments.index)"
    assert index.read_text() == results.render_index(RESULTS), \
        f"{index} is out of date: run `bppsa results` (python -m experiments.index)"


@pytest.mark.parametrize("path", sorted(RESULTS.glob("*/*.json")), ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_committed_results_carry_provenance(path):
    record = json.loads(path.read_text())
    missing = PROVENANCE_KEYS - set(record.get("provenance", {}))
    assert not missing, f"{path}: provenance lacks {sorted(missing)}"
    assert record["provenance"]["command"]


def test_readme_links_resolve():
    """Every relative link of the front page and of the experiments README points at a file."""
    import re
    for page in (ROOT / "README.md", ROOT / "experiments" / "README.md"):
        for link in re.findall(r"\]\(([^)#:]+)\)", page.read_text()):
            assert (page.parent / link).exists(), f"{page.relative_to(ROOT)} links to missing {link}"


def test_render_and_write(tmp_path):
    root = tmp_path / "results"
    (root / "cpu").mkdir(parents=True)
    record = {"title": "B thing", "provenance": provenance("bppsa run b")}
    (root / "cpu" / "b_thing.json").write_text(json.dumps(record))
    (root / "cpu" / "b_thing.md").write_text("| x | y |\n|---|---|\n| 1 | 2 |\n")
    (root / "cpu" / "b_thing.png").write_bytes(b"\x89PNG")
    (root / "cpu" / "a_thing.json").write_text(json.dumps({"value": 1}))
    (root / "cpu" / "notes.md").write_text("# How it was made fast\n\nlong text\n")
    assert results.write_index(root)
    text = (root / results.INDEX).read_text()
    assert text.index("### a_thing") < text.index("### b_thing — B thing")  # sorted by file name
    assert "| 1 | 2 |" in text and "![b_thing](cpu/b_thing.png)" in text
    assert "`bppsa run b`" in text and "no provenance recorded" in text
    assert "[How it was made fast](cpu/notes.md)" in text and "long text" not in text  # linked, not copied
    assert not results.write_index(root)  # idempotent
    assert results.main(["--root", str(root), "--check"]) == 0
    (root / "cpu" / "c.json").write_text(json.dumps({"provenance": {}}))
    (root / "cpu" / "c.md").write_text("new table\n")
    assert results.main(["--root", str(root), "--check"]) == 1
    assert results.main(["--root", str(root)]) == 0
    assert "new table" in (root / results.INDEX).read_text()
    assert results.main(["--root", str(root), "--check"]) == 0


def test_empty_and_broken_results(tmp_path):
    assert "No results committed yet." in results.render_index(tmp_path / "none")
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "bad.json").write_text("{not json")
    with pytest.raises(ValueError, match="bad.json"):
        results.render_index(tmp_path)


def _draw(record, path):
    Path(path).write_bytes(b"\x89PNG" + json.dumps(record["value"]).encode())


def test_plots_are_redrawn_by_bppsa_experiments_functions(tmp_path, monkeypatch):
    module = types.ModuleType("experiments.extensions.demo_plots")
    module.draw = _draw
    monkeypatch.setitem(sys.modules, "experiments.extensions.demo_plots", module)
    (tmp_path / "cpu").mkdir()
    record = {"value": 7, "plot": "experiments.extensions.demo_plots:draw"}
    (tmp_path / "cpu" / "thing.json").write_text(json.dumps(record))
    (tmp_path / "cpu" / "other.json").write_text(json.dumps({"provenance": {}}))
    assert results.regenerate_plots(tmp_path) == [tmp_path / "cpu" / "thing.png"]
    assert (tmp_path / "cpu" / "thing.png").read_bytes() == b"\x89PNG7"
    assert not (tmp_path / "cpu" / "other.png").exists()


@pytest.mark.parametrize("spec", ["os:system", "experiments.index:main", "experiments.cli:main", "bppsa.nn:RNN",
                                  "experiments.extensionsX.m:f", "experiments", "experiments.extensions.demo_plots", 3])
def test_plots_refuse_functions_outside_bppsa_experiments(tmp_path, monkeypatch, spec):
    module = types.ModuleType("experiments.extensions.demo_plots")
    module.draw = _draw
    monkeypatch.setitem(sys.modules, "experiments.extensions.demo_plots", module)
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "evil.json").write_text(json.dumps({"plot": spec}))
    good = {"value": 1, "plot": "experiments.extensions.demo_plots:draw"}
    (tmp_path / "cpu" / "good.json").write_text(json.dumps(good))
    with pytest.raises(ValueError, match=r"evil\.json.*experiments\.<paper>\.<module>:<function>"):
        results.regenerate_plots(tmp_path)
    assert results.main(["--root", str(tmp_path), "--plots"]) == 2
    assert not (tmp_path / "cpu" / "evil.png").exists() and not (tmp_path / "cpu" / "good.png").exists()


def test_plots_never_import_a_module_a_result_names(tmp_path, monkeypatch, capsys):
    """A result naming "os:system" or a module of its own is refused before anything is imported or called."""
    code = tmp_path / "code"
    code.mkdir()
    (code / "planted_plot.py").write_text(f"open({str(tmp_path / 'imported')!r}, 'w').close()\n"
                                          "def draw(record, path):\n    open(path, 'w').close()\n")
    monkeypatch.syspath_prepend(str(code))
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "a.json").write_text(json.dumps({"plot": "planted_plot:draw"}))
    (tmp_path / "cpu" / "b.json").write_text(json.dumps({"plot": "os:system"}))
    assert results.main(["--root", str(tmp_path), "--plots"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "planted_plot:draw" in err and "os:system" in err
    assert "planted_plot" not in sys.modules and not (tmp_path / "imported").exists()
    assert not (tmp_path / "cpu" / "a.png").exists() and not (tmp_path / "cpu" / "b.png").exists()


# --------------------------------------------------------------------------------------------
# One way to produce a result: every committed result names the run of a config that made it.
# --------------------------------------------------------------------------------------------



def config_of(command: str) -> Path | None:
    """The config a result's command ran, when it is a run of the one runner: ``bppsa run PATH[:ARG]
    [--config.KEY=VALUE ...] [--workdir W] [--publish]``, ``bppsa reproduce NAME [--quick|--smoke] ...``
    with the runner's flags only, or ``bppsa bench`` (a run of the sweep config); None otherwise. A
    path is found by its file name among today's configs (configs moved with their papers)."""
    import shlex

    from experiments import cli
    try:
        words = shlex.split(command)
    except ValueError:
        return None
    if words[:1] != ["bppsa"] or len(words) < 2:
        return None
    if words[1] == "bench":
        return cli.config_path("rnn_sweep")
    if words[1] not in ("run", "reproduce") or len(words) < 3:
        return None
    flags, i = words[3:], 0
    while i < len(flags):  # only the runner's own flags
        flag = flags[i]
        if flag.startswith("--config.") or flag in ("--publish", "--restart", "--quick", "--smoke"):
            i += 1
        elif flag == "--workdir" and i + 1 < len(flags):
            i += 2
        else:
            return None
    paths = cli.config_paths()
    if words[1] == "reproduce":
        return paths.get(words[2].replace("-", "_"))
    return paths.get(Path(words[2].split(":")[0]).stem)


@pytest.mark.parametrize("path", sorted(RESULTS.glob("*/*.json")), ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_every_result_is_the_run_of_a_config(path):
    command = json.loads(path.read_text())["provenance"]["command"]
    if path.parent.name == "gpu":  # the device machine has no ml_collections, hence no runner: its one script
        # the kernels compiled for it here (make machine-code), and pararnn-torch's beside them
        # (make machine-code-peer): predictions, no run
        compiled = {"machine_code": "experiments.gpu.machine_code",
                    "pararnn_machine_code": "experiments.gpu.peer_machine_code"}
        if path.stem in compiled:
            assert shlex.split(command)[:3] == ["python", "-m", compiled[path.stem]], command
            return
        runs = [shlex.split(c) for c in (command or "").split(";")]
        assert runs and all(len(r) >= 2 and r[0] == "experiments/gpu/run.sh" for r in runs), \
            f"{path.name} was made by {command!r}; expected runs of experiments/gpu/run.sh OUT [flags]"
        return
    config = config_of(command)
    assert config is not None and config.exists(), \
        f"{path.name} was made by {command!r}, not by `bppsa run CONFIG`; expected a run of a config"


def test_config_of_reads_the_runners_commands():
    assert config_of("bppsa run experiments/configs/rnn_train.py --workdir /tmp/x --publish").name == "rnn_train.py"
    assert config_of("bppsa run experiments/paper_bppsa/configs/rnn_sweep.py:quick --config.repeats=3").name \
        == "rnn_sweep.py"
    assert config_of("bppsa reproduce zipline").name == "zipline.py"
    assert config_of("bppsa bench --T 10 --B 1").name == "rnn_sweep.py"
    assert config_of("bppsa reproduce sparse-vgg --parts flops --workdir /tmp/flops") is None  # a flag of no runner
    assert config_of("python experiments/bptt_unroll.py out") is None
    assert config_of("bppsa run experiments/configs/no_such.py") is None
