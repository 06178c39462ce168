"""The parallel forward (bppsa.forward.newton: forward="newton" / "quasi") in float64: its states equal the
sequential forward's and autodiff through a plain ``lax.scan`` (tests/reference.py), and the
gradients (params, xs, h0) at them equal autodiff's, rel 1e-9, for every cell (cells.RNN tanh and
relu, GRU, LSTM, Generic, structured Block* with head sizes 1 and 2, flax's cells through
bppsa.nn.RNN vs nnx.RNN with seq_lengths), every backward (BPPSA's three scans, BPTT), T = 1,
odd and non-power-of-two T, B = 1, chunks, a 4-device mesh (T not divisible by 4, with and
without a batch axis), guess=, return_info=, jit, vmap and forward mode. Then what happens when
Newton does not converge (a chaotic RNN): the fallback returns the sequential states exactly,
warns once and counts; on_fail="raise" raises; damping never returns unconverged states; and the
option checks name their field.

Compiles dominate the cost: each check builds one jitted program with the reference and every
configuration it compares, and the default run keeps a few cases per kind (the cross products
are marked slow).
"""

import functools
import math
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from hypothesis import strategies as st

import bppsa
import bppsa.nn
from bppsa import cells, parallel
from bppsa.forward import newton
from bppsa.plan import options
from bppsa.errors import UsageError
from bppsa.forward.newton import NewtonDidNotConverge, NewtonFallbackWarning, NewtonInfo
from tests.helpers import (generic_cell, make_problem, normal, one_line_usage_error, random_like, random_params,
                           states_loss)
from tests.props import property_pair
from tests.reference import scan_grads, scan_states
from tests.tolerance import assert_trees_close

slow = pytest.mark.slow
I, H = 3, 4
TOL = options.DEFAULT_TOL["float64"]

CELLS = {  # name -> (I, H) -> cell
    "rnn-tanh": lambda i, h: cells.RNN(i, h),
    "rnn-relu": lambda i, h: cells.RNN(i, h, nonlinearity="relu"),
    "gru": lambda i, h: cells.GRU(i, h),
    "lstm": lambda i, h: cells.LSTM(i, h),
    "generic": generic_cell,
    "block-rnn-k1": lambda i, h: cells.BlockRNN(i, h),
    "block-rnn-k2": lambda i, h: cells.BlockRNN(i, h, 2),
    "block-gru-k1": lambda i, h: cells.BlockGRU(i, h),
    "block-gru-k2": lambda i, h: cells.BlockGRU(i, h, 2),
    "block-lstm-k1": lambda i, h: cells.BlockLSTM(i, h),
    "block-lstm-k2": lambda i, h: cells.BlockLSTM(i, h, 2),
}
FORWARDS = ("newton", "quasi")
BACKWARDS = {
    "blelloch": dict(backward="bppsa", scan="blelloch"),
    "associative": dict(backward="bppsa", scan="associative"),
    "sequential": dict(backward="bppsa", scan="sequential"),
    "bptt": dict(backward="bptt"),
}
CONFIGS = {f"{f}/{b}": dict(forward=f, **o) for f in FORWARDS for b, o in BACKWARDS.items()}


def _a_sequential_trajectory(cell, p, xs, h0, states, what=""):
    """``states`` (T, B, H) are a sequential forward's: each is one step of the cell from the one
    before, to rounding (a few ulps of the dtype). A per-step check: unlike a comparison with
    another program's sequential states, it does not grow with the recurrence's expansion (the
    chaotic cells here amplify a last-bit difference along the sequence), and an unconverged
    Newton iterate fails it (its residual is above the tolerance)."""
    states = jnp.asarray(states)
    prev = jnp.concatenate([jnp.asarray(h0, states.dtype)[None], states[:-1]])
    f = jax.vmap(lambda h, x: cell.step(p, h, x))(prev, jnp.asarray(xs, states.dtype))
    residual = float(jnp.max(jnp.abs(states - f) / (1 + jnp.abs(f))))
    assert residual <= 64 * float(jnp.finfo(states.dtype).eps), f"{what}: one-step residual {residual:.3g}"


def _states_and_grads(run):
    """run(p, x, h) -> (states, info): (states, info, grads of states_loss(states) w.r.t. p, x, h), one solve."""
    def f(p, x, h):
        states, info = run(p, x, h)
        return states_loss(states), (states, info)

    def both(p, x, h):
        grads, (states, info) = jax.grad(f, argnums=(0, 1, 2), has_aux=True)(p, x, h)
        return states, info, grads

    return both


def _check_info(info, T, what="", least=1, most=None):
    """Converged, not fallen back, within T iterations (undamped, iteration k makes the first k
    states exact; ``least``: 0 where the first iterate may already be the solution; ``most``: the
    bound instead of T, for damped steps)."""
    assert isinstance(info, NewtonInfo), what
    assert bool(info.converged) and not bool(info.fell_back), f"{what}: {info}"
    most = min(T, options.DEFAULT_MAX_ITER) if most is None else most
    assert least <= int(info.iterations) <= most, f"{what}: {info}"
    assert float(info.residual) <= TOL, f"{what}: {info}"
    assert info.iterations.dtype == jnp.int32 and info.converged.dtype == jnp.bool_


def _check(name, T, B, configs, seed=0, hidden=H):
    """Every configuration's states and gradients vs the lax.scan reference, in one jitted program."""
    cell, params, xs, h0 = make_problem(CELLS[name](I, hidden), T, B, seed=seed)

    @jax.jit
    def run(p, x, h):
        ref = scan_states(cell, p, x, h), scan_grads(cell, p, x, h, states_loss)
        got = {key: _states_and_grads(lambda p, x, h, o=o: bppsa.rnn(cell, p, x, h, on_fail="raise",
                                                                     return_info=True, **o))(p, x, h)
               for key, o in configs.items()}
        return ref, got

    (ref_states, ref_grads), got = run(params, xs, h0)
    assert max(float(jnp.abs(a).max()) for a in jax.tree.leaves(ref_grads)) > 1e-6  # a real gradient
    for key, (states, info, grads) in got.items():
        what = f"{name} T={T} B={B} {key}"
        assert_trees_close(states, ref_states, what=f"{what} states")
        assert_trees_close(grads, ref_grads, 1e-9, 1e-11, f"{what} grads")
        damped = configs[key].get("damping") is not None
        _check_info(info, T, what, most=configs[key].get("max_iter", options.DEFAULT_MAX_ITER) if damped else None)
    return got


