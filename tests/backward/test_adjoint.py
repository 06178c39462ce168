"""BPTT by the cells' analytic adjoint (``has_adjoint``): its gradients, forward-mode derivatives and
Hessian-vector products equal autodiff's through a plain lax.scan over cell.step, in float64, with
the parameter gradients after the loop and in it; the adjoint step is g @ M_t; the plan's rule."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import bppsa
from bppsa import cells
from bppsa.backward.rule import bppsa_states
from bppsa.nn import cells as flax_cells
from tests.helpers import jax_problem
from tests.reference import scan_states
from tests.tolerance import max_tree_diff

CELLS = {
    "rnn-tanh": lambda I, H: cells.RNN(I, H),
    "rnn-relu-residual": lambda I, H: cells.RNN(I, H, nonlinearity="relu", residual=True, hidden_bias=False),
    "rnn-sigmoid": lambda I, H: cells.RNN(I, H, nonlinearity="sigmoid", input_bias=False),
    "gru": lambda I, H: cells.GRU(I, H),
    "gru-flax-biases": lambda I, H: cells.GRU(I, H, activation="sigmoid", hidden_bias=False),
    "lstm": lambda I, H: cells.LSTM(I, H),
    "lstm-flax-biases": lambda I, H: cells.LSTM(I, H, gate="tanh", input_bias=False),
    "flax-simple": lambda I, H: flax_cells.adapt(nnx.SimpleCell(I, H, rngs=nnx.Rngs(0)), None, I),
    "flax-gru": lambda I, H: flax_cells.adapt(nnx.GRUCell(I, H, rngs=nnx.Rngs(0)), None, I),
    "flax-lstm": lambda I, H: flax_cells.adapt(nnx.LSTMCell(I, H, rngs=nnx.Rngs(0)), None, I),
    "flax-optimized-lstm": lambda I, H: flax_cells.adapt(nnx.OptimizedLSTMCell(I, H, rngs=nnx.Rngs(0)), None, I),
}


def _setup(name, T, B, I=3, H=4, seed=0):
    """(cell, params, xs, h0 (flat), weights (T, B, S)), float64 (:func:`tests.helpers.jax_problem`)."""
    cell = CELLS[name](I, H)
    return (cell, *jax_problem(cell, T, B, np.float64, seed, extra=((T, B, cell.state_size),)))


def _adjoint_states(cell, sums, hoist=True):
    """The flat states by BPTT through the cell's adjoint, the parameter gradients summed after the
    loop (``sums="after"``) or in it (``"in_loop"``): the plan's fields say which."""
    def states(p, x, s0):
        plan = bppsa.Options(backward="bptt", precision="highest", unroll=1).plan(cell, x, s0)
        plan = plan.replace(hoist=hoist, weights_in_loop=sums == "in_loop")
        return bppsa_states(cell, plan, p, x, s0)
    return states


def _reference(cell):
    return lambda p, x, s0: cell.flatten_state(scan_states(cell, p, x, cell.unflatten_state(s0)))


def _loss(states_fn, weights):
    return lambda p, x, s0: jnp.sum(jnp.sin(states_fn(p, x, s0)) * weights)


def _check_gradients(name, T, B, sums, hoist):
    cell, params, xs, h0, w = _setup(name, T, B)
    assert cell.has_adjoint
    grads = lambda f: jax.jit(jax.value_and_grad(_loss(f, w), argnums=(0, 1, 2)))(params, xs, h0)
    want, got = grads(_reference(cell)), grads(_adjoint_states(cell, sums, hoist))
    assert max_tree_diff(got, want, relative=True) < 1e-12, (name, T, B, sums, hoist)


@pytest.mark.parametrize("name", [n if n not in ("flax-gru", "gru-flax-biases")  # flax-lstm, lstm-flax-biases stay
                                  else pytest.param(n, marks=pytest.mark.slow)
                                  for n in sorted(set(CELLS) - {"rnn-sigmoid", "flax-simple", "flax-optimized-lstm"})])
def test_adjoint_bptt_gradients_match_autodiff(name):
    """T = 1, odd and non-power-of-two lengths, B = 1; the parameter gradients after the loop and
    in it, the input product hoisted and not (every cell, every combination: the slow test below)."""
    for T, B, sums, hoist in [(1, 1, "after", False), (7, 1, "in_loop", True), (12, 3, "after", True),
                                (12, 3, "in_loop", False)]:
        _check_gradients(name, T, B, sums, hoist)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CELLS))
@pytest.mark.parametrize("T, B", [(1, 1), (7, 1), (12, 3), (33, 2)])
@pytest.mark.parametrize("sums", ["after", "in_loop"])
def test_adjoint_bptt_gradients_match_autodiff_every_combination(name, T, B, sums):
    for hoist in (True, False):
        _check_gradients(name, T, B, sums, hoist)


@pytest.mark.parametrize("name, sums", [("gru", "after"), ("flax-lstm", "in_loop"),
                                          pytest.param("rnn-tanh", "after", marks=pytest.mark.slow),
                                          pytest.param("rnn-tanh", "in_loop", marks=pytest.mark.slow),
                                          pytest.param("gru", "in_loop", marks=pytest.mark.slow),
                                          pytest.param("lstm", "after", marks=pytest.mark.slow),
                                          pytest.param("lstm", "in_loop", marks=pytest.mark.slow),
                                          pytest.param("flax-lstm", "after", marks=pytest.mark.slow)])
