"""The structured cells at head size 1 (elementwise recurrences) in the sequential loop, before
and after: W_h read as the gates' rows (``Cell.loop_params``), the input product hoisted before
the loop or kept in it and the unroll by a rule measured per gate count and per use, BPTT's
autodiff loop or a forward alone (``bppsa.plan.rules.hoist_inputs``, ``bppsa.plan.rules.bptt_unroll``);
against hand-written ``lax.scan``s of BlockGRU's equations.

Each tree runs in a child process pinned to one core, XLA single-threaded, float32; within a
child every variant is timed interleaved (``bppsa.host.time_interleaved``, median of rounds after
one warm-up call each), the data passed as jit arguments. The trees run one after the other (not
interleaved): read the ratios. ``--before COMMIT`` is checked out into a temporary git worktree;
"after" is this checkout. The hand-written scans run in the after tree only (they do not use bppsa).

    python experiments/history/elementwise_loop_bench.py OUTDIR [--before 56d995d] [--quick]
        # writes OUTDIR/elementwise-loop.{json,md}; about 15 min on a 2-core CPU (quick: 1 min)

Variants: bppsa ``backward="bptt"`` and ``backward="bppsa"`` (the sequential forward, then the
backward the plan picks), the training step (``jax.value_and_grad`` of Σ H ⊙ R) and the forward
alone (the loss); hand-written (BlockGRU only): the same equations, W_h's gate rows and the gates'
biases made before the loop, the input product hoisted before the loop (split into the three
gates once) or computed in each step, at unroll 1 and 2.
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
# (cell, I, H, T, B); the first: the never-slower issue's BlockGRU shape
POINTS = (("gru", 16, 64, 4096, 8), ("gru", 16, 64, 4096, 1), ("gru", 16, 64, 4096, 4), ("gru", 12, 20, 1034, 32),
          ("gru", 12, 256, 2048, 8), ("lstm", 16, 64, 4096, 8), ("rnn", 16, 64, 4096, 8))
QUICK_POINTS = (("gru", 4, 8, 64, 2), ("lstm", 4, 8, 64, 2))


def hand_gru_states(p, xs, h0, unroll: int, hoist: bool):
    """BlockGRU(head_size=1)'s states as a JAX user writes its equations: a plain ``lax.scan`` (W_h's
    gate rows and the gates' biases made before it), the input product hoisted before the loop (split
    into the three gates once) or computed in each step; ``p`` is the cell's params."""
    import jax
    import jax.numpy as jnp

    w, bh = p["W_h"][:, 0, :].T, p["b_h"].reshape(3, -1)

    def gates(g, h):
        r = jax.nn.sigmoid(g[0] + h * w[0] + bh[0])
        z = jax.nn.sigmoid(g[1] + h * w[1] + bh[1])
        return (1 - z) * jnp.tanh(g[2] + r * (h * w[2] + bh[2])) + z * h

    if hoist:
        step = lambda h, g: (h := gates(g, h), h)  # noqa: E731
        return jax.lax.scan(step, h0, tuple(jnp.split(xs @ p["W_x"] + p["b_x"], 3, axis=-1)), unroll=unroll)[1]
    step = lambda h, x: (h := gates(jnp.split(x @ p["W_x"] + p["b_x"], 3, axis=-1), h), h)  # noqa: E731
    return jax.lax.scan(step, h0, xs, unroll=unroll)[1]


def child(tree: str, quick: bool, repeats: int) -> dict:
    """Runs in the child: ``tree`` first on sys.path (its bppsa), the measurements as a dict."""
    sys.path.insert(0, tree)
    import warnings

    import jax
    import jax.numpy as jnp
    import numpy as np

    import bppsa
    from bppsa import host, structured

    assert bppsa.__file__.startswith(tree), bppsa.__file__
    warnings.simplefilter("ignore")
    make = {"gru": structured.BlockGRU, "lstm": structured.BlockLSTM, "rnn": structured.BlockRNN}
    rows = []
    for kind, I, H, T, B in QUICK_POINTS if quick else POINTS:
        cell = make[kind](I, H, 1)
        p = cell.init(jax.random.key(0))
        rng = np.random.default_rng(0)
        xs, s0, R = (jnp.asarray(rng.standard_normal(s).astype(np.float32)) for s in ((T, B, I), (B, cell.state_size),
                                                                                      (T, B, H)))
        h0 = cell.unflatten_state(0.5 * s0)

        losses = {f"bppsa {b}": (lambda p, xs, h0, R, b=b: jnp.vdot(cell.hidden(bppsa.rnn(cell, p, xs, h0, backward=b)), R))
                  for b in ("bptt", "bppsa")}
        if kind == "gru" and "hand" in sys.argv[5:]:
            for hoist in (True, False):
                for u in (1, 2):
                    losses[f"hand {'hoisted' if hoist else 'in-loop'} u{u}"] = (
                        lambda p, xs, h0, R, u=u, hoist=hoist: jnp.vdot(hand_gru_states(p, xs, h0, u, hoist), R))
        fns, compile_s = {}, {}
        for name, loss in losses.items():
            for what, f in (("step", jax.jit(jax.value_and_grad(loss))), ("fwd", jax.jit(loss))):
                t0 = time.perf_counter()
                jax.block_until_ready(f(p, xs, h0, R))
                compile_s[f"{name} {what}"] = time.perf_counter() - t0
                fns[f"{name} {what}"] = lambda f=f: f(p, xs, h0, R)
        stats = host.time_interleaved(fns, repeats=repeats, warmup=1, block=2)
        rows.append({"point": [kind, I, H, T, B], "ms": {k: 1e3 * s["median"] for k, s in stats.items()},
                     "compile s": compile_s})
        print(tree, rows[-1]["point"], {k: round(v, 2) for k, v in rows[-1]["ms"].items()}, flush=True)
    return {"rows": rows}


