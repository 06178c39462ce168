"""bppsa.rnn gradients equal autodiff through a plain lax.scan over cell.step, in float64."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from jax import lax

import bppsa
from bppsa import cells
from tests.helpers import generic_cell, states_loss
from tests.reference import scan_states


SCANS = ("blelloch", "associative", "sequential")


def _generic_cell_with_jacobian(I, H):
    """Generic with a user-supplied analytic Jacobian (a plain tanh RNN)."""
    def step(p, h, x):
        return jnp.tanh(x @ p["A"] + h @ p["W"])

    def jac(p, h, x):  # one example: M[i, j] = ∂h'_i/∂h_j
        hn = step(p, h, x)
        return (1 - hn ** 2)[:, None] * p["W"].T

    def init(key, dtype=jnp.float32):
        k = jax.random.split(key)
        return {"A": jax.random.normal(k[0], (I, H), dtype), "W": jax.random.normal(k[1], (H, H), dtype) / H}

    return cells.Generic(step, jacobian_fn=jac, hidden_size=H, input_size=I, init_fn=init)


CELLS = {
    "rnn-tanh": lambda I, H: cells.RNN(I, H),
    "rnn-relu": lambda I, H: cells.RNN(I, H, nonlinearity="relu"),
    "gru": lambda I, H: cells.GRU(I, H),
    "lstm": lambda I, H: cells.LSTM(I, H),
    "generic": generic_cell,
    "generic-jac": _generic_cell_with_jacobian,
}


_reference = scan_states  # the one plain lax.scan reference (tests/reference.py)


def _grads(fn, params, xs, h0, every_step):
    return jax.jit(jax.grad(lambda p, x, h: states_loss(fn(p, x, h), every_step), argnums=(0, 1, 2)))(params, xs, h0)


def _check_all(cell, params, xs, h0, losses, scans, rtol=1e-9, atol=1e-11):
    """One compiled function: reference and BPPSA gradients for every (loss, scan) pair."""

    @jax.jit
    def run(p, x, h):
        out = []
        for every in losses:
            ref = jax.grad(lambda p, x, h: states_loss(_reference(cell, p, x, h), every), argnums=(0, 1, 2))(p, x, h)
            got = [jax.grad(lambda p, x, h: states_loss(bppsa.rnn(cell, p, x, h, backward="bppsa", scan=s), every),
                            argnums=(0, 1, 2))(p, x, h) for s in scans]
            out.append((ref, got))
        return out

    for ref, got in run(params, xs, h0):
        for g in got:
            jax.tree.map(lambda a, w: np.testing.assert_allclose(a, w, rtol=rtol, atol=atol), g, ref)


slow = pytest.mark.slow

CONVENTIONS = {  # the fields in which published cells differ (flax: no hidden bias / no input bias)
    "rnn-sigmoid-residual-nohbias": lambda: cells.RNN(3, 4, "sigmoid", input_bias=True, hidden_bias=False,
                                                      residual=True),
    "gru-nohbias": lambda: cells.GRU(3, 4, hidden_bias=False),
    "gru-relu-act": lambda: cells.GRU(3, 4, activation="relu"),
    "lstm-noibias": lambda: cells.LSTM(3, 4, input_bias=False),
}


# The default run: every convention at T = 7, B = 2 and the GRU's at T = 1, B = 1 (test-all: each at both).
@pytest.mark.parametrize("name,T,B", [(n, 7, 2) for n in sorted(CONVENTIONS)]
                         + [pytest.param(n, 1, 1, marks=() if n == "gru-nohbias" else slow) for n in sorted(CONVENTIONS)])
def test_cell_conventions_match_autodiff(name, T, B):
    cell = CONVENTIONS[name]()
    k = jax.random.split(jax.random.key(5), 3)
    params = cell.init(k[0], jnp.float64)
    xs = jax.random.normal(k[1], (T, B, 3), jnp.float64)
    h0 = cell.unflatten_state(0.5 * jax.random.normal(k[2], (B, cell.state_size), jnp.float64))
    _check_all(cell, params, xs, h0, (True,), ("blelloch", "sequential"))


# The default run: every cell at T = 1, B = 1 and two at an odd T > 1 (the others' odd T: the
# conventions test above and the generic per-example test below); test-all: every cell at every shape.
_ODD_IN_THE_DEFAULT_RUN = ("gru", "rnn-tanh")


@pytest.mark.parametrize("cell,T,B", [(c, 1, 1) for c in sorted(CELLS)]
                         + [pytest.param(c, 9, 3, marks=() if c in _ODD_IN_THE_DEFAULT_RUN else slow)
                            for c in sorted(CELLS)]
                         + [pytest.param(c, T, B, marks=slow) for c in sorted(CELLS)
                            for T, B in [(2, 3), (3, 1), (7, 2), (8, 1), (17, 2)]])
def test_gradients_match_autodiff(problem, cell, T, B):
    """Every cell x every scan x loss at the last step and at every step."""
    c, params, xs, h0 = problem(CELLS[cell](3, 4), T, B, seed=T)
    _check_all(c, params, xs, h0, [False, True], SCANS)


@pytest.mark.parametrize("cell", ["gru"] + [pytest.param(c, marks=slow) for c in
                                            ["lstm", "rnn-tanh", "rnn-relu", "generic", "generic-jac"]])
def test_long_sequence(problem, cell):
    """T >= 1000 (2^10 + 1 = 1025: a non-power-of-two that carries a block at every level)."""
    c, params, xs, h0 = problem(CELLS[cell](2, 3), 1025, 2, seed=1)
    _check_all(c, params, xs, h0, [False, True], ["blelloch"], rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize("T", [31] + [pytest.param(T, marks=slow) for T in (33, 63, 65)])
def test_powers_of_two_neighbours(problem, T):
    c, params, xs, h0 = problem(CELLS["gru"](3, 5), T, 2, seed=T)
    _check_all(c, params, xs, h0, [False, True], ["blelloch", "associative"])


@pytest.mark.parametrize("cell,H", [("rnn-tanh", 1), ("lstm", 64)] + [
    pytest.param(c, h, marks=slow) for c, h in [("rnn-tanh", 64), ("gru", 1), ("gru", 64), ("lstm", 1)]])
def test_hidden_sizes(problem, cell, H):
    c, params, xs, h0 = problem(CELLS[cell](3, H), 13, 2, seed=H)
    _check_all(c, params, xs, h0, [True], ["blelloch"], rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize("cell", ["rnn-relu", "gru"] + [pytest.param(c, marks=slow) for c in ["rnn-tanh", "lstm"]])
def test_saturated_units(problem, cell):
    """Large weights saturate tanh/sigmoid (σ' ≈ 0) and push relu units to 0."""
    c, params, xs, h0 = problem(CELLS[cell](3, 6), 25, 2, seed=3, param_scale=12.0)
    _check_all(c, params, xs, h0, [True], ["blelloch"], rtol=1e-8, atol=1e-12)


@settings(max_examples=4, deadline=None)
@given(cell=st.sampled_from(sorted(CELLS)), scan=st.sampled_from(SCANS), T=st.integers(1, 40),
       B=st.integers(1, 4), I=st.integers(1, 4), H=st.integers(1, 6), every=st.booleans(),
       seed=st.integers(0, 1000))
def test_gradients_property(problem, cell, scan, T, B, I, H, every, seed):
    c, params, xs, h0 = problem(CELLS[cell](I, H), T, B, seed=seed)
    _check_all(c, params, xs, h0, [every], [scan], rtol=1e-8, atol=1e-10)


def test_forward_values_equal_lax_scan(problem):
    for name in ("gru", "lstm"):
        c, params, xs, h0 = problem(CELLS[name](3, 4), 10, 2)
        for backward in ("bppsa", "bptt"):
            out = bppsa.rnn(c, params, xs, h0, backward=backward)
            jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-12), out, _reference(c, params, xs, h0))


