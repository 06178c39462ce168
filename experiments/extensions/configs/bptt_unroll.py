"""The measurements behind bppsa.plan.rules.bptt_unroll: BPTT through lax.scan at every unroll of
bppsa.plan.rules.UNROLLS (1 … 32), interleaved, over a grid of cells and shapes; the unroll the rule
picks and its time over the best unroll's.

    bppsa run experiments/extensions/configs/bptt_unroll.py          # the full grid (29 points; ~10 min on 2 CPU cores)
    bppsa run experiments/extensions/configs/bptt_unroll.py:quick    # 3 points (RNN T = 1000, B = 1 and 16; GRU T = 1000, B = 1); ~1-2 min
    bppsa run experiments/extensions/configs/bptt_unroll.py:smoke    # one tiny point (RNN(1, 4), T = 8, B = 1), seconds

The grid: the vanilla RNN (input 1, hidden 20) at T = 1000 over B = 1 … 256, at B = 1 over T = 100
and 10 000, at B = 16 over T = 10, 100, 3000; GRU (B = 1, 16) and LSTM (B = 1) at T = 1000; two of
the IRMAS grid's GRU shapes; GRU and LSTM at the five shapes of the flax drop-in's training-step table. Writes bptt-unroll.{json,md} into the work directory (--publish: into
experiments/results/<device>/). Task: experiments.extensions.bptt_unroll:run.
"""

import ml_collections

PRESETS = ("quick", "smoke")  # the arguments get_config takes: `bppsa run CONFIG:PRESET`

# (cell, I, H, T, B)
GRID = tuple([("rnn", 1, 20, 1000, B) for B in (1, 2, 4, 8, 16, 32, 64, 128, 256)] +
             [("rnn", 1, 20, T, 1) for T in (100, 10000)] + [("rnn", 1, 20, T, 16) for T in (10, 100, 3000)] +
             [("gru", 1, 20, 1000, B) for B in (1, 16)] + [("lstm", 1, 20, 1000, 1)] +
             [("gru", 38, 20, 259, 16), ("gru", 12, 20, 1034, 64)] +  # two of the IRMAS grid's shapes
             [(kind, I, H, T, B) for kind in ("gru", "lstm")  # the flax drop-in's five training-step shapes
              for T, B, I, H in ((100, 32, 16, 32), (517, 16, 24, 20), (1034, 32, 12, 20), (256, 8, 64, 128),
                                 (2000, 4, 8, 16))])
QUICK = (("rnn", 1, 20, 1000, 1), ("rnn", 1, 20, 1000, 16), ("gru", 1, 20, 1000, 1))


def get_config(arg=None):
    if arg not in (None, *PRESETS):
        raise ValueError(f"bptt_unroll takes no argument, 'quick' or 'smoke'; got {arg!r}")
    c = ml_collections.ConfigDict()
    c.task = "experiments.extensions.bptt_unroll:run"
    c.name = "bptt-unroll"
    c.grid = GRID
    c.repeats = 7  # rounds of interleaved blocks (2 timed calls each)
    if arg == "quick":
        c.grid = QUICK
    if arg == "smoke":
        c.grid = (("rnn", 1, 4, 8, 1),)
        c.repeats = 1
    return c
