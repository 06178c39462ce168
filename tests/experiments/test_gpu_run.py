"""The device-machine run (experiments/gpu/run.sh -> experiments.paper_bppsa.gpu_run): it refuses to run
without a GPU unless asked for a dry run, and its dry run works with ml_collections, librosa,
soundfile and ray unimportable (as on the device machine), writing summary.json's schema; where the
time goes (backward alone, forward alone, kernel launches: experiments.paper_bppsa.launches); the
pararnn-torch peer's wheel carried and its column skipped with a reason without CUDA."""

import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

from experiments.paper_bppsa import gpu_run, launches, pararnn_gpu

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
        extra = {gpu_run.PARALLEL_FUSED} | ({gpu_run.PARARNN} if p["cell"] == "BlockGRU k=1" else set())
        assert set(gpu_run.PARALLEL_PAIRS) <= set(p["ms"]) <= set(gpu_run.PARALLEL_PAIRS) | extra  # tuned BPTT = seq/bptt
        if p.get("sweep") == "structured":  # each extra column: timed, or its failure's reason
            assert all(k in p["ms"] or k in p["errors"] for k in extra)
        if p["cell"] == "BlockGRU k=1" and gpu_run.jax.default_backend() == "cpu":
            assert "no CUDA" in p["errors"][gpu_run.PARARNN]
        for key, (lo, hi) in p["spread_ms"].items():
            assert lo <= p["ms"][key] <= hi
        assert {"newton/bppsa", "quasi/bppsa"} <= set(p["newton"]) <= {"newton/bppsa", "quasi/bppsa",
                                                                       gpu_run.PARALLEL_FUSED}  # the parallel forwards
        for info in p["newton"].values():
            assert info["converged"] and not info["fell_back"] and 1 <= info["iterations"] <= 50
        assert abs(p["loss_diff"]) < 1e-3  # every forward computes the same loss
        assert p["auto"].split("/")[0] in ("sequential", "newton", "quasi")  # what auto runs there
        assert {"forward_model/sequential", "forward_model/newton", "forward_model/quasi"} <= set(p["predicted_ms"])
        assert ("roofline/sequential/bppsa_blelloch" in p["predicted_ms"]) == (p["cell"] in ("RNN", "GRU"))
    elif p.get("sweep") in ("T", "B", "irmas", "sizes"):
        # no cuDNN without CUDA; the fused kernels interpreted; a fused variant not there yet costs its column only
        assert METHODS | {"bppsa_fused"} <= set(p["ms"]) <= METHODS | set(gpu_run.FUSED)
        assert all(k in p["ms"] or k in p["errors"] for k in gpu_run.FUSED)
        if "backward_ms" in p:
            # A point with :func:`gpu_run.measure_detail`'s records (on the CPU: no cuDNN).
            assert {"bptt_plain", "bptt", "bppsa_blelloch", "bppsa_fused"} <= set(p["backward_ms"])
            assert set(gpu_run.FORWARD_DETAIL) == set(p["forward_ms"])
            assert all(v > 0 for v in [*p["backward_ms"].values(), *p["forward_ms"].values()])
            assert set(p["launches"]) == set(p["ms"]) - {"bptt_unrolled", "bppsa_sequential"}  # every timed training step
            for c in p["launches"].values():
                assert c["exact"] and c["total"] >= 1
            # the plain scan's forward and backward loops each launch their bodies T times
            assert p["launches"]["bptt_plain"]["total"] >= 2 * p["T"]
            assert sum(loop["trip_count"] for loop in p["launches"]["bptt_plain"]["loops"]) >= 2 * p["T"]
        assert p["ms"]["bptt_unrolled"] == min(p["ms_by_unroll"].values())
        assert p["ms"]["bptt_unrolled"] == p["ms_by_unroll"][str(p["best_unroll"])]
        assert p["ms"]["bptt_plain"] == p["ms_by_unroll"]["1"]
        for key, name in NAMES.items():  # each is the median of that method's samples
            lo, hi = p["spread_ms"][name]
            assert lo <= p["ms"][key] <= hi
    elif p.get("sweep") == "sequence-parallel":
        assert set(p["ms"]) == {"bppsa_sharded_backward", "forward_sharded"}


