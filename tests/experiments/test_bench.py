"""Tests for the timing harness, cost model, `auto` policy and chunked BPPSA (no test asserts a time)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments import bench, gradient
from bppsa import cells, host
from experiments.paper_bppsa import rnn_sweep
from tests.reference import rnn_grads, scan_grads


@pytest.mark.parametrize("cell", [cells.RNN(1, 4), pytest.param(cells.GRU(2, 3), marks=pytest.mark.slow)],
                         ids=["rnn", "gru"])
def test_component_functions_compute_the_one_timed_gradient(close, cell):
    T, B = 7, 2
    params = cell.init(jax.random.key(0), jnp.float64)
    xs = jax.random.normal(jax.random.key(1), (T, B, cell.input_size), jnp.float64)
    h0 = cell.unflatten_state(0.1 * jnp.ones((B, cell.state_size)))
    fns = bench.component_functions(cell, params, xs, h0, seed=4)
    assert set(fns) == set(bench.COMPONENTS)
    R = gradient.readout(cell, T, B, jnp.float64, seed=4)
    ref = scan_grads(cell, params, xs, h0, lambda out: gradient.loss(cell, out, R))
    close(fns["bppsa_backward_full"](), ref, rtol=1e-9, atol=1e-11)
    close(fns["bptt_backward"](), ref, rtol=1e-9, atol=1e-11)
    close(fns["step_bppsa"](), ref[0], rtol=1e-9, atol=1e-11)
    close(fns["step_bptt"](), ref[0], rtol=1e-9, atol=1e-11)
    # the scan + contraction pieces reproduce the parameter gradient of the full backward
    dparams, _ = fns["param_grads"]()
    close(dparams, ref[0], rtol=1e-9, atol=1e-11)
    gs, _ = fns["bppsa_backward"]()
    assert gs.shape == (T, B, cell.state_size)
    jac = fns["jacobian"]()
    S = cell.state_size
    if isinstance(cell.jacobian_structure, cells.Scaled):  # the RNN: only the factors (A, Wt) are generated
        assert jac[0].shape == (T, B, S) and jac[1].shape == (S, S)
    else:
        assert jac.shape == (T, B, S, S)
    assert fns["forward"]().shape == (T, B, cell.state_size)


def test_time_components_schema():
    cell = cells.RNN(1, 3)
    params = cell.init(jax.random.key(0), jnp.float32)
    xs = jnp.ones((5, 2, 1), jnp.float32)
    h0 = jnp.zeros((2, 3), jnp.float32)
    out = bench.time_components(cell, params, xs, h0, repeats=2, warmup=0)
    for name in bench.COMPONENTS:
        rec = out[name]
        assert set(rec) == {"median", "min", "max", "repeats"}
        assert rec["repeats"] == 2
        assert 0 < rec["min"] <= rec["median"] <= rec["max"]
    med = {k: out[k]["median"] for k in bench.COMPONENTS}
    assert out["speedup_backward"] == med["bptt_backward"] / med["bppsa_backward_full"]
    assert out["speedup_scan"] == med["bptt_backward"] / med["bppsa_backward"]
    assert out["speedup_step"] == med["step_bptt"] / med["step_bppsa"]
    assert out["shape"] == {"T": 5, "B": 2, "I": 1, "S": 3, "dtype": "float32"}


def test_backward_times_times_the_one_gradient_per_method(close, monkeypatch):
    seen = {}
    monkeypatch.setattr(bench, "time_interleaved", lambda fns, repeats: seen.update(fns) or {k: {} for k in fns})
    cell = cells.RNN(1, 3)
    params = cell.init(jax.random.key(0), jnp.float64)
    out = bench.backward_times(cell, params, 6, 2, methods=("bptt", "bppsa", "auto"), scan="sequential",
                               dtype=jnp.float64)
    assert set(out) == set(seen) == {"bptt", "bppsa", "auto"}
    _, xs, h0, R = gradient.problem(cell, 6, 2, dtype=jnp.float64)
    ref = scan_grads(cell, params, xs, h0, lambda o: gradient.loss(cell, o, R))[0]
    for f in seen.values():
        close(f(), ref, rtol=1e-9, atol=1e-11)
    with pytest.raises(ValueError, match="methods.*'lax'"):
        bench.backward_times(cell, params, 6, 2, methods=("lax",))


def test_time_interleaved_rejects_bad_arguments():
    for kw in ({"repeats": 0}, {"warmup": -1}, {"block": 1}):
        with pytest.raises(ValueError, match=next(iter(kw))):
            host.time_interleaved({"f": lambda: jnp.zeros(1)}, **kw)


def test_time_interleaved_rotates_blocks_and_drops_their_first_call():
    calls = []
    fns = {k: (lambda k=k: calls.append(k) or jnp.zeros(1)) for k in "abc"}
    out = host.time_interleaved(fns, repeats=3, warmup=0, block=3)
    # blocks of 3 calls (the first block's first call compiles), the order rotated every round
    assert calls == list("aaabbbccc" "bbbcccaaa" "cccaaabbb")
    assert all(out[k]["repeats"] == 3 * 2 for k in "abc")  # the first call of each block is dropped
    assert host.time_fn(lambda: jnp.zeros(1), repeats=2)["repeats"] == 2


# ---------------------------------------------------------------------------------------------
# The fast Blelloch scan equals the sequential reference (float64, odd / non-power-of-two n).
# ---------------------------------------------------------------------------------------------

from bppsa import backprop, scan as scan_lib  # noqa: E402


@pytest.mark.parametrize("n,with_d", [(1, True), (6, True), (17, True), (64, False),
                                      pytest.param(2, False, marks=pytest.mark.slow),
                                      pytest.param(5, True, marks=pytest.mark.slow),
                                      pytest.param(33, True, marks=pytest.mark.slow),
                                      pytest.param(64, True, marks=pytest.mark.slow)])
def test_blelloch_equals_sequential(close, n, with_d):
    B, S = 2, 3
    k1, k2, k3 = jax.random.split(jax.random.key(n), 3)
    Ms = jax.random.normal(k1, (n, B, S, S), jnp.float64) / np.sqrt(S)
    ds = jax.random.normal(k2, (n, B, S), jnp.float64) if with_d else None
    v = jax.random.normal(k3, (B, S), jnp.float64)
    p1, t1 = jax.jit(scan_lib.blelloch_scan)(v, Ms, ds)
    p2, t2 = jax.jit(scan_lib.sequential_scan)(v, Ms, ds)
    close((p1, t1), (p2, t2), rtol=1e-10, atol=1e-12)
    close(jax.jit(lambda v, M, d: scan_lib.down_sweep(scan_lib.up_sweep(v, M, d)))(v, Ms, ds), p2,
           rtol=1e-10, atol=1e-12)


# ---------------------------------------------------------------------------------------------
# Chunked (memory-bounded) BPPSA is exact.
# ---------------------------------------------------------------------------------------------

_slow = pytest.mark.slow
CHUNK_CASES = [(cells.RNN(2, 3), 1, 4, _slow), (cells.RNN(2, 3), 7, 3, ()), (cells.RNN(2, 3), 10, 1, _slow),
               (cells.RNN(2, 3), 200, 71, _slow),  # chunks of 71 (storage order with one padding step) and 58
               (cells.RNN(2, 3), 1, 1, _slow), (cells.RNN(2, 3), 8, 4, _slow), (cells.RNN(2, 3), 6, 6, _slow),
               (cells.RNN(2, 3), 5, 9, _slow), (cells.GRU(2, 3), 13, 5, _slow), (cells.LSTM(2, 2), 7, 3, _slow)]


@pytest.mark.parametrize("cell,T,chunk", [pytest.param(c, T, k, marks=m, id=f"{type(c).__name__}-T{T}-C{k}")
                                          for c, T, k, m in CHUNK_CASES])
def test_chunked_bppsa_is_exact(close, loss, problem, cell, T, chunk):
    params, xs, h0 = problem(cell, T, B=2, h0_scale=1.0)[1:]
    g_ref = scan_grads(cell, params, xs, h0, loss)
    g_full = rnn_grads(cell, params, xs, h0, loss, backward="bppsa")
    g_chunk = rnn_grads(cell, params, xs, h0, loss, backward="bppsa", chunk_size=chunk)
    close(g_chunk, g_full, rtol=1e-9, atol=1e-11)
    close(g_chunk, g_ref, rtol=1e-9, atol=1e-11)


@pytest.mark.slow
def test_chunked_bppsa_with_other_scans_and_b1(close, loss, problem):
    cell = cells.RNN(1, 4)
    params, xs, h0 = problem(cell, 11, B=1, h0_scale=0)[1:]
    g_ref = scan_grads(cell, params, xs, h0, loss)
    for method in ("associative", "sequential"):
        close(rnn_grads(cell, params, xs, h0, loss, backward="bppsa", scan=method, chunk_size=4), g_ref, rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("bad", [0, -3, 2.5, True, "4"])
def test_chunk_size_is_validated(bad):
    cell = cells.RNN(1, 2)
    params = cell.init(jax.random.key(0), jnp.float64)
    with pytest.raises(ValueError, match="chunk_size"):
        backprop.rnn(cell, params, jnp.ones((3, 1, 1)), jnp.zeros((1, 2)), chunk_size=bad)


def test_chunked_mode_bounds_compiled_memory():
    cell = cells.RNN(1, 16)
    params = cell.init(jax.random.key(0), jnp.float32)
    T, B = 512, 4
    xs = jnp.ones((T, B, 1), jnp.float32)
    h0 = jnp.zeros((B, 16), jnp.float32)
    mem = bench.gradient_memory(cell, params, xs, h0, chunk_size=32)
    if mem["bppsa"] is None:
        pytest.skip("this backend has no compiled memory analysis")
    jac_bytes = T * B * 16 * 16 * 4
    # one chunk holds the first level's T/2 products (the RNN's Jacobians themselves are never formed)
    assert mem["bppsa_one_chunk"]["peak"] >= jac_bytes // 2
    assert mem["bppsa_chunked"]["peak"] < mem["bppsa_one_chunk"]["peak"] / 3
    assert mem["bptt"]["peak"] < mem["bppsa_one_chunk"]["peak"]
    assert mem["bppsa"]["peak"] <= mem["bppsa_one_chunk"]["peak"]  # the default chunks or not


# ---------------------------------------------------------------------------------------------
# Sweep outputs, commands, the GPU script.
# ---------------------------------------------------------------------------------------------

import json  # noqa: E402
import os  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def _load_config(name, arg=None):
    from experiments import cli
    from experiments.runner import load_config
    return load_config(cli.config_path(name), arg)


def test_sweep_task_smoke_writes_json_markdown_and_plot(tmp_path):
    config = _load_config("rnn_sweep", "B")  # the B sweep alone, at toy size
    config.update({"T_fixed": 30, "B_values": (2,), "repeats": 2, "auto": False})
    assert config.task == "experiments.paper_bppsa.rnn_sweep:sweep_task"
    summary = rnn_sweep.sweep_task(config, tmp_path)
    rec = json.loads((tmp_path / "rnn-sweep-B.json").read_text())
    assert set(rec["provenance"]) >= {"date", "command", "backend", "device_kind", "cpu", "jax", "jaxlib"}
    (pts,) = rec["sweeps"].values()
    assert [(p["T"], p["B"]) for p in pts] == [(30, 2)]
    for p in pts:
        assert set(p["components"]) == set(bench.COMPONENTS)
        c = {k: v["median"] for k, v in p["components"].items()}
        assert p["speedup_backward"] == c["bptt_backward"] / c["bppsa_backward_full"]
        assert p["speedup_step"] == c["step_bptt"] / c["step_bppsa"]
        assert set(p["scans"]) == {"blelloch", "associative", "sequential"}
        for m in ("bppsa", "bppsa_one_chunk", "bptt"):
            mem = p["memory"][m]
            assert mem["peak"] == mem["argument"] + mem["output"] + mem["temp"] - mem["alias"]
            assert mem["argument"] >= 30 * 2 * 20 * 4  # the readout R (T, B, H) float32 is an argument
        assert p["memory"]["jacobian_bytes"] == 30 * p["B"] * 20 * 20 * 4
    md = (tmp_path / "rnn-sweep-B.md").read_text()
    assert bench.TABLE_HEADER in md and f"| 30 | 2 | {1e3 * pts[0]['components']['forward']['median']:.2f} |" in md
    assert (tmp_path / "rnn-sweep-B.png").stat().st_size > 1000
    assert list(summary) == list(rec["sweeps"])
    full, t_only = _load_config("rnn_sweep"), _load_config("rnn_sweep", "T")
    assert t_only.T_values == full.T_values == (10, 30, 100, 300, 1000, 3000, 10000, 30000) and t_only.B_values == ()


def test_bench_point_records_auto_choice_and_baselines(tmp_path):
    cell = cells.RNN(1, 3)
    model = bench.CostModel({"bptt": [1.0, 0.0, 0.0], "bppsa": [0.0, 0.0, 0.0, 0.0]})
    r = bench.bench_point(cell, 5, 2, repeats=1, model=model, scan_variants=(), memory=False, log=lambda s: None,
                          baselines={"unrolls": (1, 4), "scans": ("blelloch", "sequential")})
    assert r["auto"]["choice"] == "bppsa_blelloch"
    assert r["auto"]["faster_measured"] in r["baselines"]["ms"] and r["auto"]["slowdown_vs_best"] >= 1.0
    b = r["baselines"]
    assert set(b["ms"]) == {"bptt_unroll1", "bptt_unroll4", "bptt", "bppsa_blelloch", "bppsa_sequential"}
    assert b["bptt_plain"] == b["ms"]["bptt_unroll1"] and b["bptt_unrolled"] == min(
        v for k, v in b["ms"].items() if k.startswith("bptt_unroll"))
    md = bench.save_record({"sweeps": {"rnn": [r]}}, tmp_path, "pt")[1].read_text()
    assert "Baselines, rnn" in md and "| 5 | 2 | " in md.split("Baselines, rnn")[1]


def test_cli_registers_bench_and_rnn_sweep():
    from experiments import cli
    assert cli.COMMANDS["bench"] == "experiments.cli:bench"
    assert "rnn-sweep" in cli.reproduce_names()
    with pytest.raises(ValueError, match="comma-separated"):
        cli.bench(["--T", "10,x", "--no-auto"])


@pytest.mark.slow
def test_gemm_option_records_rates_for_the_sweep(tmp_path, monkeypatch):
    """``--config.gemm=true`` (documented in experiments/paper_bppsa/configs/rnn_sweep.py) at toy size."""
    small = rnn_sweep.gemm_rates
    monkeypatch.setattr(rnn_sweep, "gemm_rates", lambda S: small(n=16, S=S, large=16, repeats=1))
    calls = []
    rate = rnn_sweep.product_rate
    monkeypatch.setattr(rnn_sweep, "product_rate", lambda *a, **kw: calls.append((a, kw)) or rate(*a, **kw, repeats=1))
    config = _load_config("rnn_sweep", "smoke")
    config.gemm = True
    config.hidden_size = 3
    config.T_values = (100,)
    config.B_values = ()
    config.B_fixed = 2
    rnn_sweep.sweep_task(config, tmp_path)
    rec = json.loads((tmp_path / "rnn-sweep-smoke.json").read_text())
    assert len(rec["gemm_gflops"]) == 7 and all(v > 0 for v in rec["gemm_gflops"].values())
    (p,) = rec["sweeps"]["T sweep"]
    assert calls == [((100, 2, 3), {"structured": True})]  # the RNN's diagonal structure, from the cell
    assert p["product_rate"]["levels"] == 1 and p["product_rate"]["flops"] == 2 * 50 * 2 * 27  # 50 products per row
    assert p["scan_gflops"] == 2 * 100 * 2 * 27 / p["components"]["bppsa_backward"]["min"] / 1e9


def test_product_rate_counts_the_bottom_level_products():
    r = rnn_sweep.product_rate(100, 2, 3, repeats=1)  # k = 1 bottom level: 50 products per batch row
    assert r["levels"] == 1 and r["flops"] == 2 * 50 * 2 * 27 and r["gflops"] > 0
    assert rnn_sweep.product_rate(10, 1, 3, repeats=1)["flops"] == 0  # short scans have no bottom level
    r2 = rnn_sweep.product_rate(100, 2, 3, structured=True, repeats=1)  # level 0 from vectors, same flops
    assert r2["levels"] == 1 and r2["flops"] == r["flops"] and r2["gflops"] > 0


def _bench_error(capsys, *args):
    """`bppsa bench ARGS` through the command: exit code 2 and the one stderr line."""
    from experiments import cli
    assert cli.main(["bench", *args, "--no-auto"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.splitlines() == [err] and err.startswith("bppsa bench: error: ") and "Traceback" not in err, err
    return err


@pytest.mark.parametrize("args, needle", [
    (["--T", "0"], "--T must be a comma-separated list of ints >= 1 (e.g. 100,1000); got '0'"),
    (["--T", "abc"], "--T must be a comma-separated list of ints >= 1"),
    (["--T", ","], "--T must be"),
    (["--B", "-3"], "--B must be a comma-separated list of ints >= 1 (e.g. 100,1000); got '-3'"),
    (["--repeats", "0"], "--repeats must be an int >= 1; got 0"),
    (["--hidden", "0"], "--hidden must be an int >= 1; got 0"),
    (["--name", "../x"], "--name must be a plain file name"),
])
def test_bench_flags_are_one_line_errors(tmp_path, capsys, args, needle):
    """These were tracebacks (or, --repeats 0, failed after compiling everything)."""
    err = _bench_error(capsys, *args, "--out", str(tmp_path / "out"))
    assert needle in err, err
    assert not (tmp_path / "out").exists()  # refused before anything is written


def test_bench_out_that_cannot_hold_the_results_is_refused_before_timing(tmp_path, capsys):
    """--out is the run's work directory, checked by the runner before anything is timed (it used to
    fail only after the whole benchmark had run, a traceback from mkdir); the message names --out."""
    (tmp_path / "file").write_text("mine\n")
    err = _bench_error(capsys, "--T", "4", "--B", "1", "--out", str(tmp_path / "file"))
    assert "--out" in err and "is a file, not a folder" in err and "--workdir" not in err
    assert (tmp_path / "file").read_text() == "mine\n"
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "mine.txt").write_text("mine\n")  # a folder of the user's: not bppsa's to write into
    err = _bench_error(capsys, "--T", "4", "--B", "1", "--out", str(tmp_path / "d"))
    assert "--out" in err and sorted(p.name for p in (tmp_path / "d").iterdir()) == ["mine.txt"]


def test_bench_is_a_run_of_the_sweep_config(tmp_path, monkeypatch):
    """`bppsa bench` writes through the runner: the work directory, the locked config with its grid,
    the result (json, md) and its provenance naming the command. (The timing of a point is
    test_sweep_task_smoke_writes_json_markdown_and_plot's; here each point is a recorded stand-in.)"""
    def save(record, outdir, name):
        """save_record's JSON half (with provenance), for stand-in points that have no tables."""
        from experiments.provenance import provenance, save_json
        record.setdefault("provenance", provenance())
        return save_json(outdir / f"{name}.json", record)

    from experiments import cli
    seen = []

    def point(cell, T, B, **kw):
        seen.append((type(cell).__name__, cell.hidden_size, T, B, kw["scan"], kw["repeats"]))
        return {"T": T, "B": B, "speedup_backward": 1.0, "speedup_step": 1.0}

    monkeypatch.setattr(rnn_sweep, "bench_point", point)
    monkeypatch.setattr(rnn_sweep, "save_record", lambda record, outdir, name: [save(record, Path(outdir), name)])
    monkeypatch.setattr(rnn_sweep, "plot_sweep", lambda record, path: path.write_bytes(b"stand-in"))
    assert cli.main(["bench", "--T", "6,9", "--B", "2", "--no-auto", "--repeats", "2", "--name", "pt",
                     "--hidden", "3", "--scan", "sequential", "--out", str(tmp_path / "w")]) == 0
    assert seen == [("RNN", 3, 6, 2, "sequential", 2), ("RNN", 3, 9, 2, "sequential", 2)]
    config = json.loads((tmp_path / "w" / "config.json").read_text())
    assert config["task"] == "experiments.paper_bppsa.rnn_sweep:sweep_task"
    assert (config["grid_T"], config["grid_B"], config["T_values"], config["B_values"]) == ([6, 9], [2], [], [])
    rec = json.loads((tmp_path / "w" / "pt.json").read_text())
    assert [(p["T"], p["B"]) for p in rec["sweeps"]["grid"]] == [(6, 2), (9, 2)]
    assert rec["provenance"]["command"].startswith("bppsa bench --T 6,9")
    assert (tmp_path / "w" / "summary.json").exists()


def test_a_cost_model_that_is_not_one_is_a_clear_error():
    """``cost_model="fast"`` was AttributeError: 'str' object has no attribute 'choose'."""
    from bppsa.plan import calibration
    from bppsa.errors import UsageError
    with pytest.raises(UsageError, match=r"cost_model must be a bppsa.CostModel .* or None; got 'fast' of "
                       r"type str"):
        calibration.choose_backward(cells.RNN(1, 3), 10, 2, cost_model="fast")
