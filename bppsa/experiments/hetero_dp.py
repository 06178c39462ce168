"""The heterogeneous data-parallel experiment: strategies × speed mixes × tasks × seeds.

``run(config, workdir)`` (the task of experiments/configs/hetero_dp.py) trains every
combination with :class:`~bppsa.hetero.train.SimulatedReplicas` (one process, 4 devices, a time
model fitted to real timings on this machine), optionally validates the clock with real replica
processes (:mod:`bppsa.hetero.worker` started by :func:`bppsa.parallel.launch.launch`: real
sleeps, jax.distributed over loopback), and writes hetero_dp.json / .md / .png into ``workdir``.
"""

from __future__ import annotations

import io
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from ..hetero.profile import TimeModel, slowdowns_from_mix
from ..hetero.tasks import task_from_config
from ..hetero.train import SimulatedReplicas, measure_time_model, train
from ..parallel.launch import launch
from ..provenance import device_label, provenance, save_json

__all__ = ["run", "summarize", "markdown"]


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
        rows.append({"task": task, "scenario": scenario, "strategy": strategy, "seeds": len(rs),
                     "accuracy_mean": float(acc.mean()), "accuracy_std": float(acc.std()),
                     "time_per_epoch_mean": float(tpe.mean()), "time_per_epoch_std": float(tpe.std()),
                     "partition": rs[0]["initial_partition"]})
    for row in rows:  # speed-up over uniform in the same scenario
        ref = [r for r in rows if r["task"] == row["task"] and r["scenario"] == row["scenario"]
               and r["strategy"] == "uniform"]
        row["speedup_vs_uniform"] = ref[0]["time_per_epoch_mean"] / row["time_per_epoch_mean"] if ref else None
    return rows


def markdown(rows: list[dict], process_rows: list[dict] | None = None, title: str = "") -> str:
    lines = [f"### {title}" if title else "",
             "| task | speeds, placement | strategy | batches b_i | test accuracy | time / epoch (s) | speed-up vs uniform |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['task']} | {r['scenario']} | {r['strategy']} | {r['partition']} | "
                     f"{r['accuracy_mean']:.4f} ± {r['accuracy_std']:.4f} | {r['time_per_epoch_mean']:.4f} | "
                     f"{r['speedup_vs_uniform']:.2f}× |")
    if process_rows:
        lines += ["", "Real replica processes (jax.distributed on 127.0.0.1, gloo; slow replicas really sleep):", "",
                  "| task | speeds | strategy | batches b_i | test accuracy | measured time / epoch (s) | speed-up vs uniform |",
                  "|---|---|---|---|---|---|---|"]
        for r in process_rows:
            lines.append(f"| {r['task']} | {r['scenario']} | {r['strategy']} | {r['partition']} | "
                         f"{r['accuracy_mean']:.4f} | {r['time_per_epoch_mean']:.3f} | {r['speedup_vs_uniform']:.2f}× |")
    return "\n".join(lines).lstrip("\n") + "\n"


def _plot(runs, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    panels = sorted({(r["task"], r["scenario"]) for r in runs})
    cols = min(3, len(panels))
    rows_n = (len(panels) + cols - 1) // cols
    fig, axes = plt.subplots(rows_n, cols, figsize=(4.6 * cols, 3.4 * rows_n), squeeze=False)
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
        ax.set_xlabel("(modelled) wall-clock time (s)")
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


def _run_processes(config, log) -> list[dict]:
    """Real replica processes: one launch of P workers runs every strategy; returns their records."""
    pc = config.processes
    with tempfile.TemporaryDirectory() as tmp:
        spec = {"task": pc.task, "task_config": dict(config.tasks[pc.task]), "mix": list(pc.mix),
                "strategies": list(config.strategies), "seeds": list(pc.seeds), "epochs": int(pc.epochs),
                "placement": pc.placement, "probe_batches": list(config.probe_batches),
                "profile_repeats": int(config.profile_repeats)}
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
        return json.loads((Path(tmp) / "runs.json").read_text())


def _ensure_cpu_devices(n: int):
    """Ask for n host devices when JAX has not started its CPU backend yet (no effect after)."""
    import jax
    from jax._src import xla_bridge
    if not xla_bridge.backends_are_initialized():
        if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
            jax.config.update("jax_num_cpu_devices", max(n, 8))


def run(config, workdir) -> dict:
    """Run the experiment described by ``config`` (see experiments/configs/hetero_dp.py)."""
    import jax

    _ensure_cpu_devices(max(len(m) for m in config.mixes.values()))
    if jax.device_count() < max(len(m) for m in config.mixes.values()):
        raise RuntimeError(f"need {max(len(m) for m in config.mixes.values())} devices; have {jax.device_count()}: "
                           "set XLA_FLAGS=--xla_force_host_platform_device_count=8 before JAX starts "
                           "(this task does so itself when it runs before anything else starts JAX)")
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    log = print
    runs, time_models = [], {}
    t_start = time.perf_counter()
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
    process_runs, process_rows = [], []
    if config.processes.enabled:
        try:
            process_runs = _run_processes(config, log)
        except (RuntimeError, OSError) as e:  # keep the simulated sweep; record why this part is missing
            log(f"real-process block failed: {e}")
            process_runs = [{"error": str(e)[-2000:]}]
        for r in process_runs:
            r.update(task=config.processes.task, scenario=_mix_name(config.processes.mix) + ", " +
                     config.processes.placement)
        process_rows = summarize(process_runs) if "error" not in process_runs[0] else []
    md = markdown(rows, process_rows, title=f"Heterogeneous data parallelism ({device_label()}, "
                  f"time model: {config.time_model}, fitted to real timings × slowdown factors)")
    record = {"config": json.loads(config.to_json_best_effort()), "time_models": time_models, "summary": rows, "runs": runs,
              "process_summary": process_rows, "process_runs": process_runs,
              "seconds": time.perf_counter() - t_start,
              "provenance": provenance(config.get("command") or None)}
    save_json(workdir / "hetero_dp.json", record)
    (workdir / "hetero_dp.md").write_text(md)
    _plot(runs, workdir / "hetero_dp.png")
    log("\n" + md)
    log(f"wrote {workdir / 'hetero_dp.json'}, .md, .png")
    return {"summary": rows, "process_summary": process_rows, "workdir": str(workdir)}
