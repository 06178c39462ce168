"""Every kind of value a step reads besides its arguments is followed from call to call: Python and
numpy scalars (float, int, bool), a 0-d numpy array updated in place, a float in a nested closure,
a dict or an object's attribute, a PRNG key. The held-out probe's case: the parallel forward's
compiled solver was kept per (cell, plan) and returned the first value's states (|hs - lax.scan|
up to 1.92) with ``converged=True``, and the wrong gradients from them. Each case changes the value
between two eager calls (the first call compiles and keeps the solver) and compares the states
and gradients with autodiff through a plain ``lax.scan`` of the same step, in float64."""

import dataclasses
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import bppsa
from bppsa import cells
from bppsa.cells import closure
from bppsa.errors import UsageError
from tests.helpers import normal

S, I, T, B = 3, 3, 7, 2
XS, H0 = normal(1, (T, B, I)), jnp.zeros((B, S))
PARAMS = {"W": 0.6 * jnp.eye(S) + normal(2, (S, S), 0.2)}
ATOL = 1e-11


def _kinds():
    """name -> (set(value): makes the step read ``value`` from then on, read(): the scale it reads).
    Each kind keeps its value where the probe found one: a module global, a numpy scalar, a 0-d
    numpy array written in place, a float in a nested closure, in a dict, on an object; an int and
    a bool switch change the step's arithmetic; a PRNG key adds its own noise."""
    g = {"float": 0.5, "int": 1, "bool": True, "np": np.float32(0.5)}
    arr = np.array(0.5)
    box = {"t": 0.5}
    obj = SimpleNamespace(t=0.5)
    key = [jax.random.key(0)]

    def nested():
        t = [0.5]

        def outer():
            return lambda: t[0]
        return t, outer()

    cell_t, inner = nested()

    def set_arr(v):
        arr[...] = v

    def set_key(v):
        key[0] = jax.random.key(int(v * 10) % 7)

    return {
        "python float": (lambda v: g.__setitem__("float", float(v)), lambda: g["float"]),
        "python int": (lambda v: g.__setitem__("int", int(round(v * 2))), lambda: g["int"] * 0.5),
        "python bool": (lambda v: g.__setitem__("bool", v > 0), lambda: 0.5 if g["bool"] else -0.9),
        "numpy scalar": (lambda v: g.__setitem__("np", np.float32(v)), lambda: g["np"]),
        "0-d numpy array in place": (set_arr, lambda: arr),
        "nested closure": (lambda v: cell_t.__setitem__(0, v), lambda: inner()),
        "dict": (lambda v: box.__setitem__("t", v), lambda: box["t"]),
        "attribute": (lambda v: setattr(obj, "t", v), lambda: obj.t),
        "prng key": (set_key, lambda: 0.5 + 0.1 * jax.random.normal(key[0], ())),
    }


def _step(read):
    return lambda p, h, x: jnp.tanh(read() * (h @ p["W"]) + x)


@dataclasses.dataclass(frozen=True)
class _Subclass(cells.Cell):
    """A user's own frozen-dataclass cell whose step reads ``read()``: equal instances hash equal."""

    read: object = None
    input_size: int = I
    hidden_size: int = S

    def init(self, key, dtype=jnp.float64):
        return PARAMS

    def step(self, p, h, x):
        return _step(self.read)(p, h, x)


def _cell(kind, read):
    if kind == "generic":
        return cells.Generic(_step(read), hidden_size=S, input_size=I)
    return _Subclass(read)


def _reference(read, params):
    step = _step(read)
    return jax.lax.scan(lambda h, x: (step(params, h, x),) * 2, H0, XS)[1]


def _changes(kind_name, cell_kind, forward, backward="bppsa"):
    set_value, read = _kinds()[kind_name]
    cell = _cell(cell_kind, read)
    for value in (0.5, -0.9, 0.7):
        set_value(value)
        out = bppsa.rnn(cell, PARAMS, XS, H0, forward=forward, backward=backward)
        np.testing.assert_allclose(out, _reference(read, PARAMS), rtol=0, atol=ATOL)
        loss = lambda p: jnp.sum(bppsa.rnn(cell, p, XS, H0, forward=forward, backward=backward) ** 2)  # noqa: E731
        want = jax.grad(lambda p: jnp.sum(_reference(read, p) ** 2))(PARAMS)["W"]
        np.testing.assert_allclose(jax.grad(loss)(PARAMS)["W"], want, rtol=1e-9, atol=ATOL)


