"""``nnx.RNN`` vs ``bppsa.nn.RNN`` training-step times in a flax model (the task of
experiments/extensions/configs/flax_rnn.py).

The model is the one a flax user writes: a recurrent layer over a flax cell (``nnx.SimpleCell``
for the paper's vanilla RNN, ``nnx.GRUCell`` for its IRMAS GRU) and a linear head on the final
carry; only the layer's class differs. One training step = forward + backward + Adam update, one
``nnx.jit``; the steps of all layers are timed by :mod:`bppsa.host`
(interleaved, rotated, medians). Writes ``<name>``.json (with provenance) and ``<name>``.md.
"""

from __future__ import annotations

import functools

import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from bppsa.host import time_interleaved
from bppsa.nn import RNN
from experiments import entry
from experiments.provenance import provenance, save_json
from experiments.tables import markdown_table
from experiments.train import make_train_step

__all__ = ["LAYERS", "CELLS", "make_step", "step_times"]

#: The layers compared: name -> constructor of the recurrent layer from a flax cell.
LAYERS = {
    "nnx.RNN": nnx.RNN,
    "bppsa.nn.RNN bptt": functools.partial(RNN, backward="bptt"),
    "bppsa.nn.RNN bppsa": functools.partial(RNN, backward="bppsa"),
}
CELLS = {"simple": nnx.SimpleCell, "gru": nnx.GRUCell, "lstm": nnx.OptimizedLSTMCell}


class _Classifier(nnx.Module):
    def __init__(self, layer, cell, hidden_size, num_classes, *, rngs):
        self.rnn = layer(cell)
        self.head = nnx.Linear(hidden_size, num_classes, rngs=rngs)

    def __call__(self, x):
        carry, _ = self.rnn(x, return_carry=True)
        return self.head(carry[1] if isinstance(carry, tuple) else carry)


def make_step(layer, kind, input_size, hidden_size, num_classes, seed=0, learning_rate=1e-3):
    """A training step ``step(x, y) -> (loss, accuracy)`` (x (B, T, I) float32, y (B,) ints) of a
    fresh classifier with ``layer``: the one training step of :func:`experiments.train.make_train_step`
    (``nnx.jit`` of value_and_grad of the cross-entropy + Adam), the model and optimizer bound by
    ``nnx.cached_partial`` (no graph traversal per call)."""
    rngs = nnx.Rngs(seed)
    model = _Classifier(layer, CELLS[kind](input_size, hidden_size, rngs=rngs), hidden_size, num_classes, rngs=rngs)
    optimizer = nnx.Optimizer(model, optax.adam(learning_rate), wrt=nnx.Param)
    return nnx.cached_partial(make_train_step(), model, optimizer)


def step_times(config, workdir) -> dict:
    """Median training-step time of each layer in :data:`LAYERS` at each of ``config.shapes``
    ((kind, I, H, T, B, classes) rows), and the largest loss difference over ``config.check_steps``
    steps from the same start (the layers compute the same training run)."""
    rows = []
    for kind, I, H, T, B, classes in config.shapes:
        if kind not in CELLS:
            raise ValueError(f"config.shapes: cell kind must be one of {sorted(CELLS)}; got {kind!r}")
        rng = np.random.default_rng(config.seed)
        x = jnp.asarray(rng.standard_normal((B, T, I)), jnp.float32)
        y = jnp.asarray(rng.integers(0, classes, B), jnp.int32)
        runs, losses = {}, {}
        for name, layer in LAYERS.items():
            step = make_step(layer, kind, I, H, classes, config.seed)
            losses[name] = [float(step(x, y)[0]) for _ in range(config.check_steps)]
            runs[name] = functools.partial(step, x, y)
        times = time_interleaved(runs, repeats=config.repeats)
        ref = np.asarray(losses["nnx.RNN"])
        gap = max(float(np.max(np.abs(np.asarray(c) - ref))) for c in losses.values())
        row = {"cell": kind, "I": I, "H": H, "T": T, "B": B, "classes": classes, "times": times, "max_loss_diff": gap}
        rows.append(row)
        print(_table([row]).splitlines()[-1], flush=True)
    record = {"title": "nnx.RNN vs bppsa.nn.RNN: training-step times in a flax classifier",
              "config": config.to_dict(), "rows": rows, "provenance": provenance()}
    save_json(entry(workdir, f"{config.name}.json"), record)
    entry(workdir, f"{config.name}.md").write_text(markdown(record))
    return {f"{r['cell']} T={r['T']} B={r['B']}": {n: t["median"] for n, t in r["times"].items()} for r in rows}


_COLUMNS = ["cell", "I", "H", "T", "B", *(f"{n} ms" for n in LAYERS), "nnx.RNN / bppsa", "max loss diff"]


def _row_cells(r) -> list:
    ms = [f"{1e3 * r['times'][n]['median']:.1f} [{1e3 * r['times'][n]['min']:.1f}]" for n in LAYERS]
    ratio = r["times"]["nnx.RNN"]["median"] / r["times"]["bppsa.nn.RNN bppsa"]["median"]
    return [r["cell"], r["I"], r["H"], r["T"], r["B"], *ms, f"{ratio:.2f}x", f"{r['max_loss_diff']:.1e}"]


def _table(rows) -> str:
    return markdown_table(_COLUMNS, [_row_cells(r) for r in rows], align="l" + "r" * (len(_COLUMNS) - 1))


def markdown(record) -> str:
    p = record["provenance"]
    return "\n".join([
        f"# {record['title']}", "",
        f"`{p['command']}` — {p['date']}, {p['backend']} / {p['device_kind']} / {p['cpu']} "
        f"({p['cpu_count']} cores), jax {p['jax']}, flax {p['flax']}", "",
        "One training step (forward + backward + Adam, one `nnx.jit`) of a flax classifier: the recurrent "
        "layer over the flax cell, a linear head on the final carry, float32. Median [min] ms over "
        "interleaved, rotated blocks (`bppsa.host`); nnx.RNN / bppsa > 1: BPPSA faster. Max loss diff: "
        "the largest difference of the training losses over the first steps from the same start.", "",
        _table(record["rows"]), ""])