def _run_tree(tree: Path, quick: bool, repeats: int, core: int, hand: bool) -> dict:
    env = dict(os.environ, XLA_FLAGS="--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1",
               PYTHONPATH=str(tree))
    code = ("import importlib.util, json, sys; spec = importlib.util.spec_from_file_location('bench', sys.argv[4]); "
            "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m); "
            "print('RESULT ' + json.dumps(m.child(sys.argv[1], sys.argv[2] == '1', int(sys.argv[3]))))")
    proc = subprocess.run(["taskset", "-c", str(core), sys.executable, "-c", code, str(tree), "1" if quick else "0",
                           str(repeats), __file__] + (["hand"] if hand else []), env=env, capture_output=True,
                          text=True, cwd=tree)
    if proc.returncode:
        raise RuntimeError(f"the child for {tree} failed:\n{proc.stderr[-3000:]}")
    print(proc.stdout, end="", flush=True)
    return json.loads(next(line for line in proc.stdout.splitlines() if line.startswith("RESULT "))[7:])


def _commit(tree: Path) -> str:
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=tree).stdout.strip()


def markdown(record: dict) -> str:
    out = [f"# Elementwise recurrences in the sequential loop: before ({record['before_commit']}) and after "
           f"({record['after_commit']})\n", f"{record['provenance']}\n",
           "The structured cells at head size 1 (`structured.BlockGRU/BlockLSTM/BlockRNN(I, H, 1)`). Training step: "
           "`jax.value_and_grad` of Σ H ⊙ R; fwd: the loss alone. bptt = `bppsa.rnn(backward=\"bptt\")` (autodiff "
           "through the sequential loop: these cells have no analytic adjoint), bppsa = `backward=\"bppsa\"` "
           "(the sequential forward, the BPPSA backward the plan picks). Hand-written: BlockGRU's equations in a "
           "plain `lax.scan` with autodiff, W_h's gate rows made before the loop, the input product hoisted before "
           "the loop (the gates split once) or in each step, unroll 1 or 2. The after tree's rule (`bppsa.plan.rules`): "
           "BPTT keeps the GRU's product in the loop for H >= 48 or B·G·H > 1024, the LSTM's always (unroll 2), "
           "hoists the RNN's; a forward alone (bppsa's) hoists while the T·B·G·H inputs fit in 2 MiB; B = 1 in "
           "the loop: BPTT unrolls twice. Ratio: after / before; "
           "best hand: the fastest hand-written variant; bppsa / hand: the after tree's bptt over it.\n",
           "| cell, I, H, T, B | variant | before ms | after ms | after / before | compile s after |",
           "|---|---|---:|---:|---:|---:|"]
    for rb, ra in zip(record["before"]["rows"], record["after"]["rows"], strict=True):
        name = ", ".join(str(v) for v in ra["point"])
        for v in (v for v in ra["ms"] if v.startswith("bppsa")):
            out.append(f"| {name} | {v} | {rb['ms'][v]:.2f} | {ra['ms'][v]:.2f} | {ra['ms'][v] / rb['ms'][v]:.2f} | "
                       f"{ra['compile s'][v]:.2f} |")
    out += ["", "## Against the hand-written scans (after tree)\n",
            "| cell, I, H, T, B | what | bppsa bptt ms | best hand-written ms (variant) | bppsa / hand | "
            "all hand-written ms |", "|---|---|---:|---:|---:|---|"]
    for ra in record["after"]["rows"]:
        for what in ("step", "fwd"):
            hand = {v[5:-len(what) - 1]: ms for v, ms in ra["ms"].items() if v.startswith("hand") and v.endswith(what)}
            if not hand:
                continue
            best = min(hand, key=hand.__getitem__)
            ours = ra["ms"][f"bppsa bptt {what}"]
            out.append(f"| {', '.join(str(v) for v in ra['point'])} | {what} | {ours:.2f} | {hand[best]:.2f} ({best}) | "
                       f"{ours / hand[best]:.2f} | " + ", ".join(f"{k} {v:.2f}" for k, v in hand.items()) + " |")
    return "\n".join(out) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("outdir", type=Path)
    ap.add_argument("--before", default="56d995d", help="the commit measured as 'before'")
    ap.add_argument("--quick", action="store_true", help="two tiny points")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--core", type=int, default=0)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="elementwise-loop-before-") as tmp:
        before = Path(tmp) / "tree"
        subprocess.run(["git", "worktree", "add", "-q", "--detach", str(before), a.before], check=True, cwd=REPO)
        try:
            rec_before = _run_tree(before, a.quick, a.repeats, a.core, hand=False)
            before_commit = _commit(before)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(before)], check=True, cwd=REPO)
    rec_after = _run_tree(REPO, a.quick, a.repeats, a.core, hand=True)
    command = "python experiments/history/elementwise_loop_bench.py " + " ".join(sys.argv[1:])
    record = {"provenance": f"`{command}` — {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
                            f"{platform.processor() or platform.machine()}, one core (core {a.core}), XLA single-threaded, "
                            f"float32, medians of {a.repeats} interleaved rounds per tree; the trees run one after the other",
              "before_commit": before_commit, "after_commit": _commit(REPO), "before": rec_before, "after": rec_after}
    a.outdir.mkdir(parents=True, exist_ok=True)
    (a.outdir / "elementwise-loop.json").write_text(json.dumps(record, indent=1))
    (a.outdir / "elementwise-loop.md").write_text(markdown(record))
    print(markdown(record))


if __name__ == "__main__":
    main()
