"""BPTT by the cells' analytic adjoint against autodiff's BPTT through ``lax.scan``, and where the
parameter gradients are formed (after the loop or in it).

``backward="bptt"`` for a cell with ``has_adjoint`` (RNN, GRU, LSTM and flax's four cells over them)
runs :func:`bppsa.backward.adjoint.sequential_adjoint`; before, it was JAX's autodiff of the forward
``lax.scan`` (still what a cell without an analytic adjoint gets, and what this script gets by
setting the cell class's ``has_adjoint`` to False). One core, float32, ``jax.grad`` of a loss on
the last state, compiled, the three programs interleaved in one process (``bppsa.host.time_interleaved``):

    autodiff   the former BPTT (autodiff through lax.scan; the plan's hoist and unroll)
    after      the adjoint, the parameter gradients one product each after the loop
    in_loop    the adjoint, the parameter gradients summed in the loop

at T = 200, I = 16, B in (4, 8, 16, 32, 64), H in (16, 32, 64, 128), for GRU, LSTM and RNN (tanh),
flax's bias conventions. The plan's rule (:func:`bppsa.plan.rules.adjoint_in_loop`) is read off it.

    XLA_FLAGS="--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1" \\
        taskset -c 0 python experiments/history/analytic_bptt_bench.py OUTDIR [--quick]
        # writes OUTDIR/analytic-bptt.{json,md}; about 12 min on a 2-core CPU
"""

import argparse
import functools
import itertools
import json
import platform
import subprocess
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import bppsa
from bppsa import cells, host

CELLS = {"gru": lambda I, H: cells.GRU(I, H, hidden_bias=False),
         "lstm": lambda I, H: cells.LSTM(I, H, input_bias=False),
         "rnn": lambda I, H: cells.RNN(I, H, hidden_bias=False)}
MODES = ("autodiff", "after", "in_loop")


def _gradient(cell, params, xs, s0, weights, mode):
    """The compiled gradient with BPTT in ``mode`` (traced with the class flag and the rule set for it)."""
    kind, rule = type(cell), bppsa.plan.rules.adjoint_in_loop
    kind.has_adjoint = mode != "autodiff"  # the plan reads the rule off bppsa.plan.rules when it is traced
    bppsa.plan.rules.adjoint_in_loop = lambda *a, **k: mode == "in_loop"
    try:
        f = jax.jit(jax.grad(lambda p, x: jnp.sum(cell.flatten_state(
            bppsa.rnn(cell, p, x, cell.unflatten_state(s0), backward="bptt"))[-1] * weights)))
        jax.block_until_ready(f(params, xs))
    finally:
        kind.has_adjoint, bppsa.plan.rules.adjoint_in_loop = True, rule
    return functools.partial(f, params, xs)


def grid(kinds, batches, hiddens, T, I, repeats):
    rows = []
    for kind, B, H in itertools.product(kinds, batches, hiddens):
        cell = CELLS[kind](I, H)
        params = cell.init(jax.random.key(0))
        rng = np.random.default_rng(0)
        xs = jnp.asarray(rng.standard_normal((T, B, I)), jnp.float32)
        s0 = jnp.zeros((B, cell.state_size), jnp.float32)
        weights = jnp.asarray(rng.standard_normal((B, cell.state_size)), jnp.float32)
        fns = {m: _gradient(cell, params, xs, s0, weights, m) for m in MODES}
        got = {m: fns[m]() for m in MODES}
        err = max(float(jnp.max(jnp.abs(got[m][k] - got["autodiff"][k])) / jnp.max(jnp.abs(got["autodiff"][k])))
                  for m in MODES[1:] for k in got["autodiff"])
        stats = host.time_interleaved(fns, repeats=repeats, block=5)
        ms = {m: stats[m]["median"] * 1e3 for m in MODES}
        rows.append({"cell": kind, "T": T, "B": B, "I": I, "H": H, "BGH": B * cell.gates * H, "ms": ms,
                     "max_rel_grad_diff": err, "rule_in_loop": bppsa.plan.rules.adjoint_in_loop(cell, B, "cpu")})
        print(rows[-1], flush=True)
    return rows


def markdown(record):
    lines = ["# BPTT by the cells' analytic adjoint against autodiff's", "",
             f"{record['provenance']}. `jax.grad` of a loss on the last state through "
             "`bppsa.rnn(backward=\"bptt\")`, compiled. autodiff: the former BPTT (autodiff through `lax.scan`); "
             "after / in loop: the analytic adjoint with the parameter gradients formed after its loop or summed "
             "in it (ratios to autodiff; < 1: faster); rule: what `bppsa.plan.rules.adjoint_in_loop` picks "
             "(the time of that mode / autodiff in the last column). Max rel grad diff: the largest difference of "
             "the adjoint's gradients from autodiff's, relative to the largest entry. Script: "
             "`experiments/history/analytic_bptt_bench.py`.", "",
             "| cell | B | H | B·G·H | autodiff ms | after / autodiff | in loop / autodiff | rule | rule / autodiff "
             "| max rel grad diff |", "|:---|---:|---:|---:|---:|---:|---:|:---|---:|---:|"]
    for r in record["rows"]:
        ms = r["ms"]
        mode = "in_loop" if r["rule_in_loop"] else "after"
        lines.append(f"| {r['cell']} | {r['B']} | {r['H']} | {r['BGH']} | {ms['autodiff']:.3f} | "
                     f"{ms['after'] / ms['autodiff']:.2f} | {ms['in_loop'] / ms['autodiff']:.2f} | "
                     f"{mode.replace('_', ' ')} | {ms[mode] / ms['autodiff']:.2f} | {r['max_rel_grad_diff']:.1e} |")
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("outdir", type=Path)
    ap.add_argument("--quick", action="store_true", help="two batches, two sizes, GRU only")
    ap.add_argument("--repeats", type=int, default=8)
    a = ap.parse_args()
    kinds, batches, hiddens = (["gru"], [4, 64], [16, 64]) if a.quick else (list(CELLS), [4, 8, 16, 32, 64],
                                                                           [16, 32, 64, 128])
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    record = {"provenance": f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, commit {commit}, "
                            f"{platform.processor() or platform.machine()}, jax {jax.__version__}, one core, "
                            f"float32, T = 200, I = 16, medians of {a.repeats} interleaved rounds",
              "rows": grid(kinds, batches, hiddens, 200, 16, a.repeats)}
    a.outdir.mkdir(parents=True, exist_ok=True)
    (a.outdir / "analytic-bptt.json").write_text(json.dumps(record, indent=1))
    (a.outdir / "analytic-bptt.md").write_text(markdown(record))
    print(markdown(record))


if __name__ == "__main__":
    main()
