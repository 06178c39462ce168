"""``precision=``: the BPPSA backward's matrix products at the requested precision.

On CPU precision changes no number, so the plumbing is checked in the traced program: every
dot_general of the backward (the VJP alone, without the forward) carries the requested precision,
for every cell, scan, chunking and the sharded path; in float64 the gradients are those of
autodiff through ``lax.scan`` (tests/reference.py) for every setting; bad values are UsageErrors
naming the argument.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import bppsa
from bppsa import cells, parallel
from bppsa.errors import UsageError
from tests.helpers import make_problem
from tests.reference import scan_states

PRECISIONS = {"highest": lax.Precision.HIGHEST, "high": lax.Precision.HIGH, "default": lax.Precision.DEFAULT}


def _dot_precisions(jaxpr, out):
    """The ``precision`` param of every dot_general in a jaxpr and its sub-jaxprs (scan, pjit,
    shard_map, custom calls)."""
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "dot_general":
            out.append(eqn.params["precision"])
        for value in eqn.params.values():
            for sub in value if isinstance(value, (tuple, list)) else (value,):
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    _dot_precisions(inner, out)
    return out


def _backward_dots(run, params, xs, h0):
    """Precisions of the dots of the VJP only. The forward is traced abstractly (jax.eval_shape:
    nothing is compiled or run) and the VJP is traced inside it, on the forward's residuals."""
    traced = []

    def forward_then_trace_vjp(*args):
        out, vjp = jax.vjp(run, *args)
        traced.append(jax.make_jaxpr(vjp)(jax.tree.map(jnp.ones_like, out)))
        return out

    jax.eval_shape(forward_then_trace_vjp, params, xs, h0)
    return _dot_precisions(traced[0].jaxpr, [])


CELLS = {"rnn": lambda: cells.RNN(input_size=3, hidden_size=4), "gru": lambda: cells.GRU(input_size=3, hidden_size=4),
         "lstm": lambda: cells.LSTM(input_size=3, hidden_size=4)}


@pytest.mark.parametrize("cell_name,scan,chunk_size", [  # the GRU's in one chunk: test-all (chunked stays)
    pytest.param("gru", "blelloch", None, marks=pytest.mark.slow), ("rnn", "blelloch", None),
    ("lstm", "sequential", None), ("rnn", "associative", None), ("gru", "blelloch", 16)])
def test_every_backward_dot_carries_the_requested_precision(cell_name, scan, chunk_size):
    cell = CELLS[cell_name]()
    params, xs, h0 = make_problem(cell, 40, 2, dtype=jnp.float32, h0_scale=0)[1:]
    for name, want in PRECISIONS.items():
        forms = (name, want, name.upper()) if (cell_name, scan, chunk_size) == ("gru", "blelloch", None) else (name,)
        for given in forms:
            run = lambda p, x, h: bppsa.rnn(cell, p, x, h, scan=scan, chunk_size=chunk_size, precision=given)
            dots = _backward_dots(run, params, xs, h0)
            assert dots, "the backward has no dot_general to check"
            assert set(dots) == {(want, want)}, (given, set(dots))


def test_default_precision_is_full_float32():
    cell = CELLS["gru"]()
    params, xs, h0 = make_problem(cell, 40, 2, dtype=jnp.float32, h0_scale=0)[1:]
    dots = _backward_dots(lambda p, x, h: bppsa.rnn(cell, p, x, h), params, xs, h0)
    assert dots and set(dots) == {(lax.Precision.HIGHEST,) * 2}


def test_sharded_backward_carries_the_precision():
    cell = CELLS["gru"]()
    params, xs, h0 = make_problem(cell, 20, 2, dtype=jnp.float32, h0_scale=0)[1:]
    mesh = parallel.make_mesh(2, batch_axis=None)
    for name, want in PRECISIONS.items():
        for run in (lambda p, x, h: parallel.rnn(cell, p, x, h, mesh=mesh, precision=name),
                    lambda p, x, h: bppsa.rnn(cell, p, x, h, mesh=mesh, precision=want))[:2 if name == "high" else 1]:
            dots = _backward_dots(run, params, xs, h0)
            assert dots and set(dots) == {(want, want)}, (name, set(dots))


def _float64_gradients_unchanged(cell_name, every_path, T):
    cell = CELLS[cell_name]()
    params, xs, h0 = make_problem(cell, T, 2, h0_scale=0)[1:]

    mesh = parallel.make_mesh(2, batch_axis=None)
    runs = [lambda p, x, h: scan_states(cell, p, x, h)]  # the reference: autodiff through lax.scan
    for name in PRECISIONS:
        runs.append(lambda p, x, h, name=name: bppsa.rnn(cell, p, x, h, precision=name))
        if every_path:  # (chunked exactness is tests/core/test_backprop.py's; chunking's precision is checked above)
            runs += [lambda p, x, h, name=name: bppsa.rnn(cell, p, x, h, scan="sequential", precision=name),
                     lambda p, x, h, name=name: bppsa.rnn(cell, p, x, h, mesh=mesh, precision=name)]

    @jax.jit  # one program for all of them: one compile
    def all_grads(p, x, h):
        return [jax.grad(lambda *a, run=run: jnp.sum(jnp.sin(cell.hidden(run(*a)))), argnums=(0, 1, 2))(p, x, h)
                for run in runs]

    ref, *others = all_grads(params, xs, h0)
    assert len(others) == len(PRECISIONS) * (3 if every_path else 1)
    for got in others:
        for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(ref)):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-10, atol=1e-12)


def test_float64_gradients_unchanged_for_every_precision():
    _float64_gradients_unchanged("rnn", every_path=False, T=24)


@pytest.mark.slow
@pytest.mark.parametrize("cell_name", sorted(CELLS))
def test_float64_gradients_unchanged_for_every_precision_every_cell_and_path(cell_name):
    _float64_gradients_unchanged(cell_name, every_path=True, T=40)


@pytest.mark.parametrize("bad", ["tf32", None, 3])
def test_bad_precision_is_a_usage_error_naming_the_argument(bad):
    cell = CELLS["rnn"]()
    params, xs, h0 = make_problem(cell, 4, 2, h0_scale=0)[1:]
    for run in (bppsa.rnn, parallel.rnn):
        with pytest.raises(UsageError, match=r"^precision must be one of \['highest', 'high', 'default'\]"):
            run(cell, params, xs, h0, precision=bad)
    assert bppsa.Options(precision=lax.Precision.HIGH).precision == "high"
