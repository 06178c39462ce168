"""The diagonal GRU (pararnn's cell, ``structured.BlockGRU(head_size=1)``) before and after the
elementwise rework: its Newton training step, the forward alone, the sequential forward + BPPSA
backward and BPTT, at the three diagonal points of the pararnn-torch comparison, and BlockGRU's
sequential (BPTT) step against hand-written ``lax.scan``s of the same equations.

Each tree runs in a child process pinned to one core, XLA single-threaded, float32; within a
child every variant is timed interleaved (``bppsa.host.time_interleaved``, median of rounds after
one warm-up call each). The trees run one after the other (not interleaved): read the ratios.
``--before COMMIT`` is checked out into a temporary git worktree; "after" is this checkout.

    python experiments/history/diagonal_newton_bench.py OUTDIR [--before d442636] [--quick]
        # writes OUTDIR/diagonal-newton.{json,md}; about 12 min on a 2-core CPU (quick: 2 min)

Also the parameter gradients' input product, ``einsum("tbi,tbg->ig")`` against
``bppsa.cells.flat_outer`` (one flat GEMM), in the after tree.
"""

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
POINTS = {"H=20 T=1034 B=32": (20, 1034, 32), "H=64 T=1034 B=32": (64, 1034, 32), "H=256 T=2048 B=8": (256, 2048, 8)}
QUICK_POINTS = {"H=8 T=64 B=4": (8, 64, 4)}
SEQ_SHAPE = (16, 64, 4096, 8)  # BlockGRU sequential: I, H, T, B (the shape)
OUTER_SHAPES = ((1034, 32, 12, 192), (1034, 32, 20, 60), (256, 8, 128, 384), (517, 16, 24, 60), (2000, 4, 16, 48))


