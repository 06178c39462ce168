"""Bounded memory of the parallel forward: dense Newton at H = 64, T = 100 000, B = 16.

One training step (``jax.value_and_grad`` of the mean of all hidden states w.r.t. the
parameters; ``forward="newton"``, ``backward="bppsa"``, ``chunk_size="auto"``) of a dense GRU,
float32, on this machine. Unchunked, the Jacobians alone would be T·B·S² floats (26 GB here: what
DEER's reports run out of); the chunked iteration and backward hold one chunk's at a time.

Recorded: the process's peak resident memory (``ru_maxrss``, the high-water mark of the whole
run, compile included), XLA's own plan for the compiled step (arguments, outputs, temporaries:
``memory_analysis``), the Newton iterations, the wall time of the one step, and the states'
largest deviation from the sequential forward's (run after, in float32).

    python experiments/scripts/newton_memory.py OUTDIR [--T 100000] [--B 16] [--H 64] [--I 64] [--scan blelloch]
        # writes OUTDIR/newton-memory.{json,md}; the full size takes several minutes on 2 cores
"""

import argparse
import resource
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp

import bppsa
from bppsa import cells
from experiments.provenance import provenance, save_json
from experiments.tables import markdown_table


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--T", type=int, default=100_000)
    ap.add_argument("--B", type=int, default=16)
    ap.add_argument("--H", type=int, default=64)
    ap.add_argument("--I", type=int, default=64)
    ap.add_argument("--scan", default="blelloch")
    ap.add_argument("--forward", default="newton")
    a = ap.parse_args(argv)
    cell = cells.GRU(a.I, a.H)
    params = cell.init(jax.random.key(0))
    xs = jax.random.normal(jax.random.key(1), (a.T, a.B, a.I), jnp.float32)
    h0 = jnp.zeros((a.B, a.H), jnp.float32)
    opts = bppsa.Options(forward=a.forward, backward="bppsa", scan=a.scan)

    def loss(p):
        hs, info = bppsa.rnn(cell, p, xs, h0, opts, return_info=True)
        return jnp.mean(hs), (hs, info)

    step = jax.jit(jax.value_and_grad(loss, has_aux=True))
    compiled = step.lower(params).compile()
    mem = compiled.memory_analysis()
    t0 = time.perf_counter()
    (value, (hs, info)), grads = compiled(params)
    jax.block_until_ready(grads)
    seconds = time.perf_counter() - t0
    peak_gib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB -> GiB (Linux)
    seq = jax.jit(lambda p: bppsa.rnn(cell, p, xs, h0, backward="bptt"))(params)
    deviation = float(jnp.max(jnp.abs(seq - hs)))
    gib = lambda n: round(n / 2**30, 3)
    rec = {
        "cell": f"GRU(I={a.I}, H={a.H})", "T": a.T, "B": a.B, "dtype": "float32", "forward": a.forward,
        "scan": a.scan, "peak_rss_gib": round(peak_gib, 3),
        "xla_argument_gib": gib(mem.argument_size_in_bytes), "xla_output_gib": gib(mem.output_size_in_bytes),
        "xla_temp_gib": gib(mem.temp_size_in_bytes),
        "dense_jacobians_gib": gib(a.T * a.B * a.H * a.H * 4),
        "iterations": int(info.iterations), "converged": bool(info.converged), "fell_back": bool(info.fell_back),
        "residual": float(info.residual), "max_abs_vs_sequential": deviation, "step_seconds": round(seconds, 2),
        "finite_grads": bool(all(jnp.all(jnp.isfinite(g)) for g in jax.tree.leaves(grads))),
        "provenance": provenance(" ".join(["python", "experiments/scripts/newton_memory.py"] + sys.argv[1:])),
    }
    keys = [k for k in rec if k != "provenance"]
    table = markdown_table(["quantity", "value"], [[k, rec[k]] for k in keys])
    a.out.mkdir(parents=True, exist_ok=True)
    save_json(a.out / "newton-memory.json", rec)
    (a.out / "newton-memory.md").write_text(
        "# Dense Newton step, bounded memory\n\n" + (__doc__ or "").split("\n\n")[1] + "\n\n" + table + "\n")
    print(table)


if __name__ == "__main__":
    main()
