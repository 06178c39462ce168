"""The heterogeneous data-parallel experiment: strategies × speed mixes × tasks × seeds.

``run(config, workdir)`` (the task of experiments/paper_hetero/configs/hetero_dp.py) runs, when enabled,
real replica processes first (:mod:`bppsa.hetero.worker` started by
:func:`bppsa.parallel.launch.launch`: jax.distributed over loopback, slow replicas really
sleep; every strategy and seed, plus a drift scenario with re-balancing on and off), then the
simulated sweep: every combination with :class:`~bppsa.hetero.train.SimulatedReplicas` (one
process, 4 devices, a clock from a time model fitted to real timings on this machine). Writes
<name>.json / .md / .png (and <name>_drift.png) into ``workdir``; every table says which times
were measured on real processes and which come from a time model.
"""

from __future__ import annotations

import io
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from bppsa.errors import UsageError, checked_by, require_choices, require_int, require_number
from bppsa.hetero.profile import TimeModel, slowdowns_from_mix
from bppsa.hetero.train import SimulatedReplicas, measure_time_model, task_from_config, task_options, train
from bppsa.parallel.launch import launch
from bppsa.tasks import check_task
from experiments import entry, part_failed
from experiments.provenance import device_label, provenance, save_json
from experiments.tables import markdown_table

__all__ = ["run", "summarize", "drift_summary", "markdown"]


def _mix_name(mix):
    return ":".join(f"{v:g}" for v in mix)


def summarize(runs: list[dict]) -> list[dict]:
    """Mean ± std over seeds per (task, scenario, strategy)."""
    groups: dict = {}
    for r in runs:
        groups.setdefault((r["task"], r["scenario"], r["strategy"]), []).append(r)
    rows = []
    for (task, scenario, strategy), rs in groups.items():
        acc = np.array([r["final_accuracy"] for r in rs])
        tpe = np.array([r["time_per_epoch"] for r in rs])
        row = {"task": task, "scenario": scenario, "strategy": strategy, "seeds": len(rs),
               "accuracy_mean": float(acc.mean()), "accuracy_std": float(acc.std()),
               "time_per_epoch_mean": float(tpe.mean()), "time_per_epoch_std": float(tpe.std()),
               "partition": rs[0]["initial_partition"],
               "min_samples": int(min(min(r["initial_partition"]) for r in rs))}
        if all("time_per_epoch_model" in r for r in rs):  # real processes: the time model's prediction beside
            model = float(np.mean([r["time_per_epoch_model"] for r in rs]))
            row.update(time_per_epoch_model_mean=model, model_error=model / row["time_per_epoch_mean"] - 1)
        rows.append(row)
    for row in rows:  # speed-up over uniform in the same scenario
        ref = [r for r in rows if r["task"] == row["task"] and r["scenario"] == row["scenario"]
               and r["strategy"] == "uniform"]
        row["speedup_vs_uniform"] = ref[0]["time_per_epoch_mean"] / row["time_per_epoch_mean"] if ref else None
    return rows


def _times(v):
    return "-" if v is None else f"{v:.2f}×"


def drift_summary(drift_runs: list[dict]) -> list[dict]:
    """Per drift run: mean step time before the drift, right after it and in the last epoch, switches."""
    rows = []
    for r in drift_runs:
        t, at = np.asarray(r["step_times"]), r["drift"]["at_step"]
        steps = len(t) // r["epochs"]
        rows.append({"rebalance_every": r["rebalance_every"], "drift": r["drift"],
                     "partition": r["initial_partition"], "final_partition": r["final_partition"],
                     "repartitions": r["repartitions"], "step_s_before": float(np.median(t[:at])),
                     "step_s_last_epoch": float(np.median(t[-steps:])),
                     "epoch_times": np.diff([h["time"] for h in r["history"]]).tolist(),
                     "accuracy": r["final_accuracy"]})
    return rows