def child(tree: str, quick: bool, repeats: int) -> dict:
    """Runs in the child: ``tree`` first on sys.path (its bppsa), the measurements as a dict."""
    sys.path.insert(0, tree)
    import warnings

    import jax
    import jax.numpy as jnp
    import numpy as np

    import bppsa
    from bppsa import host, structured
    from experiments.extensions.pararnn_equations import bppsa_cell, make_point

    assert bppsa.__file__.startswith(tree), bppsa.__file__
    warnings.simplefilter("ignore")
    out: dict = {"newton": [], "sequential": [], "outer": []}
    for name, (H, T, B) in (QUICK_POINTS if quick else POINTS).items():
        params, xs, h0, R = make_point("gru_diag", T, B, 12, H)
        cell, to_params, _ = bppsa_cell("gru_diag", 12, H)
        p = {k: jnp.asarray(v) for k, v in to_params(params).items()}
        args = (p, jnp.asarray(xs), jnp.asarray(h0), jnp.asarray(R))
        variants = {"newton step": (True, {"forward": "newton"}), "newton fwd": (False, {"forward": "newton"}),
                    "seq+bppsa step": (True, {}), "bptt step": (True, {"backward": "bptt"})}
        fns, compile_s = {}, {}
        for v, (grad, kw) in variants.items():
            kw = {"backward": "bppsa", **kw}
            loss = lambda p, xs, h0, R, kw=kw: jnp.vdot(bppsa.rnn(cell, p, xs, h0, **kw), R)  # noqa: E731
            f = jax.jit(jax.value_and_grad(loss) if grad else loss)
            t0 = time.perf_counter()
            jax.block_until_ready(f(*args))
            compile_s[v] = time.perf_counter() - t0
            fns[v] = lambda f=f: f(*args)
        info = jax.jit(lambda p, xs, h0: bppsa.rnn(cell, p, xs, h0, forward="newton", return_info=True)[1])(*args[:3])
        stats = host.time_interleaved(fns, repeats=repeats, warmup=1, block=2)
        out["newton"].append({"point": name, "iterations": int(info.iterations), **{
            f"{v} ms": 1e3 * stats[v]["median"] for v in fns}, **{f"{v} compile s": compile_s[v] for v in fns}})
        print(tree, name, {k: round(v, 2) for k, v in out["newton"][-1].items() if k.endswith("ms")}, flush=True)

    I, H, T, B = (4, 8, 64, 2) if quick else SEQ_SHAPE
    cell = structured.BlockGRU(I, H, 1)
    p = cell.init(jax.random.key(0))
    rng = np.random.default_rng(0)
    xs, h0, R = (jnp.asarray(rng.standard_normal(s).astype(np.float32)) for s in ((T, B, I), (B, H), (T, B, H)))

    def hand_states(p, xs, h0, unroll):  # the same equations, the input product hoisted, the gates split once
        gx = jnp.split(xs @ p["W_x"] + p["b_x"], 3, axis=-1)
        w, bh = p["W_h"][:, 0, :].T, p["b_h"].reshape(3, H)

        def step(h, g):
            r = jax.nn.sigmoid(g[0] + h * w[0] + bh[0])
            z = jax.nn.sigmoid(g[1] + h * w[1] + bh[1])
            h = (1 - z) * jnp.tanh(g[2] + r * (h * w[2] + bh[2])) + z * h
            return h, h
        return jax.lax.scan(step, h0, tuple(gx), unroll=unroll)[1]

    losses = {f"hand-written unroll {u}": (lambda p, u=u: jnp.vdot(hand_states(p, xs, h0, u), R)) for u in (1, 2, 4, 8)}
    losses["bppsa bptt"] = lambda p: jnp.vdot(bppsa.rnn(cell, p, xs, h0, backward="bptt"), R)
    losses["bppsa auto"] = lambda p: jnp.vdot(bppsa.rnn(cell, p, xs, h0, backward="auto"), R)
    fns = {}
    for name, loss in losses.items():
        for what, f in (("step", jax.jit(jax.value_and_grad(loss))), ("fwd", jax.jit(loss))):
            jax.block_until_ready(f(p))
            fns[f"{name} {what}"] = lambda f=f: f(p)
    stats = host.time_interleaved(fns, repeats=repeats, warmup=1, block=2)
    out["sequential"] = [{"variant": k, "ms": 1e3 * s["median"]} for k, s in stats.items()]
    print(tree, {r["variant"]: round(r["ms"], 2) for r in out["sequential"]}, flush=True)

    if hasattr(__import__("bppsa.cells").cells, "flat_outer"):
        from bppsa.cells import flat_outer
        fns = {}
        for shape in OUTER_SHAPES[:1] if quick else OUTER_SHAPES:
            T, B, m, n = shape
            a, b = (jnp.asarray(rng.standard_normal(s).astype(np.float32)) for s in ((T, B, m), (T, B, n)))
            e = jax.jit(lambda a, b: jnp.einsum("tbi,tbg->ig", a, b))
            f = jax.jit(flat_outer)
            np.testing.assert_allclose(e(a, b), f(a, b), rtol=1e-3, atol=1e-3)
            fns[f"{shape} einsum"], fns[f"{shape} flat"] = (lambda e=e, a=a, b=b: e(a, b)), (lambda f=f, a=a, b=b: f(a, b))
        for k in fns:
            jax.block_until_ready(fns[k]())
        stats = host.time_interleaved(fns, repeats=repeats, warmup=1, block=3)
        out["outer"] = [{"shape": k.rsplit(" ", 1)[0], "einsum ms": 1e3 * stats[f"{k.rsplit(' ', 1)[0]} einsum"]["median"],
                         "flat ms": 1e3 * stats[k]["median"]} for k in fns if k.endswith("flat")]
        out["measures"] = _measures(quick, repeats)
    return out


