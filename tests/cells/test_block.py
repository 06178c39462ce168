"""bppsa.cells.block (per-head recurrences, block-diagonal Jacobians) and its flax front ends
(bppsa.nn.block_cells), in float64: Jacobian blocks, diagonals and dense matrices against
jax.jacrev of the step, parameter gradients against autodiff, bppsa.rnn's states and gradients
against autodiff through the plain lax.scan (tests/reference.py), nnx.RNN against bppsa.nn.RNN."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from hypothesis import strategies as st

import bppsa
from bppsa import cells
from bppsa.cells.structure import elementwise
from bppsa.errors import UsageError
from bppsa.nn import cells as flax_cells
from bppsa.nn import BlockGRUCell, BlockLSTMCell, BlockSimpleCell
from tests.helpers import states_loss
from tests.props import property_pair
from tests.reference import scan_states
from tests.tolerance import assert_trees_close

slow = pytest.mark.slow
SCANS = ("blelloch", "associative", "sequential")

CELLS = {  # name -> (I, H) -> cell
    "rnn-k1": lambda I, H: cells.BlockRNN(I, H),
    "rnn-k2": lambda I, H: cells.BlockRNN(I, H, 2, "relu", hidden_bias=False),
    "gru-k1": lambda I, H: cells.BlockGRU(I, H),
    "gru-k3": lambda I, H: cells.BlockGRU(I, H, 3, hidden_bias=False),
    "gru-kH": lambda I, H: cells.BlockGRU(I, H, H, activation="relu"),
    "lstm-k1": lambda I, H: cells.BlockLSTM(I, H),
    "lstm-k2": lambda I, H: cells.BlockLSTM(I, H, 2, input_bias=False),
    "lstm-k3-flax": lambda I, H: cells.BlockLSTM(I, H, 3, flax_carry=True),
}


@pytest.mark.parametrize("name", ["gru-k3"] + [
    pytest.param(n, marks=slow) for n in ["lstm-k1", "rnn-k2", "lstm-k3-flax", "rnn-k1", "gru-k1", "gru-kH", "lstm-k2"]])
def test_jacobians_and_param_grads_match_autodiff(problem, name):
    """Blocks = the dense autodiff Jacobian's diagonal blocks, zero off them; the dense matrix
    and the diagonal equal it too; param_grads equal one autodiff VJP of the step."""
    def one_example(cell):
        """One example's step on the flat state: (S,), (I,) -> (S,)."""
        return lambda p, s, x: cell.flatten_state(cell.step(p, cell.unflatten_state(s[None]), x[None]))[0]

    cell, params, xs, _ = problem(CELLS[name](3, 6), 3, 2)
    S, k = cell.state_size, cell.jacobian_structure.size
    assert k == (2 if cell.pair_state else 1) * cell.head_size
    sp = 0.7 * jax.random.normal(jax.random.key(9), (3, 2, S), jnp.float64)
    gs = jax.random.normal(jax.random.key(4), (3, 2, S), jnp.float64)

    @jax.jit
    def run(params, sp, xs, gs):
        s = jax.vmap(jax.vmap(lambda a, x: one_example(cell)(params, a, x)))(sp, xs)
        J = cells.autodiff_jacobian(one_example(cell), params, sp, xs)
        ours = (cell.jacobian_blocks(params, sp, xs, s), cell.transposed_jacobian(params, sp, xs, s),
                cell.jacobian_diagonal(params, sp, xs, s), cell.param_grads(params, sp, xs, s, gs))
        return J, ours, cells.autodiff_param_grads(one_example(cell), params, sp, xs, gs)

    J, (blocks, dense, diagonal, grads), want_grads = run(params, sp, xs, gs)
    N = S // k
    assert blocks.shape == (3, 2, N, k, k)
    J6 = J.reshape(3, 2, N, k, N, k)
    assert_trees_close(blocks, jnp.einsum("tbnanc->tbnac", J6), 1e-12, 1e-14)
    assert float(jnp.abs(J6 * (1 - jnp.eye(N))[:, None, :, None]).max()) == 0.0  # nothing off the blocks
    assert_trees_close(dense, J, 1e-12, 1e-14)
    assert_trees_close(diagonal, jnp.diagonal(J, axis1=-2, axis2=-1), 1e-12, 1e-14)
    assert_trees_close(grads, want_grads, 1e-12, 1e-13)


