"""The CPU products of the Blelloch scan in two forms: unrolled fused multiply-adds or one batched GEMM.

``bppsa.scan.batched_matmul`` / ``batched_vecmat`` unroll a product of S x S matrices into S
multiply-adds (one XLA loop fusion) for S <= ``FMA_MAX`` and at least ``FMA_MIN_PRODUCTS``
products a call; otherwise one flat batched GEMM. The unrolled form costs compile time (S terms a
product) on every level of every scan, while its run-time gain comes from the big bottom levels.
This script measures, one core, float32, interleaved in one process (``bppsa.host.time_interleaved``):

    bare      one jitted product, n products of S x S, GEMM time / fused time
    programs  ``jax.grad`` of a loss through ``bppsa.rnn(backward="bppsa")`` (and the Newton forward
              for one case), compile seconds and run ms, with FMA_MIN_PRODUCTS = 0 (every product
              unrolled, as before the threshold), 256, 1024 and 10^9 (every product a GEMM)

    XLA_FLAGS="--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1" \\
        taskset -c 0 python experiments/history/product_forms_bench.py OUTDIR [--quick]
        # writes OUTDIR/product-forms.{json,md}; about 6 min on a 2-core CPU
"""

import argparse
import json
import platform
import subprocess
import time
from pathlib import Path

import jax
import jax.numpy as jnp

import bppsa
from bppsa import cells, host
from bppsa.scan import dense as scan_lib  # the module whose FMA_MIN_PRODUCTS the products read

THRESHOLDS = {"unrolled": 0, "256": 256, "1024": 1024, "gemm": 10**9}
PROGRAMS = {  # name: (cell, T, B, forward)
    "RNN(20,20) T=1000 B=16": (lambda: cells.RNN(input_size=20, hidden_size=20), 1000, 16, "sequential"),
    "RNN(20,20) T=1000 B=2": (lambda: cells.RNN(input_size=20, hidden_size=20), 1000, 2, "sequential"),
    "RNN(20,20) T=10000 B=1": (lambda: cells.RNN(input_size=20, hidden_size=20), 10000, 1, "sequential"),
    "GRU(24,20) T=517 B=16": (lambda: cells.GRU(input_size=24, hidden_size=20), 517, 16, "sequential"),
    "GRU(8,16) T=2000 B=4": (lambda: cells.GRU(input_size=8, hidden_size=16), 2000, 4, "sequential"),
    "LSTM(8,8) T=2000 B=4": (lambda: cells.LSTM(input_size=8, hidden_size=8), 2000, 4, "sequential"),
    "LSTM(16,12) T=100 B=32": (lambda: cells.LSTM(input_size=16, hidden_size=12), 100, 32, "sequential"),
    "LSTM(3,5) T=37 B=2 newton": (lambda: cells.LSTM(input_size=3, hidden_size=5), 37, 2, "newton"),
}


def _gemm(L, R):  # its own function: jax.jit(batched_matmul) again would reuse the unrolled trace
    n = L.shape[-1]
    return jnp.matmul(L.reshape((-1, n, n)), R.reshape((-1, n, n))).reshape(L.shape)


def _with_threshold(value, make):
    """``make()`` traced and compiled with FMA_MIN_PRODUCTS = value (read at trace time), JAX's
    caches cleared first (a nested jit, e.g. the Newton solver's, would reuse its earlier trace)."""
    old = scan_lib.FMA_MIN_PRODUCTS
    scan_lib.FMA_MIN_PRODUCTS = value
    jax.clear_caches()
    try:
        t0 = time.perf_counter()
        compiled = make()
        return compiled, time.perf_counter() - t0
    finally:
        scan_lib.FMA_MIN_PRODUCTS = old