def test_lstm_returns_hs_and_cs(problem):
    c, params, xs, h0 = problem(CELLS["lstm"](3, 4), 5, 2)
    hs, cs = bppsa.rnn(c, params, xs, h0)
    assert hs.shape == cs.shape == (5, 2, 4)


def test_bptt_and_auto_gradients(problem):
    c, params, xs, h0 = problem(CELLS["gru"](3, 4), 12, 2)
    want = _grads(lambda p, x, h: _reference(c, p, x, h), params, xs, h0, True)
    for backward in ("bptt", "auto"):
        got = _grads(lambda p, x, h: bppsa.rnn(c, p, x, h, backward=backward), params, xs, h0, True)
        jax.tree.map(lambda g, w: np.testing.assert_allclose(g, w, rtol=1e-10), got, want)


def test_value_and_grad_jit_vmap(problem):
    """vmap over independent sequences of a jitted value_and_grad; same as the reference."""
    c, params, xs, h0 = problem(CELLS["gru"](3, 4), 9, 2)
    xss = jnp.stack([xs, 2 * xs, -xs])

    def make(fn):
        return jax.jit(jax.vmap(jax.value_and_grad(lambda p, x: states_loss(fn(p, x, h0), True)), in_axes=(None, 0)))

    v1, g1 = make(lambda p, x, h: bppsa.rnn(c, p, x, h))(params, xss)
    v2, g2 = make(lambda p, x, h: _reference(c, p, x, h))(params, xss)
    np.testing.assert_allclose(v1, v2, rtol=1e-12)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-9), g1, g2)


