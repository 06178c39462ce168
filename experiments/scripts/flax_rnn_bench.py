"""``nnx.RNN`` against ``bppsa.nn.RNN`` on flax's four cells: one training step's gradient,
with and without ``seq_lengths``, on this machine, float32.

    .venv/bin/python experiments/scripts/flax_rnn_bench.py            # 13 min on a shared 2-core CPU, mostly compiles
    .venv/bin/python experiments/scripts/flax_rnn_bench.py --quick    # one tiny shape, ~1 min (writes under runs/)

Writes ``--out``.json (rows, samples, provenance) and ``--out``.md (default
experiments/results/cpu/flax-rnn). For each flax cell (``nnx.SimpleCell``, ``nnx.GRUCell``,
``nnx.LSTMCell``, ``nnx.OptimizedLSTMCell``) and shape (T, B, I, H), the same cell (the same
Params) is driven by each layer:

    nnx.RNN     ``nnx.RNN(cell)`` (flax's scan, unroll 1; gradients by autodiff through it)
    bppsa       ``bppsa.nn.RNN(cell, backward="bppsa")``
    auto        ``bppsa.nn.RNN(cell, backward="auto")``: its choice is ``Options.resolve``'s for
                the cell bppsa runs (``bppsa.nn.cells.adapt``) at this T, B, float32
    identity    ``bppsa.nn.RNN(cell, backward="bppsa", padding="identity")`` (rows with
                seq_lengths only: padded steps are identity maps, the scan stops at max(seq_lengths))

The timed step is ``jax.jit`` over the module's split state of ``nnx.value_and_grad`` (w.r.t.
the cell's ``nnx.Param``s) of ``experiments.gradient``'s loss with padded steps masked,
L = Σ_{b,t < len_b} ⟨y[b, t], R[b, t]⟩, y (B, T, H) the layer's outputs, R (B, T, H) ~ N(0, 1)
fixed; seq_lengths (B,) uniform in [T/2, T] ("yes" rows) or None ("no"; then the mask is all
ones). Before timing, every layer's outputs (at valid steps) are checked against ``nnx.RNN``'s
(allclose, rtol 1e-4) and its gradient's largest difference from ``nnx.RNN``'s, relative to the
largest entry, is recorded (and must be < 1e-3). Times: :func:`bppsa.host.time_interleaved`
(all layers of a row interleaved in rotated blocks, the compile dropped), median ms.
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import bppsa
from bppsa import nn
from bppsa.host import time_interleaved
from bppsa.nn import cells as flax_cells
from experiments.data.irmas import SHAPES as IRMAS_SHAPES
from experiments.provenance import provenance, save_json
from experiments.tables import markdown_table

CELLS = {"SimpleCell": nnx.SimpleCell, "GRUCell": nnx.GRUCell, "LSTMCell": nnx.LSTMCell,
         "OptimizedLSTMCell": nnx.OptimizedLSTMCell}
IRMAS_HIDDEN = 20  # the paper's IRMAS GRU (experiments/paper_bppsa/configs/irmas_grid.py: hidden_size)
#: (T, B, I, H): a small point, the IRMAS GRU's settings "m" and "l" (features F, frames T of
#: experiments.data.irmas.SHAPES at the grid's B = 16 and 32), a bigger hidden size.
SHAPES = [(100, 16, 32, 32),
          (IRMAS_SHAPES["m"][1], 16, IRMAS_SHAPES["m"][0], IRMAS_HIDDEN),
          (IRMAS_SHAPES["l"][1], 32, IRMAS_SHAPES["l"][0], IRMAS_HIDDEN),
          (256, 8, 128, 128)]
QUICK = [(20, 4, 8, 8)]
LAYERS = {
    "nnx.RNN": lambda cell: nnx.RNN(cell),
    "bppsa": lambda cell: nn.RNN(cell, backward="bppsa"),
    "auto": lambda cell: nn.RNN(cell, backward="auto"),
    "identity": lambda cell: nn.RNN(cell, backward="bppsa", padding="identity"),
}
RTOL, GRAD_TOL = 1e-4, 1e-3


def loss(model, x, lengths, mask, R):
    """experiments.gradient's loss over valid steps: x (B, T, I), lengths (B,) or None, mask (B, T),
    R (B, T, H) -> (loss, masked outputs (B, T, H))."""
    y = model(x, seq_lengths=lengths) * mask[..., None]
    return jnp.vdot(y, R), y


def step_fn(layer, x, lengths, mask, R):
    """A zero-argument callable: the jitted ``((loss, masked outputs), ∂loss/∂Params)`` of
    ``layer`` on these arrays (the outputs come back for the check; they are computed anyway)."""
    graphdef, state = nnx.split(layer)

    @jax.jit
    def step(state, x, lengths, mask, R):
        return nnx.value_and_grad(loss, has_aux=True)(nnx.merge(graphdef, state), x, lengths, mask, R)

    return functools.partial(step, state, x, lengths, mask, R)


def auto_choice(cell, T, B, I) -> str:
    """What ``backward="auto"`` runs for this flax cell at (T, B), float32: "bptt" or "bppsa:<scan>"."""
    opts = bppsa.Options(backward="auto").resolve(flax_cells.adapt(cell, None, I), T, B, jnp.float32)
    return "bptt" if opts.backward == "bptt" else f"bppsa:{opts.scan}"


def _rel(a, ref) -> float:
    a, ref = (np.concatenate([np.ravel(np.asarray(v, np.float64)) for v in jax.tree.leaves(t)]) for t in (a, ref))
    return float(np.max(np.abs(a - ref)) / np.max(np.abs(ref)))


def point(kind, T, B, I, H, ragged, *, repeats, seed=0):
    """One row: every layer's step over the same ``kind`` cell at (T, B, I, H), checked, then timed."""
    rng = np.random.default_rng(seed)
    x = jnp.asarray(rng.standard_normal((B, T, I)), jnp.float32)
    R = jnp.asarray(rng.standard_normal((B, T, H)), jnp.float32)
    lengths = jnp.asarray(rng.integers(T // 2, T + 1, B), jnp.int32) if ragged else None
    mask = (jnp.arange(T)[None, :] < (jnp.full((B,), T) if lengths is None else lengths)[:, None]).astype(jnp.float32)
    cell = CELLS[kind](I, H, rngs=nnx.Rngs(seed))
    names = [n for n in LAYERS if ragged or n != "identity"]
    layers = {n: LAYERS[n](cell) for n in names}
    fns, ys, grads, compile_s = {}, {}, {}, {}
    for n, layer in layers.items():
        fns[n] = step_fn(layer, x, lengths, mask, R)
        t0 = time.perf_counter()
        (_, ys[n]), grads[n] = jax.block_until_ready(fns[n]())  # compiles
        compile_s[n] = time.perf_counter() - t0
        np.testing.assert_allclose(np.asarray(ys[n]), np.asarray(ys["nnx.RNN"]), rtol=RTOL, atol=1e-6,
                                   err_msg=f"{kind} T={T} B={B} seq_lengths={ragged}: {n}'s outputs vs nnx.RNN's")
    grad_diff = {n: _rel(grads[n], grads["nnx.RNN"]) for n in names if n != "nnx.RNN"}
    bad = {n: d for n, d in grad_diff.items() if not d < GRAD_TOL}
    if bad:
        raise AssertionError(f"{kind} T={T} B={B}: gradients differ from nnx.RNN's by {bad} (max |Δ| / max |g|), "
                             f"expected < {GRAD_TOL}")
    times = time_interleaved(fns, repeats=repeats, warmup=0)
    return {"cell": kind, "seq_lengths": ragged, "T": T, "B": B, "I": I, "H": H,
            "lengths": None if lengths is None else np.asarray(lengths).tolist(),
            "auto_choice": auto_choice(cell, T, B, I), "times": times, "compile_s": compile_s,
            "grad_rel_diff": grad_diff}


def _ms(r, n):
    return f"{1e3 * r['times'][n]['median']:.2f}" if n in r["times"] else "—"


def _ratio(r, n):
    return f"{r['times']['nnx.RNN']['median'] / r['times'][n]['median']:.2f}x" if n in r["times"] else "—"


COLUMNS = ["cell", "seq_lengths", "T", "B", "I", "H", "nnx.RNN ms", "bppsa ms", "auto ms", "auto chose",
           "identity ms", "nnx.RNN / bppsa", "nnx.RNN / auto", "nnx.RNN / identity", "max grad diff"]


def table(rows) -> str:
    return markdown_table(COLUMNS, [[r["cell"], "yes" if r["seq_lengths"] else "no", r["T"], r["B"], r["I"], r["H"],
                                     _ms(r, "nnx.RNN"), _ms(r, "bppsa"), _ms(r, "auto"), r["auto_choice"],
                                     _ms(r, "identity"), _ratio(r, "bppsa"), _ratio(r, "auto"), _ratio(r, "identity"),
                                     f"{max(r['grad_rel_diff'].values()):.1e}"] for r in rows],
                          align="ll" + "r" * 7 + "l" + "r" * 5)


def markdown(record) -> str:
    p = record["provenance"]
    return "\n".join([
        "# nnx.RNN vs bppsa.nn.RNN on flax's cells: training-step gradient times", "",
        f"`{p['command']}` — {p['date']}, {p['backend']} / {p['cpu']} ({p['cpu_count']} cores), "
        f"jax {p['jax']}, jaxlib {p['jaxlib']}, flax {p['flax']}, commit {(p['git_commit'] or '?')[:7]}, "
        f"{record['wall_s'] / 60:.1f} min, load average (1, 5, 15 min) {record['loadavg']['start']} at the start, "
        f"{record['loadavg']['end']} at the end", "",
        "One training step's gradient: `jax.jit` of `nnx.value_and_grad` w.r.t. the cell's Params of "
        "`experiments.gradient`'s loss with padded steps masked (Σ over valid steps of ⟨output, R⟩, R fixed N(0, 1)), "
        "float32, the same cell (same Params) in every layer. seq_lengths \"yes\": uniform in [T/2, T]. "
        "nnx.RNN = `nnx.RNN(cell)`; bppsa = `bppsa.nn.RNN(cell, backward=\"bppsa\")`; auto = "
        "`backward=\"auto\"` (its choice: `Options.resolve` for the adapted cell); identity = "
        "`backward=\"bppsa\", padding=\"identity\"`. "
        f"Median ms over {record['repeats']} interleaved rotated rounds (`bppsa.host`); the machine is "
        "shared, so read the ratios (> 1: bppsa.nn.RNN faster). Outputs equal nnx.RNN's (allclose, rtol "
        "1e-4) in every row; max grad diff: the largest |g − g_nnx.RNN| / max |g_nnx.RNN| over the bppsa layers.",
        "", table(record["rows"]), ""])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="one tiny shape, 2 rounds (default --out runs/flax-rnn-quick)")
    ap.add_argument("--repeats", type=int, default=None, help="timed rounds per row (default 5; --quick 2)")
    ap.add_argument("--out", default=None, help="path stem of the .json/.md written "
                                                "(default experiments/results/cpu/flax-rnn)")
    args = ap.parse_args(argv)
    repeats = args.repeats or (2 if args.quick else 5)
    out = Path(args.out or ("runs/flax-rnn-quick" if args.quick else "experiments/results/cpu/flax-rnn"))
    command = " ".join(["python", "experiments/scripts/flax_rnn_bench.py"] + (sys.argv[1:] if argv is None else list(argv)))
    loadavg = lambda: " ".join(Path("/proc/loadavg").read_text().split()[:3]) if Path("/proc/loadavg").exists() else "?"
    load_start = loadavg()
    start, rows = time.perf_counter(), []
    for T, B, I, H in (QUICK if args.quick else SHAPES):
        for kind in CELLS:
            for ragged in (False, True):
                rows.append(point(kind, T, B, I, H, ragged, repeats=repeats))
                print(table(rows[-1:]).splitlines()[-1] if rows[1:] else table(rows), flush=True)
    record = {"rows": rows, "repeats": repeats, "wall_s": time.perf_counter() - start,
              "loadavg": {"start": load_start, "end": loadavg()}, "provenance": provenance(command)}
    save_json(out.with_suffix(".json"), record)
    out.with_suffix(".md").write_text(markdown(record))
    print(f"\nwrote {out.with_suffix('.md')} and .json ({record['wall_s'] / 60:.1f} min)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