# the default run: head size 1 (the diagonal cell, with the pararnn-torch peer's column); head size 2 (2x2
# blocks): make test-all
@pytest.mark.parametrize("k", [pytest.param(2, marks=pytest.mark.slow), 1])
def test_parallel_part_times_every_forward_with_its_newton_info(tmp_path, k):
    """Part ``parallel`` in this process at the dry run's sizes, a point of the structured cell."""
    pl = gpu_run.plan(True)
    # the T sweep's points: the slow dry run; head size 1 is where the pararnn-torch peer is (skipped: no CUDA)
    pl["parallel"] = (("structured", "blockgru", k, 3, 4, 6, 2),)
    s = gpu_run.Summary(tmp_path / "out")
    gpu_run.run_parallel(s, {**pl, "budgets": {**pl["budgets"], "parallel": 600}}, deadline=gpu_run.time.monotonic() + 600)
    got = s.write()
    assert got["skipped"] == [] and [(p["sweep"], p["cell"]) for p in got["points"]] == [
        ("structured", f"BlockGRU k={k}")]
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
                      ("parallel", "structured"), ("parallel", "structured"), ("cpu16", "sizes"),
                      ("cpu16", "sequence-parallel"), ("cpu16", "sequence-parallel")]
    for p in s["points"]:
        _check_point(p)
    prec = s["points"][3]
    assert set(prec["grad_rel_err"]) == {"bppsa:highest", "bppsa:high", "bppsa:default", "bptt:default",
                                         "bptt:highest"}
    assert all(0 < e < 1e-4 for e in prec["grad_rel_err"].values())  # float32 against float64
    assert s["points"][2]["cell"] == "GRU" and s["points"][2]["setting"] == "s"
    assert s["points"][5]["cell"] == "BlockGRU k=1" and "no CUDA" in s["points"][5]["errors"][gpu_run.PARARNN]
    assert s["points"][6]["cell"] == "BlockGRU k=2" and s["points"][6]["head_size"] == 2
    assert "backward_ms" in s["points"][0] and "launches" in s["points"][0]  # the T sweep's point: where time goes
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


def test_the_dry_runs_t_sweep_point_says_where_the_time_goes(tmp_path):
    """The T sweep of the dry run (the plan's detail_T): backward alone, forward alone and launches
    per method next to the training step, the fused columns timed or their failure recorded."""
    pl = gpu_run.plan(True)
    assert pl["T_sweep"][0] in pl["detail_T"]
    s = gpu_run.Summary(tmp_path / "out")
    gpu_run.run_gpu(s, {**pl, "budgets": {**pl["budgets"], "gpu/T": 600}}, gpu_run.time.monotonic() + 600,
                    only="gpu/T")
    got = s.write()
    assert got["skipped"] == [] and len(got["points"]) == 1
    p = got["points"][0]
    assert {"backward_ms", "forward_ms", "launches"} <= set(p) and "detail_skipped" not in p
    _check_point(p)


def test_a_point_asking_for_detail_drops_it_when_the_budget_is_short(tmp_path, monkeypatch):
    clock = [0.0]
    monkeypatch.setattr(gpu_run.time, "monotonic", lambda: clock[0])
    b = gpu_run.Budget(100, deadline=1e9)
    b.record(10, 60.0)  # 10 units took 60 s; 100 s left: the point fits, twice its time (DETAIL_WORK) does not
    seen = []

    def measure(detail):
        seen.append(detail)
        return {"part": "gpu", "ms": {}}
    s = gpu_run.Summary(tmp_path / "out")
    gpu_run.sweep(s, b, [({"part": "gpu", "T": 1}, 10, {"detail": True})], measure)
    assert seen == [False] and s.write()["points"] == [{"part": "gpu", "ms": {}, "detail_skipped": "time budget"}]


def test_launches_of_a_scan_grow_with_its_length():
    scan = lambda x: jax.lax.scan(lambda c, a: (jnp.tanh(c * a + 1.0), c), x[0], x)[1]  # noqa: E731
    counts = {T: launches.count(scan, jnp.ones((T, 4))) for T in (10, 100)}
    for T, c in counts.items():
        (loop,) = c["loops"]
        assert loop["trip_count"] == T and loop["body"] >= 1 and c["exact"]
        assert c["total"] >= T * loop["body"]  # every trip launches the body's kernels
    assert counts[100]["total"] - counts[10]["total"] == 90 * counts[10]["loops"][0]["body"]


def test_one_fusion_counts_one_launch_and_a_jitted_partial_is_lowered_as_it_is():
    c = launches.count(lambda x: jnp.tanh(x * 2.0 + 1.0), jnp.ones(8))
    assert c["total"] == 1 and c["loops"] == [] and c["by_kind"] == {"fusion": 1}
    f = jax.jit(lambda a, b: jnp.tanh(a @ b))
    a = jnp.ones((4, 4))
    f(a, a)
    assert launches.count(functools.partial(f, a), a)["total"] >= 1


