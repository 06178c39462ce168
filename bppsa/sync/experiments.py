"""Experiment tasks for elastic synchronization (configs in experiments/configs/):

- :func:`sync_models` — time to a target test accuracy for BSP, ASP, SSP(s), DSSP(s_L, r_max) and
  ElasticBSP(R) on a heterogeneous 4-worker cluster (simulated clock, real gradients), training a
  small CNN on scikit-learn's digits and a GRU on a synthetic sequence task; the table has the
  layout of DSSP's Table I (one row per model, one column per policy), plus accuracy-vs-time curves.
- :func:`zipline_runtimes` — ZipLine's runtime table (workers × R) for the exact variants and the
  heuristics, with the heuristics' gap to the optimum.

Each writes ``<name>.json`` (with provenance), ``<name>.md`` and ``<name>.png`` into ``workdir``.
``bppsa reproduce sync`` / ``bppsa reproduce zipline`` run the full configs and write into
experiments/results/<device>/.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import time
from pathlib import Path

import numpy as np

from ..provenance import device_label, provenance, save_json
from .models import make_task
from .simulator import ComputeModel, policy_label, simulate
from .zipline import ZIPLINE_METHODS, selection_range

__all__ = ["sync_models", "zipline_runtimes", "plot_sync_models", "plot_zipline_runtimes",
           "main_sync", "main_zipline"]

_ROOT = Path(__file__).resolve().parents[2]


def _plain(x):
    """ConfigDict / tuples -> JSON-able python."""
    if hasattr(x, "to_dict"):
        x = x.to_dict()
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    return x


def _command(config):
    """The command for provenance: ours (bppsa reproduce), the runner's (bppsa run), or argv."""
    if config.get("command", None):
        return config.command
    try:
        from ..runner import current_command
        return current_command()
    except ImportError:
        return None


def _compute_model(c) -> ComputeModel:
    return ComputeModel(means=tuple(c.means), sigma=float(c.sigma),
                        stragglers=tuple(tuple(s) for s in c.get("stragglers", ())), comm=float(c.get("comm", 0.0)))


def _fmt(v, digits=0):
    return "—" if v is None else f"{v:.{digits}f}"


def sync_models(config, workdir) -> dict:
    """Simulate every (model, policy, seed); write the time-to-accuracy table and curves."""
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    name = config.get("name", "sync_models")
    compute = _compute_model(config.cluster)
    policies = [(p[0], dict(p[1])) for p in _plain(config.policies)]
    runs, rows = [], []
    t_start = time.time()
    for m in _plain(config.models):
        task = make_task(m["task"])
        for pol, opts in policies:
            per_seed = []
            for seed in range(int(config.seeds)):
                t0 = time.time()
                r = simulate(task, pol, compute, policy_options=opts, learning_rate=m["learning_rate"],
                             batch_size=m["batch_size"], max_time=m["max_time"], eval_every=m["eval_every"],
                             seed=seed, target=m["target"])
                r["model"], r["real_seconds"] = m["label"], time.time() - t0
                per_seed.append(r)
                print(f"{m['label']:>10} {r['label']:>16} seed {seed}: time to {m['target']:.2f} = "
                      f"{_fmt(r['time_to_target'])}, final {r['final_accuracy']:.3f}, pushes {r['total_pushes']}, "
                      f"barriers {r['barriers']} ({r['real_seconds']:.1f} s)", flush=True)
            tt = [r["time_to_target"] for r in per_seed]
            reached = [t for t in tt if t is not None]
            rows.append({"model": m["label"], "policy": per_seed[0]["label"], "target": m["target"],
                         "time_to_target": tt,
                         "median_time_to_target": float(np.median(reached)) if len(reached) == len(tt) else None,
                         "reached": f"{len(reached)}/{len(tt)}",
                         "final_accuracy": float(np.mean([r["final_accuracy"] for r in per_seed])),
                         "total_pushes": float(np.mean([r["total_pushes"] for r in per_seed])),
                         "wait_per_worker": np.mean([r["wait"] for r in per_seed], axis=0).tolist(),
                         "barriers": float(np.mean([r["barriers"] for r in per_seed])),
                         "max_staleness": int(max(max(r["staleness_hist"]) for r in per_seed)),
                         "mean_staleness": float(np.mean([sum(k * v for k, v in r["staleness_hist"].items())
                                                          / max(1, r["total_pushes"]) for r in per_seed]))})
            runs += per_seed
    for row in rows:
        bsp = next((x for x in rows if x["model"] == row["model"] and x["policy"] == "BSP"), None)
        t, tb = row["median_time_to_target"], bsp and bsp["median_time_to_target"]
        row["speedup_vs_bsp"] = (tb / t) if (t and tb) else None
    record = {"title": "Elastic synchronization: time to target accuracy (simulated heterogeneous cluster)",
              "name": name, "plot": "bppsa.sync.experiments:plot_sync_models",
              "config": _plain(config), "rows": rows,
              # full curves for seed 0 (the plot); every seed's numbers are in rows
              "curves": [{"model": r["model"], "label": r["label"], "seed": r["seed"],
                          "time": [round(c["time"], 3) for c in r["curve"]],
                          "accuracy": [round(c["accuracy"], 4) for c in r["curve"]],
                          "wait": r["wait"], "staleness_hist": r["staleness_hist"], "barriers": r["barriers"]}
                         for r in runs if r["seed"] == 0],
              "real_seconds": time.time() - t_start,
              "provenance": provenance(_command(config))}
    md = _sync_table(record)
    save_json(workdir / f"{name}.json", record)
    (workdir / f"{name}.md").write_text(md)
    plot_sync_models(record, workdir / f"{name}.png")
    print(md)
    return {"rows": rows, "files": [f"{name}.json", f"{name}.md", f"{name}.png"]}