# --- every cell, every forward x backward ----------------------------------------------------

# The default run: these, and with the other default tests every forward and backward (GRU newton/blelloch: the
# damped, sharded and forward-mode tests; RNN: chunks and vmap; LSTM quasi/bptt: test_one_step_and_one_row).
DEFAULT_CELL_CONFIG = {"block-lstm-k2": "quasi/sequential", "rnn-relu": "newton/associative"}


@pytest.mark.parametrize("name", list(DEFAULT_CELL_CONFIG))
def test_states_and_gradients_equal_lax_scan(name):
    """T = 7 (odd, not a power of two), B = 2."""
    _check(name, 7, 2, {k: CONFIGS[k] for k in (DEFAULT_CELL_CONFIG[name],)})


@slow
@pytest.mark.parametrize("name", sorted(CELLS))
def test_states_and_gradients_every_cell_every_forward_and_backward(name):
    _check(name, 7, 2, CONFIGS)


EDGE_SHAPES = [(1, 2), (6, 1), (12, 3)]


@slow
@pytest.mark.parametrize("shape", [0, 1, 2])
@pytest.mark.parametrize("name", sorted(CELLS))
def test_states_and_gradients_every_cell_at_edge_shapes(name, shape):
    """T = 1 (one step), T = 6 and 12 (even, not powers of two), B = 1; each cell meets every
    configuration at one of the shapes."""
    T, B = EDGE_SHAPES[shape]
    _check(name, T, B, {k: CONFIGS[k] for k in sorted(CONFIGS)[shape::len(EDGE_SHAPES)]})


def test_one_step_and_one_row():
    """T = 1, B = 1: one Newton iteration is exact (the first state depends on h0 only)."""
    got = _check("lstm", 1, 1, {k: CONFIGS[k] for k in ("quasi/bptt",)})
    assert all(int(info.iterations) == 1 for _, info, _ in got.values())


@slow
@pytest.mark.parametrize("kind", FORWARDS)
def test_iterations_never_exceed_T(kind):
    """Iteration k makes the first k states exact: at most T iterations, for every T."""
    for T in (2, 3, 8):
        got = _check("gru", T, 2, {k: CONFIGS[k] for k in (f"{kind}/blelloch",)}, seed=T)
        assert int(got[f"{kind}/blelloch"][1].iterations) <= T


# --- chunks ----------------------------------------------------------------------------------

def _check_chunks(name, T, kind, scan, chunks):
    """chunk_size in ``chunks`` (None: one chunk): equal states, gradients and iteration counts."""
    base = dict(forward=kind, **BACKWARDS[scan])
    got = _check(name, T, 2, {str(c): dict(base, chunk_size=c) for c in chunks})
    whole_states, whole_info, whole_grads = got["None"]
    for c in chunks[1:]:
        states, info, grads = got[str(c)]
        assert_trees_close(states, whole_states, 1e-12, 1e-14, f"chunk_size={c} vs None states")
        assert_trees_close(grads, whole_grads, 1e-11, 1e-13, f"chunk_size={c} vs None grads")
        # the same iterates to rounding: the same count, or one more or fewer where the residual
        # lands at the tolerance (the chunks sum in another order)
        assert abs(int(info.iterations) - int(whole_info.iterations)) <= 1, (c, info, whole_info)


def test_chunked_equals_unchunked():
    """Chunks of 2 over T = 7: three full chunks and a short last one."""
    _check_chunks("rnn-tanh", 7, "newton", "blelloch", (None, 2))


@slow
@pytest.mark.parametrize("k,name", list(enumerate(["rnn-tanh", "gru", "lstm", "generic", "block-gru-k2",
                                                   "block-lstm-k1"])))
@pytest.mark.parametrize("kind", FORWARDS)
def test_chunked_equals_unchunked_every_cell(k, name, kind):
    """T = 9 in chunks of 1, 4 (a short last one) and 8, and "auto"; the scans in turn."""
    _check_chunks(name, 9, kind, sorted(BACKWARDS)[k % len(BACKWARDS)], (None, 1, 4, 8, "auto"))


# --- a mesh of 4 devices ---------------------------------------------------------------------

def _check_mesh(name, T, B, kind, data=1, backward="blelloch", guess=False):
    """The sharded parallel forward over 4 (x ``data``) devices vs the reference and one device."""
    cell, params, xs, h0 = make_problem(CELLS[name](I, H), T, B)
    mesh = parallel.make_mesh(4, data) if data > 1 else parallel.make_mesh(4, batch_axis=None)
    batch_axis = "data" if data > 1 else None
    opts = dict(forward=kind, on_fail="raise", **BACKWARDS[backward])

    @jax.jit
    def run(p, x, h):
        ref = scan_states(cell, p, x, h), scan_grads(cell, p, x, h, states_loss)
        g = ref[0] if guess else None
        sharded = _states_and_grads(lambda p, x, h: bppsa.rnn(cell, p, x, h, mesh=mesh, batch_axis=batch_axis,
                                                              return_info=True, guess=g, **opts))(p, x, h)
        return ref, sharded

    (ref_states, ref_grads), (states, info, grads) = run(params, xs, h0)
    what = f"{name} T={T} B={B} {kind} mesh 4x{data}"
    assert_trees_close(states, ref_states, what=what)
    assert_trees_close(grads, ref_grads, 1e-9, 1e-11, what)
    _check_info(info, T, what, least=0)
    if guess:
        assert int(info.iterations) == 1  # the exact states: one step, the one that shows they are
    return info


def test_sharded_over_four_devices():
    """T = 7 over 4 devices (a padded last stretch), B = 2."""
    _check_mesh("gru", 7, 2, "newton")


