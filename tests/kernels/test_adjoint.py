"""BPTT's fused adjoint loop (bppsa.kernels.adjoint): in Pallas's interpret mode its adjoint states
and ∂L/∂s0 are JAX's reverse mode through the sequential forward (float64 and float32, T = 1, odd
T, B = 1, B over two tiles, H not a power of two, LSTM's pair state); it lowers for CUDA on this
CPU; through bppsa.rnn(backward="bptt", kernels="interpret") the gradients equal autodiff's through
a plain lax.scan in float64."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

import bppsa
from bppsa import cells
from bppsa.forward.sequential import forward_states
from bppsa.kernels import cuda_module, fused_adjoint, lowering
from bppsa.kernels.recurrence import max_hidden
from tests.helpers import jax_problem
from tests.reference import scan_grads

pytestmark = pytest.mark.filterwarnings("ignore:The Pallas Triton backend is deprecated:DeprecationWarning")

CELLS = {"rnn": lambda I, H: cells.RNN(I, H), "gru": lambda I, H: cells.GRU(I, H),
         "lstm": lambda I, H: cells.LSTM(I, H, input_bias=False)}


ADJOINT_SHAPES = [(1, 1, 5), (12, 17, 33), (7, 3, 20)]


# the default run: the float64 lstm at T = 1 and over two tiles (the odd T = 7: the fused BPTT gradients
# below); its (7, 3, 20) and the other cells and dtypes: make test-all
@pytest.mark.parametrize("name, dtype, shapes", [
    pytest.param(n, d, ADJOINT_SHAPES[:2] if default else ADJOINT_SHAPES, id=f"{n}-{jnp.dtype(d).name}",
                 marks=() if default else pytest.mark.slow)
    for n in sorted(CELLS) for d in (jnp.float64, jnp.float32) for default in [(n, d) == ("lstm", jnp.float64)]] + [
    pytest.param("lstm", jnp.float64, ADJOINT_SHAPES[2:], id="lstm-float64-7-3-20", marks=pytest.mark.slow)])
def test_interpret_mode_equals_reverse_mode(name, dtype, shapes):
    for T, B, H in shapes:
        H = min(H, max_hidden(CELLS[name](3, H)))  # a GRU: at most 32
        cell = CELLS[name](3, H)
        params, xs, s0, ct = jax_problem(cell, T, B, dtype, seed=T, extra=((T, B, cell.state_size),))
        ss = forward_states(cell, params, xs, s0)
        # the adjoint state of step t is the gradient w.r.t. a perturbation added to s_t
        def loss(eps):
            def body(s, inp):
                x, e = inp
                s = cell.flatten_state(cell.step(params, cell.unflatten_state(s), x)) + e
                return s, s
            return jnp.sum(jax.lax.scan(body, s0, (xs, eps))[1] * ct)
        want = jax.grad(loss)(jnp.zeros_like(ss))
        g0_want = jax.vjp(lambda s: forward_states(cell, params, xs, s), s0)[1](ct)[0]
        gs, g0 = fused_adjoint(cell, params, xs, s0, ss, ct, interpret=True)
        tol = 1e-12 if dtype == jnp.float64 else 2e-5
        assert gs.dtype == dtype and g0.shape == s0.shape
        assert float(jnp.max(jnp.abs(gs - want))) <= tol, (name, T, B, H)
        assert float(jnp.max(jnp.abs(g0 - g0_want))) <= tol, (name, T, B, H)


@pytest.mark.parametrize("name", sorted(CELLS))
def test_the_kernel_lowers_for_cuda_here(name):
    cell = CELLS[name](3, 20)
    params, S = cell.init(jax.random.key(0)), cell.state_size
    module = cuda_module(lambda p, x, s, ss, ct: fused_adjoint(cell, p, x, s, ss, ct), params, jnp.zeros((9, 5, 3)),
                         jnp.zeros((5, S)), jnp.zeros((9, 5, S)), jnp.zeros((9, 5, S)))
    assert module.count(lowering.TRITON_CALL) == 1


@pytest.mark.parametrize("name", [n if n == "rnn" else pytest.param(n, marks=pytest.mark.slow) for n in sorted(CELLS)])
def test_fused_bptt_gradients_equal_autodiff(name):
    """The fused forward and the fused adjoint loop (the whole BPTT step in two kernels), float64."""
    for T, B in [(1, 1), (7, 2)]:
        cell = CELLS[name](3, 5)
        params, xs, s0, _ = jax_problem(cell, T, B, jnp.float64, seed=T, extra=((T, B, cell.state_size),))
        h0 = cell.unflatten_state(s0)
        w = jnp.cos(jnp.arange(T * B * 5, dtype=jnp.float64)).reshape(T, B, 5)
        loss = lambda states: jnp.sum(jnp.sin(cell.hidden(states)) * w)  # noqa: E731
        want = scan_grads(cell, params, xs, h0, loss)
        f = lambda p, x, h: loss(bppsa.rnn(cell, p, x, h, backward="bptt", kernels="interpret"))  # noqa: E731
        assert str(jax.make_jaxpr(jax.grad(f))(params, xs, h0)).count("pallas_call") >= 2  # forward and adjoint
        got = jax.grad(f, argnums=(0, 1, 2))(params, xs, h0)
        for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
            assert jnp.allclose(a, b, rtol=1e-10, atol=1e-11), (name, T, B)


def test_a_cell_it_does_not_run_is_a_clear_error():
    with pytest.raises(ValueError, match="the fused adjoint runs bppsa.cells.RNN and LSTM with hidden_size <= 64 "
                                         "and GRU with hidden_size <= 32"):
        fused_adjoint(cells.GRU(3, 80), None, jnp.zeros((2, 1, 3)), jnp.zeros((1, 80)), jnp.zeros((2, 1, 80)),
                      jnp.zeros((2, 1, 80)), interpret=True)
