"""The parallel forward's stopping rule and safeguards (bppsa.forward.newton.iterate):

- converged states are as accurate as the sequential forward's on slowly forgetting cells (a
  diagonal GRU whose update gate is 0.99 … 0.9999, float32 against a float64 reference): the
  residual alone passed them 4e-4 … 1e-3 off, where the sequential forward is 1e-6 off;
- an iterate that overflows is repaired and the iteration goes on: DEER's own hard case (a GRU in
  float32, state 2, weights ×100, T = 100) converges with the default settings, no fallback;
- ``atol``/``rtol`` are the tolerances of both tests, checked on construction;
- the stall rule ends an iteration that no longer improves, with a message that says so;
- gradients at the converged states still equal autodiff's (float64).

float64 is on for the suite (tests/conftest.py); the float32 cases name their dtype.
"""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import bppsa
from bppsa import cells
from bppsa.forward import newton
from bppsa.plan import options
from bppsa.errors import UsageError
from tests.helpers import normal, random_params
from tests.reference import scan_grads, scan_states


def _slow_gru(gate, T, H=8, seed=0):
    """A diagonal GRU (head size 1) whose update gate is ≈ ``gate`` at every step (its bias set to
    logit(gate)), float64 parameters, inputs and h0."""
    cell = cells.BlockGRU(1, H, 1)
    p = random_params(cell, seed, np.float64)
    b_x = np.array(p["b_x"])
    b_x[H:2 * H] = np.log(gate / (1 - gate))
    p = dict(p, b_x=jnp.asarray(b_x), b_h=p["b_h"].at[H:2 * H].set(0.0))
    return cell, p, normal(seed + 1, (T, 1, 1)), jnp.zeros((1, H))


@pytest.mark.parametrize("gate, kind", [(0.999, "newton")] + [
    pytest.param(g, k, marks=pytest.mark.slow) for g in (0.99, 0.999, 0.9999) for k in ("newton", "quasi")
    if (g, k) != (0.999, "newton")])
def test_slowly_forgetting_gru_is_as_accurate_as_the_sequential_forward(gate, kind):
    """float32 states against the float64 truth: the parallel forward's error at most 10x the
    sequential forward's, or it says it did not converge (here it converges)."""
    cell, p, xs, h0 = _slow_gru(gate, 5000)
    truth = bppsa.rnn(cell, p, xs, h0)
    f32 = lambda a: jax.tree.map(lambda v: v.astype(jnp.float32), a)
    p32, xs32, h032 = f32(p), f32(xs), f32(h0)
    seq_err = float(jnp.max(jnp.abs(bppsa.rnn(cell, p32, xs32, h032) - truth)))
    states, info = jax.jit(lambda p, x, h: bppsa.rnn(cell, p, x, h, forward=kind, on_fail="raise",
                                                     return_info=True))(p32, xs32, h032)
    err = float(jnp.max(jnp.abs(states - truth)))
    assert bool(info.converged) and not bool(info.fell_back)
    assert err <= 10 * seq_err, f"gate {gate}: parallel forward {err:.2e} from the truth, sequential {seq_err:.2e}"
    assert float(info.error) <= 1e-5 and float(info.residual) <= 1e-5  # what it reports, within tol


@pytest.mark.slow
def test_slowly_forgetting_gru_gradients_equal_autodiff():
    """float64, T = 501 (odd), gate 0.999: the converged states' gradients equal autodiff's."""
    cell, p, xs, h0 = _slow_gru(0.999, 501, H=4)
    loss = lambda ss: jnp.sum(jnp.sin(ss))
    ref_states, ref_grads = scan_states(cell, p, xs, h0), scan_grads(cell, p, xs, h0, loss)

    def f(p, x, h):
        return loss(bppsa.rnn(cell, p, x, h, forward="newton", on_fail="raise"))

    grads = jax.jit(jax.grad(f, argnums=(0, 1, 2)))(p, xs, h0)
    states = bppsa.rnn(cell, p, xs, h0, forward="newton", on_fail="raise")
    np.testing.assert_allclose(states, ref_states, rtol=1e-10, atol=1e-12)
    for g, r in zip(jax.tree.leaves(grads), jax.tree.leaves(ref_grads)):
        np.testing.assert_allclose(g, r, rtol=1e-8, atol=1e-11)


