"""What a library user gets: ``backward="auto"`` against the methods it chooses between, timed in a
plain script as a training loop runs it.

    .venv/bin/python experiments/scripts/user_script.py [--out experiments/results/cpu/user-script]
    bppsa run experiments/extensions/configs/user_script.py   # the same, run by the runner in a subprocess

Nothing here but ``import bppsa`` and the public API: no ``bppsa.host`` call, no benchmark
harness set-up, so the process is in the state a user's script is in (the first ``bppsa.rnn``
call applies bppsa's CPU defaults, as it would for them). Each method is one jitted SGD training
step (the gradient of the one timed loss, :mod:`experiments.gradient`), run ``--steps`` times in a row
per sample, as a training loop runs; the methods are interleaved by
:func:`bppsa.host.time_interleaved` (rotated blocks, medians). Shapes: the vanilla RNN of the
paper's sweeps (input 1, hidden 20) at T = 10 000, B = 1 and T = 1000, B in {2, 16}. Reports each
method's ms per step and ``auto``'s ratio to the fastest of tuned BPTT (``bptt``),
``lax.scan(unroll=16)`` (``bptt_unroll16``) and BPPSA-blelloch (the target: within 1.1x).
About 2 minutes on a 2-core CPU.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import jax
import jax.numpy as jnp

import bppsa
from bppsa import cells, host
from bppsa.host import time_interleaved
from experiments import gradient
from experiments.provenance import provenance
from experiments.tables import markdown_table

SHAPES = ((10_000, 1), (1000, 2), (1000, 16))
METHODS = ("auto", "bptt", "bptt_unroll16", "bppsa_blelloch", "bppsa_sequential")  # experiments.gradient's names
CANDIDATES = ("bptt", "bptt_unroll16", "bppsa_blelloch")  # the fastest of these is auto's target


def train_loop(method, cell, params, xs, h0, R, steps: int, lr: float = 1e-3):
    """A zero-argument callable running ``steps`` SGD steps from ``params``; returns the params.
    The step is what a user writes: ``jax.jit`` of an update with ``jax.grad`` of the one timed
    loss (:func:`experiments.gradient.loss`) of ``bppsa.rnn``'s output (or of a plain ``lax.scan``)."""
    forward = gradient.forward_fn(cell, method)

    @jax.jit
    def step(p):
        g = jax.grad(lambda q: gradient.loss(cell, forward(q, xs, h0), R))(p)
        return jax.tree.map(lambda a, b: a - lr * b, p, g)

    def loop():
        p = params
        for _ in range(steps):
            p = step(p)
        return p

    return loop


def measure(T: int, B: int, *, steps: int, repeats: int) -> dict:
    cell = cells.RNN(1, 20)
    params, xs, h0, R = gradient.problem(cell, T, B)
    fns = {m: train_loop(m, cell, params, xs, h0, R, steps) for m in METHODS}
    res = time_interleaved(fns, repeats=repeats, warmup=1, block=3)
    ms = {m: 1e3 * res[m]["median"] / steps for m in METHODS}
    fastest = min(CANDIDATES, key=ms.get)
    choice = bppsa.choose_backward(cell, T, B, jnp.float32)
    return {"T": T, "B": B, "allocator_tuned": host.allocator_tuned(), "ms_per_step": ms, "fastest": fastest, "auto_choice": list(choice),
            "auto_vs_fastest": ms["auto"] / ms[fastest], "samples": res}


def parse_shapes(text: str) -> tuple:
    """``"10000x1,1000x2"`` -> ((10000, 1), (1000, 2))."""
    try:
        shapes = tuple(tuple(int(v) for v in item.split("x")) for item in text.split(","))
    except ValueError:
        shapes = ()
    if not shapes or any(len(s) != 2 or min(s) < 1 for s in shapes):
        raise argparse.ArgumentTypeError(f"expected TxB,TxB,... with positive ints; got {text!r}")
    return shapes


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="experiments/results/cpu/user-script", help="path stem of the .json/.md written")
    ap.add_argument("--steps", type=int, default=10, help="training steps per timed sample")
    ap.add_argument("--repeats", type=int, default=5, help="timed rounds")
    ap.add_argument("--note", default="", help="a line written under the table (e.g. how loaded the machine was)")
    ap.add_argument("--shapes", type=parse_shapes, default=SHAPES,
                    help="the (T, B) points as TxB,TxB,... (default: " + ",".join(f"{T}x{B}" for T, B in SHAPES) + ")")
    ap.add_argument("--command", default=None,
                    help="the command recorded in the provenance (default: this script's own command line; "
                         "`bppsa run experiments/extensions/configs/user_script.py` passes its own)")
    args = ap.parse_args(argv)
    rows = [measure(T, B, steps=args.steps, repeats=args.repeats) for T, B in args.shapes]
    table = markdown_table(
        ["T", "B"] + [f"{m} ms" for m in METHODS] + ["auto picked", "auto / fastest"],
        [[r["T"], r["B"]] + [f"{r['ms_per_step'][m]:.2f}" for m in METHODS]
         + [":".join(x for x in r["auto_choice"] if x), f"{r['auto_vs_fastest']:.2f}x ({r['fastest']})"] for r in rows])
    prov = provenance(command=args.command or " ".join([Path(sys.argv[0]).name]
                                                       + (argv if argv is not None else sys.argv[1:])))
    print(table)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps({"provenance": prov, "rows": rows}, indent=1))
    out.with_suffix(".md").write_text(
        "# What a plain user script gets: `backward=\"auto\"` vs the fastest method\n\n"
        f"RNN(1, 20), float32, one jitted SGD step per call, {args.steps} steps per sample, "
        f"{args.repeats} interleaved rounds (median ms per step). Process state as in a user's script: "
        "`import bppsa` and the public API only; glibc allocator tuned by the first `bppsa.rnn` call: "
        f"{'yes' if host.allocator_tuned() else 'no (BPPSA_MALLOC_TUNING=0)'}.\n\n" + table + "\n\n"
        + (args.note + "\n\n" if args.note else "")
        + f"Provenance: {prov.get('cpu')} ({prov.get('backend')}, {prov.get('cpu_count')} cores), jax {prov.get('jax')}, "
          f"{prov.get('date')}, `{prov.get('command')}`\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
