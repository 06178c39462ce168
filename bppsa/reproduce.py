"""``bppsa reproduce rnn-train``: the paper's vanilla RNN on bitstreams, trained with BPTT and BPPSA.

Both runs start from the same parameters and see the same batches; the loss curves must
coincide (up to float32 rounding) and the backward pass is timed for each method.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from . import cells
from .data.bitstream import NUM_CLASSES, make_bitstream
from .nn import SequenceClassifier
from .provenance import provenance, save_json
from .train import backward_times, compare_backward_training

__all__ = ["rnn_training", "main_rnn_train"]


def rnn_training(*, length=1000, num_samples=640, steps=60, batch_size=16, learning_rate=1e-3,
                 hidden_size=20, seed=0, timing_lengths=(1000,), timing_batches=(1, 16), repeats=5,
                 log=print) -> dict:
    """Run the comparison; return a JSON-able record (curves, times, max curve difference)."""
    x, y = make_bitstream(num_samples, length, seed=seed)
    cell = cells.RNN(input_size=1, hidden_size=hidden_size)

    def make_model(backward):
        return SequenceClassifier(cell, NUM_CLASSES, backward=backward, rngs=nnx.Rngs(seed))

    log(f"training RNN(1, {hidden_size}) on bitstreams: T = {length}, N = {num_samples}, "
        f"B = {batch_size}, {steps} Adam steps, lr = {learning_rate}")
    curves = compare_backward_training(make_model, x, y, steps=steps, batch_size=batch_size,
                                       learning_rate=learning_rate, seed=seed)
    diff = max(abs(a["loss"] - b["loss"]) for a, b in zip(curves["bptt"], curves["bppsa"]))
    log(f"{'step':>5} {'loss BPTT':>10} {'loss BPPSA':>11} {'acc BPTT':>9} {'acc BPPSA':>10}")
    every = max(1, steps // 15)
    for a, b in zip(curves["bptt"], curves["bppsa"]):
        if a["step"] % every == 0 or a["step"] == steps:
            log(f"{a['step']:5d} {a['loss']:10.5f} {b['loss']:11.5f} {a['accuracy']:9.3f} {b['accuracy']:10.3f}")
    log(f"max |loss_BPTT - loss_BPPSA| over the run: {diff:.2e}")

    params = cell.init(jax.random.key(seed))
    times = []
    log(f"\nbackward pass (jax.grad incl. forward), median of {repeats}:")
    log(f"{'T':>6} {'B':>4} {'BPTT ms':>9} {'BPPSA ms':>9} {'speedup':>8}")
    for T in timing_lengths:
        for B in timing_batches:
            t = backward_times(cell, params, T, B, repeats=repeats, seed=seed)
            sp = t["bptt"]["median"] / t["bppsa"]["median"]
            times.append({"T": T, "B": B, **{f"{m}_s": v["median"] for m, v in t.items()}, "speedup": sp})
            log(f"{T:6d} {B:4d} {1e3 * t['bptt']['median']:9.2f} {1e3 * t['bppsa']['median']:9.2f} {sp:8.2f}x")
    return {"config": {"length": length, "num_samples": num_samples, "steps": steps,
                       "batch_size": batch_size, "learning_rate": learning_rate,
                       "hidden_size": hidden_size, "seed": seed},
            "curves": curves, "max_loss_diff": diff, "backward_times": times}


def _plot(record, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for m, style in (("bptt", "-"), ("bppsa", "--")):
        h = record["curves"][m]
        ax.plot([r["step"] for r in h], [r["loss"] for r in h], style, label=m.upper())
    ax.set_xlabel("step")
    ax.set_ylabel("training loss")
    ax.set_title("Vanilla RNN on bitstreams: BPTT vs BPPSA")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main_rnn_train(argv=None) -> int:
    p = argparse.ArgumentParser(prog="bppsa reproduce rnn-train", description=__doc__)
    p.add_argument("--quick", action="store_true", help="small sizes: under a minute on 2 CPU cores")
    p.add_argument("--workdir", default="runs/rnn-train", help="where results go (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    if a.quick:
        record = rnn_training(length=200, num_samples=320, steps=40, timing_lengths=(1000,),
                              timing_batches=(1, 16), seed=a.seed)
    else:
        record = rnn_training(length=1000, num_samples=1280, steps=300,
                              timing_lengths=(1000, 10000), timing_batches=(1, 16), seed=a.seed)
    record["provenance"] = provenance()
    out = Path(a.workdir)
    save_json(out / "rnn-train.json", record)
    _plot(record, out / "rnn-train.png")
    print(f"\nwrote {out / 'rnn-train.json'} and {out / 'rnn-train.png'}")
    return 0
