"""One replica process of the real-process experiment (started with :func:`bppsa.parallel.launch.launch`).

``python -m bppsa.hetero.worker SPEC.json``: trains the spec's task with every strategy and
seed on P = (number of processes) replicas, this one slowed down by its factor from the speed
mix; process 0 writes ``runs.json`` next to the spec. SPEC holds ``task`` (a name for
:func:`~bppsa.hetero.tasks.task_from_config`), ``task_config`` (its config, with batch_size and
learning_rate), ``mix`` (speed ratios, one per process), ``strategies``, ``seeds``, ``epochs``,
``placement``, ``probe_batches`` and ``profile_repeats``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(argv=None) -> int:
    from ..parallel.mesh import initialize

    spec_path = Path((argv or sys.argv[1:])[0])
    spec = json.loads(spec_path.read_text())
    initialize()  # before any other JAX call

    import jax

    from .profile import slowdowns_from_mix
    from .tasks import task_from_config
    from .train import ProcessReplicas, train

    pid = jax.process_index()
    tcfg = spec["task_config"]
    task = task_from_config(spec["task"], tcfg)
    replicas = ProcessReplicas(task.per_sample_loss, slowdowns_from_mix(spec["mix"]))
    log = print if pid == 0 else None
    runs = []
    for strategy in spec["strategies"]:
        for seed in spec["seeds"]:
            r = train(task, replicas, strategy=strategy, batch_size=tcfg["batch_size"], epochs=spec["epochs"],
                      learning_rate=tcfg["learning_rate"], seed=seed, placement=spec["placement"],
                      probe_batches=spec["probe_batches"], profile_repeats=spec["profile_repeats"], log=log)
            r["mix"] = spec["mix"]
            runs.append(r)
    if pid == 0:
        (spec_path.parent / "runs.json").write_text(json.dumps(runs, default=float))
    jax.distributed.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