def test_equal_to_the_dense_cells_with_block_diagonal_weights():
    """BlockGRU/BlockLSTM/BlockRNN are cells.GRU/LSTM/RNN with W_h = recurrent_matrix(W_h)."""
    for block, dense in ((cells.BlockRNN(3, 6, 2), cells.RNN(3, 6)), (cells.BlockGRU(3, 6, 3),
                         cells.GRU(3, 6)), (cells.BlockLSTM(3, 6, 2), cells.LSTM(3, 6))):
        p = block.init(jax.random.key(1), jnp.float64)
        q = dict(p, W_h=cells.recurrent_matrix(p["W_h"], block.gates))
        assert np.count_nonzero(q["W_h"]) == p["W_h"].size
        xs = jax.random.normal(jax.random.key(2), (4, 2, 3), jnp.float64)
        h0 = dense.unflatten_state(jax.random.normal(jax.random.key(3), (2, dense.state_size), jnp.float64))
        assert_trees_close(scan_states(block, p, xs, h0), scan_states(dense, q, xs, h0), 1e-13, 1e-14)


def _check(cell, params, xs, h0, scans=SCANS, chunk_size=None, backwards=("bppsa",), rtol=1e-9):
    """States and gradients (params, xs, h0) of bppsa.rnn against autodiff through lax.scan, every
    scan and backward in one compiled function."""

    @jax.jit
    def run(p, x, h):
        ref = scan_states(cell, p, x, h), jax.grad(lambda *a: states_loss(scan_states(cell, *a)), argnums=(0, 1, 2))(p, x, h)
        got = []
        for backward in backwards:
            for scan in scans if backward == "bppsa" else ("blelloch",):
                f = lambda p, x, h: bppsa.rnn(cell, p, x, h, backward=backward, scan=scan, chunk_size=chunk_size)
                got.append((f(p, x, h), jax.grad(lambda *a: states_loss(f(*a)), argnums=(0, 1, 2))(p, x, h)))
        return ref, got

    ref, got = run(params, xs, h0)
    for g in got:
        assert_trees_close(g, ref, rtol, rtol * 1e-2)


@pytest.mark.parametrize("name,T,B", [("gru-k3", 7, 2), ("rnn-k1", 1, 1)] + [
    pytest.param(n, T, B, marks=slow) for n, T, B in [("lstm-k2", 6, 1), ("rnn-k2", 12, 2), ("gru-k1", 17, 1), ("gru-kH", 9, 2),
                                                      ("lstm-k3-flax", 10, 2), ("lstm-k2", 1, 2), ("lstm-k1", 5, 3)]])
def test_rnn_gradients_match_autodiff(problem, name, T, B):
    cell, params, xs, h0 = problem(CELLS[name](3, 6), T, B, seed=T)
    _check(cell, params, xs, h0, backwards=("bppsa", "bptt"))


# (cell, H, T, B) -> the CPU plan's (hoist, unroll) with BPTT (autodiff through the loop) and with
# BPPSA (the loop is a forward alone); float32 inputs, the measured rule of bppsa.plan.rules' elementwise loop.
ELEMENTWISE_RULES = [
    ("gru", 20, 517, 4, (True, 1), (True, 1)),       # H < 48, B·G·H = 240: hoisted
    ("gru", 8, 1024, 2, (True, 2), (True, 2)),       # tiny steps (B·G·H = 48): unrolled twice
    ("gru", 20, 1034, 32, (False, 1), (False, 1)),   # B·G·H = 1920 > HOIST_MAX; 7.6 MiB > 2 MiB
    ("gru", 64, 4096, 8, (False, 1), (False, 1)),    # H >= 48 (the never-slower issue's point)
    ("gru", 64, 4096, 1, (False, 2), (False, 1)),    # B = 1 in the loop: BPTT unrolls twice
    ("gru", 64, 1024, 1, (False, 2), (True, 1)),     # 768 KiB: a forward alone hoists
    ("lstm", 64, 4096, 8, (False, 2), (False, 2)),
    ("lstm", 16, 1024, 1, (False, 2), (True, 2)),
    ("rnn", 64, 4096, 8, (True, 1), (True, 2)),
]


