"""The order effect under bppsa.host's protocol (experiments/history/scan-optimisation.md, round
4): median time by position in a block of consecutive calls (the first follows another program),
and an A/A control (one executable timed under two names, interleaved with BPTT).

    bppsa run experiments/extensions/configs/order_effect.py          # RNN(1, 20), T = 10 000, B = 1; about a minute on 2 CPU cores
    bppsa run experiments/extensions/configs/order_effect.py:smoke    # T = 50, 3 rounds; seconds

Plain BPTT (lax.scan, unroll 1), tuned BPTT and BPPSA-blelloch, the training-step gradient of
experiments.gradient. Writes order-effect.{json,md} into the work directory (--publish: into
experiments/results/<device>/). Task: experiments.extensions.order_effect:run.
"""

import ml_collections

PRESETS = ("smoke",)  # the arguments get_config takes: `bppsa run CONFIG:PRESET`


def get_config(arg=None):
    if arg not in (None, *PRESETS):
        raise ValueError(f"order_effect takes no argument or 'smoke'; got {arg!r}")
    c = ml_collections.ConfigDict()
    c.task = "experiments.extensions.order_effect:run"
    c.name = "order-effect"
    c.I = 1
    c.H = 20
    c.T = 10000
    c.B = 1
    c.rounds = 12  # 1. position in block: rounds of one block per method, order rotated
    c.block = 4  # consecutive calls per block
    c.aa_repeats = 12  # 2. the A/A control: time_interleaved rounds
    c.aa_blocks = (2, 3)  # its block sizes (the first call of each block dropped)
    if arg == "smoke":
        c.T = 50
        c.rounds = 3
        c.aa_repeats = 2
    return c
