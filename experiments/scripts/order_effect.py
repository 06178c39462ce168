"""The order effect under bppsa.host's protocol (experiments/results/cpu/scan-optimisation.md,
round 4): median time by position in a block of consecutive calls (the first follows another
program), and an A/A control (one executable timed under two names, interleaved with BPTT).

    python experiments/scripts/order_effect.py      # about a minute on 2 CPU cores; prints the tables
"""
import time

import jax
import numpy as np

from bppsa import cells
from bppsa.host import time_interleaved
from experiments import gradient

cell = cells.RNN(1, 20); T, B = 10000, 1
p, xs, h0, R = gradient.problem(cell, T, B)  # the one timed gradient (experiments.gradient)
g = gradient.gradient_functions(cell, p, xs, h0, R, ["bptt_unroll1", "bptt", "bppsa_blelloch"])
fns = {"bptt_plain": g["bptt_unroll1"], "bptt_tuned": g["bptt"], "bppsa": g["bppsa_blelloch"]}
for f in fns.values(): jax.block_until_ready(f())
# 1. position in block: blocks of 4 calls, order rotated, 12 rounds
pos = {k: [[] for _ in range(4)] for k in fns}
names = list(fns)
for r in range(12):
    for n in names[r % 3:] + names[:r % 3]:
        for i in range(4):
            t0 = time.perf_counter(); jax.block_until_ready(fns[n]()); pos[n][i].append(time.perf_counter() - t0)
print("median ms by position in block (1st = right after another program):")
for n in names:
    print(n, [round(1e3 * float(np.median(x)), 2) for x in pos[n]])
# 2. A/A control: the same BPPSA executable under two names, interleaved with BPTT (block=2 and 3)
for block in (2, 3):
    t = time_interleaved({"bppsa_a": fns["bppsa"], "bptt_plain": fns["bptt_plain"], "bppsa_b": fns["bppsa"]},
                         repeats=12, block=block)
    print(f"A/A block={block}:", {k: round(1e3 * v["median"], 2) for k, v in t.items()},
          "a/b =", round(t["bppsa_a"]["median"] / t["bppsa_b"]["median"], 3))
