"""A cell's step that reads arrays besides its arguments (bppsa.cells.closure): every forward and
backward computes with the values of the call, compiled programs are reused only for the same
function, and gradients reach a closed-over traced value; float64, against autodiff through a
plain lax.scan."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import bppsa
from bppsa import backprop, cells
from bppsa.cells import closure
from bppsa.errors import UsageError
from tests.helpers import normal

S, I, T, B = 4, 3, 9, 2


def reference(U, W, xs, h0, mask=None):
    """h_t = tanh(W h + U x [masked]) by autodiff's plain lax.scan, batched."""
    def body(h, x):
        a = h @ W.T + x @ U.T
        h = jnp.tanh(a if mask is None else jnp.where(mask, a, 0.0))
        return h, h
    return jax.lax.scan(body, h0, xs)[1]


@pytest.fixture
def data():
    xs = normal(1, (T, B, I))
    return {"U": normal(2, (S, I), 0.5)}, xs, jnp.zeros((B, S))


# the parallel forwards with changed values in the default run: tests/cells/test_read_values.py
@pytest.mark.parametrize("forward", [pytest.param("newton", marks=pytest.mark.slow),
                                     pytest.param("quasi", marks=pytest.mark.slow), "sequential"])
def test_a_rebound_global_is_read_at_every_call(forward, data):
    """The probe's case: a step reading a global W, rebound between two eager calls; the second
    call returned the first W's states (0.54 away) and a wrong gradient with forward="newton"."""
    params, xs, h0 = data
    box = {"W": normal(3, (S, S), 0.4)}
    cell = cells.Generic(lambda p, h, x: jnp.tanh(box["W"] @ h + p["U"] @ x), hidden_size=S, input_size=I)
    loss = lambda p: bppsa.rnn(cell, p, xs, h0, forward=forward).sum()  # noqa: E731
    for seed in (4, 5, 6):
        box["W"] = normal(seed, (S, S), 0.4)
        want = reference(params["U"], box["W"], xs, h0)
        np.testing.assert_allclose(bppsa.rnn(cell, params, xs, h0, forward=forward), want, rtol=0, atol=1e-12)
        grad = jax.grad(lambda p: reference(p["U"], box["W"], xs, h0).sum())(params)["U"]
        np.testing.assert_allclose(jax.grad(loss)(params)["U"], grad, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(jax.jit(jax.grad(loss))(params)["U"], grad, rtol=1e-10, atol=1e-12)


def test_a_numpy_array_updated_in_place_and_the_compiled_solver_reused(data):
    params, xs, h0 = data
    W = np.array(normal(7, (S, S), 0.4))
    cell = cells.Generic(lambda p, h, x: jnp.tanh(W @ h + p["U"] @ x), hidden_size=S, input_size=I)
    backprop.compiled_solver.cache_clear()
    for seed in (8, 9):
        W[...] = np.asarray(normal(seed, (S, S), 0.4))
        out = bppsa.rnn(cell, params, xs, h0, forward="newton")
        np.testing.assert_allclose(out, reference(params["U"], jnp.asarray(W), xs, h0), rtol=0, atol=1e-12)
    info = backprop.compiled_solver.cache_info()
    assert (info.misses, info.hits) == (1, 1)  # the same function of its operands: compiled once


def test_a_python_scalar_rebound_is_another_function(data):
    params, xs, h0 = data
    W = normal(10, (S, S), 0.4)
    box = {"gain": 1.0}
    cell = cells.Generic(lambda p, h, x: jnp.tanh(box["gain"] * (W @ h) + p["U"] @ x), hidden_size=S,
                         input_size=I)
    for gain in (1.0, 0.3):
        box["gain"] = gain
        out = bppsa.rnn(cell, params, xs, h0, forward="newton")
        np.testing.assert_allclose(out, reference(params["U"], gain * W, xs, h0), rtol=0, atol=1e-12)


def test_an_integer_mask_is_kept_by_value(data):
    params, xs, h0 = data
    W = normal(11, (S, S), 0.4)
    box = {"mask": np.array([1, 0, 1, 1], bool)}
    cell = cells.Generic(lambda p, h, x: jnp.tanh(jnp.where(box["mask"], W @ h + p["U"] @ x, 0.0)),
                         hidden_size=S, input_size=I)
    for mask in ([1, 0, 1, 1], [0, 1, 1, 0]):
        box["mask"] = np.array(mask, bool)
        want = reference(params["U"], W, xs, h0, box["mask"])
        np.testing.assert_allclose(bppsa.rnn(cell, params, xs, h0, forward="newton"), want, rtol=0, atol=1e-12)
        grad = jax.grad(lambda p: reference(p["U"], W, xs, h0, box["mask"]).sum())(params)["U"]
        got = jax.grad(lambda p: bppsa.rnn(cell, p, xs, h0).sum())(params)["U"]
        np.testing.assert_allclose(got, grad, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("length, backward, forward", [  # each pair at one length or both: the rest in test-all
    (T, b, f) if (T, b, f) not in ((1, "bptt", "newton"), (9, "bppsa", "newton"), (1, "bppsa", "quasi"),
                                   (9, "bptt", "sequential")) else pytest.param(T, b, f, marks=pytest.mark.slow)
    for T in (1, 9) for b, f in (("bppsa", "sequential"), ("bppsa", "newton"), ("bptt", "newton"),
                                 ("bptt", "sequential"), ("bppsa", "quasi"))])
def test_gradient_through_a_closed_over_traced_array(backward, forward, length, data):
    """The probe's item 6: jax.grad of a loss that builds the cell from the differentiated W
    (UnexpectedTracerError with backward="bppsa" and with forward="newton")."""
    params, xs, h0 = data
    xs = xs[:length]
    W0 = normal(12, (S, S), 0.4)

    def loss(W, U):
        cell = cells.Generic(lambda p, h, x: jnp.tanh(W @ h + p["U"] @ x), hidden_size=S, input_size=I)
        return jnp.sum(bppsa.rnn(cell, {"U": U}, xs, h0, backward=backward, forward=forward) ** 2)

    want = jax.grad(lambda W, U: jnp.sum(reference(U, W, xs, h0) ** 2), argnums=(0, 1))(W0, params["U"])
    for fn in (jax.grad(loss, argnums=(0, 1)), jax.jit(jax.grad(loss, argnums=(0, 1)))):
        for got, ref in zip(fn(W0, params["U"]), want):
            np.testing.assert_allclose(got, ref, rtol=1e-10, atol=1e-12)


def test_a_jacobian_fn_closing_over_a_traced_array(data):
    params, xs, h0 = data
    W0 = normal(13, (S, S), 0.4)

    def loss(W):
        step = lambda p, h, x: jnp.tanh(W @ h + p["U"] @ x)  # noqa: E731
        jac = lambda p, h, x: (1 - step(p, h, x) ** 2)[:, None] * W  # noqa: E731
        cell = cells.Generic(step, jacobian_fn=jac, hidden_size=S, input_size=I)
        return jnp.sum(bppsa.rnn(cell, params, xs, h0) ** 2)

    want = jax.grad(lambda W: jnp.sum(reference(params["U"], W, xs, h0) ** 2))(W0)
    np.testing.assert_allclose(jax.grad(loss)(W0), want, rtol=1e-10, atol=1e-12)


def test_forward_mode_and_hvp_through_a_closed_over_array(data):
    params, xs, h0 = data
    W0 = normal(14, (S, S), 0.4)

    def loss(W):
        cell = cells.Generic(lambda p, h, x: jnp.tanh(W @ h + p["U"] @ x), hidden_size=S, input_size=I)
        return jnp.sum(bppsa.rnn(cell, params, xs, h0) ** 2)

    ref = lambda W: jnp.sum(reference(params["U"], W, xs, h0) ** 2)  # noqa: E731
    V = normal(15, (S, S))
    np.testing.assert_allclose(jax.jvp(loss, (W0,), (V,))[1], jax.jvp(ref, (W0,), (V,))[1], rtol=1e-10)
    hvp = lambda f: jax.jvp(jax.grad(f), (W0,), (V,))[1]  # noqa: E731
    np.testing.assert_allclose(hvp(loss), hvp(ref), rtol=1e-9, atol=1e-12)


def test_a_traced_integer_in_the_closure_is_a_one_line_error(data):
    params, xs, h0 = data

    @jax.jit
    def run(k):
        cell = cells.Generic(lambda p, h, x: jnp.tanh(jnp.roll(h, k) + p["U"] @ x), hidden_size=S, input_size=I)
        return bppsa.rnn(cell, params, xs, h0)

    with pytest.raises(UsageError, match=r"^Generic's step_fn reads a traced int\d+ array of shape \(\) from its "
                                         r"closure; integer, boolean and key values a step reads must be concrete"):
        run(1)


def test_a_subclass_reading_a_global_is_not_kept_across_calls(data):
    """Another kind of cell that reads an array besides its arguments: no compiled solver kept."""
    params, xs, h0 = data
    box = {"W": normal(16, (S, S), 0.4)}

    class Reads(cells.Generic):
        def step(self, p, h, x):
            return jnp.tanh(h @ box["W"].T + x @ p["U"].T)

    cell = Reads(lambda p, h, x: jnp.tanh(box["W"] @ h + p["U"] @ x), hidden_size=S, input_size=I)
    assert closure.program_key(cell, params, xs, h0) is None
    assert closure.program_key(cells.GRU(I, S), cells.GRU(I, S).init(jax.random.key(0)), xs, h0) is not None
    for seed in (17, 18):
        box["W"] = normal(seed, (S, S), 0.4)
        out = bppsa.rnn(cell, params, xs, h0, forward="newton")
        np.testing.assert_allclose(out, reference(params["U"], box["W"], xs, h0), rtol=0, atol=1e-12)


def test_a_closure_free_generic_is_left_as_it_is(data):
    params, xs, h0 = data
    cell = cells.Generic(lambda p, h, x: jnp.tanh(p["U"] @ x + h), hidden_size=S, input_size=I)
    assert closure.lift(cell, params, xs, h0) == (cell, params)


def test_a_failure_message_names_the_users_cell_and_params(data):
    params, xs, h0 = data
    W = normal(19, (S, S), 3.0)
    cell = cells.Generic(lambda p, h, x: jnp.tanh(W @ h + p["U"] @ x), hidden_size=S, input_size=I)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(bppsa.forward.newton.NewtonDidNotConverge, match="the parallel forward of Generic did not"):
            bppsa.rnn(cell, params, xs * 20, h0, forward="newton", max_iter=1, on_fail="raise")
    assert not caught


def test_the_mesh_reads_the_values_of_each_call_and_differentiates_them(data):
    params, xs, h0 = data
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:4]), ("seq",))
    box = {"W": normal(20, (S, S), 0.4)}
    cell = cells.Generic(lambda p, h, x: jnp.tanh(box["W"] @ h + p["U"] @ x), hidden_size=S, input_size=I)
    for seed in (21, 22):
        box["W"] = normal(seed, (S, S), 0.4)
        out = bppsa.rnn(cell, params, xs, h0, mesh=mesh)
        np.testing.assert_allclose(out, reference(params["U"], box["W"], xs, h0), rtol=0, atol=1e-12)

    def loss(W):
        c = cells.Generic(lambda p, h, x: jnp.tanh(W @ h + p["U"] @ x), hidden_size=S, input_size=I)
        return jnp.sum(bppsa.rnn(c, params, xs, h0, mesh=mesh) ** 2)

    want = jax.grad(lambda W: jnp.sum(reference(params["U"], W, xs, h0) ** 2))(box["W"])
    # under jit: an eager grad runs the shard_map's transpose op by op (~9 s here against ~0.5 s); W is
    # a traced value in the cell's closure either way
    np.testing.assert_allclose(jax.jit(jax.grad(loss))(box["W"]), want, rtol=1e-10, atol=1e-12)
