"""Tuned BPTT (the lax.scan unroll rule), backward="auto" out of the box (the shipped cost models,
the (backward, scan) choice) and the baselines harness."""

import importlib.resources
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import bppsa
from experiments import baselines, calibrate, gradient
from bppsa import cells
from bppsa.plan import calibration, rules
from bppsa.plan import cost
from bppsa.forward.sequential import forward_states
from experiments.tables import markdown_table
from tests.reference import rnn_grads, scan_grads, scan_states

FAVOUR_SEQUENTIAL = {"bptt": [1.0, 0.0, 0.0], "bppsa": [1.0, 0.0, 0.0, 0.0], "bppsa_sequential": [0.0] * 3}


def test_bptt_unroll_rule():
    rnn20, gru20 = cells.RNN(1, 20), cells.GRU(1, 20)
    assert rules.bptt_unroll(rnn20, 1000, 1, backend="cpu") == 16   # cheap steps: loop overhead dominates
    assert rules.bptt_unroll(rnn20, 1000, 2, backend="cpu") == 2
    assert rules.bptt_unroll(gru20, 1000, 1, backend="cpu") == 4
    assert rules.bptt_unroll(gru20, 1000, 8, backend="cpu") == 2     # small batches: unroll 2
    assert rules.bptt_unroll(gru20, 1000, 16, backend="cpu") == 1    # from B = 16: the plain loop
    assert rules.bptt_unroll(rnn20, 1000, 256, backend="cpu") == 1
    assert rules.bptt_unroll(rnn20, 5, 1, backend="cpu") == 1       # tiny problem: not worth the compile
    assert rules.bptt_unroll(rnn20, 1, 64, backend="cpu") == 1      # never more than T
    assert rules.bptt_unroll(rnn20, 10, 16, backend="cpu") == 10    # short: fully unrolled, no loop
    assert rules.bptt_unroll(rnn20, 4, 16, backend="gpu") == 4
    assert rules.bptt_unroll(rnn20, 1000, 16, backend="gpu") == rules.GPU_UNROLL
    assert all(rules.bptt_unroll(c, 1000, B, backend="cpu") in rules.UNROLLS
               for c in (rnn20, gru20, cells.LSTM(1, 20)) for B in (1, 2, 4, 16, 256))


def test_tuned_bptt_is_exact_and_unrolled(close, loss, problem):
    cell, params, xs, h0 = problem(cells.RNN(2, 20), T=61, B=1, h0_scale=0)  # 61 steps: not a multiple of the unroll
    assert rules.bptt_unroll(cell, 61, 1, xs.dtype, backend="cpu") == 16
    assert rules.bptt_unroll(cells.RNN(2, 3), 37, 1, backend="cpu") == 1  # tiny: not worth the compile
    close(rnn_grads(cell, params, xs, h0, loss, backward="bptt"), scan_grads(cell, params, xs, h0, loss))
    s0 = jnp.zeros((1, 20))
    tuned = str(jax.make_jaxpr(lambda p: forward_states(cell, p, xs, s0))(params))
    assert tuned == str(jax.make_jaxpr(lambda p: forward_states(
        cell, p, xs, s0, unroll=rules.bptt_unroll(cell, 61, 1)))(params))
    assert tuned != str(jax.make_jaxpr(lambda p: forward_states(cell, p, xs, s0, unroll=1))(params))


def test_shipped_cost_models_are_package_data():
    root = importlib.resources.files("bppsa.plan").joinpath("cost_models")
    for name in ("cpu", "gpu"):
        assert root.joinpath(f"{name}.json").is_file()
    cpu, gpu = calibration.shipped_cost_model("cpu"), calibration.shipped_cost_model("gpu")
    assert set(cpu.coef) == set(gpu.coef) == set(cost.METHODS)
    assert cpu.meta["model_version"] == gpu.meta["model_version"] == calibration.COST_MODEL_VERSION
    assert gpu.meta["measured"] is False and cpu.meta["measured"]  # the GPU model is a prior
    assert calibration.shipped_cost_model("tpu") is None


def test_package_data_is_declared_for_installation():
    import tomllib
    from pathlib import Path
    conf = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    globs = conf["tool"]["setuptools"]["package-data"]["bppsa"]
    pkg = Path(bppsa.__file__).parent
    found = {p.relative_to(pkg).as_posix() for g in globs for p in pkg.glob(g)}
    assert {"plan/cost_models/cpu.json", "plan/cost_models/gpu.json"} <= found