@pytest.mark.parametrize("kind, H, T, B, bptt, forward", ELEMENTWISE_RULES)
def test_elementwise_loop_plan(kind, H, T, B, bptt, forward):
    cell = {"gru": cells.BlockGRU, "lstm": cells.BlockLSTM, "rnn": cells.BlockRNN}[kind](16, H, 1)
    assert elementwise(cell) and elementwise(flax_cells.Masked(cell))
    xs, s0 = jnp.zeros((T, B, 16)), jnp.zeros((B, cell.state_size))
    for backward, want in (("bptt", bptt), ("bppsa", forward)):
        plan = bppsa.Options(backward=backward).plan(cell, xs, s0)
        assert (plan.hoist, plan.unroll) == want, (backward, plan.hoist, plan.unroll)
        assert bppsa.plan.rules.hoist_inputs(cell, T, B, jnp.float32, backward, "gpu")  # off CPU: always
    parallel = bppsa.Options(backward="bppsa", forward="newton").plan(cell, xs, s0)
    assert parallel.hoist


def test_loop_rules_name_a_bad_use():
    cell = cells.BlockGRU(4, 8, 1)
    with pytest.raises(UsageError, match="backward must be 'bptt' .*'bppsa' or 'forward'; got 'auto'"):
        bppsa.plan.rules.hoist_inputs(cell, 100, 2, None, "auto")
    with pytest.raises(UsageError, match="got 'BPTT'"):
        bppsa.plan.rules.bptt_unroll(cell, 100, 2, backward="BPTT")


@pytest.mark.parametrize("name", ["gru-k1", "lstm-k1"] + [pytest.param(n, marks=slow) for n in ("rnn-k1", "gru-k3")])
def test_elementwise_loop_params(problem, name):
    """At head size 1 a step is elementwise (bppsa.cells.structure.elementwise) and reads W_h as the gates' rows
    (Cell.loop_params), equal to the steps on the stored layout; states and gradients (T = 13, odd;
    B = 3) against float64 autodiff through lax.scan, under every loop rule."""
    cell, params, xs, h0 = problem(CELLS[name](3, 6), 13, 3, seed=7)
    is_elementwise = cell.head_size == 1
    assert elementwise(cell) is is_elementwise
    assert elementwise(flax_cells.Masked(cell)) is is_elementwise
    lp = cell.loop_params(params)
    assert (lp["W_h"].shape == (cell.gates, cell.hidden_size)) if is_elementwise else lp is params
    masked = flax_cells.Masked(cell)
    assert jax.tree.map(jnp.shape, masked.loop_params(params)) == jax.tree.map(jnp.shape, lp)
    u = cell.project(params, xs[0])
    assert_trees_close(cell.step_projected(lp, h0, u), cell.step_projected(params, h0, u), 1e-15, 0)
    assert_trees_close(cell.step(lp, h0, xs[0]), cell.step(params, h0, xs[0]), 1e-15, 0)
    for hoist in (True, False):  # the loop's both forms, whatever the rule picks at this size
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(bppsa.plan.rules, "hoist_inputs", lambda *a, hoist=hoist, **k: hoist)
            _check(cell, params, xs, h0, ("blelloch", "sequential"), backwards=("bppsa", "bptt"))


class _DenseLSTM(cells.BlockLSTM):
    """A BlockLSTM that hides its block structure: the backward forms its dense (S, S) matrices."""

    @property
    def jacobian_structure(self):
        return cells.Dense()


def test_dense_path_without_the_block_structure(problem):
    cell = _DenseLSTM(3, 6, 2, input_bias=False)
    _, params, xs, h0 = problem(CELLS["lstm-k2"](3, 6), 7, 2, seed=4)
    _check(cell, params, xs, h0, ("blelloch",))


