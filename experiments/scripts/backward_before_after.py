"""Time the BPPSA and BPTT backward passes through the public API, for a before/after record.

    python experiments/scripts/backward_before_after.py OUT.json [--label NAME] [--points T:B,...]
    python experiments/scripts/backward_before_after.py --combine PREFIX RUN.json ... [--note TEXT]

Runs against whatever ``bppsa`` is importable (so the same script can time an older checkout:
``PYTHONPATH=/path/to/old/checkout python ...``). In one process, interleaved, for each point:
BPTT (``jax.grad`` through ``lax.scan``), BPPSA with the library's default settings, and -- when
the installed version has it -- BPPSA with ``chunk_size=None`` (one chunk). RNN, input 1,
H = 20, float32, a random cotangent on every step; median and min of the repeats after a
compile warm-up, ``block_until_ready``; the order of the functions rotates every round (on the
shared 2-core machine the function right after BPTT's long single-threaded loop measured up to
1.5× slower by median). Writes JSON with provenance.

``--combine`` puts several such runs (one per checkout, each run in its own process) into
PREFIX.json (``{"title", "note", "runs": {label: run}}``) and a markdown table PREFIX.md: per point,
each run's BPPSA variants as median / min ms and × = BPTT / BPPSA of the same run (median [min]).
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


TITLE = "BPPSA backward before/after the scan optimisations (RNN H = 20)"


def _merge(a, b):
    """Two runs of one checkout: per point and variant the median of the runs' medians (a running
    median over the processes merged so far) and the min of their mins."""
    n = a["processes"]
    rows = []
    for ra in a["rows"]:
        rb = next(r for r in b["rows"] if (r["T"], r["B"]) == (ra["T"], ra["B"]))
        row = {"T": ra["T"], "B": ra["B"]}
        for k, x in ra.items():
            if isinstance(x, dict) and "median_ms" in x:
                meds = x.get("run_medians_ms", [x["median_ms"]]) + [rb[k]["median_ms"]]
                row[k] = {"median_ms": float(np.median(meds)), "min_ms": min(x["min_ms"], rb[k]["min_ms"]),
                          "run_medians_ms": meds}
        rows.append(row)
    return dict(a, rows=rows, processes=n + 1, provenance=b.get("provenance", a.get("provenance")))


def combine(prefix, paths, note=""):
    """Several runs of this script -> PREFIX.json and PREFIX.md (see the module docstring)."""
    runs = {}
    for path in paths:
        with open(path) as f:
            run = json.load(f)
        label = run.get("label") or path
        if label in runs:  # the same checkout measured again (another process, another moment)
            runs[label] = _merge(runs[label], run)
        else:
            runs[label] = dict(run, processes=1)
    with open(prefix + ".json", "w") as f:
        first = next(iter(runs.values()))  # provenance: the first checkout's (list "after" first)
        json.dump({"title": TITLE, "note": note, "provenance": first.get("provenance", {}),
                   "runs": runs}, f, indent=1)
    cols = [(label, k) for label, run in runs.items()
            for k in run["rows"][0] if k not in ("T", "B", "bptt") and not k.startswith("speedup_")]
    lines = [note, "", "| T | B | " + " | ".join(f"{label}: {k}" for label, k in cols) + " |",
             "|---|---|" + "---|" * len(cols)]
    points = [(r["T"], r["B"]) for r in next(iter(runs.values()))["rows"]]
    for T, B in points:
        cells_ = []
        for label, k in cols:
            row = next((r for r in runs[label]["rows"] if (r["T"], r["B"]) == (T, B)), None)
            if row is None:
                cells_.append("–")
                continue
            x, b = row[k], row["bptt"]
            cells_.append(f"{x['median_ms']:.2f} / {x['min_ms']:.2f} ({b['median_ms'] / x['median_ms']:.2f}× "
                          f"[{b['min_ms'] / x['min_ms']:.2f}×])")
        lines.append(f"| {T} | {B} | " + " | ".join(cells_) + " |")
    with open(prefix + ".md", "w") as f:
        f.write("\n".join(lines).lstrip("\n") + "\n")
    print("wrote", prefix + ".json,", prefix + ".md")


def main(argv=None):
    if argv is None:
        argv = sys.argv[1:]
    if argv[:1] == ["--combine"]:
        c = argparse.ArgumentParser(prog="backward_before_after.py --combine")
        c.add_argument("prefix")
        c.add_argument("runs", nargs="+")
        c.add_argument("--note", default="")
        a = c.parse_args(argv[1:])
        return combine(a.prefix, a.runs, a.note)
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
        names = list(fns)
        for r in range(a.repeats):  # the order rotates every round: no variant always follows BPTT
            for k in names[r % len(names):] + names[:r % len(names)]:
                f = fns[k]
                t0 = time.perf_counter()
                jax.block_until_ready(f())
                samples[k].append(time.perf_counter() - t0)
        row = {"T": T, "B": B}
        for k, s in samples.items():
            row[k] = {"median_ms": 1e3 * float(np.median(s)), "min_ms": 1e3 * float(np.min(s))}
        for k in fns:
            if k != "bptt":
                row[f"speedup_{k}"] = {s: row["bptt"][f"{s}_ms"] / row[k][f"{s}_ms"] for s in ("median", "min")}
                # BPTT and this variant timed in the same round, ratio per round, then the median
                row[f"speedup_{k}"]["paired_median"] = float(np.median(np.divide(samples["bptt"], samples[k])))
        rows.append(row)
        print(f"T={T:6d} B={B:3d} " + "  ".join(f"{k} {row[k]['median_ms']:.2f}/{row[k]['min_ms']:.2f} ms"
                                                for k in fns)
              + "  paired x " + " ".join(f"{row[f'speedup_{k}']['paired_median']:.2f}" for k in fns if k != "bptt"),
              flush=True)
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