def _deer_hard_case():
    """DEER's test_rnn(difficult=True), as its test suite builds it: a GRU with state 2 and input
    2 in float32, weights U(-1, 1)/√n ×100 (its comment: "makes the temporary value nans"),
    hidden biases U(-1, 1)/√n, inputs N(0, 1)/100, h0 N(0, 1), T = 100, jax.random.PRNGKey(0)."""
    dtype, nh, nx, m = jnp.float32, 2, 2, 100
    key = jax.random.PRNGKey(0)
    weights = []
    for _ in range(3):
        k1, k2, k3, key = jax.random.split(key, 4)
        weights.append(((jax.random.uniform(k1, (nh, nx), dtype=dtype) * 2 - 1) / nx ** 0.5 * m,
                        (jax.random.uniform(k2, (nh, nh), dtype=dtype) * 2 - 1) / nh ** 0.5 * m,
                        (jax.random.uniform(k3, (nh,), dtype=dtype) * 2 - 1) / nh ** 0.5))
    k1, k2, _, key = jax.random.split(key, 4)
    xs = jax.random.normal(k1, (100, nx), dtype=dtype) / m
    h0 = jax.random.normal(k2, (nh,), dtype=dtype)
    cell = cells.GRU(nx, nh)  # r, z, n gate-major; n = tanh(x W_xn + b_xn + r ⊙ (h W_hn + b_hn)), as DEER's
    params = {"W_x": jnp.concatenate([w[0].T for w in weights], axis=1),
              "W_h": jnp.concatenate([w[1].T for w in weights], axis=1),
              "b_x": jnp.zeros((3 * nh,), dtype), "b_h": jnp.concatenate([w[2] for w in weights])}
    return cell, params, xs[:, None, :], h0[None, :]


def _loop(cell, params, xs, h0):
    """A plain Python loop of the cell's step (DEER's reference)."""
    h, out = h0, []
    for t in range(xs.shape[0]):
        h = cell.step(params, h, xs[t])
        out.append(h)
    return jnp.stack(out)


# both: make test-all; the default run solves the same case with on_fail="raise" (the accuracy test below)
@pytest.mark.slow
@pytest.mark.parametrize("jit", [True, False])
def test_deers_hard_case_converges_with_the_defaults(jit):
    cell, params, xs, h0 = _deer_hard_case()
    run = lambda p, x, h: bppsa.rnn(cell, p, x, h, forward="newton", on_fail="raise", return_info=True)
    states, info = (jax.jit(run) if jit else run)(params, xs, h0)
    assert bool(info.converged) and not bool(info.fell_back), info
    loop = _loop(cell, params, xs, h0)
    assert bool(jnp.all(jnp.isfinite(states)))
    np.testing.assert_allclose(states, loop, atol=1e-6, rtol=1e-5)  # DEER's check (jnp.allclose(..., atol=1e-6))


def test_deers_hard_case_is_as_accurate_as_the_loop():
    """Against the same problem in float64: the parallel forward's float32 states are no further
    from it than twice the float32 loop's (the loop is not exact either: weights ×100)."""
    cell, params, xs, h0 = _deer_hard_case()
    up = lambda a: jax.tree.map(lambda v: v.astype(jnp.float64), a)
    truth = _loop(cell, up(params), up(xs), up(h0))
    states = bppsa.rnn(cell, params, xs, h0, forward="newton", on_fail="raise")
    loop_err = float(jnp.max(jnp.abs(_loop(cell, params, xs, h0) - truth)))
    assert float(jnp.max(jnp.abs(states - truth))) <= 2 * loop_err + 1e-7


def test_repair_replaces_non_finite_entries_and_clips():
    H = jnp.array([[1.0, jnp.nan, jnp.inf, -jnp.inf, 3e38]], jnp.float32)
    F = jnp.array([[9.0, 2.0, jnp.nan, -5.0, 0.0]], jnp.float32)
    b = newton.bound(jnp.float32)
    assert b == pytest.approx(float(np.sqrt(np.finfo(np.float32).max)))
    np.testing.assert_array_equal(newton.repair(H, F), jnp.array([[1.0, 2.0, 0.0, -5.0, b]], jnp.float32))
    np.testing.assert_array_equal(newton.repair(H), jnp.array([[1.0, 0.0, 0.0, 0.0, b]], jnp.float32))


