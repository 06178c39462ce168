"""Reverse mode before and after forward-mode autodiff came to ``bppsa.rnn`` (issue 24, item 8).

Three implementations of ``bppsa.backward.rule.bppsa_states`` timed on the one timed gradient
(``experiments.gradient.loss``: the training step's gradient w.r.t. the parameters, forward included,
jitted), all interleaved in one run (``bppsa.host.time_interleaved``):

    old      the ``jax.custom_vjp`` of commit OLD_REV (no forward mode), loaded from git
    new      the ``jax.custom_jvp`` of the working tree: tangent rule = one block linear solve
             (``lax.custom_linear_solve``) whose transpose is the BPPSA adjoint scan *and* the
             cell's analytic ``param_grads`` (route (a) with the analytic gradients kept)
    plain_a  route (a) as first written: the tangent right-hand sides by a ``jax.jvp`` of the
             step, the linear solve over the states only; reverse mode = the BPPSA adjoint scan,
             then JAX's transpose of the step's JVP for the parameter and input gradients

and, for the record, forward mode itself: ``jax.jvp`` of ``bppsa.rnn`` w.r.t. the parameters
(new) and of ``backward="bptt"`` (autodiff through the scan). Columns ×: old time / new time
(> 1: new faster). Memory: XLA's temporary bytes of the compiled gradient (``memory_analysis``).

    python experiments/history/forward_mode_bench.py OUTDIR [--quick] [--repeats 7]
        # writes OUTDIR/forward-mode.{json,md}; full grid about 15 min on a 2-core CPU; then the
        # compiled programs compared (HLO instructions by opcode, old vs new)
"""

import argparse
import collections
import functools
import importlib
import json
import re
import subprocess
import sys
import time
import types
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import bppsa
from bppsa import cells
from bppsa.host import time_interleaved
from experiments import gradient
from experiments.provenance import provenance, save_json
from experiments.tables import markdown_table

OLD_REV = "a834d6a1fb8a78a536811f099bdf5cdecf11a23d"  # the last commit of the custom_vjp backward
# The script runs at the commits it measured (up to 3771255): the next one moved bppsa/_backward.py into
# bppsa/backward/ and bppsa/forward/ (git worktree add /tmp/at 3771255, then run it there).
new_lib = importlib.import_module("bppsa._backward")
ROOT = Path(__file__).resolve().parents[2]
CELLS = {"rnn": cells.RNN, "gru": cells.GRU, "lstm": cells.LSTM}
# (cell, I, H, T, B, scan, chunk_size): the IRMAS shapes (experiments.data.irmas.SHAPES: s (38, 259),
# m (24, 517), l (12, 1034)) at H = 20, wider GRUs, the paper's RNN and an LSTM.
GRID = [("gru", 38, 20, 259, 32, "blelloch", "auto"), ("gru", 24, 20, 517, 16, "blelloch", "auto"),
        ("gru", 12, 20, 1034, 32, "blelloch", "auto"), ("gru", 64, 64, 517, 16, "blelloch", "auto"),
        ("gru", 128, 128, 517, 16, "blelloch", "auto"), ("gru", 24, 20, 517, 16, "sequential", "auto"),
        ("gru", 24, 20, 517, 16, "blelloch", None), ("rnn", 1, 20, 10000, 1, "blelloch", "auto"),
        ("rnn", 1, 20, 1000, 16, "blelloch", "auto"), ("lstm", 20, 20, 1000, 4, "blelloch", "auto")]
HLO_POINTS = [("gru", 24, 20, 517, 16, "blelloch", "auto"), ("gru", 24, 20, 517, 16, "sequential", "auto"),
              ("lstm", 20, 20, 1000, 4, "blelloch", "auto")]
QUICK = [("gru", 24, 20, 517, 16, "blelloch", "auto"), ("rnn", 1, 20, 1000, 16, "blelloch", "auto")]