def test_float32_gradients_close_to_float64(problem):
    c, params, xs, h0 = problem(CELLS["rnn-tanh"](1, 20), 300, 2)
    p32, x32, h32 = jax.tree.map(lambda a: a.astype(jnp.float32), (params, xs, h0))
    g64 = _grads(lambda p, x, h: _reference(c, p, x, h), params, xs, h0, False)
    g32 = _grads(lambda p, x, h: bppsa.rnn(c, p, x, h), p32, x32, h32, False)
    assert all(leaf.dtype == jnp.float32 for leaf in jax.tree.leaves(g32))
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-4), g32, g64)


def test_nan_in_inputs_propagates_like_autodiff(problem):
    c, params, xs, h0 = problem(CELLS["rnn-tanh"](3, 4), 9, 2)
    xs = xs.at[4, 0, 1].set(jnp.nan)
    want = _grads(lambda p, x, h: _reference(c, p, x, h), params, xs, h0, True)
    got = _grads(lambda p, x, h: bppsa.rnn(c, p, x, h), params, xs, h0, True)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        assert np.isnan(w).any()
        # every NaN of autodiff is a NaN here; finite entries agree
        assert np.isnan(g[np.isnan(w)]).all()
        finite = ~np.isnan(w) & ~np.isnan(g)
        np.testing.assert_allclose(g[finite], w[finite], rtol=1e-9)


# ---- bad input ------------------------------------------------------------------------------

def test_bad_inputs_raise_clear_errors():
    cell = cells.GRU(3, 4)
    params = cell.init(jax.random.key(0), jnp.float64)
    xs = jnp.ones((5, 2, 3))
    h0 = jnp.zeros((2, 4))
    cases = [
        (dict(xs=jnp.ones((5, 3))), r"xs must have shape \(T, B, I\) \(rank 3\)"),
        (dict(xs=jnp.ones((0, 2, 3))), r"at least one time step"),
        (dict(xs=jnp.ones((5, 2, 7))), r"I = GRU.input_size = 3"),
        (dict(xs=jnp.ones((5, 2, 3), jnp.int32)), r"xs must have a floating dtype"),
        (dict(h0=jnp.zeros((3, 4))), r"h0 must have shape \(B, H\) = \(2, 4\)"),
        (dict(h0=jnp.zeros((2, 5))), r"h0 must have shape \(B, H\) = \(2, 4\)"),
        (dict(h0=jnp.zeros((2, 4), jnp.int32)), r"h0 must have a floating dtype"),
        (dict(backward="magic"), r"backward must be one of"),
        (dict(scan="kogge"), r"scan must be one of"),
        (dict(params={**params, "W_h": params["W_h"].astype(jnp.int32)}), r"params\['W_h'\] must have a floating"),
    ]
    for override, pattern in cases:
        kw = dict(xs=xs, h0=h0, params=params)
        kw.update(override)
        extra = {k: kw.pop(k) for k in ("backward", "scan") if k in kw}
        with pytest.raises(ValueError, match=pattern):
            bppsa.rnn(cell, kw["params"], kw["xs"], kw["h0"], **extra)
    lstm = cells.LSTM(3, 4)
    with pytest.raises(ValueError, match=r"pair \(h0, c0\)"):
        bppsa.rnn(lstm, lstm.init(jax.random.key(0)), xs, h0)
    with pytest.raises(ValueError, match=r"c0 must have shape"):
        bppsa.rnn(lstm, lstm.init(jax.random.key(0)), xs, (h0, jnp.zeros((2, 3))))