def markdown(rows: list[dict], process_rows: list[dict] | None = None, title: str = "",
             drift_rows: list[dict] | None = None, process_info: dict | None = None) -> str:
    lines = [f"### {title}" if title else ""]
    if process_rows:
        info = process_info or {}
        lines += ["", "Real replica processes (jax.distributed on 127.0.0.1, gloo), measured: each replica computes "
                  "its own batch, then sleeps τ·f_i·b_i (τ = "
                  f"{1e3 * info.get('tau_s', float('nan')):.3f} ms per sample, f_i = the configured slowdown); speeds "
                  "profiled one replica at a time. The model column is the time model from that profile "
                  "(steps × (slowest t_i(b_i) + all-reduce)).", ""]
        lines.append(markdown_table(
            ["task", "speeds, placement", "strategy", "batches b_i (initial)", "test accuracy (mean of seeds)",
             "time / epoch (s), measured", "time / epoch (s), time model", "model error",
             "speed-up vs uniform, measured"],
            [[r["task"], r["scenario"], r["strategy"], r["partition"],
              f"{r['accuracy_mean']:.4f} ± {r['accuracy_std']:.4f} (n = {r['seeds']})",
              f"{r['time_per_epoch_mean']:.3f}"]
             + ([f"{r['time_per_epoch_model_mean']:.3f}", f"{100 * r['model_error']:+.1f} %"] if "model_error" in r
                else ["-", "-"])
             + [_times(r["speedup_vs_uniform"])] for r in process_rows]))
    if drift_rows:
        d = drift_rows[0]["drift"]
        lines += ["", f"Drift on real processes, measured: replica {d['replica']} becomes {d['factor']:g}× slower at "
                  f"step {d['at_step']}.", ""]
        lines.append(markdown_table(
            ["re-balancing", "step time before drift (ms)", "step time, last epoch (ms)", "time per epoch (s)",
             "re-partitions (step: from → to)", "test accuracy"],
            [[f"every {r['rebalance_every']} steps" if r["rebalance_every"] else "off",
              f"{1e3 * r['step_s_before']:.1f}",
              f"{1e3 * r['step_s_last_epoch']:.1f}", ", ".join(f"{v:.2f}" for v in r["epoch_times"]),
              "; ".join(f"{x['step']}: {x['from']} → {x['to']}" for x in r["repartitions"]) or "none",
              f"{r['accuracy']:.4f}"] for r in drift_rows]))
    if rows:
        lines += ["", "Simulated replicas (one process, 4 devices), time model: replica i's step takes f_i·τ·b_i "
                  "(τ measured on this machine); times are the model's, accuracies are real training.", ""]
        lines.append(markdown_table(
            ["task", "speeds, placement", "strategy", "batches b_i", "test accuracy", "time / epoch (s), time model",
             "speed-up vs uniform, time model"],
            [[r["task"], r["scenario"], r["strategy"], r["partition"],
              f"{r['accuracy_mean']:.4f} ± {r['accuracy_std']:.4f}", f"{r['time_per_epoch_mean']:.4f}",
              _times(r["speedup_vs_uniform"])] for r in rows]))
    return "\n".join(lines).lstrip("\n") + "\n"


