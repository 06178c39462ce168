"""The documentation site's figures, drawn from the committed results (experiments/results/**/*.json).

    python -m experiments.figures [--results experiments/results] [--out docs/_static/figures]

Reads only the committed JSON (nothing is measured; a few seconds on a CPU) and writes one PNG per
figure into ``--out``, which docs/results.md shows beside its tables: BPPSA's speed-up against the
sequence length T and the batch size B (the paper's two figures) on the CPU and on the GPU; the
GPU run's columns (the newest ``gpu/*.json``: the IRMAS-shaped GRU, the parallel forward, the
16-core CPU part); the IRMAS grid on the CPU; the parallel forward's Newton iterations; and
``bppsa.nn.RNN`` against ``nnx.RNN``.
A figure whose result file is absent is skipped (and named in the printed summary).
:func:`experiments.paper_bppsa.gpu_publish.main` calls :func:`draw_all` when a GPU run lands.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

__all__ = ["FIGURES", "draw_all", "main"]

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "experiments" / "results"
OUT = ROOT / "docs" / "_static" / "figures"
BASELINES = ("bptt_plain", "bptt_unrolled", "bptt")  # the GPU run's BPTT columns; "best BPTT" is their minimum


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _load(results: Path, rel: str) -> dict | None:
    path = results / rel
    return json.loads(path.read_text()) if path.is_file() else None


def _gpu_record(results: Path) -> dict | None:
    """The newest GPU run (``gpu/<name>.json`` whose points are the GPU script's, each with its
    ``part``; by its provenance date), so that a run just published is the one drawn. The
    machine-code records beside them (predictions, no run) are not runs."""
    records = [json.loads(p.read_text()) for p in sorted((results / "gpu").glob("*.json"))]
    records = [r for r in records if isinstance(r, dict) and isinstance(r.get("points"), list) and r["points"]
               and all(isinstance(p, dict) and "part" in p for p in r["points"])]
    return max(records, key=lambda r: str((r.get("provenance") or {}).get("date", "")), default=None)


def _device(record: dict | None) -> str:
    prov = (record or {}).get("provenance") or {}
    if prov.get("backend") == "cpu" and prov.get("cpu"):
        return f"{prov['cpu']}, {prov.get('cpu_count', '?')} cores"
    return str(prov.get("device_kind") or prov.get("backend") or "")


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    _plt().close(fig)
    return path


def _gpu_points(record: dict, part: str, sweep: str) -> list[dict]:
    return sorted((p for p in record["points"] if p["part"] == part and p.get("sweep") == sweep and p.get("ms")),
                  key=lambda p: (p["T"], p["B"]))


# --- the CPU sweeps (rnn-sweep): the paper's speed-up against T and against B -----------------------

def _cpu_sweep(results: Path, out: Path, sweep: str, axis: str, name: str) -> Path | None:
    record = _load(results, "cpu/rnn-sweep.json")
    if record is None:
        return None
    rows = sorted(record["sweeps"][sweep], key=lambda r: r[axis])
    xs = [r[axis] for r in rows]
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    for key, label, style in [("bptt_plain", "plain lax.scan", "o-"), ("best", "best BPTT", "s-"),
                              ("bppsa_sequential", "BPPSA, sequential scan", "^--")]:
        ys = []
        for r in rows:
            b = r["baselines"]
            base = min(b["ms"][k] for k in b["ms"] if k.startswith("bptt")) if key == "best" else (
                b.get(key) if key == "bptt_plain" else b["ms"][key])
            ys.append(base / b["ms"]["bppsa_blelloch"])
        ax.plot(xs, ys, style, label=f"{label} / BPPSA (Blelloch)")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xscale("log", base=2 if axis == "B" else 10)
    ax.set_xlabel(f"{axis} ({'sequence length' if axis == 'T' else 'batch size'})")
    ax.set_ylabel("speed-up of BPPSA (×)")
    fixed = f"B = {rows[0]['B']}" if axis == "T" else f"T = {rows[0]['T']}"
    ax.set_title(f"CPU: RNN(1, 20), {fixed}, training-step gradient\n{_device(record)}", fontsize=9)
    ax.legend(fontsize=8)
    return _save(fig, out / name)


def cpu_speedup_T(results: Path, out: Path) -> Path | None:
    """rnn-sweep's T sweep: BPTT time / BPPSA time against T (the paper's figure, on a CPU)."""
    return _cpu_sweep(results, out, "T sweep", "T", "cpu_speedup_T.png")


def cpu_speedup_B(results: Path, out: Path) -> Path | None:
    """rnn-sweep's B sweep: BPTT time / BPPSA time against B."""
    return _cpu_sweep(results, out, "B sweep", "B", "cpu_speedup_B.png")


