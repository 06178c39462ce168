"""bppsa.nn.RNN accepts everything nnx.RNN accepts, with the same meaning: its constructor
arguments, duck-typed cells, cells with non-Param state, mixed precision, any input rank, flax's
padding semantics, seq_lengths with zeros, and errors in flax's vocabulary. Each is compared
against nnx.RNN itself in float64: outputs, final carry, state updates, and gradients w.r.t. the
Params, the inputs and the initial carry."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import bppsa.nn
from bppsa.errors import UsageError
from bppsa.nn import BPTTFallbackWarning

F64 = jnp.float64
I, H, B, T = 3, 4, 2, 5


def normal(shape, seed=1, dtype=F64):
    return jax.random.normal(jax.random.key(seed), shape, dtype)


def loss(out):
    carry, ys = out if isinstance(out, tuple) else (None, out)
    leaves = jax.tree.leaves(ys) + jax.tree.leaves(carry)
    return sum(jnp.sum(jnp.cos(a.astype(F64)) * (1 + k)) for k, a in enumerate(leaves))


def run(model, x, carry=None, **kw):
    """(outputs, loss, grads w.r.t. Params, inputs, initial carry), under nnx.jit."""
    def f(m, x, c):
        return loss(m(x, initial_carry=c, **kw))

    def both(m, x, c):
        out = m(x, initial_carry=c, **kw)
        return out, *nnx.value_and_grad(f, argnums=(0, 1, 2))(m, x, c)

    out, value, (gm, gx, gc) = nnx.jit(both)(model, x, carry)
    return out, value, nnx.to_pure_dict(nnx.state(gm, nnx.Param)), gx, gc


def same(a, b, rtol=1e-11, atol=1e-12):
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for u, v in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        assert jnp.result_type(u) == jnp.result_type(v)
        np.testing.assert_allclose(np.asarray(u, np.float64), np.asarray(v, np.float64), rtol=rtol, atol=atol)


def pair(make_cell, x, carry_of=None, call=None, **rnn_kw):
    """nnx.RNN and bppsa.nn.RNN over identical fresh cells: their run() results."""
    call = call or {}
    results = []
    for layer in (nnx.RNN, bppsa.nn.RNN):
        cell = make_cell()
        carry = carry_of(cell) if carry_of else None
        results.append(run(layer(cell, **rnn_kw), x, carry, **call))
    return results


def key_data(state):
    return jax.tree.map(lambda a: jax.random.key_data(a) if jnp.issubdtype(a.dtype, jax.dtypes.prng_key) else a,
                        nnx.to_pure_dict(state))


def no_fallback():
    return warnings.catch_warnings(action="error", category=BPTTFallbackWarning)


# --- 1. constructor arguments -----------------------------------------------------------------

def test_unroll_state_axes_and_broadcast_rngs_are_taken_with_nnx_meaning():
    make = lambda: nnx.GRUCell(I, H, param_dtype=F64, rngs=nnx.Rngs(0))
    kw = dict(unroll=2, state_axes=nnx.StateAxes({nnx.Param: None, ...: nnx.Carry}), broadcast_rngs="dropout")
    with no_fallback():
        ref, got = pair(make, normal((B, T, I)), **kw)
    same(ref, got)
    layer = bppsa.nn.RNN(make(), unroll=3, backward="bptt")
    assert layer.options.unroll == 3
    assert "unroll=3" in str(jax.make_jaxpr(lambda x: layer(x, initial_carry=jnp.zeros((B, H), F64)))(normal((B, T, I))))
    with pytest.raises(UsageError, match="unroll must be a positive int"):
        bppsa.nn.RNN(make(), unroll=0)


def test_state_scanned_over_time_runs_nnx_rnn_with_a_warning():
    """A Param scanned over the time axis (state_axes int): one kernel per step, as nnx.RNN does."""
    class PerStep(nnx.Module):
        def __init__(self):
            self.w = nnx.Param(normal((T, H, H), 3) * 0.3)
            self.u = nnx.Param(normal((I, H), 4))

        def __call__(self, h, x):
            h = jnp.tanh(x @ self.u[...] + h @ self.w[...])
            return h, h

        def initialize_carry(self, shape, rngs=None):
            return jnp.zeros(shape[:-1] + (H,), F64)

        num_feature_axes = 1

    axes = nnx.StateAxes({nnx.PathContains("w"): 0, ...: nnx.Carry})
    with pytest.warns(BPTTFallbackWarning, match="state_axes scans w over the time axis"):
        ref, got = pair(PerStep, normal((B, T, I)), state_axes=axes)
    same(ref, got)


# --- 2. duck-typed cells ----------------------------------------------------------------------

class Duck(nnx.Module):
    """Not an RNNCellBase: __call__, initialize_carry and num_feature_axes only (flax's test cell)."""

    def __init__(self, rngs):
        self.rngs = rngs  # stored, never read in a step
        self.dense = nnx.Linear(I + H, H, param_dtype=F64, rngs=rngs)

    def __call__(self, carry, x):
        h = jnp.tanh(self.dense(jnp.concatenate([x, carry], axis=-1)))
        return h, 2.0 * h

    def initialize_carry(self, input_shape, rngs=None):
        return jnp.zeros(input_shape[:-1] + (H,), F64)

    @property
    def num_feature_axes(self):
        return 1


def test_duck_typed_cell_storing_rngs_runs_bppsa_and_equals_nnx():
    with no_fallback():
        ref, got = pair(lambda: Duck(nnx.Rngs(7)), normal((B, T, I)), carry_of=lambda c: normal((B, H), 2))
    same(ref, got)


def test_a_module_without_the_cell_methods_is_refused():
    with pytest.raises(UsageError, match="without initialize_carry, num_feature_axes"):
        bppsa.nn.RNN(nnx.Linear(I, H, rngs=nnx.Rngs(0)))


# --- 3. non-Param state -----------------------------------------------------------------------

class DropoutGRU(nnx.GRUCell):
    """Recurrent dropout on the new state, drawn from the 'recurrent_dropout' stream each step."""

    def __init__(self, rngs, **kw):
        super().__init__(I, H, param_dtype=F64, rngs=rngs, **kw)
        self.drop = nnx.Dropout(0.5, rng_collection="recurrent_dropout", rngs=rngs)

    def __call__(self, carry, x):
        h, _ = super().__call__(carry, x)
        h = self.drop(h)
        return h, h


@pytest.mark.parametrize("broadcast", [None, pytest.param("recurrent_dropout", marks=pytest.mark.slow)])
def test_recurrent_dropout_draws_nnx_rnns_masks(broadcast):
    """Same rngs -> the same masks as nnx.RNN (per step, or one per sequence when broadcast)."""
    make = lambda: DropoutGRU(nnx.Rngs(0, recurrent_dropout=5))
    x = normal((B, T, I)) + 3.0  # no output is zero by chance
    with no_fallback():
        ref, got = pair(make, x, broadcast_rngs=broadcast)
    same(ref, got)
    dropped = np.asarray(got[0]) == 0
    assert dropped.any() and not dropped.all()
    if broadcast:  # one mask for the sequence
        assert (dropped == dropped[:, :1]).all()
    else:
        assert not (dropped == dropped[:, :1]).all()
    cells = [make(), make()]
    nnx.RNN(cells[0], broadcast_rngs=broadcast)(x)
    bppsa.nn.RNN(cells[1], broadcast_rngs=broadcast)(x)
    same(*(key_data(nnx.state(c, nnx.RngState)) for c in cells), 0, 0)  # the streams advanced alike


# jax warns (an error to come) when a scatter casts its update to a narrower dtype implicitly
@pytest.mark.filterwarnings("error::FutureWarning")
def test_deterministic_dropout_and_eval_batchnorm_run_bppsa_with_their_state_as_constants():
    class Normed(nnx.Module):
        def __init__(self, rngs):
            self.cell = nnx.SimpleCell(I, H, param_dtype=F64, rngs=rngs)
            self.norm = nnx.BatchNorm(H, use_running_average=True, param_dtype=F64, rngs=rngs)
            # flax keeps batch statistics in float32: cast to it, as jax will require of a scatter
            self.norm.mean[...] = normal((H,), 8).astype(self.norm.mean.dtype)
            self.norm.var[...] = (1.0 + normal((H,), 9) ** 2).astype(self.norm.var.dtype)
            self.drop = nnx.Dropout(0.5, deterministic=True, rngs=rngs)

        def __call__(self, carry, x):
            h, _ = self.cell(carry, x)
            h = self.drop(self.norm(h))
            return h, h

        def initialize_carry(self, shape, rngs=None):
            return jnp.zeros(shape[:-1] + (H,), F64)

        num_feature_axes = 1

    with no_fallback():
        ref, got = pair(lambda: Normed(nnx.Rngs(1)), normal((B, T, I)), carry_of=lambda c: normal((B, H), 3))
    same(ref, got, rtol=1e-5, atol=1e-6)  # flax keeps batch statistics in float32: its rsqrt rounds there


@pytest.mark.slow
def test_training_batchnorm_and_a_counter_run_nnx_rnn_and_update_state_alike():
    class Counting(nnx.Module):
        def __init__(self, rngs):
            self.cell = nnx.GRUCell(I, H, param_dtype=F64, rngs=rngs)
            self.norm = nnx.BatchNorm(H, param_dtype=F64, rngs=rngs)  # training: updates its statistics
            self.steps = nnx.Variable(jnp.zeros((), jnp.int32))

        def __call__(self, carry, x):
            self.steps[...] += 1
            h, _ = self.cell(carry, x)
            return h, self.norm(h)

        def initialize_carry(self, shape, rngs=None):
            return jnp.zeros(shape[:-1] + (H,), F64)

        num_feature_axes = 1

    with pytest.warns(BPTTFallbackWarning, match="each step updates"):
        ref, got = pair(lambda: Counting(nnx.Rngs(2)), normal((B, T, I)))
    same(ref, got)
    a, b = Counting(nnx.Rngs(2)), Counting(nnx.Rngs(2))
    nnx.RNN(a)(normal((B, T, I)))
    bppsa.nn.RNN(b)(normal((B, T, I)))
    assert int(b.steps[...]) == T
    same(key_data(nnx.state(a)), key_data(nnx.state(b)), 0, 0)


def test_a_counter_the_step_reads_runs_bppsa_and_counts_like_nnx():
    """State a step changes on its own (an int counter it also reads) is computed ahead of the
    scan: each step sees nnx.RNN's value, and the cell ends with nnx.RNN's count."""
    class Counter(nnx.Module):
        def __init__(self, rngs):
            self.cell = nnx.SimpleCell(I, H, dtype=F64, param_dtype=F64, rngs=rngs)
            self.steps = nnx.Variable(jnp.array(3, jnp.int32))

        def __call__(self, carry, x):
            self.steps[...] += 2
            h, _ = self.cell(carry, x * self.steps[...])
            return h, h * jnp.sqrt(self.steps[...].astype(F64))

        def initialize_carry(self, shape, rngs=None):
            return jnp.zeros(shape[:-1] + (H,), F64)

        num_feature_axes = 1

    x = normal((B, T, I)) * 0.1
    with no_fallback():
        ref, got = pair(lambda: Counter(nnx.Rngs(2)), x)
    same(ref, got)
    a, b = Counter(nnx.Rngs(2)), Counter(nnx.Rngs(2))
    nnx.RNN(a)(x)
    bppsa.nn.RNN(b)(x)
    assert int(a.steps[...]) == int(b.steps[...]) == 3 + 2 * T


@pytest.mark.slow
def test_gru_with_gelu_and_kept_rngs_runs_bppsa():
    make = lambda: nnx.GRUCell(I, H, activation_fn=jax.nn.gelu, keep_rngs=True, param_dtype=F64, rngs=nnx.Rngs(3))
    with no_fallback():
        ref, got = pair(make, normal((B, T, I)))
    same(ref, got)


# --- 4. mixed precision -----------------------------------------------------------------------

@pytest.mark.parametrize("kind", [nnx.LSTMCell] + [pytest.param(k, marks=pytest.mark.slow)
                                                  for k in (nnx.GRUCell, nnx.OptimizedLSTMCell)])
def test_mixed_precision_promotes_like_flax(kind):
    make = lambda: kind(I, H, dtype=jnp.bfloat16, param_dtype=jnp.float32, rngs=nnx.Rngs(4))
    x = normal((B, T, I), dtype=jnp.float32)
    ref, got = pair(make, x, call=dict(return_carry=True))
    assert jax.tree.map(jnp.result_type, ref[0]) == jax.tree.map(jnp.result_type, got[0])
    assert jnp.result_type(got[0][1]) == jnp.float32  # flax's promotion: float32 outputs and carry
    same(ref[0], got[0], rtol=1e-6, atol=1e-6)
    same(ref[1:], got[1:], rtol=3e-2, atol=1e-2)  # bfloat16 products (eps 7.8e-3) summed in another order


# --- 5. any input rank ------------------------------------------------------------------------

@pytest.mark.parametrize("shape, time_major", [((T, I), False), pytest.param((1, B, T, I), False, marks=pytest.mark.slow),
                                               pytest.param((T, 1, B, I), True, marks=pytest.mark.slow)])
def test_any_batch_rank_equals_nnx(shape, time_major):
    make = lambda: nnx.LSTMCell(I, H, param_dtype=F64, rngs=nnx.Rngs(5))
    batch = shape[1:-1] if time_major else shape[:-2]
    carry = lambda c: (normal(batch + (H,), 6), normal(batch + (H,), 7))
    with no_fallback():
        ref, got = pair(make, normal(shape), carry_of=carry, time_major=time_major, return_carry=True)
    same(ref, got)


# --- 6. and 7. padding and seq_lengths ---------------------------------------------------------

def test_default_padding_is_flaxs_in_a_bidirectional_unmasked_loss():
    def make(layer):
        return lambda: nnx.Bidirectional(layer(nnx.GRUCell(I, H, param_dtype=F64, rngs=nnx.Rngs(1))),
                                         layer(nnx.GRUCell(I, H, param_dtype=F64, rngs=nnx.Rngs(2))))

    lengths = jnp.array([2, 5])
    x = normal((B, T, I))
    ref = run(make(nnx.RNN)(), x, seq_lengths=lengths)
    got = run(make(bppsa.nn.RNN)(), x, seq_lengths=lengths)
    same(ref, got)


@pytest.mark.parametrize("jit_lengths", [pytest.param(False, marks=pytest.mark.slow), True])
def test_seq_lengths_with_zero_give_nnx_carry(jit_lengths):
    make = lambda: nnx.GRUCell(I, H, param_dtype=F64, rngs=nnx.Rngs(1))
    lengths = jnp.array([0, 3])
    x, c0 = normal((B, T, I)), normal((B, H), 2)
    if jit_lengths:  # traced lengths
        call = lambda layer: nnx.jit(lambda m, x, n: m(x, initial_carry=c0, seq_lengths=n, return_carry=True))(
            layer, x, lengths)
    else:
        call = lambda layer: layer(x, initial_carry=c0, seq_lengths=lengths, return_carry=True)
    ref, got = call(nnx.RNN(make())), call(bppsa.nn.RNN(make()))
    same(ref, got)
    grads = pair(make, x, carry_of=lambda c: c0, call=dict(seq_lengths=lengths, return_carry=True))
    same(*grads)
    # identity padding keeps a zero-length row's initial carry
    carry, _ = bppsa.nn.RNN(make(), padding="identity")(x, initial_carry=c0, seq_lengths=lengths, return_carry=True)
    np.testing.assert_array_equal(carry[0], c0[0])


# --- 9. errors in flax's vocabulary -----------------------------------------------------------

def test_initial_carry_errors_speak_flax():
    layer = bppsa.nn.RNN(nnx.LSTMCell(I, H, param_dtype=F64, rngs=nnx.Rngs(0)))
    x = normal((B, T, I))
    with pytest.raises(UsageError, match=r"initial_carry must be LSTMCell's carry \(c, h\), each of shape \(2, 4\) "
                                         r"for inputs of batch shape \(2,\).*initialize_carry\(\(2, 3\)\)"):
        layer(x, initial_carry=jnp.zeros((B, H), F64))
    with pytest.raises(UsageError, match=r"initial_carry must be GRUCell's carry of shape \(2, 4\)"):
        bppsa.nn.RNN(nnx.GRUCell(I, H, rngs=nnx.Rngs(0)))(x, initial_carry=jnp.zeros((T, H)))
    with pytest.raises(UsageError, match=r"inputs must have shape \(T, \*batch, \*features\)"):
        layer(x[0, 0], time_major=True)


# --- 8. forward-mode autodiff -----------------------------------------------------------------

GRU64 = lambda: nnx.GRUCell(I, H, param_dtype=F64, rngs=nnx.Rngs(0))


@pytest.mark.parametrize("backward, make", [
    ("bppsa", GRU64), pytest.param("bppsa", lambda: DropoutGRU(nnx.Rngs(0, recurrent_dropout=3)), marks=pytest.mark.slow),
    pytest.param("bppsa", lambda: Duck(nnx.Rngs(1)), marks=pytest.mark.slow),
    pytest.param("bptt", lambda: DropoutGRU(nnx.Rngs(0, recurrent_dropout=3)), marks=pytest.mark.slow),
    pytest.param("auto", GRU64, marks=pytest.mark.slow)])
def test_jvp_jacfwd_and_hvp_through_nn_rnn_equal_nnx(backward, make):
    """jax.jvp, jax.jacfwd and forward-over-reverse HVPs of bppsa.nn.RNN equal nnx.RNN's (the
    non-Param state is an argument too: nnx refuses a module merged from closed-over state)."""
    x, c0 = normal((B, T, I)) + 1.0, normal((B, H), 2)
    lengths = jnp.array([T, 3])

    def functional(layer):
        graphdef, params, rest = nnx.split(layer(make()), nnx.Param, ...)

        def f(p, rest, x):  # the same rng state every call: the same dropout masks
            return nnx.merge(graphdef, p, rest)(x, initial_carry=c0, seq_lengths=lengths)

        return f, params, rest

    (f_ref, p, rest), (f_got, _, _) = functional(nnx.RNN), functional(lambda c: bppsa.nn.RNN(c, backward=backward))
    no = jax.tree.map(lambda a: np.zeros(a.shape, jax.dtypes.float0), rest)  # ints and keys: no tangent
    tp, tx = jax.tree.map(lambda a: normal(a.shape, 5), p), normal(x.shape, 6)
    same(jax.jvp(f_ref, (p, rest, x), (tp, no, tx)), jax.jvp(f_got, (p, rest, x), (tp, no, tx)))
    if not jax.tree.leaves(rest):  # (jacfwd closes over rest: nnx refuses that for RNG state)
        # nnx.RNN's scan does not run under jacfwd's vmap: its Jacobian column by column, by jvp
        basis = jnp.eye(x.size, dtype=F64).reshape((x.size,) + x.shape)
        zero = jax.tree.map(jnp.zeros_like, p)
        columns = jnp.stack([jax.jvp(f_ref, (p, rest, x), (zero, no, e))[1] for e in basis], axis=-1)
        same(columns.reshape(columns.shape[:-1] + x.shape), jax.jacfwd(f_got, argnums=2)(p, rest, x))
    grad = lambda f: jax.grad(lambda p, r: loss(f(p, r, x)), argnums=(0, 1), allow_int=True)
    hvp = lambda f: jax.jvp(lambda p, r: grad(f)(p, r)[0], (p, rest), (tp, no))
    same(hvp(f_ref), hvp(f_got), rtol=1e-10, atol=1e-11)