@slow
@pytest.mark.parametrize("name,T,B,kind,data,backward", [
    ("gru", 7, 1, "newton", 1, "blelloch"), ("gru", 10, 1, "quasi", 1, "associative"),
    ("lstm", 5, 2, "newton", 1, "sequential"), ("lstm", 9, 3, "quasi", 2, "blelloch"),
    ("rnn-tanh", 3, 2, "newton", 1, "bptt"), ("generic", 6, 1, "quasi", 1, "blelloch"),
    ("block-gru-k2", 11, 3, "newton", 2, "bptt"), ("block-lstm-k1", 7, 1, "newton", 2, "blelloch"),
    ("block-rnn-k2", 2, 2, "quasi", 1, "sequential"), ("rnn-relu", 13, 2, "newton", 2, "associative")])
def test_sharded_more(name, T, B, kind, data, backward):
    """B = 1 and > 1, T < 4 and T not divisible by 4, a 2-D (data, seq) mesh with an uneven batch."""
    _check_mesh(name, T, B, kind, data, backward)


@slow
def test_sharded_with_a_guess():
    _check_mesh("lstm", 7, 2, "newton", guess=True)


# --- guess= and return_info= -----------------------------------------------------------------

def test_a_good_guess_converges_in_fewer_iterations():
    """Guesses (vmapped: one compiled solve, per-guess iteration counts): zeros (what guess=None
    starts from), the exact states (no iteration), a previous training step's states (fewer)."""
    cell, params, xs, h0 = make_problem(CELLS["lstm"](I, H), 9, 2)
    near = jax.tree.map(lambda a: a * 1.01, params)  # a previous training step's parameters

    @jax.jit
    def run(p, x, h):
        ref = scan_states(cell, p, x, h)
        guesses = jax.tree.map(lambda *a: jnp.stack(a), jax.tree.map(jnp.zeros_like, ref), ref,
                               scan_states(cell, near, x, h))
        go = lambda g: bppsa.rnn(cell, p, x, h, forward="newton", on_fail="raise", guess=g, return_info=True)
        return ref, jax.vmap(go)(guesses)

    ref, (states, info) = run(params, xs, h0)
    for k in range(3):
        assert_trees_close(jax.tree.map(lambda a: a[k], states), ref, what=f"guess {k}")
        _check_info(jax.tree.map(lambda a: a[k], info), 9, f"guess {k}", least=0)
    zeros, exact, previous = (int(i) for i in info.iterations)
    assert exact == 1  # one step: the residual alone does not bound the error; the step shows it is ~0
    assert 1 <= previous < zeros


def test_bad_guesses_are_usage_errors():
    for name, bad in [("gru", lambda ref: ref[:-1]), ("gru", lambda ref: ref[..., :-1]),
                      ("gru", lambda ref: ref[None]), ("gru", lambda ref: ref.astype(jnp.int32)),
                      ("lstm", lambda ref: ref[0]), ("lstm", lambda ref: (ref[0], ref[1][:, :1])),
                      ("lstm", lambda ref: (ref[0],) * 3)]:
        cell, params, xs, h0 = make_problem(CELLS[name](I, H), 5, 2)
        ref = jax.eval_shape(lambda: scan_states(cell, params, xs, h0))
        ref = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), ref)
        with pytest.raises(UsageError, match=r"^guess must be shaped like the states rnn returns"):
            bppsa.rnn(cell, params, xs, h0, forward="newton", guess=bad(ref))
    mesh = parallel.make_mesh(4, batch_axis=None)
    with pytest.raises(UsageError, match=r"^guess must be shaped"):
        bppsa.rnn(cell, params, xs, h0, forward="newton", guess=jnp.zeros((5, 2, 4)), mesh=mesh)


def test_return_info_structure():
    """Traced only: NewtonInfo's fields are scalars (int32, bool, bool, the states' dtype three times,
    int32, bool); the sequential forward's info is None; without return_info the states alone."""
    cell, params, xs, h0 = make_problem(CELLS["lstm"](I, H), 6, 2)
    shape = lambda **o: jax.eval_shape(lambda: bppsa.rnn(cell, params, xs, h0, **o))
    states, info = shape(forward="newton", return_info=True)
    assert isinstance(info, NewtonInfo) and NewtonInfo._fields == ("iterations", "converged", "fell_back", "residual",
                                                                         "error", "lle", "predicted", "chose_sequential")
    assert [(v.shape, v.dtype) for v in info] == [((), jnp.int32), ((), jnp.bool_), ((), jnp.bool_), ((), jnp.float64),
                                                  ((), jnp.float64), ((), jnp.float64), ((), jnp.int32), ((), jnp.bool_)]
    assert jax.tree.map(lambda a: a.shape, states) == ((6, 2, H), (6, 2, H))
    assert shape(forward="quasi", on_fail="raise", return_info=True)[1].fell_back.shape == ()
    assert shape(forward="sequential", return_info=True)[1] is None
    plain = shape(forward="newton")
    assert isinstance(plain, tuple) and len(plain) == 2 and all(isinstance(a, jax.ShapeDtypeStruct) for a in plain)


# --- jit, vmap, forward mode -----------------------------------------------------------------

def test_vmap_under_jit():
    """vmap over 3 sequences (the same inputs scaled): per-example states, gradients and info."""
    cell, params, xs, h0 = make_problem(CELLS["rnn-tanh"](I, H), 5, 2)
    xv = jnp.stack([xs, 2 * xs, -xs])

    @jax.jit
    def run(p, xv, h):
        ref = jax.vmap(lambda x: (scan_states(cell, p, x, h), scan_grads(cell, p, x, h, states_loss)))(xv)
        run = _states_and_grads(lambda p, x, h: bppsa.rnn(cell, p, x, h, forward="quasi", on_fail="raise",
                                                          return_info=True))
        got = jax.vmap(run, in_axes=(None, 0, None))(p, xv, h)
        return ref, got

    (ref_states, ref_grads), (states, info, grads) = run(params, xv, h0)
    assert_trees_close(states, ref_states)
    assert_trees_close(grads, ref_grads, 1e-9, 1e-11)
    assert info.iterations.shape == info.converged.shape == info.fell_back.shape == info.residual.shape == (3,)
    assert bool(jnp.all(info.converged)) and not bool(jnp.any(info.fell_back))
    assert bool(jnp.all((info.iterations >= 1) & (info.iterations <= 5) & (info.residual <= TOL)))


