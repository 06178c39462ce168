"""The paper's T sweep (Wang et al. 2020, Fig. 5a): vanilla RNN, input 1, hidden 20, B = 16.

    bppsa run experiments/paper_bppsa/configs/rnn_tsweep.py          # T = 10 ... 30000; about 30-60 min on 2 CPU cores
    bppsa run experiments/paper_bppsa/configs/rnn_tsweep.py:smoke    # T = 10 only; a few seconds (no cost-model probe)

Times forward, Jacobian generation, scan, contraction, the whole backward and the training-step gradient
of BPPSA and BPTT at every point (see experiments.bench); writes rnn-tsweep.json/.md/.png to the workdir.
:quick is the same as :smoke.
"""

import ml_collections


def get_config(arg=None):
    c = ml_collections.ConfigDict()
    c.task = "experiments.paper_bppsa.rnn_sweep:sweep_task"
    c.name = "rnn-tsweep"
    c.hidden_size = 20
    c.T_values = (10, 30, 100, 300, 1000, 3000, 10000, 30000)
    c.B_values = ()
    c.B_fixed = 16
    c.T_fixed = 1000
    c.repeats = 5
    c.auto = True
    c.gemm = False
    c.time_budget_s = ml_collections.config_dict.placeholder(float)
    if arg not in (None, "quick", "smoke"):
        raise ValueError(f"rnn_tsweep takes no argument, 'quick' or 'smoke'; got {arg!r}")
    if arg in ("quick", "smoke"):
        c.T_values = (10,)
        c.repeats = 2
        c.auto = False
    return c
