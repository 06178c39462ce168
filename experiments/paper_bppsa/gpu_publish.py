"""Publish device-machine runs (``experiments/gpu/run.sh``) as one committed result.

    python -m experiments.paper_bppsa.gpu_publish OUT1/summary.json [OUT2/summary.json ...] \\
        --name h200 [--machine OUT1/machine.txt] [--results experiments/results]

Merges the runs' points (a point measured in two runs keeps the later run's; points are keyed by
part, sweep, cell, setting, head size, T, B and devices), keeps every run's provenance, and writes
``<results>/gpu/<name>.json`` (with ``"provenance"``: the first run's, plus ``"runs"``: each run's) and
``<name>.md``: the RNN T and B sweeps, the IRMAS-shaped GRU table, the float32 precision check, the
parallel forward's training step, the 16-core CPU part and the roofline comparison; then redraws
the site's figures (:mod:`experiments.figures`, into ``--figures``). Then run ``bppsa results`` to
regenerate the index.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from bppsa import cells
from bppsa.plan import calibration, cost
from experiments import figures
from experiments.extensions import parallel_step, roofline
from experiments.provenance import save_json
from experiments.tables import markdown_table

__all__ = ["merge", "cell_of", "choices", "detail_tables", "markdown", "main"]

KEY = ("part", "sweep", "cell", "setting", "head_size", "T", "B", "devices")
BASELINES = ("bptt_plain", "bptt_unrolled", "bptt")


def merge(summaries: list[dict]) -> dict:
    """{"points", "skipped", "runs"} of several GPU-run summaries, later runs winning per point key."""
    points: dict[tuple, dict] = {}
    for s in summaries:
        for p in s.get("points", []):
            points[tuple(p.get(k) for k in KEY)] = p

    def measured(label):  # a skip's label names fewer keys than a point (no T or H at times; a parallel
        return any(all((_kind(p) if k == "cell" and p["part"] == "parallel" else p.get(k)) == v  # one's cell
                       for k, v in label.items() if k != "reason") for p in points.values())  # is its kind)

    skipped = []
    for s in summaries:
        skipped += [k for k in s.get("skipped", []) if not measured(k) and k not in skipped]
    return {"points": list(points.values()), "skipped": skipped, "runs": [s.get("provenance", {}) for s in summaries]}


def _f(x) -> str:
    return "-" if x is None else f"{x:.3g}"


def _gpu_rows(points, sweep, fused=False, bptt_fused=False):
    rows = []
    for p in sorted((p for p in points if p["part"] == "gpu" and p.get("sweep") == sweep),
                    key=lambda p: (p["T"], p["B"])):
        ms = p["ms"]
        bppsa = ms["bppsa_blelloch"]
        best = min(ms[k] for k in BASELINES)
        row = [p.get("setting", p["cell"]), p.get("I", 1), p["T"], p["B"], _f(ms["bptt_plain"]),
               f"{_f(ms['bptt_unrolled'])} ({p['best_unroll']})", _f(ms["bptt"]), _f(bppsa),
               _f(ms.get("bppsa_sequential")), _f(ms.get("cudnn")), f"{ms['bptt_plain'] / bppsa:.2f}",
               f"{best / bppsa:.2f}", "-" if "cudnn" not in ms else f"{ms['cudnn'] / bppsa:.2f}"]
        if fused:  # the fused forward (bppsa.kernels) with the Blelloch backward, and cuDNN against it
            f = ms.get("bppsa_fused")
            row += [_f(f), "-" if f is None or "cudnn" not in ms else f"{ms['cudnn'] / f:.2f}"]
        if bptt_fused:  # tuned BPTT with the fused kernels (its adjoint loop)
            row.append(_f(ms.get("bptt_fused")))
        rows.append(row)
    return rows


def _has_fused(points, column: str = "bppsa_fused") -> bool:
    """Whether any GPU point timed ``column`` (runs before the fused kernels did not): its columns then."""
    return any(column in p.get("ms", {}) for p in points if p["part"] == "gpu")


#: The columns of the backward-alone, forward-alone and launch tables, in order: key -> header.
DETAIL_COLUMNS = {"bptt_plain": "plain lax.scan", "bptt": "bptt tuned", "bptt_fused": "bptt fused",
                  "bppsa_blelloch": "BPPSA blelloch", "bppsa_fused": "BPPSA fused", "cudnn": "cuDNN"}
FORWARD_COLUMNS = {"bptt_plain": "lax.scan", "bppsa_blelloch": "bppsa sequential (XLA)",
                   "bppsa_fused": "bppsa fused kernel", "cudnn": "cuDNN (training forward)"}


def _detail_points(points, key):
    return sorted((p for p in points if p["part"] == "gpu" and p.get(key)),
                  key=lambda p: (str(p.get("sweep")), str(p.get("setting", "")), p["T"], p["B"]))


def _label(p) -> list:
    return [p.get("sweep", ""), p.get("setting", p["cell"]), p["T"], p["B"]]


def detail_tables(points) -> list[str]:
    """Markdown of where the time goes (runs that measured it; none else): the backward alone, the
    forward alone and the kernels launched per training step, one column per method measured.

    Args:
      points: the merged points.

    Returns:
      The section's lines (empty where no point has ``backward_ms``, ``forward_ms`` or ``launches``).
    """
    lines: list[str] = []
    bwd = _detail_points(points, "backward_ms")
    if bwd:
        cols = [k for k in DETAIL_COLUMNS if any(k in p["backward_ms"] for p in bwd)]
        rows = []
        for p in bwd:
            b = p["backward_ms"]
            ratio = lambda k: "-" if k not in b or "bppsa_blelloch" not in b else f"{b[k] / b['bppsa_blelloch']:.2f}"
            step = (p.get("ms") or {}).get("bppsa_blelloch")
            share = "-" if step is None or "bppsa_blelloch" not in b else f"{b['bppsa_blelloch'] / step:.2f}"
            rows.append(_label(p) + [_f(b.get(k)) for k in cols] + [ratio("bptt_plain"), ratio("bptt"), share])
        header = ["sweep", "setting / cell", "T", "B", *(DETAIL_COLUMNS[k] for k in cols), "plain / BPPSA",
                  "tuned / BPPSA", "BPPSA backward / step"]
        lines += ["## The backward alone", "",
                  "ms of the pullback only: the forward and `jax.vjp` run once outside the timing, then the jitted "
                  "vjp function at ∂L/∂out (`experiments.gradient.backward_functions`); for BPPSA its Jacobians, "
                  "scan and parameter gradients; cuDNN: `loss.backward(retain_graph=True)` after one forward, CUDA "
                  "synchronised. plain / BPPSA at T = 30 000 is the paper's backward speed-up metric. BPPSA "
                  "backward / step: its share of the whole training step (the T and B sweep tables).", "",
                  markdown_table(header, rows, align="llrr" + "r" * (len(header) - 4)), ""]
    fwd = _detail_points(points, "forward_ms")
    if fwd:
        cols = [k for k in FORWARD_COLUMNS if any(k in p["forward_ms"] for p in fwd)]
        rows = [_label(p) + [_f(p["forward_ms"].get(k)) for k in cols] for p in fwd]
        header = ["sweep", "setting / cell", "T", "B", *(FORWARD_COLUMNS[k] for k in cols)]
        lines += ["## The forward alone", "",
                  "ms of the jitted forward (states only): `lax.scan` over `cell.step`, `bppsa.rnn`'s sequential "
                  "forward by XLA and by the fused kernel (`kernels=`); cuDNN's forward as a training step runs it "
                  "(autograd recording).", "",
                  markdown_table(header, rows, align="llrr" + "r" * (len(header) - 4)), ""]
    lau = _detail_points(points, "launches")
    if lau:
        cols = [k for k in DETAIL_COLUMNS if any(k in p["launches"] for p in lau)]

        def n(p, k):
            c = p["launches"].get(k)
            return "-" if c is None else f"{c['total']}" + ("" if c.get("exact", True) else "+")
        rows = [_label(p) + [n(p, k) for k in cols] for p in lau]
        header = ["sweep", "setting / cell", "T", "B", *(DETAIL_COLUMNS[k] for k in cols)]
        lines += ["## Kernels launched per training step", "",
                  "Counted from the compiled program (`experiments.paper_bppsa.launches`): fusions, custom calls "
                  "(cuBLAS, Triton/Pallas) and other computing instructions, a `while` loop's body times its trip "
                  "count (XLA's `known_trip_count`; + where a loop had none: a lower bound). Memcpys are not "
                  "counted.", "", markdown_table(header, rows, align="llrr" + "r" * (len(header) - 4)), ""]
    return lines


GPU_HEADER = ["setting / cell", "I", "T", "B", "plain lax.scan", "best unrolled (u)", "bptt tuned", "BPPSA blelloch",
              "BPPSA seq.", "cuDNN", "plain / BPPSA", "best BPTT / BPPSA", "cuDNN / BPPSA"]


PAIRS = ("sequential/bptt", "sequential/bppsa", "newton/bppsa", "quasi/bppsa")
#: The parallel part's extra columns, where a run has them: the fused Newton pair and pararnn-torch's step.
PARALLEL_EXTRA = {"newton/bppsa fused": "newton/bppsa fused", "pararnn_torch_fused": "pararnn-torch fused"}


def _parallel_extra(points) -> list[str]:
    return [k for k in PARALLEL_EXTRA if any(k in p.get("ms", {}) for p in points if p["part"] == "parallel")]


def _parallel_rows(points):
    rows = []
    extra = _parallel_extra(points)
    for p in (p for p in points if p["part"] == "parallel"):
        ms, its = p["ms"], p.get("newton") or {}
        base = ms["sequential/bptt"]
        ours = [v for k, v in ms.items() if k in PAIRS or k == "newton/bppsa fused"]  # bppsa's programs only
        rows.append([p["cell"], p.get("head_size", 1), p.get("I", 1), p["H"], p["T"], p["B"]]
                    + [_f(ms.get(k)) for k in PAIRS] + [_f(ms.get(k)) for k in extra]
                    + [f"{base / min(ours):.2f}",
                       " / ".join(str((its.get(k) or {}).get("iterations", "-"))
                                  for k in ("newton/bppsa", "quasi/bppsa")),
                       p.get("auto", "-"), _f((p.get("predicted_ms") or {}).get("forward_model/newton"))])
    return rows


def _kind(p) -> str:
    """A parallel point's cell kind (``parallel_step.make_cell``'s): recorded, or read off its label
    ("RNN", "GRU", "BlockGRU k=16" -> "rnn", "gru", "blockgru")."""
    return p.get("kind") or p["cell"].split()[0].lower()


def cell_of(p):
    if p["part"] == "parallel":
        return parallel_step.make_cell(_kind(p), p["I"], p["H"], p.get("head_size", 1))
    return (cells.RNN if p["cell"] == "RNN" else cells.GRU)(input_size=p.get("I", 1), hidden_size=p["H"])


def choices(points) -> str:
    """What ``backward="auto"`` (the shipped GPU cost model) and ``forward="auto"``
    (:func:`bppsa.plan.cost.choose_forward` on "gpu") pick at each point, against the fastest measured."""
    model, rows = calibration.shipped_cost_model("gpu"), []
    names = {"bptt": "bptt", "bppsa": "bppsa_blelloch", "bppsa_sequential": "bppsa_sequential"}
    for p in sorted(points, key=lambda p: p["part"] != "gpu"):
        ms, gate = p.get("ms") or {}, None
        if p["part"] == "gpu" and "bppsa_blelloch" in ms and model is not None:
            pick = names[model.choose(cell_of(p), p["T"], p["B"])]
            timed = {v: ms[v] for v in names.values()}
        elif p["part"] == "parallel":
            fwd, gate = cost.choose_forward(cell_of(p), p["T"], p["B"], backend="gpu")
            foreseen = ((p.get("newton") or {}).get("newton/bppsa") or {}).get("predicted")
            if gate is not None and foreseen is not None and foreseen > gate:
                fwd = "sequential"  # the solver's own fallback, after its first iterate
            pick, timed = f"{fwd}/bppsa", {k: v for k, v in ms.items() if k.endswith("/bppsa")}
        else:
            continue
        fastest = min(timed, key=lambda k: timed[k])
        rows.append([p["part"], p["cell"], p["T"], p["B"], "-" if gate is None else f"{gate:.1f}", pick, fastest,
                     f"{timed[pick] / timed[fastest]:.2f}"])
    right = sum(r[5] == r[6] for r in rows)
    return (f"The backward's choice (`bppsa/plan/cost_models/gpu.json`) among tuned BPTT and BPPSA's two scans, and "
            f"the forward's (`bppsa.plan.cost.choose_forward`, as committed when this was published) among the BPPSA "
            f"pairs: right at {right} of {len(rows)} points; × = the pick's time / the fastest's. gate = the "
            f"break-even Newton iterations: where the solver foresees more at its first iterate (the run's "
            f"`predicted`) it falls back to the sequential forward, listed so (its first iterate's cost not "
            f"counted). The forward's constants were fitted to these parallel points: in-sample.\n\n"
            + markdown_table(["part", "cell", "T", "B", "gate", "auto picks", "fastest", "×"], rows,
                             align="llrrrllr"))


def markdown(record: dict) -> str:
    pts, prov = record["points"], record["provenance"]
    runs = record.get("runs", [])
    lines = [f"# The device-machine run: {prov.get('device_kind', '?')}", "",
             f"{prov.get('date', '?')}: {prov.get('device_kind')}, driver {prov.get('driver', '?')}, "
             f"{prov.get('cpu')} ({prov.get('cpu_count')} cores), Python {prov.get('python')}, jax {prov.get('jax')}, "
             f"flax {prov.get('flax')}, torch {prov.get('torch')}, commit {str(prov.get('git_commit'))[:10]}. "
             f"Runs: " + "; ".join(f"`{r.get('command')}` ({r.get('date')})" for r in runs) + ".", "",
             *([f"**Note.** {prov['note']}", ""] if prov.get("note") else []),
             "Every time is the median (ms) of one training-step gradient (forward + backward of a fixed random "
             "readout of every hidden state), all methods interleaved after compile warm-up. BPTT: autodiff "
             "through `lax.scan` (plain; the best `unroll` of 1..32; `bppsa.rnn(backward=\"bptt\")`, tuned); "
             "BPPSA: `bppsa.rnn(backward=\"bppsa\")` with the Blelloch or a sequential scan; cuDNN: torch "
             "`nn.RNN`/`nn.GRU` on CUDA, same inputs and readout. Ratios > 1: BPPSA faster.", ""]
    for title, sweep in (("RNN 1 → 20, T sweep (B = 16)", "T"), ("RNN 1 → 20, B sweep (T = 1000)", "B"),
                         ("IRMAS-shaped GRU → 20 (synthetic inputs)", "irmas")):
        fused, bptt_fused = _has_fused(pts), _has_fused(pts, "bptt_fused")
        rows = _gpu_rows(pts, sweep, fused, bptt_fused)
        if rows:
            header = GPU_HEADER + (["BPPSA fused", "cuDNN / fused"] if fused else []) \
                + (["bptt fused"] if bptt_fused else [])
            lines += [f"## {title}", "", markdown_table(header, rows, align="l" + "r" * (len(header) - 1)), ""]
    prec = [p for p in pts if p.get("sweep") == "precision"]
    if prec:
        lines += ["## Float32 gradient error against float64 (RNN, B = 16)", "",
                  "max |g32 − g64| / max |g64|; BPPSA per `precision=`, BPTT per matmul precision.", "",
                  markdown_table(["T"] + sorted(prec[0]["grad_rel_err"]) + ["BPPSA ms (highest / high / default)"],
                                 [[p["T"]] + [f"{p['grad_rel_err'][k]:.2e}" for k in sorted(p["grad_rel_err"])]
                                  + [" / ".join(_f(p["bppsa_ms_by_precision"].get(k))
                                                for k in ("highest", "high", "default"))] for p in prec]), ""]
    lines += detail_tables(pts)
    rows = _parallel_rows(pts)
    if rows:
        extra = [PARALLEL_EXTRA[k] for k in _parallel_extra(pts)]
        lines += ["## The parallel forward's training step", "",
                  "`bppsa.rnn(..., forward=f, backward=b)`'s jitted parameter gradient; × = tuned BPTT's time / the "
                  "fastest pair's; iterations of Newton / quasi-Newton; auto = what `forward=\"auto\", "
                  "backward=\"auto\"` runs (at the run: the forward constants of its commit); model = "
                  "`bppsa.plan.cost.forward_seconds`' Newton forward alone, at the run."
                  + (" newton/bppsa fused: the same pair with the fused kernels (`kernels=`)." if "newton/bppsa fused"
                     in _parallel_extra(pts) else "")
                  + (" pararnn-torch fused: its fused Triton Newton step (K = 3) and eq. 2.6 backward for its "
                     "diagonal GRU at the BlockGRU k=1 shape (`experiments.paper_bppsa.pararnn_gpu`; not in ×)."
                     if "pararnn_torch_fused" in _parallel_extra(pts) else ""), "",
                  markdown_table(["cell", "head", "I", "H", "T", "B", "sequential/bptt", "sequential/bppsa",
                                  "newton/bppsa", "quasi/bppsa", *extra, "×", "iterations", "auto at the run",
                                  "model ms at the run"],
                                 rows, align="lrrrrrrrrr" + "r" * len(extra) + "rlll"), ""]
    cpu = [p for p in pts if p["part"] == "cpu16"]
    if cpu:
        sizes = [p for p in cpu if p.get("sweep") != "sequence-parallel"]
        seq = [p for p in cpu if p.get("sweep") == "sequence-parallel"]
        lines += ["## The host's 16 CPU cores (XLA CPU, 16 host devices)", "",
                  markdown_table(["T", "B", "plain", "best unrolled", "bptt tuned", "BPPSA blelloch", "BPPSA seq."],
                                 [[p["T"], p["B"]] + [_f(p["ms"].get(k)) for k in
                                  ("bptt_plain", "bptt_unrolled", "bptt", "bppsa_blelloch", "bppsa_sequential")]
                                  for p in sizes]), ""]
        if seq:
            lines += ["Sequence-parallel backward and forward (RNN T = 10 000, B = 16) over host devices:", "",
                      markdown_table(["devices", "sharded backward ms", "sharded forward ms"],
                                     [[p["devices"], _f(p["ms"].get("bppsa_sharded_backward")),
                                       _f(p["ms"].get("forward_sharded"))] for p in seq]), ""]
    if record.get("skipped"):
        lines += ["Not measured (time budget or failure): " + "; ".join(
            ", ".join(f"{k}={v}" for k, v in s.items() if k != "reason") + f" ({s.get('reason')})"
            for s in record["skipped"]) + ".", ""]
    lines += ["## auto's choices against these measurements", "", choices(pts), ""]
    lines += ["## Against the roofline model", "", roofline.compare_table(roofline.compare({"points": pts})), ""]
    return "\n".join(lines)


def _driver(machine: Path | None) -> str | None:
    if machine is None or not machine.exists():
        return None
    for line in machine.read_text().splitlines():
        if "Driver Version" in line:
            return line.split("Driver Version:")[1].split()[0] + ", CUDA " + line.split("CUDA Version:")[1].split()[0]
    return None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m experiments.paper_bppsa.gpu_publish",
                                 description=(__doc__ or "").split("\n")[0])
    ap.add_argument("summaries", nargs="+", help="summary.json files of GPU runs, earliest first")
    ap.add_argument("--name", required=True, help="the result's name, e.g. h200")
    ap.add_argument("--machine", default=None, help="nvidia-smi output of the machine (for the driver version)")
    ap.add_argument("--command", default=None, help="the command(s) that made the runs, as the device ran them")
    ap.add_argument("--note", default=None, help="a note printed under the provenance (what it does not say)")
    ap.add_argument("--results", default="experiments/results", help="results folder")
    ap.add_argument("--figures", default=None,
                    help="where to redraw the site's figures (experiments.figures); default: docs/_static/figures "
                         "when --results is the committed folder, else none")
    args = ap.parse_args(argv)
    summaries = []
    for path in args.summaries:
        s = json.loads(Path(path).read_text())
        if not isinstance(s, dict) or "points" not in s:
            ap.error(f"{path} is not a GPU run's summary.json (no 'points')")
        summaries.append(s)
    record = merge(summaries)
    prov = dict(record["runs"][0])
    prov.pop("plan", None)
    words = sys.argv[1:] if argv is None else list(argv)
    prov.update(driver=_driver(Path(args.machine)) if args.machine else None,
                published_by=" ".join(["python -m experiments.paper_bppsa.gpu_publish", *words]))
    if args.command:
        prov["command"] = args.command
    if args.note:
        prov["note"] = args.note
    record = {"provenance": prov, **record}
    out = Path(args.results) / "gpu"
    out.mkdir(parents=True, exist_ok=True)
    save_json(out / f"{args.name}.json", record)
    (out / f"{args.name}.md").write_text(markdown(record))
    print(f"wrote {out / args.name}.json and .md ({len(record['points'])} points)")
    if args.figures is None and Path(args.results).resolve() == figures.RESULTS:
        args.figures = str(figures.OUT)
    if args.figures:  # the site's figures of the GPU run (and the others), redrawn from the results folder
        drawn = [p for p in figures.draw_all(args.results, args.figures).values() if p]
        print(f"drew {len(drawn)} figures into {args.figures}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
