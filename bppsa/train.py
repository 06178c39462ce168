"""One training loop (optax Adam by default) for sequence classifiers, plus backward timing."""

from __future__ import annotations

import time
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

__all__ = ["cross_entropy", "make_train_step", "evaluate", "train_classifier", "time_backward"]


def cross_entropy(logits, labels):
    """Mean softmax cross-entropy: logits (B, C), labels (B,) int."""
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()


def make_train_step():
    """A jitted ``step(model, optimizer, x, y) -> (loss, accuracy)`` that updates in place."""

    @nnx.jit
    def step(model, optimizer, x, y):
        def loss_fn(m):
            logits = m(x)
            return cross_entropy(logits, y), logits

        (loss, logits), grads = nnx.value_and_grad(loss_fn, has_aux=True)(model)
        optimizer.update(model, grads)
        return loss, (logits.argmax(-1) == y).mean()

    return step


@nnx.jit
def _eval_batch(model, x, y):
    logits = model(x)
    return cross_entropy(logits, y) * x.shape[0], (logits.argmax(-1) == y).sum()


def evaluate(model, x, y, batch_size: int = 256) -> dict:
    """Loss and accuracy of ``model`` on (x (N, T, I), y (N,))."""
    if len(x) == 0:
        raise ValueError("evaluate needs at least one sample; got an empty x")
    loss = correct = 0.0
    for i in range(0, len(x), batch_size):
        l, c = _eval_batch(model, jnp.asarray(x[i:i + batch_size]), jnp.asarray(y[i:i + batch_size]))
        loss += float(l)
        correct += float(c)
    return {"loss": loss / len(x), "accuracy": correct / len(x)}


def train_classifier(model, x, y, *, steps: int, batch_size: int, learning_rate: float = 1e-3,
                     seed: int = 0, eval_data=None, eval_every: int = 0, log_every: int = 1,
                     optimizer: optax.GradientTransformation | None = None,
                     callback: Callable[[dict], None] | None = None) -> list[dict]:
    """Train ``model`` on (x (N, T, I), y (N,)) with minibatches drawn from ``seed``.

    Returns the history: one dict per logged step with ``step``, ``loss``, ``accuracy``,
    ``time`` (seconds since start) and, every ``eval_every`` steps, ``eval_loss``/``eval_accuracy``.
    """
    if steps < 0:
        raise ValueError(f"steps must be >= 0; got {steps}")
    if not 1 <= batch_size <= len(x):
        raise ValueError(f"batch_size must be in 1..{len(x)} (the dataset size); got {batch_size}")
    if len(x) != len(y):
        raise ValueError(f"x and y must have the same length; got {len(x)} and {len(y)}")
    tx = optimizer if optimizer is not None else optax.adam(learning_rate)
    opt = nnx.Optimizer(model, tx, wrt=nnx.Param)
    step_fn = make_train_step()
    rng = np.random.default_rng(seed)
    history = []
    start = time.perf_counter()
    for step in range(1, steps + 1):
        idx = rng.choice(len(x), size=batch_size, replace=False)
        loss, acc = step_fn(model, opt, jnp.asarray(x[idx]), jnp.asarray(y[idx]))
        record = None
        if log_every and (step % log_every == 0 or step == steps):
            record = {"step": step, "loss": float(loss), "accuracy": float(acc),
                      "time": time.perf_counter() - start}
        if eval_data is not None and eval_every and (step % eval_every == 0 or step == steps):
            record = record or {"step": step, "loss": float(loss), "accuracy": float(acc),
                                "time": time.perf_counter() - start}
            ev = evaluate(model, *eval_data)
            record.update(eval_loss=ev["loss"], eval_accuracy=ev["accuracy"])
        if record is not None:
            history.append(record)
            if callback is not None:
                callback(record)
    return history


def time_backward(fn, *args, repeats: int = 5, warmup: int = 1) -> dict:
    """Median/min/max wall time (s) of ``fn(*args)`` after ``warmup`` compiled calls."""
    for _ in range(warmup):
        jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t0)
    return {"median": float(np.median(times)), "min": float(np.min(times)), "max": float(np.max(times)),
            "repeats": repeats}


def compare_backward_training(make_model: Callable[[str], nnx.Module], x, y, *, steps: int,
                              batch_size: int, learning_rate: float, seed: int = 0,
                              eval_data=None, eval_every: int = 0,
                              methods=("bptt", "bppsa")) -> dict[str, list[dict]]:
    """Train one model per backward method from the *same* initial parameters and batches.

    ``make_model(backward)`` must build the model deterministically (same rngs for every method).
    Returns {method: history}.
    """
    return {m: train_classifier(make_model(m), x, y, steps=steps, batch_size=batch_size,
                                learning_rate=learning_rate, seed=seed, eval_data=eval_data,
                                eval_every=eval_every)
            for m in methods}


def backward_times(cell, params, T: int, B: int, *, methods=("bptt", "bppsa"), scan: str = "blelloch",
                   repeats: int = 5, seed: int = 0, dtype=jnp.float32) -> dict[str, dict]:
    """Time ``jax.grad`` of a last-step loss w.r.t. params for each backward method (interleaved).

    Includes the forward pass (both methods run the same ``lax.scan`` forward).
    """
    from .backprop import rnn

    k1, k2 = jax.random.split(jax.random.key(seed))
    xs = jax.random.normal(k1, (T, B, cell.input_size), dtype)
    h0 = cell.unflatten_state(jnp.zeros((B, cell.state_size), dtype))
    fns = {}
    for m in methods:
        def loss(p, m=m):
            out = rnn(cell, p, xs, h0, backward=m, scan=scan)
            hs = out[0] if isinstance(out, tuple) else out
            return jnp.sum(hs[-1] ** 2)
        fns[m] = jax.jit(jax.grad(loss))
        jax.block_until_ready(fns[m](params))  # compile
    samples = {m: [] for m in methods}
    for _ in range(repeats):
        for m in methods:  # interleaved so both see the same machine load
            t0 = time.perf_counter()
            jax.block_until_ready(fns[m](params))
            samples[m].append(time.perf_counter() - t0)
    return {m: {"median": float(np.median(s)), "min": float(np.min(s)), "max": float(np.max(s)),
                "repeats": repeats} for m, s in samples.items()}
