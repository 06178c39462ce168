"""Forward-mode autodiff through ``bppsa.rnn`` (``jax.jvp``, ``jax.jacfwd``, Hessian-vector
products) equals autodiff through the plain ``lax.scan`` (tests/reference.py), float64, for every
``backward=`` and every kind of cell; reverse mode still runs the BPPSA adjoint scan.

The backwards: BPPSA with each scan, chunks of 2 over an odd T, BPTT, and "auto" (the shipped cost
model, and one that picks BPPSA). The default run covers every backward on one cell and every cell
on one backward; the cross product is slow.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from hypothesis import strategies as st

import bppsa
from bppsa import cells
from bppsa.plan import cost
from bppsa.backward import rule
from bppsa.nn import cells as flax_cells
from tests.helpers import generic_cell, normal, random_params
from tests.props import property_pair
from tests.reference import loss_of, scan_states
from tests.tolerance import assert_trees_close

PICKS_BPPSA = cost.CostModel({"bptt": [1.0, 0.0, 0.0], "bppsa": [0.0, 0.0, 0.0, 0.0]})
BACKWARDS = {
    "blelloch": dict(backward="bppsa", scan="blelloch", chunk_size=None),
    "associative": dict(backward="bppsa", scan="associative", chunk_size=None),
    "sequential": dict(backward="bppsa", scan="sequential", chunk_size=None),
    "blelloch_chunks_of_2": dict(backward="bppsa", scan="blelloch", chunk_size=2),
    "sequential_chunks_of_2": dict(backward="bppsa", scan="sequential", chunk_size=2),
    "bptt": dict(backward="bptt"),
    "auto": dict(backward="auto"),
    "auto_picking_bppsa": dict(backward="auto", cost_model=PICKS_BPPSA),
}
I, H = 3, 4


def _flax(kind):
    make = {"gru": nnx.GRUCell, "lstm": nnx.LSTMCell}[kind]
    flax_cell = make(I, H, param_dtype=jnp.float64, rngs=nnx.Rngs(0))
    return flax_cells.adapt(flax_cell, None, I), flax_cells.cell_params(flax_cell)


CELLS = {
    "rnn": lambda: cells.RNN(I, H),
    "rnn_dense": lambda: cells.RNN(I, H, diagonal=False),
    "gru": lambda: cells.GRU(I, H),
    "lstm": lambda: cells.LSTM(I, H),
    "generic": lambda: generic_cell(I, H),
    "flax_gru": lambda: _flax("gru"),
    "flax_lstm": lambda: _flax("lstm"),
    "masked_gru": lambda: flax_cells.Masked(cells.GRU(I, H)),
}


def _problem(name, T=7, B=2, seed=0):
    """(cell, params, xs, h0, tangents (params, xs, h0)), float64; a Masked cell's last input
    channel is a 0/1 mask."""
    made = CELLS[name]()
    cell, params = made if isinstance(made, tuple) else (made, random_params(made, seed))
    n_in = cell.input_size
    xs = normal(seed + 1, (T, B, n_in))
    if isinstance(cell, flax_cells.Masked):
        mask = (np.arange(T * B).reshape(T, B, 1) % 3 != 1).astype(np.float64)
        xs = xs.at[..., -1:].set(jnp.asarray(mask))
    h0 = cell.unflatten_state(normal(seed + 2, (B, cell.state_size), 0.5))
    k = iter(range(100, 200))
    tangent = lambda a: normal(next(k), jnp.shape(a))
    return cell, params, xs, h0, jax.tree.map(tangent, (params, xs, h0))


def _runs(cell, backwards=BACKWARDS):
    return {name: (lambda p, x, h, o=o: bppsa.rnn(cell, p, x, h, **o)) for name, o in backwards.items()}


def _check_jvp_and_hvp(name, T, B, backwards=BACKWARDS, seed=0, reverse_over_reverse=False):
    cell, params, xs, h0, tangents = _problem(name, T, B, seed)
    ref = lambda p, x, h: scan_states(cell, p, x, h)
    runs = {"reference": ref, **_runs(cell, backwards)}

    @jax.jit
    def everything(primals, tangents):
        out = {}
        for key, run in runs.items():
            grad = jax.grad(loss_of(run), argnums=(0, 1, 2))
            out[key] = {"jvp": jax.jvp(run, primals, tangents),
                        "hvp_forward_over_reverse": jax.jvp(grad, primals, tangents)[1]}
            if reverse_over_reverse:
                out[key]["hvp_reverse_over_reverse"] = jax.grad(lambda *a: sum(
                    jnp.vdot(g, t) for g, t in zip(jax.tree.leaves(grad(*a)), jax.tree.leaves(tangents))),
                    argnums=(0, 1, 2))(*primals)
        return out

    got = everything((params, xs, h0), tangents)
    want = got.pop("reference")
    for key, value in got.items():
        assert_trees_close(value, want, what=f"{name} T={T} B={B} {key}: ")


DEFAULT_BACKWARDS = ("sequential_chunks_of_2", "auto_picking_bppsa")  # the rest: slow
DEFAULT_CELLS = ("lstm", "generic", "masked_gru")  # flax's cells: also in tests/nn/test_flax_dropin.py


def _slow_unless(default):
    return lambda v: v if v in default else pytest.param(v, marks=pytest.mark.slow)


@pytest.mark.parametrize("backward", [_slow_unless(DEFAULT_BACKWARDS)(b) for b in sorted(BACKWARDS)])
def test_jvp_and_hvp_equal_autodiff_through_lax_scan_for_every_backward(backward):
    """jax.jvp w.r.t. params, xs and h0 at once, and the HVP forward-over-reverse (GRU, T = 7, B = 2)."""
    _check_jvp_and_hvp("gru", T=7, B=2, backwards={backward: BACKWARDS[backward]})


@pytest.mark.parametrize("name", [_slow_unless(DEFAULT_CELLS)(c) for c in sorted(CELLS)])
def test_jvp_and_hvp_equal_autodiff_through_lax_scan_for_every_cell(name):
    """Every kind of cell, on the chunked Blelloch scan over an odd T (a short last chunk)."""
    _check_jvp_and_hvp(name, T=7, B=2, backwards={"blelloch_chunks_of_2": BACKWARDS["blelloch_chunks_of_2"]})


def test_hvp_reverse_over_reverse():
    """grad of grad: the transposed solve transposed again (the tangent scan runs in reverse mode)."""
    _check_jvp_and_hvp("lstm", T=5, B=2, backwards={"sequential_chunks_of_2": BACKWARDS["sequential_chunks_of_2"]},
                       reverse_over_reverse=True)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CELLS))
def test_jvp_and_hvps_every_cell_and_backward(name):
    _check_jvp_and_hvp(name, T=7, B=2, reverse_over_reverse=True)


EDGES = [("gru", 1, 1), ("lstm", 1, 2), ("lstm", 6, 1), ("rnn", 5, 1)]


@pytest.mark.parametrize("name,T,B", [e if e == ("gru", 1, 1) else pytest.param(*e, marks=pytest.mark.slow)
                                      for e in EDGES])
def test_jvp_and_hvp_at_edge_shapes(name, T, B):
    """T = 1 (one step, no scan level), B = 1, T even with chunks of 2 (no short chunk)."""
    _check_jvp_and_hvp(name, T=T, B=B, backwards={b: BACKWARDS[b] for b in ["blelloch_chunks_of_2" if T > 1 else "blelloch"]})


@pytest.mark.slow
@pytest.mark.parametrize("name,T,B", EDGES)
def test_jvp_and_hvps_at_edge_shapes_every_backward(name, T, B):
    _check_jvp_and_hvp(name, T=T, B=B, reverse_over_reverse=True)


@pytest.mark.parametrize("name,backwards", [
    ("gru", ("blelloch", "bptt")), pytest.param("flax_lstm", ("sequential_chunks_of_2",), marks=pytest.mark.slow),
    pytest.param("masked_gru", ("associative",), marks=pytest.mark.slow),
    *(pytest.param(n, tuple(BACKWARDS), marks=pytest.mark.slow) for n in ("rnn", "gru", "lstm", "generic", "flax_lstm",
                                                                        "masked_gru"))])
def test_jacfwd_equals_jacrev_of_the_reference(name, backwards):
    cell, params, xs, h0, _ = _problem(name, T=5, B=2)
    runs = {"reference": lambda p, x, h: scan_states(cell, p, x, h),
            **_runs(cell, {b: BACKWARDS[b] for b in backwards})}

    @jax.jit
    def jacobians(p, x, h):
        return {key: (jax.jacrev if key == "reference" else jax.jacfwd)(run, argnums=(0, 1, 2))(p, x, h)
                for key, run in runs.items()}

    got = jacobians(params, xs, h0)
    want = got.pop("reference")
    for key, value in got.items():
        assert_trees_close(value, want, what=f"{name} {key}: ")


@pytest.mark.slow
def test_hessian_equals_the_reference():
    """jax.hessian (forward over reverse, vmapped) w.r.t. the parameters, with a BPPSA scan."""
    cell, params, xs, h0, _ = _problem("gru", T=5, B=1)
    loss = lambda run: (lambda p: loss_of(run)(p, xs, h0))
    ref = jax.jit(jax.hessian(loss(lambda p, x, h: scan_states(cell, p, x, h))))(params)
    for o in (dict(scan="blelloch"), dict(scan="sequential", chunk_size=2)):
        got = jax.jit(jax.hessian(loss(lambda p, x, h, o=o: bppsa.rnn(cell, p, x, h, **o))))(params)
        assert_trees_close(got, ref, what=f"hessian {o}: ")


def _double_adjoint(calls):
    real = rule.adjoint

    def spy(*args, **kwargs):
        calls.append(args[1])  # the scan method
        gs, dp, dx, g0 = real(*args, **kwargs)
        return gs, jax.tree.map(lambda a: 2 * a, dp), 2 * dx, 2 * g0

    return spy


@pytest.mark.parametrize("opts", [dict(scan="blelloch", chunk_size=None)] + [
    pytest.param(o, marks=pytest.mark.slow) for o in (dict(scan="sequential", chunk_size=2),
                                                      dict(scan="associative", chunk_size="auto"))])
def test_reverse_mode_runs_the_bppsa_adjoint_and_forward_mode_does_not(monkeypatch, opts):
    """With the adjoint (the BPPSA scan and the analytic gradients) replaced by one that doubles
    its gradients, jax.grad doubles and jax.jvp does not change: reverse mode is that adjoint."""
    cell, params, xs, h0, tangents = _problem("gru", T=7, B=2)
    run = lambda p, x, h: bppsa.rnn(cell, p, x, h, **opts)
    loss = loss_of(run)
    both = lambda: jax.jit(lambda *a: (jax.grad(loss, argnums=(0, 1, 2))(*a), jax.jvp(run, a, tangents)))(
        params, xs, h0)  # a new jitted function each call: traced again
    grads, jvp = both()
    calls = []
    monkeypatch.setattr(rule, "adjoint", _double_adjoint(calls))
    doubled, jvp_after = both()
    assert calls and set(calls) == {opts["scan"]}
    assert_trees_close(doubled, jax.tree.map(lambda a: 2 * a, grads), what="grad with the doubling adjoint: ")
    assert_trees_close(jvp_after, jvp, what="jvp with the doubling adjoint: ")


def test_backward_bptt_does_not_use_the_bppsa_adjoint(monkeypatch):
    cell, params, xs, h0, _ = _problem("gru", T=4, B=2)
    calls = []
    monkeypatch.setattr(rule, "adjoint", _double_adjoint(calls))
    jax.grad(loss_of(lambda p, x, h: bppsa.rnn(cell, p, x, h, backward="bptt")))(params, xs, h0)
    assert calls == []


def _eqns(jaxpr, name):
    """The equations named ``name`` in a jaxpr and its sub-jaxprs (pjit, scan, ..., not inside a match)."""
    found = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == name:
            found.append(eqn)
            continue
        for value in eqn.params.values():
            for sub in value if isinstance(value, (tuple, list)) else (value,):
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    found += _eqns(inner, name)
    return found


def test_gradient_program_has_the_scan_as_the_transposed_solve():
    """The jaxpr of jax.grad holds one custom_linear_solve, the transposed one: its solve (what
    runs) is the adjoint, the Blelloch scan's levels without a loop over T; the forward tangent scan
    (a ``lax.scan`` over T) is only its transpose_solve, which reverse mode never runs."""
    cell, params, xs, h0, _ = _problem("gru", T=8, B=2)
    loss = loss_of(lambda p, x, h: bppsa.rnn(cell, p, x, h, scan="blelloch", chunk_size=None))
    solves = _eqns(jax.make_jaxpr(jax.grad(loss))(params, xs, h0).jaxpr, "custom_linear_solve")
    assert len(solves) == 1
    solve = solves[0].params["jaxprs"].solve.jaxpr
    tangent_scan = solves[0].params["jaxprs"].transpose_solve.jaxpr
    assert not _eqns(solve, "scan") and _eqns(solve, "dot_general")
    assert _eqns(tangent_scan, "scan")


@pytest.mark.slow  # both sizes; the default run keeps the jvp/hvp tests for every cell, backward and edge shape
@property_pair(
    2, 25, name=st.sampled_from(["rnn", "gru", "lstm", "generic"]), T=st.integers(1, 9), B=st.integers(1, 3),
    backward=st.sampled_from(sorted(BACKWARDS)), seed=st.integers(0, 50))
def test_forward_mode_property(name, T, B, backward, seed):
    _check_jvp_and_hvp(name, T, B, backwards={backward: BACKWARDS[backward]}, seed=seed)


