"""A classification task: a train/test split and a model as pure functions over a parameter pytree.

The contract the heterogeneous data-parallel trainer (:mod:`bppsa.hetero`) and the parameter-server
runtimes (:mod:`bppsa.sync`) share; the tasks they train are built by name in :mod:`bppsa.tasks`. ::

    task = Task("name", x_train, y_train, x_test, y_test, init, logits)
    params = task.init(jax.random.key(0))             # a pytree
    task.logits(params, x)                            # x (B, ...) -> (B, C)
    task.per_sample_loss(params, x, y)                # (B,) cross-entropy
    task.loss(params, x, y)                           # their mean
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax

__all__ = ["Task"]


@dataclasses.dataclass(frozen=True, eq=False)
class Task:
    """Data (numpy: x (N, ...), y (N,) int) and a model: ``init(key) -> params``, ``logits(params, x) -> (B, C)``.

    ``per_sample_loss`` and ``loss`` (softmax cross-entropy of the logits, per sample and its mean)
    are fixed functions of the task, so jitted code built from them is built once per task.
    ``spec`` is the dict the task was built from (when it was built from one).

    Attributes:
      name: the task's name.
      x_train: (N, ...) training inputs (numpy).
      y_train: (N,) int training labels.
      x_test: (M, ...) test inputs.
      y_test: (M,) int test labels.
      init: ``init(key) -> params``, a fresh parameter pytree from a JAX PRNG key.
      logits: ``logits(params, x) -> (B, C)`` for x (B, ...).
      description: a line describing the task.
      spec: the dict the task was built from (empty when it was not).
      per_sample_loss: ``per_sample_loss(params, x, y) -> (B,)``, the softmax cross-entropy of the
        logits against the int labels y (B,) (set on construction).
      loss: ``loss(params, x, y)``, their mean, a scalar (set on construction).

    Raises:
      ValueError: when x and y of the training or the test set differ in length.
    """
    name: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    init: Callable
    logits: Callable
    description: str = ""
    spec: dict = dataclasses.field(default_factory=dict)
    per_sample_loss: Callable = dataclasses.field(init=False, repr=False)
    loss: Callable = dataclasses.field(init=False, repr=False)
    _cache: dict = dataclasses.field(init=False, repr=False)

    def __post_init__(self):
        if len(self.x_train) != len(self.y_train) or len(self.x_test) != len(self.y_test):
            raise ValueError(f"x and y must have the same length; got train {len(self.x_train)}, {len(self.y_train)} "
                             f"and test {len(self.x_test)}, {len(self.y_test)}")
        logits = self.logits

        def per_sample_loss(params, x, y):
            return optax.softmax_cross_entropy_with_integer_labels(logits(params, x), y)

        def loss(params, x, y):
            return per_sample_loss(params, x, y).mean()

        object.__setattr__(self, "per_sample_loss", per_sample_loss)
        object.__setattr__(self, "loss", loss)
        object.__setattr__(self, "_cache", {})

    def grad_fn(self):
        """jitted ``(params, x, y) -> (mean loss, grads)`` (one per task, so it compiles once)."""
        if "grad" not in self._cache:
            self._cache["grad"] = jax.jit(jax.value_and_grad(self.loss))
        return self._cache["grad"]

    def accuracy_fn(self):
        """jitted ``params -> (test loss, test accuracy)`` (one per task)."""
        if "acc" not in self._cache:
            x, y = jnp.asarray(self.x_test), jnp.asarray(self.y_test)

            @jax.jit
            def acc(params):
                lg = self.logits(params, x)
                return (optax.softmax_cross_entropy_with_integer_labels(lg, y).mean(),
                        (lg.argmax(-1) == y).mean())
            self._cache["acc"] = acc
        return self._cache["acc"]

    def server_step(self, optimizer):
        """jitted ``(params, opt_state, grads) -> (params, opt_state)`` for ``optimizer`` (cached per optimizer)."""
        key = ("step", optimizer)
        if key not in self._cache:
            @jax.jit
            def step(params, opt_state, grads):
                updates, opt_state = optimizer.update(grads, opt_state, params)
                return optax.apply_updates(params, updates), opt_state
            self._cache[key] = step
        return self._cache[key]
