"""``backward="auto"`` on cells with 1×1 Jacobian blocks (the structured cells at head size 1)
before and after its CPU rule (``bppsa.plan.calibration.choose_backward``): the training step of BPTT and of
the sequential forward + BPPSA backward at each point, what ``auto`` picked before (the tree of
``--before``, extracted by ``git archive`` into a temporary folder; only its plan is asked) and
picks now, and the shipped CPU model's predictions (the reason it picked BPTT).

Points: the diagonal GRU of the pararnn-torch comparison (``experiments/extensions/pararnn_peer.py``:
``gru_diag``, BlockGRU(12, H, 1, hidden_bias=False) with the peer's weights and inputs) at H = 20,
64, 256 and (T, B) = (1034, 32), (2048, 8); BlockGRU and BlockRNN at head size 1 at smaller and
longer shapes; and controls the rule leaves to the model (BlockLSTM at head size 1: 2×2 blocks;
BlockGRU with heads of 4 and 8). The training step: ``jax.jit(jax.value_and_grad(loss))``, loss
Σ H ⊙ R (R fixed N(0, 1)); one core (``--core``), XLA single-threaded, float32, both methods timed
interleaved (``bppsa.host.time_interleaved``, median of 7 rounds after one warm-up call).

    python experiments/history/diagonal_auto_probe.py OUTDIR [--before 11f64d0] [--core 0]
        # writes OUTDIR/diagonal-auto.{json,md}; about 2.5 min on a 2-core CPU (--render: the .md alone)
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
# (cell, head size, I, H, T, B); "gru_diag": the pararnn-torch comparison's diagonal GRU
POINTS = ([("gru_diag", 1, 12, H, T, B) for T, B in ((1034, 32), (2048, 8)) for H in (20, 64, 256)]
          + [("gru", 1, 16, H, T, B) for H, T, B in ((8, 64, 4), (20, 100, 1), (64, 1024, 1), (20, 517, 16),
                                                      (128, 256, 4), (20, 10000, 1), (8, 1000, 2))]
          + [("rnn", 1, 16, H, T, B) for H, T, B in ((20, 1034, 8), (64, 1024, 4), (64, 4096, 1))]
          + [("lstm", 1, 16, 20, 1034, 8), ("lstm", 1, 16, 64, 1024, 4), ("gru", 4, 16, 64, 1024, 8),
             ("gru", 8, 16, 64, 1024, 8)])


def _cell(kind, k, I, H):
    from bppsa import structured

    if kind == "gru_diag":
        return structured.BlockGRU(I, H, k, hidden_bias=False)
    return {"gru": structured.BlockGRU, "rnn": structured.BlockRNN, "lstm": structured.BlockLSTM}[kind](I, H, k)


def picks(points: list) -> list:
    """``backward="auto"``'s (backward, scan) per point, in the bppsa this process imports."""
    import jax
    import jax.numpy as jnp

    import bppsa

    print("bppsa from", Path(bppsa.__file__).parent, flush=True)
    out = []
    for kind, k, I, H, T, B in points:
        cell = _cell(kind, k, I, H)
        plan = bppsa.Options(backward="auto").plan(cell, jax.ShapeDtypeStruct((T, B, I), jnp.float32),
                                                   jax.ShapeDtypeStruct((B, cell.state_size), jnp.float32))
        out.append([plan.backward, plan.scan])
    return out