@pytest.mark.parametrize("name,kind,backward", [
    ("gru", "newton", "blelloch"),
    *(pytest.param(n, k, b, marks=slow) for n, k, b in [
        ("lstm", "quasi", "sequential"), ("block-lstm-k2", "newton", "associative"), ("generic", "quasi", "bptt"),
        ("rnn-relu", "newton", "sequential"), ("block-rnn-k1", "quasi", "blelloch")])])
def test_forward_mode_through_the_parallel_forward(name, kind, backward):
    """jax.jvp w.r.t. params, xs and h0 at once (the tangent scan at the solved states)."""
    cell, params, xs, h0 = make_problem(CELLS[name](I, H), 6, 2)
    run = lambda p, x, h: bppsa.rnn(cell, p, x, h, forward=kind, on_fail="raise", **BACKWARDS[backward])
    ref = lambda p, x, h: scan_states(cell, p, x, h)
    got, want = jax.jit(lambda *a: (jax.jvp(run, a, random_like(a)), jax.jvp(ref, a, random_like(a))))(params, xs, h0)
    assert_trees_close(got, want, 1e-9, 1e-11, f"{name} {kind} {backward} jvp: ")


@pytest.mark.parametrize("order", ["forward_over_reverse", pytest.param("reverse_over_reverse", marks=slow)])
def test_hessian_vector_products_through_the_parallel_forward(order):
    """The HVP of a loss of the states (as test_forward_mode.py checks for the sequential forward)."""
    cell, params, xs, h0 = make_problem(CELLS["rnn-tanh"](I, H), 3, 1)
    t = random_like((params, xs, h0))

    def hvp(run):
        grad = jax.grad(lambda *a: states_loss(run(*a)), argnums=(0, 1, 2))
        if order == "forward_over_reverse":
            return lambda *a: jax.jvp(grad, a, t)[1]
        return jax.grad(lambda *a: sum(jnp.vdot(g, v) for g, v in zip(jax.tree.leaves(grad(*a)), jax.tree.leaves(t))),
                        argnums=(0, 1, 2))

    got, want = jax.jit(lambda *a: (hvp(lambda p, x, h: bppsa.rnn(cell, p, x, h, forward="newton"))(*a),
                                    hvp(functools.partial(scan_states, cell))(*a)))(params, xs, h0)
    assert_trees_close(got, want, 1e-9, 1e-11, f"HVP {order}: ")


# --- a property over shapes, cells and forwards ----------------------------------------------

@property_pair(
    1, 8, T=st.integers(1, 11), B=st.integers(1, 3), hidden=st.sampled_from([2, 4]),
    name=st.sampled_from(sorted(CELLS)), kind=st.sampled_from(FORWARDS), scan=st.sampled_from(sorted(BACKWARDS)),
    seed=st.integers(0, 30))
def test_property(T, B, hidden, name, kind, scan, seed):
    _check(name, T, B, {kind: dict(forward=kind, **BACKWARDS[scan])}, seed=seed, hidden=hidden)


# --- non-convergence: a chaotic cell ---------------------------------------------------------

CHAOS_T = 40


@functools.cache
def _chaos():
    """An RNN with W_h scaled x10 (chaotic, Newton needs ~36 iterations from zeros), T = 40."""
    cell = cells.RNN(I, H)
    params = dict(random_params(cell))
    params["W_h"] = 10 * params["W_h"]
    return cell, params, normal(3, (CHAOS_T, 2, I)), normal(4, (2, H), 0.5)


@functools.cache
def _chaos_fallback_program():
    """(fallback states, info), the sequential forward's states, damped runs' (states, info) and
    the reference states, one jitted program (cached: the tests here share one compile)."""
    cell, *_ = _chaos()

    @jax.jit
    def run(p, x, h):
        fallback = bppsa.rnn(cell, p, x, h, forward="newton", max_iter=3, return_info=True)
        sequential = bppsa.rnn(cell, p, x, h, forward="sequential", backward="bptt")
        damped = [bppsa.rnn(cell, p, x, h, forward=kind, max_iter=m, damping=d, return_info=True)
                  for kind, m, d in (("newton", 5, 1.0), ("quasi", 4, 0.0))]
        return fallback, sequential, damped, scan_states(cell, p, x, h)

    return run


def test_non_convergence_falls_back_to_the_sequential_states_warns_once_and_counts(monkeypatch):
    monkeypatch.setattr(newton, "_fallbacks", [0])  # as in a fresh process: the first fallback warns
    cell, params, xs, h0 = _chaos()
    run = _chaos_fallback_program()
    with pytest.warns(NewtonFallbackWarning, match=r"did not converge after \d+ iterations \(tol .*; "
                                                   r"residual .*\); the sequential forward ran instead"):
        (states, info), sequential, damped, ref_states = jax.block_until_ready(run(params, xs, h0))
    _a_sequential_trajectory(cell, params, xs, h0, states, "the fallback's states")  # the sequential forward's
    assert_trees_close(states, sequential)
    assert_trees_close(states, ref_states)
    assert not bool(info.converged) and bool(info.fell_back) and int(info.iterations) == 3
    assert float(info.residual) > TOL
    after_first = newton.fallback_count()
    assert after_first >= 1  # this run's fallbacks: the undamped one, and the damped ones that failed
    with warnings.catch_warnings():
        warnings.simplefilter("error", NewtonFallbackWarning)  # shown once a process
        jax.block_until_ready(run(params, xs, h0))
    assert newton.fallback_count() == 2 * after_first


def test_damping_never_returns_unconverged_states():
    """Damped runs on the chaotic cell: converged => the reference's states; not converged =>
    fell back, the sequential states exactly."""
    cell, params, xs, h0 = _chaos()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NewtonFallbackWarning)
        _, sequential, damped, ref_states = jax.block_until_ready(_chaos_fallback_program()(params, xs, h0))
    for k, (states, info) in enumerate(damped):
        assert bool(info.converged) != bool(info.fell_back), f"damped run {k}: {info}"
        if bool(info.converged):
            assert float(info.residual) <= TOL
            assert_trees_close(states, ref_states, what=f"damped run {k}")
        else:
            _a_sequential_trajectory(cell, params, xs, h0, states, f"damped run {k}")
            assert_trees_close(states, sequential, what=f"damped run {k}")