# --- the GPU run (gpu/h200.json) ---------------------------------------------------------------------

def _gpu_sweep(results: Path, out: Path, axis: str, name: str) -> Path | None:
    record = _gpu_record(results)
    if record is None:
        return None
    pts = _gpu_points(record, "gpu", axis)
    if not pts:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    xs = [p[axis] for p in pts]
    bppsa = [p["ms"]["bppsa_blelloch"] for p in pts]
    ax.plot(xs, [p["ms"]["bptt_plain"] / b for p, b in zip(pts, bppsa)], "o-", label="plain lax.scan / BPPSA")
    ax.plot(xs, [min(p["ms"][k] for k in BASELINES) / b for p, b in zip(pts, bppsa)], "s-",
            label="best BPTT / BPPSA")
    if all("cudnn" in p["ms"] for p in pts):
        ax.plot(xs, [p["ms"]["cudnn"] / b for p, b in zip(pts, bppsa)], "d--", label="cuDNN RNN / BPPSA")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xscale("log", base=2 if axis == "B" else 10)
    ax.set_yscale("log")
    ax.set_xlabel(f"{axis} ({'sequence length' if axis == 'T' else 'batch size'})")
    ax.set_ylabel("time / BPPSA's time (×)")
    fixed = f"B = {pts[0]['B']}" if axis == "T" else f"T = {pts[0]['T']}"
    ax.set_title(f"GPU: RNN(1, 20), {fixed}, training-step gradient\n{_device(record)}", fontsize=9)
    ax.legend(fontsize=8)
    return _save(fig, out / name)


def gpu_speedup_T(results: Path, out: Path) -> Path | None:
    """The GPU run's T sweep: each baseline's time over BPPSA's, against T."""
    return _gpu_sweep(results, out, "T", "gpu_speedup_T.png")


def gpu_speedup_B(results: Path, out: Path) -> Path | None:
    """The GPU run's B sweep: each baseline's time over BPPSA's, against B."""
    return _gpu_sweep(results, out, "B", "gpu_speedup_B.png")


def _grouped_bars(ax, labels: list[str], columns: dict[str, list[float]]):
    width = 0.8 / len(columns)
    for i, (name, ys) in enumerate(columns.items()):
        ax.bar([x + (i - (len(columns) - 1) / 2) * width for x in range(len(labels))], ys, width, label=name)
    ax.set_xticks(range(len(labels)), labels, fontsize=8)


def gpu_irmas(results: Path, out: Path) -> Path | None:
    """The GPU run's IRMAS-shaped GRU: each column's training-step time, per setting."""
    record = _gpu_record(results)
    pts = _gpu_points(record, "gpu", "irmas") if record else []
    if not pts:
        return None
    names = {"bptt_plain": "plain lax.scan", "bptt": "tuned BPTT", "bppsa_sequential": "BPPSA, sequential scan",
             "bppsa_blelloch": "BPPSA (Blelloch)", "cudnn": "cuDNN GRU"}
    cols = {label: [p["ms"][k] for p in pts] for k, label in names.items() if all(k in p["ms"] for p in pts)}
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 3.8))
    _grouped_bars(ax, [f"{p.get('setting', '')} T={p['T']}\nB={p['B']}" for p in pts], cols)
    ax.set_ylabel("training step, ms")
    ax.set_title(f"GPU: GRU(F, 20) on IRMAS shapes\n{_device(record)}", fontsize=9)
    ax.legend(fontsize=7, ncol=3)
    return _save(fig, out / "gpu_irmas.png")