def _measures(quick: bool, repeats: int) -> list:
    """An iterate's per-step maxima of its residual and its last step, in the tolerance's units
    (as bppsa.forward.newton's iteration measures them): two max reductions against one variadic one."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax import lax

    from bppsa import host

    def over(d, ref):  # bppsa.forward.newton's |d| / (atol + rtol |ref|), 0 where d = 0, inf where NaN
        r = jnp.where(d == 0, 0.0, jnp.abs(d) / (1e-5 + 1e-5 * jnp.abs(ref)))
        return jnp.where(jnp.isnan(r), jnp.inf, r)

    rows = []
    for T, B, S in ((64, 4, 8),) if quick else ((1034, 32, 20), (1034, 32, 64), (2048, 8, 256)):
        rng = np.random.default_rng(0)
        Hn, H, F = (jnp.asarray(rng.standard_normal((T, B, S)).astype(np.float32)) for _ in range(3))
        t = jnp.arange(T)[:, None, None]

        def separate(Hn, H, F, t=t, T=T):
            per_step = lax.optimization_barrier(jnp.max(over(Hn - F, F).reshape(T, -1), axis=1))
            return per_step, jnp.max(over(jnp.where(t > 3, Hn - H, 0.0), Hn), initial=0.0)

        def variadic(Hn, H, F, t=t):
            terms = (over(Hn - F, F), over(jnp.where(t > 3, Hn - H, 0.0), Hn))
            init = (jnp.float32(-jnp.inf),) * 2
            r, d = lax.reduce(terms, init, lambda a, b: (jnp.maximum(a[0], b[0]), jnp.maximum(a[1], b[1])), (1, 2))
            return r, jnp.max(d, initial=0.0)

        a, b = jax.jit(separate), jax.jit(variadic)
        np.testing.assert_array_equal(a(Hn, H, F)[0], b(Hn, H, F)[0])
        fns = {"separate": lambda: a(Hn, H, F), "variadic": lambda: b(Hn, H, F)}
        for f in fns.values():
            jax.block_until_ready(f())
        stats = host.time_interleaved(fns, repeats=repeats, warmup=1, block=3)
        rows.append({"shape": [T, B, S], **{f"{k} ms": 1e3 * v["median"] for k, v in stats.items()}})
    return rows


def _run_tree(tree: Path, quick: bool, repeats: int, core: int) -> dict:
    env = dict(os.environ, XLA_FLAGS="--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1",
               PYTHONPATH=str(tree))
    # this file by its path (the before tree has none), bppsa and the harness from the tree
    code = ("import importlib.util, json, sys; spec = importlib.util.spec_from_file_location('bench', sys.argv[4]); "
            "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m); "
            "print('RESULT ' + json.dumps(m.child(sys.argv[1], sys.argv[2] == '1', int(sys.argv[3]))))")
    proc = subprocess.run(["taskset", "-c", str(core), sys.executable, "-c", code, str(tree), "1" if quick else "0",
                           str(repeats), __file__], env=env, capture_output=True, text=True, cwd=tree)
    if proc.returncode:
        raise RuntimeError(f"the child for {tree} failed:\n{proc.stderr[-3000:]}")
    print(proc.stdout, end="", flush=True)
    return json.loads(next(line for line in proc.stdout.splitlines() if line.startswith("RESULT "))[7:])


def _commit(tree: Path) -> str:
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=tree).stdout.strip()


def markdown(record: dict) -> str:
    b, a = record["before"], record["after"]
    out = [f"# The diagonal GRU's Newton step: before ({record['before_commit']}) and after ({record['after_commit']})\n",
           f"{record['provenance']}\n",
           "## Newton training step, pararnn's diagonal GRU (I = 12, pararnn's initialisation), ms\n",
           "iterations: the Newton iterations bppsa took (the same before and after). Ratio: after / before.\n",
           "| point | iterations | newton step before | after | ratio | newton fwd before | after | ratio | "
           "seq+bppsa before | after | ratio | bptt before | after | compile s newton step before / after |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for rb, ra in zip(b["newton"], a["newton"], strict=True):
        cells = [rb["point"], str(ra["iterations"])]
        for v in ("newton step", "newton fwd", "seq+bppsa step"):
            cells += [f"{rb[v + ' ms']:.2f}", f"{ra[v + ' ms']:.2f}", f"{ra[v + ' ms'] / rb[v + ' ms']:.2f}"]
        cells += [f"{rb['bptt step ms']:.2f}", f"{ra['bptt step ms']:.2f}",
                  f"{rb['newton step compile s']:.2f} / {ra['newton step compile s']:.2f}"]
        out.append("| " + " | ".join(cells) + " |")
    I, H, T, B = SEQ_SHAPE
    out += ["", f"## BlockGRU(head_size=1) sequential, I = {I}, H = {H}, T = {T}, B = {B}: training step "
            "(value_and_grad) and forward, ms\n",
            "Hand-written: the same equations in a plain `lax.scan` with autodiff, the input product hoisted "
            "and the gates split before the loop, at unroll 1, 2, 4 and 8 (the best a JAX user would write; "
            "independent of the tree).\n",
            "| variant | before | after |", "|---|---:|---:|"]
    for rb, ra in zip(b["sequential"], a["sequential"], strict=True):
        out.append(f"| {ra['variant']} | {rb['ms']:.2f} | {ra['ms']:.2f} |")
    if a["outer"]:
        out += ["", "## Parameter gradients' input product (T, B, m), (T, B, n) -> (m, n), after tree, ms\n",
                "| (T, B, m, n) | einsum tbi,tbg->ig | flat GEMM (cells.flat_outer) | einsum / flat |",
                "|---|---:|---:|---:|"]
        for r in a["outer"]:
            out.append(f"| {r['shape']} | {r['einsum ms']:.3f} | {r['flat ms']:.3f} | {r['einsum ms'] / r['flat ms']:.2f} |")
    if a.get("measures"):
        out += ["", "## An iterate's per-step maxima (residual and last step), after tree, ms\n",
                "bppsa.forward.newton's two measures of an iterate: two max reductions (XLA's CPU writes each one's input "
                "out first) against one variadic reduction (its producers fused in).\n",
                "| (T, B, S) | two reductions | one variadic reduction | ratio |", "|---|---:|---:|---:|"]
        for r in a["measures"]:
            out.append(f"| {tuple(r['shape'])} | {r['separate ms']:.2f} | {r['variadic ms']:.2f} | "
                       f"{r['separate ms'] / r['variadic ms']:.2f} |")
    return "\n".join(out) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("outdir", type=Path)
    ap.add_argument("--before", default="d442636", help="the commit measured as 'before'")
    ap.add_argument("--quick", action="store_true", help="one tiny point, a tiny sequential shape")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--core", type=int, default=0)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="diag-newton-before-") as tmp:
        before = Path(tmp) / "tree"
        subprocess.run(["git", "worktree", "add", "-q", "--detach", str(before), a.before], check=True, cwd=REPO)
        try:
            rec_before = _run_tree(before, a.quick, a.repeats, a.core)
            before_commit = _commit(before)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(before)], check=True, cwd=REPO)
    rec_after = _run_tree(REPO, a.quick, a.repeats, a.core)
    record = {"provenance": f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
                            f"{platform.processor() or platform.machine()}, one core (core {a.core}), XLA single-threaded, "
                            f"float32, medians of {a.repeats} interleaved rounds per tree; the trees run one after the other",
              "before_commit": before_commit, "after_commit": _commit(REPO), "before": rec_before, "after": rec_after}
    a.outdir.mkdir(parents=True, exist_ok=True)
    (a.outdir / "diagonal-newton.json").write_text(json.dumps(record, indent=1))
    (a.outdir / "diagonal-newton.md").write_text(markdown(record))
    print(markdown(record))


if __name__ == "__main__":
    main()
