"""The small models the synchronization experiments train, as pure JAX functions over pytrees.

A task (:class:`bppsa.data.task.Task`: data, ``init`` and ``logits``) is built by name from a plain
dict; both runtimes (the simulator and Ray) do so, so only that dict crosses process boundaries.

- ``"digits_cnn"``: a small CNN on scikit-learn's bundled 8×8 digits (``load_digits``, no download):
  conv 3×3 (C₁) → ReLU → conv 3×3 stride 2 (C₂) → ReLU → dense(10). x: (N, 8, 8, 1).
- ``"seq_gru"``: a GRU (:class:`bppsa.cells.GRU`, gradients by :func:`bppsa.rnn` with the BPPSA
  backward) + a linear head on the last state, on a synthetic sequence task (below). x: (N, T, F).

The synthetic sequence task (a stand-in with IRMAS's layout: K classes, F features per frame, T
frames): class k has a random spectral template m_k (F,) and a modulation frequency ω_k; a sample
is x_t = a·m_k·(1 + 0.5·sin(ω_k t + φ)) + σ·ε_t with random phase φ, gain a and Gaussian noise, so
the class must be inferred by integrating the noisy frames over time.
"""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np

from .. import cells
from ..backprop import rnn
from ..data.digits import load_digits, train_test_split
from ..data.task import Task

__all__ = ["make_task", "make_sequence_task", "TASKS"]


# -- digits CNN
def _cnn_init(key, channels=(8, 16), num_classes=10):
    k1, k2, k3 = jax.random.split(key, 3)
    c1, c2 = channels

    def he(k, shape, fan_in):
        return (jax.random.normal(k, shape, jnp.float32) * np.sqrt(2.0 / fan_in)).astype(jnp.float32)
    return {"conv1": {"w": he(k1, (3, 3, 1, c1), 9), "b": jnp.zeros((c1,), jnp.float32)},
            "conv2": {"w": he(k2, (3, 3, c1, c2), 9 * c1), "b": jnp.zeros((c2,), jnp.float32)},
            "dense": {"w": he(k3, (4 * 4 * c2, num_classes), 16 * c2) * 0.5,
                      "b": jnp.zeros((num_classes,), jnp.float32)}}


def _conv(x, p, stride):
    y = jax.lax.conv_general_dilated(x, p["w"], (stride, stride), "SAME",
                                     dimension_numbers=("NHWC", "HWIO", "NHWC"))
    return jax.nn.relu(y + p["b"])


def _cnn_logits(params, x):
    h = _conv(x, params["conv1"], 1)          # (N, 8, 8, C1)
    h = _conv(h, params["conv2"], 2)          # (N, 4, 4, C2)
    h = h.reshape(h.shape[0], -1)
    return h @ params["dense"]["w"] + params["dense"]["b"]


def _digits_task(spec):
    x_train, y_train, x_test, y_test = load_digits(test_fraction=spec.get("test_fraction", 0.25),
                                                   seed=spec.get("data_seed", 0))
    channels = tuple(spec.get("channels", (8, 16)))
    return Task("digits_cnn", x_train[..., None], y_train, x_test[..., None], y_test,  # x: (N, 8, 8, 1)
                lambda key: _cnn_init(key, channels), _cnn_logits, spec=dict(spec))


# -- GRU on a synthetic sequence task
def make_sequence_task(num_samples: int, length: int, num_features: int = 12, num_classes: int = 8,
                       noise: float = 1.0, seed: int = 0):
    """x (N, T, F) float32, y (N,) int32: the synthetic sequence task described in the module docstring."""
    for name, v, lo in (("num_samples", num_samples, 1), ("length", length, 1),
                        ("num_features", num_features, 1), ("num_classes", num_classes, 2)):
        if int(v) < lo:
            raise ValueError(f"{name} must be >= {lo}; got {v}")
    rng = np.random.default_rng(seed)
    templates = rng.normal(size=(num_classes, num_features))
    templates /= np.linalg.norm(templates, axis=1, keepdims=True) / np.sqrt(num_features)
    omega = rng.uniform(0.2, 1.2, size=num_classes)
    y = np.arange(num_samples) % num_classes
    rng.shuffle(y)
    t = np.arange(length)
    phase = rng.uniform(0, 2 * np.pi, size=(num_samples, 1))
    gain = rng.uniform(0.3, 0.7, size=(num_samples, 1, 1))
    mod = 1.0 + 0.5 * np.sin(omega[y][:, None] * t[None, :] + phase)  # (N, T)
    x = gain * templates[y][:, None, :] * mod[..., None] + noise * rng.normal(size=(num_samples, length, num_features))
    return x.astype(np.float32), y.astype(np.int32)


def _gru_parts(spec):
    cell = cells.GRU(input_size=spec.get("num_features", 12), hidden_size=spec.get("hidden_size", 20))
    num_classes = spec.get("num_classes", 8)
    backward = spec.get("backward", "bppsa")

    def init(key):
        k1, k2 = jax.random.split(key)
        H = cell.hidden_size
        return {"cell": cell.init(k1, jnp.float32),
                "head": {"w": (jax.random.normal(k2, (H, num_classes), jnp.float32) / np.sqrt(H)).astype(jnp.float32),
                         "b": jnp.zeros((num_classes,), jnp.float32)}}

    def logits(params, x):
        xs = jnp.swapaxes(x, 0, 1)  # (T, B, F)
        h0 = jnp.zeros((x.shape[0], cell.hidden_size), x.dtype)
        hs = rnn(cell, params["cell"], xs, h0, backward=backward)
        return hs[-1] @ params["head"]["w"] + params["head"]["b"]

    return init, logits


def _seq_task(spec):
    x, y = make_sequence_task(spec.get("num_samples", 2000), spec.get("length", 32),
                              spec.get("num_features", 12), spec.get("num_classes", 8),
                              spec.get("noise", 1.0), spec.get("data_seed", 0))
    xtr, ytr, xte, yte = train_test_split(x, y, spec.get("test_fraction", 0.25), spec.get("data_seed", 0))
    init, logits = _gru_parts(spec)
    return Task("seq_gru", xtr, ytr, xte, yte, init, logits, spec=dict(spec))


TASKS = {"digits_cnn": _digits_task, "seq_gru": _seq_task}


_TASK_CACHE: dict = {}


def make_task(spec) -> Task:
    """Build a task from a dict ``{"name": "digits_cnn" | "seq_gru", ...options}``.

    Tasks are cached per spec within a process, so their jitted functions compile once.
    """
    spec = dict(spec)
    name = spec.get("name")
    if name not in TASKS:
        raise ValueError(f"task name must be one of {sorted(TASKS)}; got {name!r}")
    key = json.dumps(spec, sort_keys=True, default=list)
    if key not in _TASK_CACHE:
        _TASK_CACHE[key] = TASKS[name](spec)
    return _TASK_CACHE[key]
