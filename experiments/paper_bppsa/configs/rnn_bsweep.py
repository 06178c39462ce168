"""The paper's B sweep (Wang et al. 2020, Fig. 5b): vanilla RNN, input 1, hidden 20, T = 1000.

    bppsa run experiments/paper_bppsa/configs/rnn_bsweep.py          # B = 2 ... 256; about 10-20 min on 2 CPU cores
    bppsa run experiments/paper_bppsa/configs/rnn_bsweep.py:smoke    # T = 30, B = 2; a few seconds (no probe)

Times forward, Jacobian generation, scan, contraction, the whole backward and the training-step gradient
of BPPSA and BPTT at every point (see experiments.bench); writes rnn-bsweep.json/.md/.png to the workdir.
:quick is the same as :smoke.
"""

import ml_collections


def get_config(arg=None):
    c = ml_collections.ConfigDict()
    c.task = "experiments.paper_bppsa.rnn_sweep:sweep_task"
    c.name = "rnn-bsweep"
    c.hidden_size = 20
    c.T_values = ()
    c.B_values = (2, 4, 8, 16, 32, 64, 128, 256)
    c.B_fixed = 16
    c.T_fixed = 1000
    c.repeats = 5
    c.auto = True
    c.gemm = False
    c.time_budget_s = ml_collections.config_dict.placeholder(float)
    if arg not in (None, "quick", "smoke"):
        raise ValueError(f"rnn_bsweep takes no argument, 'quick' or 'smoke'; got {arg!r}")
    if arg in ("quick", "smoke"):
        c.B_values = (2,)
        c.T_fixed = 30
        c.repeats = 2
        c.auto = False
    return c
