"""Bounded memory of the parallel forward: one dense Newton training step (GRU, float32, H = I = 64,
T = 100 000, B = 16, Blelloch scan, backward="bppsa", chunk_size="auto") and its memory.

    bppsa run experiments/extensions/configs/newton_memory.py          # needs ~11 GiB of memory; 5-11 min on 2 cores
    bppsa run experiments/extensions/configs/newton_memory.py:smoke    # T = 64, B = 2, H = 4, I = 3; seconds

Records the process's peak resident memory (ru_maxrss: the high-water mark of the whole process,
compile included, so run the full size in a `bppsa run` process of its own), XLA's memory plan of
the compiled step, the Newton iterations, the step's wall time and the states' largest deviation
from the sequential forward's; the unchunked Jacobians alone would be 24.4 GiB. Writes
newton-memory.{json,md} into the work directory (--publish: into experiments/results/<device>/).
Task: experiments.extensions.newton_memory:run.
"""

import ml_collections

PRESETS = ("smoke",)  # the arguments get_config takes: `bppsa run CONFIG:PRESET`


def get_config(arg=None):
    if arg not in (None, *PRESETS):
        raise ValueError(f"newton_memory takes no argument or 'smoke'; got {arg!r}")
    c = ml_collections.ConfigDict()
    c.task = "experiments.extensions.newton_memory:run"
    c.name = "newton-memory"
    c.T = 100_000
    c.B = 16
    c.H = 64
    c.I = 64
    c.scan = "blelloch"  # the scan of the Newton iterations' solves and of the BPPSA backward
    c.forward = "newton"  # or "quasi"
    if arg == "smoke":
        c.T = 64
        c.B = 2
        c.H = 4
        c.I = 3
    return c
