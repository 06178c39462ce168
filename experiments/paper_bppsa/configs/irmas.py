"""The paper's GRU on IRMAS (BPPSA §5.2): the timing grid and BPTT vs BPPSA training, in one run.

    bppsa reproduce irmas --quick    # = bppsa run experiments/paper_bppsa/configs/irmas.py:quick; `make reproduce`; 9-25 min on a shared 2-core machine
    bppsa reproduce irmas            # = ...irmas.py; the full sizes: 30-45 min on 2 CPU cores
    bppsa reproduce irmas --config.data_dir=/path/to/IRMAS   # the real data
    bppsa run experiments/paper_bppsa/configs/irmas.py:smoke             # tiny stand-in inside the work directory

GRU(F, 20) -> 11 classes. The grid: B ∈ {16, 32, 64} × settings s/m/l, on the first B clips'
MFCC features. The training: setting m, from the same initial parameters on the same batches,
held-out accuracy and, where a test set is present, the multi-label F1. Without data_dir: the
synthetic stand-in, generated on first use under synth_dir (quick: 20 clips per class; full: 60).
Writes irmas_grid.{json,md,png} and irmas_train.{json,md,png} into the work directory.
"""

import ml_collections

PRESETS = ("quick", "smoke")  # the arguments get_config takes: `bppsa run CONFIG:PRESET`


def get_config(arg=None):
    if arg not in (None, *PRESETS):
        raise ValueError(f"irmas takes no argument, 'quick' or 'smoke'; got {arg!r}")
    c = ml_collections.ConfigDict()
    c.task = "experiments.paper_bppsa.irmas:run"
    c.parts = ("grid", "train")
    c.data_dir = ml_collections.config_dict.placeholder(str)  # None: the synthetic stand-in
    c.synth_dir = "data/synth-irmas-full"  # "": inside the work directory
    c.cache_dir = "data/cache"
    c.clips_per_class = 60
    c.test_clips = 55
    c.test_seconds = (5.0, 20.0)
    c.hidden_size = 20
    c.seed = 0
    # the timing grid
    c.settings = ("s", "m", "l")
    c.batches = (16, 32, 64)
    c.repeats = 7
    # the training
    c.setting = "m"
    c.steps = 1500
    c.batch_size = 16
    c.learning_rate = 3e-4  # the paper's
    c.eval_every = 100
    if arg == "quick":
        c.synth_dir = "data/synth-irmas"
        c.clips_per_class = 20
        c.test_clips = 22
        c.test_seconds = (5.0, 8.0)
        c.repeats = 3
        c.steps = 200
        c.learning_rate = 3e-3
        c.eval_every = 25
    elif arg == "smoke":
        c.synth_dir = ""
        c.cache_dir = ""
        c.clips_per_class = 2
        c.test_clips = 2
        c.test_seconds = (3.5, 6.0)
        c.settings = ("s",)
        c.batches = (4,)
        c.repeats = 1
        c.setting = "s"
        c.steps = 6
        c.batch_size = 8
        c.eval_every = 3
    return c