def test_auto_without_calibration_uses_the_shipped_model_and_is_exact(close, loss, problem, tmp_path, monkeypatch):
    monkeypatch.setenv("BPPSA_CACHE_DIR", str(tmp_path))  # no local calibration
    monkeypatch.setattr(calibrate, "calibrate", lambda **kw: pytest.fail("auto must not probe"))
    calibration.default_cost_model.cache_clear()
    try:
        model = calibration.default_cost_model()
        assert model is not None and model.coef == calibration.shipped_cost_model().coef
        cell, params, xs, h0 = problem(cells.RNN(2, 3), T=20, B=2, h0_scale=0)
        assert calibration.choose_backward(cell, 20, 2, xs.dtype) in cost.METHODS.values()
        close(rnn_grads(cell, params, xs, h0, loss, backward="auto"), scan_grads(cell, params, xs, h0, loss))
    finally:
        calibration.default_cost_model.cache_clear()


def test_auto_picks_the_scan_only_when_scan_is_left_default(close, loss, problem):
    cell, params, xs, h0 = problem(cells.RNN(2, 3), T=9, B=2, h0_scale=0)
    model = cost.CostModel(FAVOUR_SEQUENTIAL)
    assert calibration.choose_backward(cell, 9, 2, xs.dtype, cost_model=model) == ("bppsa", "sequential")
    trace = lambda **kw: str(jax.make_jaxpr(lambda p, x, h: rnn_grads(cell, p, x, h, loss, **kw))(params, xs, h0))
    auto = trace(backward="auto", cost_model=model)
    assert auto == trace(backward="bppsa", scan="sequential") != trace(backward="bppsa", scan="blelloch")
    assert trace(backward="auto", cost_model=model, scan="blelloch") == trace(backward="bppsa", scan="blelloch")
    close(rnn_grads(cell, params, xs, h0, loss, backward="auto", cost_model=model),
          scan_grads(cell, params, xs, h0, loss))
    # a model fitted without the sequential scan never picks it
    two = cost.CostModel({"bptt": [1.0, 0.0, 0.0], "bppsa": [0.0] * 4})
    assert calibration.choose_backward(cell, 9, 2, cost_model=two) == ("bppsa", "blelloch")