def gpu_parallel_forward(results: Path, out: Path) -> Path | None:
    """The GPU run's parallel forward: the training step per forward/backward pair, per point."""
    record = _gpu_record(results)
    pts = [p for p in (record or {}).get("points", []) if p["part"] == "parallel" and p.get("ms")]
    if not pts:
        return None
    pts.sort(key=lambda p: (p["cell"], p["T"], p["B"]))
    keys = [k for k in pts[0]["ms"] if all(k in p["ms"] for p in pts)]
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 3.8))
    _grouped_bars(ax, [f"{p['cell']} T={p['T']}\nB={p['B']}" for p in pts],
                  {k.replace("/", " forward, ") + " backward": [p["ms"][k] for p in pts] for k in keys})
    ax.set_yscale("log")
    ax.set_ylabel("training step, ms")
    ax.set_title(f"GPU: the parallel forward (Newton, quasi-Newton) against the sequential one\n{_device(record)}",
                 fontsize=9)
    ax.legend(fontsize=7, ncol=2)
    return _save(fig, out / "gpu_parallel_forward.png")


def gpu_cpu16(results: Path, out: Path) -> Path | None:
    """The GPU machine's 16-core CPU part: BPPSA's sequence-parallel backward against the devices."""
    record = _gpu_record(results)
    pts = sorted((p for p in (record or {}).get("points", []) if p["part"] == "cpu16"
                  and p.get("sweep") == "sequence-parallel" and p.get("ms")), key=lambda p: p["devices"])
    if not pts:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    xs = [p["devices"] for p in pts]
    for k, style in [("bppsa_sharded_backward", "o-"), ("forward_sharded", "s--")]:
        ax.plot(xs, [p["ms"][k] for p in pts], style, label=k.replace("_", " "))
    ax.set_xscale("log", base=2)
    ax.set_xlabel("CPU devices the sequence is split over")
    ax.set_ylabel("ms")
    ax.set_title(f"16-core CPU: RNN(1, 20), T = {pts[0]['T']}, B = {pts[0]['B']}, sequence-parallel",
                 fontsize=9)
    ax.legend(fontsize=8)
    return _save(fig, out / "gpu_machine_cpu16_sequence_parallel.png")


# --- the CPU IRMAS grid, the parallel forward's iterations, flax ------------------------------------

def cpu_irmas_grid(results: Path, out: Path) -> Path | None:
    """irmas_grid: BPTT time / BPPSA time per setting, for the training step and the backward."""
    record = _load(results, "cpu/irmas_grid.json")
    if record is None:
        return None
    rows = record["rows"]
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 3.6))
    _grouped_bars(ax, [f"{r['setting']} T={r['T']}\nB={r['B']}" for r in rows],
                  {"training step": [r["speedup_step"] for r in rows],
                   "backward": [r["speedup_backward"] for r in rows]})
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_ylabel("BPTT time / BPPSA time (×)")
    ax.set_title(f"CPU: GRU(F, 20) on IRMAS shapes (below 1: BPTT is faster)\n{_device(record)}", fontsize=9)
    ax.legend(fontsize=8)
    return _save(fig, out / "cpu_irmas_grid.png")


def parallel_forward_iterations(results: Path, out: Path) -> Path | None:
    """parallel-step: Newton and quasi-Newton iterations to converge, against T, per cell."""
    record = _load(results, "cpu/parallel-step.json")
    if record is None:
        return None
    rows = [r for r in record["iterations"] if r.get("weights") == "random"]
    cells = list(dict.fromkeys(r["cell"] for r in rows))
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6), sharey=True)
    for ax, forward in zip(axes, ("newton", "quasi")):
        for i, cell in enumerate(cells):
            pts = sorted((r["T"], r["iterations"]) for r in rows if r["cell"] == cell and r["forward"] == forward)
            if pts:
                ax.plot(*zip(*pts), "o-", color=f"C{i}", label=cell)
        ax.set_xscale("log")
        ax.set_xlabel("T (sequence length)")
        ax.set_title(f"{'Newton' if forward == 'newton' else 'quasi-Newton'} forward", fontsize=9)
    axes[0].set_ylabel("iterations to converge")
    axes[0].legend(fontsize=7, ncol=2, loc="upper left")
    axes[0].set_ylim(top=max(r["iterations"] for r in rows) + 2)
    fig.suptitle(f"The parallel forward's iterations (random weights), {_device(record)}", fontsize=9)
    return _save(fig, out / "parallel_forward_iterations.png")