def child(points: list) -> list:
    """In a child pinned to one core: each point's two training steps, interleaved."""
    import warnings

    import jax
    import jax.numpy as jnp
    import numpy as np

    import bppsa
    from bppsa import host
    from bppsa.plan import calibration
    from experiments.extensions.pararnn_equations import bppsa_cell, make_point

    warnings.simplefilter("ignore")
    model = calibration.shipped_cost_model("cpu")
    rows = []
    for (kind, k, I, H, T, B), pick in zip(points, picks(points), strict=True):
        cell = _cell(kind, k, I, H)
        if kind == "gru_diag":  # the peer's weights and inputs, in bppsa's parameter layout
            params, xs, h0, R = make_point("gru_diag", T, B, I, H)
            p = {name: jnp.asarray(v) for name, v in bppsa_cell("gru_diag", I, H)[1](params).items()}
            xs, h0, R = jnp.asarray(xs), jnp.asarray(h0), jnp.asarray(R)
        else:
            p = cell.init(jax.random.key(0))
            rng = np.random.default_rng(0)
            xs, s0, R = (jnp.asarray(rng.standard_normal(s).astype(np.float32))
                         for s in ((T, B, I), (B, cell.state_size), (T, B, H)))
            h0 = cell.unflatten_state(0.5 * s0)
        s0 = cell.flatten_state(h0)
        # auto's plan is the plan of the method it picks: its time is that method's
        assert bppsa.Options(backward="auto").plan(cell, xs, s0) == bppsa.Options(backward=pick[0]).plan(cell, xs, s0)
        fns = {}
        for backward in ("bptt", "bppsa"):
            loss = lambda p, xs, h0, R, b=backward: jnp.vdot(cell.hidden(bppsa.rnn(cell, p, xs, h0, backward=b)), R)  # noqa: E731
            f = jax.jit(jax.value_and_grad(loss))
            jax.block_until_ready(f(p, xs, h0, R))
            fns[backward] = lambda f=f: f(p, xs, h0, R)
        stats = host.time_interleaved(fns, repeats=7, warmup=1, block=2)
        predicted = model.predict(cell, T, B, jnp.float32)
        rows.append({"point": [kind, k, I, H, T, B], "ms": {b: 1e3 * s["median"] for b, s in stats.items()},
                     "after": pick[0], "model_ms": {m: 1e3 * v for m, v in predicted.items()}})
        print(rows[-1]["point"], {b: round(v, 2) for b, v in rows[-1]["ms"].items()}, pick[0], flush=True)
    return rows


def markdown(record: dict) -> str:
    out = ["# `backward=\"auto\"` on cells with 1×1 Jacobian blocks: before and after its CPU rule\n",
           f"{record['provenance']}\n",
           f"Before: commit {record['before_commit']}'s plan (the shipped CPU model); after: this tree's "
           "(`bppsa.plan.calibration.choose_backward`: on CPU, one device, 1×1 Jacobian blocks, the scan left open → the "
           "elementwise BPPSA). Training step (`jax.value_and_grad` of Σ H ⊙ R), ms: BPTT = `backward=\"bptt\"` "
           "(autodiff through `lax.scan`), BPPSA = `backward=\"bppsa\"` (the sequential forward, then the "
           "sequential scan over cache-sized chunks of the Jacobians' diagonals). auto / best: the time of the "
           "method auto picks over the faster one's. Model: the shipped CPU model's predicted backward ms for BPTT "
           "and for its cheaper BPPSA (its features count formed S×S Jacobians and their products). gru_diag: the "
           "pararnn-torch comparison's diagonal GRU (BlockGRU(12, H, 1, hidden_bias=False), the peer's weights); "
           "k: the head size (lstm k = 1: 2×2 blocks of (h, c)).\n",
           "| cell | k | I, H, T, B | BPTT ms | BPPSA ms | BPTT / BPPSA | auto before | auto / best before | "
           "auto after | auto / best after | model BPTT ms | model BPPSA ms |",
           "|---|---:|---|---:|---:|---:|---|---:|---|---:|---:|---:|"]
    diag = [r for r in record["rows"] if r["point"][0] != "lstm" and r["point"][1] == 1]
    ratios = [r["ms"]["bptt"] / r["ms"]["bppsa"] for r in diag]
    right = {w: sum(r["ms"][r[w]] == min(r["ms"].values()) for r in record["rows"]) for w in ("before", "after")}
    out.insert(3, f"1×1 blocks (gru_diag, gru and rnn at k = 1): BPTT / BPPSA {min(ratios):.2f}-{max(ratios):.2f} at "
                  f"all {len(diag)} points; auto picked BPTT at {sum(r['before'] == 'bptt' for r in diag)} of them "
                  f"before and BPPSA at {sum(r['after'] == 'bppsa' for r in diag)} after. The faster method at "
                  f"{right['before']} of {len(record['rows'])} points before, {right['after']} after.\n")
    for r in record["rows"]:
        kind, k, I, H, T, B = r["point"]
        ms, best = r["ms"], min(r["ms"].values())
        model = r["model_ms"]
        out.append(f"| {kind} | {k} | {I}, {H}, {T}, {B} | {ms['bptt']:.2f} | {ms['bppsa']:.2f} | "
                   f"{ms['bptt'] / ms['bppsa']:.2f} | {r['before']} | {ms[r['before']] / best:.2f} | {r['after']} | "
                   f"{ms[r['after']] / best:.2f} | {model['bptt']:.2f} | "
                   f"{min(model['bppsa'], model.get('bppsa_sequential', float('inf'))):.2f} |")
    return "\n".join(out) + "\n"


