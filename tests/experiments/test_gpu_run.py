"""The device-machine run (experiments/gpu/run.sh -> experiments.paper_bppsa.gpu_run): it refuses to run
without a GPU unless asked for a dry run, and its dry run works with ml_collections, librosa,
soundfile and ray unimportable (as on the device machine), writing summary.json's schema."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from experiments.paper_bppsa import gpu_run

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "experiments" / "gpu" / "run.sh"
METHODS = {"bptt_plain", "bptt_unrolled", "bptt", "bppsa_blelloch", "bppsa_sequential"}  # the names of every table
NAMES = {"bptt_plain": "bptt_unroll1", "bptt": "bptt", "bppsa_blelloch": "bppsa_blelloch", "bppsa_sequential": "bppsa_sequential"}


def _blocked_env(tmp_path, **extra):
    """The environment of the device machine: the four packages raise ImportError on import
    (stub packages first on PYTHONPATH), JAX on the CPU, no forced host devices."""
    stubs = tmp_path / "blocked"
    for name in gpu_run.BLOCKED:
        (stubs / name).mkdir(parents=True)
        (stubs / name / "__init__.py").write_text(
            f"raise ImportError('{name} is not installed on the device machine')\n")
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "BPPSA_ALLOW_CPU")}
    return {**env, "PYTHON": sys.executable, "JAX_PLATFORMS": "cpu",
            "PYTHONPATH": os.pathsep.join([str(stubs), str(ROOT)]), **extra}


def test_the_gpu_run_imports_none_of_the_packages_the_device_machine_lacks():
    code = ("import sys, experiments.paper_bppsa.gpu_run as g; "
            "print(sorted(m for m in g.BLOCKED if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0 and r.stdout.strip() == "[]", (r.stdout, r.stderr[-2000:])


def test_gpu_script_fails_loudly_without_a_gpu(tmp_path):
    r = subprocess.run(["bash", str(SCRIPT), str(tmp_path / "out")], env=_blocked_env(tmp_path),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1
    assert "no GPU visible" in r.stderr and "--dry-run" in r.stderr


def _check_point(p):
    assert p["part"] in ("gpu", "cpu16", "parallel")
    for key in ("cell", "T", "B", "H", "ms", "best_unroll", "peak_mb", "grad_rel_err"):
        assert key in p, (key, p)
    assert p["peak_mb"] is None  # CPU: no device memory stats
    assert p["H"] == 20 or p["part"] == "parallel"
    if p["part"] == "parallel":
        _check_parallel_point(p)
    elif p.get("sweep") in ("T", "B", "irmas", "sizes"):
        assert set(p["ms"]) == METHODS | {"bppsa_fused"}  # no cuDNN without CUDA; the fused kernel interpreted
        assert p["ms"]["bptt_unrolled"] == min(p["ms_by_unroll"].values())
        assert p["ms"]["bptt_unrolled"] == p["ms_by_unroll"][str(p["best_unroll"])]
        assert p["ms"]["bptt_plain"] == p["ms_by_unroll"]["1"]
        for key, name in NAMES.items():  # each is the median of that method's samples
            lo, hi = p["spread_ms"][name]
            assert lo <= p["ms"][key] <= hi
    elif p.get("sweep") == "sequence-parallel":
        assert set(p["ms"]) == {"bppsa_sharded_backward", "forward_sharded"}


def _check_parallel_point(p):
    assert set(p["ms"]) == set(gpu_run.PARALLEL_PAIRS)  # tuned BPTT = sequential/bptt
    for key, (lo, hi) in p["spread_ms"].items():
        assert lo <= p["ms"][key] <= hi
    assert set(p["newton"]) == {"newton/bppsa", "quasi/bppsa"}  # NewtonInfo of the parallel forwards only
    for info in p["newton"].values():
        assert info["converged"] and not info["fell_back"] and 1 <= info["iterations"] <= 50
    assert abs(p["loss_diff"]) < 1e-3  # every forward computes the same loss
    assert p["auto"].split("/")[0] in ("sequential", "newton", "quasi")  # what auto runs there
    assert {"forward_model/sequential", "forward_model/newton", "forward_model/quasi"} <= set(p["predicted_ms"])
    assert ("roofline/sequential/bppsa_blelloch" in p["predicted_ms"]) == (p["cell"] in ("RNN", "GRU"))


def test_parallel_part_times_every_forward_with_its_newton_info(tmp_path):
    """Part ``parallel`` in this process at the dry run's sizes, one point of each kind of cell."""
    pl = gpu_run.plan(True)
    pl["parallel"] = (("structured", "blockgru", 2, 3, 4, 6, 2),)  # the T sweep's points: the slow dry run
    s = gpu_run.Summary(tmp_path / "out")
    gpu_run.run_parallel(s, {**pl, "budgets": {**pl["budgets"], "parallel": 600}}, deadline=gpu_run.time.monotonic() + 600)
    got = s.write()
    assert got["skipped"] == [] and [(p["sweep"], p["cell"]) for p in got["points"]] == [("structured", "BlockGRU k=2")]
    for p in got["points"]:
        _check_point(p)