@slow
def test_damping_on_a_contractive_cell_converges_to_the_same_states():
    _check("gru", 5, 2, {"damped": dict(forward="newton", damping=0.5)})


@slow
@pytest.mark.parametrize("kind", FORWARDS)
def test_damping_and_max_iter_sweep_on_the_chaotic_cell(kind):
    """Whatever damping and max_iter: converged and exact, or fallen back to the sequential states."""
    cell, params, xs, h0 = _chaos()
    cases = [(d, m) for d in (None, 0.0, 0.01, 1.0, 100.0) for m in (1, 7, 45)]

    @jax.jit
    def run(p, x, h):
        runs = [bppsa.rnn(cell, p, x, h, forward=kind, damping=d, max_iter=m, return_info=True) for d, m in cases]
        return runs, bppsa.rnn(cell, p, x, h, forward="sequential", backward="bptt"), scan_states(cell, p, x, h)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NewtonFallbackWarning)
        runs, sequential, ref = run(params, xs, h0)
    for (d, m), (states, info) in zip(cases, runs):
        what = f"damping={d} max_iter={m}: {info}"
        assert bool(info.converged) != bool(info.fell_back), what
        assert int(info.iterations) <= m, what
        if bool(info.converged):
            assert_trees_close(states, ref, what=what)
        else:
            _a_sequential_trajectory(cell, params, xs, h0, states, what)
            assert_trees_close(states, sequential, what=what)


def test_on_fail_raise_raises_eagerly(capfd, caplog):
    """The error itself, and nothing printed or logged besides (JAX logs an exception its host
    callback raises, with a traceback, before re-raising it)."""
    cell, params, xs, h0 = _chaos()
    with pytest.raises(NewtonDidNotConverge, match=r"parallel forward of RNN did not converge after 3 "
                                                   r"iterations \(tol .*; residual .*\); raise max_iter"):
        jax.block_until_ready(bppsa.rnn(cell, params, xs, h0, forward="newton", max_iter=3, on_fail="raise"))
    assert capfd.readouterr() == ("", "")
    assert not caplog.records


def test_on_fail_raise_raises_under_jit(capfd, caplog):
    """Under jax.jit the error reaches the caller (a RuntimeError naming NewtonDidNotConverge), and
    JAX's log of the callback's failure is not printed besides."""
    cell, params, xs, h0 = _chaos()
    run = jax.jit(lambda p, x, h: bppsa.rnn(cell, p, x, h, forward="newton", max_iter=3, on_fail="raise"))
    with pytest.raises(RuntimeError, match=r"NewtonDidNotConverge: the parallel forward of RNN did not converge"):
        jax.block_until_ready(run(params, xs, h0))
    assert "jax.debug.callback failed" not in capfd.readouterr().err
    assert not [r for r in caplog.records if "callback failed" in r.getMessage()]


def test_an_exported_program_leaves_the_report_out():
    """jax.export cannot carry the report's host callback (nor export it for another platform):
    exported here and run, an iteration that did not converge falls back to the sequential states
    (on_fail="sequential") or returns NaN states (on_fail="raise"), never the unconverged ones."""
    from jax import export

    cell, params, xs, h0 = _chaos()
    sequential = bppsa.rnn(cell, params, xs, h0, forward="sequential", backward="bptt")
    for on_fail in ("sequential", "raise"):
        f = lambda p, x, h: bppsa.rnn(cell, p, x, h, forward="newton", max_iter=3, on_fail=on_fail)  # noqa: E731,B023
        exported = export.export(jax.jit(f))(params, xs, h0)
        assert "callback" not in exported.mlir_module()
        states = exported.call(params, xs, h0)
        if on_fail == "raise":
            assert bool(jnp.all(jnp.isnan(states)))
        else:
            assert_trees_close(states, sequential)


# plain Newton in float32 and one damped step in float64 in the default run; the rest in the slow run
@pytest.mark.parametrize("damping, dtype", [
    (d, t) if (d, t) in ((None, np.float32), (1e-3, np.float64)) else pytest.param(d, t, marks=pytest.mark.slow)
    for d in (None, 0.0, 1e-3, 1.0) for t in (np.float32, np.float64)])
def test_a_converged_guess_converges_in_one_iteration_with_any_damping(damping, dtype):
    """The documented warm start: the exact states, or a previous converged result, as guess. With
    damping a step from them lowered no merit, was rejected ten times (error inf) and fell back."""
    cell = cells.GRU(I, H)
    params, xs, h0 = random_params(cell, 1, dtype), normal(2, (57, 3, I), dtype=dtype), normal(3, (3, H), 0.1, dtype)
    exact = bppsa.rnn(cell, params, xs, h0, backward="bptt")
    previous = bppsa.rnn(cell, params, xs, h0, forward="newton")
    tol = options.DEFAULT_TOL[np.dtype(dtype).name]
    with warnings.catch_warnings():
        warnings.simplefilter("error", NewtonFallbackWarning)
        for guess in (exact, previous):
            states, info = bppsa.rnn(cell, params, xs, h0, forward="newton", damping=damping, guess=guess,
                                     return_info=True)
            assert (int(info.iterations), bool(info.converged), bool(info.fell_back)) == (1, True, False), info
            assert float(info.error) <= tol and float(info.residual) <= tol
            np.testing.assert_allclose(states, exact, rtol=0, atol=10 * tol)


# --- option checks ---------------------------------------------------------------------------

BAD_OPTIONS = [
    ("tol", 0), ("tol", 0.0), ("tol", -1e-3), ("tol", 1), ("tol", 1.5), ("tol", float("nan")), ("tol", True),
    ("tol", "1e-6"), ("max_iter", 0), ("max_iter", -3), ("max_iter", True), ("max_iter", False), ("max_iter", 2.0),
    ("max_iter", "5"), ("damping", -0.1), ("damping", float("nan")), ("damping", float("inf")), ("damping", True),
    ("damping", "1"), ("on_fail", "fallback"), ("on_fail", None), ("on_fail", "Raise"), ("forward", "newtons"),
    ("forward", None), ("forward", "parallel"),
]


