"""The README's results section is generated from experiments/results/ and kept in sync."""

import json
from pathlib import Path

import pytest

from bppsa import results
from bppsa.provenance import provenance

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "experiments" / "results"
PROVENANCE_KEYS = {"date", "command", "backend", "device_kind", "cpu", "jax", "jaxlib", "flax", "optax",
                   "git_commit"}


def test_readme_results_section_is_in_sync():
    block = results.extract((ROOT / "README.md").read_text())
    assert block is not None, "README.md lacks the <!-- results:begin/end --> markers"
    assert block == results.render(RESULTS, ROOT), \
        "README.md's results section is out of date: run `bppsa results` (python -m bppsa.results)"


@pytest.mark.parametrize("path", sorted(RESULTS.glob("*/*.json")), ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_committed_results_carry_provenance(path):
    record = json.loads(path.read_text())
    missing = PROVENANCE_KEYS - set(record.get("provenance", {}))
    assert not missing, f"{path}: provenance lacks {sorted(missing)}"
    assert record["provenance"]["command"]


def test_render_and_update(tmp_path):
    root = tmp_path / "experiments" / "results"
    (root / "cpu").mkdir(parents=True)
    (root / "cpu" / "b_thing.json").write_text(json.dumps({"title": "B thing", "provenance": provenance("bppsa run b")}))
    (root / "cpu" / "b_thing.md").write_text("| x | y |\n|---|---|\n| 1 | 2 |\n")
    (root / "cpu" / "b_thing.png").write_bytes(b"\x89PNG")
    (root / "cpu" / "a_thing.json").write_text(json.dumps({"value": 1}))
    readme = tmp_path / "README.md"
    readme.write_text("# Title\n\nText.\n")
    assert results.update_readme(readme, root)
    text = readme.read_text()
    assert text.startswith("# Title\n\nText.\n\n" + results.BEGIN)
    block = results.extract(text)
    assert block.index("#### a_thing") < block.index("#### B thing")  # sorted by file name
    assert "| 1 | 2 |" in block and "![b_thing](experiments/results/cpu/b_thing.png)" in block
    assert "`bppsa run b`" in block and "no provenance recorded" in block
    assert not results.update_readme(readme, root)  # idempotent
    assert results.main(["--root", str(root), "--readme", str(readme), "--check"]) == 0
    (root / "cpu" / "c.md").write_text("new table\n")
    assert results.main(["--root", str(root), "--readme", str(readme), "--check"]) == 1
    assert results.main(["--root", str(root), "--readme", str(readme)]) == 0
    assert "new table" in readme.read_text() and readme.read_text().count(results.BEGIN) == 1
    assert readme.read_text().startswith("# Title\n\nText.\n")


def test_empty_and_broken_results(tmp_path):
    assert "No results committed yet." in results.render(tmp_path / "none", tmp_path)
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "bad.json").write_text("{not json")
    with pytest.raises(ValueError, match="bad.json"):
        results.render(tmp_path, tmp_path)


def test_plots_are_regenerated_from_the_json(tmp_path):
    src = RESULTS / "cpu" / "rnn_train.json"
    record = json.loads(src.read_text())
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "rnn_train.json").write_text(json.dumps(record | {"plot": "bppsa.experiments.rnn_train:plot_rnn_train"}))
    (tmp_path / "cpu" / "other.json").write_text(json.dumps({"provenance": {}}))
    assert results.regenerate_plots(tmp_path) == [tmp_path / "cpu" / "rnn_train.png"]
    assert (tmp_path / "cpu" / "rnn_train.png").read_bytes()[:4] == b"\x89PNG"
    assert not (tmp_path / "cpu" / "other.png").exists()
