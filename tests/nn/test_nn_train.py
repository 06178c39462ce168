"""The nnx modules, the bitstream data, the training loop and `bppsa reproduce rnn-train`."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from bppsa import cells
from bppsa.tasks.bitstream import class_rates, make_bitstream
from bppsa.nn import RNN, SequenceClassifier
from experiments.train import compare_backward_training
from tests.tolerance import assert_close


def test_bitstream_is_deterministic_balanced_and_has_the_paper_rates():
    x1, y1 = make_bitstream(400, 300, seed=3)
    x2, y2 = make_bitstream(400, 300, seed=3)
    assert x1.shape == (400, 300, 1) and x1.dtype == np.float32 and y1.dtype == np.int32
    np.testing.assert_array_equal(x1, x2)
    np.testing.assert_array_equal(y1, y2)
    assert np.bincount(y1).tolist() == [40] * 10
    rates = np.array([x1[y1 == k].mean() for k in range(10)])
    np.testing.assert_allclose(rates, class_rates(), atol=0.02)
    assert not np.array_equal(make_bitstream(400, 300, seed=4)[0], x1)


@pytest.mark.parametrize("bad, match", [(dict(num_samples=0), "num_samples"), (dict(length=0), "length"),
                                        (dict(num_classes=11), "num_classes")])
def test_bitstream_bad_arguments(bad, match):
    kw = dict(num_samples=10, length=5) | bad
    with pytest.raises(ValueError, match=match):
        make_bitstream(**kw)


@pytest.mark.parametrize("cell", [cells.RNN(1, 5), cells.GRU(1, 5), cells.LSTM(1, 5)])
def test_classifier_shapes_and_backward_choice_agree(cell):
    x = jnp.asarray(make_bitstream(4, 7, seed=0)[0])
    outs = [SequenceClassifier(cell, 10, backward=b, rngs=nnx.Rngs(0))(x) for b in ("bptt", "bppsa")]
    assert outs[0].shape == (4, 10)
    assert_close(outs[0], outs[1])  # float32: two programs, equal to rounding
    with pytest.raises(ValueError, match=r"x must have shape \(B, T, I\)"):
        SequenceClassifier(cell, 10, rngs=nnx.Rngs(0))(x[0])


def test_time_major_layer_gradients_equal_between_methods():
    x = jax.random.normal(jax.random.key(0), (6, 3, 2), jnp.float64)  # (T, B, I)

    def grads(backward):
        layer = RNN(cells.GRU(2, 4), backward=backward, time_major=True, rngs=nnx.Rngs(1), param_dtype=jnp.float64)
        return nnx.grad(lambda m: jnp.sum(m(x) ** 2))(layer)

    a, b = grads("bptt"), grads("bppsa")
    jax.tree.map(lambda u, v: np.testing.assert_allclose(u, v, rtol=1e-10), a, b)


def test_training_curves_of_bptt_and_bppsa_coincide_float32():
    """Same initial parameters, same batches, 20 Adam steps: the same loss curve (float32)."""
    x, y = make_bitstream(96, 40, seed=0)
    cell = cells.RNN(1, 8)
    curves = compare_backward_training(
        lambda b: SequenceClassifier(cell, 10, backward=b, rngs=nnx.Rngs(0)), x, y,
        steps=20, batch_size=16, learning_rate=1e-2, seed=0)
    la = np.array([r["loss"] for r in curves["bptt"]])
    lb = np.array([r["loss"] for r in curves["bppsa"]])
    assert len(la) == len(lb) == 20
    np.testing.assert_allclose(la, lb, rtol=1e-4, atol=1e-5)
    assert la[-5:].mean() < la[:5].mean()  # it learns something


def test_train_step_contract_updates_in_place_with_the_loss_gradient():
    """make_train_step: (loss, accuracy) of the batch before the update; model and optimizer updated in place."""
    import optax

    from experiments.train import cross_entropy, make_train_step

    x, y = (jnp.asarray(a) for a in make_bitstream(16, 6, seed=0))
    model = SequenceClassifier(cells.GRU(1, 4), 10, rngs=nnx.Rngs(0))
    twin = SequenceClassifier(cells.GRU(1, 4), 10, rngs=nnx.Rngs(0))
    before = jax.tree.map(np.array, nnx.state(model, nnx.Param))
    logits = nnx.jit(lambda m: m(x))(model)  # jitted: one compile each, not one per eager op
    grads = nnx.jit(nnx.grad(lambda m: cross_entropy(m(x), y)))(twin)
    opt = nnx.Optimizer(model, optax.sgd(0.5), wrt=nnx.Param)
    loss, acc = make_train_step()(model, opt, x, y)
    assert_close(loss, cross_entropy(logits, y))  # the jitted step's loss and an eager one
    assert float(acc) == float((logits.argmax(-1) == y).mean())
    jax.tree.map(lambda a, b, g: np.testing.assert_allclose(b, a - 0.5 * g, rtol=1e-5, atol=1e-7),
                 before, nnx.state(model, nnx.Param), nnx.state(grads, nnx.Param))
    assert int(opt.step[...]) == 1
    # another loss: a constant one has no gradient, so nothing moves
    state = jax.tree.map(np.array, nnx.state(model, nnx.Param))
    loss, _ = make_train_step(lambda lg, yy: 0.0 * lg.sum())(model, opt, x, y)
    assert float(loss) == 0.0
    jax.tree.map(np.testing.assert_array_equal, state, nnx.state(model, nnx.Param))  # a zero gradient: exactly