@pytest.mark.parametrize("field,value", BAD_OPTIONS)
def test_bad_options_name_the_field(field, value):
    match = rf"^{field} must be"
    with pytest.raises(UsageError, match=match):
        bppsa.Options(**{field: value})
    with pytest.raises(UsageError, match=match):
        bppsa.Options().replace(**{field: value})
    cell, params, xs, h0 = make_problem(CELLS["gru"](I, H), 3, 1)
    fields = {"forward": "newton", field: value}
    with pytest.raises(UsageError, match=match):
        bppsa.rnn(cell, params, xs, h0, **fields)
    with pytest.raises(UsageError, match=match):
        bppsa.rnn(cell, params, xs, h0, mesh=parallel.make_mesh(4, batch_axis=None), **fields)
    with pytest.raises(UsageError, match=match):
        bppsa.nn.RNN(cell, rngs=nnx.Rngs(0), **fields)  # the options are checked before anything else


def test_good_options_are_kept():
    o = bppsa.Options(forward="quasi", tol=1e-6, max_iter=np.int64(7), damping=0, on_fail="raise")
    assert (o.forward, o.tol, o.max_iter, o.damping, o.on_fail) == ("quasi", 1e-6, 7, 0, "raise")
    assert type(o.max_iter) is int
    cell = cells.RNN(2, 3)
    xs, h0 = jnp.zeros((5, 1, 2), jnp.float64), jnp.zeros((1, 3), jnp.float64)
    plan = o.plan(cell, xs, h0)  # the solver's settings, kept
    assert (plan.forward, plan.scan, plan.tol, plan.max_iter, plan.damping, plan.on_fail) == (
        "quasi", "blelloch", 1e-6, 7, 0.0, "raise")
    assert bppsa.Options().forward == "sequential" and bppsa.Options().on_fail == "sequential"
    assert bppsa.Options().max_iter == options.DEFAULT_MAX_ITER and bppsa.Options().damping is None
    assert options.tolerance(jnp.float64) == 1e-12 and options.tolerance(jnp.float32) == 1e-5
    assert options.tolerance(jnp.float64, 1e-3) == 1e-3


CPU_ONLY = pytest.mark.skipif(jax.default_backend() != "cpu", reason="the CPU cost model's choice")


@CPU_ONLY
def test_forward_auto_is_sequential_on_cpu():
    for name in ("rnn-tanh", "gru", "lstm", "block-gru-k2"):
        for hidden in (4, 64):
            cell = CELLS[name](I, hidden)
            for T, B in [(1, 1), (7, 2), (1000, 1), (1000, 64)]:
                for backward in ("bppsa", "bptt", "auto"):
                    o = bppsa.Options(forward="auto", backward=backward).resolve(cell, T, B, jnp.float64)
                    assert o.forward == "sequential", (name, hidden, T, B, backward)
    cell, params, xs, h0 = make_problem(CELLS["gru"](I, H), 4, 2)
    states, info = jax.jit(lambda p: bppsa.rnn(cell, p, xs, h0, forward="auto", return_info=True))(params)
    assert info is None
    assert_trees_close(states, scan_states(cell, params, xs, h0))


@CPU_ONLY
@pytest.mark.parametrize("name,T,B", [("gru", 10_000, 1), ("rnn-tanh", 100_000, 8), ("lstm", 1_000_000, 1)])
def test_forward_auto_is_sequential_on_cpu_for_long_sequences_of_small_states(name, T, B):
    assert bppsa.Options(forward="auto").resolve(CELLS[name](I, H), T, B, jnp.float64).forward == "sequential"


def test_the_parallel_forward_is_a_while_loop_and_the_sequential_one_is_not():
    """Traced only: forward="newton" runs the iteration (a while loop), "sequential" a plain scan."""
    cell, params, xs, h0 = make_problem(CELLS["gru"](I, H), 5, 2)
    jaxpr = lambda **o: str(jax.make_jaxpr(lambda p: bppsa.rnn(cell, p, xs, h0, **o))(params))
    assert "while[" in jaxpr(forward="newton") and "while[" in jaxpr(forward="quasi")
    assert "while[" not in jaxpr(forward="sequential")
    layer = bppsa.nn.RNN(nnx.GRUCell(I, H, param_dtype=jnp.float64, rngs=nnx.Rngs(0)), forward="quasi", max_iter=9)
    assert (layer.options.forward, layer.options.max_iter) == ("quasi", 9)
    carry = jnp.zeros((2, H))
    assert "while[" in str(jax.make_jaxpr(lambda x: layer(x, initial_carry=carry))(jnp.zeros((2, 5, I))))


# --- flax cells through bppsa.nn.RNN vs nnx.RNN ----------------------------------------------

FLAX_CELLS = {
    "GRUCell": nnx.GRUCell, "LSTMCell": nnx.LSTMCell, "SimpleCell": nnx.SimpleCell,
    "OptimizedLSTMCell": nnx.OptimizedLSTMCell,
}


def _flax_run(model, x, c0, lengths):
    """(final carry, outputs), loss, grads w.r.t. the Params, inputs and initial carry, under nnx.jit."""
    def loss(m, x, c):
        carry, ys = m(x, initial_carry=c, seq_lengths=lengths, return_carry=True)
        return sum(jnp.sum(jnp.cos(a) * (1 + k)) for k, a in enumerate(jax.tree.leaves((ys, carry))))

    def both(m, x, c):
        out = m(x, initial_carry=c, seq_lengths=lengths, return_carry=True)
        return out, *nnx.value_and_grad(loss, argnums=(0, 1, 2))(m, x, c)

    out, value, (gm, gx, gc) = nnx.jit(both)(model, x, c0)
    return out, value, nnx.to_pure_dict(nnx.state(gm, nnx.Param)), gx, gc


