"""The IRMAS grid's timing on random inputs of each setting's shape (experiments.data.irmas.SHAPES, no data): GRU(F, 20).

    bppsa reproduce irmas-timing            # = bppsa run experiments/paper_bppsa/configs/irmas_timing.py; settings s/m/l x B 16/32/64
    bppsa reproduce irmas-timing --quick    # = ...irmas_timing.py:quick; setting s, B = 16, 2 repeats
    bppsa run experiments/paper_bppsa/configs/irmas_timing.py:smoke     # the same as :quick

Each point is one experiments.bench.bench_point (no scan variants, no memory; every time is of the one
timed training-step gradient, experiments.gradient), with an optional time budget. Writes irmas-timing.{json,md} into the work directory.
"""

import ml_collections

PRESETS = ("quick", "smoke")  # the arguments get_config takes: `bppsa run CONFIG:PRESET`


def get_config(arg=None):
    if arg not in (None, *PRESETS):
        raise ValueError(f"irmas_timing takes no argument, 'quick' or 'smoke'; got {arg!r}")
    c = ml_collections.ConfigDict()
    c.task = "experiments.paper_bppsa.irmas:shapes_task"
    c.name = "irmas-timing"
    c.settings = ("s", "m", "l")
    c.batches = (16, 32, 64)
    c.hidden_size = 20
    c.repeats = 5
    c.time_budget_s = ml_collections.config_dict.placeholder(float)  # seconds; later points are skipped
    c.note = ""  # a line written into the result file (e.g. how loaded the machine was)
    c.unrolls = (1, 2, 4, 8, 16, 32)  # the lax.scan unrolls timed as baselines (the best is reported)
    if arg in ("quick", "smoke"):
        c.settings = ("s",)
        c.batches = (16,)
        c.repeats = 2
    if arg == "smoke":
        c.unrolls = (1, 8)  # two of the baseline unrolls (compile time)
    return c
