"""The measurements behind ``bppsa.cost.bptt_unroll``: BPTT (the one timed gradient of
``experiments.gradient``, through ``lax.scan``) for each unroll in ``bppsa.cost.UNROLLS``, interleaved
(``bppsa.host.time_interleaved``), over a grid of cells and shapes; the unroll the rule picks
and its time over the best unroll's.

    python experiments/scripts/bptt_unroll.py OUTDIR [--quick]    # writes OUTDIR/bptt-unroll.{json,md}
"""

import argparse
import json
import sys
import time
from pathlib import Path

import jax.numpy as jnp

from bppsa import cells, cost
from bppsa.host import time_interleaved
from experiments import gradient
from experiments.provenance import provenance, save_json
from experiments.tables import markdown_table

GRID = [("rnn", 1, 20, 1000, B) for B in (1, 2, 4, 8, 16, 32, 64, 128, 256)] + \
       [("rnn", 1, 20, T, 1) for T in (100, 10000)] + [("rnn", 1, 20, T, 16) for T in (10, 100, 3000)] + \
       [("gru", 1, 20, 1000, B) for B in (1, 16)] + [("lstm", 1, 20, 1000, 1)] + \
       [("gru", 38, 20, 259, 16), ("gru", 12, 20, 1034, 64)]  # two of the IRMAS grid's shapes
QUICK = [("rnn", 1, 20, 1000, 1), ("rnn", 1, 20, 1000, 16), ("gru", 1, 20, 1000, 1)]
CELLS = {"rnn": cells.RNN, "gru": cells.GRU, "lstm": cells.LSTM}


def rule_columns(r):
    """The rule's unroll for this row and its time over the best unroll's (a rule unroll >= T,
    capped at T, is the fully unrolled loop, as every u >= T in UNROLLS)."""
    cell = CELLS[r["cell"]](r["I"], r["H"])
    ms = {int(u): v for u, v in r["ms"].items()}
    rule = cost.bptt_unroll(cell, r["T"], r["B"], jnp.float32)
    rule_ms = ms[rule] if rule in ms else ms[min(u for u in ms if u >= rule)]
    return {"rule": rule, "rule_over_best": rule_ms / min(ms.values())}


def point(kind, I, H, T, B, repeats):
    cell = CELLS[kind](I, H)
    p, xs, h0, R = gradient.problem(cell, T, B)
    fns = gradient.gradient_functions(cell, p, xs, h0, R, gradient.method_names(unrolls=cost.UNROLLS, tuned=False,
                                                                                 scans=()))
    t = time_interleaved(fns, repeats=repeats, block=3)
    ms = {u: 1e3 * t[f"bptt_unroll{u}"]["median"] for u in cost.UNROLLS}
    best = min(ms, key=ms.get)
    r = {"cell": kind, "I": I, "H": H, "T": T, "B": B, "ms": ms, "best": best, "plain_over_best": ms[1] / ms[best]}
    return {**r, **rule_columns(r)}


def render(rec, out):
    p = rec["provenance"]
    md = [f"`{p['command']}` — {p['date']}, {p['backend']} / {p['cpu']}, jax {p['jax']}", "",
          "BPTT (the timed training-step gradient of `experiments.gradient` through `lax.scan(..., unroll=u)`, "
          "forward included), "
          f"median ms of {rec.get('repeats', 7)} blocks of 2 timed calls, all unrolls interleaved; rule = "
          "`bppsa.cost.bptt_unroll` as committed (re-evaluated on the rows); × = time / best unroll's time.", "",
          ""]
    rows = []
    for r in rec["rows"]:
        r.update(rule_columns(r))
        ms = {int(u): v for u, v in r["ms"].items()}
        rows.append([r["cell"], r["I"], r["T"], r["B"], *(f"{ms[u]:.2f}" for u in cost.UNROLLS), r["best"], r["rule"],
                     f"{r['rule_over_best']:.2f}", f"{r['plain_over_best']:.2f}"])
    md.append(markdown_table(["cell", "I", "T", "B", *(f"u={u}" for u in cost.UNROLLS), "best", "rule", "rule ×",
                              "plain ×"], rows, align="lrrr" + "r" * (len(cost.UNROLLS) + 4)))
    save_json(out / "bptt-unroll.json", rec)
    (out / "bptt-unroll.md").write_text("\n".join(md) + "\n")


def main(argv=None):
    a = argparse.ArgumentParser()
    a.add_argument("outdir")
    a.add_argument("--quick", action="store_true")
    a.add_argument("--repeats", type=int, default=7)
    a.add_argument("--render", action="store_true", help="re-render OUTDIR/bptt-unroll.json with the current rule")
    args = a.parse_args(argv)
    out = Path(args.outdir)
    if args.render:
        return render(json.loads((out / "bptt-unroll.json").read_text()), out)
    out.mkdir(parents=True, exist_ok=True)
    rows, start = [], time.perf_counter()
    for g in (QUICK if args.quick else GRID):
        rows.append(point(*g, repeats=args.repeats))
        print(json.dumps(rows[-1]), flush=True)
    render({"rows": rows, "repeats": args.repeats, "wall_s": time.perf_counter() - start,
            "provenance": provenance("python experiments/scripts/bptt_unroll.py " + " ".join(sys.argv[1:] if argv is None else argv))},
           out)


if __name__ == "__main__":
    main()