def test_cudnn_baseline_needs_torch_with_cuda(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # torch made unimportable
    cell = cells.GRU(2, 3)
    _, xs, _, R = gradient.problem(cell, 10, 2)
    assert gradient.cudnn_function(cell, xs, R) is None
    assert gradient.cudnn_function(cells.Generic(lambda p, h, x: h, hidden_size=3, input_size=2), xs, R) is None


# ---------------------------------------------------------------------------------------------
# The one timed gradient (experiments.gradient): every method is the gradient of one loss.
# ---------------------------------------------------------------------------------------------

GRADIENT_CELLS = [cells.RNN(1, 3)] + [pytest.param(c, marks=pytest.mark.slow) for c in (cells.GRU(2, 3), cells.LSTM(2, 2))]


@pytest.mark.parametrize("cell", GRADIENT_CELLS, ids=lambda c: type(c).__name__)
def test_every_timed_method_is_the_gradient_of_the_one_loss(close, cell):
    T, B = 9, 2
    params, xs, h0, R = gradient.problem(cell, T, B, dtype=jnp.float64, seed=3)
    assert R.shape == (T, B, cell.hidden_size) and xs.shape == (T, B, cell.input_size)
    ref = scan_grads(cell, params, xs, h0, lambda out: jnp.vdot(cell.hidden(out), R))
    out = scan_states(cell, params, xs, h0)
    np.testing.assert_allclose(gradient.loss(cell, out, R), np.sum(np.asarray(cell.hidden(out)) * np.asarray(R)),
                               rtol=1e-13)
    methods = gradient.method_names(unrolls=(1, 4), scans=bppsa.SCANS) + ("auto",)
    fns = gradient.gradient_functions(cell, params, xs, h0, R, methods)
    assert list(fns) == ["bptt_unroll1", "bptt_unroll4", "bptt", "bppsa_blelloch", "bppsa_associative",
                         "bppsa_sequential", "auto"]
    for m, f in fns.items():
        close(f(), ref[0])
    # the backward alone: the VJP at dL/dout, w.r.t. (params, xs, h0)
    for m, f in gradient.backward_functions(cell, params, xs, h0, R, ["bptt", "bppsa_blelloch"]).items():
        close(f(), ref)


def test_the_loss_cotangent_is_the_readout_in_the_hidden_slot():
    lstm = cells.LSTM(1, 2)
    R = jnp.arange(12.0).reshape(3, 2, 2)
    hs_ct, cs_ct = gradient.out_cotangent(lstm, R)
    np.testing.assert_array_equal(hs_ct, R)
    np.testing.assert_array_equal(cs_ct, np.zeros((3, 2, 2)))
    np.testing.assert_array_equal(gradient.readout(lstm, 3, 2, seed=5), gradient.readout(lstm, 3, 2, seed=5))
    assert not np.array_equal(gradient.readout(lstm, 3, 2, seed=5), gradient.readout(lstm, 3, 2, seed=6))


@pytest.mark.parametrize("bad", ["bptt_unroll0", "bptt_unrollx", "bppsa_fast", "cudnn", "lax"])
def test_unknown_timed_methods_are_named(bad):
    with pytest.raises(ValueError, match=f"method.*{bad}"):
        gradient.forward_fn(cells.RNN(1, 2), bad)


def test_gradient_errors_measure_float32_against_float64():
    cell = cells.RNN(1, 4)
    e = gradient.gradient_errors(cell, 40, 2, {"bptt": ("bptt", {}), "bppsa": ("bppsa_blelloch", {}),
                                               "plain:highest": ("bptt_unroll1", {"matmul_precision": "highest"})},
                                 pairs=[("bppsa", "bptt")])
    assert set(e) == {"bptt", "bppsa", "plain:highest", "bppsa vs bptt"}
    assert all(1e-9 < v < 1e-5 for v in e.values()), e  # float32 rounding: above float64's, far below 1
    jax.config.update("jax_enable_x64", False)
    try:
        with pytest.raises(ValueError, match="jax_enable_x64"):
            gradient.gradient_errors(cell, 4, 1, {"bptt": ("bptt", {})})
    finally:
        jax.config.update("jax_enable_x64", True)


def test_backward_baselines_record_and_table(problem):
    cell, params, xs, h0 = problem(cells.RNN(2, 3), T=6, B=2, dtype=np.float32, h0_scale=0)
    favour_bptt = cost.CostModel({"bptt": [0.0] * 3, "bppsa": [1.0] * 4, "bppsa_sequential": [1.0] * 3})
    r = baselines.backward_baselines(cell, params, xs, h0, repeats=1, block=2, model=favour_bptt,
                                     scans=("blelloch", "sequential"), unrolls=(1, 4), cudnn=False)
    assert set(r["ms"]) == {"bptt_unroll1", "bptt_unroll4", "bptt", "bppsa_blelloch", "bppsa_sequential"}
    assert r["best_unroll"] in (1, 4) and r["bptt_unrolled"] == r["ms"][f"bptt_unroll{r['best_unroll']}"]
    assert r["auto"]["method"] == "bptt" and r["auto"]["ratio_to_fastest"] >= 1.0
    assert r["tuned_unroll"] == rules.bptt_unroll(cell, 6, 2)
    table = baselines.baseline_table([{"T": 6, "B": 2, "baselines": r}])
    assert table.splitlines()[:2] == markdown_table(baselines.BASELINE_COLUMNS, [], align="r" * 12).splitlines()
    row = table.splitlines()[2].split(" | ")
    assert row[:3] == ["| 6", "2", f"{r['bptt_plain']:.2f}"] and row[3] == f"{r['bptt_unrolled']:.2f} ({r['best_unroll']})"
    bppsa_ms = min(r["ms"]["bppsa_blelloch"], r["ms"]["bppsa_sequential"])
    assert row[10] == f"{r['bptt_plain'] / bppsa_ms:.2f}"


def test_bench_calibrate_refines_the_model_for_this_machine(tmp_path, monkeypatch):
    from experiments import cli
    from experiments.paper_bppsa import rnn_sweep
    monkeypatch.setenv("BPPSA_CACHE_DIR", str(tmp_path))
    fitted = cost.CostModel(FAVOUR_SEQUENTIAL, {"device": calibration.device_key()})
    monkeypatch.setattr(calibrate, "calibrate", lambda **kw: fitted)
    seen = []
    point = {"T": 8, "B": 1, "speedup_backward": 1.0, "speedup_step": 1.0}
    monkeypatch.setattr(rnn_sweep, "bench_point", lambda cell, T, B, **kw: seen.append(kw["model"]) or point)
    monkeypatch.setattr(rnn_sweep, "save_sweep", lambda *a, **kw: [])
    try:
        assert cli.bench(["--T", "8", "--B", "1", "--calibrate", "--out", str(tmp_path / "a")]) == 0
        assert seen[0].coef == fitted.coef and calibration.load().coef == fitted.coef  # probed and cached
        calibration.default_cost_model.cache_clear()
        assert calibration.default_cost_model().coef == fitted.coef  # auto now uses this machine's model
        seen.clear()
        assert cli.bench(["--T", "8", "--B", "1", "--out", str(tmp_path / "b")]) == 0  # no probe: the cached one
        assert seen[0].coef == fitted.coef
    finally:
        calibration.default_cost_model.cache_clear()
