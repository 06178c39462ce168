"""The parallel (Newton) forward measured: iterations to converge against T (random, trained and
chaotic weights, with the fallback) and the jitted training step for every forward × backward pair.

    bppsa run experiments/extensions/configs/parallel_step.py          # ~15-20 min on 2 loaded CPU cores
    bppsa run experiments/extensions/configs/parallel_step.py:smoke    # seconds: tiny T, one cell, one point

Predicted (from the Lyapunov exponent) against measured iterations, with forward="auto"'s choice, for
random, trained, contracting, edge-of-chaos, expanding, saturating and slowly forgetting cells.
Forwards sequential / newton / quasi (bppsa.forward.newton) × backwards bptt / bppsa (Blelloch) / bppsa
(sequential scan), against tuned BPTT, with forward="auto", backward="auto" and what it chose.
The trained weights: the IRMAS GRU after a short BPTT training run on the synthetic stand-in
(generated on first use under synth_dir). Writes parallel-step.{json,md} into the work directory
(--publish: into experiments/results/<device>/). Task: experiments.extensions.parallel_step:run.
"""

import ml_collections

PRESETS = ("smoke",)  # the arguments get_config takes: `bppsa run CONFIG:PRESET`


def get_config(arg=None):
    if arg not in (None, *PRESETS):
        raise ValueError(f"parallel_step takes no argument or 'smoke'; got {arg!r}")
    c = ml_collections.ConfigDict()
    c.task = "experiments.extensions.parallel_step:run"
    c.name = "parallel-step"
    c.parts = ("iterations", "trained", "chaotic", "predictability", "steps")
    c.seed = 0
    # (a) iterations: (kind, head_size) cells at random initialisation, B, H, I, every T
    c.iter_cells = (("rnn", 1), ("gru", 1), ("lstm", 1), ("blockgru", 1), ("blockgru", 4), ("blocklstm", 1),
                    ("blocklstm", 4))
    c.iter_T = (100, 1000, 10000, 100000)
    c.iter_B = 4
    c.iter_H = 20
    c.iter_I = 20
    c.forwards = ("newton", "quasi")
    # The scan of the Newton iterations' linear solves in this part: the count is the scan's only through
    # rounding, and on this CPU the Blelloch scan's compile (~20 s a program) would take most of the run; the
    # step-time part below runs the Blelloch iterations and records their counts.
    c.iter_scan = "sequential"
    # the trained GRU: the IRMAS stand-in (as experiments/paper_bppsa/configs/irmas.py:quick), a short Adam run with BPTT
    c.synth_dir = "data/synth-irmas"  # "": inside the work directory
    c.cache_dir = "data/cache"
    c.clips_per_class = 20
    c.setting = "m"
    c.train_steps = 300
    c.train_batch = 16
    c.learning_rate = 3e-3
    # the chaotic case: an RNN with its recurrent matrix scaled to this spectral radius
    c.chaotic_rho = 3.0
    c.chaotic_T = (100, 1000, 10000)
    # predicted against measured iterations: the cells above, the trained GRU, an RNN across spectral radii
    # (contracting, edge of chaos, expanding), a saturating RNN and slowly forgetting diagonal GRUs
    c.pred_T = (100, 1000, 10000)
    c.pred_forwards = ("newton", "elk")
    c.pred_rhos = (0.5, 0.9, 1.1, 1.3, 1.6, 2.0)
    c.pred_gates = (0.99, 0.999)
    # (b) the training step: (kind, head_size, I, H, T, B)
    c.step_points = (("gru", 1, 24, 20, 517, 16), ("gru", 1, 12, 20, 1034, 32), ("rnn", 1, 1, 20, 1000, 2),
                     ("rnn", 1, 1, 20, 10000, 1), ("blockgru", 1, 16, 64, 4096, 8))
    c.repeats = 3
    if arg == "smoke":
        c.iter_cells = (("blockgru", 2),)
        c.iter_T = (6,)
        c.iter_B = 2
        c.iter_H = 4
        c.iter_I = 3
        c.forwards = ("newton",)
        c.synth_dir = ""
        c.cache_dir = ""
        c.clips_per_class = 1
        c.setting = "s"
        c.train_steps = 2
        c.train_batch = 4
        c.chaotic_T = (5,)
        c.pred_T = (6,)
        c.pred_rhos = (0.9,)
        c.pred_gates = (0.99,)
        c.step_points = (("rnn", 1, 2, 3, 5, 2),)
        c.repeats = 1
    return c
