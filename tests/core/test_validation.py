"""Bad input to bppsa.rnn / bppsa.parallel.rnn: params checked against the cell's param_spec,
method arguments, h0 — each a one-line UsageError (a ValueError) naming what was wrong and what
was expected, raised the same way under BPTT, BPPSA and the sequence-parallel entry point."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import bppsa
from bppsa import cells, parallel
from bppsa.errors import UsageError
from tests.helpers import one_line_usage_error

T, B, I, H = 5, 2, 3, 4


def _entry_points(cell, xs, h0, **kw):
    """bppsa.rnn under both backwards (its gradient too) and parallel.rnn, on params p."""
    return [
        lambda p: bppsa.rnn(cell, p, xs, h0, backward="bptt", **kw),
        lambda p: jax.grad(lambda q: bppsa.rnn(cell, q, xs, h0, **kw)[-1].sum())(p),
        lambda p: jax.jit(lambda q: bppsa.rnn(cell, q, xs, h0, **kw))(p),  # raised at trace time
        lambda p: parallel.rnn(cell, p, xs, h0, **kw),
    ]


def test_param_spec_is_init_traced():
    for cell in (cells.RNN(I, H), cells.GRU(I, H), cells.LSTM(I, H)):
        spec = cell.param_spec(jnp.float64)
        params = cell.init(jax.random.key(0), jnp.float64)
        assert jax.tree.structure(spec) == jax.tree.structure(params)
        for s, p in zip(jax.tree.leaves(spec), jax.tree.leaves(params)):
            assert isinstance(s, jax.ShapeDtypeStruct) and (s.shape, s.dtype) == (p.shape, p.dtype)
    assert cells.Generic(lambda p, h, x: h).param_spec() is None  # no init_fn: not checked


def test_params_checked_against_the_cells_structure(problem):
    cell, p, xs, h0 = problem(cells.GRU(I, H), T, B, h0_scale=0)
    cases = [
        ({k: v for k, v in p.items() if k != "W_h"}, r"params\['W_h'\] is missing: GRU expects a leaf of shape \(4, 12\)"),
        ({**p, "W_hh": p["W_h"]}, r"params\['W_hh'\] \(shape \(4, 12\)\) is not a parameter of GRU; expected exactly "
                                  r"params\['W_h'\], params\['W_x'\]"),
        ({**p, "W_x": p["W_h"], "W_h": p["W_x"]}, r"params\['W_h'\] has shape \(3, 12\); GRU expects \(4, 12\)"),
        ({**p, "W_h": p["W_h"].T}, r"params\['W_h'\] has shape \(12, 4\); GRU expects \(4, 12\)"),
        ({**p, "b_x": p["b_x"][None]}, r"params\['b_x'\] has shape \(1, 12\); GRU expects \(12,\)"),
        ({**p, "b_h": p["b_h"][0]}, r"params\['b_h'\] has shape \(\); GRU expects \(12,\)"),
        (None, r"params must be GRU's parameter pytree \(cell.init\(key\)\); got None"),
        (list(p.values()), r"params must be like GRU.init's output, a dict with params\['W_h'\], .*; got a list "
                           r"with params\[0\], params\[1\]"),
    ]
    for params, pattern in cases:
        for run in _entry_points(cell, xs, h0):
            one_line_usage_error(pattern, lambda: run(params))


def test_a_cell_subclass_with_init_is_checked_for_free():
    @dataclasses.dataclass(frozen=True)
    class Leaky(cells.RNN):  # a user cell: its own init, no param_spec of its own
        def init(self, key, dtype=jnp.float32):
            return {**super().init(key, dtype), "leak": jnp.full((self.hidden_size,), 0.5, dtype)}

    cell = Leaky(I, H)
    p = cell.init(jax.random.key(0), jnp.float64)
    one_line_usage_error(r"params\['leak'\] has shape \(1,\); Leaky expects \(4,\)",
                         lambda: bppsa.rnn(cell, {**p, "leak": p["leak"][:1]}, jnp.ones((T, B, I)), jnp.zeros((B, H))))


def test_generic_params_checked_only_with_init_fn():
    step = lambda p, h, x: jnp.tanh(x @ p["A"] + h @ p["W"])
    init = lambda key, dtype: {"A": jnp.zeros((I, H), dtype), "W": jnp.zeros((H, H), dtype)}
    p = {"A": jnp.ones((I, H)) / 3, "W": jnp.eye(H) / 2, "unused": jnp.ones(7)}
    xs, h0 = jnp.ones((T, B, I)), jnp.zeros((B, H))
    one_line_usage_error(r"params\['unused'\] \(shape \(7,\)\) is not a parameter of Generic",
                         lambda: bppsa.rnn(cells.Generic(step, init_fn=init), p, xs, h0))
    out = bppsa.rnn(cells.Generic(step), p, xs, h0, backward="bptt")  # no spec: the user's business
    assert out.shape == (T, B, H)
    one_line_usage_error(r"Generic.step must return the state's shape \[\(2, 4\)\]; it returns \[\(2, 5\)\]",
                         lambda: bppsa.rnn(cells.Generic(lambda p, h, x: jnp.concatenate([h, x[:1]])), p, xs, h0))


def test_chunk_size_accepts_integer_scalars(problem):
    cell, p, xs, h0 = problem(cells.GRU(I, H), T, B, h0_scale=0)
    for chunk in (np.int64(2), np.int32(2), jnp.int32(2), jnp.array(2, jnp.int64)):
        got = bppsa.Options(chunk_size=chunk).chunk_size
        assert got == 2 and type(got) is int

    def program(chunk):  # the gradient's traced program (nothing compiled)
        return str(jax.make_jaxpr(jax.grad(lambda q: bppsa.rnn(cell, q, xs, h0, chunk_size=chunk)[-1].sum()))(p))

    # an integer scalar gives the plain int's program, and that program is a chunked one
    assert program(np.int64(2)) == program(jnp.int32(2)) == program(2) != program(None)
    for chunk in (True, np.bool_(True), 2.0, np.float64(2.0), jnp.array(2.0), jnp.array([2]), 0, np.int64(-1), "2"):
        one_line_usage_error(r"chunk_size must be a positive int, None or 'auto'; got",
                             lambda: bppsa.rnn(cell, p, xs, h0, chunk_size=chunk))
    one_line_usage_error(r"chunk_size must be a concrete positive int \(static under jit\); got a traced int",
                         lambda: jax.jit(lambda c: bppsa.rnn(cell, p, xs, h0, chunk_size=c))(2))
    one_line_usage_error(r"chunk_size=2 cannot be combined with mesh", lambda: parallel.rnn(cell, p, xs, h0, chunk_size=np.int64(2)))


def test_method_arguments_and_h0_named(problem):
    cell, p, xs, h0 = problem(cells.GRU(I, H), T, B, h0_scale=0)
    for entry in (bppsa.rnn, parallel.rnn):
        one_line_usage_error(r"scan must be one of \['associative', 'blelloch', 'sequential'\] or None; got \[\]",
                             lambda: entry(cell, p, xs, h0, scan=[]))
        one_line_usage_error(r"backward must be one of \['bppsa', 'bptt', 'auto'\]; got \{\}",
                             lambda: entry(cell, p, xs, h0, backward={}))
        one_line_usage_error(r"h0 must be the initial state, a \(B, H\) = \(2, 4\) array \(e.g. jnp.zeros\); got None",
                             lambda: entry(cell, p, xs, None))
    one_line_usage_error(r"combine must be one of .*; got \[\]", lambda: parallel.rnn(cell, p, xs, h0, combine=[]))
    lstm = cells.LSTM(I, H)
    one_line_usage_error(r"c0 must be the initial state, a \(B, H\) = \(2, 4\) array",
                         lambda: bppsa.rnn(lstm, lstm.init(jax.random.key(0)), xs, (h0, None)))


def test_h0_dtype_must_survive_a_step(problem):
    cell, p, xs, h0 = problem(cells.GRU(I, H), T, B, h0_scale=0)
    p32 = jax.tree.map(lambda a: a.astype(jnp.float32), p)
    for run in _entry_points(cell, xs, h0.astype(jnp.float32)):
        one_line_usage_error(r"h0 has dtype float32 but GRU.step turns it into float64 \(from params' dtype float64\); "
                             r"pass h0 as float64, or params and xs as float32", lambda: run(p))
    one_line_usage_error(r"h0 has dtype float32 but GRU.step turns it into float64 \(from xs' dtype float64\)",
                         lambda: bppsa.rnn(cell, p32, xs, h0.astype(jnp.float32)))
    # a state the step keeps in its dtype is fine: float32 everywhere, or a float64 state with float32 params
    assert bppsa.rnn(cell, p32, xs.astype(jnp.float32), h0.astype(jnp.float32)).dtype == jnp.float32
    assert bppsa.rnn(cell, p32, xs, h0).dtype == jnp.float64
    weak = jnp.broadcast_to(jnp.asarray(0.0), (B, H))  # weakly typed float64: lax.scan promotes it
    assert bppsa.rnn(cell, p32, xs.astype(jnp.float32), weak).dtype == jnp.float32


def test_numpy_and_jax_scalars_are_numbers_and_ints(problem):
    """tol, damping and max_iter take numpy and JAX scalars (tol=np.float32(1e-5) and damping=
    np.float32(1) were refused as 'must be a number') and store Python floats and ints; NaN, inf,
    bools and arrays that are not 0-d are still refused."""
    cell, p, xs, h0 = problem(cells.GRU(I, H), T, B, h0_scale=0)
    o = bppsa.Options(forward="newton", tol=np.float32(1e-5), damping=np.float32(1), max_iter=jnp.int32(7))
    assert (type(o.tol), type(o.damping), type(o.max_iter)) == (float, float, int)
    assert (o.tol, o.damping, o.max_iter) == (float(np.float32(1e-5)), 1.0, 7)
    assert bppsa.Options(tol=jnp.float32(1e-5), damping=jnp.array(0.5), max_iter=np.int64(3)) == \
        bppsa.Options(tol=float(np.float32(1e-5)), damping=0.5, max_iter=3)
    hs = bppsa.rnn(cell, p, xs, h0, forward="newton", tol=np.float64(1e-9), damping=np.float32(1), on_fail="raise")
    np.testing.assert_allclose(hs, bppsa.rnn(cell, p, xs, h0), rtol=1e-7)
    for field, bad in [("tol", np.float32("nan")), ("tol", np.float64(1.0)), ("tol", np.bool_(True)),
                       ("tol", jnp.array([1e-5])), ("damping", np.float64("inf")), ("damping", jnp.float32("nan")),
                       ("damping", np.float32(-1)), ("max_iter", np.float64(3.0)), ("max_iter", jnp.array([3]))]:
        one_line_usage_error(rf"^{field} must be", lambda: bppsa.Options(**{field: bad}))


def test_as_int_and_as_number_are_the_one_test():
    """bppsa.errors.as_int / as_number: ints and floats, numpy scalars, 0-d numpy and JAX arrays, as
    Python ints and floats; never bools, strings, complex numbers or arrays of other shapes; and the
    config checks built on them (require_int, require_ints, require_number) take the same."""
    from bppsa.errors import as_int, as_number, require_int, require_ints, require_number
    for v in (3, np.int64(3), np.uint8(3), np.array(3), jnp.int32(3), jnp.array(3, jnp.int64)):
        assert as_int(v) == 3 and type(as_int(v)) is int and as_number(v) == 3, repr(v)
    for v in (2.5, np.float32(2.5), np.float16(2.5), np.array(2.5), jnp.float32(2.5), jnp.bfloat16(2.5)):
        assert as_int(v) is None and as_number(v) == 2.5 and type(as_number(v)) is float, repr(v)
    for v in (True, np.bool_(False), jnp.array(True), "3", None, 1j, np.complex64(1), [3], np.array([3]),
              jnp.zeros((1,), jnp.int32)):
        assert as_int(v) is None and as_number(v) is None, repr(v)
    assert np.isnan(as_number(np.float32("nan")))  # a number: ranges are the caller's
    assert jax.jit(lambda x: jnp.asarray(as_int(x) is None))(3)  # a traced value is not concrete
    config = {"n": np.int64(4), "lr": np.float32(0.5), "sizes": [np.int64(1), jnp.int32(2), 3]}
    assert require_int(config, "n") == 4 and type(require_int(config, "n")) is int
    assert require_number(config, "lr") == 0.5 and require_ints(config, "sizes") == (1, 2, 3)
    for key, check in (("flag", require_int), ("flag", require_number), ("nan", require_number)):
        with pytest.raises(UsageError, match=rf"^config.{key} must be"):
            check({"flag": np.bool_(True), "nan": np.float64("nan")}, key)


def test_cell_sizes_take_integer_scalars():
    """input_size and hidden_size given as numpy or JAX integers are stored as ints (the same
    cell, hash included, as with plain ints)."""
    for cls in (cells.RNN, cells.GRU, cells.LSTM):
        cell = cls(np.int64(I), jnp.int32(H))
        assert cell == cls(I, H) and hash(cell) == hash(cls(I, H)) and type(cell.input_size) is int
    one_line_usage_error(r"^GRU: hidden_size must be a positive int; got np.float64\(4.0\)", lambda: cells.GRU(I, np.float64(4)))


def test_a_missing_config_key_is_named():
    """require_int and the others on a key the config lacks: a UsageError naming it (was a bare KeyError)."""
    from bppsa.errors import require_choices, require_int, require_ints, require_number
    config = {"model": {"hidden": 3}}
    assert require_int(config, "model.hidden") == 3
    for check, key in ((require_int, "model.depth"), (require_ints, "sizes"), (require_number, "model.lr.max")):
        with pytest.raises(UsageError, match=rf"config.{key}: the config has no"):
            check(config, key)
    with pytest.raises(UsageError, match=r"config.mode: the config has no 'mode'"):
        require_choices(config, "mode", ("a", "b"))