def bare(sizes, counts, repeats):
    rows = []
    for S in sizes:
        for n in counts:
            L, R = (jax.random.normal(jax.random.key(i), (n, S, S)) for i in (0, 1))
            fused, tf = _with_threshold(0, lambda: jax.jit(scan_lib.batched_matmul).lower(L, R).compile())
            gemm = jax.jit(_gemm).lower(L, R).compile()
            stats = host.time_interleaved({"fused": lambda: fused(L, R), "gemm": lambda: gemm(L, R)},
                                          repeats=repeats, block=3)
            ratio = stats["gemm"]["median"] / stats["fused"]["median"]
            rows.append({"S": S, "n": n, "gemm_over_fused": ratio, "fused_us": 1e6 * stats["fused"]["median"],
                         "fused_compile_s": tf})
            print(f"bare S={S:2d} n={n:6d}: GEMM/fused {ratio:4.2f} (fused {rows[-1]['fused_us']:.1f} us)", flush=True)
    return rows


def programs(names, repeats):
    rows = []
    for name in names:
        make_cell, T, B, forward = PROGRAMS[name]
        cell = make_cell()
        params = cell.init(jax.random.key(0))
        xs = jax.random.normal(jax.random.key(1), (T, B, cell.input_size))
        h = jnp.zeros((B, cell.hidden_size))
        h0 = (h, h) if isinstance(cell, cells.LSTM) else h

        def loss(p):
            hs = bppsa.rnn(cell, p, xs, h0, backward="bppsa", forward=forward)
            return jnp.mean((hs[0] if isinstance(hs, tuple) else hs) ** 2)

        compiled, compile_s = {}, {}
        for label, value in THRESHOLDS.items():
            compiled[label], compile_s[label] = _with_threshold(
                value, lambda: jax.jit(jax.grad(loss)).lower(params).compile())
        stats = host.time_interleaved({k: (lambda c=c: c(params)) for k, c in compiled.items()}, repeats=repeats)
        row = {"program": name, **{f"compile_s[{k}]": compile_s[k] for k in THRESHOLDS},
               **{f"run_ms[{k}]": 1e3 * stats[k]["median"] for k in THRESHOLDS}}
        rows.append(row)
        print(name + ": " + "  ".join(f"{k} {compile_s[k]:.2f} s {1e3 * stats[k]['median']:.2f} ms"
                                      for k in THRESHOLDS), flush=True)
    return rows


def markdown(record):
    out = [f"# CPU products: unrolled multiply-adds vs one batched GEMM\n\n{record['provenance']}\n",
           "## One product, GEMM time / unrolled time (> 1: unrolled faster)\n",
           "| S | " + " | ".join(f"n = {n}" for n in record["counts"]) + " |",
           "|---|" + "---|" * len(record["counts"])]
    for S in record["sizes"]:
        cells_ = [f"{r['gemm_over_fused']:.2f}" for r in record["bare"] if r["S"] == S]
        out.append(f"| {S} | " + " | ".join(cells_) + " |")
    out += ["", "## BPPSA gradient programs: compile s / run ms by FMA_MIN_PRODUCTS "
            "(unrolled = 0, gemm = every product a GEMM)\n",
            "| program | " + " | ".join(THRESHOLDS) + " |", "|---|" + "---|" * len(THRESHOLDS)]
    for r in record["programs"]:
        out.append(f"| {r['program']} | " + " | ".join(
            f"{r[f'compile_s[{k}]']:.2f} / {r[f'run_ms[{k}]']:.2f}" for k in THRESHOLDS) + " |")
    return "\n".join(out) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("outdir", type=Path)
    ap.add_argument("--quick", action="store_true", help="two sizes, two counts, two programs")
    ap.add_argument("--repeats", type=int, default=11)
    a = ap.parse_args()
    sizes, counts = ([8, 20], [64, 1024]) if a.quick else ([4, 8, 12, 16, 20, 24], [16, 64, 256, 1024, 4096, 16384])
    names = list(PROGRAMS)[:2] if a.quick else list(PROGRAMS)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    record = {"provenance": f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, commit {commit}, "
                            f"{platform.processor() or platform.machine()}, jax {jax.__version__}, one core, "
                            f"float32, medians of {a.repeats} interleaved rounds",
              "sizes": sizes, "counts": counts, "bare": bare(sizes, counts, a.repeats),
              "programs": programs(names, a.repeats)}
    a.outdir.mkdir(parents=True, exist_ok=True)
    (a.outdir / "product-forms.json").write_text(json.dumps(record, indent=1))
    (a.outdir / "product-forms.md").write_text(markdown(record))
    print(markdown(record))


if __name__ == "__main__":
    main()
