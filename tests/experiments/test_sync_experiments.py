"""The synchronization experiment configs and tasks at smoke size.

(tests/experiments/test_configs.py also runs every config's smoke variant through `bppsa run`, and
tests/test_notebooks.py executes notebooks/04_sync.ipynb with BPPSA_NOTEBOOK_SMOKE=1.)
"""

import json
from pathlib import Path

import pytest

from experiments.cli import config_path
from experiments.runner import load_config

ROOT = Path(__file__).resolve().parents[2]


def _config(name, arg=None):
    return load_config(config_path(name), arg)


@pytest.mark.parametrize("name, module", [("sync", "sync"), ("zipline", "zipline"), ("sync_ray", "sync")])
def test_configs_have_task_and_smoke(name, module):
    full, smoke, quick = _config(name), _config(name, "smoke"), _config(name, "quick")
    assert full.task.startswith(f"experiments.paper_sync.{module}:") and smoke.task == quick.task == full.task
    with pytest.raises(ValueError, match="smoke"):
        _config(name, "huge")
    if name == "sync":
        labels = [p[0] for p in full.policies]
        assert labels == ["bsp", "asp", "ssp", "ssp", "ssp", "dssp"] + ["elasticbsp"] * 5
        assert [p[1].get("R") for p in full.policies[6:]] == [15, 30, 60, 120, 240]
        assert tuple(full.cluster.means) == (1.0, 1.0, 2.5, 2.5)


def test_sync_ray_policies_parse():
    from experiments.paper_sync.sync import parse_policies
    assert parse_policies(_config("sync_ray").policies) == [
        ("bsp", {}), ("asp", {}), ("ssp", {"s": 3}), ("dssp", {}), ("elasticbsp", {"R": 30})]
    assert parse_policies("dssp:s_L=3;r_max=12") == [("dssp", {"s_L": 3, "r_max": 12})]
    with pytest.raises(ValueError, match="key=<int>"):
        parse_policies("ssp:s=three")
    with pytest.raises(ValueError, match="at least one policy"):
        parse_policies(" , ")


def test_zipline_runtimes_smoke_writes_results(tmp_path):
    from experiments.paper_sync.zipline import zipline_runtimes
    cfg = _config("zipline", "smoke")
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
    cpu = ROOT / "experiments" / "results" / "cpu"
    for name in ("sync_models", "zipline_runtimes", "sync_ray"):
        rec = json.loads((cpu / f"{name}.json").read_text())
        assert rec["provenance"]["git_commit"] and rec["provenance"]["command"].startswith("bppsa ") and rec["rows"]
        assert (cpu / f"{name}.md").exists()
    table = (cpu / "sync_models.md").read_text()
    for label in ("BSP", "ASP", "SSP s=3", "SSP s=6", "SSP s=15", "DSSP(3,12)", "ElasticBSP R=15",
                  "ElasticBSP R=30", "ElasticBSP R=60", "ElasticBSP R=120", "ElasticBSP R=240"):
        assert f"| {label} |" in table


@pytest.mark.parametrize("override, needle", [
    ("--config.cluster.comm=-5", "config.cluster: comm must be a finite number >= 0; got -5.0"),
    ("--config.cluster.sigma=-1", "config.cluster: sigma must be a finite number >= 0; got -1.0"),
    ("--config.cluster.means=1,nan", "config.cluster: means must be finite numbers > 0; got means[1] = nan"),
    ("--config.seeds=0", "config.seeds must be an int >= 1"),
])
def test_sync_models_refuses_a_bad_cluster_in_one_line(tmp_path, capsys, override, needle):
    """comm = -5 used to hang forever (iterations ending before they start); sigma = -1 was a traceback."""
    from experiments import cli
    argv = ["run", str(config_path("sync")) + ":smoke", override, "--workdir", str(tmp_path / "w")]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.splitlines() == [err] and err.startswith("bppsa run: error: ") and needle in err, err
    assert not (tmp_path / "w").exists()


@pytest.mark.parametrize("field, value, needle", [
    ("max_time", float("nan"), "config.models[0]: max_time must be a finite number"),
    ("eval_every", 1e-9, "config.models[0]: max_time / eval_every must be at most"),
    ("batch_size", 0, "config.models[0]: batch_size must be an int >= 1"),
    ("learning_rate", float("inf"), "config.models[0].learning_rate must be a finite number > 0"),
    ("target", 1.5, "config.models[0].target must be an accuracy in (0, 1]"),
    ("task", {"name": "imagenet"}, "config.models[0]: task name must be one of"),
])
def test_sync_models_checks_every_model_before_it_runs(tmp_path, field, value, needle):
    """max_time = nan and eval_every = 1e-9 used to hang; the task declares its checks for the runner."""
    from bppsa.errors import UsageError
    from experiments.paper_sync.sync import check_sync_models, sync_models
    assert sync_models.check is check_sync_models  # what the runner calls before anything is written
    cfg = _config("sync", "smoke")
    cfg.models = ({**cfg.models[0], field: value},)
    with pytest.raises(UsageError) as e:
        sync_models(cfg, tmp_path / "w")
    assert needle in str(e.value), e.value
    assert not (tmp_path / "w").exists()