def test_bad_cell_configuration():
    with pytest.raises(ValueError, match=r"RNN: nonlinearity must be one of \['tanh', 'sigmoid', 'relu'\]; got 'gelu'"):
        cells.RNN(3, 4, nonlinearity="gelu")
    with pytest.raises(ValueError, match="GRU: gate must be one of"):
        cells.GRU(3, 4, gate=jax.nn.sigmoid)  # by name, so that the cell stays hashable and printable
    with pytest.raises(ValueError, match="LSTM: input_bias must be True or False; got 0"):
        cells.LSTM(3, 4, input_bias=0)
    with pytest.raises(ValueError, match="hidden_size must be a positive int"):
        cells.GRU(3, 0)
    with pytest.raises(ValueError, match="input_size must be a positive int"):
        cells.LSTM(2.5, 4)


# ---------------------------------------------------------------------------------------------
# The RNN's diagonal Jacobian structure (M_t = diag(σ'(a_t)) W_hᵀ): the Blelloch backward's fast
# path, taken from T >= 64 (the scan's first bottom level), exact.
# ---------------------------------------------------------------------------------------------

from bppsa.scan import dense as scan_lib  # noqa: E402


@pytest.mark.parametrize("name", ["rnn-tanh", "rnn-relu"])
def test_scaled_jacobian_is_the_transposed_jacobian(problem, name):
    c, params, xs, h0 = problem(CELLS[name](3, 5), 7, 2)
    ss = _reference(c, params, xs, h0)
    s_prev = jnp.concatenate([h0[None], ss[:-1]])
    st = c.jacobian_structure
    assert isinstance(st, cells.Scaled)
    A, Wt = st.factors(params, s_prev, xs, ss)
    np.testing.assert_array_equal(A[..., None] * Wt, c.transposed_jacobian(params, s_prev, xs, ss))
    for other in ("gru", "lstm", "generic", "generic-jac"):
        assert not isinstance(cells.structure_of(CELLS[other](3, 4)), cells.Scaled)
    assert cells.RNN(3, 5, diagonal=False).jacobian_structure == cells.Dense()  # the structure switched off


@pytest.mark.parametrize("name,T,B", [("rnn-relu", 129, 1)] + [
    pytest.param(*p, marks=slow) for p in [("rnn-tanh", 64, 1), ("rnn-tanh", 300, 2), ("rnn-tanh", 100, 3),
                                           ("rnn-tanh", 1025, 1)]])
def test_rnn_diagonal_path_matches_autodiff(problem, name, T, B, monkeypatch):
    c, params, xs, h0 = problem(CELLS[name](2, 4), T, B, seed=T)
    calls = []
    fast = scan_lib.blelloch_scan_stored_diag
    monkeypatch.setattr(scan_lib, "blelloch_scan_stored_diag", lambda *a: calls.append(a[-1]) or fast(*a))
    _check_all(c, params, xs, h0, [False, True], ["blelloch"], rtol=1e-8, atol=1e-10)
    assert calls and set(calls) == {T}  # the structured path ran (both losses)
    # the same gradients through the dense path (Jacobians formed)
    d = cells.RNN(2, 4, c.nonlinearity, diagonal=False)
    g = [jax.jit(jax.grad(lambda p: states_loss(bppsa.rnn(cell, p, xs, h0), True)))(params) for cell in (c, d)]
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12), *g)


def test_rnn_diagonal_path_chunked(problem):
    """Chunks with the structured scan (auto-sized for it), float64, against autodiff."""
    c, params, xs, h0 = problem(CELLS["rnn-tanh"](1, 3), 200, 1, seed=5)
    ref = jax.jit(jax.grad(lambda p: states_loss(_reference(c, p, xs, h0), True)))(params)
    for chunk in (71,):  # 3 equal chunks of 67, one padding step (one chunk: the tests above)
        got = jax.jit(jax.grad(lambda p: states_loss(bppsa.rnn(c, p, xs, h0, chunk_size=chunk), True)))(params)
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-11), got, ref)


# The default run: each cell at 7 by 3 (padding steps), and the GRU at 2 by 1 (chunks of one step);
# test-all: every cell at every split.
@pytest.mark.parametrize("name,T,B,chunk", [
    pytest.param(n, T, B, chunk, marks=() if (T, chunk) == (7, 3) or (n, T) == ("gru", 2) else slow)
    for n in ("gru", "lstm", "generic") for T, B, chunk in [(7, 2, 3), (10, 1, 4), (9, 3, 3), (2, 1, 1)]])
