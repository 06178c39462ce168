"""bppsa.lyapunov: the largest Lyapunov exponent along a trajectory (float64, tests/conftest.py), against
maps whose exponents are known (a linear recurrence: log ρ(A) for a normal A; the logistic map at
r = 4: log 2) and against a direct estimate (one vector through the Jacobians, renormalised every
step, in a Python loop), for dense, block-diagonal and diagonal Jacobians, every chunk length,
T = 1, odd T, B = 1, jit and vmap (the cross products in the slow run)."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import bppsa
from bppsa import cells
from bppsa.cells.structure import block_size
from bppsa.errors import UsageError
from tests.helpers import normal, random_params


@pytest.mark.parametrize("eigs", [(1.3, 0.9, -1.1)] + [pytest.param(e, marks=pytest.mark.slow)
                                                       for e in ((0.8, -0.5, 0.3), (-0.2, 0.1, 0.05))])
def test_linear_recurrence_gives_log_spectral_radius(eigs):
    # h' = A h with A = Q diag(eigs) Qᵀ (normal): λ_max = log max |eigs|.
    seed = 0
    S = len(eigs)
    Q, _ = np.linalg.qr(np.random.default_rng(seed).normal(size=(S, S)))
    A = jnp.asarray(Q @ np.diag(eigs) @ Q.T)
    cell = cells.Generic(lambda p, h, x: p["A"] @ h + 0 * x.sum(), hidden_size=S)
    p = {"A": A}
    xs, h0 = jnp.zeros((999, 2, 1)), normal(1, (2, 3))
    lle = bppsa.lyapunov(cell, p, xs, h0, states=jnp.zeros((999, 2, 3)))  # the Jacobian is A wherever
    np.testing.assert_allclose(lle, math.log(max(abs(e) for e in eigs)), atol=0.01)


def test_logistic_map_at_r4_gives_log_2():
    cell = cells.Generic(lambda p, h, x: p["r"] * h * (1 - h) + 0 * x.sum(), hidden_size=1)
    xs, h0 = jnp.zeros((20000, 3, 1)), jnp.array([[0.1234], [0.31], [0.77]])
    lle = bppsa.lyapunov(cell, {"r": jnp.float64(4.0)}, xs, h0)
    np.testing.assert_allclose(lle, math.log(2), atol=0.05)


def _direct(cell, p, xs, h0):
    """Per sequence, the largest over the Jacobian's diagonal blocks (k = the cell's Blocks' size;
    dense: one block) of one vector (1, …, 1)/√k through the block of J_t (jax.jacrev of the flat
    step), renormalised every step: (B,)."""
    ss = bppsa.rnn(cell, p, xs, h0, backward="bptt")
    flat = lambda s: cell.flatten_state(s)
    s0, ss = flat(h0), flat(ss)
    S = s0.shape[-1]
    k = block_size(cell) or S
    step = lambda s, x: flat(cell.step(p, cell.unflatten_state(s[None]), x[None]))[0]
    jacobian = jax.jit(jax.jacrev(step))  # one compile, not an eager jacrev per step
    out = []
    for b in range(s0.shape[0]):
        v, total, h = np.ones((S // k, k)) / math.sqrt(k), np.zeros(S // k), s0[b]
        for t in range(xs.shape[0]):
            J = np.asarray(jacobian(h, xs[t, b]))
            v = np.stack([J[i * k:(i + 1) * k, i * k:(i + 1) * k] @ v[i] for i in range(S // k)])
            n = np.linalg.norm(v, axis=1)
            total, v, h = total + np.log(n), v / n[:, None], ss[t, b]
        out.append(total.max() / xs.shape[0])
    return np.array(out)


CASES = {
    "gru": lambda: cells.GRU(3, 4),
    "lstm": lambda: cells.LSTM(3, 4),
    "block-gru-k1": lambda: cells.BlockGRU(3, 4, 1),
    "block-lstm-k2": lambda: cells.BlockLSTM(3, 4, 2),
}


@pytest.mark.parametrize("name, T, B", [("gru", 37, 2)] + [
    pytest.param(n, T, B, marks=pytest.mark.slow) for n in CASES for T, B in ((1, 1), (37, 2)) if (n, T) != ("gru", 37)])
def test_equals_a_direct_estimate(name, T, B):
    cell = CASES[name]()
    p = jax.tree.map(lambda a: 3 * a, random_params(cell, 2))  # some expanding, some contracting
    xs = normal(3, (T, B, 3))
    h0 = (normal(4, (B, 4)), normal(5, (B, 4))) if "lstm" in name else normal(4, (B, 4))
    np.testing.assert_allclose(bppsa.lyapunov(cell, p, xs, h0), _direct(cell, p, xs, h0), rtol=1e-9, atol=1e-12)


@pytest.mark.slow
def test_chunk_length_does_not_change_it_and_states_may_be_given():
    cell = cells.GRU(3, 5)
    p, xs, h0 = random_params(cell, 6), normal(7, (101, 2, 3)), normal(8, (2, 5))
    ref = bppsa.lyapunov(cell, p, xs, h0)
    for chunk in (1, 7, 101, 500):
        np.testing.assert_allclose(bppsa.lyapunov(cell, p, xs, h0, chunk=chunk), ref, rtol=1e-10)
    states = bppsa.rnn(cell, p, xs, h0)
    np.testing.assert_allclose(bppsa.lyapunov(cell, p, xs, h0, states=states), ref, rtol=1e-12)
    assert bool(jnp.all(ref < 0))  # a randomly initialised GRU contracts


@pytest.mark.slow
def test_jit_and_vmap():
    cell = cells.BlockGRU(2, 6, 2)
    p, xs, h0 = random_params(cell, 1), normal(2, (4, 50, 3, 2)), normal(3, (3, 6))
    f = jax.jit(jax.vmap(lambda x: bppsa.lyapunov(cell, p, x, h0)))
    out = f(xs)
    assert out.shape == (4, 3)
    for i in range(4):
        np.testing.assert_allclose(out[i], bppsa.lyapunov(cell, p, xs[i], h0), rtol=1e-10)


def test_diagonal_blocks_jit_and_a_given_chunk():
    """The default run's small twin of the two slow tests above: a diagonal cell under jit, T = 9
    (odd), B = 1, equal for chunk 1, 4 and the default."""
    cell = cells.BlockGRU(2, 3, 1)
    p, xs, h0 = random_params(cell, 1), normal(2, (9, 1, 2)), normal(3, (1, 3))
    f = jax.jit(lambda x, c: bppsa.lyapunov(cell, p, x, h0, chunk=c), static_argnums=1)
    ref = _direct(cell, p, xs, h0)
    for c in (1, 4, None):
        np.testing.assert_allclose(f(xs, c), ref, rtol=1e-9)


def test_bad_input_is_a_one_line_value_error():
    cell = cells.GRU(3, 4)
    p, xs, h0 = random_params(cell, 1), normal(2, (5, 2, 3)), normal(3, (2, 4))
    with pytest.raises(ValueError, match=r"^chunk must be a positive int or None; got 0$"):
        bppsa.lyapunov(cell, p, xs, h0, chunk=0)
    with pytest.raises(ValueError, match=r"^states must be shaped like the states rnn returns: a float array of "
                                         r"shape \(T, B, H\) = \(5, 2, 4\); got float32\[4, 2, 4\]$"):
        bppsa.lyapunov(cell, p, xs, h0, states=jnp.zeros((4, 2, 4), jnp.float32))
    # rnn(..., return_info=True)'s (states, info) passed whole: named, not an AttributeError
    out = bppsa.rnn(cell, p, xs, h0, forward="newton", return_info=True)
    with pytest.raises(UsageError, match=r"^states must be shaped like the states rnn returns: .*; got a tuple of 2 "
                                         r"items \(rnn\(\.\.\., return_info=True\) returns \(states, info\): "
                                         r"pass its first item\)$"):
        bppsa.lyapunov(cell, p, xs, h0, states=out)
    lstm = cells.LSTM(3, 4)
    pair = (h0, h0)
    out = bppsa.rnn(lstm, random_params(lstm, 1), xs, pair, return_info=True)
    with pytest.raises(UsageError, match=r"\(LSTM's state is a pair\); got a tuple of 2 items \(rnn"):
        bppsa.lyapunov(lstm, random_params(lstm, 1), xs, pair, states=out)
    with pytest.raises(UsageError, match=r"^states must be shaped like .* a pair of float arrays"):
        bppsa.lyapunov(lstm, random_params(lstm, 1), xs, pair, states=out[0][0])
    with pytest.raises(UsageError, match=r"^xs must have at least one time step"):
        bppsa.lyapunov(cell, p, xs[:0], h0)
