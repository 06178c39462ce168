"""One replica process of the real-process experiment (started with :func:`bppsa.parallel.launch.launch`).

``python -m bppsa.hetero.worker SPEC.json``: P = (number of processes) replicas at the speeds of
the spec's ``mix``. Once per run it calibrates the emulation (τ, the all-reduce time) and
profiles every replica one at a time; then it trains the spec's task with every strategy and
seed from those speeds, and, when the spec has a ``drift`` block, runs the drift scenario with
re-balancing on and off. Process 0 writes ``runs.json`` next to the spec.

SPEC keys: ``task`` (a task name of :mod:`bppsa.tasks`), ``task_config`` (its options, with
batch_size and learning_rate: :func:`~bppsa.hetero.train.task_from_config`), ``mix``,
``strategies``, ``seeds``, ``epochs``, ``placement``, ``probe_batches``, ``profile_repeats``;
optional ``emulation`` ("sleep"), ``sleep_scale`` (8), ``tau`` (None: calibrated),
``min_per_replica`` (1), ``max_speed_ratio`` (16) and ``drift`` = {"replica", "factor", "at"
(fraction of the run's steps), "rebalance_every", "tolerance", "strategy", "seed"}.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

__all__ = ["modelled_epoch", "main"]


def modelled_epoch(models, counts, steps: int, comm_s: float) -> float:
    """The time model's seconds per epoch: steps × (slowest replica's t_i(b_i) + the all-reduce).

    Args:
      models: the P replicas' :class:`~bppsa.hetero.profile.TimeModel`.
      counts: (P,) the replica batch sizes b_i.
      steps: the steps per epoch.
      comm_s: the all-reduce's seconds per step.

    Returns:
      The modelled seconds per epoch, a float.
    """
    return steps * (max(float(m.time(b)) for m, b in zip(models, counts)) + comm_s)


def main(argv=None) -> int:
    """Run this process's replica of the experiment the spec describes (see the module docstring).

    Args:
      argv: the command line's arguments after the program name, the spec's path first (None or
        empty: ``sys.argv[1:]``).

    Returns:
      0, the exit status, after ``jax.distributed`` is shut down (process 0 first writes
      ``runs.json`` next to the spec).
    """
    from bppsa.parallel.mesh import initialize

    spec_path = Path((argv or sys.argv[1:])[0])
    spec = json.loads(spec_path.read_text())
    initialize()  # before any other JAX call

    import jax
    import numpy as np

    from bppsa.hetero.processes import ProcessReplicas
    from bppsa.hetero.profile import bound_speeds, nominal_speeds, slowdowns_from_mix
    from bppsa.hetero.train import STRATEGIES, task_from_config, train

    pid = jax.process_index()
    log = print if pid == 0 else (lambda s: None)
    tcfg = spec["task_config"]
    B, P = int(tcfg["batch_size"]), jax.process_count()
    task = task_from_config(spec["task"], tcfg)
    base = slowdowns_from_mix(spec["mix"])
    replicas = ProcessReplicas(task.per_sample_loss, base, emulation=spec.get("emulation", "sleep"),
                               tau=spec.get("tau"), sleep_scale=spec.get("sleep_scale", 8.0))
    params0 = jax.tree.map(np.asarray, task.init(jax.random.key(0)))
    calib = replicas.calibrate(params0, task.x_train, task.y_train, max(B // P, 1), repeats=spec["profile_repeats"])
    log(f"calibration: {json.dumps(calib)}")
    models = replicas.profile(spec["probe_batches"], spec["profile_repeats"], params=params0, x=task.x_train,
                              y=task.y_train)
    speeds, clipped = bound_speeds(nominal_speeds(models, B), spec.get("max_speed_ratio", 16.0))
    assert replicas.profile_log is not None  # set by replicas.profile() above
    for row in replicas.profile_log:
        log(f"replica {row['replica']}: step {[round(1e3 * t, 2) for t in row['median_s']]} ms at b = "
            f"{row['probe_batches']} (spread {[round(v, 3) for v in row['spread']]}, rejected {row['rejected']})")
    log(f"speeds at B/P = {B / P:g}: {np.round(speeds / speeds.max(), 3).tolist()}"
        + (f" (replicas {clipped} clipped to the sanity bound)" if clipped else ""))
    steps = len(task.x_train) // B
    common = dict(batch_size=B, epochs=spec["epochs"], learning_rate=tcfg["learning_rate"],
                  placement=spec["placement"], min_per_replica=spec.get("min_per_replica", 1), log=log)
    runs = []
    for strategy in spec["strategies"]:
        for seed in spec["seeds"]:
            r = train(task, replicas, strategy=strategy, seed=seed,
                      speeds=speeds if STRATEGIES[strategy][0] else None, **common)
            r.update(mix=spec["mix"], time_per_epoch_model=modelled_epoch(models, r["initial_partition"], steps,
                                                                         calib["allreduce_s"]))
            runs.append(r)
    drift_runs = []
    d = spec.get("drift")
    if d:
        after = list(base)
        after[d["replica"]] *= d["factor"]
        at = int(d["at"] * steps * spec["epochs"])
        replicas.schedule = [(0, list(base)), (at, after)]
        for every in (d["rebalance_every"], 0):
            log(f"drift: replica {d['replica']} {d['factor']:g}x slower from step {at}; re-balancing "
                + (f"every {every} steps" if every else "off"))
            r = train(task, replicas, strategy=d["strategy"], seed=d["seed"], speeds=speeds, rebalance_every=every,
                      rebalance_tolerance=d.get("tolerance", 0.05), **common)
            r.update(mix=spec["mix"], drift={"replica": d["replica"], "factor": d["factor"], "at_step": at},
                     rebalance_every=every)
            drift_runs.append(r)
        replicas.schedule = [(0, list(base))]
    if pid == 0:
        out = {"calibration": calib, "profile": replicas.profile_log, "speeds": speeds.tolist(),
               "speeds_clipped": clipped, "runs": runs, "drift_runs": drift_runs}
        (spec_path.parent / "runs.json").write_text(json.dumps(out, default=float))
    jax.distributed.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
