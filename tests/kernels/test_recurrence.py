"""The fused recurrence (bppsa.kernels.recurrence): in Pallas's interpret mode it computes the
sequential forward's states (float32 and float64, T = 1, odd T, B = 1, B over two tiles, H not a
power of two, every activation and bias convention); its Triton lowering for CUDA is checked on this
CPU for every cell it runs; through bppsa.rnn(kernels="interpret") the gradients, forward-mode
derivatives and Hessian-vector products are autodiff's through a plain lax.scan in float64."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

import bppsa
from bppsa import cells
from bppsa.errors import UsageError
from bppsa.forward.sequential import forward_states
from bppsa import kernels as kernel_lib
from bppsa.kernels import cuda_module, fused_states, lowering, recurrence, supports
from tests.helpers import jax_problem
from tests.reference import scan_grads

# JAX >= 0.11 warns that the Triton backend is deprecated: chosen anyway, for its float32 products
# (bppsa.kernels.recurrence says why); the warning is expected, not a finding
pytestmark = pytest.mark.filterwarnings("ignore:The Pallas Triton backend is deprecated:DeprecationWarning")

CELLS = {
    "rnn": lambda I, H: cells.RNN(I, H),
    "rnn-relu-residual": lambda I, H: cells.RNN(I, H, nonlinearity="relu", residual=True, hidden_bias=False),
    "rnn-sigmoid": lambda I, H: cells.RNN(I, H, nonlinearity="sigmoid", input_bias=False),
    "gru": lambda I, H: cells.GRU(I, H),
    "gru-flax-biases": lambda I, H: cells.GRU(I, H, hidden_bias=False),
    "lstm": lambda I, H: cells.LSTM(I, H),
    "lstm-flax-biases": lambda I, H: cells.LSTM(I, H, input_bias=False),
}


FORWARD_SHAPES = [(1, 1, 5), (12, 17, 33), (7, 3, 20)]  # B = 17: two batch tiles; H: padded to 16, 64, 32
DEFAULT_FORWARD = (("rnn", jnp.float64), ("gru", jnp.float64), ("lstm", jnp.float64), ("rnn", jnp.float32))


# the default run: rnn, gru and lstm in float64 and the rnn in float32, each at T = 1 and over two tiles, and
# the float64 rnn at (7, 3, 20) too; the others' (7, 3, 20), the float32 gru and lstm and the activation and
# bias variants: make test-all
@pytest.mark.parametrize("dtype, name, shapes", [
    pytest.param(d, n, FORWARD_SHAPES[:2] if (n, d) in DEFAULT_FORWARD[1:] else FORWARD_SHAPES,
                 id=f"{jnp.dtype(d).name}-{n}", marks=() if (n, d) in DEFAULT_FORWARD else pytest.mark.slow)
    for d in (jnp.float64, jnp.float32) for n in sorted(CELLS)] + [
    pytest.param(d, n, FORWARD_SHAPES[2:], id=f"{jnp.dtype(d).name}-{n}-7-3-20", marks=pytest.mark.slow)
    for n, d in DEFAULT_FORWARD[1:]])
def test_interpret_mode_equals_the_sequential_forward(name, dtype, shapes):
    for T, B, H in shapes:
        H = min(H, recurrence.max_hidden(CELLS[name](3, H)))  # a GRU: at most 32
        cell = CELLS[name](3, H)
        params, xs, s0 = jax_problem(cell, T, B, dtype)
        want = forward_states(cell, params, xs, s0)
        got = fused_states(cell, params, xs, s0, interpret=True)
        assert got.shape == want.shape and got.dtype == want.dtype
        tol = 1e-13 if dtype == jnp.float64 else 2e-6
        assert float(jnp.max(jnp.abs(got - want))) <= tol, (name, T, B, H)


@pytest.mark.parametrize("name", ["rnn", "gru", "lstm"])
def test_the_kernel_lowers_for_cuda_here(name):
    """The Triton lowering runs on this CPU (jax.export for CUDA): a kernel that cannot lower fails here."""
    cell = CELLS[name](3, 20)
    params = cell.init(jax.random.key(0))
    xs, s0 = jnp.zeros((9, 5, 3)), jnp.zeros((5, cell.state_size))
    module = cuda_module(lambda p, x, s: fused_states(cell, p, x, s), params, xs, s0)
    assert module.count(lowering.TRITON_CALL) >= 1


def test_a_kernel_that_cannot_lower_fails_the_check():
    """The check can fail: a kernel with a primitive Triton does not lower (a sort) raises at export."""
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import triton as pl_triton

    def kernel(x_ref, o_ref):
        o_ref[...] = jnp.sort(x_ref[...], axis=0)

    f = lambda x: pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),  # noqa: E731
                                 compiler_params=pl_triton.CompilerParams(num_warps=4))(x)
    with pytest.raises(NotImplementedError, match="Pallas Triton lowering: sort"):
        cuda_module(f, jnp.zeros((16, 16)))


def test_supported_cells_and_sizes():
    assert supports(cells.LSTM(3, recurrence.MAX_HIDDEN)) and not supports(cells.LSTM(3, recurrence.MAX_HIDDEN + 1))
    assert supports(cells.RNN(3, 64)) and supports(cells.GRU(3, 32)) and not supports(cells.GRU(3, 33))  # GRU 64 spills
    assert [recurrence.warps_for(n) for n in (16, 32, 64)] == [4, 4, 8]
    assert [recurrence.warps_for(n, g) for n, g in ((64, 1), (32, 3), (64, 4))] == [4, 4, 8]  # by W_h's size
    assert not supports(cells.Generic(lambda p, h, x: jnp.tanh(h + x)))
    assert [recurrence.padded_size(n) for n in (1, 16, 17, 20, 33, 64)] == [16, 16, 32, 32, 64, 64]
    with pytest.raises(ValueError, match="the fused recurrence runs bppsa.cells.RNN and LSTM with hidden_size <= 64 "
                                         "and GRU with hidden_size <= 32"):
        fused_states(cells.GRU(3, 80), None, jnp.zeros((2, 1, 3)), jnp.zeros((1, 80)), interpret=True)


GRADIENT_SHAPES = [(1, 1), (7, 1), (12, 3)]


# the default run: the rnn at T = 1 and T = 7 with B = 1; its (12, 3) and the gru and lstm: make test-all
@pytest.mark.parametrize("name, shapes", [
    pytest.param("rnn", GRADIENT_SHAPES[:2], id="rnn"),
    pytest.param("rnn", GRADIENT_SHAPES[2:], id="rnn-12-3", marks=pytest.mark.slow),
    pytest.param("gru", GRADIENT_SHAPES, id="gru", marks=pytest.mark.slow),
    pytest.param("lstm", GRADIENT_SHAPES, id="lstm", marks=pytest.mark.slow)])
def test_gradients_through_the_kernel_equal_autodiff(name, shapes):
    """bppsa.rnn(kernels="interpret"): the forward is the kernel, the backward BPPSA's rule at its
    states; float64 against autodiff through a plain lax.scan, T = 1, 7 and 12, B = 1 and 3."""
    for T, B in shapes:
        cell = CELLS[name](3, 5)
        params, xs, s0 = jax_problem(cell, T, B, seed=T)
        h0 = cell.unflatten_state(s0)
        w = jnp.cos(jnp.arange(T * B * cell.hidden_size, dtype=jnp.float64)).reshape(T, B, cell.hidden_size)
        loss = lambda states: jnp.sum(jnp.sin(cell.hidden(states)) * w)  # noqa: E731
        want = scan_grads(cell, params, xs, h0, loss)
        got = jax.grad(lambda p, x, h: loss(bppsa.rnn(cell, p, x, h, kernels="interpret")),
                       argnums=(0, 1, 2))(params, xs, h0)
        for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
            assert jnp.allclose(a, b, rtol=1e-10, atol=1e-11), (name, T, B)


def test_the_memory_chunked_backward_scans_each_chunk_with_the_kernels():
    """chunk_size < T: the backward's chunks (latest first, each one's root its successor's total),
    each scanned by the fused kernels; 7 steps in chunks of 3 (one padded step), float64."""
    cell = CELLS["gru"](3, 5)
    params, xs, s0 = jax_problem(cell, 7, 2, seed=5)
    h0 = cell.unflatten_state(s0)
    loss = lambda states: jnp.sum(jnp.sin(cell.hidden(states)))  # noqa: E731
    want = scan_grads(cell, params, xs, h0, loss)
    got = jax.grad(lambda p: loss(bppsa.rnn(cell, p, xs, h0, kernels="interpret", chunk_size=3)))(params)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want[0]), strict=True):
        assert jnp.allclose(a, b, rtol=1e-10, atol=1e-11)


def test_forward_mode_and_hvps_through_the_kernel():
    cell = CELLS["gru"](3, 5)
    params, xs, s0 = jax_problem(cell, 9, 2, seed=3)
    tangent = jax.tree.map(lambda a: jax.random.normal(jax.random.key(7), a.shape, a.dtype), params)
    ref = lambda p: jnp.sum(jnp.sin(bppsa.rnn(cell, p, xs, s0, backward="bptt")))  # noqa: E731
    ours = lambda p: jnp.sum(jnp.sin(bppsa.rnn(cell, p, xs, s0, kernels="interpret")))  # noqa: E731
    jvp = lambda f: jax.jvp(f, (params,), (tangent,))[1]  # noqa: E731
    assert abs(float(jvp(ours) - jvp(ref))) < 1e-11
    hvp = lambda f: jax.jvp(jax.grad(f), (params,), (tangent,))[1]  # noqa: E731
    for a, b in zip(jax.tree.leaves(hvp(ours)), jax.tree.leaves(hvp(ref)), strict=True):
        assert jnp.allclose(a, b, rtol=1e-9, atol=1e-10)


def test_the_kernels_option():
    """"auto" never picks a kernel on the CPU (nor, until a GPU measurement says so, anywhere);
    "pallas" run off a GPU, or where the kernels do not run, is a one-line error naming why."""
    cell = CELLS["gru"](3, 5)
    params, xs, s0 = jax_problem(cell, 6, 2)
    assert bppsa.Options().plan(cell, xs, s0).kernels == "xla"
    assert bppsa.Options(kernels="interpret").plan(cell, xs, s0).kernels == "interpret"
    assert bppsa.Options(kernels="pallas").plan(cell, xs, s0).kernels == "pallas"  # planned on any host
    with pytest.raises(UsageError, match=r"kernels='pallas' compiles Pallas's Triton kernels for a GPU.*"
                                         r"kernels='interpret'"):
        bppsa.rnn(cell, params, xs, s0, kernels="pallas")
    with pytest.raises(UsageError, match=r"kernels must be one of"):
        bppsa.Options(kernels="triton")
    # every stage needs a kernel, or the option is an error naming the stages that have none
    assert bppsa.Options(kernels="interpret", backward="bptt").plan(cell, xs, s0).kernels == "interpret"
    assert bppsa.Options(kernels="interpret", forward="newton").plan(cell, xs, s0).kernels == "interpret"
    generic = cells.Generic(lambda p, h, x: jnp.tanh(p["w"] * h))
    with pytest.raises(UsageError, match=r"kernels='interpret' needs a fused kernel for every stage .* none for "
                                         r"forward='sequential' of .*forward='newton' runs the fused scan"):
        bppsa.rnn(generic, {"w": jnp.ones(())}, xs, s0, kernels="interpret")
    assert bppsa.Options(kernels="interpret", forward="newton").plan(generic, xs, s0).kernels == "interpret"
    big = cells.GRU(3, 200)
    with pytest.raises(UsageError, match=r"forward='newton' with Jacobian blocks of 200 .*backward='bppsa' with "
                                         r"Jacobian blocks of 200.*kernels='xla' runs it"):
        bppsa.Options(kernels="interpret", forward="newton").plan(big, xs, jnp.zeros((2, 200)))
    with pytest.raises(UsageError, match=r"backward='bptt' of BlockGRU"):
        block = bppsa.cells.BlockGRU(3, 8, head_size=2)
        bppsa.Options(kernels="interpret", forward="newton", backward="bptt").plan(block, xs, jnp.zeros((2, 8)))
    gru64 = cells.GRU(3, 64)  # its compiled kernels spill registers: the limit is named
    assert kernel_lib.unsupported(gru64, "bptt", "sequential", 64) == [
        "forward='sequential' of GRU with hidden_size 64 (the fused recurrence runs hidden sizes up to 32 for a GRU: "
        "larger ones spill registers on the GPU; forward='newton' runs the fused scan for other cells)",
        "backward='bptt' of GRU with hidden_size 64 (the fused adjoint loop runs hidden sizes up to 32 for a GRU: "
        "larger ones spill registers on the GPU)"]
    assert kernel_lib.unsupported(cell, "bppsa", "sequential", cell.state_size, mesh=True) == [
        "a mesh (the sequence-parallel scan has no kernel)"]
    assert kernel_lib.unsupported(big, "bppsa", "quasi", 200) == [
        "backward='bppsa' with Jacobian blocks of 200 (the fused scan takes at most 64: larger ones spill registers "
        "on the GPU)"]


def test_the_flax_drop_in_takes_the_option():
    """bppsa.nn.RNN(kernels=...): "xla" runs as before; "interpret" on flax's cells (adapted, not
    bppsa's own cells) is refused by name, not run another way."""
    from flax import nnx
    x = jax.random.normal(jax.random.key(0), (2, 5, 3))
    out = bppsa.nn.RNN(nnx.GRUCell(3, 4, rngs=nnx.Rngs(0)), kernels="xla")(x)
    assert out.shape == (2, 5, 4)
    with pytest.raises(UsageError, match=r"kernels='interpret' needs a fused kernel .* of GRUCell"):
        bppsa.nn.RNN(nnx.GRUCell(3, 4, rngs=nnx.Rngs(0)), kernels="interpret")(x)
