"""The measurements behind the sequential loop's rule for elementwise steps (``bppsa.plan.rules``'s
``_elementwise_loop``: the structured cells at head size 1): for each point, the loop's four
forms, the input product hoisted before the loop (H) or computed in each step (L), at unroll 1
and 2, timed interleaved in one process.

- ``hand``: BlockGRU's equations in a plain ``lax.scan`` with autodiff (W_h's gate rows and the
  gates' biases made before the loop), the training step (``jax.value_and_grad`` of Σ H ⊙ R);
- ``step`` / ``fwd``: ``bppsa.rnn`` of BlockGRU, BlockLSTM or BlockRNN with the plan's hoisting
  forced (``bppsa.plan.rules.hoist_inputs`` replaced in this process) and ``unroll=`` given, the training
  step with ``backward="bptt"`` (autodiff through the loop) or the forward alone with
  ``backward="bppsa"`` (the loop a BPPSA backward follows).

One core (``--core``), XLA single-threaded, float32, median of 7 rounds after one warm-up call.

    python experiments/history/elementwise_rule_probe.py OUTDIR [--core 0]
        # writes OUTDIR/elementwise-rule.{json,md}; about 6 min on a 2-core CPU
"""

import argparse
import importlib.util
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

# (mode, cell, I, H, T, B)
POINTS = ([("hand", "gru", 16, H, T, B) for H, T, B in (
    (64, 256, 1), (64, 1024, 1), (64, 4096, 1), (128, 1024, 1), (8, 1024, 2), (64, 1024, 2), (20, 517, 4),
    (16, 2000, 4), (32, 1024, 4), (40, 1024, 4), (48, 1024, 4), (64, 512, 4), (128, 256, 4), (16, 16384, 4),
    (20, 1034, 8), (32, 1024, 8), (20, 8192, 8), (64, 4096, 8), (20, 517, 16), (20, 200, 32), (20, 1034, 32))]
    + [(mode, cell, 16, H, T, B) for mode in ("step", "fwd") for cell, H, T, B in (
        ("lstm", 20, 1034, 8), ("lstm", 32, 1024, 4), ("lstm", 64, 1024, 2), ("lstm", 64, 4096, 8),
        ("lstm", 16, 1024, 1), ("rnn", 20, 1034, 8), ("rnn", 64, 1024, 4), ("rnn", 128, 1024, 4),
        ("rnn", 64, 4096, 8), ("rnn", 64, 4096, 1))])


def child(points: list) -> list:
    """In a child pinned to one core: each point's four loop forms, interleaved."""
    import warnings

    import jax
    import jax.numpy as jnp
    import numpy as np

    import bppsa
    import bppsa.plan.rules
    from bppsa import host, structured

    warnings.simplefilter("ignore")
    spec = importlib.util.spec_from_file_location("elementwise_loop_bench", Path(__file__).with_name(
        "elementwise_loop_bench.py"))  # its hand-written BlockGRU scan
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    make = {"gru": structured.BlockGRU, "lstm": structured.BlockLSTM, "rnn": structured.BlockRNN}
    rows = []
    for mode, kind, I, H, T, B in points:
        cell = make[kind](I, H, 1)
        p = cell.init(jax.random.key(0))
        rng = np.random.default_rng(0)
        xs, s0, R = (jnp.asarray(rng.standard_normal(s).astype(np.float32))
                     for s in ((T, B, I), (B, cell.state_size), (T, B, H)))
        h0 = cell.unflatten_state(0.5 * s0)

        fns = {}
        for hoist in (True, False):
            for u in (1, 2):
                if mode == "hand":
                    loss = lambda p, xs, h0, R, u=u, hoist=hoist: jnp.vdot(bench.hand_gru_states(p, xs, h0, u, hoist), R)  # noqa: E731
                else:
                    bppsa.plan.rules.hoist_inputs = lambda *a, hoist=hoist, **k: hoist  # read when the plan is made
                    backward = "bptt" if mode == "step" else "bppsa"
                    loss = lambda p, xs, h0, R, u=u, b=backward: jnp.vdot(  # noqa: E731
                        cell.hidden(bppsa.rnn(cell, p, xs, h0, backward=b, unroll=u)), R)
                f = jax.jit(loss if mode == "fwd" else jax.value_and_grad(loss))
                jax.block_until_ready(f(p, xs, h0, R))  # traced and compiled here, under this hoist
                fns[f"{'H' if hoist else 'L'}u{u}"] = lambda f=f: f(p, xs, h0, R)
        stats = host.time_interleaved(fns, repeats=7, warmup=1, block=2)
        rows.append({"point": [mode, kind, I, H, T, B], "MiB": T * B * cell.gates * H * 4 / 2 ** 20,
                     "ms": {k: 1e3 * s["median"] for k, s in stats.items()}})
        print(rows[-1]["point"], {k: round(v, 3) for k, v in rows[-1]["ms"].items()}, flush=True)
    return rows