def _sync_table(record) -> str:
    rows = record["rows"]
    models = list(dict.fromkeys(r["model"] for r in rows))
    pols = list(dict.fromkeys(r["policy"] for r in rows))
    cfg = record["config"]
    cl = cfg["cluster"]
    lines = [f"Virtual seconds to reach the target test accuracy (median of {cfg['seeds']} seeds; "
             f"— = not reached within the run) on {len(cl['means'])} simulated workers with mean iteration "
             f"times {tuple(cl['means'])} (log-normal σ = {cl['sigma']}); each update applied on arrival with "
             "SGD; gradients are real (JAX) on the parameters each worker pulled.", ""]
    head = "| model (target) | " + " | ".join(pols) + " |"
    lines += [head, "|" + "---|" * (len(pols) + 1)]
    for m in models:
        rm = {r["policy"]: r for r in rows if r["model"] == m}
        tgt = next(iter(rm.values()))["target"]
        lines.append(f"| {m} ({tgt:.2f}) | " + " | ".join(_fmt(rm[p]["median_time_to_target"]) for p in pols) + " |")
        lines.append(f"| speed-up vs BSP | " + " | ".join(
            "—" if rm[p]["speedup_vs_bsp"] is None else f"{rm[p]['speedup_vs_bsp']:.2f}×" for p in pols) + " |")
        lines.append(f"| final accuracy | " + " | ".join(f"{rm[p]['final_accuracy']:.3f}" for p in pols) + " |")
        lines.append(f"| waiting (s, all workers) | " + " | ".join(
            f"{sum(rm[p]['wait_per_worker']):.0f}" for p in pols) + " |")
        lines.append(f"| barriers | " + " | ".join(f"{rm[p]['barriers']:.0f}" for p in pols) + " |")
        lines.append(f"| mean / max staleness | " + " | ".join(
            f"{rm[p]['mean_staleness']:.1f} / {rm[p]['max_staleness']}" for p in pols) + " |")
    return "\n".join(lines) + "\n"


def plot_sync_models(record, path) -> None:
    """Accuracy vs virtual time (seed 0) per model, and waiting per policy."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    curves = record["curves"]
    models = list(dict.fromkeys(c["model"] for c in curves))
    fig, axes = plt.subplots(1, len(models) + 1, figsize=(5.2 * (len(models) + 1), 4))
    axes = np.atleast_1d(axes)
    cmap = plt.get_cmap("tab20")
    for ax, m in zip(axes, models):
        cs = [c for c in curves if c["model"] == m and c["seed"] == 0]
        for k, c in enumerate(cs):
            style = "-" if ("BSP" in c["label"] or c["label"].startswith("DSSP")) else "--"
            ax.plot(c["time"], c["accuracy"], style, color=cmap(k % 20), label=c["label"], lw=1.3)
        tgt = next(r["target"] for r in record["rows"] if r["model"] == m)
        ax.axhline(tgt, color="k", lw=0.6, ls=":")
        ax.set_title(f"{m}: test accuracy (seed 0)")
        ax.set_xlabel("virtual time (s)")
        ax.set_ylim(max(0.0, tgt - 0.4), 1.0)
    axes[0].legend(fontsize=7, ncol=2)
    ax = axes[-1]
    rows = record["rows"]
    pols = list(dict.fromkeys(r["policy"] for r in rows))
    width = 0.8 / max(1, len(models))
    for j, m in enumerate(models):
        rm = {r["policy"]: r for r in rows if r["model"] == m}
        ax.bar(np.arange(len(pols)) + j * width, [sum(rm[p]["wait_per_worker"]) for p in pols], width, label=m)
    ax.set_xticks(np.arange(len(pols)) + width * (len(models) - 1) / 2)
    ax.set_xticklabels(pols, rotation=60, ha="right", fontsize=7)
    ax.set_ylabel("total waiting (virtual s)")
    ax.set_title("waiting, summed over workers")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _zipline_input(n, R, seed):
    """ElasticBSP's predictions: row p = start_p + i·interval_p, i = 1..R (heterogeneous intervals)."""
    rng = np.random.default_rng([seed, n, R])
    start = rng.uniform(0.0, 1.0, size=(n, 1))
    interval = rng.uniform(0.5, 2.5, size=(n, 1))
    return start + interval * np.arange(1, R + 1)