def flax_rnn(results: Path, out: Path) -> Path | None:
    """flax_rnn: ``bppsa.nn.RNN``'s gradient-step time over ``nnx.RNN``'s, per flax cell and shape."""
    record = _load(results, "cpu/flax_rnn.json")
    rows = (record or {}).get("cells", {}).get("rows", [])
    if not rows:
        return None
    labels = [f"{r['cell'].replace('Cell', '')}{' +len' if r.get('seq_lengths') else ''}\nT={r['T']} B={r['B']}"
              for r in rows]
    ref = [r["times"]["nnx.RNN"]["median"] for r in rows]
    cols = {f'backward="{k}"': [r["times"][k]["median"] / t for r, t in zip(rows, ref)]
            for k in ("bppsa", "auto") if all(k in r["times"] for r in rows)}
    plt = _plt()
    fig, ax = plt.subplots(figsize=(max(8, 0.45 * len(rows)), 4))
    _grouped_bars(ax, labels, cols)
    ax.tick_params(axis="x", labelsize=6)
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_yscale("log")
    ax.set_ylabel("time / nnx.RNN's time")
    ax.set_title(f"CPU: bppsa.nn.RNN against nnx.RNN on flax's cells (gradient step)\n{_device(record)}", fontsize=9)
    ax.legend(fontsize=8)
    return _save(fig, out / "flax_rnn.png")


def bptt_unroll(results: Path, out: Path) -> Path | None:
    """bptt-unroll: the plain scan's time over the best unroll's, against T, per cell."""
    record = _load(results, "cpu/bptt-unroll.json")
    if record is None:
        return None
    rows = record["rows"]
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    groups = list(dict.fromkeys((r["cell"], r["H"], r["B"]) for r in rows))
    for i, g in enumerate(groups):
        pts = sorted((r["T"], r["plain_over_best"]) for r in rows if (r["cell"], r["H"], r["B"]) == g)
        ax.plot(*zip(*pts), "o-", color=f"C{i % 10}", label=f"{g[0]} H={g[1]} B={g[2]}")
    ax.set_xscale("log")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xlabel("T (sequence length)")
    ax.set_ylabel("unroll 1 / best unroll (×)")
    ax.set_title(f"CPU: what unrolling BPTT's lax.scan gains\n{_device(record)}", fontsize=9)
    ax.legend(fontsize=7, ncol=2)
    return _save(fig, out / "bptt_unroll.png")


FIGURES: dict[str, Callable[[Path, Path], Path | None]] = {
    f.__name__: f for f in (cpu_speedup_T, cpu_speedup_B, gpu_speedup_T, gpu_speedup_B, gpu_irmas,
                            gpu_parallel_forward, gpu_cpu16, cpu_irmas_grid, parallel_forward_iterations,
                            flax_rnn, bptt_unroll)}


def draw_all(results: str | Path = RESULTS, out: str | Path = OUT) -> dict[str, Path | None]:
    """Draw every figure of :data:`FIGURES` from ``results`` into ``out``; {name: path, or None if skipped}."""
    results, out = Path(results), Path(out)
    out.mkdir(parents=True, exist_ok=True)
    return {name: fn(results, out) for name, fn in FIGURES.items()}


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m experiments.figures", description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--results", default=str(RESULTS), help="the committed results folder")
    ap.add_argument("--out", default=str(OUT), help="where the PNGs go (the site's docs/_static/figures)")
    args = ap.parse_args(argv)
    drawn = draw_all(args.results, args.out)
    for name, path in drawn.items():
        print(f"{name}: {path if path else 'skipped (its result file is absent)'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