def old_module(rev=OLD_REV):
    """``bppsa/_backward.py`` as of ``rev``, imported as a module of the bppsa package."""
    src = subprocess.run(["git", "show", f"{rev}:bppsa/_backward.py"], cwd=ROOT, check=True,
                         capture_output=True, text=True).stdout
    mod = types.ModuleType("bppsa._backward_old")
    mod.__package__ = "bppsa"
    exec(compile(src, f"{rev[:7]}:bppsa/_backward.py", "exec"), mod.__dict__)
    return mod


def _adjoint_states(cell, scan_method, chunk_size, params, xs, s0, ss, ct):
    """The BPPSA adjoint scan alone (chunked as the library does it): gs (T, B, S), g0."""
    xr, sr, spr, ctr = new_lib.scan_order(xs, ss, s0, ct)
    T, B, S = ss.shape
    C = (bppsa.plan.rules.auto_chunk_size(T, B, S, ss.dtype.itemsize,
                                    structured=scan_method == "blelloch" and cell.has_diagonal_jacobian)
         if chunk_size == "auto" else chunk_size) or T
    gsr, u = [], jnp.zeros_like(ctr[0])
    n_full, rest = divmod(T, C)
    split = lambda a: a[:n_full * C].reshape((n_full, C) + a.shape[1:])

    def chunk(u, c):
        x_c, s_c, sp_c, ct_c = c
        v, ds = new_lib.root_and_offsets(ct_c)
        gs, total = new_lib._scan_gradients(cell, scan_method, params, x_c, s_c, sp_c, ds, v + u)
        return total, gs

    if n_full:
        u, g = lax.scan(chunk, u, tuple(split(a) for a in (xr, sr, spr, ctr)))
        gsr.append(g.reshape((n_full * C,) + g.shape[2:]))
    if rest:
        u, g = chunk(u, tuple(a[n_full * C:] for a in (xr, sr, spr, ctr)))
        gsr.append(g)
    return jnp.concatenate(gsr, axis=0)[::-1], u


def plain_route_a():
    """Route (a) as first written (see the module docstring): a custom_jvp like the library's."""

    @functools.partial(jax.custom_jvp, nondiff_argnums=(0, 1, 2, 6))
    def states(cell, scan_method, chunk_size, params, xs, s0, precision="highest"):
        return new_lib.forward_states(cell, params, xs, s0)

    @states.defjvp
    def _jvp(cell, scan_method, chunk_size, precision, primals, tangents):
        params, xs, s0 = primals
        dp, dxs, ds0 = tangents
        ss = new_lib.forward_states(cell, params, xs, s0)
        step = functools.partial(new_lib._flat_step, cell)
        with jax.default_matmul_precision(precision):
            rhs = jax.jvp(lambda p, x: new_lib._steps(cell, p, new_lib._prev_states(s0, ss), x), (params, xs),
                          (dp, dxs))[1]
            first = jax.jvp(lambda s: step(params, s, xs[0]), (s0,), (ds0,))[1]
            rhs = rhs.at[0].add(first)

            def matvec(z):
                prev = jnp.concatenate([jnp.zeros_like(z[:1]), z[:-1]], axis=0)
                spr = new_lib._prev_states(s0, ss)
                return z - jax.jvp(lambda s: new_lib._steps(cell, params, s, xs), (spr,), (prev,))[1]

            def solve(_, b):
                return new_lib.tangent_states(cell, params, xs, s0, ss, b, jnp.zeros_like(s0))

            def transpose_solve(_, c):
                return _adjoint_states(cell, scan_method, chunk_size, params, xs, s0, ss, c)[0]

            return ss, lax.custom_linear_solve(matvec, rhs, solve, transpose_solve)

    return states


def _rnn_with(states_fn, cell, scan, chunk_size):
    def run(p, x, h):
        return cell.unflatten_state(states_fn(cell, scan, chunk_size, p, x, cell.flatten_state(h), "highest"))
    return run