def zipline_runtimes(config, workdir) -> dict:
    """Median wall time of each ZipLine method on n × R prediction matrices; heuristics' gap to the optimum."""
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    name = config.get("name", "zipline_runtimes")
    methods = list(config.methods)
    for m in methods:
        if m not in ZIPLINE_METHODS:
            raise ValueError(f"config.methods: unknown method {m!r}; expected some of {sorted(ZIPLINE_METHODS)}")
    max_points = dict(_plain(config.max_points))
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
            opt = answers[methods[0]][1]
            row = {"workers": int(n), "R": int(R)}
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
              "plot": "bppsa.sync.experiments:plot_zipline_runtimes",
              "config": _plain(config), "rows": rows,
              "target_1000x150_s": None if target is None else target.get(f"{methods[0]}_s"),
              "paper_1000x150_s": 2.38, "provenance": provenance(_command(config))}
    md = _zipline_table(record)
    save_json(workdir / f"{name}.json", record)
    (workdir / f"{name}.md").write_text(md)
    plot_zipline_runtimes(record, workdir / f"{name}.png")
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
             "Heuristic columns give time / range found (optimal range in the last column); — = skipped (too slow).",
             "", "| workers | R | " + " | ".join(_ZL_LABELS.get(m, m) for m in methods) + " | optimal range |",
             "|" + "---|" * (len(methods) + 3)]
    exact = {"window", "zipline", "zipline_opt", "bsearch", "brute_force"}
    for r in record["rows"]:
        cells = []
        for m in methods:
            t = r[f"{m}_s"]
            if t is None:
                cells.append("—")
            elif m in exact:
                cells.append(f"{1e3 * t:.2f} ms")
            else:
                cells.append(f"{1e3 * t:.2f} ms / {r[f'{m}_range']:.3f}")
        lines.append(f"| {r['workers']} | {r['R']} | " + " | ".join(cells) + f" | {r['optimal_range']:.4f} |")
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


def _load_config(path, arg):
    spec = importlib.util.spec_from_file_location("_bppsa_config", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.get_config(arg)


def _main(argv, prog, config_name, task):
    p = argparse.ArgumentParser(prog=prog, description=f"run experiments/configs/{config_name}.py and save its results")
    p.add_argument("--smoke", action="store_true", help="the config's smoke variant (seconds)")
    p.add_argument("--quick", action="store_true", help="same as --smoke")
    p.add_argument("--out", default=None,
                   help="output folder (default: experiments/results/<device>/, or runs/<name>-smoke for --smoke)")
    a = p.parse_args(argv)
    smoke = a.smoke or a.quick
    config = _load_config(_ROOT / "experiments" / "configs" / f"{config_name}.py", "smoke" if smoke else None)
    config.command = f"{prog}{' --smoke' if smoke else ''}"
    out = Path(a.out) if a.out else (Path("runs") / f"{config_name}-smoke" if smoke
                                     else _ROOT / "experiments" / "results" / device_label())
    summary = task(config, out)
    print(f"wrote {', '.join(str(out / f) for f in summary['files'])}")
    return 0


def main_sync(argv=None) -> int:
    """``bppsa reproduce sync [--smoke] [--out DIR]``."""
    return _main(argv, "bppsa reproduce sync", "sync_models", sync_models)


def main_zipline(argv=None) -> int:
    """``bppsa reproduce zipline [--smoke] [--out DIR]``."""
    return _main(argv, "bppsa reproduce zipline", "zipline_runtimes", zipline_runtimes)
