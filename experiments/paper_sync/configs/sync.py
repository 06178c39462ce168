"""Elastic synchronization, time to target accuracy (DSSP's Table I layout) on a heterogeneous cluster.

    bppsa run experiments/paper_sync/configs/sync.py --publish   # 8-15 min on 2 loaded CPU cores (8.4 min measured)
    bppsa run experiments/paper_sync/configs/sync.py:smoke       # ~25 s (mostly compilation); :quick is the same
    bppsa reproduce sync [--quick]                    # = bppsa run experiments/paper_sync/configs/sync.py[:quick]

Four simulated workers, two fast and two 2.5× slower (mixed GPUs), log-normal noise σ = 0.1 on each
iteration time; virtual clock, real JAX gradients on the parameters each worker pulled, SGD on the
server applied on arrival. Policies: BSP, ASP, SSP s = 3/6/15, DSSP(3, 12), ElasticBSP R =
15/30/60/120/240. Models: a small CNN on scikit-learn's digits (target 0.95) and a GRU (BPPSA
backward) on a synthetic 8-class sequence task (T = 32, 12 features; target 0.95). Five seeds.
Results: experiments/results/<device>/sync_models.{json,md,png} (with --publish).
"""

import ml_collections

PRESETS = ("quick", "smoke")  # the arguments get_config takes: `bppsa run CONFIG:PRESET`

POLICIES = (("bsp", {}), ("asp", {}), ("ssp", {"s": 3}), ("ssp", {"s": 6}), ("ssp", {"s": 15}),
            ("dssp", {"s_L": 3, "r_max": 12}),
            ("elasticbsp", {"R": 15}), ("elasticbsp", {"R": 30}), ("elasticbsp", {"R": 60}),
            ("elasticbsp", {"R": 120}), ("elasticbsp", {"R": 240}))


def get_config(arg=None):
    if arg not in (None, *PRESETS):
        raise ValueError(f"sync.py takes no argument, 'quick' or 'smoke'; got {arg!r}")
    c = ml_collections.ConfigDict()
    c.task = "experiments.paper_sync.sync:sync_models"
    c.name = "sync_models"
    c.seeds = 5
    c.cluster = ml_collections.ConfigDict({"means": (1.0, 1.0, 2.5, 2.5), "sigma": 0.1, "comm": 0.0})
    c.policies = POLICIES
    c.models = (
        {"label": "CNN digits", "task": {"name": "digits_cnn", "channels": (8, 16)},
         "learning_rate": 0.05, "batch_size": 32, "max_time": 300.0, "eval_every": 1.0, "target": 0.95},
        {"label": "GRU seq", "task": {"name": "gru", "data": "sequences", "num_samples": 2000, "length": 32,
                                      "num_features": 12, "num_classes": 8, "noise": 1.0, "hidden_size": 20,
                                      "backward": "bppsa"},
         "learning_rate": 0.1, "batch_size": 32, "max_time": 300.0, "eval_every": 2.0, "target": 0.95},
    )
    if arg in ("quick", "smoke"):
        c.name = "sync_models_smoke"
        c.seeds = 1
        c.policies = (("bsp", {}), ("dssp", {"s_L": 3, "r_max": 12}), ("elasticbsp", {"R": 15}))
        c.models = ({"label": "CNN digits", "task": {"name": "digits_cnn", "channels": (4, 8)},
                     "learning_rate": 0.1, "batch_size": 16, "max_time": 10.0, "eval_every": 2.0,
                     "target": 0.5},)
    return c
