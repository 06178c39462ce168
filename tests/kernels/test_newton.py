"""The parallel Newton forward with fused kernels (bppsa.rnn(forward="newton" or "quasi",
kernels="interpret")): a diagonal cell's whole step (bppsa.kernels.newton: the steps, their
Jacobians and the scan in three kernels) equals the XLA step (float64 and float32, T = 1, odd and
non-power-of-two T, B = 1 and over two tiles, H not a power of two, chunks that do not divide T)
and lowers for CUDA; through bppsa.rnn the states and iteration counts are the XLA forward's and
the gradients (the BPPSA backward, its scan fused too) autodiff's through a plain lax.scan in
float64, for the diagonal GRU (ParaRNN's cell), block heads, a block LSTM and a dense cell; the
kernels are what runs (pallas_call in the program). The convergence test's pieces come from the
kernels (the step's from the apply kernel, the residual from the next reduce's; equal to iterate's
over (T, B, S)), the iteration counts are XLA's, the input projection runs once before the loop,
and a Newton training step exports for CUDA here."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import pytest
from jax.extend.core import jaxprs_in_params

import bppsa
from bppsa import cells
from bppsa.forward.newton import bound
from bppsa.forward.sequential import prev_states, steps
from bppsa.forward.step import newton_step
from bppsa.kernels import cuda_module, fused_newton_step, lowering
from bppsa.kernels import newton as kernel_newton
from tests.helpers import jax_problem
from tests.reference import scan_grads

pytestmark = pytest.mark.filterwarnings("ignore:The Pallas Triton backend is deprecated:DeprecationWarning")

CASES = {
    "diagonal-gru": (lambda: cells.BlockGRU(3, 8, head_size=1), "newton"),
    "block-gru": (lambda: cells.BlockGRU(3, 8, head_size=2), "newton"),
    "block-lstm": (lambda: cells.BlockLSTM(3, 8, head_size=2), "newton"),
    "dense-gru": (lambda: cells.GRU(3, 6), "newton"),
    "gru-quasi": (lambda: cells.GRU(3, 6), "quasi"),
}


@pytest.mark.parametrize("name", [n if n == "diagonal-gru" else pytest.param(n, marks=pytest.mark.slow)
                                  for n in CASES])  # the others: make test-all
def test_newton_with_fused_solves_equals_autodiff(name):
    make, forward = CASES[name]
    cell = make()
    for T, B in [(1, 1), (7, 2)]:
        params, xs, s0 = jax_problem(cell, T, B, seed=T)
        h0 = cell.unflatten_state(s0)
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


# (37, 1, 20, 2): 19 chunks, the carry's block of 16 and a rest of 3
STEP_SHAPES = [(1, 1, 5, None), (30, 17, 33, 4), (37, 1, 20, 2), (7, 3, 20, None)]


# the default run: the rnn in float64 at T = 1, over two tiles with chunks that do not divide T, and the
# carry's block and rest (odd T, B = 1); its (7, 3, 20) and the other cells and dtypes: make test-all
# (the gru: the e2e test above)
@pytest.mark.parametrize("name, dtype, shapes", [
    pytest.param(n, d, STEP_SHAPES[:3] if default else STEP_SHAPES, id=f"{n}-{jnp.dtype(d).name}",
                 marks=() if default else pytest.mark.slow)
    for n in DIAGONAL for d in (jnp.float64, jnp.float32) for default in [n == "rnn" and d == jnp.float64]]
    + [pytest.param("rnn", jnp.float64, STEP_SHAPES[3:], id="rnn-float64-7-3-20", marks=pytest.mark.slow)])
def test_the_fused_newton_step_equals_the_xla_step(name, dtype, shapes):
    for T, B, H, chunk in shapes:
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
    """A program owns 32 elements ((2, 16) or (1, 32)); the chunks are halved until the grid is
    >= 4 waves of resident one-warp programs (132 SMs x 32) where chunks of >= 8 steps, at most 256
    of them, reach that; elsewhere >= 4 programs an SM (or chunks of 8 steps): at every diagonal
    point (H = 20..1024, T >= 1024, B >= 8) one or the other; H = 200 (padded to 256) over B = 9
    rows: the step is still the XLA one."""
    assert kernel_newton.MIN_PROGRAMS == 4 * 132 * 32
    assert [kernel_newton.tile(h) for h in (16, 32, 256, 1024)] == [(2, 16), (1, 32), (1, 32), (1, 32)]
    for H in (20, 64, 256, 1024):
        for T, B in ((1024, 8), (4096, 16), (30000, 16)):
            bt, ht = kernel_newton.tile(max(16, 1 << (H - 1).bit_length()))
            tiles = -(-B // bt) * (max(16, 1 << (H - 1).bit_length()) // ht)
            C, chunks = kernel_newton.chunking(T, tiles)
            assert chunks == -(-T // C) and C <= math.isqrt(T - 1) + 1, (H, T, B)
            waves = chunks * tiles >= kernel_newton.MIN_PROGRAMS
            assert waves or chunks * tiles >= 4 * 132 or C == kernel_newton.MIN_CHUNK, (H, T, B)
            if not waves:  # then no allowed chunk reaches the waves
                floor = max(kernel_newton.MIN_CHUNK, -(-T // kernel_newton.MAX_CHUNKS))
                assert tiles * -(-T // floor) < kernel_newton.MIN_PROGRAMS, (H, T, B)
    assert kernel_newton.chunking(4096, 128) == (16, 256)  # H = 256, B = 16: 32 768 programs, 7.76 waves
    assert kernel_newton.chunking(4096, 512) == (64, 64)  # H = 1024: ⌈√T⌉ steps already make 7.76 waves
    assert kernel_newton.chunking(4096, 16) == (64, 64)  # H = 20: 256 chunks make 0.97 waves; 1024 programs
    assert kernel_newton.chunking(1024, 8) == (15, 69)  # H = 20, B = 8: chunks shortened for 552 programs
    assert kernel_newton.chunking(30, 34) == (6, 5)  # short: ⌈√T⌉ steps kept (not 30 chunks of one step)
    assert kernel_newton.chunking(200, 8) == (8, 25)  # shortened to MIN_CHUNK, no further
    assert kernel_newton.chunking(30000, 16) == (174, 173)  # long: ⌈√T⌉ steps already make 4 programs an SM
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
    assert "fused_newton_reduce" in program and "fused_newton_apply" in program


def _xla_measures(cell, params, xs, s0, H, Hn, exact, atol, rtol):
    """iterate's tests of the new iterate Hn from H, by XLA over (T, B, S)."""
    F = steps(cell, params, prev_states(s0, Hn), xs)
    over = lambda d, ref: jnp.where(d == 0, 0, jnp.abs(d) / (atol + rtol * jnp.abs(ref)))  # noqa: E731
    t = jnp.arange(H.shape[0])
    r, d = over(Hn - F, F), jnp.where(t[:, None, None] > exact, Hn - H, 0)
    per_step = jnp.max(r, axis=(1, 2))
    front = jnp.min(jnp.where(per_step > 1, t, jnp.iinfo(jnp.int32).max))
    return jnp.max(r), jnp.max(over(d, Hn)), jnp.max(jnp.abs(d) / (1 + jnp.abs(Hn))), jnp.max(jnp.abs(Hn)), front