@pytest.mark.slow  # ~13 s; the default run checks the parallel part of the same script (below)
def test_cpu16_part_dry_run_with_blocked_imports(tmp_path):
    out = tmp_path / "out"
    env = _blocked_env(tmp_path, XLA_FLAGS="--xla_force_host_platform_device_count=2")
    r = subprocess.run([sys.executable, "-m", "experiments.paper_bppsa.gpu_run", str(out), "--part", "cpu16",
                        "--dry-run", "--budget", "120"], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    s = json.loads((out / "summary.json").read_text())
    assert s["provenance"]["parts"]["cpu16"]["backend"] == "cpu" and s["skipped"] == []
    kinds = [(p["part"], p["sweep"], p.get("devices")) for p in s["points"]]
    assert kinds == [("cpu16", "sizes", None), ("cpu16", "sequence-parallel", 1), ("cpu16", "sequence-parallel", 2)]
    for p in s["points"]:
        _check_point(p)
    lines = (out / "points.jsonl").read_text().splitlines()
    assert [json.loads(line)["point"] for line in lines] == s["points"]  # written point by point


@pytest.mark.slow
def test_gpu_script_dry_run_with_blocked_imports(tmp_path):
    out = tmp_path / "out"
    env = _blocked_env(tmp_path, BPPSA_ALLOW_CPU="1")
    r = subprocess.run(["bash", str(SCRIPT), str(out), "--budget", "480"], env=env, capture_output=True,
                       text=True, timeout=800)
    assert r.returncode == 0, r.stderr[-3000:]
    s = json.loads((out / "summary.json").read_text())
    assert s["skipped"] == [], s["skipped"]
    assert s["provenance"]["dry_run"] is True and s["provenance"]["backend"] == "cpu"
    assert set(s["provenance"]["parts"]) == {"gpu", "cpu16"}
    sweeps = [(p["part"], p["sweep"]) for p in s["points"]]
    assert sweeps == [("gpu", "T"), ("gpu", "B"), ("gpu", "irmas"), ("gpu", "precision"), ("parallel", "T"),
                      ("parallel", "structured"), ("cpu16", "sizes"), ("cpu16", "sequence-parallel"),
                      ("cpu16", "sequence-parallel")]
    for p in s["points"]:
        _check_point(p)
    prec = s["points"][3]
    assert set(prec["grad_rel_err"]) == {"bppsa:highest", "bppsa:high", "bppsa:default", "bptt:default",
                                         "bptt:highest"}
    assert all(0 < e < 1e-4 for e in prec["grad_rel_err"].values())  # float32 against float64
    assert s["points"][2]["cell"] == "GRU" and s["points"][2]["setting"] == "s"
    assert s["points"][5]["cell"] == "BlockGRU k=2" and s["points"][5]["head_size"] == 2
    assert "times relative to bppsa" in r.stdout


def test_budget_skips_a_point_that_would_not_fit_and_summary_keeps_every_record(tmp_path, monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(gpu_run.time, "monotonic", lambda: clock[0])
    b = gpu_run.Budget(60, deadline=1e9)
    assert b.allows(1e9)  # nothing measured yet: the first point always runs
    b.record(10, 20.0)  # 10 units of work took 20 s
    clock[0] += 20
    assert b.allows(35) and not b.allows(50)  # 20·√3.5 = 37 s fits in the 40 s left, 20·√5 = 45 s does not
    assert gpu_run.Budget(60, deadline=110).end == 110  # the whole run's deadline caps the part's
    clock[0] = 161
    assert not b.allows(1)

    s = gpu_run.Summary(tmp_path / "out")
    s.set_provenance("gpu", {"backend": "gpu"})
    s.add({"part": "gpu", "T": 1})
    s.add(skipped={"part": "gpu", "T": 2, "reason": "time budget"})
    s.set_provenance("cpu16", {"backend": "cpu"})
    got = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert got == {"provenance": {"backend": "gpu", "parts": {"gpu": {"backend": "gpu"}, "cpu16": {"backend": "cpu"}}},
                   "points": [{"part": "gpu", "T": 1}], "skipped": [{"part": "gpu", "T": 2, "reason": "time budget"}]}
    assert not (tmp_path / "out" / "summary.json.tmp").exists()