# every kind and every cell kind once in the default run; the other four pairs: make test-all
_DEFAULT_PAIRS = {("python float", "generic"), ("prng key", "generic"), ("numpy scalar", "subclass"),
                  ("0-d numpy array in place", "subclass")}


@pytest.mark.parametrize("kind_name, cell_kind", [
    (k, c) if (k, c) in _DEFAULT_PAIRS else pytest.param(k, c, marks=pytest.mark.slow)
    for c in ("generic", "subclass") for k in ("python float", "numpy scalar", "0-d numpy array in place", "prng key")])
def test_a_changed_value_is_read_by_the_newton_forward(kind_name, cell_kind):
    _changes(kind_name, cell_kind, "newton")


@pytest.mark.slow
@pytest.mark.parametrize("kind_name", list(_kinds()))
@pytest.mark.parametrize("cell_kind", ["generic", "subclass"])
@pytest.mark.parametrize("forward,backward", [("newton", "bppsa"), ("quasi", "bptt"), ("sequential", "bppsa"),
                                              ("newton", "bptt")])
def test_every_kind_of_value_every_forward(kind_name, cell_kind, forward, backward):
    _changes(kind_name, cell_kind, forward, backward)


@pytest.mark.parametrize("kind_name", ["python bool", "nested closure", "dict",
                                       pytest.param("attribute", marks=pytest.mark.slow),  # make test-all
                                       pytest.param("python int", marks=pytest.mark.slow)])
def test_the_probe_case_quasi_and_the_nested_and_dict_values(kind_name):
    """Quasi-Newton with a bool switch, a nested closure, a dict, an attribute and an int (the
    default run's share of the slow matrix above; the attribute and the int: make test-all)."""
    _changes(kind_name, "subclass", "quasi")


def test_under_a_users_jit_the_value_of_each_trace_is_used():
    """A global read under a new ``jax.jit`` each time (a training loop that re-jits after changing a
    hyper-parameter): bppsa's kept solver is not reused for the old value inside the new trace."""
    set_value, read = _kinds()["python float"]
    cell = _cell("subclass", read)
    for value in (0.5, -0.9):
        set_value(value)
        out = jax.jit(lambda p: bppsa.rnn(cell, p, XS, H0, forward="newton"))(PARAMS)
        np.testing.assert_allclose(out, _reference(read, PARAMS), rtol=0, atol=ATOL)


def test_a_traced_scalar_in_a_users_jit_is_an_operand():
    """The scalar an argument of the user's jit, closed over by a Generic built inside it."""
    @jax.jit
    def run(t):
        cell = cells.Generic(_step(lambda: t), hidden_size=S, input_size=I)
        return bppsa.rnn(cell, PARAMS, XS, H0, forward="newton")

    for value in (0.5, -0.9):
        np.testing.assert_allclose(run(value), _reference(lambda: value, PARAMS), rtol=0, atol=ATOL)


# in the slow run (10-25 s each): the default run's mesh case is tests/cells/test_closure.py's
@pytest.mark.slow
@pytest.mark.parametrize("forward", ["sequential", "newton"])
def test_through_a_mesh(forward):
    set_value, read = _kinds()["python float"]
    cell = _cell("subclass", read)
    mesh = bppsa.parallel.make_mesh(seq=2, batch_axis=None)
    for value in (0.5, -0.9):
        set_value(value)
        out = bppsa.rnn(cell, PARAMS, XS, H0, forward=forward, mesh=mesh)
        np.testing.assert_allclose(out, _reference(read, PARAMS), rtol=0, atol=ATOL)
        loss = lambda p: jnp.sum(bppsa.rnn(cell, p, XS, H0, forward=forward, mesh=mesh) ** 2)  # noqa: E731
        want = jax.grad(lambda p: jnp.sum(_reference(read, p) ** 2))(PARAMS)["W"]
        np.testing.assert_allclose(jax.grad(loss)(PARAMS)["W"], want, rtol=1e-9, atol=ATOL)