def _before_picks(commit: str) -> list:
    """``picks`` in the bppsa of ``commit`` (``git archive`` into a temporary folder, no checkout)."""
    with tempfile.TemporaryDirectory(prefix="diagonal-auto-before-") as tmp:
        archive = subprocess.run(["git", "archive", commit, "bppsa"], check=True, capture_output=True, cwd=REPO).stdout
        subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
        return _run(["-c", _CALL.format(fn="picks"), __file__, json.dumps(POINTS)], tmp, Path(tmp))


_CALL = ("import importlib.util, json, sys; spec = importlib.util.spec_from_file_location('probe', sys.argv[1]); "
         "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m); "
         "print('RESULT ' + json.dumps(m.{fn}(json.loads(sys.argv[2]))))")


def _run(args: list, path: str, cwd: Path, prefix: tuple = ()) -> list:
    env = dict(os.environ, XLA_FLAGS="--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1",
               PYTHONPATH=os.pathsep.join([path, str(REPO)]))
    proc = subprocess.run([*prefix, sys.executable, *args], env=env, capture_output=True, text=True, cwd=cwd)
    if proc.returncode:
        raise RuntimeError(f"the child failed:\n{proc.stderr[-3000:]}")
    print(proc.stdout, end="", flush=True)
    return json.loads(next(line for line in proc.stdout.splitlines() if line.startswith("RESULT "))[7:])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("outdir", type=Path)
    ap.add_argument("--before", default="11f64d0", help="the commit whose auto is 'before'")
    ap.add_argument("--core", type=int, default=0)
    ap.add_argument("--render", action="store_true", help="rewrite OUTDIR's .md from its .json, no run")
    a = ap.parse_args()
    if a.render:
        record = json.loads((a.outdir / "diagonal-auto.json").read_text())
        (a.outdir / "diagonal-auto.md").write_text(markdown(record))
        return
    t0 = time.time()
    before = _before_picks(a.before)
    rows = _run(["-c", _CALL.format(fn="child"), __file__, json.dumps(POINTS)], str(REPO), REPO,
                ("taskset", "-c", str(a.core)))
    for r, b in zip(rows, before, strict=True):
        r["before"] = b[0]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO).stdout
    dirty = subprocess.run(["git", "status", "--porcelain", "bppsa"], capture_output=True, text=True, cwd=REPO).stdout
    record = {"provenance": f"`python experiments/history/diagonal_auto_probe.py {' '.join(sys.argv[1:])}` — "
                            f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, commit {commit.strip()}"
                            f"{' with uncommitted changes to bppsa/' if dirty.strip() else ''}, "
                            f"{platform.processor() or platform.machine()}, one core (core {a.core}), XLA "
                            f"single-threaded, float32, medians of 7 interleaved rounds, {time.time() - t0:.0f} s",
              "before_commit": a.before, "rows": rows}
    a.outdir.mkdir(parents=True, exist_ok=True)
    (a.outdir / "diagonal-auto.json").write_text(json.dumps(record, indent=1))
    (a.outdir / "diagonal-auto.md").write_text(markdown(record))
    print(markdown(record))


if __name__ == "__main__":
    main()