def _plot_drift(drift_runs, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 3.4))
    for r, c in zip(drift_runs, ("tab:blue", "tab:red")):
        t = 1e3 * np.asarray(r["step_times"])
        label = f"re-balancing every {r['rebalance_every']} steps" if r["rebalance_every"] else "re-balancing off"
        ax.plot(np.arange(len(t)), t, "-", lw=1, color=c, label=label)
        for x in r["repartitions"]:
            ax.axvline(x["step"], color=c, ls=":", lw=1)
    d = drift_runs[0]["drift"]
    ax.axvline(d["at_step"], color="k", ls="--", lw=1, label=f"replica {d['replica']} {d['factor']:g}× slower")
    ax.set_xlabel("step")
    ax.set_ylabel("step time (ms), measured")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title("Drift on real replica processes (dotted: re-partitions)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _plot(runs, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    panels = sorted({(r["task"], r["scenario"]) for r in runs})
    cols = min(3, len(panels))
    rows_n = (len(panels) + cols - 1) // cols
    fig, axes = plt.subplots(rows_n, cols, figsize=(max(4.6 * cols, 7.5), 3.4 * rows_n), squeeze=False)
    colors = {"uniform": "tab:gray", "proportional-mean": "tab:red", "proportional-weighted": "tab:blue"}
    for ax, (task, scen) in zip(axes.flat, panels):
        for strategy, c in colors.items():
            rs = [r for r in runs if r["task"] == task and r["scenario"] == scen and r["strategy"] == strategy]
            if not rs:
                continue
            t = np.mean([[h["time"] for h in r["history"]] for r in rs], 0)
            a = np.array([[h["accuracy"] for h in r["history"]] for r in rs])
            ax.plot(t, a.mean(0), "-o", ms=3, color=c, label=strategy)
            ax.fill_between(t, a.min(0), a.max(0), color=c, alpha=0.15)
        ax.set_title(f"{task}  [{scen}]", fontsize=9)
        ax.set_xlabel("wall-clock time (s), " + ("measured" if "real processes" in scen else "time model"))
        ax.set_ylabel("test accuracy")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=8, loc="lower right")
    fig.suptitle("Heterogeneous data parallelism: accuracy vs wall-clock (mean over seeds, band = min..max)",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _run_processes(config, log) -> dict:
    """Real replica processes: one launch of P workers runs every strategy (and the drift scenario)."""
    pc = config.processes
    with tempfile.TemporaryDirectory() as tmp:
        spec = {"task": pc.task, "task_config": dict(config.tasks[pc.task]), "mix": list(pc.mix),
                "strategies": list(config.strategies), "seeds": list(pc.seeds), "epochs": int(pc.epochs),
                "placement": pc.placement, "probe_batches": list(pc.get("probe_batches", config.probe_batches)),
                "profile_repeats": int(config.profile_repeats), "emulation": pc.get("emulation", "sleep"),
                "sleep_scale": float(pc.get("sleep_scale", 8.0)), "tau": pc.get("tau"),
                "min_per_replica": int(pc.get("min_per_replica", 1)),
                "max_speed_ratio": float(pc.get("max_speed_ratio", 16.0)),
                "drift": dict(pc.drift) if pc.get("drift") and pc.drift.get("enabled", True) else None}
        if spec["drift"]:
            spec["drift"].pop("enabled", None)
        (Path(tmp) / "spec.json").write_text(json.dumps(spec))
        log(f"real processes: {len(pc.mix)} replicas at speeds {_mix_name(pc.mix)} on {pc.task} ...")
        t0 = time.perf_counter()
        out, err = io.StringIO(), io.StringIO()
        rc = launch([sys.executable, "-m", "bppsa.hetero.worker", str(Path(tmp) / "spec.json")], len(pc.mix),
                    devices_per_process=1, timeout=pc.timeout_s, out=out, err=err)
        if rc != 0:
            raise RuntimeError(f"replica processes failed ({rc}):\n{err.getvalue()[-4000:]}")
        log("\n".join(line[4:] for line in out.getvalue().splitlines() if line.startswith("[0] ")))
        log(f"real processes done in {time.perf_counter() - t0:.1f} s")
        result = json.loads((Path(tmp) / "runs.json").read_text())
        result["seconds"] = time.perf_counter() - t0
        return result


def _ensure_cpu_devices(n: int):
    """Ask for n host devices when JAX has not started its CPU backend yet (no effect after)."""
    import jax
    from jax._src import xla_bridge
    if not xla_bridge.backends_are_initialized():
        if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
            jax.config.update("jax_num_cpu_devices", max(n, 8))


def _check_mix(key: str, mix: list) -> list:
    """A mix is >= 2 positive, finite speed ratios (one per replica)."""
    if len(mix) < 2 or any(isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating))
                           or not 0 < v < float("inf") for v in mix):
        raise UsageError(f"{key} must be >= 2 positive speed ratios, one per replica; got {mix!r}")
    return mix


