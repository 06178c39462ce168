"""The synchronization experiment configs and tasks (smoke sizes), and the notebook (slow)."""

import importlib.util
import json
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _config(name, arg=None):
    spec = importlib.util.spec_from_file_location(name, ROOT / "experiments" / "configs" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.get_config(arg)


@pytest.mark.parametrize("name", ["sync_models", "zipline_runtimes"])
def test_configs_have_task_and_smoke(name):
    full, smoke = _config(name), _config(name, "smoke")
    assert full.task.startswith("bppsa.sync.experiments:") and smoke.task == full.task
    with pytest.raises(ValueError, match="smoke"):
        _config(name, "huge")
    if name == "sync_models":
        labels = [p[0] for p in full.policies]
        assert labels == ["bsp", "asp", "ssp", "ssp", "ssp", "dssp"] + ["elasticbsp"] * 5
        assert [p[1].get("R") for p in full.policies[6:]] == [15, 30, 60, 120, 240]
        assert tuple(full.cluster.means) == (1.0, 1.0, 2.5, 2.5)


def test_zipline_runtimes_smoke_writes_results(tmp_path):
    from bppsa.sync.experiments import zipline_runtimes
    cfg = _config("zipline_runtimes", "smoke")
    out = zipline_runtimes(cfg, tmp_path)
    rec = json.loads((tmp_path / f"{cfg.name}.json").read_text())
    assert rec["provenance"]["jax"] and len(rec["rows"]) == len(cfg.workers) * len(cfg.horizons)
    for r in rec["rows"]:
        ranges = [r[f"{m}_range"] for m in ("window", "zipline", "zipline_opt", "bsearch")]
        assert max(ranges) - min(ranges) < 1e-12
        assert r["grid_scan_range"] >= r["optimal_range"] - 1e-12
    assert (tmp_path / f"{cfg.name}.md").read_text().startswith("Median wall time")
    assert (tmp_path / f"{cfg.name}.png").stat().st_size > 0 and out["files"]


def test_committed_results_have_provenance():
    found = sorted((ROOT / "experiments" / "results").glob("*/sync_models.json")) + \
        sorted((ROOT / "experiments" / "results").glob("*/zipline_runtimes.json"))
    if not found:
        pytest.skip("no committed sync results")
    for f in found:
        rec = json.loads(f.read_text())
        assert rec["provenance"]["git_commit"] is not None and rec["rows"]


@pytest.mark.slow
def test_sync_models_smoke(tmp_path):
    from bppsa.sync.experiments import sync_models
    cfg = _config("sync_models", "smoke")
    out = sync_models(cfg, tmp_path)
    assert {r["policy"] for r in out["rows"]} == {"BSP", "DSSP(3,12)", "ElasticBSP R=15"}
    assert (tmp_path / f"{cfg.name}.png").exists()


@pytest.mark.slow
def test_notebook_runs_in_smoke_mode(monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    path = ROOT / "notebooks" / "04_sync.ipynb"
    nb = nbformat.read(path, as_version=4)
    assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code"), "commit the notebook without outputs"
    monkeypatch.setenv("BPPSA_NOTEBOOK_SMOKE", "1")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("MPLBACKEND", "Agg")
    nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(ROOT / "notebooks")}}).execute()


def test_notebook_is_committed_without_outputs_and_has_smoke_parameters():
    nbformat = pytest.importorskip("nbformat")
    nb = nbformat.read(ROOT / "notebooks" / "04_sync.ipynb", as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(not c.get("outputs") and c.get("execution_count") is None for c in code)
    assert "BPPSA_NOTEBOOK_SMOKE" in code[0].source and code[0].source.startswith("# Parameters")
