"""The site's figures (experiments.figures) draw from the committed results, and the GPU publisher
redraws them when a run lands."""

import json
import shutil
from pathlib import Path

from experiments import figures
from experiments.paper_bppsa import gpu_publish

ROOT = Path(__file__).resolve().parents[2]


def test_every_figure_draws_from_the_committed_results(tmp_path):
    drawn = figures.draw_all(figures.RESULTS, tmp_path)
    skipped = [name for name, path in drawn.items() if path is None]
    assert not skipped, f"figures without their committed result: {skipped}"
    assert len(drawn) >= 10
    for path in drawn.values():
        assert path is not None and path.parent == tmp_path and path.stat().st_size > 10_000


def test_the_committed_figures_are_the_scripts():
    """Every figure the script draws is committed under docs/_static/figures and shown by the site."""
    pages = "".join(p.read_text() for p in (ROOT / "docs").rglob("*.md") if "_build" not in p.parts)
    names = {p.name for p in figures.OUT.glob("*.png")}
    assert len(names) >= len(figures.FIGURES), "run `python -m experiments.figures`; commit docs/_static/figures"
    missing = [n for n in names if n not in pages]
    assert not missing, f"figures no page of docs/ shows: {missing}"


def test_a_missing_result_skips_its_figure(tmp_path):
    (tmp_path / "cpu").mkdir()
    shutil.copy(figures.RESULTS / "cpu" / "rnn-sweep.json", tmp_path / "cpu")
    drawn = figures.draw_all(tmp_path, tmp_path / "out")
    assert drawn["cpu_speedup_T"] and drawn["cpu_speedup_B"] and drawn["gpu_irmas"] is None


def test_the_gpu_publisher_draws_the_figures(tmp_path):
    summary = json.loads((figures.RESULTS / "gpu" / "h200.json").read_text())
    summary["provenance"] = summary["runs"][0]
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    results = tmp_path / "results"
    assert gpu_publish.main([str(tmp_path / "summary.json"), "--name", "h100", "--results", str(results),
                             "--figures", str(tmp_path / "figs")]) == 0
    assert (results / "gpu" / "h100.md").exists()
    assert {"gpu_speedup_T.png", "gpu_irmas.png"} <= {p.name for p in (tmp_path / "figs").glob("*.png")}