@pytest.mark.parametrize("name", ["lstm-k1"] + [pytest.param(n, marks=slow) for n in ("rnn-k2", "gru-k3")])
def test_small_chunks(problem, name):
    cell, params, xs, h0 = problem(CELLS[name](3, 6), 11, 2, seed=1)
    _check(cell, params, xs, h0, ("blelloch", "sequential"), chunk_size=3)


def test_diagonal_cells_elementwise_plan_chunked_newton_and_lle(problem):
    """A cell with 1×1 Jacobian blocks (k = 1): on CPU its plan is the sequential scan over
    cache-sized chunks (bppsa.plan.rules.elementwise_plan); with small chunks (3 steps of T = 11, odd)
    and in one piece (the solve's own loop), the Newton and quasi forwards (their Jacobian diagonals made with the steps and reused by
    the solve and the exponent) the states and gradients equal autodiff's, and NewtonInfo.lle the
    exponent along the returned states."""
    plan = bppsa.Options(forward="newton").plan(cells.BlockGRU(12, 64, 1), jnp.zeros((1034, 32, 12), jnp.float32),
                                                jnp.zeros((32, 64), jnp.float32))
    assert (plan.scan, plan.chunk_size, plan.solve_chunk) == ("sequential", 32, None)  # 32·32·64 float32 = 256 KiB
    assert bppsa.Options(scan="blelloch").plan(cells.BlockGRU(3, 4), jnp.zeros((9, 2, 3)),
                                               jnp.zeros((2, 4))).scan == "blelloch"  # an explicit scan is kept
    cell, params, xs, h0 = problem(CELLS["gru-k1"](3, 6), 11, 2, seed=5)

    @jax.jit
    def run(p, x, h):
        ref = scan_states(cell, p, x, h), jax.grad(lambda *a: states_loss(scan_states(cell, *a)), argnums=(0, 1, 2))(p, x, h)
        got, infos = [], []
        for mode, chunk in (("newton", 3), ("quasi", 3), ("newton", None), ("quasi", None)):  # None: one piece
            kw = dict(backward="bppsa", forward=mode, scan="sequential", chunk_size=chunk, on_fail="raise")
            f = lambda p, x, h: bppsa.rnn(cell, p, x, h, **kw)  # noqa: B023
            got.append((f(p, x, h), jax.grad(lambda *a: states_loss(f(*a)), argnums=(0, 1, 2))(p, x, h)))
            infos.append(bppsa.rnn(cell, p, x, h, return_info=True, **kw)[1])
        return ref, got, infos

    ref, got, infos = run(params, xs, h0)
    for g in got:
        assert_trees_close(g, ref, 1e-8, 1e-10)
    lle = jnp.max(bppsa.lyapunov(cell, params, xs, h0, ref[0]))
    for info in infos:
        assert bool(info.converged) and not bool(info.fell_back)
        np.testing.assert_allclose(info.lle, lle, rtol=1e-8)


_SHAPES = dict(kind=st.sampled_from(["rnn", "gru", "lstm"]), scan=st.sampled_from(SCANS), T=st.integers(1, 20),
               B=st.integers(1, 3), I=st.integers(1, 3), heads=st.integers(1, 3), k=st.integers(1, 3),
               seed=st.integers(0, 1000))


@property_pair(2, 10, **_SHAPES)
def test_gradients_property(problem, kind, scan, T, B, I, heads, k, seed):
    make = {"rnn": cells.BlockRNN, "gru": cells.BlockGRU, "lstm": cells.BlockLSTM}[kind]
    cell, params, xs, h0 = problem(make(I, heads * k, k), T, B, seed=seed)
    _check(cell, params, xs, h0, (scan,), rtol=1e-8)