def test_an_exact_guess_takes_one_verifying_step_and_reports_its_error():
    cell = cells.LSTM(3, 4)
    p, xs, h0 = random_params(cell, 1), normal(2, (9, 2, 3)), (normal(3, (2, 4)), normal(4, (2, 4)))
    ref = scan_states(cell, p, xs, h0)
    _, info = bppsa.rnn(cell, p, xs, h0, forward="newton", guess=ref, return_info=True, on_fail="raise")
    assert int(info.iterations) == 1 and bool(info.converged)
    assert 0 <= float(info.error) <= 1e-14 and float(info.residual) <= 1e-14


@pytest.mark.parametrize("field, value", [("atol", -1e-6), ("atol", float("nan")), ("atol", float("inf")),
                                          ("rtol", -0.1), ("rtol", float("nan")), ("rtol", 1.0), ("atol", "1e-6"),
                                          ("rtol", True)])
def test_bad_tolerances_are_one_line_value_errors(field, value):
    with pytest.raises(ValueError, match=rf"^{field} must be .*; got {value!r}$".replace("(", r"\(")):
        bppsa.Options(forward="newton", **{field: value})
    assert issubclass(UsageError, ValueError)


def test_both_tolerances_zero_is_refused():
    with pytest.raises(UsageError, match="atol and rtol are both 0"):
        bppsa.Options(atol=0, rtol=0.0)


def test_atol_and_rtol_default_to_tol_and_set_the_test():
    """The plan fills them from tol (per dtype by default); a looser rtol stops earlier, a tighter
    atol later, and the states always meet what was asked of them."""
    cell = cells.GRU(3, 4)
    p, xs, h0 = random_params(cell, 5), normal(6, (40, 2, 3)), normal(7, (2, 4))
    plan = bppsa.Options(forward="newton").plan(cell, xs, h0)
    assert plan.atol == plan.rtol == plan.tol == options.DEFAULT_TOL["float64"]
    assert bppsa.Options(forward="newton", tol=1e-6, rtol=1e-3).plan(cell, xs, h0).atol == 1e-6
    ref = scan_states(cell, p, xs, h0)
    iters = {}
    for name, opts in {"loose": dict(atol=1e-3, rtol=1e-3), "default": {}, "tight": dict(atol=1e-14, rtol=0.0)}.items():
        states, info = bppsa.rnn(cell, p, xs, h0, forward="quasi", return_info=True, on_fail="raise", **opts)
        a, r = opts.get("atol", 1e-12), opts.get("rtol", 1e-12)
        assert bool(jnp.all(jnp.abs(states - ref) <= 10 * (a + r * jnp.abs(ref)))), name
        iters[name] = int(info.iterations)
    assert iters["loose"] < iters["default"] <= iters["tight"]


def test_a_stalled_iteration_stops_early_and_says_so(monkeypatch):
    """A tolerance below the rounding of float64 (rtol 1e-18, atol 0) cannot be met: the iteration
    ends after PATIENCE steps that improve nothing, long before max_iter, and says so; the
    fallback's states are the sequential forward's."""
    cell = cells.GRU(3, 4)
    p, xs, h0 = random_params(cell, 3), normal(4, (60, 2, 3)), normal(5, (2, 4))
    monkeypatch.setattr(newton, "_fallbacks", [0])
    with pytest.warns(newton.NewtonFallbackWarning, match=r"did not converge after \d+ iterations .*: it stopped "
                                                          rf"improving \({newton.PATIENCE} iterations in a row"):
        states, info = bppsa.rnn(cell, p, xs, h0, forward="newton", atol=0.0, rtol=1e-18, max_iter=1000,
                                 return_info=True)
    assert bool(info.fell_back) and newton.PATIENCE < int(info.iterations) < 100, info
    np.testing.assert_allclose(states, bppsa.rnn(cell, p, xs, h0), rtol=1e-12, atol=1e-14)  # the sequential forward


def test_nan_in_xs_runs_no_iteration():
    cell = cells.GRU(3, 4)
    p, h0 = random_params(cell, 1, np.float32), jnp.zeros((2, 4), jnp.float32)
    xs = normal(2, (20, 2, 3), dtype=np.float32)
    xs = xs.at[7, 1, 0].set(jnp.nan)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", newton.NewtonFallbackWarning)
        _, info = bppsa.rnn(cell, p, xs, h0, forward="newton", return_info=True)
    assert int(info.iterations) == 0 and bool(info.fell_back)