ITERATE_SHAPES = [(1, 1, 5, None, -1), (30, 17, 33, 4, 9), (37, 1, 20, 2, 20), (7, 3, 20, None, 2)]


# the default run: the rnn at T = 1, over two tiles and the carry's block and rest; its (7, 3, 20) and the
# gru: make test-all
@pytest.mark.parametrize("name, shapes", [
    pytest.param("gru", ITERATE_SHAPES, id="gru", marks=pytest.mark.slow),
    pytest.param("rnn", ITERATE_SHAPES[:3], id="rnn"),
    pytest.param("rnn", ITERATE_SHAPES[3:], id="rnn-7-3-20", marks=pytest.mark.slow)])
def test_the_kernels_measure_the_new_iterate_as_iterate_does(name, shapes):
    """fused_newton_iteration's five scalars (the apply kernel's step sizes, the reduce's residual at
    H') equal iterate's tests of H' computed over (T, B, S)
    (float64; chunks that do not divide T, B and H over several tiles: the padded rows and units
    left out; the steps t <= exact out of the step size; T = 1)."""
    for T, B, H, chunk, exact in shapes:
        cell = DIAGONAL[name](H)
        k = jax.random.split(jax.random.key(T), 4)
        params = cell.init(k[0], jnp.float64)
        xs = jax.random.normal(k[1], (T, B, 3), jnp.float64)
        s0 = 0.5 * jax.random.normal(k[2], (B, H), jnp.float64)
        guess = 0.3 * jax.random.normal(k[3], (T, B, H), jnp.float64)
        ops = kernel_newton.newton_operands(cell, params, xs, jnp.float64, interpret=True)
        new, got = kernel_newton.fused_newton_iteration(cell, ops, s0, guess, jnp.int32(exact), atol=1e-3, rtol=1e-4,
                                                        chunk=chunk, interpret=True)
        plain = fused_newton_step(cell, params, xs, s0, guess, chunk=chunk, interpret=True)
        assert float(jnp.max(jnp.abs(new - plain))) <= 1e-13  # (the tests' XLA flags: to rounding, not bits)
        want = _xla_measures(cell, params, xs, s0, guess, new, exact, 1e-3, 1e-4)
        assert int(got.front) == int(want[4]), (name, T)
        for a, b in zip(got[:4], want[:4], strict=True):  # the residual: the steps evaluated by each
            assert abs(float(a) - float(b)) <= 1e-9 * max(1.0, float(b)), (name, T, got, want)
        assert float(got.size) < bound(jnp.float64)
        same = kernel_newton.fused_newton_iteration(cell, ops, s0, guess, jnp.int32(exact), atol=1e-3, rtol=1e-3,
                                                    chunk=chunk, interpret=True)[1]
        assert float(same.step_rel) == 0.0  # atol = rtol: iterate takes it from the step


