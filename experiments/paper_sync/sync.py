"""Elastic synchronization experiments (the tasks of experiments/paper_sync/configs/sync.py and sync_ray.py).

- :func:`sync_models` — time to a target test accuracy for BSP, ASP, SSP(s), DSSP(s_L, r_max) and
  ElasticBSP(R) on a heterogeneous 4-worker cluster (simulated clock, real gradients), training a
  small CNN on scikit-learn's digits and a GRU on a synthetic sequence task; the table has the
  layout of DSSP's Table I (one row per model, one column per policy), plus accuracy-vs-time curves.
- :func:`sync_ray` — the same policies on the real Ray runtime (:func:`bppsa.sync.ray_runtime.run_ray`),
  each for a fixed wall-clock time, optionally killing a worker mid-run.

Each writes ``<name>.json`` (with provenance) and ``<name>.md`` (sync_models also ``<name>.png``)
into ``workdir``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

from bppsa.errors import UsageError, checked_by, require_int, require_number
from bppsa.sync.policies import make_policy
from bppsa.sync.simulator import ComputeModel, check_simulation, policy_label, simulate
from bppsa.tasks import check_task, task_from_spec
from experiments import entry
from experiments.provenance import provenance, save_json
from experiments.tables import markdown_table

__all__ = ["sync_models", "check_sync_models", "plot_sync_models", "sync_ray", "check_sync_ray", "parse_policies",
           "parse_kill"]


def _fmt(v, digits=0):
    return "—" if v is None else f"{v:.{digits}f}"


def _compute_model(c) -> ComputeModel:
    """``config.cluster`` as a :class:`ComputeModel`; UsageError naming the key on a bad value."""
    try:
        return ComputeModel(means=tuple(c.means), sigma=c.sigma,
                            stragglers=tuple(tuple(s) for s in c.get("stragglers", ())), comm=c.get("comm", 0.0))
    except (ValueError, TypeError) as e:
        raise UsageError(f"config.cluster: {e}") from None


_MODEL_KEYS = ("label", "task", "learning_rate", "batch_size", "max_time", "eval_every", "target")


def _policies(plain) -> list[tuple[str, dict]]:
    pols = plain.get("policies")
    if not isinstance(pols, list) or not pols or any(
            not isinstance(p, list) or len(p) != 2 or not isinstance(p[0], str) or not isinstance(p[1], dict)
            for p in pols):
        raise UsageError("config.policies must be a non-empty list of (name, options) pairs, e.g. "
                         f"(('bsp', {{}}), ('ssp', {{'s': 3}})); got {pols!r}")
    return [(p[0], dict(p[1])) for p in pols]


def check_sync_models(config) -> None:
    """The config of :func:`sync_models`: every value in range (UsageError naming the key), before any run."""
    require_int(config, "seeds")
    compute = _compute_model(config.cluster)
    plain = json.loads(config.to_json_best_effort())
    for name, opts in _policies(plain):
        try:
            make_policy(name, compute.num_workers, **opts)
        except (ValueError, TypeError) as e:
            raise UsageError(f"config.policies: ({name!r}, {opts!r}): {e}") from None
    models = plain.get("models")
    if not isinstance(models, list) or not models:
        raise UsageError(f"config.models must be a non-empty list of model dicts with keys {_MODEL_KEYS}; "
                         f"got {models!r}")
    for i, m in enumerate(models):
        where = f"config.models[{i}]"
        if not isinstance(m, dict) or set(m) != set(_MODEL_KEYS):
            raise UsageError(f"{where} must be a dict with the keys {_MODEL_KEYS}; got {m!r}")
        for key in ("learning_rate", "target"):
            v = m[key]
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < float("inf") or \
                    (key == "target" and v > 1):
                expected = "a finite number > 0" if key == "learning_rate" else "an accuracy in (0, 1]"
                raise UsageError(f"{where}.{key} must be {expected}; got {v!r}")
        try:
            spec = dict(m["task"])
            check_task(spec.pop("name", None), **spec)
            check_simulation(compute, max_time=m["max_time"], eval_every=m["eval_every"], batch_size=m["batch_size"])
        except (ValueError, TypeError) as e:
            raise UsageError(f"{where}: {e}") from None


@checked_by(check_sync_models)
def sync_models(config, workdir) -> dict:
    """Simulate every (model, policy, seed); write the time-to-accuracy table and curves."""
    check_sync_models(config)
    Path(workdir).mkdir(parents=True, exist_ok=True)  # a folder of yours when called directly
    name = config.get("name", "sync_models")
    plain = json.loads(config.to_json_best_effort())
    compute = _compute_model(config.cluster)
    policies = _policies(plain)
    runs, rows = [], []
    t_start = time.time()
    for m in plain["models"]:
        task = task_from_spec(m["task"])
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
              "name": name, "plot": "experiments.paper_sync.sync:plot_sync_models",
              "config": plain, "rows": rows,
              # full curves for seed 0 (the plot); every seed's numbers are in rows
              "curves": [{"model": r["model"], "label": r["label"], "seed": r["seed"],
                          "time": [round(c["time"], 3) for c in r["curve"]],
                          "accuracy": [round(c["accuracy"], 4) for c in r["curve"]],
                          "wait": r["wait"], "staleness_hist": r["staleness_hist"], "barriers": r["barriers"]}
                         for r in runs if r["seed"] == 0],
              "real_seconds": time.time() - t_start,
              "provenance": provenance(config.get("command") or None)}
    md = _sync_table(record)
    save_json(entry(workdir, f"{name}.json"), record)
    entry(workdir, f"{name}.md").write_text(md)
    plot_sync_models(record, entry(workdir, f"{name}.png"))
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
    body = []
    for m in models:
        rm = {r["policy"]: r for r in rows if r["model"] == m}
        tgt = next(iter(rm.values()))["target"]
        body += [[f"{m} ({tgt:.2f})"] + [_fmt(rm[p]["median_time_to_target"]) for p in pols],
                 ["speed-up vs BSP"] + ["—" if rm[p]["speedup_vs_bsp"] is None else f"{rm[p]['speedup_vs_bsp']:.2f}×"
                                        for p in pols],
                 ["final accuracy"] + [f"{rm[p]['final_accuracy']:.3f}" for p in pols],
                 ["waiting (s, all workers)"] + [f"{sum(rm[p]['wait_per_worker']):.0f}" for p in pols],
                 ["barriers"] + [f"{rm[p]['barriers']:.0f}" for p in pols],
                 ["mean / max staleness"] + [f"{rm[p]['mean_staleness']:.1f} / {rm[p]['max_staleness']}" for p in pols]]
    lines.append(markdown_table(["model (target)"] + pols, body))
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


def parse_policies(text: str, num_workers: int | None = None) -> list[tuple[str, dict]]:
    """``"bsp,ssp:s=3,dssp:s_L=3;r_max=12"`` -> ``[("bsp", {}), ("ssp", {"s": 3}), ("dssp", {...})]``.

    Comma-separated ``policy[:key=value[;key=value]]``; option values are ints. With ``num_workers``
    each policy is also built once, so unknown names and options are refused here. Raises UsageError.
    """
    specs = []
    for item in filter(None, (t.strip() for t in text.split(","))):
        name, _, opts = item.partition(":")
        kw = {}
        for kv in filter(None, opts.split(";")):
            k, eq, v = kv.partition("=")
            try:
                if not eq or not k.strip():
                    raise ValueError
                kw[k.strip()] = int(v)
            except ValueError:
                raise UsageError(f"config.policies: option {kv!r} of {item!r} must be key=<int> "
                                 f"(e.g. 'ssp:s=3'); got {text!r}") from None
        if num_workers is not None:
            try:
                make_policy(name, num_workers, **kw)
            except ValueError as e:
                raise UsageError(f"config.policies: {item!r}: {e}") from None
        specs.append((name, kw))
    if not specs:
        raise UsageError(f"config.policies must name at least one policy (e.g. 'bsp,dssp'); got {text!r}")
    return specs


def parse_kill(text: str, num_workers: int) -> tuple[int, float] | None:
    """``"WORKER:SECONDS"`` -> (worker, seconds) with 0 <= worker < num_workers; ``""`` -> None."""
    if not text:
        return None
    worker, sep, at = text.partition(":")
    try:
        kill = (int(worker), float(at))
    except ValueError:
        kill = None
    if not sep or kill is None or not 0 <= kill[0] < num_workers or not kill[1] >= 0:
        raise UsageError(f"config.kill must be 'WORKER:SECONDS' with WORKER in 0..{num_workers - 1} and "
                         f"SECONDS >= 0 (e.g. '{num_workers - 1}:10'), or '' for none; got {text!r}")
    return kill


def check_sync_ray(config) -> None:
    """The config of :func:`sync_ray`: every value in range (UsageError naming the key), before Ray starts."""
    workers = require_int(config, "workers")
    require_int(config, "num_cpus")
    require_number(config, "duration")
    require_number(config, "dead_timeout")
    parse_policies(config.policies, workers)
    parse_kill(config.kill, workers)
    delays = tuple(config.delays)
    if len(delays) != workers or any(not isinstance(d, (int, float)) or d < 0 for d in delays):
        raise UsageError(f"config.delays must be {workers} numbers >= 0 (one per worker, config.workers = "
                         f"{workers}); got {delays!r}")
    try:
        model = json.loads(config.model)
    except ValueError as e:
        raise UsageError(f"config.model must be a JSON task spec (e.g. '{{\"name\": \"digits_cnn\"}}'); "
                         f"got {config.model!r} ({e})") from None
    try:
        task_from_spec(model)  # an unknown task name or option is refused here, before Ray starts
    except ValueError as e:
        raise UsageError(f"config.model: {e}") from None


@checked_by(check_sync_ray)
def sync_ray(config, workdir) -> dict:
    """Run each of ``config.policies`` on the real Ray runtime for ``config.duration`` wall-clock seconds.

    Config keys: policies (see :func:`parse_policies`), workers, delays (one per worker: seconds
    each sleeps per iteration), duration, kill ("WORKER:SECONDS" or ""), dead_timeout, address
    ("" starts a local Ray with num_cpus CPUs), num_cpus, model (the task spec as JSON).
    """
    import ray

    from bppsa.sync.ray_runtime import init_ray, run_ray

    Path(workdir).mkdir(parents=True, exist_ok=True)  # a folder of yours when called directly
    name = config.get("name", "sync_ray")
    check_sync_ray(config)
    delays = [float(d) for d in config.delays]
    kill = parse_kill(config.kill, config.workers)
    specs = parse_policies(config.policies)
    task = json.loads(config.model)
    started = not ray.is_initialized()  # a Ray the caller started is used as it is, and left running
    if started:
        init_ray(config.address or None, num_cpus=config.num_cpus)
    rows, runs = [], []
    try:
        for policy, kw in specs:
            r = run_ray(task, policy, num_workers=config.workers, policy_options=kw, duration_s=config.duration,
                        delays=delays, kill=kill, dead_timeout=config.dead_timeout, shutdown=False)
            acc = [c["accuracy"] for c in r["curve"]]
            row = {"policy": policy_label(policy, kw), "updates": r["version"], "final_accuracy": acc[-1],
                   "best_accuracy": max(acc), "barriers": r["barriers"],
                   "wait_s": [round(r["wait"][w], 2) for w in sorted(r["wait"])],
                   "pushes": [r["pushes"][w] for w in sorted(r["pushes"])], "dead": r["dead"],
                   "detect_delay_s": r["detect_delay"], "duplicates": len(r["duplicates"]),
                   "refused": len(r["refused"]), "setup_s": r["setup_s"]}
            print(json.dumps(row), flush=True)
            rows.append(row)
            runs.append({k: v for k, v in r.items() if k != "applied"})
    finally:
        if started:
            ray.shutdown()
    lines = [f"Real Ray runtime: {config.workers} worker actors + 1 parameter-server actor on a local Ray "
             f"({config.num_cpus} CPUs), {config.duration:g} s wall clock per policy, injected per-iteration "
             f"delays {delays} s" + (f", worker {kill[0]} killed at {kill[1]:g} s" if kill else "")
             + f"; task {json.dumps(task)}, SGD.", ""]
    body = []
    for r in rows:
        dead = ", ".join(f"w{d['worker']} ({d['detected_by']})" for d in r["dead"]) or "—"
        if r["detect_delay_s"] is not None:
            dead += f", {r['detect_delay_s']:.2f} s"
        body.append([r["policy"], r["updates"], f"{r['final_accuracy']:.3f}", r["barriers"], r["pushes"], r["wait_s"],
                     dead])
    lines.append(markdown_table(["policy", "updates", "final acc.", "barriers", "pushes per worker",
                                 "waiting per worker (s)", "dead (detected by, after)"], body))
    md = "\n".join(lines) + "\n"
    record = {"title": "Elastic synchronization on a real Ray runtime", "name": name, "rows": rows, "runs": runs,
              "config": json.loads(config.to_json_best_effort()),
              "provenance": provenance(config.get("command") or None)}
    save_json(entry(workdir, f"{name}.json"), record)
    entry(workdir, f"{name}.md").write_text(md)
    print(md)
    return {"rows": rows, "files": [f"{name}.json", f"{name}.md"]}