def check(config):
    """The config's values, checked before anything runs (UsageError naming the key)."""
    from bppsa.hetero.processes import EMULATIONS
    from bppsa.hetero.train import STRATEGIES
    require_choices(config, "strategies", tuple(STRATEGIES), many=True)
    require_int(config, "profile_repeats")
    pc = config.processes
    for key, mix in config.mixes.items():
        _check_mix(f"config.mixes.{key}", list(mix))
    for scen in config.scenarios:
        if scen.mix not in config.mixes:
            raise UsageError(f"a scenario names mix {scen.mix!r}, which config.mixes does not have "
                             f"(it has {sorted(config.mixes)})")
    for name in list(config.task_names) + ([pc.task] if pc.enabled else []):
        if name not in config.tasks:
            raise UsageError(f"config.tasks has no entry {name!r} (it has {sorted(config.tasks)})")
        try:
            check_task(name, **task_options(config.tasks[name]))  # an unknown name or option; JAX not started
        except ValueError as e:
            raise UsageError(f"config.tasks.{name}: {e}") from None
    if not pc.enabled:
        return
    mix = _check_mix("config.processes.mix", list(pc.mix))
    require_int(config, "processes.epochs")
    require_choices(config, "processes.emulation", EMULATIONS)
    require_number(config, "processes.sleep_scale")
    if pc.tau is not None:
        require_number(config, "processes.tau", strict=False)
    m = require_int(config, "processes.min_per_replica", minimum=0)
    batch = config.tasks[pc.task].batch_size
    if batch < m * len(mix):
        raise UsageError(f"config.tasks.{pc.task}.batch_size = {batch} cannot give each of the {len(mix)} replicas "
                         f"processes.min_per_replica = {m} samples")
    if pc.drift.enabled:
        require_int(config, "processes.drift.replica", minimum=0, maximum=len(mix) - 1)
        require_number(config, "processes.drift.factor")
        require_int(config, "processes.drift.rebalance_every")
        if not 0 < pc.drift.at < 1:
            raise UsageError(f"config.processes.drift.at must be a fraction of the run in (0, 1); got {pc.drift.at!r}")