_GPU_HLO = """HloModule jit_step, entry_computation_layout={(f32[16,20]{1,0})->f32[16,20]{1,0}}

%fused_computation (param_0: f32[16,20]) -> f32[16,20] {
  %param_0 = f32[16,20]{1,0} parameter(0)
  ROOT %tanh.1 = f32[16,20]{1,0} tanh(f32[16,20]{1,0} %param_0)
}

%body (p: (s32[], f32[16,20])) -> (s32[], f32[16,20]) {
  %p = (s32[], f32[16,20]{1,0}) parameter(0)
  %gte.0 = s32[] get-tuple-element((s32[], f32[16,20]{1,0}) %p), index=0
  %gte.1 = f32[16,20]{1,0} get-tuple-element((s32[], f32[16,20]{1,0}) %p), index=1
  %gemm = (f32[16,20]{1,0}, s8[0]{0}) custom-call(f32[16,20]{1,0} %gte.1, f32[16,20]{1,0} %gte.1), custom_call_target="__cublas$gemm"
  %gte.2 = f32[16,20]{1,0} get-tuple-element((f32[16,20]{1,0}, s8[0]{0}) %gemm), index=0
  %fusion = f32[16,20]{1,0} fusion(f32[16,20]{1,0} %gte.2), kind=kLoop, calls=%fused_computation
  %copy.1 = f32[16,20]{1,0} copy(f32[16,20]{1,0} %fusion)
  ROOT %t = (s32[], f32[16,20]{1,0}) tuple(s32[] %gte.0, f32[16,20]{1,0} %copy.1)
}

%cond (p.1: (s32[], f32[16,20])) -> pred[] {
  %p.1 = (s32[], f32[16,20]{1,0}) parameter(0)
  %gte.3 = s32[] get-tuple-element((s32[], f32[16,20]{1,0}) %p.1), index=0
  %c = s32[] constant(1000)
  ROOT %lt = pred[] compare(s32[] %gte.3, s32[] %c), direction=LT
}

%command_buffer (q: f32[16,20]) -> f32[16,20] {
  %q = f32[16,20]{1,0} parameter(0)
  ROOT %k = f32[16,20]{1,0} custom-call(f32[16,20]{1,0} %q), custom_call_target="__gpu$xla.gpu.triton"
}

ENTRY %main (x: f32[16,20]) -> f32[16,20] {
  %x = f32[16,20]{1,0} parameter(0)
  %zero = s32[] constant(0)
  %init = (s32[], f32[16,20]{1,0}) tuple(s32[] %zero, f32[16,20]{1,0} %x)
  %w1 = (s32[], f32[16,20]{1,0}) while((s32[], f32[16,20]{1,0}) %init), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"1000"},"known_init_step":{"init":"0","step":"1"}}
  %w2 = (s32[], f32[16,20]{1,0}) while((s32[], f32[16,20]{1,0}) %w1), condition=%cond, body=%body
  %g = f32[16,20]{1,0} get-tuple-element((s32[], f32[16,20]{1,0}) %w2), index=1
  ROOT %call = f32[16,20]{1,0} call(f32[16,20]{1,0} %g), to_apply=%command_buffer
}
"""


def test_launches_from_gpu_hlo_text_count_gemms_triton_and_loop_trips():
    c = launches.count_text(_GPU_HLO)
    # w1: 1000 trips of (gemm + fusion); w2: no trip count, its body once; then one Triton kernel in a call
    assert c["by_kind"] == {"gemm": 1001, "fusion": 1001, "triton": 1} and c["total"] == 2003
    assert c["loops"] == [{"trip_count": 1000, "body": 2}, {"trip_count": None, "body": 2}]
    assert c["unknown_trip_counts"] == 1 and not c["exact"] and c["copies"] == 1001 and c["top_level"] == 0
    with pytest.raises(ValueError, match="ENTRY"):
        launches.count_text("HloModule empty")


