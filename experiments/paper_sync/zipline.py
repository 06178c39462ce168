"""ZipLine's runtime table (ElasticBSP's barrier choice; the task of experiments/paper_sync/configs/zipline.py).

:func:`zipline_runtimes` times every method of :data:`bppsa.sync.ZIPLINE_METHODS` on n × R
prediction matrices (workers × horizons), checks the exact ones agree and reports the heuristics'
gap to the optimum; it writes ``<name>.json`` (with provenance), ``<name>.md`` and ``<name>.png``
into ``workdir``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

from bppsa.errors import checked_by, require_choices, require_int, require_ints
from bppsa.sync.zipline import ZIPLINE_METHODS, selection_range
from experiments import entry
from experiments.provenance import provenance, save_json
from experiments.tables import markdown_table

__all__ = ["zipline_runtimes", "check_zipline_runtimes", "plot_zipline_runtimes"]

EXACT = ("window", "zipline", "zipline_opt", "bsearch", "brute_force")  # the methods that find the optimum


def _zipline_input(n, R, seed):
    """ElasticBSP's predictions: row p = start_p + i·interval_p, i = 1..R (heterogeneous intervals)."""
    rng = np.random.default_rng([seed, n, R])
    start = rng.uniform(0.0, 1.0, size=(n, 1))
    interval = rng.uniform(0.5, 2.5, size=(n, 1))
    return start + interval * np.arange(1, R + 1)


def check_zipline_runtimes(config) -> None:
    """The ranges of :func:`zipline_runtimes`'s config (UsageError naming the key)."""
    require_choices(config, "methods", tuple(sorted(ZIPLINE_METHODS)), many=True)
    require_ints(config, "workers", allow_empty=False)
    require_ints(config, "horizons", allow_empty=False)
    require_int(config, "repeats")
    require_int(config, "seed", 0)


@checked_by(check_zipline_runtimes)
def zipline_runtimes(config, workdir) -> dict:
    """Median wall time of each ZipLine method on n × R prediction matrices; heuristics' gap to the optimum."""
    check_zipline_runtimes(config)
    methods = list(config.methods)
    Path(workdir).mkdir(parents=True, exist_ok=True)  # a folder of yours when called directly
    name = config.get("name", "zipline_runtimes")
    plain = json.loads(config.to_json_best_effort())
    max_points = plain["max_points"]
    rows = []
    for n in config.workers:
        for R in config.horizons:
            times = _zipline_input(int(n), int(R), int(config.seed))
            results = {m: [] for m in methods}
            answers = {}
            for m in methods:
                if n * R > max_points.get(m, np.inf):
                    continue
                answers[m] = ZIPLINE_METHODS[m](times)  # warm-up
            for _ in range(int(config.repeats)):  # interleaved repeats
                for m in answers:
                    t0 = time.perf_counter()
                    ZIPLINE_METHODS[m](times)
                    results[m].append(time.perf_counter() - t0)
            # the optimum from an exact method that ran (a heuristic's range is no optimum; None: none ran)
            opt = next((answers[m][1] for m in answers if m in EXACT), None)
            row: dict[str, float | None] = {"workers": int(n), "R": int(R)}
            for m in methods:
                if m in answers:
                    row[f"{m}_s"] = float(np.median(results[m]))
                    row[f"{m}_range"] = answers[m][1]
                    assert abs(selection_range(times, answers[m][0]) - answers[m][1]) < 1e-9
                else:
                    row[f"{m}_s"] = row[f"{m}_range"] = None
            row["optimal_range"] = opt
            rows.append(row)
            print("  ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()), flush=True)
    target = next((r for r in rows if r["workers"] == 1000 and r["R"] == 150), None)
    record = {"title": "ZipLine runtimes (ElasticBSP's barrier choice)", "name": name,
              "plot": "experiments.paper_sync.zipline:plot_zipline_runtimes",
              "config": plain, "rows": rows,
              "target_1000x150_s": None if target is None else target.get(f"{methods[0]}_s"),
              "paper_1000x150_s": 2.38, "provenance": provenance(config.get("command") or None)}
    md = _zipline_table(record)
    save_json(entry(workdir, f"{name}.json"), record)
    entry(workdir, f"{name}.md").write_text(md)
    plot_zipline_runtimes(record, entry(workdir, f"{name}.png"))
    print(md)
    return {"rows": rows, "target_1000x150_s": record["target_1000x150_s"],
            "files": [f"{name}.json", f"{name}.md", f"{name}.png"]}


_ZL_LABELS = {"window": "ZipLine (count window, default)", "zipline": "ZipLine (paper, O(R·n²))",
              "zipline_opt": "ZipLineOpt", "bsearch": "ZipLine binary search", "grid_scan": "GridScan",
              "full_grid_scan": "FullGridScan", "brute_force": "brute force"}


def _zipline_table(record) -> str:
    cfg = record["config"]
    methods = cfg["methods"]
    lines = [f"Median wall time of {cfg['repeats']} interleaved repeats (after a warm-up) on ElasticBSP "
             "prediction matrices (row p = start_p + i·interval_p, intervals uniform in [0.5, 2.5]); "
             "pure Python + numpy on one core. The paper reports 2.38 s for 1000 workers × R = 150. "
             "Heuristic columns give time / range found (optimal range in the last column); — = skipped (too slow), "
             "or, in the last column, no exact method ran.",
             ""]
    body = []
    for r in record["rows"]:
        cells = []
        for m in methods:
            t = r[f"{m}_s"]
            if t is None:
                cells.append("—")
            elif m in EXACT:
                cells.append(f"{1e3 * t:.2f} ms")
            else:
                cells.append(f"{1e3 * t:.2f} ms / {r[f'{m}_range']:.3f}")
        body.append([r["workers"], r["R"], *cells, "—" if r["optimal_range"] is None else f"{r['optimal_range']:.4f}"])
    lines.append(markdown_table(["workers", "R", *(_ZL_LABELS.get(m, m) for m in methods), "optimal range"], body))
    return "\n".join(lines) + "\n"


def plot_zipline_runtimes(record, path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = record["rows"]
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for ax, R in zip(axes, sorted({r["R"] for r in rows})):
        rr = [r for r in rows if r["R"] == R]
        for m in record["config"]["methods"]:
            pts = [(r["workers"], r[f"{m}_s"]) for r in rr if r[f"{m}_s"] is not None]
            if pts:
                ax.loglog(*zip(*pts), "o-", label=_ZL_LABELS.get(m, m))
        ax.set_title(f"R = {R}")
        ax.set_xlabel("workers n")
        ax.set_ylabel("seconds")
        if R == 150:
            ax.axhline(2.38, color="k", ls=":", lw=0.8)
            ax.text(10, 2.6, "paper, n = 1000", fontsize=7)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