def test_adjoint_bptt_forward_mode_and_hessian_vector_products(name, sums):
    cell, params, xs, h0, w = _setup(name, 9, 2, seed=1)
    tangent = jax.tree.map(lambda a: jax.random.normal(jax.random.key(7), a.shape, a.dtype), params)
    ref, ours = _loss(_reference(cell), w), _loss(_adjoint_states(cell, sums), w)
    jvp = lambda f: jax.jit(lambda t: jax.jvp(lambda p: f(p, xs, h0), (params,), (t,))[1])(tangent)
    assert abs(float(jvp(ours) - jvp(ref))) < 1e-12
    hvp = lambda f: jax.jit(lambda t: jax.jvp(jax.grad(lambda p: f(p, xs, h0)), (params,), (t,))[1])(tangent)
    assert max_tree_diff(hvp(ours), hvp(ref), relative=True) < 1e-11


@pytest.mark.parametrize("name", sorted(CELLS))
def test_the_adjoint_step_is_the_transposed_jacobian_and_its_factors_the_step(name):
    """adjoint_step's g_prev = g @ M_t (the cell's transposed_jacobian); step_factors' state = the step's."""
    cell, params, xs, h0, w = _setup(name, 1, 5, seed=2)
    h = cell.unflatten_state(h0)
    u = cell.project(params, xs[0])
    new, factors = cell.step_factors(params, h, u)
    assert max_tree_diff(new, cell.step_projected(params, h, u), relative=True) < 1e-15
    g = w[0]
    M = cell.transposed_jacobian(params, h0[None], xs[:1], cell.flatten_state(new)[None])[0]
    g_prev, _ = cell.adjoint_step(params, factors, g)
    assert max_tree_diff(g_prev, jnp.einsum("bi,bij->bj", g, M), relative=True) < 1e-13


def test_bptt_runs_the_adjoint_for_cells_that_have_one_and_autodiff_otherwise():
    cell, params, xs, h0, w = _setup("gru", 6, 2)
    uses_solve = lambda c, p: "linear_solve" in str(jax.make_jaxpr(jax.grad(
        lambda q: jnp.sum(c.flatten_state(bppsa.rnn(c, q, xs, c.unflatten_state(h0), backward="bptt")))))(p))
    assert uses_solve(cell, params)
    generic = cells.Generic(lambda p, h, x: jnp.tanh(x @ p["A"] + h @ p["W"]), hidden_size=4, input_size=3)
    gp = {"A": jnp.ones((3, 4)) * 0.1, "W": jnp.eye(4) * 0.5}
    assert not generic.has_adjoint and not uses_solve(generic, gp)
    got = jax.grad(lambda p: jnp.sum(bppsa.rnn(cell, p, xs, h0, backward="bptt") * w))(params)
    want = jax.grad(lambda p: jnp.sum(_reference(cell)(p, xs, h0) * w))(params)
    assert max_tree_diff(got, want, relative=True) < 1e-12


def test_the_plan_sums_parameter_gradients_in_the_loop_for_large_batches_and_steps_on_cpu():
    """In the loop on CPU from B = 32 when B·G·H > 1024; after it otherwise, and off CPU always."""
    cpu = jax.default_backend() == "cpu"
    for cell, B, in_loop in ((cells.GRU(3, 16), 8, False), (cells.GRU(3, 16), 31, False), (cells.GRU(3, 16), 32, True),
                             (cells.RNN(3, 16), 32, False), (cells.RNN(3, 16), 64, False), (cells.RNN(3, 16), 65, True),
                             (cells.LSTM(3, 16), 64, True)):
        xs, s0 = jnp.zeros((5, B, 3)), jnp.zeros((B, cell.state_size))
        assert bppsa.Options(backward="bptt").plan(cell, xs, s0).weights_in_loop is (in_loop and cpu), (cell, B)
        assert bppsa.Options(backward="bppsa").plan(cell, xs, s0).weights_in_loop is False
        assert bppsa.plan.rules.adjoint_in_loop(cell, B, "cpu") is in_loop
        assert not bppsa.plan.rules.adjoint_in_loop(cell, B, "gpu")


@pytest.mark.parametrize("name", sorted(CELLS))
def test_the_in_loop_sums_are_the_parameter_gradients(name):
    """adjoint_sum_step over every step (from adjoint_sum_inputs: x and h transposed, a row of ones
    for each bias), summed, then adjoint_sum_result = adjoint_grads' dparams; its per-step input
    cotangents = adjoint_grads' dxs; on the loop form of the parameters (loop_params) as on params."""
    T, B = 5, 3
    cell, params, xs, h0, w = _setup(name, T, B, seed=3)
    ss = _reference(cell)(params, xs, h0)
    previous = jnp.concatenate([h0[None], ss[:-1]], axis=0)
    factors = jax.vmap(lambda s, u: cell.step_factors(params, cell.unflatten_state(s), u)[1])(
        previous, cell.project(params, xs))
    cots = jax.vmap(lambda f, g: cell.adjoint_step(params, f, g)[1])(factors, w)
    want_dp, want_dx = cell.adjoint_grads(params, previous, xs, factors, w, cots)
    inputs = cell.adjoint_sum_inputs(params, previous, xs)
    assert all(a.shape[:1] == (T,) and a.shape[-1] == B for a in jax.tree.leaves(inputs))
    for form in (params, cell.loop_params(params)):
        parts, dxs = zip(*(cell.adjoint_sum_step(form, *jax.tree.map(lambda a: a[t], (inputs, factors)), w[t],
                                                 jax.tree.map(lambda a: a[t], cots)) for t in range(T)))
        sums = jax.tree.map(lambda *a: sum(a), *parts)
        assert max_tree_diff(cell.adjoint_sum_result(params, sums), want_dp, relative=True) < 1e-13
        assert max_tree_diff(jnp.stack(dxs), want_dx, relative=True) < 1e-13
        x, h = xs[0], cell.unflatten_state(h0)
        stepped = cell.step_projected(form, h, cell.project(form, x))
        assert max_tree_diff(stepped, cell.step(params, h, x), relative=True) < 1e-15