def _check_flax(name, kind, T=7, B=3, lengths=(2, 7, 5), **kw):
    make = lambda: FLAX_CELLS[name](I, H, dtype=jnp.float64, param_dtype=jnp.float64, rngs=nnx.Rngs(1))
    x = normal(11, (B, T, I))
    leaves, treedef = jax.tree.flatten(make().initialize_carry((B, I), nnx.Rngs(0)))
    c0 = jax.tree.unflatten(treedef, [normal(20 + k, a.shape, 0.5) for k, a in enumerate(leaves)])
    lengths = jnp.asarray(lengths)
    ref = _flax_run(nnx.RNN(make()), x, c0, lengths)
    got = _flax_run(bppsa.nn.RNN(make(), forward=kind, on_fail="raise", **kw), x, c0, lengths)
    assert_trees_close(got, ref, 1e-9, 1e-11, f"{name} {kind} {kw}: ")


def test_flax_gru_newton_with_seq_lengths():
    _check_flax("GRUCell", "newton")


@slow
@pytest.mark.parametrize("name", sorted(FLAX_CELLS))
@pytest.mark.parametrize("kind", FORWARDS)
def test_flax_cells_with_seq_lengths(name, kind):
    _check_flax(name, kind)


@slow
@pytest.mark.parametrize("name", ["GRUCell", "LSTMCell"])
def test_flax_cells_edge_shapes_and_backwards(name):
    """T = 1, B = 1; BPTT; chunks of 2 (a short last one)."""
    _check_flax(name, "newton", T=1, B=1, lengths=(1,))
    _check_flax(name, "quasi", backward="bptt")
    _check_flax(name, "newton", scan="sequential", chunk_size=2)


def test_constants_are_consistent():
    assert options.KINDS == FORWARDS and set(FORWARDS) < set(bppsa.FORWARDS)
    assert options.ON_FAIL == ("sequential", "raise")
    assert math.isclose(TOL, 1e-12)