def test_the_pararnn_wheel_is_small_and_installs_offline_where_it_is_carried(tmp_path):
    """experiments/gpu/fetch_wheels.sh puts the wheel there (git-ignored); without it, or without
    torch and CUDA (here), the peer's column is a recorded reason, never a failure."""
    none = pararnn_gpu.ensure_pararnn(tmp_path)
    assert none[0] is None or none[1] == "installed"
    wheels = sorted(pararnn_gpu.WHEELS.glob("pararnn_torch-*.whl"))
    if wheels:
        assert sum(w.stat().st_size for w in pararnn_gpu.WHEELS.iterdir()) < 10 * 2 ** 20
    r = subprocess.run([sys.executable, "-m", "experiments.paper_bppsa.pararnn_gpu", "--I", "4", "--H", "8", "--T",
                        "16", "--B", "2"], capture_output=True, text=True, timeout=120, cwd=ROOT,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    rec = json.loads(r.stdout.strip().splitlines()[-1])
    assert r.returncode == 0 and ("skipped" in rec or rec["scan_backend"] == "fused"), rec


def test_fused_columns_read_their_predicted_time_from_the_machine_code_records():
    """measured / predicted: a fused column's prediction is the machine-code record's launches of the
    point (by name and pair; the Newton kernels times the iterations run); the ratio only on a GPU."""
    ours = json.loads(gpu_run.MACHINE_CODE.read_text())
    step = {(s["point"], s["pair"]): s["us"] for s in ours["steps"]}
    p = {"part": "gpu", "sweep": "T", "cell": "RNN", "T": 30000, "B": 16, "H": 20,
         "ms": {"bppsa_fused": 5.0, "bptt_fused": 4.0, "bptt": 9.0}}
    got = gpu_run.fused_predictions(p, ours, on_gpu=False)
    assert set(got) == {"bppsa_fused", "bptt_fused"}
    assert got["bppsa_fused"]["point"] == "gpu/T rnn T=30000"
    assert got["bppsa_fused"]["predicted_ms"] == pytest.approx(step[("gpu/T rnn T=30000", "sequential/bppsa")] / 1e3)
    assert got["bptt_fused"]["predicted_ms"] == pytest.approx(step[("gpu/T rnn T=30000", "sequential/bptt")] / 1e3)
    assert got["bppsa_fused"]["ratio"] is None and "n/a (CPU)" in gpu_run.fused_table({"points": [
        {**p, "predicted_fused": got}]})
    on_gpu = gpu_run.fused_predictions(p, ours, on_gpu=True)["bppsa_fused"]
    assert on_gpu["ratio"] == pytest.approx(5.0 / on_gpu["predicted_ms"])
    # the Newton kernels run once an iteration: 5 iterations
    q = {"part": "parallel", "sweep": "structured", "kind": "blockgru", "cell": "BlockGRU k=1", "head_size": 1,
         "T": 4096, "B": 16, "H": 256, "ms": {gpu_run.PARALLEL_FUSED: 3.0},
         "newton": {gpu_run.PARALLEL_FUSED: {"iterations": 5}}}
    xs = [x for x in ours["launches"] if x["point"] == "parallel blockgru head=1 H=256" and x["pair"] == "newton/bppsa"]
    newton = sum(x["predicted"]["us"] for x in xs if x["label"] in gpu_run.NEWTON_KERNELS)
    rest = sum(x["predicted"]["us"] for x in xs) - newton
    assert newton > 0 and gpu_run.fused_predictions(q, ours, on_gpu=False)[gpu_run.PARALLEL_FUSED][
        "predicted_ms"] == pytest.approx((rest + 5 * newton) / 1e3)
    # pararnn-torch's forward, from its own record
    peer = json.loads(gpu_run.PEER_MACHINE_CODE.read_text())
    (pp,) = [x for x in peer["points"] if x["name"] == "parallel blockgru head=1 H=256"]
    r = gpu_run.fused_predictions({**q, "ms": {gpu_run.PARARNN: 7.0}, "pararnn": {"forward_ms": 2.0, "iters": 3}},
                                  ours, peer, on_gpu=True)[gpu_run.PARARNN]
    assert r["predicted_ms"] == pytest.approx(pp["forward"]["pararnn_us"] / 1e3)
    assert r["ratio"] == pytest.approx(2.0 / r["predicted_ms"])
    # a point the check did not compile (the dry run's sizes): no prediction, no ratio
    d = gpu_run.fused_predictions({**p, "T": 12}, ours, on_gpu=False)["bppsa_fused"]
    assert d["predicted_ms"] is None and d["ratio"] is None
    # the dry run's IRMAS point: the full point's name, another T: not that point's prediction
    irmas = {"part": "gpu", "sweep": "irmas", "setting": "s", "cell": "GRU", "T": 8, "B": 16, "H": 20,
             "ms": {"bppsa_fused": 1.0}}
    assert gpu_run.fused_predictions(irmas, ours, on_gpu=False)["bppsa_fused"]["predicted_ms"] is None
    full_T = gpu_run.IRMAS_SHAPES["s"][1]
    assert gpu_run.fused_predictions({**irmas, "T": full_T}, ours, on_gpu=False)["bppsa_fused"]["predicted_ms"] > 0
    assert gpu_run.fused_predictions({**p, "part": "cpu16"}, ours, on_gpu=True) == {}  # XLA CPU: nothing to predict
