"""nnx.RNN vs bppsa.nn.RNN (BPTT and BPPSA backward): training-step times of a flax classifier at
the paper's RNN shape (nnx.SimpleCell, input 1, hidden 20, T = 1000, B = 16, 10 classes) and its
IRMAS GRU shape (nnx.GRUCell, input 24, hidden 20, T = 517, B = 32, 11 classes).

    bppsa run experiments/extensions/configs/flax_rnn.py             # both shapes, 7 rounds (~2-5 min on 2 cores)
    bppsa run experiments/extensions/configs/flax_rnn.py:smoke       # one tiny GRU, seconds

Writes flax_rnn.{json,md} into the work directory (--publish: into experiments/results/<device>/).
"""

import ml_collections


def get_config(arg=None):
    if arg not in (None, "smoke"):
        raise ValueError(f"flax_rnn takes no argument or 'smoke'; got {arg!r}")
    c = ml_collections.ConfigDict()
    c.task = "experiments.extensions.flax_rnn:step_times"
    c.name = "flax_rnn"
    c.shapes = (("simple", 1, 20, 1000, 16, 10), ("gru", 24, 20, 517, 32, 11))  # (cell, I, H, T, B, classes)
    c.repeats = 7
    c.check_steps = 3
    c.seed = 0
    if arg == "smoke":
        c.shapes = (("gru", 3, 4, 5, 2, 3),)
        c.repeats = 1
        c.check_steps = 1
    return c