def test_chunked_backward_with_padding_steps_matches_autodiff(problem, name, T, B, chunk):
    """Equal chunks of at most ``chunk`` steps: T = 7 by 3 is 3 chunks of 3 with 2 padding steps,
    10 by 4 is 3 of 4 with 2, 9 by 3 none, 2 by 1 two of 1. Every gradient (params, xs, h0) in
    float64 against autodiff through lax.scan, losses on every step and on the last one alone (the
    padding steps follow the last: its cotangent must reach it unchanged)."""
    cell, params, xs, h0 = problem(CELLS[name](3, 4), T, B, seed=T + B)
    for every in (True, False):
        ref = _grads(lambda p, x, h: _reference(cell, p, x, h), params, xs, h0, every)
        got = _grads(lambda p, x, h: bppsa.rnn(cell, p, x, h, backward="bppsa", chunk_size=chunk), params, xs, h0,
                     every)
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-11), got, ref)


# ---------------------------------------------------------------------------------------------
# The Cell contract: abstract methods, properties instead of type checks, one return convention.
# ---------------------------------------------------------------------------------------------

def test_cell_contract_and_properties():
    with pytest.raises(TypeError, match="abstract"):
        type("Partial", (cells.Cell,), {"init": lambda self, key, dtype=None: {}})()
    rnn, gru, lstm = cells.RNN(2, 3), cells.GRU(2, 3), cells.LSTM(2, 3)
    assert [c.gates for c in (rnn, gru, lstm)] == [1, 3, 4]
    assert [c.pair_state for c in (rnn, gru, lstm)] == [False, False, True]
    assert [type(c.jacobian_structure) for c in (rnn, gru, lstm)] == [cells.Scaled, cells.Factored, cells.Factored]
    assert not hasattr(cells.Generic(lambda p, h, x: h), "gates")  # a cost input of the affine cells, not the contract
    assert cells.gate_count(cells.Generic(lambda p, h, x: h)) == 1
    with pytest.raises(ValueError, match="diagonal must be True or False"):
        cells.RNN(2, 3, diagonal="no")
    xs = jnp.ones((4, 2, 2))
    for c in (rnn, gru, lstm):
        h0 = c.unflatten_state(jnp.zeros((2, c.state_size)))
        out = bppsa.rnn(c, c.init(jax.random.key(0)), xs, h0)
        assert c.hidden(out).shape == (4, 2, 3)
        assert isinstance(out, tuple) == c.pair_state


# ---------------------------------------------------------------------------------------------
# cells.Generic takes a per-example step (h (S,), x (I,) -> (S,)) that bppsa vmaps over B and T:
# a step cannot couple batch rows, so its gradients are those of autodiff for any step it can write.
# ---------------------------------------------------------------------------------------------

def _mean_step(p, h, x):
    """Nonlinear, and uses h.mean(0): over a batch that coupled rows; on one example, a mean of h."""
    return jnp.tanh(x @ p["A"] + jnp.sin(h) @ p["W"] + p["b"]) * (1.0 + 0.5 * jnp.tanh(h.mean(0)))


def _mean_params(I, H, seed=0):
    k = jax.random.split(jax.random.key(seed), 3)
    return {"A": jax.random.normal(k[0], (I, H), jnp.float64), "W": jax.random.normal(k[1], (H, H), jnp.float64) / H,
            "b": jax.random.normal(k[2], (H,), jnp.float64)}


@pytest.mark.parametrize("T,B", [(1, 1), (7, 3)] + [pytest.param(T, B, marks=slow) for T, B in [(1, 2), (5, 1)]])
def test_generic_per_example_step_matches_plain_scan(T, B):
    """Against autodiff through a plain lax.scan that loops over the batch rows itself."""
    I, H = 2, 3
    cell = cells.Generic(_mean_step, hidden_size=H, input_size=I)
    params = _mean_params(I, H, seed=T)
    k = jax.random.split(jax.random.key(T + 10), 2)
    xs = jax.random.normal(k[0], (T, B, I), jnp.float64)
    h0 = 0.5 * jax.random.normal(k[1], (B, H), jnp.float64)

    def plain(p, x, h):
        body = lambda h, xt: ((n := jnp.stack([_mean_step(p, h[b], xt[b]) for b in range(B)])), n)
        return lax.scan(body, h, x)[1]

    @jax.jit
    def run(p, x, h):
        grad = lambda fn, every: jax.grad(lambda *a: states_loss(fn(*a), every), argnums=(0, 1, 2))(p, x, h)
        return [(grad(plain, every), [grad(lambda p, x, h: bppsa.rnn(cell, p, x, h, scan=s), every)
                                      for s in SCANS]) for every in (False, True)]

    for want, gots in run(params, xs, h0):
        for got in gots:
            jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12), got, want)


