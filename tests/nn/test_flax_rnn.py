"""bppsa.nn.RNN, the drop-in for flax.nnx.RNN: outputs, final carry and gradients (w.r.t. every
nnx.Param and the inputs) equal nnx.RNN's with the same cell, in float64.

The default run covers the LSTM cells and a custom cell with seq_lengths + reverse/keep_order +
return_carry (the hardest combination), the options on the GRU, and every cell's conventions; the
full cross product (every cell in every combination) is slow.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import bppsa
import bppsa.nn
from bppsa import cells
from bppsa.plan import calibration
from bppsa.plan import cost
from bppsa.nn import cells as flax_cells
from bppsa.errors import UsageError
from tests.tolerance import assert_close

F64 = jnp.float64
I, H, B, T = 3, 4, 3, 5
LENGTHS = jnp.array([5, 1, 3])  # full, one step, odd
SHORT = jnp.array([4, 1, 3])  # no row is full: the scan runs 4 steps, not T


class TwoPartCell(nnx.RNNCellBase):
    """A custom cell: a (h, m) carry of two widths and an output that is not the carry."""

    def __init__(self, in_features, hidden_features, *, rngs):
        self.hidden_features = hidden_features
        self.dense = nnx.Linear(in_features + hidden_features, hidden_features, param_dtype=F64, rngs=rngs)
        self.u = nnx.Param(0.5 * jax.random.normal(rngs.params(), (hidden_features, 2), F64))

    def __call__(self, carry, x):
        h, m = carry
        h2 = jnp.tanh(self.dense(jnp.concatenate([x, h], axis=-1))) + 0.5 * m[..., :1]
        m2 = jnp.sin(h2 @ self.u[...])
        return (h2, m2), 2.0 * h2 + m2[..., 1:]

    def initialize_carry(self, input_shape, rngs=None):
        batch = input_shape[:-1]
        return jnp.zeros(batch + (self.hidden_features,), F64), jnp.zeros(batch + (2,), F64)

    @property
    def num_feature_axes(self):
        return 1


def make_cell(kind, in_features=I, seed=0):
    r = nnx.Rngs(seed)
    kw = dict(param_dtype=F64, rngs=r)
    return {
        "simple": lambda: nnx.SimpleCell(in_features, H, dtype=F64, **kw),
        "simple_relu_residual": lambda: nnx.SimpleCell(in_features, H, dtype=F64, residual=True,
                                                       activation_fn=nnx.relu, **kw),
        "gru": lambda: nnx.GRUCell(in_features, H, **kw),
        "lstm": lambda: nnx.LSTMCell(in_features, H, **kw),
        "optimized_lstm": lambda: nnx.OptimizedLSTMCell(in_features, H, **kw),
        "gru_gelu": lambda: nnx.GRUCell(in_features, H, activation_fn=nnx.gelu, **kw),  # autodiff fallback
        "custom": lambda: TwoPartCell(in_features, H, rngs=r),
    }[kind]()


CELLS = ["simple", "simple_relu_residual", "gru", "lstm", "optimized_lstm", "gru_gelu", "custom"]
DEFAULT_CELLS = ["lstm", "optimized_lstm", "custom"]  # the GRU: in its options test; the simple cells: test-all


def slow_unless(default):
    return lambda v: v if v in default else pytest.param(v, marks=pytest.mark.slow)


def inputs(shape=(B, T, I), seed=1):
    return jax.random.normal(jax.random.key(seed), shape, F64)


def valid_mask(lengths, time_major=False):
    m = (jnp.arange(T)[None, :] < lengths[:, None]).astype(F64)[..., None]  # (B, T, 1)
    return jnp.swapaxes(m, 0, 1) if time_major else m


def loss_of(out, mask):
    """A loss of every output (masked to valid steps where given) and of the final carry."""
    carry, ys = out if isinstance(out, tuple) else (None, out)
    loss = sum(jnp.sum(jnp.cos(y) * (1.0 if mask is None else mask)) for y in jax.tree.leaves(ys))
    return loss + sum(jnp.sum(jnp.sin(c) ** 2) for c in jax.tree.leaves(carry))


def value_and_grads(model, x, call, mask):
    def loss(m, x):
        return loss_of(call(m, x), mask)

    out, value, (gm, gx) = nnx.jit(lambda m, x: (call(m, x),) + nnx.value_and_grad(loss, argnums=(0, 1))(m, x))(model, x)
    return out, value, nnx.to_pure_dict(nnx.state(gm, nnx.Param)), gx


def assert_same(a, b, rtol=1e-10, atol=1e-12):
    assert jax.tree.structure(a) == jax.tree.structure(b)
    jax.tree.map(lambda u, v: np.testing.assert_allclose(np.asarray(u), np.asarray(v), rtol=rtol, atol=atol), a, b)


def compare(build, x, call, *, mask=None, outputs_mask=None):
    """build(layer_factory) -> model; layer_factory(cell) is nnx.RNN or bppsa.nn.RNN."""
    ref = value_and_grads(build(lambda cell, **kw: nnx.RNN(cell, **kw)), x, call, mask)
    got = value_and_grads(build(lambda cell, **kw: bppsa.nn.RNN(cell, **kw)), x, call, mask)
    out_ref, out_got = ref[0], got[0]
    if outputs_mask is not None:  # identity padding: outputs agree at valid steps
        keep = lambda o: jax.tree.map(lambda y: y * outputs_mask, o)
        out_ref, out_got = (jax.tree.map(keep, o) if not isinstance(o, tuple) else (o[0], keep(o[1]))
                            for o in (out_ref, out_got))
    assert_same(out_ref, out_got)
    assert_same(ref[1:], got[1:])


VARIANTS = ["plain", "time_major", "bidirectional", "stack", "T1_B1"]


def single(kind, **rnn_kw):
    return lambda layer: layer(make_cell(kind), **rnn_kw)


# --- the hardest combination (the default run: DEFAULT_CELLS; test-all: every cell) ------------

@pytest.mark.parametrize("kind", [slow_unless(DEFAULT_CELLS)(k) for k in CELLS])
def test_padded_reverse_keep_order_with_carry_equals_flax(kind):
    x, mask = inputs(), valid_mask(SHORT)
    call = lambda m, x: m(x, seq_lengths=SHORT, return_carry=True, reverse=True, keep_order=True)
    compare(single(kind), x, call, mask=mask, outputs_mask=mask)


@pytest.mark.parametrize("kind, reverse", [("gru", False)] + [
    pytest.param(k, r, marks=pytest.mark.slow) for k, r in (("gru", True), ("custom", False), ("custom", True))])
def test_flax_padding_equals_flax_at_every_step(kind, reverse):
    """padding="flax": padded steps run the cell, so every output (and an unmasked loss) agrees."""
    x = inputs()
    call = lambda m, x: m(x, seq_lengths=LENGTHS, return_carry=True, reverse=reverse, keep_order=reverse)
    ref = value_and_grads(nnx.RNN(make_cell(kind)), x, call, None)
    got = value_and_grads(bppsa.nn.RNN(make_cell(kind), padding="flax"), x, call, None)
    assert_same(ref, got)


def test_identity_padding_holds_the_last_valid_output_and_ignores_padding():
    x = inputs()
    layer = bppsa.nn.RNN(make_cell("gru"), padding="identity")
    run = nnx.jit(lambda layer, x, lengths: layer(x, seq_lengths=lengths, return_carry=True))  # traced lengths
    carry, ys = run(layer, x, LENGTHS)
    for b, n in enumerate(LENGTHS.tolist()):
        np.testing.assert_array_equal(ys[b, n:], jnp.broadcast_to(ys[b, n - 1], ys[b, n:].shape))
        np.testing.assert_array_equal(carry[b], ys[b, n - 1])
    # the padding's values change nothing, and get no gradient
    noisy = jnp.where(valid_mask(LENGTHS) > 0, x, 100.0)
    np.testing.assert_array_equal(run(layer, noisy, LENGTHS)[1], ys)  # one program; no value reads the padding
    gx = nnx.jit(nnx.grad(lambda layer, x: jnp.sum(run(layer, x, LENGTHS)[1] ** 2), argnums=1))(layer, x)
    assert jnp.all(jnp.where(valid_mask(LENGTHS) > 0, 0.0, gx) == 0) and jnp.any(gx != 0)
    # concrete lengths that all end before T: the scan runs max(lengths) steps, with the same result
    h0 = jnp.zeros((B, H), F64)
    jaxpr = str(jax.make_jaxpr(lambda x: layer(x, seq_lengths=SHORT, initial_carry=h0))(x))
    assert "length=4" in jaxpr and "length=5" not in jaxpr
    traced = nnx.jit(lambda layer, x, lengths: layer(x, seq_lengths=lengths, initial_carry=h0))  # runs T steps
    assert_close(layer(x, seq_lengths=SHORT, initial_carry=h0), traced(layer, x, SHORT))  # two programs


@pytest.mark.parametrize("variant", [slow_unless(["bidirectional", "T1_B1"])(v) for v in VARIANTS])
def test_gru_options_equal_flax(variant):
    check_variant("gru", variant)


def check_variant(kind, variant):
    if variant == "plain":
        compare(single(kind), inputs(), lambda m, x: m(x))
    elif variant == "T1_B1":
        compare(single(kind), inputs((1, 1, I)), lambda m, x: m(x, return_carry=True))
    elif variant == "time_major":
        lengths, mask = LENGTHS, valid_mask(LENGTHS, time_major=True)
        compare(single(kind, time_major=True, return_carry=True), inputs((T, B, I)),
                lambda m, x: m(x, seq_lengths=lengths), mask=mask, outputs_mask=mask)
    elif variant == "bidirectional":
        mask = valid_mask(LENGTHS)

        def build(layer):
            return nnx.Bidirectional(layer(make_cell(kind, seed=0)), layer(make_cell(kind, seed=1)))

        compare(build, inputs(), lambda m, x: m(x, seq_lengths=LENGTHS, return_carry=True), mask=mask,
                outputs_mask=mask)
    elif variant == "stack":
        mask = valid_mask(LENGTHS)

        class Stack(nnx.Module):
            def __init__(self, layer):
                self.first = layer(make_cell(kind, seed=0))
                self.second = layer(make_cell(kind, in_features=H, seed=1))

            def __call__(self, x):
                return self.second(self.first(x, seq_lengths=LENGTHS), seq_lengths=LENGTHS, return_carry=True)

        compare(Stack, inputs(), lambda m, x: m(x), mask=mask, outputs_mask=mask)
    else:
        raise AssertionError(variant)


# --- the full cross product (slow) --------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("kind", [k for k in CELLS if k != "gru"])
def test_every_cell_and_option_equals_flax(kind, variant):
    check_variant(kind, variant)


@pytest.mark.slow
@pytest.mark.parametrize("kind", CELLS)
@pytest.mark.parametrize("lengths", [[1, 1, 1], [2, 5, 4], [5, 5, 5]])
def test_every_cell_every_length_equals_flax(kind, lengths):
    lengths = jnp.array(lengths)
    mask = valid_mask(lengths)
    call = lambda m, x: m(x, seq_lengths=lengths, return_carry=True)
    compare(single(kind), inputs(), call, mask=mask, outputs_mask=mask)
    call = lambda m, x: m(x, seq_lengths=lengths, return_carry=True, reverse=True)
    compare(single(kind), inputs(), call, mask=mask, outputs_mask=mask)  # valid steps come first in scan order


# --- adapters, scans, bppsa cells, errors ---------------------------------------------------------

def test_analytic_adapters_are_chosen_and_fall_back_to_autodiff():
    adapted = {k: flax_cells.adapt(make_cell(k), None, I) for k in ("simple", "gru", "lstm", "optimized_lstm")}
    assert {k: (type(c), type(c.core), c.layout) for k, c in adapted.items()} == {
        "simple": (flax_cells.Flax, cells.RNN, "simple"), "gru": (flax_cells.Flax, cells.GRU, "gru"),
        "lstm": (flax_cells.Flax, cells.LSTM, "lstm"), "optimized_lstm": (flax_cells.Flax, cells.LSTM, "optimized_lstm")}
    # flax's conventions are the bppsa cells' fields: no hidden bias (Simple, GRU), no input bias (LSTM)
    assert not adapted["gru"].core.hidden_bias and adapted["gru"].core.input_bias
    assert adapted["lstm"].core.hidden_bias and not adapted["lstm"].core.input_bias
    carry = make_cell("gru_gelu").initialize_carry((B, I), nnx.Rngs(0))
    assert isinstance(flax_cells.adapt(make_cell("gru_gelu"), carry, I), flax_cells.Autodiff)


@pytest.mark.parametrize("kind", ["simple", "simple_relu_residual", "gru", "lstm", "optimized_lstm"])
def test_flax_cells_are_bppsa_cells_with_flax_conventions(kind):
    """One copy of the maths: the flax cell's step, transposed Jacobian and gradients are the bppsa
    cell's (its conventions as fields) with the parameters mapped, and equal flax's own (float64)."""
    flax_cell = make_cell(kind)
    cell = flax_cells.adapt(flax_cell, None, I)
    params = flax_cells.cell_params(flax_cell)
    core_params = cell.core_params(params)
    assert sorted(core_params) == sorted(cell.core.init(jax.random.key(0), F64))  # the core's own layout
    k = jax.random.split(jax.random.key(3), 3)
    x = jax.random.normal(k[0], (B, I), F64)
    carry = jax.tree.map(lambda a: jax.random.normal(k[1], a.shape, F64),
                         flax_cell.initialize_carry((B, I), nnx.Rngs(0)))
    want, _ = flax_cell(carry, x)  # flax's own step
    got = cell.step(params, carry, x)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_allclose(a, b, rtol=1e-13, atol=1e-14)
    s_prev = cell.flatten_state(carry)[None]
    s = cell.flatten_state(got)[None]
    jac = jax.vmap(jax.jacrev(lambda h, xx: cell.flatten_state(flax_cell(cell.unflatten_state(h[None]),
                                                                         xx[None])[0])[0]))(s_prev[0], x)
    np.testing.assert_allclose(cell.transposed_jacobian(params, s_prev, x[None], s)[0], jac, rtol=1e-12, atol=1e-13)
    gs = jax.random.normal(k[2], s.shape, F64)
    dp, dx = cell.param_grads(params, s_prev, x[None], s, gs)
    graphdef, state = nnx.split(flax_cell)
    flax_step = lambda st, xx: cell.flatten_state(nnx.merge(graphdef, st)(cell.unflatten_state(s_prev[0]), xx)[0])
    _, vjp = jax.vjp(flax_step, state, x)
    want_dp, want_dx = vjp(gs[0])
    np.testing.assert_allclose(dx[0], want_dx, rtol=1e-12, atol=1e-13)
    want_dp = nnx.to_pure_dict(want_dp)
    assert jax.tree.structure(dp) == jax.tree.structure(want_dp)
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(dp), jax.tree.leaves(want_dp)):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-13, err_msg=jax.tree_util.keystr(path))


@pytest.mark.parametrize("kind", ["simple", "gru", "lstm", "optimized_lstm"])
def test_adapter_init_has_the_flax_cells_parameter_structure(kind):
    cell = flax_cells.adapt(make_cell(kind), None, I)
    fresh = cell.init(jax.random.key(0), F64)
    assert jax.tree.map(jnp.shape, fresh) == jax.tree.map(jnp.shape, flax_cells.cell_params(make_cell(kind)))


@pytest.mark.parametrize("opts", [dict(chunk_size=2)] + [
    pytest.param(o, marks=pytest.mark.slow) for o in (dict(autodiff=True), dict(scan="associative"),
                                                      dict(scan="sequential"), dict(backward="bptt"))])
def test_backward_options_give_the_same_gradients(opts):
    x, mask = inputs(), valid_mask(LENGTHS)
    call = lambda m, x: m(x, seq_lengths=LENGTHS, return_carry=True)
    ref = value_and_grads(nnx.RNN(make_cell("lstm")), x, call, mask)
    got = value_and_grads(bppsa.nn.RNN(make_cell("lstm"), **opts), x, call, mask)
    assert_same(ref[1:], got[1:])


def test_auto_backward_asks_the_cost_model_about_the_flax_cell():
    slow_bptt = cost.CostModel({"bptt": [1.0, 0.0, 0.0], "bppsa": [0.0, 0.0, 0.0, 0.0]})
    cell = flax_cells.adapt(make_cell("gru"), None, I)
    assert calibration.choose_backward(cell, 1000, 16, cost_model=slow_bptt) == ("bppsa", "blelloch")
    assert calibration.choose_backward(flax_cells.Masked(cell), 1000, 16, cost_model=slow_bptt) == ("bppsa", "blelloch")
    layer = bppsa.nn.RNN(make_cell("gru"), backward="auto", cost_model=slow_bptt)
    np.testing.assert_allclose(layer(inputs()), nnx.RNN(make_cell("gru"))(inputs()), rtol=1e-12)


def test_float32_simple_cell_computes_in_its_dtype_like_flax():
    cell = lambda: nnx.SimpleCell(I, H, rngs=nnx.Rngs(0))  # dtype float32 by default
    x = inputs().astype(jnp.float32)
    ref, got = nnx.RNN(cell())(x), bppsa.nn.RNN(cell())(x)
    assert got.dtype == ref.dtype == jnp.float32
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("cell", [cells.GRU(I, H), cells.LSTM(I, H)])
def test_bppsa_cells_run_batch_major_and_match_bppsa_rnn(cell):
    x = inputs()
    layer = bppsa.nn.RNN(cell, rngs=nnx.Rngs(0), param_dtype=F64)
    carry, ys = layer(x, return_carry=True)
    params = jax.tree.map(lambda v: v[...], layer.params, is_leaf=lambda v: isinstance(v, nnx.Variable))
    h0 = cell.unflatten_state(jnp.zeros((B, cell.state_size), F64))
    ref = bppsa.rnn(cell, params, jnp.swapaxes(x, 0, 1), h0, backward="bptt")
    np.testing.assert_allclose(ys, jnp.swapaxes(cell.hidden(ref), 0, 1), rtol=1e-12)
    assert_same(carry, jax.tree.map(lambda a: a[-1], ref))


@pytest.mark.parametrize("lengths, match", [
    ([5, 6, 2], r"seq_lengths must lie in \[0, T\] = \[0, 5\].*\[6\]"),
    ([5, -1, 2], r"seq_lengths must lie in \[0, T\].*\[-1\]"),
    ([5, 2], r"seq_lengths must have the inputs' batch shape \(3,\); got shape \(2,\)"),
    ([5.0, 2.0, 1.0], r"seq_lengths must be integers; got dtype float"),
])
def test_bad_seq_lengths_raise_a_clear_value_error(lengths, match):
    layer = bppsa.nn.RNN(make_cell("gru"))
    with pytest.raises(ValueError, match=match) as err:
        layer(inputs(), seq_lengths=jnp.array(lengths))
    assert isinstance(err.value, UsageError)


def test_bad_arguments_raise_usage_errors():
    with pytest.raises(UsageError, match="backward must be one of"):
        bppsa.nn.RNN(make_cell("gru"), backward="fast")
    with pytest.raises(UsageError, match="padding must be one of"):
        bppsa.nn.RNN(make_cell("gru"), padding="zeros")
    with pytest.raises(UsageError, match="needs rngs=nnx.Rngs"):
        bppsa.nn.RNN(cells.GRU(I, H))
    with pytest.raises(UsageError, match=r"inputs must have shape \(\*batch, T, \*features\) with 1 feature"):
        bppsa.nn.RNN(make_cell("gru"))(inputs()[0, 0])