def markdown(record: dict) -> str:
    out = ["# The elementwise loop's rule: the loop's four forms per point\n", f"{record['provenance']}\n",
           "H: the input product hoisted before the loop; L: in each step; u1/u2: the unroll. hand: BlockGRU's "
           "equations in a plain `lax.scan`, training step; step: `bppsa.rnn(backward=\"bptt\")` training step "
           "(autodiff through the loop); fwd: the forward alone before a BPPSA backward (`backward=\"bppsa\"`, "
           "the loss only). MiB: the hoisted inputs, T·B·G·H float32. Best per row in bold.\n",
           "| what | cell | I, H, T, B | B·G·H | MiB | Hu1 ms | Hu2 ms | Lu1 ms | Lu2 ms | best |",
           "|---|---|---|---:|---:|---:|---:|---:|---:|---|"]
    gates = {"gru": 3, "lstm": 4, "rnn": 1}
    for r in record["rows"]:
        mode, kind, I, H, T, B = r["point"]
        best = min(r["ms"], key=r["ms"].__getitem__)
        cells = [f"**{r['ms'][k]:.3f}**" if k == best else f"{r['ms'][k]:.3f}" for k in ("Hu1", "Hu2", "Lu1", "Lu2")]
        out.append(f"| {mode} | {kind} | {I}, {H}, {T}, {B} | {B * gates[kind] * H} | {r['MiB']:.2f} | "
                   + " | ".join(cells) + f" | {best} |")
    return "\n".join(out) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("outdir", type=Path)
    ap.add_argument("--core", type=int, default=0)
    a = ap.parse_args()
    repo = Path(__file__).resolve().parents[2]
    env = dict(os.environ, XLA_FLAGS="--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1",
               PYTHONPATH=str(repo))
    code = ("import importlib.util, json, sys; spec = importlib.util.spec_from_file_location('probe', sys.argv[1]); "
            "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m); "
            "print('RESULT ' + json.dumps(m.child(json.loads(sys.argv[2]))))")
    t0 = time.time()
    proc = subprocess.run(["taskset", "-c", str(a.core), sys.executable, "-c", code, __file__, json.dumps(POINTS)],
                          env=env, capture_output=True, text=True, cwd=repo)
    if proc.returncode:
        raise RuntimeError(f"the child failed:\n{proc.stderr[-3000:]}")
    print(proc.stdout, end="", flush=True)
    rows = json.loads(next(line for line in proc.stdout.splitlines() if line.startswith("RESULT "))[7:])
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=repo).stdout
    record = {"provenance": f"`python experiments/history/elementwise_rule_probe.py {' '.join(sys.argv[1:])}` — "
                            f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, commit {commit.strip()}, "
                            f"{platform.processor() or platform.machine()}, one core (core {a.core}), XLA "
                            f"single-threaded, float32, medians of 7 interleaved rounds, {time.time() - t0:.0f} s",
              "rows": rows}
    a.outdir.mkdir(parents=True, exist_ok=True)
    (a.outdir / "elementwise-rule.json").write_text(json.dumps(record, indent=1))
    (a.outdir / "elementwise-rule.md").write_text(markdown(record))
    print(markdown(record))


if __name__ == "__main__":
    main()
