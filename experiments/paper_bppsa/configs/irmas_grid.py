"""IRMAS timing grid (BPPSA paper §5.2, Table): GRU(F, 20), B ∈ {16, 32, 64} × settings s/m/l.

    bppsa run experiments/paper_bppsa/configs/irmas_grid.py          # 5–20 min on 2 CPU cores (20 min measured, loaded)
    bppsa run experiments/paper_bppsa/configs/irmas_grid.py:smoke    # 15–80 s: setting s, B = 16, 1 repeat
    bppsa run experiments/paper_bppsa/configs/irmas_grid.py --config.data_dir=/path/to/IRMAS   # the real data

Times forward, transposed-Jacobian generation, the BPPSA scan, the parameter-gradient
contraction, the whole BPPSA backward, the BPTT backward and the training-step gradient each way, on the
first B clips' MFCC features (the synthetic stand-in under data/synth-irmas unless data_dir is
set). Writes irmas_grid.{json,md,png} into the work directory.
"""

import ml_collections

PRESETS = ("quick", "smoke")  # the arguments get_config takes: `bppsa run CONFIG:PRESET`


def get_config(arg=None):
    c = ml_collections.ConfigDict()
    c.task = "experiments.paper_bppsa.irmas:run"
    c.parts = ("grid",)
    c.data_dir = ml_collections.config_dict.placeholder(str)  # None: the synthetic stand-in
    c.synth_dir = "data/synth-irmas"
    c.cache_dir = "data/cache"
    c.clips_per_class = 20  # the stand-in of `make reproduce` (the grid uses the first 6 clips per class)
    c.test_clips = 22
    c.test_seconds = (5.0, 8.0)
    c.settings = ("s", "m", "l")
    c.batches = (16, 32, 64)
    c.repeats = 7
    c.hidden_size = 20
    c.seed = 0
    if arg in ("quick", "smoke"):
        c.clips_per_class = 2
        c.test_clips = 0
        c.synth_dir = ""  # "": inside the work directory
        c.cache_dir = ""
        c.settings = ("s",)
        c.batches = (16,)
        c.repeats = 1
    elif arg is not None:
        raise ValueError(f"unknown config argument {arg!r}; expected nothing, 'quick' or 'smoke'")
    return c