def point(kind, I, H, T, B, scan, chunk_size, repeats, old, plain):
    cell = CELLS[kind](I, H)
    p, xs, h0, R = gradient.problem(cell, T, B)
    runs = {"old": _rnn_with(old.bppsa_states, cell, scan, chunk_size),
            "new": _rnn_with(new_lib.bppsa_states, cell, scan, chunk_size),
            "plain_a": _rnn_with(plain, cell, scan, chunk_size)}
    grads = {m: jax.jit(jax.grad(lambda q, x, h, R, f=f: gradient.loss(cell, f(q, x, h), R))) for m, f in runs.items()}
    fns = {m: functools.partial(g, p, xs, h0, R) for m, g in grads.items()}
    tp = jax.tree.map(jnp.ones_like, p)
    jvps = {"jvp_new": jax.jit(lambda q, x, h: jax.jvp(lambda q: runs["new"](q, x, h), (q,), (tp,))[1]),
            "jvp_bptt": jax.jit(lambda q, x, h: jax.jvp(lambda q: bppsa.rnn(cell, q, x, h, backward="bptt"),
                                                        (q,), (tp,))[1])}
    fns.update({m: functools.partial(f, p, xs, h0) for m, f in jvps.items()})
    ref = jax.tree.leaves(fns["old"]())
    err = {m: max(float(jnp.max(jnp.abs(a - b)) / jnp.max(jnp.abs(b))) for a, b in zip(jax.tree.leaves(fns[m]()), ref))
           for m in ("new", "plain_a")}
    temp = {m: g.lower(p, xs, h0, R).compile().memory_analysis() for m, g in grads.items()}
    t = time_interleaved(fns, repeats=repeats, block=3)
    ms = {m: 1e3 * s["median"] for m, s in t.items()}
    return {"cell": kind, "I": I, "H": H, "T": T, "B": B, "scan": scan, "chunk_size": chunk_size, "ms": ms,
            "min_ms": {m: 1e3 * s["min"] for m, s in t.items()},
            "temp_mib": {m: (a.temp_size_in_bytes / 2**20 if a is not None else None) for m, a in temp.items()},
            "old_over_new": ms["old"] / ms["new"], "old_over_plain_a": ms["old"] / ms["plain_a"],
            "max_rel_diff_vs_old": err}


def hlo_ops(kind, I, H, T, B, scan, chunk_size, old):
    """The compiled gradient's HLO instructions by opcode, old and new, and where they differ."""
    cell = CELLS[kind](I, H)
    p, xs, h0, R = gradient.problem(cell, T, B)
    counts = {}
    for m, f in {"old": old.bppsa_states, "new": new_lib.bppsa_states}.items():
        run = _rnn_with(f, cell, scan, chunk_size)
        g = jax.jit(jax.grad(lambda q, x, h, R, run=run: gradient.loss(cell, run(q, x, h), R)))
        counts[m] = collections.Counter(re.findall(r"= \S+ (\w[\w-]*)\(", g.lower(p, xs, h0, R).compile().as_text()))
    diff = {k: [counts["old"][k], counts["new"][k]] for k in sorted(set(counts["old"]) | set(counts["new"]))
            if counts["old"][k] != counts["new"][k]}
    return {"cell": kind, "I": I, "H": H, "T": T, "B": B, "scan": scan, "chunk_size": chunk_size,
            "ops_old": sum(counts["old"].values()), "ops_new": sum(counts["new"].values()), "differ": diff}