def test_an_overflowing_iterate_is_never_reported_converged():
    """Regression: a chaotic RNN (spectral radius 3) at T = 1000, float32: the first Newton step
    overflows to NaN; XLA's CPU max can skip NaNs, so the residual must count them as +inf. The
    result is the sequential forward's, fell_back is set."""
    cell = cells.RNN(20, 20)
    p = cell.init(jax.random.key(0), jnp.float32)
    rho = float(np.max(np.abs(np.linalg.eigvals(np.asarray(p["W_h"], np.float64)))))
    p = dict(p, W_h=p["W_h"] * (3 / rho))
    xs = jax.random.normal(jax.random.key(1), (1000, 2, 20), jnp.float32)
    h0 = jnp.zeros((2, 20), jnp.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        states, info = bppsa.rnn(cell, p, xs, h0, forward="newton", max_iter=5, return_info=True)
    assert not bool(info.converged) and bool(info.fell_back)
    # the sequential forward's states: one step from the one before, to float32 rounding (a chaotic
    # float32 trajectory cannot be compared with another program's over T = 1000 steps)
    _a_sequential_trajectory(cell, p, xs, h0, states, "the fallback's states")


# --- one-line errors: guess= structure, an empty batch, NaN/inf ---------------------------------

def test_a_guess_of_the_wrong_structure_is_a_one_line_usage_error():
    """A tuple, a dict or a ragged list for a single-array state, or a single array for a pair
    state, is named (it was an AttributeError inside flat_guess); the expected shapes are given."""
    cell, params, xs, h0 = make_problem(CELLS["gru"](I, H), 5, 2)
    one = r"^guess must be shaped like the states rnn returns: a float array of shape \(T, B, H\) = \(5, 2, 4\)"
    for bad, got in [((jnp.zeros((5, 2, 4)),), "a tuple of 1 item"), ((jnp.zeros((5, 2, 4)),) * 2, "a tuple of 2 items"),
                     ({"h": jnp.zeros((5, 2, 4))}, "a dict of 1 item")]:
        one_line_usage_error(rf"{one} \(GRU's state is one array\); got {got}$",
                             lambda: bppsa.rnn(cell, params, xs, h0, forward="newton", guess=bad))
    one_line_usage_error(rf"{one}; got a list of 2 items, which is not an array of numbers$",
                         lambda: bppsa.rnn(cell, params, xs, h0, forward="newton", guess=[[0.0], [0.0, 1.0]]))
    one_line_usage_error(rf"{one}; got float64\[5, 2\]$",
                         lambda: bppsa.rnn(cell, params, xs, h0, forward="quasi", guess=np.zeros((5, 2)).tolist()))
    lstm, lp, lxs, lh0 = make_problem(CELLS["lstm"](I, H), 5, 2)
    two = (r"^guess must be shaped like the states rnn returns: a pair of float arrays of shapes \(5, 2, 4\), "
           r"\(5, 2, 4\)")
    one_line_usage_error(rf"{two} \(LSTM's state is a pair\); got a float64 array of shape \(5, 2, 4\)$",
                         lambda: bppsa.rnn(lstm, lp, lxs, lh0, forward="newton", guess=jnp.zeros((5, 2, 4))))
    one_line_usage_error(rf"{two}; got float64\[5, 2, 4\], float64\[5, 2, 1\] \(a list of 2 items\)$",
                         lambda: bppsa.rnn(lstm, lp, lxs, lh0, forward="newton",
                                           guess=[jnp.zeros((5, 2, 4)), jnp.zeros((5, 2, 1))]))


def test_a_nested_list_guess_is_converted():
    """Nested Python lists shaped like the states are taken as arrays (a pair's parts too): the
    exact states as a list converge at once, to the states the array guess gives."""
    for name in ("gru", "lstm"):
        cell, params, xs, h0 = make_problem(CELLS[name](I, H), 5, 2)
        ref = scan_states(cell, params, xs, h0)
        as_lists = jax.tree.map(lambda a: np.asarray(a).tolist(), ref)
        if name == "lstm":
            as_lists = list(as_lists)  # a list pair, each part a nested list
        states, info = bppsa.rnn(cell, params, xs, h0, forward="newton", on_fail="raise", guess=as_lists,
                                 return_info=True)
        assert_trees_close(states, ref, what=name)
        assert int(info.iterations) == 1 and bool(info.converged), f"{name}: {info}"  # the verifying step


@pytest.mark.parametrize("kind, names", [("newton", ("rnn-tanh",)), ("quasi", ("rnn-tanh",)),
                                         pytest.param("newton", ("lstm",), marks=pytest.mark.slow),
                                         pytest.param("quasi", ("lstm",), marks=pytest.mark.slow)])
def test_an_empty_batch_gives_the_sequential_forwards_empty_result(kind, names):
    """B = 0: the parallel forward returns what the sequential one does (it raised 'zero-size array
    to reduction operation max'), its gradients too, converged at 0 iterations; also on a mesh."""
    for name in names:
        cell, params, xs, h0 = make_problem(CELLS[name](I, H), 5, 0)
        loss = lambda out: sum(jnp.sum(a) for a in jax.tree.leaves(out))
        grads = lambda **kw: jax.grad(lambda p, x, h: loss(bppsa.rnn(cell, p, x, h, **kw)), argnums=(0, 1, 2))(
            params, xs, h0)
        seq = bppsa.rnn(cell, params, xs, h0)
        states, info = bppsa.rnn(cell, params, xs, h0, forward=kind, on_fail="raise", return_info=True)
        shapes = lambda tree: jax.tree.map(lambda a: (a.shape, a.dtype), tree)
        assert shapes(states) == shapes(seq) and jax.tree.leaves(seq)[0].shape == (5, 0, H)
        assert bool(info.converged) and not bool(info.fell_back) and int(info.iterations) == 0
        for backward in ("bppsa", "bptt"):
            ref, got = grads(backward=backward), grads(forward=kind, backward=backward, on_fail="raise")
            assert shapes(got) == shapes(ref), f"{name} {backward}"
            for g, r in zip(jax.tree.leaves(got), jax.tree.leaves(ref)):
                np.testing.assert_array_equal(g, r)
        mesh = parallel.make_mesh(4, batch_axis=None)  # under jit: eagerly, the shard_map runs op by op (~1 s)
        sharded = jax.jit(lambda p, x, h: bppsa.rnn(cell, p, x, h, forward=kind, on_fail="raise", mesh=mesh))
        assert shapes(sharded(params, xs, h0)) == shapes(seq)


@pytest.mark.parametrize("kind", ["newton", pytest.param("quasi", marks=pytest.mark.slow)])
def test_nan_inputs_are_named_not_blamed_on_max_iter(kind, monkeypatch):
    """NaN/inf in xs, h0 or params: the failure names where (it said 'did not converge ... raise
    max_iter'), eagerly, under jit and in the fallback's warning."""
    # (label, params, xs, h0, the message's cause) of a GRU, T = 5, B = 2.
    cell, params, xs, h0 = make_problem(CELLS["gru"](I, H), 5, 2)
    problems = [
        ("NaN in xs", params, xs.at[2, 1, 0].set(jnp.nan), h0, r"at step 2 \(the inputs contain NaN/inf: xs\[2\]\)"),
        ("inf in h0", params, xs, h0.at[0, 1].set(jnp.inf), r"at step 0 \(the inputs contain NaN/inf: h0\)"),
        ("NaN in W_h", dict(params, W_h=params["W_h"].at[0, 0].set(jnp.nan)), xs, h0,
         r"at step 0 \(the inputs contain NaN/inf: params\['W_h'\]\)"),
    ]
    for label, params, xs, h0, cause in problems:
        pattern = rf"did not converge after \d+ iterations \(tol .*; residual inf, .*\): the states became " \
                  rf"NaN/inf {cause}; raising max_iter " \
                  r"will not help; remove the NaN/inf from the inputs$"
        with pytest.raises(NewtonDidNotConverge, match=pattern) as info:
            jax.block_until_ready(bppsa.rnn(cell, params, xs, h0, forward=kind, on_fail="raise"))
        assert "\n" not in str(info.value) and "raise max_iter" not in str(info.value), label
        monkeypatch.setattr(newton, "_fallbacks", [0])  # the first fallback warns
        with pytest.warns(NewtonFallbackWarning, match=rf"{cause}; raising max_iter will not help; the sequential "):
            jax.block_until_ready(bppsa.rnn(cell, params, xs, h0, forward=kind))
    label, params, xs, h0, cause = problems[0]
    with pytest.raises(RuntimeError, match=rf"NewtonDidNotConverge: .*{cause}; raising max_iter will not help"):
        jax.block_until_ready(jax.jit(lambda x: bppsa.rnn(cell, params, x, h0, forward=kind, on_fail="raise"))(xs))


def test_an_overflowing_iterate_from_finite_inputs_says_so():
    """Finite inputs whose iterate overflows (relu, huge W_h): the message says the inputs are
    finite and points at damping, not at max_iter."""
    cell = cells.RNN(I, H, nonlinearity="relu")
    params = dict(random_params(cell, 0), W_h=jnp.full((H, H), 1e200))
    xs, h0 = jnp.ones((5, 2, I)), jnp.zeros((2, H))
    with pytest.raises(NewtonDidNotConverge, match=r"the states became NaN/inf at step \d \(the inputs are finite: "
                                                   r"the iterate \(or the recurrence itself\) overflowed\); raising "
                                                   r"max_iter will not help; pass damping="):
        jax.block_until_ready(bppsa.rnn(cell, params, xs, h0, forward="newton", on_fail="raise"))


def test_eager_calls_run_one_compiled_solver_kept_across_calls():
    """Called eagerly, the parallel forward is one jitted program per (cell, plan), made once: a
    second call with the same cell and options reuses it (no retrace, no recompile), the states
    equal a jitted call's and the plain loop's."""
    from bppsa import backprop

    cell, params, xs, h0 = make_problem(CELLS["gru"](I, H), 9, 2)
    backprop.compiled_solver.cache_clear()
    first = bppsa.rnn(cell, params, xs, h0, forward="newton")
    second = bppsa.rnn(cell, params, xs, h0, forward="newton")
    info = backprop.compiled_solver.cache_info()
    assert (info.misses, info.hits) == (1, 1), info
    jitted = jax.jit(lambda p, x, h: bppsa.rnn(cell, p, x, h, forward="newton"))(params, xs, h0)
    np.testing.assert_array_equal(np.asarray(first), np.asarray(second))
    assert_trees_close(first, jitted, what="eager vs jit")
    assert_trees_close(first, scan_states(cell, params, xs, h0), what="eager vs loop")
