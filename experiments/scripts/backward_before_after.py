"""Time the BPPSA and BPTT backward passes through the public API, for a before/after record.

    python experiments/scripts/backward_before_after.py OUT.json [--label NAME] [--points T:B,...]

Runs against whatever ``bppsa`` is importable (so the same script can time an older checkout:
``PYTHONPATH=/path/to/old/checkout python ...``). In one process, interleaved, for each point:
BPTT (``jax.grad`` through ``lax.scan``), BPPSA with the library's default settings, and -- when
the installed version has it -- BPPSA with ``chunk_size=None`` (one chunk). RNN, input 1,
H = 20, float32, a random cotangent on every step; median and min of the repeats after a
compile warm-up, ``block_until_ready``. Writes JSON with provenance.
"""

import argparse
import inspect
import json
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

import bppsa
from bppsa import cells

POINTS = ((10000, 1), (1000, 2), (1000, 1), (1000, 16), (30000, 1), (3000, 16))


def _backward(cell, params, xs, h0, **kw):
    _, vjp = jax.vjp(lambda p, x, h: bppsa.rnn(cell, p, x, h, **kw), params, xs, h0)
    ct = jax.random.normal(jax.random.key(2), (xs.shape[0],) + h0.shape, xs.dtype)
    apply = jax.jit(lambda f, c: f(c))
    return lambda: apply(vjp, ct)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("--label", default="")
    p.add_argument("--points", default=",".join(f"{T}:{B}" for T, B in POINTS))
    p.add_argument("--repeats", type=int, default=9)
    a = p.parse_args(argv)
    has_chunks = "chunk_size" in inspect.signature(bppsa.rnn).parameters
    cell = cells.RNN(1, 20)
    params = cell.init(jax.random.key(0), jnp.float32)
    rows = []
    for spec in a.points.split(","):
        T, B = (int(x) for x in spec.split(":"))
        xs = jax.random.normal(jax.random.key(1), (T, B, 1), jnp.float32)
        h0 = jnp.zeros((B, 20), jnp.float32)
        fns = {"bptt": _backward(cell, params, xs, h0, backward="bptt"),
               "bppsa": _backward(cell, params, xs, h0, backward="bppsa")}
        if has_chunks:
            fns["bppsa_one_chunk"] = _backward(cell, params, xs, h0, backward="bppsa", chunk_size=None)
        for f in fns.values():  # compile and warm up
            jax.block_until_ready(f())
            jax.block_until_ready(f())
        samples = {k: [] for k in fns}
        for _ in range(a.repeats):
            for k, f in fns.items():
                t0 = time.perf_counter()
                jax.block_until_ready(f())
                samples[k].append(time.perf_counter() - t0)
        row = {"T": T, "B": B}
        for k, s in samples.items():
            row[k] = {"median_ms": 1e3 * float(np.median(s)), "min_ms": 1e3 * float(np.min(s))}
        for k in fns:
            if k != "bptt":
                row[f"speedup_{k}"] = {s: row["bptt"][f"{s}_ms"] / row[k][f"{s}_ms"] for s in ("median", "min")}
        rows.append(row)
        print(f"T={T:6d} B={B:3d} " + "  ".join(f"{k} {row[k]['median_ms']:.2f}/{row[k]['min_ms']:.2f} ms"
                                                for k in fns), flush=True)
    try:
        from bppsa.provenance import provenance
        prov = provenance("python " + " ".join(sys.argv))
    except ImportError:
        prov = {}
    host = getattr(bppsa, "host", None)
    rec = {"label": a.label, "provenance": prov, "malloc_tuned": bool(host and host.allocator_tuned()),
           "repeats": a.repeats, "rows": rows}
    with open(a.out, "w") as f:
        json.dump(rec, f, indent=1)
    print("wrote", a.out)


if __name__ == "__main__":
    main()