@pytest.mark.parametrize("name", [pytest.param(n, marks=slow) for n in ("gru-k3", "lstm-k1", "rnn-k2")])
def test_parallel_forward_modes(problem, name):  # the default run's parallel forward of block cells: tests/forward/test_newton.py
    """forward="newton" / "quasi": the same states and gradients."""
    modes = ("newton", "quasi")
    cell, params, xs, h0 = problem(CELLS[name](3, 6), 9, 2, seed=2)

    @jax.jit
    def run(p, x, h):
        ref = scan_states(cell, p, x, h), jax.grad(lambda *a: states_loss(scan_states(cell, *a)), argnums=(0, 1, 2))(p, x, h)
        got = []
        for mode in modes:
            f = lambda p, x, h: bppsa.rnn(cell, p, x, h, backward="bppsa", forward=mode,  # pyright: ignore[reportCallIssue]
                                          on_fail="raise")
            got.append((f(p, x, h), jax.grad(lambda *a: states_loss(f(*a)), argnums=(0, 1, 2))(p, x, h)))
        return ref, got

    ref, got = run(params, xs, h0)
    for g in got:
        assert_trees_close(g, ref, 1e-8, 1e-10)


def test_bad_sizes_and_activations_are_usage_errors():
    with pytest.raises(UsageError, match=r"hidden_size \(6\) must be divisible by head_size \(4\)"):
        cells.BlockGRU(3, 6, 4)
    with pytest.raises(UsageError, match="head_size must be a positive int"):
        cells.BlockLSTM(3, 6, 0)
    with pytest.raises(UsageError, match="nonlinearity must be one of"):
        cells.BlockRNN(3, 6, 2, "gelu")
    with pytest.raises(UsageError, match="divisible by head_size"):
        BlockLSTMCell(3, 5, head_size=2, rngs=nnx.Rngs(0))
    with pytest.raises(UsageError, match="gate_fn must be one of"):
        BlockGRUCell(3, 4, gate_fn=jax.nn.gelu, rngs=nnx.Rngs(0))
    with pytest.raises(UsageError, match="params"):  # a dense W_h is not a BlockGRU's
        cell = cells.BlockGRU(3, 4, 2)
        p = dict(cell.init(jax.random.key(0)), W_h=jnp.zeros((4, 12)))
        bppsa.rnn(cell, p, jnp.zeros((2, 1, 3)), jnp.zeros((1, 4)))


# ---------------------------------------------------------------------------------------------
# The flax front ends
# ---------------------------------------------------------------------------------------------

FLAX = {"simple": BlockSimpleCell, "gru": BlockGRUCell, "lstm": BlockLSTMCell}


@pytest.mark.parametrize("kind,head,lengths,padding", [("lstm", 3, (5, 2, 0), "flax")] + [
    pytest.param(k, h, L, p, marks=slow) for k, h, L, p in [
        ("simple", 1, (3, 5, 1), "identity"), ("lstm", 1, None, "flax"), ("gru", 6, (4, 5, 5), "identity"),
        ("simple", 3, (1, 2, 5), "flax"), ("gru", 2, None, "flax")]])
def test_flax_cells_in_nnx_rnn_and_bppsa_nn_rnn(kind, head, lengths, padding):
    """nnx.RNN(module) and bppsa.nn.RNN(module) (the analytic structured cell) agree: outputs,
    final carry, gradients w.r.t. the module's Params and the inputs."""
    module = FLAX[kind](3, 6, head_size=head, param_dtype=jnp.float64, bias_init=nnx.initializers.normal(0.5),
                        rngs=nnx.Rngs(0))
    x = jax.random.normal(jax.random.key(1), (3, 5, 3), jnp.float64)
    cell, params = flax_cells.plan(module, module.initialize_carry((3, 3), nnx.Rngs(0)), x[:, 0], steps=5)
    assert type(cell) is type(module.bppsa_cell()) and params.keys() == nnx.state(module, nnx.Param).keys()
    ours = bppsa.nn.RNN(module, return_carry=True, backward="bppsa", padding=padding)
    ref = nnx.RNN(module, return_carry=True)
    lens = None if lengths is None else jnp.asarray(lengths)
    mask = 1.0 if lens is None else (jnp.arange(5)[None, :] < lens[:, None])[..., None]
    if padding == "identity":  # the valid outputs only: padded steps differ by design
        loss = lambda m, x: jnp.sum(jnp.sin(m(x, seq_lengths=lens)[1]) * mask)
    else:
        def loss(m, x):
            carry, y = m(x, seq_lengths=lens)
            return jnp.sum(jnp.sin(y) * jnp.cos(jnp.arange(y.shape[-1]))) + sum(jnp.sum(c ** 2) for c in jax.tree.leaves(carry))

    @nnx.jit
    def run(ref, ours, x):
        return [(m(x, seq_lengths=lens), nnx.grad(loss, argnums=(0, 1))(m, x)) for m in (ref, ours)]

    ((c1, y1), g1), ((c2, y2), g2) = run(ref, ours, x)
    if padding == "flax" or lens is None:
        assert_trees_close((c2, y2), (c1, y1), 1e-13, 1e-14)
    assert_trees_close(y2 * mask, y1 * mask, 1e-13, 1e-14)
    assert ours.hidden(c2) is (c2[1] if kind == "lstm" else c2)  # the h of flax's (c, h)
    assert_trees_close(nnx.to_pure_dict(g2[0]), nnx.to_pure_dict(g1[0]), 1e-9, 1e-12)
    assert_trees_close(g2[1], g1[1], 1e-9, 1e-12)


