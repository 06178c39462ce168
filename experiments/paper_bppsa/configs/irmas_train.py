"""IRMAS training, BPTT vs BPPSA (BPPSA paper §5.2): GRU(F, 20) -> 11 classes, Adam lr 3e-4.

    bppsa run experiments/paper_bppsa/configs/irmas_train.py          # 8–22 min on 2 CPU cores (22 min measured, loaded)
    bppsa run experiments/paper_bppsa/configs/irmas_train.py:smoke    # 10–35 s: 20 steps on a tiny stand-in
    bppsa run experiments/paper_bppsa/configs/irmas_train.py --config.data_dir=/path/to/IRMAS   # the real data

Trains the paper's model with BPTT and with BPPSA from the same initial parameters on the same
batches (setting m: T = 517, F = 24), evaluates on a stratified 20 % held-out split and, when a
test set is present, the multi-label F1 on 3-second windows of the test clips. Writes
irmas_train.{json,md,png} into the work directory.
"""

import ml_collections

PRESETS = ("quick", "smoke")  # the arguments get_config takes: `bppsa run CONFIG:PRESET`


def get_config(arg=None):
    c = ml_collections.ConfigDict()
    c.task = "experiments.paper_bppsa.irmas:run"
    c.parts = ("train",)
    c.data_dir = ml_collections.config_dict.placeholder(str)  # None: the synthetic stand-in
    c.synth_dir = "data/synth-irmas-full"
    c.cache_dir = "data/cache"
    c.clips_per_class = 60
    c.test_clips = 55
    c.test_seconds = (5.0, 20.0)
    c.setting = "m"
    c.steps = 1500
    c.batch_size = 16
    c.learning_rate = 3e-4  # the paper's
    c.hidden_size = 20
    c.eval_every = 100
    c.seed = 0
    if arg in ("quick", "smoke"):
        c.synth_dir = ""  # "": inside the work directory
        c.cache_dir = ""
        c.clips_per_class = 2
        c.test_clips = 2
        c.test_seconds = (3.5, 6.0)
        c.setting = "s"
        c.steps = 20
        c.batch_size = 8
        c.eval_every = 10
    elif arg is not None:
        raise ValueError(f"unknown config argument {arg!r}; expected nothing, 'quick' or 'smoke'")
    return c