def render(rec, out):
    p = rec["provenance"]
    md = [f"`{p['command']}` — {p['date']}, {p['backend']} / {p['cpu']} ({p['cpu_count']} cores, shared), "
          f"jax {p['jax']}, commit {p['git_commit']}", "",
          "Reverse mode before and after forward mode: the one timed gradient (`experiments.gradient.loss`, the "
          "training step's gradient w.r.t. the parameters, forward included, jitted, float32), median ms of "
          f"{rec['repeats']} blocks of 2 timed calls, every column interleaved in one run. "
          f"old = the `custom_vjp` of {OLD_REV[:7]}; new = the `custom_jvp` whose transposed linear solve is the "
          "BPPSA scan + the cells' analytic `param_grads` (what `bppsa.rnn` runs now); plain (a) = the same "
          "without the analytic gradients (JAX's transpose of the step's JVP). × = old / new (> 1: new faster). "
          "temp MiB: XLA's temporaries of the compiled gradient. jvp: forward mode w.r.t. the parameters "
          "(new; `backward=\"bptt\"`: autodiff through `lax.scan`), which old could not do.", "", ""]
    rows = []
    for r in rec["rows"]:
        ms, tm = r["ms"], r["temp_mib"]
        rows.append([r["cell"], r["I"], r["H"], r["T"], r["B"], r["scan"], r["chunk_size"],
                     f"{ms['old']:.2f}", f"{ms['new']:.2f}", f"{r['old_over_new']:.2f}", f"{ms['plain_a']:.2f}",
                     f"{r['old_over_plain_a']:.2f}", *(f"{tm[m]:.1f}" if tm[m] is not None else "-" for m in
                                                        ("old", "new", "plain_a")),
                     f"{ms['jvp_new']:.2f}", f"{ms['jvp_bptt']:.2f}"])
    md.append(markdown_table(["cell", "I", "H", "T", "B", "scan", "chunk", "old ms", "new ms", "×", "plain (a) ms",
                              "× plain", "temp MiB old", "new", "plain (a)", "jvp ms", "jvp bptt ms"],
                             rows, align="lrrrrll" + "r" * 10))
    xs = [r["old_over_new"] for r in rec["rows"]]
    xa = [r["old_over_plain_a"] for r in rec["rows"]]
    gmean = lambda v: float(np.exp(np.mean(np.log(v))))
    md += ["", f"old / new: {min(xs):.2f}–{max(xs):.2f} (geometric mean {gmean(xs):.3f}); old / plain (a): "
               f"{min(xa):.2f}–{max(xa):.2f} (geometric mean {gmean(xa):.3f}). Largest gradient difference "
               "to old (relative to the largest entry): new "
               f"{max(r['max_rel_diff_vs_old']['new'] for r in rec['rows']):.1e}, plain (a) "
               f"{max(r['max_rel_diff_vs_old']['plain_a'] for r in rec['rows']):.1e}."]
    if rec.get("hlo"):
        differ = lambda h: ", ".join(f"{k} {a}→{b}" for k, (a, b) in h["differ"].items()) or "nothing"
        md += ["", "The compiled gradient programs, old vs new (HLO instructions of `jit(grad)` after XLA's passes): "
               + "; ".join(f"{h['cell']} {h['scan']} T={h['T']} B={h['B']}: {h['ops_old']} vs {h['ops_new']}, "
                           f"differing only in {differ(h)}" for h in rec["hlo"]) + "."]
    save_json(out / "forward-mode.json", rec)
    (out / "forward-mode.md").write_text("\n".join(md) + "\n")


def main(argv=None):
    a = argparse.ArgumentParser()
    a.add_argument("outdir")
    a.add_argument("--quick", action="store_true")
    a.add_argument("--repeats", type=int, default=7)
    a.add_argument("--render", action="store_true", help="re-render OUTDIR/forward-mode.json")
    a.add_argument("--hlo-only", action="store_true", help="add the HLO comparison to OUTDIR/forward-mode.json")
    args = a.parse_args(argv)
    out = Path(args.outdir)
    if args.render:
        return render(json.loads((out / "forward-mode.json").read_text()), out)
    if args.hlo_only:  # the timings kept; the compiled programs compared (a few compiles, no timing)
        rec = json.loads((out / "forward-mode.json").read_text())
        rec["hlo"] = [hlo_ops(*g, old=old_module()) for g in HLO_POINTS]
        return render(rec, out)
    out.mkdir(parents=True, exist_ok=True)
    old, plain = old_module(), plain_route_a()
    rows, start = [], time.perf_counter()
    grid = QUICK if args.quick else GRID
    for g in grid:
        rows.append(point(*g, repeats=args.repeats, old=old, plain=plain))
        print(json.dumps(rows[-1]), flush=True)
    hlo = [hlo_ops(*g, old=old) for g in HLO_POINTS]
    render({"rows": rows, "hlo": hlo, "repeats": args.repeats, "old_rev": OLD_REV,
            "wall_s": time.perf_counter() - start,
            "provenance": provenance("python experiments/history/forward_mode_bench.py "
                                     + " ".join(sys.argv[1:] if argv is None else argv))}, out)


if __name__ == "__main__":
    main()
