"""The one options object: validated once, accepted by every entry point, ``auto`` resolved once."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax import lax

import bppsa
import bppsa.nn
from bppsa import cells, parallel
from bppsa.plan import cost
from bppsa.plan import options
from bppsa.errors import UsageError

from tests.reference import grads_of, scan_grads


@pytest.mark.parametrize("field,value,words", [
    ("backward", "fast", "backward must be one of ['bppsa', 'bptt', 'auto']; got 'fast'"),
    ("scan", "tree", "scan must be one of ['associative', 'blelloch', 'sequential'] or None; got 'tree'"),
    ("chunk_size", 0, "chunk_size must be a positive int, None or 'auto'; got 0"),
    ("chunk_size", 2.0, "chunk_size must be a positive int, None or 'auto'; got 2.0"),
    ("chunk_size", True, "got True"),
    ("precision", "low", "precision must be one of ['highest', 'high', 'default']"),
    ("combine", "ring", "combine must be one of ['logstep', 'allgather', 'chain', 'auto']; got 'ring'"),
    ("cost_model", {"bptt": 1}, "cost_model must be a bppsa.CostModel or None; got dict"),
])
def test_every_field_is_checked_with_a_message_naming_it(problem, field, value, words):
    with pytest.raises(UsageError) as e:
        bppsa.Options(**{field: value})
    assert words in str(e.value)
    with pytest.raises(UsageError) as e:  # the same check behind the keyword of an entry point
        bppsa.rnn(*problem(cells.GRU(3, 4)), **{field: value})
    assert words in str(e.value)


def test_values_are_normalised_once():
    o = bppsa.Options(chunk_size=np.int64(4), precision=lax.Precision.HIGH)
    assert o.chunk_size == 4 and type(o.chunk_size) is int and o.precision == "high"
    assert bppsa.Options(precision="HIGHEST").precision == "highest"
    assert o.replace(scan="sequential") == bppsa.Options(scan="sequential", chunk_size=4, precision="high")
    with pytest.raises(UsageError, match="unknown option 'chunk'; the options are backward, scan, chunk_size"):
        options.make(chunk=3)
    with pytest.raises(UsageError, match="options must be a bppsa.Options, a bppsa.Plan or None; got dict"):
        options.make({"backward": "bptt"})


def test_keywords_override_the_options_object():
    o = options.make(bppsa.Options(backward="bptt", chunk_size=3), backward="bppsa")
    assert (o.backward, o.chunk_size) == ("bppsa", 3)


def test_auto_is_resolved_in_one_place_and_keeps_an_explicit_scan():
    cell = cells.RNN(1, 20)
    slow_bptt = cost.CostModel({"bptt": [1.0, 0.0, 0.0], "bppsa": [0.0, 0.0, 0.0, 0.0]})
    fast_bptt = cost.CostModel({"bptt": [0.0, 0.0, 0.0], "bppsa": [1.0, 0.0, 0.0, 0.0]})
    r = bppsa.Options(backward="auto", cost_model=slow_bptt).resolve(cell, 1000, 1)
    assert (r.backward, r.scan) == ("bppsa", "blelloch")
    r = bppsa.Options(backward="auto", scan="associative", cost_model=slow_bptt).resolve(cell, 1000, 1)
    assert (r.backward, r.scan) == ("bppsa", "associative")
    assert bppsa.Options(backward="auto", cost_model=fast_bptt).resolve(cell, 1000, 1).backward == "bptt"
    assert bppsa.Options().resolve(cell, 10, 1) == bppsa.Options(scan="blelloch")


@pytest.mark.parametrize("entry", ["bppsa.rnn", "backprop.rnn"] + [
    pytest.param(e, marks=pytest.mark.slow) for e in ("parallel.rnn", "bppsa.rnn(mesh)", "pmap_rnn")])
@pytest.mark.parametrize("opts", [bppsa.Options(scan="sequential", chunk_size=3)] + [
    pytest.param(o, marks=pytest.mark.slow) for o in (bppsa.Options(backward="bptt"), bppsa.Options(precision="high"))])
def test_every_entry_point_takes_the_options_object(problem, close, loss, entry, opts):
    cell, params, xs, h0 = problem(cells.GRU(2, 2), T=8, B=1)
    one = opts.replace(chunk_size="auto")  # a mesh takes no int chunk_size
    mesh = parallel.make_mesh(2, batch_axis=None)
    run = {
        "bppsa.rnn": lambda p, x, h: bppsa.rnn(cell, p, x, h, opts),
        "backprop.rnn": lambda p, x, h: bppsa.backprop.rnn(cell, p, x, h, options=opts),
        "parallel.rnn": lambda p, x, h: parallel.rnn(cell, p, x, h, one, mesh=mesh),
        "bppsa.rnn(mesh)": lambda p, x, h: bppsa.rnn(cell, p, x, h, one, mesh=mesh),
        "pmap_rnn": lambda p, x, h: parallel.pmap_rnn(cell, p, x.reshape((2, 4) + x.shape[1:]), h, one).reshape(
            (8,) + h.shape),
    }[entry]
    close(grads_of(run, params, xs, h0, loss), scan_grads(cell, params, xs, h0, loss))


def test_nn_modules_take_the_options_object():
    x = jax.random.normal(jax.random.key(1), (2, 5, 3), jnp.float64)
    opts = bppsa.Options(scan="associative", chunk_size=2)
    layer = bppsa.nn.RNN(nnx.GRUCell(3, 4, rngs=nnx.Rngs(0), param_dtype=jnp.float64), options=opts)
    assert layer.options == opts
    ref = nnx.RNN(nnx.GRUCell(3, 4, rngs=nnx.Rngs(0), param_dtype=jnp.float64))
    np.testing.assert_allclose(layer(x), ref(x), rtol=1e-12)
    assert bppsa.nn.RNN(nnx.GRUCell(3, 4, rngs=nnx.Rngs(0)), options=opts, backward="bptt").options.backward == "bptt"
    clf = bppsa.nn.SequenceClassifier(cells.GRU(3, 4), 5, rngs=nnx.Rngs(0), backward="bptt", chunk_size=2)
    assert clf.rnn.options == bppsa.Options(backward="bptt", chunk_size=2)
    with pytest.raises(UsageError, match="unknown option 'unrol'"):
        bppsa.nn.RNN(nnx.GRUCell(3, 4, rngs=nnx.Rngs(0)), unrol=4)


@pytest.mark.parametrize("backward", ["bppsa", pytest.param("bptt", marks=pytest.mark.slow)])
def test_unroll_sets_the_forward_scans_unroll_and_changes_no_result(problem, close, loss, backward):
    cell, params, xs, h0 = problem(cells.GRU(2, 3), T=7, B=2)
    run = lambda unroll: bppsa.rnn(cell, params, xs, h0, backward=backward, unroll=unroll)
    assert "unroll=3" in str(jax.make_jaxpr(lambda: run(3))())
    np.testing.assert_allclose(run(3), run(1), rtol=1e-13)
    close(grads_of(lambda p, x, h: bppsa.rnn(cell, p, x, h, backward=backward, unroll=True), params, xs, h0, loss),
          scan_grads(cell, params, xs, h0, loss))
    assert bppsa.Options(unroll=np.int64(4)).unroll == 4 and bppsa.Options(unroll=True).unroll is True
    for bad in (0, -2, 1.5, "2"):
        with pytest.raises(UsageError, match="unroll must be a positive int, True, False or None"):
            bppsa.Options(unroll=bad)
