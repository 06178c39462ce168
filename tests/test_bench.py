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