def test_flax_cell_conventions():
    """flax's cell conventions: carry shapes and the LSTM's (c, h), the Params' layout, biases
    as flax's cells have them, mixed precision to the autodiff adapter."""
    rngs = nnx.Rngs(0)
    lstm = BlockLSTMCell(4, 6, head_size=2, rngs=rngs)
    assert {k: v.shape for k, v in flax_cells.cell_params(lstm).items()} == {"W_x": (4, 24), "W_h": (3, 2, 8),
                                                                              "b_h": (24,)}
    assert set(flax_cells.cell_params(BlockGRUCell(4, 6, rngs=rngs))) == {"W_x", "W_h", "b_x"}
    c, h = lstm.initialize_carry((2, 7, 4), rngs)
    assert c.shape == h.shape == (2, 7, 6) and lstm.num_feature_axes == 1
    (c2, h2), y = lstm((c + 1.0, h), jnp.ones((2, 7, 4)))
    assert y is h2 and c2.shape == (2, 7, 6)
    c_seq, h_seq = scan_states(lstm.bppsa_cell(), flax_cells.cell_params(lstm), jnp.ones((1, 2, 4)),
                               (jnp.ones((2, 6)), jnp.zeros((2, 6))))  # flax_carry: the pair (c, h)
    assert_trees_close(h_seq[0], lstm((jnp.ones((2, 6)), jnp.zeros((2, 6))), jnp.ones((2, 4)))[1], 1e-6, 1e-7)
    mixed = BlockGRUCell(4, 6, dtype=jnp.bfloat16, rngs=rngs)
    assert isinstance(flax_cells.plan(mixed, mixed.initialize_carry((2, 4), rngs), jnp.ones((2, 4)), steps=3)[0],
                      flax_cells.Autodiff)


def test_sizes_take_numpy_and_jax_integers():
    """head_size=np.int64(2) (and the other sizes as numpy or JAX integers) was refused as 'must be a
    positive int': it is stored as an int, here and in the flax front ends."""
    for cls in (cells.BlockRNN, cells.BlockGRU, cells.BlockLSTM):
        cell = cls(np.int64(3), jnp.int32(6), np.int64(2))
        assert cell == cls(3, 6, 2) and hash(cell) == hash(cls(3, 6, 2))
        assert all(type(getattr(cell, f)) is int for f in ("input_size", "hidden_size", "head_size"))
    with pytest.raises(UsageError, match=r"^BlockGRU: head_size must be a positive int; got np.float64\(2.0\)"):
        cells.BlockGRU(3, 6, np.float64(2))
    for kind, cls in FLAX.items():
        module = cls(np.int64(3), jnp.int32(6), head_size=np.int64(2), rngs=nnx.Rngs(0))
        assert all(type(getattr(module, f)) is int for f in ("in_features", "hidden_features", "head_size")), kind
        assert module.W_h.shape == (3, 2, cls._gates * 2), kind
        out = bppsa.nn.RNN(module)(jnp.ones((2, 5, 3)))
        assert out.shape == (2, 5, 6), kind
