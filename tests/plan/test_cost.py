"""bppsa.plan.rules, .cost and .calibration: the cost features, the fitted model, its cache, backward="auto" and chunk sizing."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bppsa import cells
from bppsa.plan import calibration, rules
from bppsa.plan import cost
from bppsa.backward import pipeline
from experiments import calibrate
from bppsa.scan import dense as scan_lib
from tests.reference import rnn_grads, scan_grads


FAVOUR_BPPSA = {"bptt": [1.0, 0.0, 0.0], "bppsa": [0.0, 0.0, 0.0, 0.0]}
FAVOUR_BPTT = {"bptt": [0.0, 0.0, 0.0], "bppsa": [1.0, 0.0, 0.0, 0.0]}


# ---------------------------------------------------------------------------------------------
# Chunk sizing.
# ---------------------------------------------------------------------------------------------

def test_auto_chunk_size():
    assert rules.auto_chunk_size(30_000, 1, 20, 4, backend="gpu") is None  # one chunk off CPU
    assert rules.auto_chunk_size(1000, 2, 20, 4, backend="cpu") is None    # fits in CHUNK_BYTES
    c = rules.auto_chunk_size(30_000, 1, 20, 4, backend="cpu")
    assert c * 20 * 20 * 4 <= rules.CHUNK_BYTES < 2 * c * 20 * 20 * 4
    assert scan_lib.bottom_layout(c)[2] == c  # m·2^k: the Blelloch scan pads nothing in a full chunk
    assert rules.auto_chunk_size(10**6, 1024, 64, 8, backend="cpu") == 64  # never below 64
    # diagonal structure (the RNN): no Jacobians formed, the largest array is half as big
    assert rules.auto_chunk_size(10_000, 1, 20, 4, backend="cpu") is not None
    assert rules.auto_chunk_size(10_000, 1, 20, 4, backend="cpu", structured=True) is None
    c2 = rules.auto_chunk_size(30_000, 1, 20, 4, backend="cpu", structured=True)
    assert c2 * 20 * 20 * 4 // 2 <= rules.CHUNK_BYTES < c2 * 20 * 20 * 4 and c2 > c
    assert c == 5120  # 8 MiB / 1600 B = 5242 steps, rounded down to 40 * 2^7: no padding in a chunk


@pytest.mark.slow  # chunked exactness: tests/experiments/test_bench.py's default cases
@pytest.mark.skipif(jax.default_backend() != "cpu", reason='chunk_size="auto" chunks on CPU only')
def test_default_auto_chunking_is_exact(close, loss, monkeypatch):
    """chunk_size="auto" (the default) chunks once the Jacobians pass CHUNK_BYTES; exact."""
    cell = cells.GRU(2, 3)
    T, B = 150, 2
    params = cell.init(jax.random.key(5), jnp.float64)
    xs = jax.random.normal(jax.random.key(6), (T, B, 2), jnp.float64)
    h0 = jax.random.normal(jax.random.key(7), (B, 3), jnp.float64)
    monkeypatch.setattr(rules, "CHUNK_BYTES", 64 * B * 3 * 3 * 8)  # chunks of 64, 64, 22
    assert rules.auto_chunk_size(T, B, 3, 8, backend="cpu") == 64
    calls = []
    chunked = pipeline.chunked_backward
    monkeypatch.setattr(pipeline, "chunked_backward", lambda *a: calls.append(a[2]) or chunked(*a))
    g_ref = scan_grads(cell, params, xs, h0, loss)
    close(rnn_grads(cell, params, xs, h0, loss, backward="bppsa"), g_ref, rtol=1e-9, atol=1e-11)
    assert calls == [64]  # the default took the chunked path, with chunks of 64
    close(rnn_grads(cell, params, xs, h0, loss, backward="bppsa", chunk_size=None), g_ref, rtol=1e-9, atol=1e-11)
    assert calls == [64]  # chunk_size=None: one chunk


# ---------------------------------------------------------------------------------------------
# Features and the model.
# ---------------------------------------------------------------------------------------------

def test_cost_model_choices_in_constructed_regimes():
    cell = cells.RNN(1, 20)
    # per-step latency dominates BPTT; BPPSA pays per level and per S^3 flop
    model = cost.CostModel({"bptt": [1e-6, 0.0, 1e-11], "bppsa": [2e-5, 5e-12, 5e-12, 1e-11]})
    assert model.choose(cell, T=100_000, B=1) == "bppsa"   # long, thin: few levels vs many steps
    assert model.choose(cell, T=4, B=1) == "bptt"          # short: level overhead dominates
    assert model.choose(cell, T=1000, B=4096) == "bptt"    # wide: S^3 work dominates
    p = model.predict(cell, 1000, 2)
    assert set(p) == {"bptt", "bppsa"} and all(v > 0 for v in p.values())
    with pytest.raises(ValueError, match="coef"):
        cost.CostModel({"bptt": [1.0]})


def test_cost_features_separate_dense_and_diagonal_products():
    rnn, gru = cells.RNN(1, 20), cells.GRU(1, 20)
    f_rnn, f_gru = cost.cost_features(rnn, 4096, 2), cost.cost_features(gru, 4096, 2)
    work = 4096 * 2 * 20 ** 3
    assert f_rnn["bppsa"][1:3] == [0.0, work] and f_gru["bppsa"][1:3] == [work, 0.0]
    assert cost.cost_features(cells.RNN(1, 20, diagonal=False), 4096, 2)["bppsa"][1:3] == [work, 0.0]
    # a device where dense products are slow and diagonal ones fast picks per cell
    model = cost.CostModel({"bptt": [2e-6, 0.0, 0.0], "bppsa": [0.0, 1e-9, 1e-12, 0.0]})
    assert model.choose(rnn, 4096, 2) == "bppsa" and model.choose(gru, 4096, 2) == "bptt"


def test_fit_recovers_nonnegative_coefficients():
    cell = cells.GRU(1, 4)
    true = {"bptt": [1e-6, 2e-6, 1e-9], "bppsa": [1e-5, 0.0, 0.0, 3e-9]}
    pts = [(64, 1), (512, 1), (256, 2), (1024, 4), (4096, 8)]
    f = {k: [cost.cost_features(cell, T, B)[k] for T, B in pts] for k in true}
    y = {k: [float(np.dot(true[k], row)) for row in f[k]] for k in true}
    model = cost.CostModel.fit(f, y, {"note": "synthetic"})
    assert all(c >= 0 for k in model.coef for c in model.coef[k]) and model.meta == {"note": "synthetic"}
    for T, B in pts:
        for k, v in model.predict(cell, T, B).items():
            assert v == pytest.approx(cost.CostModel(true).predict(cell, T, B)[k], rel=1e-6)
    with pytest.raises(ValueError, match="same length"):
        cost.CostModel.fit({"bptt": f["bptt"], "bppsa": f["bppsa"][:2]}, y)


def test_fit_reaches_the_optimal_residual_where_greedy_pruning_does_not():
    """The fit is a true non-negative least squares on relative error: on this problem, dropping
    the most negative unconstrained coefficient and never re-adding one ends at x = 0 (residual 2);
    the optimum is x = (0, 3/7, 0) (residual 1.65), as scipy.optimize.nnls finds and the KKT
    conditions confirm."""
    import scipy.optimize
    A = np.array([[-3.0, 1.0, -1.0], [2.0, 2.0, -3.0], [-1.0, 1.0, -2.0], [-1.0, -1.0, 1.0]])
    secs = np.array([1e-3, 2e-3, 5e-4, 4e-3])  # rows scaled by the seconds: relative error A x - 1
    rows = A * secs[:, None]
    f = {"bptt": rows.tolist(), "bppsa": np.c_[rows, np.zeros(4)].tolist()}
    x = np.array(cost.CostModel.fit(f, {"bptt": secs.tolist(), "bppsa": secs.tolist()}).coef["bptt"])
    np.testing.assert_allclose(x, [0.0, 3 / 7, 0.0], atol=1e-12)
    np.testing.assert_allclose(x, scipy.optimize.nnls(A, np.ones(4))[0], atol=1e-12)
    assert np.linalg.norm(A @ x - 1) == pytest.approx(1.6475089, rel=1e-6)  # the greedy pruning's: 2
    grad = A.T @ (A @ x - 1)  # KKT: zero where x > 0, non-negative where x = 0
    assert np.all(x >= 0) and np.all(np.abs(grad[x > 0]) < 1e-12) and np.all(grad[x == 0] >= -1e-12)


def test_fit_shares_the_weight_of_features_the_probe_cannot_tell_apart():
    """Two identical columns (with only G = 1 probed, T·B·S² and T·B·G·S² are the same feature):
    the optimal fits are a line; the fit takes its minimum-norm point (an equal split), not the
    vertex where one feature takes everything."""
    rng = np.random.default_rng(0)
    rows = rng.uniform(1.0, 2.0, size=(6, 2))
    A = np.c_[rows, rows[:, 1]]
    secs = A @ np.array([1e-3, 2e-3, 0.0]) * rng.uniform(0.95, 1.05, size=6)
    f = {"bptt": A.tolist(), "bppsa": np.c_[A, np.zeros(6)].tolist()}
    coef = cost.CostModel.fit(f, {"bptt": secs.tolist(), "bppsa": secs.tolist()}).coef["bptt"]
    assert coef[1] == pytest.approx(coef[2], rel=1e-6) and coef[1] > 0  # split equally, to the rounding of a
    # rank-deficient least-squares solve (its BLAS kernels differ between CPUs)


def test_refitting_the_shipped_cpu_model_from_its_measurements_reproduces_it():
    """bppsa/plan/cost_models/cpu.json keeps its probe's measurements: the fit of today's code
    gives its model back, so its choices are what the fit makes of those measurements.

    The probe's feature matrices are rank-deficient (condition ~1e16: with G = 1 probed, two
    features are one column), so the coefficients are the minimum-norm point of a line and move by
    ~1e-6 relative with the BLAS kernels of the CPU; the predicted seconds at the probed points,
    which the measurements do determine, agree to float64 rounding everywhere."""
    shipped = calibration.shipped_cost_model("cpu")
    m = shipped.meta
    probes = calibrate.probe_cells(m["points"], m["dense_points"], m["gated_points"], m["hidden_size"])
    rnn, dense = probes[0][0], probes[len(m["points"])][0]
    feats = {k: [cost.cost_features(c, T, B, 4)[k] for c, T, B in probes] for k in m["measured"]}
    refit = cost.CostModel.fit(feats, m["measured"])
    for k, coef in shipped.coef.items():
        A = np.asarray(feats[k])
        np.testing.assert_allclose(A @ np.asarray(refit.coef[k]), A @ np.asarray(coef), rtol=1e-9, err_msg=k)
        np.testing.assert_allclose(refit.coef[k], coef, rtol=0, atol=1e-4 * np.max(np.abs(coef)), err_msg=k)
    for c, T, B in probes + [(rnn, 10, 1), (rnn, 30000, 256), (dense, 517, 16)]:
        assert refit.choose(c, T, B) == shipped.choose(c, T, B), (type(c).__name__, T, B)


# ---------------------------------------------------------------------------------------------
# backward="auto": an explicit model, else the cached calibration, else BPTT.
# ---------------------------------------------------------------------------------------------

def test_auto_uses_the_given_model_and_stays_exact(close, loss):
    cell = cells.RNN(1, 3)
    params = cell.init(jax.random.key(0), jnp.float64)
    xs = jax.random.normal(jax.random.key(1), (9, 2, 1), jnp.float64)
    h0 = jnp.zeros((2, 3))
    g_ref = scan_grads(cell, params, xs, h0, loss)
    for coef, choice in ((FAVOUR_BPPSA, "bppsa"), (FAVOUR_BPTT, "bptt")):
        model = cost.CostModel(coef)
        assert calibration.choose_backward(cell, 9, 2, jnp.float64, cost_model=model) == cost.METHODS[choice]
        close(rnn_grads(cell, params, xs, h0, loss, backward="auto", cost_model=model), g_ref, rtol=1e-9, atol=1e-11)


# The diagonal GRU (pararnn's, BlockGRU(head_size=1)) at the points of the pararnn-torch comparison
# (experiments/extensions/pararnn_peer.py: H = 20, 64, 256) and the shapes measured with them, (H, T, B):
# the elementwise BPPSA 1.2-1.8x faster than BPTT at each (experiments/history/diagonal-auto.md).
DIAGONAL_POINTS = [(20, 1034, 32), (64, 1034, 32), (256, 1034, 32), (20, 2048, 8), (64, 2048, 8), (256, 2048, 8)]


@pytest.mark.parametrize("H, T, B", DIAGONAL_POINTS)
def test_auto_runs_the_elementwise_bppsa_for_diagonal_cells_on_cpu(H, T, B):
    """1×1 Jacobian blocks on the CPU, the scan left open: BPPSA by the elementwise plan, whatever the
    model (its S³ and S² features describe formed Jacobians); an explicit scan, a mesh or another
    backend: the model decides, as before."""
    cell = cells.BlockGRU(12, H, 1, hidden_bias=False)
    for model in (None, cost.CostModel(FAVOUR_BPTT)):
        assert calibration.choose_backward(cell, T, B, jnp.float32, cost_model=model, backend="cpu") == ("bppsa", "sequential")
    assert calibration.choose_backward(cells.BlockRNN(12, H), T, B, backend="cpu") == ("bppsa", "sequential")
    shipped = {b: calibration.shipped_cost_model(b) for b in ("cpu", "gpu")}
    for kw, model in (({"scan": "blelloch"}, shipped["cpu"]), ({"devices": 2}, shipped["cpu"]),
                      ({"backend": "gpu"}, shipped["gpu"])):
        kw = {"backend": "cpu", **kw}
        assert calibration.choose_backward(cell, T, B, jnp.float32, cost_model=model, **kw) == \
            cost.METHODS[model.choose(cell, T, B, jnp.float32)]


@pytest.mark.parametrize("cell", [cells.RNN(1, 20), cells.GRU(24, 20), cells.LSTM(12, 20),
                                  cells.BlockGRU(12, 64, 4), cells.BlockLSTM(16, 20, 1),
                                  cells.BlockRNN(16, 64, 8)],
                         ids=["rnn", "gru", "lstm", "block-gru-k4", "block-lstm-k1", "block-rnn-k8"])
def test_auto_keeps_the_models_choice_for_every_other_cell(cell):
    """Dense Jacobians and blocks larger than 1×1 (the LSTM's (h, c) pairs included): the shipped
    model's choice, at the points the paper and the pararnn-torch comparison measure."""
    model = calibration.shipped_cost_model("cpu")
    for T, B in ((1000, 2), (1000, 16), (10_000, 1), (517, 16), (1034, 32), (2048, 8), (64, 1)):
        assert calibration.choose_backward(cell, T, B, jnp.float32, cost_model=model, backend="cpu") == \
            cost.METHODS[model.choose(cell, T, B, jnp.float32)]


def test_default_auto_uses_a_cached_model_and_never_probes(tmp_path, monkeypatch):
    """No cached model: auto uses the shipped model without probing; a cached model for this
    device decides once it exists."""
    monkeypatch.setenv("BPPSA_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(calibrate, "calibrate", lambda **kw: pytest.fail("auto must not probe"))
    calibration.default_cost_model.cache_clear()
    try:
        cell = cells.RNN(1, 4)
        shipped = calibration.shipped_cost_model()
        assert calibration.default_cost_model().coef == shipped.coef
        assert calibration.choose_backward(cell, 1000, 2) == cost.METHODS[shipped.choose(cell, 1000, 2)]
        favour_bptt = {"bptt": [0.0] * 3, "bppsa": [1.0] * 4, "bppsa_sequential": [1.0] * 3}
        calibration.cache_path().write_text(json.dumps(cost.CostModel(favour_bptt, {"device": calibration.device_key()}).to_json()))
        calibration.default_cost_model.cache_clear()
        assert calibration.choose_backward(cell, 1000, 2) == ("bptt", None)
        calibration.cache_path().write_text(json.dumps(cost.CostModel(FAVOUR_BPPSA, {"device": calibration.device_key()}).to_json()))
        assert calibration.choose_backward(cell, 1000, 2) == ("bptt", None)  # looked up once per process
        calibration.default_cost_model.cache_clear()
        assert calibration.choose_backward(cell, 1000, 2) == ("bppsa", "blelloch")
        # an explicit model wins over the cached one
        assert calibration.choose_backward(cell, 1000, 2, cost_model=cost.CostModel(FAVOUR_BPTT)) == ("bptt", None)
    finally:
        calibration.default_cost_model.cache_clear()


def test_cache_round_trip_and_stale_or_corrupt_files(tmp_path, monkeypatch):
    monkeypatch.setenv("BPPSA_CACHE_DIR", str(tmp_path))
    path = calibration.cache_path()
    assert path.parent == tmp_path and calibration.load() is None
    model = cost.CostModel(FAVOUR_BPPSA, {"device": calibration.device_key()})
    assert calibration.save(model) == path
    assert calibration.load().coef == model.coef
    calibration.save(cost.CostModel(FAVOUR_BPPSA, {"device": "another device"}))
    assert calibration.load() is None  # calibrated elsewhere (or by an older implementation)
    path.write_text("{not json")
    assert calibration.load() is None
    calibration.default_cost_model.cache_clear()


def test_calibration_probe_is_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("BPPSA_CACHE_DIR", str(tmp_path))
    path = calibration.cache_path()
    assert not path.exists()
    m1 = calibrate.load_cost_model(points=((16, 1), (64, 1)), dense_points=((64, 1),), gated_points=((32, 2),),
                                   hidden_size=4, repeats=1)
    assert path.exists() and path.parent == tmp_path
    assert all(c >= 0 for k in ("bptt", "bppsa") for c in m1.coef[k])
    m2 = calibrate.load_cost_model(points=((1, 1),))  # from the cache: the probe is not rerun
    assert m2.coef == m1.coef and m2.meta["points"] == [[16, 1], [64, 1]]
    assert m1.meta["dense_points"] == [[64, 1]] and m1.meta["gated_points"] == [[32, 2]]
    assert len(m1.meta["measured"]["bppsa"]) == 5  # 2 RNN points, 1 dense, 1 each for the GRU and the LSTM
    assert len(m1.meta["measured"]["bppsa_sequential"]) == 5 and len(m1.coef["bppsa_sequential"]) == 3
    path.write_text("{not json")
    m3 = calibrate.load_cost_model(points=((16, 1),), dense_points=(), gated_points=(), hidden_size=4,
                                   repeats=1)  # corrupt: re-probed
    assert m3.meta["points"] == [[16, 1]]
    calibration.default_cost_model.cache_clear()
