"""Predictability in the parallel forward: ``NewtonInfo.lle`` (the largest Lyapunov exponent along
the returned states), ``NewtonInfo.predicted`` (the iterations it foresees) and ``forward="auto"``'s
gate (bppsa.plan.options.Plan.gate): the exponent along the first states decides between Newton and the
sequential forward. float64 (tests/conftest.py): states equal the sequential forward's and gradients
equal autodiff through a plain ``lax.scan`` on either branch.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import bppsa
from bppsa import cells
from bppsa.forward import newton
from bppsa.plan import cost
from tests.reference import scan_grads, scan_states


def _gated(cell, xs, h0, gate, **fields):
    plan = bppsa.Options(forward="newton", on_fail="raise", **fields).plan(cell, xs, cell.flatten_state(h0))
    return dataclasses.replace(plan, gate=float(gate))


def test_info_reports_the_exponent_along_the_returned_states(problem):
    cell, p, xs, h0 = problem(cells.GRU(3, 4), 9, 3)
    states, info = jax.jit(lambda p, x, h: bppsa.rnn(cell, p, x, h, forward="newton", return_info=True))(p, xs, h0)
    np.testing.assert_allclose(info.lle, jnp.max(bppsa.lyapunov(cell, p, xs, h0, states)), rtol=1e-9)
    assert float(info.lle) < 0 and int(info.predicted) == int(newton.predicted_iterations(info.lle, 9))
    assert not bool(info.chose_sequential)


def test_predicted_iterations():
    """min(T, ⌊3 + memory⌋) for λ < 0 (memory 1/(1 − e^λ)), T for λ >= 0, quasi twice; monotone."""
    lles = jnp.array([-5.0, -1.0, -0.5, -0.1, -0.01, 0.0, 0.3])
    k = np.asarray(newton.predicted_iterations(lles, 1000))
    assert list(k) == [4, 4, 5, 13, 103, 1000, 1000]
    assert np.all(np.diff(k) >= 0)
    assert int(newton.predicted_iterations(-1e-6, 50)) == 50  # capped at T, Newton's bound
    assert list(np.asarray(newton.predicted_iterations(lles[:3], 1000, "quasi"))) == [8, 8, 10]


def test_auto_on_cpu_is_the_sequential_forward_with_no_gate(problem):
    cell, p, xs, h0 = problem(cells.GRU(3, 4), 9, 3)
    plan = bppsa.Options(forward="auto").plan(cell, xs, h0)
    assert plan.forward == "sequential" and plan.gate is None
    forward, gate = cost.choose_forward(cell, 100_000, 64, backend="gpu")
    assert forward == "newton" and gate >= 2
    assert gate == pytest.approx(cost.break_even_iterations(cell, 100_000, 64, "gpu"))
    assert cost.choose_forward(cell, 4, 1, backend="gpu") == ("sequential", None)


@pytest.mark.parametrize("gate, on", [pytest.param(50, True, marks=pytest.mark.slow), (1, False)])  # on: vmap below
def test_the_gate_goes_on_or_runs_the_sequential_forward(problem, loss, gate, on):
    """A contracting GRU (T = 7, B = 2): a gate above the prediction goes on (converged Newton), one
    below it runs the sequential forward; both exact, gradients equal autodiff."""
    cell, p, xs, h0 = problem(cells.GRU(3, 4), 7, 2)
    plan = _gated(cell, xs, h0, gate)

    @jax.jit
    def run(p, x, h):
        def f(p, x, h):
            states, info = bppsa.rnn(cell, p, x, h, plan, return_info=True)
            return loss(states), (states, info)
        grads, (states, info) = jax.grad(f, argnums=(0, 1, 2), has_aux=True)(p, x, h)
        return states, info, grads, scan_states(cell, p, x, h), scan_grads(cell, p, x, h, loss)

    states, info, grads, ref, ref_grads = run(p, xs, h0)
    np.testing.assert_allclose(states, ref, rtol=1e-10, atol=1e-12)
    for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(ref_grads)):
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-11)
    assert bool(info.chose_sequential) == (not on) and bool(info.converged) and not bool(info.fell_back)
    assert float(info.lle) < 0 and 0 < int(info.predicted) <= 7
    assert (int(info.iterations) > 0) == on


def test_the_gate_runs_the_sequential_forward_on_a_chaotic_cell():
    """The logistic map at r = 4 (exponent log 2): the exponent along the first states is positive,
    so the sequential forward runs, however generous the gate, and its states are returned."""
    cell = cells.Generic(lambda p, h, x: p["r"] * h * (1 - h) + 0 * x.sum(), hidden_size=1)
    p, xs, h0 = {"r": jnp.float64(4.0)}, jnp.zeros((300, 2, 1)), jnp.array([[0.1234], [0.31]])
    states, info = bppsa.rnn(cell, p, xs, h0, _gated(cell, xs, h0, 1e9), return_info=True)
    assert float(info.lle) > 0.5 and bool(info.chose_sequential) and int(info.iterations) == 0
    assert int(info.predicted) == 300 and bool(info.converged) and not bool(info.fell_back)
    np.testing.assert_allclose(states, bppsa.rnn(cell, p, xs, h0), rtol=1e-12, atol=1e-12)


def test_the_probe_sees_past_its_first_window():
    """A cell that contracts over the first PROBE_STEPS steps and expands after: the accelerator
    rule's gate (the GPU constants) and the exponent along the first window alone foresee 5 Newton
    iterations; Newton then spends max_iter on the chaotic stretch and falls back. The probe's
    windows at the middle and the end see the chaos: the sequential forward runs, exact."""
    T, B = 2000, 2
    # The logistic map whose rate is the input, h' = x h (1 − h): x = 2.5 for the first ``switch``
    # steps (a fixed point, exponent log 0.5: it contracts), 4 after (chaos, exponent log 2).
    switch = newton.PROBE_STEPS
    cell = cells.Generic(lambda p, h, x: p["s"] * x * h * (1 - h), hidden_size=1)
    xs = jnp.where(jnp.arange(T)[:, None, None] < switch, 2.5, 4.0) * jnp.ones((T, B, 1))
    h0 = jnp.linspace(0.12, 0.31, B)[:, None]
    p = {"s": jnp.float64(1.0)}
    forward, gate = cost.choose_forward(cell, T, B, backend="gpu")
    assert forward == "newton" and 5 <= gate < 100  # the first window's 5 iterations pass this gate
    plan = dataclasses.replace(bppsa.Options(forward="newton").plan(cell, xs, h0), gate=float(gate))
    states, info = jax.jit(lambda p, x, h: bppsa.rnn(cell, p, x, h, plan, return_info=True))(p, xs, h0)
    assert bool(info.chose_sequential) and int(info.iterations) == 0 and not bool(info.fell_back)
    assert int(info.predicted) == T and float(info.lle) > 0.5
    np.testing.assert_allclose(states, scan_states(cell, p, xs, h0), rtol=1e-12, atol=1e-12)


def test_probe_windows_spread_over_the_sequence():
    """Windows of PROBE_STEPS (64) at the start, the middle and the end; fewer where T is short."""
    assert newton.PROBE_STEPS == 64 and newton.PROBE_WINDOWS == 3
    assert [newton.probe_windows(T) for T in (1, 7, 64, 65, 100, 128, 129, 300, 2000)] == [
        (0,), (0,), (0,), (0, 1), (0, 36), (0, 64), (0, 32, 65), (0, 118, 236), (0, 968, 1936)]


@pytest.mark.parametrize("T", [7, pytest.param(100, marks=pytest.mark.slow),  # longer windows: test-all
                               pytest.param(300, marks=pytest.mark.slow)])  # three windows: test-all
def test_the_probe_keeps_newton_where_every_window_contracts(problem, T):
    """The contracting GRU at one window (T = 7), two (100) and three (300): the probe's prediction
    is the first window's or close to it, within a gate of 50, so Newton runs as before."""
    cell, p, xs, h0 = problem(cells.GRU(3, 4), T, 2)
    first = newton.predicted_iterations(newton.lle_at(cell, p, xs[:newton.PROBE_STEPS], cell.flatten_state(h0),
                                                      scan_states(cell, p, xs[:newton.PROBE_STEPS], h0)), T)
    states, info = bppsa.rnn(cell, p, xs, h0, _gated(cell, xs, h0, 50), return_info=True)
    assert not bool(info.chose_sequential) and bool(info.converged) and int(info.iterations) > 0
    assert int(first) <= int(info.predicted) <= int(first) + 1
    np.testing.assert_allclose(states, scan_states(cell, p, xs, h0), rtol=1e-10, atol=1e-12)


def test_gate_under_vmap(problem):
    cell, p, xs, h0 = problem(cells.GRU(3, 4), 5, 2)
    plan = _gated(cell, xs, h0, 50)
    xss = jnp.stack([xs, 3 * xs])
    states, info = jax.jit(jax.vmap(lambda x: bppsa.rnn(cell, p, x, h0, plan, return_info=True)))(xss)
    assert info.lle.shape == (2,) and info.chose_sequential.shape == (2,)
    for i in range(2):
        np.testing.assert_allclose(states[i], scan_states(cell, p, xss[i], h0), rtol=1e-10, atol=1e-12)
