"""The parallel Newton forward with its linear solves by the fused chunked scan
(bppsa.rnn(forward="newton" or "quasi", kernels="interpret")): the states and iteration counts are
the XLA scans', the gradients (the BPPSA backward, its scan fused too) autodiff's through a plain
lax.scan in float64, for the diagonal GRU (ParaRNN's cell), block heads, a block LSTM and a dense
cell; the kernels are what runs (pallas_call in the program)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

import bppsa
from bppsa import cells, structured
from tests.reference import scan_grads

pytestmark = pytest.mark.filterwarnings("ignore:The Pallas Triton backend is deprecated:DeprecationWarning")

CASES = {
    "diagonal-gru": (lambda: structured.BlockGRU(3, 8, head_size=1), "newton"),
    "block-gru": (lambda: structured.BlockGRU(3, 8, head_size=2), "newton"),
    "block-lstm": (lambda: structured.BlockLSTM(3, 8, head_size=2), "newton"),
    "dense-gru": (lambda: cells.GRU(3, 6), "newton"),
    "gru-quasi": (lambda: cells.GRU(3, 6), "quasi"),
}


def _problem(cell, T, B, seed):
    k = jax.random.split(jax.random.key(seed), 3)
    params = cell.init(k[0], jnp.float64)
    xs = jax.random.normal(k[1], (T, B, cell.input_size), jnp.float64)
    h0 = cell.unflatten_state(0.5 * jax.random.normal(k[2], (B, cell.state_size), jnp.float64))
    return params, xs, h0


@pytest.mark.parametrize("name", [n if n == "diagonal-gru" else pytest.param(n, marks=pytest.mark.slow)
                                  for n in CASES])  # the others: make test-all
def test_newton_with_fused_solves_equals_autodiff(name):
    make, forward = CASES[name]
    cell = make()
    for T, B in [(1, 1), (7, 2)]:
        params, xs, h0 = _problem(cell, T, B, seed=T)
        H = cell.hidden_size
        w = jnp.cos(jnp.arange(T * B * H, dtype=jnp.float64)).reshape(T, B, H)
        loss = lambda states: jnp.sum(jnp.sin(cell.hidden(states)) * w)  # noqa: E731
        run = lambda p, x, h, k: bppsa.rnn(cell, p, x, h, forward=forward, kernels=k, return_info=True)  # noqa: E731
        (ours, info), (xla, xla_info) = run(params, xs, h0, "interpret"), run(params, xs, h0, "xla")
        assert int(info.iterations) == int(xla_info.iterations) and bool(info.converged)
        for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(xla), strict=True):
            assert jnp.allclose(a, b, rtol=1e-12, atol=1e-12), (name, T, B)
        f = lambda p, x, h: loss(bppsa.rnn(cell, p, x, h, forward=forward, kernels="interpret"))  # noqa: E731
        assert str(jax.make_jaxpr(f)(params, xs, h0)).count("pallas_call") >= 3  # the solve's three kernels
        got = jax.grad(f, argnums=(0, 1, 2))(params, xs, h0)
        want = scan_grads(cell, params, xs, h0, loss)
        for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
            assert jnp.allclose(a, b, rtol=1e-10, atol=1e-11), (name, T, B)
