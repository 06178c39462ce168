"""The parallel forward through real training: the IRMAS GRU and a diagonal BlockGRU trained on the
synthetic IRMAS stand-in with forward="sequential", "newton" and "auto" (same initialisation, same
batches): Newton iterations, the largest Lyapunov exponent and the loss per step.

    bppsa run experiments/extensions/configs/newton_training.py          # ~7 min on 2 CPU cores
    bppsa run experiments/extensions/configs/newton_training.py:smoke    # seconds

Writes newton-training.{json,md,png} into the work directory (--publish: into
experiments/results/<device>/). Task: experiments.extensions.newton_training:run.
"""

import ml_collections

PRESETS = ("smoke",)  # the arguments get_config takes: `bppsa run CONFIG:PRESET`


def get_config(arg=None):
    if arg not in (None, *PRESETS):
        raise ValueError(f"newton_training takes no argument or 'smoke'; got {arg!r}")
    c = ml_collections.ConfigDict()
    c.task = "experiments.extensions.newton_training:run"
    c.name = "newton-training"
    c.seed = 0
    c.models = ("GRU", "BlockGRU k=1")
    c.forwards = ("sequential", "newton", "auto")
    c.synth_dir = "data/synth-irmas"  # "": inside the work directory
    c.cache_dir = "data/cache"
    c.clips_per_class = 20
    c.setting = "m"
    c.hidden = 20
    c.steps = 300
    c.batch = 16
    c.learning_rate = 3e-3
    if arg == "smoke":
        c.models = ("BlockGRU k=1",)
        c.forwards = ("sequential", "newton")
        c.synth_dir = ""
        c.cache_dir = ""
        c.clips_per_class = 1
        c.setting = "s"
        c.hidden = 4
        c.steps = 3
        c.batch = 4
    return c