class _TempCell(nnx.Module):
    """A flax cell (nnx's RNNCellBase contract) whose step reads a module-level temperature."""

    def __init__(self, read, *, rngs):
        self.read = read
        self.W = nnx.Param(PARAMS["W"])
        self.in_features, self.hidden_features = I, S

    def __call__(self, carry, x):
        h = jnp.tanh(self.read() * (carry @ self.W[...]) + x)
        return h, h

    def initialize_carry(self, input_shape, rngs=None):
        return jnp.zeros(input_shape[:-1] + (S,))

    @property
    def num_feature_axes(self):
        return 1


def test_a_flax_cell_in_the_drop_in():
    set_value, read = _kinds()["python float"]
    layer = bppsa.nn.RNN(_TempCell(read, rngs=nnx.Rngs(0)), forward="newton", time_major=True)
    ref = nnx.RNN(_TempCell(read, rngs=nnx.Rngs(0)), time_major=True)
    for value in (0.5, -0.9):
        set_value(value)
        np.testing.assert_allclose(layer(XS), ref(XS), rtol=0, atol=ATOL)


@pytest.mark.parametrize("forward, backward", [("sequential", "bppsa"), ("newton", "bptt"),
                                               pytest.param("sequential", "bptt", marks=pytest.mark.slow),
                                               pytest.param("newton", "bppsa", marks=pytest.mark.slow)])
def test_a_python_float_differentiated(forward, backward):
    """``jax.grad(loss)(0.7)`` with the float a params leaf or a closed-over value, every forward and
    backward (two pairs in the default run, the other two in make test-all), and grad of grad: it
    crashed ('TypedFloat' object has no attribute 'size')."""
    def ref_loss(t):
        return jnp.sum(_reference(lambda: t, PARAMS) ** 2)

    def leaf(t):
        cell = cells.Generic(lambda p, h, x: jnp.tanh(p["t"] * (h @ p["W"]) + x), hidden_size=S, input_size=I)
        return jnp.sum(bppsa.rnn(cell, {**PARAMS, "t": t}, XS, H0, forward=forward, backward=backward) ** 2)

    def closed(t):
        cell = cells.Generic(_step(lambda: t), hidden_size=S, input_size=I)
        return jnp.sum(bppsa.rnn(cell, PARAMS, XS, H0, forward=forward, backward=backward) ** 2)

    for loss in (leaf, closed):
        np.testing.assert_allclose(jax.grad(loss)(0.7), jax.grad(ref_loss)(0.7), rtol=1e-9)
    np.testing.assert_allclose(jax.grad(jax.grad(closed))(0.7), jax.grad(jax.grad(ref_loss))(0.7), rtol=1e-8)


def test_the_key_names_every_value_the_step_reads():
    """program_key: equal for equal values, different for a changed scalar (even one that prints the
    same to a few digits), None for a float array that is not an operand."""
    t = [0.5]
    cell = _Subclass(lambda: t[0])
    key = lambda: closure.program_key(cell, PARAMS, XS, H0)  # noqa: E731
    first = key()
    assert first == key()
    t[0] = 0.5 + 1e-15
    assert key() != first
    W = normal(3, (S,))
    assert closure.program_key(_Subclass(lambda: W), PARAMS, XS, H0) is None


def test_a_traced_integer_error_gives_advice_that_works():
    """The error for a traced integer a step closes over names the fix; following it works."""
    def run(k):
        step = lambda p, h, x: jnp.tanh(jnp.roll(h, k, axis=-1) @ p["W"] + x)  # noqa: E731
        cell = cells.Generic(step, hidden_size=S, input_size=I)
        return bppsa.rnn(cell, PARAMS, XS, H0)

    with pytest.raises(UsageError, match=r"static_argnums"):
        jax.jit(run)(1)
    out = jax.jit(run, static_argnums=0)(1)
    ref = jax.lax.scan(lambda h, x: (jnp.tanh(jnp.roll(h, 1, axis=-1) @ PARAMS["W"] + x),) * 2, H0, XS)[1]
    np.testing.assert_allclose(out, ref, rtol=0, atol=ATOL)