def _while_primitives(jaxpr, inside=False, found=None):
    """The primitives run in every iteration of the jaxpr's while loops (not inside a cond's
    branches, nor the kernels' own)."""
    found = set() if found is None else found
    for eqn in jaxpr.eqns:
        if inside and eqn.primitive.name != "cond":
            found.add(eqn.primitive.name)
        if eqn.primitive.name in ("cond", "pallas_call"):
            continue
        for sub in jaxprs_in_params(eqn.params):
            _while_primitives(sub, inside or eqn.primitive.name == "while", found)
    return found


def test_an_iteration_is_the_three_kernels_and_scalars():
    """Through bppsa.rnn an iteration runs the three kernels on the input projection made before
    the loop: no product (x_t W_x) and no pass of the cell's gates over (T, B, S) in the loop
    (the repair's XLA measures sit in a cond not taken)."""
    cell = cells.BlockGRU(3, 8)
    f = lambda p: bppsa.rnn(cell, p, jnp.ones((5, 2, 3)), jnp.zeros((2, 8)),  # noqa: E731
                            forward="newton", kernels="interpret")
    looped = _while_primitives(jax.make_jaxpr(f)(cell.init(jax.random.key(0))).jaxpr)
    assert "pallas_call" in looped and "dot_general" not in looped and "logistic" not in looped, looped


# the default run: the rnn at T = 37 in float32 (B = 1); the gru at T = 1 in float64, whose counts and states
# test_newton_with_fused_solves_equals_autodiff checks at T = 1 and B = 1 in the default run, the other dtype
# of each, T = 100 and quasi: make test-all
@pytest.mark.parametrize("name, T, B, dtype", [
    pytest.param(n, T, B, d, id=f"{n}-{T}-{B}-{jnp.dtype(d).name}",
                 marks=() if (n, T, d) == ("rnn", 37, jnp.float32) else pytest.mark.slow)
    for n, T, B in [("gru", 1, 1), ("rnn", 37, 1), ("gru", 100, 3)] for d in (jnp.float64, jnp.float32)])
