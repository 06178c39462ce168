"""Heterogeneity-aware data parallelism: uniform vs proportional-mean vs proportional-weighted.

    bppsa run experiments/configs/hetero_dp.py --publish   # ~15 min on 2 busy CPU cores
    bppsa reproduce hetero-dp                              # the same run
    bppsa run experiments/configs/hetero_dp.py:smoke       # under a minute (digits only, 1 epoch, 1 seed)
    bppsa reproduce hetero-dp --quick                      # = :quick, the same as :smoke

Four replicas at speed ratios 1:1:2:4 (and 1:2:4:8) train a small CNN on scikit-learn's
digits and the GRU sequence classifier (BPPSA backward) on the synthetic bitstream task, each
strategy × 3 seeds. Replicas are 4 devices of one process; the clock is a time model: replica
i's step on b_i samples takes f_i·τ·b_i, with τ the per-sample time of the local gradient at
B/P measured on this machine and f_i = max(s)/s_i (or f_i·(α + β·b_i) with time_model="affine"). A final block runs 4 real replica processes
(jax.distributed on 127.0.0.1) in which slow replicas really sleep, to check the modelled clock.
Placement "iid": random data shards; "label": shards cut from label-sorted data (data
locality), where plain averaging's over-weighting of slow replicas biases the model.
"""

import ml_collections


def get_config(arg=None):
    c = ml_collections.ConfigDict()
    c.task = "bppsa.experiments.hetero_dp:run"
    c.task_names = ["digits-cnn", "gru"]
    c.tasks = ml_collections.ConfigDict({
        "digits-cnn": {"batch_size": 64, "epochs": 10, "learning_rate": 3e-3},
        "gru": {"data": "bitstream", "num_samples": 2000, "length": 32, "hidden_size": 20, "num_classes": 10,
                "batch_size": 64, "epochs": 8, "learning_rate": 1e-2},
    })
    c.mixes = ml_collections.ConfigDict({"1:1:2:4": [1, 1, 2, 4], "1:2:4:8": [1, 2, 4, 8]})
    c.scenarios = [
        ml_collections.ConfigDict({"mix": "1:1:2:4", "placement": "iid"}),
        ml_collections.ConfigDict({"mix": "1:1:2:4", "placement": "label"}),
        ml_collections.ConfigDict({"mix": "1:2:4:8", "placement": "label"}),
    ]
    c.strategies = ["uniform", "proportional-mean", "proportional-weighted"]
    c.seeds = [0, 1, 2]
    c.probe_batches = [4, 16, 64]   # profiling: fit t(b) = α + β·b at these batch sizes
    c.profile_repeats = 5
    # "proportional": replica i's step takes f_i·τ·b_i, τ the measured per-sample time at B/P (speeds are
    # throughput ratios, as in the paper); "affine": f_i·(α + β·b_i) with the fitted fixed cost α
    c.time_model = "proportional"
    c.jitter = 0.05                 # log-normal noise on each modelled replica step time
    c.comm_s = 0.0                  # modelled all-reduce time per step (same for every strategy)
    c.processes = ml_collections.ConfigDict({
        "enabled": True, "task": "gru", "mix": [1, 1, 2, 4], "placement": "label", "epochs": 2,
        "seeds": [0], "timeout_s": 900,
    })
    c.command = ""
    if arg in ("smoke", "quick"):
        c.task_names = ["digits-cnn"]
        c.tasks["digits-cnn"].epochs = 1
        c.tasks.gru.update(num_samples=256, length=8, epochs=1)
        c.probe_batches = [4, 16]
        c.scenarios = c.scenarios[1:2]
        c.seeds = [0]
        c.profile_repeats = 2
        c.processes.update(enabled=False)
    elif arg not in (None, ""):
        raise ValueError(f"get_config: unknown argument {arg!r}; expected None, 'quick' or 'smoke'")
    return c
