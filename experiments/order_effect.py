"""The order effect under bppsa.timing's protocol (experiments/results/cpu/scan-optimisation.md,
round 4): median time by position in a block of consecutive calls (the first follows another
program), and an A/A control (one executable timed under two names, interleaved with BPTT).

    python experiments/order_effect.py      # about a minute on 2 CPU cores; prints the tables
"""
import json, time
import numpy as np
import jax, jax.numpy as jnp
from bppsa import cells, backprop
from bppsa.timing import time_interleaved
cell = cells.RNN(1, 20); T, B = 10000, 1
p = cell.init(jax.random.key(0), jnp.float32)
xs = jax.random.normal(jax.random.key(1), (T, B, 1), jnp.float32); h0 = jnp.zeros((B, 20))
ct = jax.random.normal(jax.random.key(2), (T, B, 20))
def g(**kw):
    def loss(q):
        return jnp.vdot(backprop.rnn(cell, q, xs, h0, **kw), ct)
    f = jax.jit(jax.grad(loss)); return lambda: f(p)
def gplain():
    def loss(q):
        return jnp.vdot(backprop.forward_states(cell, q, xs, h0, unroll=1), ct)
    f = jax.jit(jax.grad(loss)); return lambda: f(p)
fns = {"bptt_plain": gplain(), "bptt_tuned": g(backward="bptt"), "bppsa": g(backward="bppsa")}
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
