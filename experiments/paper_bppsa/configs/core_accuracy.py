"""Float32 gradient error of BPPSA vs BPTT, and of both vs a float64 BPTT reference (RNN, H = 20).

    bppsa reproduce core-accuracy            # T in (1000, 10000, 30000), B = 16: about a minute on 2 CPU cores
    bppsa reproduce core-accuracy --quick    # T = 1000 only: seconds
    bppsa run experiments/paper_bppsa/configs/core_accuracy.py:smoke    # T = 50, B = 2

Max |difference| / max |gradient| over all parameter gradients of the one timed loss
(experiments.gradient.loss: a fixed random readout of every step's hidden state), on Bernoulli(0.5)
bitstreams (experiments.gradient.problem); the reference is float64 autodiff through lax.scan
(experiments.gradient.gradient_errors). Writes core_accuracy.{json,md} into the work directory.
"""

import ml_collections

PRESETS = ("quick", "smoke")  # the arguments get_config takes: `bppsa run CONFIG:PRESET`


def get_config(arg=None):
    if arg not in (None, *PRESETS):
        raise ValueError(f"core_accuracy takes no argument, 'quick' or 'smoke'; got {arg!r}")
    c = ml_collections.ConfigDict()
    c.task = "experiments.paper_bppsa.rnn_sweep:accuracy_task"
    c.name = "core_accuracy"
    c.lengths = (1000, 10000, 30000)
    c.batch_size = 16
    c.hidden_size = 20
    c.seed = 0
    if arg == "quick":
        c.lengths = (1000,)
    elif arg == "smoke":
        c.lengths = (50,)
        c.batch_size = 2
    return c
