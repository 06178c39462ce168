"""nnx.RNN vs bppsa.nn.RNN in flax, two parts (``parts``) in one result:

- ``step``: a flax classifier's training step (forward + backward + Adam), nnx.RNN against
  bppsa.nn.RNN(backward="auto") (``layers``) for GRUCell, LSTMCell and SimpleCell at five (T, B, I, H),
  one core, in one process and in separate processes (``step_modes``), compile seconds beside;
- ``cells``: flax's four cells (SimpleCell, GRUCell, LSTMCell, OptimizedLSTMCell) with and without
  ``seq_lengths``, one training step's gradient: nnx.RNN, bppsa.nn.RNN with ``backward="bppsa"``,
  ``"auto"`` and ``padding="identity"``, outputs and gradients checked against nnx.RNN's, at
  (T, B, I, H) = (100, 16, 32, 32), the IRMAS GRU's settings "m" and "l" (experiments.data.irmas.SHAPES
  at the grid's B = 16 and 32, hidden 20) and (256, 8, 128, 128).

    bppsa run experiments/extensions/configs/flax_rnn.py          # both parts, full shapes: ~30 min (30 min measured: step 24, cells 6)
    bppsa run experiments/extensions/configs/flax_rnn.py:quick    # cells at one tiny shape (T 20, B 4, I 8, H 8), 2 rounds; one small GRU step: ~1-2 min
    bppsa run experiments/extensions/configs/flax_rnn.py:smoke    # both parts at a tiny GRU, one round: seconds (~20 s on the loaded 2-core machine)
    bppsa run experiments/extensions/configs/flax_rnn.py --config.parts=cells   # one part alone

Writes flax_rnn.{json,md} into the work directory (--publish: into experiments/results/<device>/); the
json holds the step part's rows under "rows" and the cells part's under "cells". Task:
experiments.extensions.flax_rnn:run.
"""

import ml_collections

PRESETS = ("quick", "smoke")  # the arguments get_config takes: `bppsa run CONFIG:PRESET`


def get_config(arg=None):
    if arg not in (None, *PRESETS):
        raise ValueError(f"flax_rnn takes no argument, 'quick' or 'smoke'; got {arg!r}")
    c = ml_collections.ConfigDict()
    c.task = "experiments.extensions.flax_rnn:run"
    c.name = "flax_rnn"
    c.parts = ("step", "cells")
    # part "step": (cell, I, H, T, B, classes), cell one of simple / gru / lstm / olstm (OptimizedLSTMCell)
    c.shapes = tuple((cell, I, H, T, B, 10) for cell in ("gru", "lstm", "simple")
                     for T, B, I, H in ((100, 32, 16, 32), (517, 16, 24, 20), (1034, 32, 12, 20), (256, 8, 64, 128),
                                        (2000, 4, 8, 16)))
    c.layers = ("nnx.RNN", "auto")  # the first is the reference; also "bptt", "bppsa"
    c.step_modes = ("one", "separate")  # all layers in one process; each layer in processes of its own
    c.core = 0                      # the one core every measurement runs on
    c.repeats = 9                   # rounds per process ("separate": half as many, at least 1)
    c.block = 3                     # timed calls per round (after one untimed), at least
    c.min_block_s = 0.1             # ... or as many as fill this many seconds (short steps: more samples)
    c.separate_rounds = 4           # processes per layer in "separate" (2 left one row at the mercy of one slow period)
    c.check_steps = 3
    c.seed = 0
    # part "cells": (T, B, I, H); each cell with seq_lengths no and yes
    c.cells_shapes = ((100, 16, 32, 32), (517, 16, 24, 20), (1034, 32, 12, 20), (256, 8, 128, 128))
    c.cells_kinds = ("SimpleCell", "GRUCell", "LSTMCell", "OptimizedLSTMCell")
    c.cells_repeats = 5
    c.cells_seed = 0
    if arg == "quick":
        c.shapes = (("gru", 8, 8, 20, 4, 3),)
        c.repeats = 3
        c.separate_rounds = 1
        c.cells_shapes = ((20, 4, 8, 8),)
        c.cells_repeats = 2
    if arg == "smoke":
        c.shapes = (("gru", 3, 4, 5, 2, 3),)
        c.repeats = 1
        c.block = 1
        c.min_block_s = 0.0
        c.separate_rounds = 1
        c.check_steps = 1
        c.cells_shapes = ((5, 2, 3, 4),)
        c.cells_kinds = ("GRUCell",)
        c.cells_repeats = 1
    return c
