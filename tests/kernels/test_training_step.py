"""The whole training step with kernels="pallas", exported for CUDA on this CPU: every kernel
lowers inside the real program (the custom derivative rule, the plan's chunking, the parameter
gradients around them), and the step's time loop is gone: a fixed number of Triton kernels whatever
T, and no ``while`` loop left outside them, where XLA's step loops over time."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

import bppsa
from bppsa import cells
from bppsa.kernels import cuda_module, lowering

pytestmark = pytest.mark.filterwarnings("ignore:The Pallas Triton backend is deprecated:DeprecationWarning")


def _step_module(cell, T, kernels, dtype=jnp.float32, **options):
    """The CUDA module of one training-step gradient (a readout of every step's hidden state)."""
    B = 16
    params = cell.init(jax.random.key(0), dtype)
    xs, s0 = jnp.zeros((T, B, cell.input_size), dtype), jnp.zeros((B, cell.state_size), dtype)
    # the plan is made here, on the CPU host, as for a GPU: "pallas" is refused only where its kernels
    # would be compiled for the CPU
    plan = bppsa.Options(kernels=kernels, chunk_size=None, **options).plan(cell, xs, s0)
    loss = lambda p, x, h: jnp.sum(cell.hidden(bppsa.rnn(cell, p, x, h, plan)))  # noqa: E731
    return cuda_module(jax.grad(loss), params, xs, cell.unflatten_state(s0))


@pytest.mark.parametrize("name, backward, kernels", [
    ("rnn", "bppsa", 4),  # the fused forward and the scan's three (its Jacobians formed inside)
    pytest.param("gru", "bppsa", 4, marks=pytest.mark.slow),  # make test-all: the rnn's count is the same
    ("rnn", "bptt", 2),   # the fused forward and the fused adjoint loop
])
def test_the_fused_step_has_no_time_loop_and_a_fixed_number_of_kernels(name, backward, kernels):
    cell = cells.RNN(1, 20) if name == "rnn" else cells.GRU(12, 20)
    for T in (100, 1000):
        fused = _step_module(cell, T, "pallas", backward=backward)
        assert fused.count(lowering.TRITON_CALL) == kernels, (name, T)
        assert fused.count("stablehlo.while") == 0, (name, T)
    assert _step_module(cell, 1000, "xla", backward=backward).count("stablehlo.while") >= 1  # XLA's step loops


@pytest.mark.parametrize("options", [{}, {"backward": "bptt"},
                                     pytest.param({"forward": "newton"}, marks=pytest.mark.slow)],  # make test-all
                         ids=["bppsa", "bptt", "newton"])
def test_an_empty_batch_runs_every_kernel_path(options):
    """B = 0: no program to launch; the states and gradients are XLA's (empty states, zero gradients)."""
    # the fused recurrence and BPTT's adjoint loop run the dense cells; Newton's step the diagonal ones
    for cell in [cells.BlockGRU(3, 8) if "forward" in options else cells.GRU(3, 5)]:
        params, xs = cell.init(jax.random.key(0)), jnp.ones((4, 0, 3))
        h0 = cell.unflatten_state(jnp.zeros((0, cell.state_size)))
        run = lambda p, k: bppsa.rnn(cell, p, xs, h0, kernels=k, **options)  # noqa: E731
        assert run(params, "interpret").shape == run(params, "xla").shape == (4, 0, cell.hidden_size)
        grads = jax.grad(lambda p: jnp.sum(run(p, "interpret")))(params)
        assert all(float(jnp.max(jnp.abs(g), initial=0.0)) == 0.0 for g in jax.tree.leaves(grads))


def test_the_16_bit_step_lowers_for_cuda():
    """bfloat16 arrays: the kernels compute in float32 (Triton lowers no 16-bit division)."""
    assert _step_module(cells.GRU(3, 20), 100, "pallas", dtype=jnp.bfloat16).count(lowering.TRITON_CALL) == 4


@pytest.mark.slow  # make test-all; the lowering above stays in the default run
def test_16_bit_inputs_compute_in_float32():
    """bfloat16 arrays: the kernels compute in float32 and round back; the states and gradients are
    float32's rounded."""
    cell = cells.GRU(3, 20)
    k = jax.random.split(jax.random.key(3), 2)
    params = cell.init(k[0])
    xs, h0 = jax.random.normal(k[1], (9, 2, 3)), jnp.zeros((2, 20))
    half = lambda t: jax.tree.map(lambda a: a.astype(jnp.bfloat16), t)  # noqa: E731
    loss = lambda p, x, h, kernels: jnp.sum(bppsa.rnn(cell, p, x, h, kernels=kernels)).astype(jnp.float32)  # noqa: E731
    want = jax.grad(loss)(half(params), half(xs), half(h0), "xla")
    exact = jax.grad(loss)(params, xs, h0, "xla")
    got = jax.grad(loss)(half(params), half(xs), half(h0), "interpret")
    for g, w, e in zip(jax.tree.leaves(got), jax.tree.leaves(want), jax.tree.leaves(exact), strict=True):
        assert g.dtype == jnp.bfloat16
        scale = float(jnp.max(jnp.abs(e)))
        assert float(jnp.max(jnp.abs(g.astype(jnp.float32) - e))) <= 0.03 * scale  # bfloat16's rounding
        assert float(jnp.max(jnp.abs(w.astype(jnp.float32) - e))) <= 0.05 * scale  # XLA's, for scale


@pytest.mark.parametrize("route", ["keyword", "options", "plan.replace", "rnn(plan, kernels=)", "jit"])
def test_pallas_run_on_the_cpu_is_bppsas_one_line_refusal(route):
    """A plan with kernels="pallas" is made on any host; running it here is bppsa's UsageError, not
    Pallas's "Only interpret mode is supported on CPU backend", by every route to the kernels."""
    from bppsa.errors import UsageError

    cell = cells.GRU(3, 5)
    params, xs, h0 = cell.init(jax.random.key(0)), jnp.ones((6, 2, 3)), jnp.zeros((2, 5))
    plan = bppsa.Options(kernels="interpret").plan(cell, xs, h0)
    runs = {
        "keyword": lambda: bppsa.rnn(cell, params, xs, h0, kernels="pallas"),
        "options": lambda: bppsa.rnn(cell, params, xs, h0, bppsa.Options(kernels="pallas")),
        "plan.replace": lambda: bppsa.rnn(cell, params, xs, h0, plan.replace(kernels="pallas")),
        "rnn(plan, kernels=)": lambda: bppsa.rnn(cell, params, xs, h0, plan, kernels="pallas"),
        "jit": lambda: jax.jit(jax.grad(lambda p: jnp.sum(bppsa.rnn(cell, p, xs, h0, kernels="pallas"))))(params),
    }
    with pytest.raises(UsageError, match=r"^kernels='pallas' compiles Pallas's Triton kernels for a GPU; this "
                                         r"program is being compiled for cpu: kernels='interpret' runs"):
        runs[route]()
