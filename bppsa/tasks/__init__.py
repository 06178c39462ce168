"""The tasks that heterogeneous data parallelism (:mod:`bppsa.hetero`) and elastic synchronization
(:mod:`bppsa.sync`) train, built by name: one registry, one model per task. ::

    from bppsa import tasks
    task = tasks.make_task("digits_cnn")                              # channels=(8, 16)
    task = tasks.make_task("gru", data="bitstream", length=32)        # the paper's bitstreams
    task = tasks.make_task("gru", data="sequences", num_features=12, num_classes=8)
    task = tasks.task_from_spec({"name": "digits_cnn", "channels": [4, 8]})   # the JSON-able form

- ``"digits_cnn"``: a small CNN as pure functions (:func:`cnn_init`, :func:`cnn_logits`: conv 3×3
  → ReLU → conv 3×3 stride 2 → ReLU → linear) on scikit-learn's bundled 8×8 digits
  (:func:`bppsa.tasks.digits.load_digits`, no download); x: (N, 8, 8, 1).
- ``"gru"``: the paper's sequence classifier (:class:`bppsa.nn.SequenceClassifier`: a
  :class:`bppsa.cells.GRU`, gradients by the ``backward`` of :func:`bppsa.rnn`, a linear head on the
  last state) on the Bernoulli bitstreams (:mod:`bppsa.tasks.bitstream`, x: (N, T, 1)) or the
  modulated-template sequences (:mod:`bppsa.tasks.sequences`, x: (N, T, F)).

Each is a :class:`bppsa.tasks.task.Task` (numpy train/test arrays, ``init(key) -> params``,
``logits(params, x) -> (B, C)``), its ``spec`` the ``{"name": ..., **options}`` it was built from.
A spec is what crosses process boundaries (replica processes, Ray actors): every process builds
the same task from it. Tasks are cached per spec within a process, so their jitted functions
compile once.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
from typing import TYPE_CHECKING, Callable, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from bppsa.errors import as_int, as_number
from bppsa.tasks.digits import load_digits, train_test_split
from bppsa.tasks.task import Task

if TYPE_CHECKING:
    from flax import nnx

__all__ = ["TASKS", "check_task", "make_task", "task_from_spec", "nnx_task", "cnn_init", "cnn_logits", "digits_task",
           "gru_task"]


def nnx_task(name: str, x_train, y_train, x_test, y_test, make_model: Callable[[nnx.Rngs], nnx.Module],
             description: str = "", spec: Mapping | None = None) -> Task:
    """A :class:`~bppsa.tasks.task.Task` whose model is ``make_model(rngs)``, an nnx module (x (B, ...) -> (B, C))
    holding only ``nnx.Param`` state.

    ``init(key)`` builds the module with ``nnx.Rngs(key)`` and returns its state (the parameter
    pytree, an ``nnx.State``); ``logits`` merges that state back into the module's graph and calls it.

    Args:
      name: the task's name.
      x_train: (N, ...) training inputs (numpy).
      y_train: (N,) int training labels.
      x_test: (M, ...) test inputs.
      y_test: (M,) int test labels.
      make_model: ``make_model(rngs) -> nnx.Module``, called once here (with ``nnx.Rngs(0)``, for
        the graph) and by every ``init``.
      description: a line describing the task.
      spec: the spec it was built from (None: ``{"name": name}``).

    Returns:
      The :class:`~bppsa.tasks.task.Task`.
    """
    from flax import nnx  # here, not at the top: processes that train only the digits CNN never import flax

    graphdef, _ = nnx.split(make_model(nnx.Rngs(0)))

    def init(key):
        return nnx.split(make_model(nnx.Rngs(key)))[1]

    def logits(params, x):
        return nnx.merge(graphdef, params)(x)

    return Task(name, x_train, y_train, x_test, y_test, init, logits, description=description,
                spec=dict(spec or {"name": name}))


def _positive_int(name, value):
    n = as_int(value)
    if n is None or n < 1:
        raise ValueError(f"{name} must be a positive integer; got {value!r}")
    return n


def cnn_init(key, channels=(8, 16), num_classes: int = 10) -> dict:
    """Parameters of :func:`cnn_logits` (He-normal weights, zero biases, the head's weights halved).

    Args:
      key: a JAX PRNG key.
      channels: (C₁, C₂), the two convolutions' output channels.
      num_classes: C, the classes (the head's outputs).

    Returns:
      A dict of float32 arrays, "conv1" with w (3, 3, 1, C₁) and b (C₁,), "conv2" with
      w (3, 3, C₁, C₂) and b (C₂,), "dense" with w (16·C₂, C) and b (C,).
    """
    k1, k2, k3 = jax.random.split(key, 3)
    c1, c2 = channels

    def he(k, shape, fan_in):
        return (jax.random.normal(k, shape, jnp.float32) * np.sqrt(2.0 / fan_in)).astype(jnp.float32)
    return {"conv1": {"w": he(k1, (3, 3, 1, c1), 9), "b": jnp.zeros((c1,), jnp.float32)},
            "conv2": {"w": he(k2, (3, 3, c1, c2), 9 * c1), "b": jnp.zeros((c2,), jnp.float32)},
            "dense": {"w": he(k3, (4 * 4 * c2, num_classes), 16 * c2) * 0.5,
                      "b": jnp.zeros((num_classes,), jnp.float32)}}


def _conv(x, p, stride):
    y = jax.lax.conv_general_dilated(x, p["w"], (stride, stride), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))
    return jax.nn.relu(y + p["b"])


def cnn_logits(params, x):
    """The digits CNN: conv 3×3 (C₁) → ReLU → conv 3×3 stride 2 (C₂) → ReLU → linear; x (B, 8, 8, 1) → (B, classes).

    Args:
      params: the parameters (:func:`cnn_init`).
      x: (B, 8, 8, 1) images, NHWC.

    Returns:
      (B, C) logits.
    """
    h = _conv(x, params["conv1"], 1)          # (B, 8, 8, C1)
    h = _conv(h, params["conv2"], 2)          # (B, 4, 4, C2)
    return h.reshape(h.shape[0], -1) @ params["dense"]["w"] + params["dense"]["b"]


def digits_task(*, channels=(8, 16), test_fraction: float = 0.25, data_seed: int = 0) -> Task:
    """The digits CNN (:func:`cnn_logits`, channels (C₁, C₂)) on the digits, pixels in [0, 1]; the test
    set is the first ``test_fraction`` of a ``data_seed``-seeded permutation.

    Args:
      channels: (C₁, C₂), two positive ints.
      test_fraction: the test set's share, in [0, 1).
      data_seed: seeds the split.

    Returns:
      The "digits_cnn" :class:`~bppsa.tasks.task.Task`, x (N, 8, 8, 1) float32 and y (N,) int32.

    Raises:
      ValueError: for channels that are not two positive ints, or a test_fraction outside [0, 1).
    """
    channels = tuple(channels)
    if len(channels) != 2:
        raise ValueError(f"channels must be two positive integers (C1, C2); got {channels!r}")
    channels = tuple(_positive_int("channels", c) for c in channels)
    x_train, y_train, x_test, y_test = load_digits(test_fraction=test_fraction, seed=data_seed)
    return Task("digits_cnn", x_train[..., None], y_train, x_test[..., None], y_test,  # x: (N, 8, 8, 1)
                lambda key: cnn_init(key, channels), cnn_logits,
                description=f"CNN (conv {channels[0]}, conv {channels[1]} stride 2, linear) on sklearn digits, 8x8x1")


GRU_DATA = ("bitstream", "sequences")


def gru_task(*, data: str = "bitstream", num_samples: int = 2000, length: int = 32, hidden_size: int = 20,
             num_classes: int = 10, num_features: int | None = None, noise: float | None = None,
             backward: str = "bppsa", test_fraction: float = 0.2, data_seed: int = 0) -> Task:
    """The GRU sequence classifier (hidden ``hidden_size``, ``backward`` of :func:`bppsa.rnn`) on synthetic sequences.

    data = "bitstream": the paper's Bernoulli(0.05 + 0.1 k) bitstreams, x: (N, T, 1) (num_classes
    ≤ 10; num_features and noise do not apply). data = "sequences": the modulated templates of
    :mod:`bppsa.tasks.sequences`, x: (N, T, num_features) (default 12) with Gaussian ``noise``
    (default 1.0). The test set is drawn per class.

    Args:
      data: "bitstream" or "sequences".
      num_samples: N, training and test samples together.
      length: T, the steps of a sequence.
      hidden_size: H, the GRU's hidden size (a positive int).
      num_classes: the classes (1..10 for "bitstream", at least 2 for "sequences").
      num_features: F for "sequences" (None: 12); None or 1 for "bitstream".
      noise: σ of the Gaussian noise for "sequences" (None: 1.0); None for "bitstream".
      backward: the backward of :func:`bppsa.rnn` (:class:`bppsa.Options`' ``backward``).
      test_fraction: the test set's share, in [0, 1).
      data_seed: seeds the data and the split.

    Returns:
      The "gru" :class:`~bppsa.tasks.task.Task`, x (N, T, F) float32 and y (N,) int32; its params
      an ``nnx.State``.

    Raises:
      ValueError: for an unknown data, a hidden_size that is not a positive int, num_features or
      noise given for "bitstream", or bad data sizes or test_fraction.
    """
    from bppsa import cells
    from bppsa.nn import SequenceClassifier

    hidden_size = _positive_int("hidden_size", hidden_size)
    if data == "bitstream":
        if num_features not in (None, 1) or noise is not None:
            raise ValueError(f"num_features and noise do not apply to data='bitstream' (one bit per step, no noise); "
                             f"got num_features={num_features!r}, noise={noise!r}")
        from bppsa.tasks.bitstream import make_bitstream
        x, y = make_bitstream(num_samples, length, seed=data_seed, num_classes=num_classes)
    elif data == "sequences":
        from bppsa.tasks.sequences import make_sequences
        x, y = make_sequences(num_samples, length, 12 if num_features is None else num_features, num_classes,
                              1.0 if noise is None else noise, seed=data_seed)
    else:
        raise ValueError(f"data must be one of {list(GRU_DATA)}; got {data!r}")
    cell = cells.GRU(input_size=x.shape[-1], hidden_size=hidden_size)
    return nnx_task("gru", *train_test_split(x, y, test_fraction, data_seed, stratify=True),
                    lambda rngs: SequenceClassifier(cell, num_classes, backward=backward, rngs=rngs),
                    description=f"GRU({x.shape[-1]}, {hidden_size}) + linear, {backward} backward, on {data} "
                                f"(T = {length}, {num_classes} classes)")


TASKS: dict[str, Callable[..., Task]] = {"digits_cnn": digits_task, "gru": gru_task}
_RENAMED = {"digits-cnn": "'digits_cnn'", "seq_gru": "'gru' with data='sequences'"}  # earlier spellings
_CACHE: dict = {}


def check_task(name: str, **options) -> None:
    """Refuse an unknown task name or option (ValueError listing the known ones) without building the
    task: nothing here starts JAX, so a config check can run before a task sets up its devices.

    Args:
      name: the task's name.
      **options: its builder's keyword arguments.

    Raises:
      ValueError: for a name not in :data:`TASKS` (naming the new name of a renamed task), or an
      option its builder does not take. Option values are not checked.
    """
    if name not in TASKS:
        hint = f" (it is now called {_RENAMED[name]})" if name in _RENAMED else ""
        raise ValueError(f"task name must be one of {sorted(TASKS)}; got {name!r}{hint}")
    accepted = list(inspect.signature(TASKS[name]).parameters)
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        raise ValueError(f"task {name!r} takes the options {accepted}; got unknown option(s) {unknown}")


def make_task(name: str, **options) -> Task:
    """The task ``name`` (one of :data:`TASKS`) built with ``options`` (the keyword arguments of its builder:
    :func:`digits_task`, :func:`gru_task`); cached per (name, options) within the process (numpy and
    JAX scalars count as the Python numbers they equal).

    Args:
      name: the task's name, a key of :data:`TASKS`.
      **options: its builder's keyword arguments.

    Returns:
      The :class:`~bppsa.tasks.task.Task`, its ``spec`` ``{"name": name, **options}`` (as JSON reads it
      back).

    Raises:
      ValueError: for an unknown name or option, listing the known ones (:func:`check_task`), or an
      option value the builder refuses.
    """
    check_task(name, **options)
    spec = {"name": name, **options}
    key = json.dumps(spec, sort_keys=True, default=lambda v: repr(v) if (n := as_number(v)) is None else n)
    if key not in _CACHE:
        _CACHE[key] = dataclasses.replace(TASKS[name](**options), spec=json.loads(key))
    return _CACHE[key]


def task_from_spec(spec: Mapping) -> Task:
    """:func:`make_task` from a spec ``{"name": ..., **options}`` (a mapping, e.g. parsed JSON).

    Args:
      spec: a mapping with "name" (a key of :data:`TASKS`) and that task's options.

    Returns:
      The :class:`~bppsa.tasks.task.Task` (:func:`make_task`'s, cached).

    Raises:
      ValueError: for a spec that is not a mapping with a "name", or an unknown name or option.
    """
    if not isinstance(spec, Mapping) or "name" not in spec:
        raise ValueError(f"a task spec must be a mapping with a 'name' (one of {sorted(TASKS)}) and that task's "
                         f"options; got {spec!r}")
    options = dict(spec)
    return make_task(options.pop("name"), **options)
