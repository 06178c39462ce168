"""The experiment's two tasks: a small CNN (flax.nnx) on scikit-learn's bundled digits, and the
GRU sequence classifier (bppsa.nn, BPPSA backward) on a synthetic sequence task.

Each is a :class:`bppsa.data.task.Task` (numpy train/test arrays, ``init(key) -> params``,
``logits(params, x)``) built by :func:`nnx_task` from an nnx module that maps x (B, ...) to logits
(B, C) and holds only ``nnx.Param`` state.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
from flax import nnx

from ..data.digits import load_digits, train_test_split
from ..data.task import Task

__all__ = ["nnx_task", "DigitsCNN", "digits_task", "sequence_task", "make_task", "task_from_config", "TASK_KEYS"]


def nnx_task(name: str, x_train, y_train, x_test, y_test, make_model: Callable[[nnx.Rngs], nnx.Module],
             description: str = "") -> Task:
    """A :class:`~bppsa.data.task.Task` whose model is ``make_model(rngs)``, an nnx module (x (B, ...) -> (B, C)).

    ``init(key)`` builds the module with ``nnx.Rngs(key)`` and returns its state (the parameter
    pytree); ``logits`` merges that state back into the module's graph and calls it.
    """
    graphdef, _ = nnx.split(make_model(nnx.Rngs(0)))

    def init(key):
        return nnx.split(make_model(nnx.Rngs(key)))[1]

    def logits(params, x):
        return nnx.merge(graphdef, params)(x)

    return Task(name, x_train, y_train, x_test, y_test, init, logits, description=description)


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
    return nnx_task("digits-cnn", x_train[..., None], y_train, x_test[..., None], y_test,
                    lambda rngs: DigitsCNN(10, rngs=rngs),
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
    return nnx_task(f"gru-{data}", *train_test_split(x, y, test_fraction, seed, stratify=True),
                    lambda rngs: SequenceClassifier(cell, num_classes, backward="bppsa", rngs=rngs),
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
