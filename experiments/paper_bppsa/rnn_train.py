"""The paper's vanilla RNN training curve on bitstreams, BPTT vs BPPSA
(``experiments/paper_bppsa/configs/rnn_train.py``).

``rnn_train(config, workdir)`` is the task (``bppsa reproduce rnn-train``); :func:`rnn_train_table`
and :func:`plot_rnn_train` render its record.
"""

from __future__ import annotations

import json
import math
from os import PathLike
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from bppsa import cells
from bppsa.errors import UsageError, checked_by, require_choices, require_int, require_ints, require_number
from bppsa.nn import SequenceClassifier
from bppsa.plan.options import BACKWARDS
from bppsa.scan import SCANS
from bppsa.tasks.bitstream import NUM_CLASSES, make_bitstream
from experiments import entry
from experiments.bench import backward_times
from experiments.provenance import provenance, save_json
from experiments.tables import markdown_table
from experiments.train import evaluate, fit

__all__ = ["rnn_train", "check_rnn_train", "plot_rnn_train", "rnn_train_table"]


def check_rnn_train(config) -> None:
    """The ranges of :func:`rnn_train`'s config (UsageError naming the key): called before anything runs."""
    require_choices(config, "methods", BACKWARDS, many=True)
    if len(set(config.methods)) != len(config.methods):
        raise UsageError(f"config.methods must not repeat a method; got {tuple(config.methods)!r}")
    require_choices(config, "scan", tuple(SCANS))
    require_choices(config, "dtype", ("float32", "float64"))
    for key in ("steps", "length", "num_samples", "eval_samples", "hidden_size", "timing.repeats"):
        require_int(config, key)
    require_int(config, "batch_size", 1, config.num_samples)
    for key in ("eval_every", "checkpoint_every"):
        require_int(config, key, 0)
    require_int(config, "seed", 0, 2 ** 32 - 1)
    if not math.isfinite(require_number(config, "learning_rate")):
        raise UsageError(f"config.learning_rate must be a finite number > 0; got {config.learning_rate!r}")
    require_ints(config, "timing.lengths")
    require_ints(config, "timing.batches")


@checked_by(check_rnn_train)
def rnn_train(config, workdir: PathLike) -> dict:
    """The paper's vanilla RNN training curve on the bitstream task, BPTT vs BPPSA.

    One model per method in ``config.methods``, all from the same initial parameters (seed) and
    the same batches, each trained by the resumable :func:`experiments.train.fit` in
    ``workdir/<method>/``. The loss curves must coincide up to float32 rounding (the backward
    passes compute the same gradient); the backward pass alone is then timed per method.
    Writes ``<name>.json`` (curves, final metrics, timings, provenance), ``<name>.md`` and
    ``<name>.png`` into ``workdir``.
    """
    dtype = {"float32": jnp.float32, "float64": jnp.float64}[config.dtype]
    x, y = make_bitstream(config.num_samples, config.length, seed=config.seed)
    xe, ye = make_bitstream(config.eval_samples, config.length, seed=config.seed + 1)
    x, xe = x.astype(dtype), xe.astype(dtype)
    cell = cells.RNN(input_size=1, hidden_size=config.hidden_size)

    curves, finals = {}, {}
    for method in config.methods:
        model = SequenceClassifier(cell, NUM_CLASSES, backward=method, scan=config.scan,
                                   rngs=nnx.Rngs(config.seed), dtype=dtype)
        curves[method] = fit(model, x, y, steps=config.steps, batch_size=config.batch_size,
                             learning_rate=config.learning_rate, seed=config.seed,
                             workdir=entry(workdir, method), checkpoint_every=config.checkpoint_every,
                             eval_data=(xe, ye), eval_every=config.eval_every,
                             progress=config.progress, desc=f"{config.name} [{method}]",
                             callback=_stop_if_not_finite(method, config))
        finals[method] = evaluate(model, xe, ye)
        leaves = jax.tree.leaves(nnx.state(model, nnx.Param))
        finals[method]["param_abs_sum"] = float(sum(np.abs(np.asarray(l, np.float64)).sum() for l in leaves))

    methods = list(config.methods)
    diff, diverge = None, None  # one method: nothing compared, nothing claimed
    if len(methods) > 1:
        a = curves[methods[0]]
        gaps = [max(abs(r["loss"] - curves[m][i]["loss"]) for m in methods[1:]) for i, r in enumerate(a)]
        diff = float("nan") if any(math.isnan(g) for g in gaps) else max(gaps)
        # float32 rounding differs between the methods; training amplifies it over many steps
        diverge = next((r["step"] for r, g in zip(a, gaps) if g > 1e-3), None)

    params = cell.init(jax.random.key(config.seed), dtype)
    times = []
    for T in config.timing.lengths:
        for B in config.timing.batches:
            t = backward_times(cell, params, T, B, methods=tuple(methods), scan=config.scan,
                               repeats=config.timing.repeats, seed=config.seed, dtype=dtype)
            row = {"T": T, "B": B, **{f"{m}_s": t[m]["median"] for m in methods}}
            if "bptt" in t and "bppsa" in t:
                row["speedup"] = t["bptt"]["median"] / t["bppsa"]["median"]
            times.append(row)

    record = {
        "name": config.name,
        "plot": "experiments.paper_bppsa.rnn_train:plot_rnn_train",
        "config": {k: v for k, v in config.items() if k != "timing"} | {"timing": dict(config.timing)},
        "final": {m: {"train_loss": curves[m][-1]["loss"], **finals[m],
                      "median_step_s": float(np.median([r["step_time"] for r in curves[m] if not r.get("warmup")]
                                                       or [curves[m][-1]["step_time"]])),
                      "train_time_s": curves[m][-1]["time"]} for m in methods},
        "max_loss_diff": diff,
        "diverge_step": diverge,
        "backward_times": times,
        "curves": curves,
        "provenance": provenance(),
    }
    record["config"] = json.loads(json.dumps(record["config"], default=list))
    save_json(entry(workdir, f"{config.name}.json"), record)
    entry(workdir, f"{config.name}.md").write_text(rnn_train_table(record))
    plot_rnn_train(record, entry(workdir, f"{config.name}.png"))
    compared = {"max_loss_diff": diff, "diverge_step": diverge} if len(methods) > 1 else {}
    return {**compared,
            **{f"{m}_eval_accuracy": finals[m]["accuracy"] for m in methods},
            **{f"{m}_train_loss": curves[m][-1]["loss"] for m in methods}}


