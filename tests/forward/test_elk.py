"""The trust-region (ELK) step of the parallel forward, ``damping=λ0`` (bppsa.forward.elk.trust_region_solve
inside bppsa.forward.newton), in float64:

- the parallel Kalman smoother is the exact minimiser of |linearised residual|² + λ|H − y|², against a
  dense least-squares solve (hypothesis: lengths 1 … 9, block sizes 1 … 3, λ from 0 to 100);
- ELK (full Jacobians, a block-diagonal cell's blocks) and quasi-ELK (diagonals): states equal the
  sequential forward's and gradients equal autodiff through a plain ``lax.scan``, at T = 1, odd T,
  B = 1, under jit and vmap;
- on the chaotic RNN it converges to the reference states or falls back, never wrong
  (tests/forward/test_newton.py's damping tests); on a mesh that splits time it is refused by name.
"""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import strategies as st

import bppsa
from bppsa import cells, parallel
from bppsa.errors import UsageError
from bppsa.forward.newton import NewtonFallbackWarning
from bppsa.forward.elk import trust_region_solve
from tests.forward.test_newton import _check
from tests.props import property_pair
from tests.reference import scan_states

slow = pytest.mark.slow


@property_pair(
    4, 30, n=st.integers(1, 9), R=st.integers(1, 3), k=st.integers(1, 3),
    lam=st.sampled_from([0.0, 1e-3, 0.5, 2.0, 100.0]), seed=st.integers(0, 2**16))
def test_smoother_is_the_exact_minimiser(n, R, k, lam, seed):
    def least_squares(v, Ms, ds, y, lam):
        """The minimiser by a dense solve: one row block per residual h_t − h_{t-1} @ M_t − d_t and
        (λ > 0) per observation √λ (h_t − y_t), for each batch row."""
        n, R, k = ds.shape
        out = np.zeros((n, R, k))
        for r in range(R):
            rows, rhs = [], []
            for t in range(n):
                A = np.zeros((k, n * k))
                A[:, t * k:(t + 1) * k] = np.eye(k)
                if t:
                    A[:, (t - 1) * k:t * k] -= Ms[t, r].T
                rows.append(A)
                rhs.append(ds[t, r] + (v[r] @ Ms[0, r] if t == 0 else 0))
                if lam > 0:
                    O = np.zeros((k, n * k))
                    O[:, t * k:(t + 1) * k] = np.sqrt(lam) * np.eye(k)
                    rows.append(O)
                    rhs.append(np.sqrt(lam) * y[t, r])
            out[:, r] = np.linalg.lstsq(np.vstack(rows), np.concatenate(rhs), rcond=None)[0].reshape(n, k)
        return out

    rng = np.random.default_rng(seed)
    v, Ms = rng.normal(size=(R, k)), 0.9 * rng.normal(size=(n, R, k, k))
    ds, y = rng.normal(size=(n, R, k)), rng.normal(size=(n, R, k))
    got = np.asarray(jax.jit(trust_region_solve)(*map(jnp.asarray, (v, Ms, ds, y)), lam))
    np.testing.assert_allclose(got, least_squares(v, Ms, ds, y, lam), rtol=1e-9, atol=1e-10,
                               err_msg=f"n={n} R={R} k={k} λ={lam}")


def test_no_damping_is_the_newton_step_and_large_damping_no_step():
    """λ = 0 gives the affine recurrence's states; λ → ∞ gives y back."""
    rng = np.random.default_rng(0)
    n, R, k = 6, 2, 3
    v, Ms = jnp.asarray(rng.normal(size=(R, k))), jnp.asarray(0.5 * rng.normal(size=(n, R, k, k)))
    ds, y = jnp.asarray(rng.normal(size=(n, R, k))), jnp.asarray(rng.normal(size=(n, R, k)))
    h, states = v, []
    for t in range(n):
        h = jnp.einsum("rk,rkj->rj", h, Ms[t]) + ds[t]
        states.append(h)
    solve = jax.jit(trust_region_solve)  # one compile for both dampings, not op-by-op dispatch
    np.testing.assert_allclose(solve(v, Ms, ds, y, 0.0), jnp.stack(states), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(solve(v, Ms, ds, y, 1e12), y, atol=1e-9)


ELK = {"elk/blelloch": dict(forward="newton", damping=1.0, backward="bppsa", scan="blelloch"),
       "quasi-elk/bptt": dict(forward="quasi", damping=0.5, backward="bptt")}
MOST = 100


@pytest.mark.parametrize("name", ["gru", pytest.param("block-gru-k2", marks=slow)])
def test_elk_states_and_gradients_equal_lax_scan(name):
    """T = 7 (odd), B = 2, under jit: ELK and quasi-ELK's states and gradients equal the reference's."""
    _check(name, 7, 2, ELK)


@slow
@pytest.mark.parametrize("T, B", [(1, 1), (6, 1), (9, 3)])
@pytest.mark.parametrize("name", ["rnn-tanh", "lstm", "generic", "block-rnn-k1", "block-lstm-k2"])
def test_elk_every_cell_at_edge_shapes(name, T, B):
    _check(name, T, B, ELK)


@slow
def test_elk_one_step():
    """T = 1, B = 1: the first state depends on h0 only."""
    _check("lstm", 1, 1, {"elk": dict(forward="newton", damping=1.0)})


def test_elk_under_vmap(problem):
    """vmap over independent problems: each row's states equal its sequential forward's."""
    cell, params, xs, h0 = problem(cells.GRU(3, 4), 5, 2)
    xss = jnp.stack([xs, 2 * xs, -xs])
    run = jax.jit(jax.vmap(lambda x: bppsa.rnn(cell, params, x, h0, forward="newton", damping=2.0,
                                                on_fail="raise", return_info=True)))
    states, info = run(xss)
    for i in range(3):
        np.testing.assert_allclose(states[i], scan_states(cell, params, xss[i], h0), rtol=1e-10, atol=1e-12)
    assert info.iterations.shape == (3,) and bool(jnp.all(info.converged))


def test_elk_on_a_mesh_that_splits_time_is_refused(problem):
    cell, params, xs, h0 = problem(cells.GRU(3, 4), 8, 2)
    with pytest.raises(UsageError, match=r"damping= \(the trust-region step\) solves the whole sequence on one "
                                         r"device.*pass damping=None"):
        bppsa.rnn(cell, params, xs, h0, forward="newton", damping=1.0, mesh=parallel.make_mesh(4, batch_axis=None))


@slow
def test_elk_on_a_gru_with_weights_x100_converges_or_falls_back(problem):
    """A GRU whose weights are ×100 (float32, DEER's kind of hard case): ELK's damped steps stay finite
    and it converges to the sequential states; converged or fallen back, never wrong."""
    cell, params, xs, h0 = problem(cells.GRU(3, 2), 60, 2, seed=3)
    params = jax.tree.map(lambda a: (100 * a).astype(jnp.float32), params)
    xs, h0 = (xs / 100).astype(jnp.float32), h0.astype(jnp.float32)
    ref = scan_states(cell, params, xs, h0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NewtonFallbackWarning)
        states, info = jax.jit(lambda p, x, h: bppsa.rnn(cell, p, x, h, forward="newton", damping=1.0,
                                                         return_info=True))(params, xs, h0)
    assert bool(info.converged) != bool(info.fell_back), info
    np.testing.assert_allclose(states, ref, atol=1e-4)
