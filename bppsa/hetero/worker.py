"""One replica process of the real-process experiment (started by bppsa.hetero.launch.spawn).

``python -m bppsa.hetero.worker SPEC.json``: trains the spec's task with every strategy and
seed on P = (number of processes) replicas, this one slowed down by its factor from the speed
mix; process 0 writes ``runs.json`` next to the spec.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(argv=None) -> int:
    from .launch import init_distributed

    spec_path = Path((argv or sys.argv[1:])[0])
    spec = json.loads(spec_path.read_text())
    pid, nproc = init_distributed()

    import jax

    from .experiment import _task, slowdowns_from_mix
    from .tasks import functional
    from .train import ProcessReplicas, train

    from ml_collections import ConfigDict
    task = _task(spec["task"], ConfigDict(spec["task_config"]))
    tcfg = spec["task_config"]
    _, loss_fn, _ = functional(task.make_model(0))
    replicas = ProcessReplicas(loss_fn, slowdowns_from_mix(spec["mix"]))
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
