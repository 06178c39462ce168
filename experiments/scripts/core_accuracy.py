"""Float32 gradient error of BPPSA vs BPTT (and of both vs a float64 reference), RNN H = 20.

Command: .venv/bin/python experiments/scripts/core_accuracy.py [--lengths 1000 10000 30000]
Expected run time: about a minute on 2 CPU cores. Writes experiments/results/<device>/core_accuracy.{json,md}.
"""

import argparse
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

jax.config.update("jax_enable_x64", True)

import bppsa  # noqa: E402
from bppsa import cells  # noqa: E402
from bppsa.provenance import device_label, provenance, save_json  # noqa: E402


def grads(cell, params, xs, h0, backward, scan="blelloch"):
    def loss(p):
        hs = bppsa.rnn(cell, p, xs, h0, backward=backward, scan=scan)
        return jnp.sum(hs[-1]) + jnp.mean(hs)  # last-step and every-step terms
    return jax.jit(jax.grad(loss))(params)


def rel_err(a, b):
    a = np.concatenate([np.ravel(x) for x in jax.tree.leaves(a)])
    b = np.concatenate([np.ravel(x) for x in jax.tree.leaves(b)])
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lengths", type=int, nargs="+", default=[1000, 10000, 30000])
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    cell = cells.RNN(1, 20)
    rows = []
    for T in a.lengths:
        p64 = cell.init(jax.random.key(0), jnp.float64)
        xs64 = jax.random.bernoulli(jax.random.key(T), 0.35, (T, a.batch, 1)).astype(jnp.float64)
        h64 = jnp.zeros((a.batch, 20), jnp.float64)
        p32, xs32, h32 = jax.tree.map(lambda x: x.astype(jnp.float32), (p64, xs64, h64))
        ref = grads(cell, p64, xs64, h64, "bptt")
        g_bptt = grads(cell, p32, xs32, h32, "bptt")
        g_bppsa = grads(cell, p32, xs32, h32, "bppsa")
        row = {"T": T, "B": a.batch, "H": 20,
               "bppsa_vs_bptt_f32": rel_err(g_bppsa, g_bptt),
               "bppsa_f32_vs_f64": rel_err(g_bppsa, ref),
               "bptt_f32_vs_f64": rel_err(g_bptt, ref)}
        rows.append(row)
        print(row, flush=True)
    md = ["| T | B | H | max rel. error BPPSA vs BPTT (f32) | BPPSA f32 vs f64 | BPTT f32 vs f64 |",
          "|---:|---:|---:|---:|---:|---:|"]
    md += [f"| {r['T']} | {r['B']} | {r['H']} | {r['bppsa_vs_bptt_f32']:.2e} | {r['bppsa_f32_vs_f64']:.2e} | "
           f"{r['bptt_f32_vs_f64']:.2e} |" for r in rows]
    out = Path(a.out or f"experiments/results/{device_label()}")
    save_json(out / "core_accuracy.json", {"rows": rows, "provenance": provenance()})
    (out / "core_accuracy.md").write_text("Float32 gradient error (max abs difference / max abs gradient), "
                                          "vanilla RNN, hidden 20, bitstream inputs.\n\n" + "\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