@pytest.mark.parametrize("forward", ["newton", pytest.param("quasi", marks=pytest.mark.slow)])
def test_the_kernels_convergence_test_takes_the_xla_decisions(forward, name, T, B, dtype):
    """Through bppsa.rnn the fused iterations' counts, residuals and states are the XLA forward's
    (float64 and float32; T = 1, odd T; B = 1), whose test reads its own pass over the sequence."""
    cell = DIAGONAL[name](20)
    k = jax.random.split(jax.random.key(T + B), 3)
    params = jax.tree.map(lambda a: 2 * a, cell.init(k[0], dtype))  # slower to converge
    xs = jax.random.normal(k[1], (T, B, 3), dtype)
    h0 = 0.5 * jax.random.normal(k[2], (B, 20), dtype)
    run = lambda kernels: bppsa.rnn(cell, params, xs, h0, forward=forward, kernels=kernels,  # noqa: E731
                                    return_info=True)
    (ours, info), (xla, want) = run("interpret"), run("xla")
    what = (name, T, B, jnp.dtype(dtype).name, int(info.iterations), int(want.iterations))
    assert int(info.iterations) == int(want.iterations) and bool(info.converged) == bool(want.converged), what
    tol = 1e-12 if dtype == jnp.float64 else 1e-5
    assert float(jnp.max(jnp.abs(ours - xla))) <= tol and abs(float(info.residual - want.residual)) <= tol, what


def test_an_iterate_that_needs_a_repair_is_measured_as_xla_does():
    """An expanding recurrence (|W_h| = 50, float32, T = 40): the first iterates overflow (the
    kernels' size test sends them to the repair and XLA's measures); the counts and states are the
    XLA forward's."""
    cell = cells.BlockRNN(3, 8)
    k = jax.random.split(jax.random.key(1), 3)
    params = dict(cell.init(k[0], jnp.float32))
    params["W_h"] = 50 * jnp.sign(params["W_h"])
    xs = jax.random.normal(k[1], (40, 2, 3), jnp.float32)
    h0 = 0.5 * jax.random.normal(k[2], (2, 8), jnp.float32)
    ops = kernel_newton.newton_operands(cell, params, xs, jnp.float32, interpret=True)
    first = kernel_newton.fused_newton_iteration(cell, ops, h0, jnp.zeros((40, 2, 8), jnp.float32), jnp.int32(0),
                                                 atol=1e-5, rtol=1e-5, interpret=True)[1]
    assert float(first.size) > bound(jnp.float32)  # a repair is due
    run = lambda kernels: bppsa.rnn(cell, params, xs, h0, forward="newton", kernels=kernels,  # noqa: E731
                                    return_info=True)
    (ours, info), (xla, want) = run("interpret"), run("xla")
    assert int(info.iterations) == int(want.iterations) and bool(info.converged) and bool(want.converged)
    assert float(jnp.max(jnp.abs(ours - xla))) <= 1e-5


@pytest.mark.parametrize("kernels", ["pallas", "xla"])
def test_a_newton_training_step_exports_for_cuda_here(kernels):
    """jax.export of a forward="newton" training-step gradient for CUDA on this CPU serialises: the
    convergence report (a host callback) is left out of an exported program."""
    cell = cells.BlockGRU(3, 20)
    params = cell.init(jax.random.key(0), jnp.float32)
    xs, h0 = jnp.zeros((37, 5, 3)), jnp.zeros((5, 20))
    loss = lambda p, x, h: jnp.sum(bppsa.rnn(cell, p, x, h, forward="newton", kernels=kernels))  # noqa: E731
    exported = lowering.cuda_export(jax.grad(loss), params, xs, h0)
    assert exported.platforms == ("cuda",) and len(exported.mlir_module_serialized) > 0
    module = exported.mlir_module()
    assert "callback" not in module
    # the forward's four (the reduce before the loop, then reduce, carry and apply in it), the backward's three
    assert module.count(lowering.TRITON_CALL) == (7 if kernels == "pallas" else 0)
