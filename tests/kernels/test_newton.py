"""The parallel Newton forward with fused kernels (bppsa.rnn(forward="newton" or "quasi",
kernels="interpret")): a diagonal cell's whole step (bppsa.kernels.newton: the steps, their
Jacobians and the scan in three kernels) equals the XLA step (float64 and float32, T = 1, odd and
non-power-of-two T, B = 1 and over two tiles, H not a power of two, chunks that do not divide T)
and lowers for CUDA; through bppsa.rnn the states and iteration counts are the XLA forward's and
the gradients (the BPPSA backward, its scan fused too) autodiff's through a plain lax.scan in
float64, for the diagonal GRU (ParaRNN's cell), block heads, a block LSTM and a dense cell; the
kernels are what runs (pallas_call in the program)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

import bppsa
from bppsa import cells
from bppsa.forward.sequential import prev_states, steps
from bppsa.forward.step import newton_step
from bppsa.kernels import cuda_module, fused_newton_step, lowering
from bppsa.kernels import newton as kernel_newton
from tests.reference import scan_grads

pytestmark = pytest.mark.filterwarnings("ignore:The Pallas Triton backend is deprecated:DeprecationWarning")

CASES = {
    "diagonal-gru": (lambda: cells.BlockGRU(3, 8, head_size=1), "newton"),
    "block-gru": (lambda: cells.BlockGRU(3, 8, head_size=2), "newton"),
    "block-lstm": (lambda: cells.BlockLSTM(3, 8, head_size=2), "newton"),
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


DIAGONAL = {"gru": lambda H: cells.BlockGRU(3, H), "rnn": lambda H: cells.BlockRNN(3, H),
            "gru-no-hidden-bias": lambda H: cells.BlockGRU(3, H, hidden_bias=False),
            "rnn-relu": lambda H: cells.BlockRNN(3, H, nonlinearity="relu")}


@pytest.mark.parametrize("name, dtype", [(n, d) if n == "rnn" and d == jnp.float64 else  # gru: the e2e test above
                                         pytest.param(n, d, marks=pytest.mark.slow)  # make test-all
                                         for n in DIAGONAL for d in (jnp.float64, jnp.float32)])
def test_the_fused_newton_step_equals_the_xla_step(name, dtype):
    for T, B, H, chunk in [(1, 1, 5, None), (7, 3, 20, None), (30, 17, 33, 4)]:
        cell = DIAGONAL[name](H)
        k = jax.random.split(jax.random.key(T), 4)
        params = cell.init(k[0], dtype)
        xs = jax.random.normal(k[1], (T, B, 3), dtype)
        s0 = 0.5 * jax.random.normal(k[2], (B, H), dtype)
        guess = 0.3 * jax.random.normal(k[3], (T, B, H), dtype)
        plan = bppsa.Options(forward="newton", scan="sequential").plan(cell, xs, s0)
        want = newton_step(cell, plan, params, xs, s0, guess, steps(cell, params, prev_states(s0, guess), xs))
        got = fused_newton_step(cell, params, xs, s0, guess, chunk=chunk, interpret=True)
        tol = 1e-13 if dtype == jnp.float64 else 3e-6
        assert got.dtype == dtype and float(jnp.max(jnp.abs(got - want))) <= tol, (name, T, B, H)


@pytest.mark.parametrize("name", ["gru", "rnn"])
def test_the_fused_newton_step_lowers_for_cuda_here(name):
    cell = DIAGONAL[name](20)
    module = cuda_module(lambda p, x, s, h: fused_newton_step(cell, p, x, s, h), cell.init(jax.random.key(0)),
                         jnp.zeros((37, 5, 3)), jnp.zeros((5, 20)), jnp.zeros((37, 5, 20)))
    assert module.count(lowering.TRITON_CALL) == 3


def test_the_grid_fills_an_h100():
    """A program owns 32 elements ((2, 16) or (1, 32)); the chunks are short enough for >= 4 programs
    an SM of an H100 at every diagonal point (H = 20..256, T >= 1024, B >= 8); H = 200 (padded to
    256) over B = 9 rows: the step is still the XLA one."""
    assert [kernel_newton.tile(h) for h in (16, 32, 256, 1024)] == [(2, 16), (1, 32), (1, 32), (1, 32)]
    for H in (20, 64, 256):
        for T, B in ((1024, 8), (4096, 16)):
            bt, ht = kernel_newton.tile(max(16, 1 << (H - 1).bit_length()))
            tiles = -(-B // bt) * (max(16, 1 << (H - 1).bit_length()) // ht)
            C, chunks = kernel_newton.chunking(T, tiles)
            assert chunks * tiles >= kernel_newton.MIN_PROGRAMS and chunks == -(-T // C), (H, T, B)
    assert kernel_newton.chunking(4096, 16) == (64, 64)  # H = 20, B = 16: 16 tiles, 1024 programs (was 64)
    assert kernel_newton.chunking(1024, 8) == (15, 69)  # H = 20, B = 8: chunks shortened for 552 programs
    assert kernel_newton.chunking(30, 34) == (6, 5)  # short: ⌈√T⌉ steps kept (not 30 chunks of one step)
    assert kernel_newton.chunking(200, 8) == (8, 25)  # shortened to MIN_CHUNK, no further
    assert kernel_newton.chunking(10, 4, chunk=4) == (4, 3)
    cell = cells.BlockGRU(3, 200)
    k = jax.random.split(jax.random.key(2), 4)
    params, xs = cell.init(k[0], jnp.float64), jax.random.normal(k[1], (5, 9, 3), jnp.float64)
    s0, guess = jax.random.normal(k[2], (9, 200), jnp.float64), jax.random.normal(k[3], (5, 9, 200), jnp.float64)
    plan = bppsa.Options(forward="newton", scan="sequential").plan(cell, xs, s0)
    want = newton_step(cell, plan, params, xs, s0, guess, steps(cell, params, prev_states(s0, guess), xs))
    assert float(jnp.max(jnp.abs(fused_newton_step(cell, params, xs, s0, guess, interpret=True) - want))) <= 1e-13


def test_which_cells_the_fused_newton_step_runs():
    assert kernel_newton.supports(cells.BlockGRU(3, 8)) and kernel_newton.supports(cells.BlockRNN(3, 8))
    assert not kernel_newton.supports(cells.BlockGRU(3, 8, head_size=2))  # blocks: the chunked scan
    assert not kernel_newton.supports(cells.BlockLSTM(3, 8))  # (h, c): 2×2 blocks
    assert not kernel_newton.supports(cells.GRU(3, 8))
    with pytest.raises(ValueError, match="the fused Newton step runs bppsa.cells.BlockRNN and BlockGRU"):
        fused_newton_step(cells.GRU(3, 8), None, jnp.zeros((2, 1, 3)), jnp.zeros((1, 8)), jnp.zeros((2, 1, 8)))
    # through bppsa.rnn the diagonal GRU's step is this kernel, not the generic solve
    cell = cells.BlockGRU(3, 8)
    program = str(jax.make_jaxpr(lambda p: bppsa.rnn(cell, p, jnp.ones((5, 2, 3)), jnp.zeros((2, 8)),
                                                     forward="newton", kernels="interpret"))(
        cell.init(jax.random.key(0))))
    assert "fused_newton_step" in program
