"""Tests for the timing harness, cost model, `auto` policy and chunked BPPSA (no test asserts a time)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bppsa import bench, cells

jax.config.update("jax_enable_x64", True)


def _close(a, b, rtol=1e-9, atol=1e-11):
    jax.tree.map(lambda x, y: np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=rtol, atol=atol),
                 a, b)


@pytest.mark.parametrize("cell", [cells.RNN(1, 4), cells.GRU(2, 3), cells.LSTM(2, 3)],
                         ids=["rnn", "gru", "lstm"])
def test_component_functions_compute_the_same_gradients(cell):
    T, B = 7, 2
    params = cell.init(jax.random.key(0), jnp.float64)
    xs = jax.random.normal(jax.random.key(1), (T, B, cell.input_size), jnp.float64)
    h0 = cell.unflatten_state(0.1 * jnp.ones((B, cell.state_size)))
    fns = bench.component_functions(cell, params, xs, h0, num_classes=3)
    assert set(fns) == set(bench.COMPONENTS)
    g_bppsa = fns["bppsa_backward_full"]()
    g_bptt = fns["bptt_backward"]()
    _close(g_bppsa, g_bptt)
    # the scan + contraction pieces reproduce the parameter gradient of the full backward
    dparams, _ = fns["param_grads"]()
    _close(dparams, g_bptt[0])
    gs, _ = fns["bppsa_backward"]()
    assert gs.shape == (T, B, cell.state_size)
    assert fns["jacobian"]().shape == (T, B, cell.state_size, cell.state_size)
    assert fns["forward"]().shape == (T, B, cell.state_size)
    (p1, h1, _), l1 = fns["step_bppsa"]()
    (p2, h2, _), l2 = fns["step_bptt"]()
    np.testing.assert_allclose(l1, l2, rtol=1e-12)
    _close((p1, h1), (p2, h2))


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
    for k in ("speedup_backward", "speedup_scan", "speedup_step"):
        assert out[k] > 0
    assert out["shape"] == {"T": 5, "B": 2, "I": 1, "S": 3, "dtype": "float32"}


def test_time_interleaved_rejects_bad_repeats():
    with pytest.raises(ValueError, match="repeats"):
        bench.time_interleaved({"f": lambda: jnp.zeros(1)}, repeats=0)


# ---------------------------------------------------------------------------------------------
# The fast Blelloch scan equals the sequential reference (float64, odd / non-power-of-two n).
# ---------------------------------------------------------------------------------------------

from hypothesis import given, settings, strategies as st  # noqa: E402

from bppsa import backprop, scan as scan_lib  # noqa: E402


@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 70), B=st.integers(1, 3), S=st.integers(1, 4), with_d=st.booleans(),
       seed=st.integers(0, 2 ** 16))
def test_blelloch_equals_sequential(n, B, S, with_d, seed):
    k1, k2, k3 = jax.random.split(jax.random.key(seed), 3)
    Ms = jax.random.normal(k1, (n, B, S, S), jnp.float64) / np.sqrt(S)
    ds = jax.random.normal(k2, (n, B, S), jnp.float64) if with_d else None
    v = jax.random.normal(k3, (B, S), jnp.float64)
    p1, t1 = scan_lib.blelloch_scan(v, Ms, ds)
    p2, t2 = scan_lib.sequential_scan(v, Ms, ds)
    _close((p1, t1), (p2, t2), rtol=1e-10, atol=1e-12)
    _close(scan_lib.down_sweep(scan_lib.up_sweep(v, Ms, ds)), p2, rtol=1e-10, atol=1e-12)


# ---------------------------------------------------------------------------------------------
# Chunked (memory-bounded) BPPSA is exact.
# ---------------------------------------------------------------------------------------------

def _grads(cell, params, xs, h0, **kw):
    def loss(p, x, h):
        out = backprop.rnn(cell, p, x, h, **kw) if kw else _lax_scan(cell, p, x, h)
        hs = out[0] if isinstance(out, tuple) else out
        return jnp.sum(jnp.sin(hs)) + jnp.sum(hs[-1] ** 2)  # a loss on every step
    return jax.grad(loss, argnums=(0, 1, 2))(params, xs, h0)


def _lax_scan(cell, p, xs, h0):
    def body(h, x):
        h = cell.step(p, h, x)
        return h, h
    _, hs = jax.lax.scan(body, h0, xs)
    return hs


@pytest.mark.parametrize("T,chunk", [(1, 1), (1, 4), (7, 3), (8, 4), (10, 1), (13, 5), (6, 6), (5, 9)])
@pytest.mark.parametrize("cell", [cells.RNN(2, 3), cells.GRU(2, 3), cells.LSTM(2, 2)], ids=["rnn", "gru", "lstm"])
def test_chunked_bppsa_is_exact(cell, T, chunk):
    B = 2
    params = cell.init(jax.random.key(0), jnp.float64)
    xs = jax.random.normal(jax.random.key(1), (T, B, cell.input_size), jnp.float64)
    h0 = cell.unflatten_state(jax.random.normal(jax.random.key(2), (B, cell.state_size), jnp.float64))
    g_ref = _grads(cell, params, xs, h0)
    g_full = _grads(cell, params, xs, h0, backward="bppsa")
    g_chunk = _grads(cell, params, xs, h0, backward="bppsa", chunk_size=chunk)
    _close(g_chunk, g_full)
    _close(g_chunk, g_ref)


def test_chunked_bppsa_with_other_scans_and_b1():
    cell = cells.RNN(1, 4)
    params = cell.init(jax.random.key(3), jnp.float64)
    xs = jax.random.normal(jax.random.key(4), (11, 1, 1), jnp.float64)
    h0 = jnp.zeros((1, 4))
    g_ref = _grads(cell, params, xs, h0)
    for method in ("associative", "sequential"):
        _close(_grads(cell, params, xs, h0, backward="bppsa", scan=method, chunk_size=4), g_ref)


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
    mem = bench.step_memory(cell, params, xs, h0, chunk_size=32)
    if mem["bppsa"] is None:
        pytest.skip("this backend has no compiled memory analysis")
    jac_bytes = T * B * 16 * 16 * 4
    assert mem["bppsa"]["peak"] >= jac_bytes  # the full method holds all T Jacobians
    assert mem["bppsa_chunked"]["peak"] < mem["bppsa"]["peak"] / 4
    assert mem["bptt"]["peak"] < mem["bppsa"]["peak"]


# ---------------------------------------------------------------------------------------------
# Cost model and backward="auto".
# ---------------------------------------------------------------------------------------------

def test_cost_model_choices_in_constructed_regimes():
    cell = cells.RNN(1, 20)
    # per-step latency dominates BPTT; BPPSA pays per level and per S^3 flop
    model = bench.CostModel({"bptt": [1e-6, 1e-11], "bppsa": [2e-5, 5e-12, 1e-11]})
    assert model.choose(cell, T=100_000, B=1) == "bppsa"   # long, thin: few levels vs many steps
    assert model.choose(cell, T=4, B=1) == "bptt"          # short: level overhead dominates
    assert model.choose(cell, T=1000, B=4096) == "bptt"    # wide: S^3 work dominates
    p = model.predict(cell, 1000, 2)
    assert set(p) == {"bptt", "bppsa"} and all(v > 0 for v in p.values())
    with pytest.raises(ValueError, match="coef"):
        bench.CostModel({"bptt": [1.0]})


def test_auto_uses_installed_policy_and_stays_exact():
    cell = cells.RNN(1, 3)
    params = cell.init(jax.random.key(0), jnp.float64)
    xs = jax.random.normal(jax.random.key(1), (9, 2, 1), jnp.float64)
    h0 = jnp.zeros((2, 3))
    g_ref = _grads(cell, params, xs, h0)
    seen = []
    for choice in ("bppsa", "bptt"):
        model = bench.CostModel({"bptt": [1.0, 0.0], "bppsa": [0.0, 0.0, 0.0]} if choice == "bppsa"
                                else {"bptt": [0.0, 0.0], "bppsa": [1.0, 0.0, 0.0]})
        prev = backprop.set_auto_policy(lambda *a, m=model: seen.append(m(*a)) or m(*a))
        try:
            _close(_grads(cell, params, xs, h0, backward="auto"), g_ref)
        finally:
            backprop.set_auto_policy(prev)
    assert seen == ["bppsa", "bptt"]


def test_calibration_probe_is_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("BPPSA_CACHE_DIR", str(tmp_path))
    path = bench.cache_path()
    assert not path.exists()
    m1 = bench.load_cost_model(points=((16, 1), (64, 1), (32, 4)), hidden_size=4, repeats=1)
    assert path.exists() and path.parent == tmp_path
    assert all(c >= 0 for k in ("bptt", "bppsa") for c in m1.coef[k])
    m2 = bench.load_cost_model(points=((1, 1),))  # from the cache: the probe is not rerun
    assert m2.coef == m1.coef and m2.meta["points"] == [[16, 1], [64, 1], [32, 4]]
    path.write_text("{not json")
    m3 = bench.load_cost_model(points=((16, 1), (32, 2)), hidden_size=4, repeats=1)
    assert m3.meta["points"] == [[16, 1], [32, 2]]