def _stop_if_not_finite(method: str, config):
    """A :func:`experiments.train.fit` callback: a non-finite loss stops the run with one line (UsageError),
    before that step's checkpoint, so no curve or summary is made of NaN."""
    def check(record: dict) -> None:
        bad = [k for k in ("loss", "eval_loss") if k in record and not math.isfinite(record[k])]
        if bad:
            raise UsageError(f"the {bad[0].replace('_', ' ')} of {method} became {record[bad[0]]} at step "
                             f"{record['step']} (config.learning_rate = {config.learning_rate:g}); nothing to "
                             f"compare: re-run with a smaller --config.learning_rate")
    return check


def rnn_train_table(record: dict) -> str:
    """Markdown tables of an :func:`rnn_train` record: final metrics and backward-pass times."""
    c = record["config"]
    diff = record["max_loss_diff"]
    if diff is None:
        compared = f"One method ({', '.join(m.upper() for m in record['final'])}): nothing to compare."
    else:
        compared = (f"Max |loss difference| between the methods over the run: {diff:.2e}"
                    + ("; the losses are not finite: nothing is claimed to agree." if not math.isfinite(diff) else
                       f"; the curves first differ by more than 1e-3 at step {record['diverge_step']}: "
                       f"{c['dtype']} rounding differences (the two backward passes sum in different orders) are "
                       f"amplified by training." if record.get("diverge_step") else
                       "; they agree to 1e-3 throughout."))
    lines = [f"Vanilla RNN(1, {c['hidden_size']}) on bitstreams, T = {c['length']}, B = {c['batch_size']}, "
             f"{c['steps']} Adam steps (lr {c['learning_rate']}), {c['dtype']}, same initial parameters and "
             f"batches for every method. " + compared, "",
             markdown_table(["method", "final train loss", "eval loss", "eval accuracy", "median step (ms)",
                             "training time (s)"],
                            [[m.upper(), f"{f['train_loss']:.4f}", f"{f['loss']:.4f}", f"{f['accuracy']:.3f}",
                              f"{1e3 * f['median_step_s']:.2f}", f"{f['train_time_s']:.1f}"]
                             for m, f in record["final"].items()], align="lrrrrr")]
    methods = list(record["final"])
    if record["backward_times"]:
        speedup = "speedup" in record["backward_times"][0]
        lines += ["", "The training-step gradient (`experiments.bench.backward_times`: the one timed loss of "
                  "`experiments.gradient`, forward included), median time (ms):", "",
                  markdown_table(["T", "B", *(m.upper() for m in methods), *(["BPTT / BPPSA"] if speedup else [])],
                                 [[r["T"], r["B"], *(f"{1e3 * r[f'{m}_s']:.2f}" for m in methods),
                                   *([f"{r['speedup']:.2f}x"] if speedup else [])] for r in record["backward_times"]],
                                 align="r" * (2 + len(methods) + speedup))]
    return "\n".join(lines) + "\n"


def plot_rnn_train(record: dict, path) -> Path:
    """Loss vs step and vs training time for every method of an :func:`rnn_train` record."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.4))
    for (m, h), style in zip(record["curves"].items(), ("-", "--", ":", "-.")):
        axes[0].plot([r["step"] for r in h], [r["loss"] for r in h], style, label=m.upper())
        axes[1].plot([r["time"] for r in h], [r["loss"] for r in h], style, label=m.upper())
    axes[0].set_xlabel("step")
    axes[1].set_xlabel("training time (s)")
    for ax in axes:
        ax.set_ylabel("training loss")
        ax.legend()
    c = record["config"]
    fig.suptitle(f"Vanilla RNN on bitstreams (T = {c['length']}, B = {c['batch_size']}): BPTT vs BPPSA")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)
