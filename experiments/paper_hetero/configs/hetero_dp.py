"""Heterogeneity-aware data parallelism: uniform vs proportional-mean vs proportional-weighted.

    bppsa run experiments/paper_hetero/configs/hetero_dp.py --publish   # ~7-15 min on 2 busy CPU cores (411 s measured)
    bppsa reproduce hetero-dp                              # the same run
    bppsa run experiments/paper_hetero/configs/hetero_dp.py:real        # real processes only: 3-5 min (253 s measured; hetero_dp_real.*)
    bppsa run experiments/paper_hetero/configs/hetero_dp.py:smoke       # under a minute (digits only, 1 epoch, 1 seed)
    bppsa reproduce hetero-dp --quick                      # = :quick, the same as :smoke

Four replicas at speed ratios 1:1:2:4 (and 1:2:4:8) train a small CNN on scikit-learn's
digits and the GRU sequence classifier (BPPSA backward) on the synthetic bitstream task, each
strategy × 3 seeds. Replicas are 4 devices of one process; the clock is a time model: replica
i's step on b_i samples takes f_i·τ·b_i, with τ the per-sample time of the local gradient at
B/P measured on this machine and f_i = max(s)/s_i (or f_i·(α + β·b_i) with time_model="affine"). The real-process block runs first: 4 replica
processes (jax.distributed on 127.0.0.1) at 1:1:2:4, each computing its own batch and then
sleeping τ·f_i·b_i (τ calibrated once per run), profiled one at a time; every strategy × 3 seeds,
and a drift scenario (replica 3 becomes 2× slower halfway) with re-balancing on and off.
Placement "iid": random data shards; "label": shards cut from label-sorted data (data
locality), where plain averaging's over-weighting of slow replicas biases the model.
"""

import ml_collections

PRESETS = ("quick", "smoke", "real")  # the arguments get_config takes: `bppsa run CONFIG:PRESET`


def get_config(arg=None):
    c = ml_collections.ConfigDict()
    c.task = "experiments.paper_hetero.hetero_dp:run"
    c.task_names = ["digits_cnn", "gru"]
    c.tasks = ml_collections.ConfigDict({
        "digits_cnn": {"batch_size": 64, "epochs": 10, "learning_rate": 3e-3},
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
    c.name = "hetero_dp"
    c.processes = ml_collections.ConfigDict({
        "enabled": True, "task": "gru", "mix": [1, 1, 2, 4], "placement": "label", "epochs": 8,
        "seeds": [0, 1, 2], "timeout_s": 900,
        "probe_batches": [8, 16, 32],   # around the nominal batch B/P = 16
        "emulation": "sleep",           # step = compute + τ·f_i·b_i; "stretch": compute × f_i
        "sleep_scale": 16.0,            # τ = sleep_scale × compute time per sample at B/P
        "tau": ml_collections.config_dict.placeholder(float),  # seconds per sample; None: calibrated
        "min_per_replica": 1,
        "max_speed_ratio": 16.0,        # profiled speeds beyond median × / ÷ this are clipped
        "drift": {"enabled": True, "replica": 3, "factor": 2.0, "at": 0.5, "rebalance_every": 5,
                  "tolerance": 0.1, "strategy": "proportional-weighted", "seed": 0},
    })
    c.command = ""
    c.keep_partial = False          # True: a failed real-process block leaves the simulated sweep, marked partial
    if arg == "real":
        c.name = "hetero_dp_real"
        c.task_names = []
    elif arg in ("smoke", "quick"):
        c.task_names = ["digits_cnn"]
        c.tasks["digits_cnn"].epochs = 1
        c.tasks.gru.update(num_samples=256, length=8, epochs=1)
        c.probe_batches = [4, 16]
        c.scenarios = c.scenarios[1:2]
        c.seeds = [0]
        c.profile_repeats = 2
        c.processes.update(enabled=False)
    elif arg is not None:
        raise ValueError(f"get_config: unknown argument {arg!r}; expected None, 'real', 'quick' or 'smoke'")
    return c
