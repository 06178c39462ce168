"""Elastic synchronization on a real Ray runtime: each policy for a fixed wall-clock time, one worker killed.

    bppsa run experiments/paper_sync/configs/sync_ray.py --publish   # ~3 min on 2 loaded CPU cores (5 × 20 s + start-up)
    bppsa run experiments/paper_sync/configs/sync_ray.py:quick       # ~1 min: BSP and DSSP, 3 workers, 5 s each, no kill
    bppsa run experiments/paper_sync/configs/sync_ray.py:smoke       # ~35 s: BSP only, 2 workers, 3 s
    bppsa reproduce sync-ray [--quick|--smoke]            # = bppsa run experiments/paper_sync/configs/sync_ray.py[:quick|:smoke]
    bppsa run experiments/paper_sync/configs/sync_ray.py --config.policies=bsp,ssp:s=3 --config.kill=  # overrides

Overrides are applied after the preset (:quick, :smoke), so explicit ``--config.`` values win;
every value is checked before Ray starts (``experiments.paper_sync.sync.check_sync_ray``).

One parameter-server actor and four worker actors on a local Ray (2 CPUs): workers compute real
JAX gradients of a small CNN on scikit-learn's digits, sleep an injected 0.02/0.02/0.05/0.05 s
per iteration, push; the server applies each push once (SGD) and the policy decides who waits.
Worker 3 is killed at 10 s; the table records who detected it and how fast. ``address`` joins an
existing Ray cluster instead ("auto" or "ray://host:port"). Results:
experiments/results/<device>/sync_ray.{json,md} (with --publish).
"""

import ml_collections

PRESETS = ("quick", "smoke")  # the arguments get_config takes: `bppsa run CONFIG:PRESET`


def get_config(arg=None):
    if arg not in (None, *PRESETS):
        raise ValueError(f"sync_ray.py takes no argument, 'quick' or 'smoke'; got {arg!r}")
    c = ml_collections.ConfigDict()
    c.task = "experiments.paper_sync.sync:sync_ray"
    c.name = "sync_ray"
    c.policies = "bsp,asp,ssp:s=3,dssp,elasticbsp:R=30"  # policy[:key=value[;key=value]], comma-separated
    c.workers = 4
    c.delays = (0.02, 0.02, 0.05, 0.05)  # seconds each worker sleeps per iteration
    c.duration = 20.0                    # wall-clock seconds per policy
    c.kill = "3:10"                      # WORKER:SECONDS, or "" for none
    c.dead_timeout = 30.0
    c.address = ""                       # "" starts a local Ray with num_cpus CPUs
    c.num_cpus = 2
    c.model = '{"name": "digits_cnn"}'   # the task spec (bppsa.tasks.task_from_spec), as JSON
    if arg == "quick":
        c.name = "sync_ray_smoke"
        c.policies, c.workers, c.delays, c.duration, c.kill = "bsp,dssp", 3, (0.01, 0.01, 0.03), 5.0, ""
    elif arg == "smoke":
        c.name = "sync_ray_smoke"
        c.policies, c.workers, c.delays, c.duration, c.kill = "bsp", 2, (0.01, 0.03), 3.0, ""
        c.model = '{"name": "digits_cnn", "channels": [4, 8]}'
    return c
