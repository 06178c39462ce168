"""The paper's vanilla RNN training curve on the bitstream task: BPTT vs BPPSA (BPPSA §5.1, the training curve).

    bppsa reproduce rnn-train           # = bppsa run experiments/paper_bppsa/configs/rnn_train.py; 1-4 min on 2 CPU cores (3.6 min measured, loaded)
    bppsa reproduce rnn-train --quick   # = ...rnn_train.py:quick, the same as :smoke; ~10 s (incl. compilation)

RNN(input 1, hidden 20) -> 10 classes on Bernoulli(0.05 + 0.1 k) bitstreams of length T = 1000,
B = 16, Adam, trained once with BPTT and once with BPPSA from the same parameters on the same
batches (resumable: re-run the same command after a kill). The paper trains with lr 1e-5 for
many epochs; we use lr 1e-3 so that the curve moves within a CPU budget
(``--config.learning_rate=1e-5`` for the paper's rate). Results: experiments/results/<device>/rnn_train.*
"""

import ml_collections

PRESETS = ("quick", "smoke")  # the arguments get_config takes: `bppsa run CONFIG:PRESET`


def get_config(arg=None):
    if arg not in (None, *PRESETS):
        raise ValueError(f"rnn_train takes no argument, 'quick' or 'smoke'; got {arg!r}")
    c = ml_collections.ConfigDict()
    c.task = "experiments.paper_bppsa.rnn_train:rnn_train"
    c.name = "rnn_train"
    c.seed = 0
    c.length = 1000             # T
    c.num_samples = 1280        # training set (balanced over the 10 classes)
    c.eval_samples = 320
    c.hidden_size = 20
    c.batch_size = 16
    c.learning_rate = 1e-3
    c.steps = 400
    c.eval_every = 50
    c.checkpoint_every = 50
    c.methods = ("bptt", "bppsa")
    c.scan = "blelloch"
    c.dtype = "float32"
    c.progress = True
    c.timing = ml_collections.ConfigDict()
    c.timing.lengths = (1000,)
    c.timing.batches = (16,)
    c.timing.repeats = 5
    if arg in ("quick", "smoke"):  # tiny: the tests run it several times
        c.length = 16
        c.num_samples = 32
        c.eval_samples = 16
        c.batch_size = 8
        c.steps = 10
        c.eval_every = 4
        c.checkpoint_every = 3
        c.progress = False
        c.timing.lengths = (16,)
        c.timing.batches = (8,)
        c.timing.repeats = 2
    return c