@checked_by(check)
def run(config, workdir) -> dict:
    """Run the experiment described by ``config`` (see experiments/paper_hetero/configs/hetero_dp.py)."""
    import jax

    _ensure_cpu_devices(max(len(m) for m in config.mixes.values()))
    if jax.device_count() < max(len(m) for m in config.mixes.values()):
        raise RuntimeError(f"need {max(len(m) for m in config.mixes.values())} devices; have {jax.device_count()}: "
                           "set XLA_FLAGS=--xla_force_host_platform_device_count=8 before JAX starts "
                           "(this task does so itself when it runs before anything else starts JAX)")
    Path(workdir).mkdir(parents=True, exist_ok=True)  # a folder of yours when called directly
    log = print
    runs, time_models = [], {}
    t_start = time.perf_counter()
    process: dict[str, Any] = {}
    process_runs, process_rows, drift_rows = [], [], []
    failed_parts: list[dict] = []
    if config.processes.enabled:
        try:
            process = _run_processes(config, log)
        except (RuntimeError, OSError) as e:  # the run fails, unless config.keep_partial keeps the simulated sweep
            part_failed(config, "the real-process block", e, failed_parts)
            log(f"real-process block failed (kept partial results): {e}")
            process = {"error": str(e)[-2000:]}
        process_runs = process.get("runs", [])
        for r in process_runs + process.get("drift_runs", []):
            r.update(task=config.processes.task,
                     scenario=f"{_mix_name(config.processes.mix)}, {config.processes.placement}, real processes")
        process_rows = summarize(process_runs)
        drift_rows = drift_summary(process.get("drift_runs", []))
    for task_name in config.task_names:
        tcfg = config.tasks[task_name]
        task = task_from_config(task_name, tcfg)
        params, loss_fn = task.init(jax.random.key(0)), task.per_sample_loss
        base = measure_time_model(loss_fn, params, task.x_train, task.y_train,
                                  [b for b in config.probe_batches if b <= len(task.x_train)], repeats=5)
        measured = base
        if config.time_model == "proportional":  # speeds are throughput ratios: t(b) ∝ b at the measured rate
            b_ref = tcfg.batch_size / max(len(m) for m in config.mixes.values())
            base = TimeModel(0.0, float(base.time(b_ref)) / b_ref)
        elif config.time_model != "affine":
            raise ValueError(f"time_model must be 'proportional' or 'affine'; got {config.time_model!r}")
        time_models[task_name] = {"measured": {"alpha": measured.alpha, "beta": measured.beta},
                                  "used": {"alpha": base.alpha, "beta": base.beta}}
        log(f"[{task_name}] {task.description}; one replica's step measured: t(b) = {1e3 * measured.alpha:.3f} ms"
            f" + b × {1e6 * measured.beta:.2f} µs; time model used ({config.time_model}): "
            f"{1e3 * base.alpha:.3f} ms + b × {1e6 * base.beta:.2f} µs")
        for scen in config.scenarios:
            mix = list(config.mixes[scen.mix])
            schedule = slowdowns_from_mix(mix)
            if scen.get("drift_to") is not None:  # speeds change at drift_epoch
                steps = len(task.x_train) // tcfg.batch_size
                schedule = [(0, schedule), (int(scen.drift_epoch * steps), slowdowns_from_mix(scen.drift_to))]
            replicas = SimulatedReplicas(loss_fn, schedule, base, comm_s=config.comm_s, jitter=config.jitter)
            scen_name = scen.get("name") or f"{_mix_name(mix)}, {scen.placement}"
            for strategy in scen.get("strategies", config.strategies):
                for seed in config.seeds:
                    t0 = time.perf_counter()
                    r = train(task, replicas, strategy=strategy, batch_size=tcfg.batch_size, epochs=tcfg.epochs,
                              learning_rate=tcfg.learning_rate, seed=seed, placement=scen.placement,
                              probe_batches=config.probe_batches, profile_repeats=config.profile_repeats,
                              rebalance_every=scen.get("rebalance_every", 0))
                    r.update(task=task_name, scenario=scen_name, mix=mix, real_seconds=time.perf_counter() - t0)
                    runs.append(r)
                    log(f"[{task_name} | {scen_name}] {strategy:22s} seed {seed}: batches {r['initial_partition']} "
                        f"acc {r['final_accuracy']:.4f}  time/epoch {r['time_per_epoch']:.4f} s"
                        + (f"  ({len(r['repartitions'])} re-partitions)" if r["repartitions"] else ""))
    rows = summarize(runs)
    name = config.get("name") or "hetero_dp"
    md = markdown(rows, process_rows, title=f"Heterogeneous data parallelism ({device_label()})",
                  drift_rows=drift_rows, process_info=process.get("calibration"))
    record = {"config": json.loads(config.to_json_best_effort()), "time_models": time_models, "summary": rows,
              "runs": runs, "process_summary": process_rows, "process_runs": process_runs,
              "process_calibration": process.get("calibration"), "process_profile": process.get("profile"),
              "process_speeds": process.get("speeds"), "drift_summary": drift_rows,
              "drift_runs": process.get("drift_runs", []), "process_error": process.get("error"),
              "seconds": time.perf_counter() - t_start, "provenance": provenance(config.get("command") or None)}
    save_json(entry(workdir, f"{name}.json"), record)
    entry(workdir, f"{name}.md").write_text(md)
    written = [f"{name}.json", f"{name}.md"]
    if runs or process_runs:
        _plot(process_runs + runs, entry(workdir, f"{name}.png"))
        written.append(f"{name}.png")
    if process.get("drift_runs"):
        _plot_drift(process["drift_runs"], entry(workdir, f"{name}_drift.png"))
        written.append(f"{name}_drift.png")
    log("\n" + md)
    log(f"wrote {', '.join(written)} in {workdir}")
    return {"summary": rows, "process_summary": process_rows, "workdir": str(workdir),
            **({"failed_parts": failed_parts} if failed_parts else {})}
