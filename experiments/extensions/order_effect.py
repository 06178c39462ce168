"""The order effect under bppsa.host's protocol (experiments/history/scan-optimisation.md,
round 4; the task of experiments/extensions/configs/order_effect.py).

Two measurements on the one timed gradient (:mod:`experiments.gradient`) of an RNN(I, H) at T, B,
for plain BPTT (``lax.scan``, unroll 1), tuned BPTT and BPPSA-blelloch, each compiled and run once
first:

1. position in block: ``config.rounds`` rounds of one block of ``config.block`` consecutive calls
   per method, the methods' order rotated each round; the median time by position in the block (the
   first call follows another program).
2. A/A control: the same BPPSA executable timed under two names, interleaved with plain BPTT by
   :func:`bppsa.host.time_interleaved` (``config.aa_repeats`` rounds) for each block size of
   ``config.aa_blocks``; the ratio of the two names' medians (1 without an order effect).

Writes ``<name>``.json (with provenance) and ``<name>``.md.
"""

from __future__ import annotations

import time
from os import PathLike

import jax
import numpy as np

from bppsa import cells
from bppsa.errors import checked_by, require_int, require_ints
from bppsa.host import time_interleaved
from experiments import entry, gradient
from experiments.provenance import provenance, save_json
from experiments.tables import markdown_table

__all__ = ["check", "position_in_block", "aa_control", "markdown", "run"]

#: The timed methods: name -> experiments.gradient's method name.
METHODS = {"bptt_plain": "bptt_unroll1", "bptt_tuned": "bptt", "bppsa": "bppsa_blelloch"}


def position_in_block(fns: dict, rounds: int, block: int) -> dict:
    """``{name: [median ms at position 1 … block]}``: ``rounds`` rounds of one block of ``block``
    consecutive calls per function, the order rotated each round."""
    pos = {k: [[] for _ in range(block)] for k in fns}
    names = list(fns)
    for r in range(rounds):
        for n in names[r % len(names):] + names[:r % len(names)]:
            for i in range(block):
                t0 = time.perf_counter()
                jax.block_until_ready(fns[n]())
                pos[n][i].append(time.perf_counter() - t0)
    return {n: [1e3 * float(np.median(x)) for x in pos[n]] for n in names}


def aa_control(fns: dict, repeats: int, block: int) -> dict:
    """The BPPSA executable under two names (``bppsa_a``, ``bppsa_b``) interleaved with plain BPTT:
    median ms of each name and the ratio a / b."""
    t = time_interleaved({"bppsa_a": fns["bppsa"], "bptt_plain": fns["bptt_plain"], "bppsa_b": fns["bppsa"]},
                         repeats=repeats, block=block)
    return {"block": block, "ms": {k: 1e3 * v["median"] for k, v in t.items()},
            "a_over_b": t["bppsa_a"]["median"] / t["bppsa_b"]["median"]}


def markdown(record: dict) -> str:
    c = record["config"]
    out = ["# The order effect under bppsa.host's protocol", "",
           f"RNN({c['I']}, {c['H']}), T = {c['T']}, B = {c['B']}, float32; the training-step gradient of "
           "`experiments.gradient` (plain BPTT = `lax.scan` unroll 1, tuned BPTT, BPPSA-blelloch), each run once "
           "before the timing.", "",
           f"## Median ms by position in a block of {c['block']} consecutive calls", "",
           f"{c['rounds']} rounds, the methods' order rotated each round; the 1st call of a block follows "
           "another program.", "",
           markdown_table(["method", *(_ordinal(i + 1) for i in range(c["block"]))],
                          [[n, *(f"{v:.2f}" for v in ms)] for n, ms in record["position"].items()],
                          align="l" + "r" * c["block"]), "",
           "## A/A control", "",
           "The same BPPSA executable timed under two names (a, b), interleaved with plain BPTT by "
           f"`bppsa.host.time_interleaved` ({c['aa_repeats']} rounds, the first call of each block dropped); "
           "median ms; a / b = 1 without an order effect.", "",
           markdown_table(["block", "bppsa_a", "bptt_plain", "bppsa_b", "a / b"],
                          [[r["block"], *(f"{r['ms'][k]:.2f}" for k in ("bppsa_a", "bptt_plain", "bppsa_b")),
                            f"{r['a_over_b']:.3f}"] for r in record["aa"]], align="rrrrr"), ""]
    return "\n".join(out)


def _ordinal(n: int) -> str:
    return f"{n}{'st' if n == 1 else 'nd' if n == 2 else 'rd' if n == 3 else 'th'}"


def check(config) -> None:
    """The ranges of :func:`run`'s config (UsageError naming the key)."""
    for key in ("T", "B", "I", "H", "rounds", "block", "aa_repeats"):
        require_int(config, key)
    require_ints(config, "aa_blocks", 2, allow_empty=False)


@checked_by(check)
def run(config, workdir: PathLike) -> dict:
    """Task of ``experiments/extensions/configs/order_effect.py``: both measurements."""
    check(config)
    cell = cells.RNN(int(config.I), int(config.H))
    p, xs, h0, R = gradient.problem(cell, int(config.T), int(config.B))  # the one timed gradient
    g = gradient.gradient_functions(cell, p, xs, h0, R, list(METHODS.values()))
    fns = {name: g[method] for name, method in METHODS.items()}
    for f in fns.values():
        jax.block_until_ready(f())
    position = position_in_block(fns, int(config.rounds), int(config.block))
    print("median ms by position in block (1st = right after another program):")
    for n, ms in position.items():
        print(n, [round(v, 2) for v in ms])
    aa = []
    for block in config.aa_blocks:
        aa.append(aa_control(fns, int(config.aa_repeats), int(block)))
        print(f"A/A block={block}:", {k: round(v, 2) for k, v in aa[-1]["ms"].items()},
              "a/b =", round(aa[-1]["a_over_b"], 3), flush=True)
    record = {"title": "The order effect under bppsa.host's protocol", "config": config.to_dict(),
              "position": position, "aa": aa, "provenance": provenance()}
    save_json(entry(workdir, f"{config.name}.json"), record)
    entry(workdir, f"{config.name}.md").write_text(markdown(record))
    return {"position_ms": position, "a_over_b": {str(r["block"]): r["a_over_b"] for r in aa}}