def test_generic_functions_see_one_example():
    """step_fn and jacobian_fn are traced on (S,) and (I,) arrays only, forward and backward:
    the batch axis is never theirs to mix, and rows stay independent."""
    I, H, T, B = 2, 3, 4, 5
    seen = []

    def step(p, h, x):
        seen.append(("step", h.shape, x.shape))
        return _mean_step(p, h, x)

    def jac(p, h, x):
        seen.append(("jac", h.shape, x.shape))
        return jax.jacrev(_mean_step, argnums=1)(p, h, x)

    params = _mean_params(I, H)
    xs = jax.random.normal(jax.random.key(1), (T, B, I), jnp.float64)
    h0 = jnp.zeros((B, H))
    for cell in (cells.Generic(step), cells.Generic(step, jacobian_fn=jac)):
        # row 0's loss does not depend on row 1's inputs: exactly zero, as autodiff says
        dxs = jax.jit(jax.grad(lambda x: bppsa.rnn(cell, params, x, h0)[:, 0].sum()))(xs)
        assert np.all(dxs[:, 1:] == 0) and np.any(dxs[:, 0] != 0)
        assert cell.step(params, h0, xs[0]).shape == (B, H)
    assert {s for s in seen} == {("step", (H,), (I,)), ("jac", (H,), (I,))}


# The default run: every cell hoisted at T = 7, B = 3, the GRU and the diagonal BlockGRU also not
# hoisted, and the GRU both ways at T = 1, B = 1; test-all: every cell both ways at both shapes.
_HOIST_DEFAULT = {("gru", 7, False), ("block-gru", 7, False), ("gru", 1, True), ("gru", 1, False)}  # + every (7, hoisted)


@pytest.mark.parametrize("name,T,B,hoist", [
    pytest.param(n, T, B, h, marks=() if (T == 7 and h) or (n, T, h) in _HOIST_DEFAULT else slow)
    for n in ["rnn-tanh", "gru", "lstm", "generic", "block-gru", "block-lstm-k2"]
    for T, B in [(1, 1), (7, 3)] for h in (True, False)])
def test_bptt_gradients_whether_or_not_the_input_product_is_hoisted(problem, monkeypatch, name, T, B, hoist):
    """BPTT's forward computes the inputs' part of the steps before its loop (the plan's ``hoist``)
    or inside each step: either way autodiff's float64 gradients through a plain lax.scan."""
    monkeypatch.setattr(bppsa.plan.rules, "hoist_inputs", lambda *a, **k: hoist)
    make = {"block-gru": lambda I, H: bppsa.cells.BlockGRU(I, H, head_size=1),
            "block-lstm-k2": lambda I, H: bppsa.cells.BlockLSTM(I, H, head_size=2)}
    monkeypatch.setitem(CELLS, "block-gru", make["block-gru"])
    monkeypatch.setitem(CELLS, "block-lstm-k2", make["block-lstm-k2"])
    c, params, xs, h0 = problem(CELLS[name](3, 4), T, B)
    s0 = jnp.concatenate(h0, axis=-1) if isinstance(h0, tuple) else h0
    assert bppsa.Options(backward="bptt").plan(c, xs, s0).hoist is hoist
    for every_step in (True, False):
        want = _grads(lambda p, x, h: _reference(c, p, x, h), params, xs, h0, every_step)
        got = _grads(lambda p, x, h: bppsa.rnn(c, p, x, h, backward="bptt"), params, xs, h0, every_step)
        jax.tree.map(lambda g, w: np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-12), got, want)


def test_bptt_hoists_the_input_product_on_cpu_only_for_small_steps():
    small, large = cells.GRU(8, 16), cells.GRU(12, 20)
    hoist = lambda cell, B, backward="bptt", backend="cpu": bppsa.plan.rules.hoist_inputs(cell, 100, B, jnp.float32,
                                                                                   backward, backend)
    assert hoist(small, 4) and not hoist(large, 32)
    assert hoist(large, 32, backend="gpu") and hoist(large, 32, "bppsa")
    xs, s0 = jax.ShapeDtypeStruct((100, 32, 12), jnp.float32), jax.ShapeDtypeStruct((32, 20), jnp.float32)
    assert not bppsa.Options(backward="bptt").plan(large, xs, s0).hoist
    assert bppsa.Options(backward="bppsa").plan(large, xs, s0).hoist  # a forward autodiff does not run through
