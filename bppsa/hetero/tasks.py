"""The experiment's two tasks: a small CNN (flax.nnx) on scikit-learn's bundled digits, and the
GRU sequence classifier (bppsa.nn, BPPSA backward) on a synthetic sequence task.

A task holds numpy train/test arrays and ``make_model(seed) -> nnx.Module``; models map x (B, ...)
to logits (B, C) and hold only ``nnx.Param`` state.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from ..data.digits import load_digits, train_test_split

__all__ = ["Task", "DigitsCNN", "digits_task", "sequence_task", "make_task", "task_from_config", "TASK_KEYS",
           "functional"]


@dataclass
class Task:
    name: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    num_classes: int
    make_model: Callable[[int], nnx.Module]
    description: str = ""


class DigitsCNN(nnx.Module):
    """conv 3×3 (8) → ReLU → conv 3×3 (16) → ReLU → 2×2 avg-pool → linear; x: (B, 8, 8, 1) → (B, 10)."""

    def __init__(self, num_classes: int = 10, *, rngs: nnx.Rngs, dtype=jnp.float32):
        self.conv1 = nnx.Conv(1, 8, (3, 3), rngs=rngs, param_dtype=dtype)
        self.conv2 = nnx.Conv(8, 16, (3, 3), rngs=rngs, param_dtype=dtype)
        self.head = nnx.Linear(4 * 4 * 16, num_classes, rngs=rngs, param_dtype=dtype)

    def __call__(self, x):
        h = jax.nn.relu(self.conv1(x))
        h = jax.nn.relu(self.conv2(h))
        h = nnx.avg_pool(h, (2, 2), strides=(2, 2))
        return self.head(h.reshape(h.shape[0], -1))


def digits_task(test_fraction: float = 0.2, seed: int = 0) -> Task:
    """scikit-learn's bundled 8×8 digits (1797 images, no download), pixels scaled to [0, 1], split per class."""
    x_train, y_train, x_test, y_test = load_digits(test_fraction=test_fraction, seed=seed, stratify=True)
    return Task("digits-cnn", x_train[..., None], y_train, x_test[..., None], y_test, num_classes=10,
                make_model=lambda s: DigitsCNN(10, rngs=nnx.Rngs(s)),
                description="small CNN (2 conv + linear) on sklearn digits, 8x8x1")


def sequence_task(data: str = "bitstream", num_samples: int = 2000, length: int = 32, hidden_size: int = 20,
                  num_classes: int = 10, test_fraction: float = 0.2, seed: int = 0) -> Task:
    """The GRU sequence classifier (hidden ``hidden_size``, BPPSA backward) on synthetic sequences.

    data = "bitstream": the paper's Bernoulli(0.05 + 0.1 k) bitstreams (x: (N, T, 1)). (The
    synthetic IRMAS stand-in of bppsa.data was not available when this was written.)
    """
    from .. import cells
    from ..nn import SequenceClassifier

    if data == "bitstream":
        from ..data.bitstream import make_bitstream
        x, y = make_bitstream(num_samples, length, seed=seed, num_classes=num_classes)
    else:
        raise ValueError(f"data must be 'bitstream'; got {data!r}")
    cell = cells.GRU(input_size=x.shape[-1], hidden_size=hidden_size)
    return Task(f"gru-{data}", *train_test_split(x, y, test_fraction, seed, stratify=True), num_classes=num_classes,
                make_model=lambda s: SequenceClassifier(cell, num_classes, backward="bppsa", rngs=nnx.Rngs(s)),
                description=f"GRU({x.shape[-1]}, {hidden_size}) + linear, BPPSA backward, on {data} "
                            f"(T = {length}, {num_classes} classes)")


def make_task(name: str, **kwargs) -> Task:
    """``"digits-cnn"`` or ``"gru"`` (kwargs go to :func:`sequence_task`)."""
    if name == "digits-cnn":
        return digits_task(**kwargs)
    if name == "gru":
        return sequence_task(**kwargs)
    raise ValueError(f"task must be 'digits-cnn' or 'gru'; got {name!r}")


TASK_KEYS = ("data", "num_samples", "length", "hidden_size", "num_classes")


def task_from_config(name: str, config) -> Task:
    """:func:`make_task` from one entry of an experiment's ``tasks`` config (a mapping).

    Only the data/model keys (:data:`TASK_KEYS`) are used; the training keys beside them
    (batch_size, epochs, learning_rate) are the caller's.
    """
    return make_task(name, **{k: config[k] for k in TASK_KEYS if k in config})


_FUNCTIONAL: dict = {}


def functional(model: nnx.Module):
    """Split an nnx model into (params, loss_fn, predict_fn) over a parameter pytree.

    loss_fn(params, x, y) -> per-sample cross-entropy (B,); predict_fn(params, x) -> logits.
    Models with the same structure share the same two functions (so jitted code is reused).
    """
    graphdef, params = nnx.split(model)
    if graphdef in _FUNCTIONAL:
        return params, *_FUNCTIONAL[graphdef]

    def predict(p, x):
        return nnx.merge(graphdef, p)(x)

    def loss_fn(p, x, y):
        return optax.softmax_cross_entropy_with_integer_labels(predict(p, x), y)

    _FUNCTIONAL[graphdef] = (loss_fn, predict)
    return params, loss_fn, predict
