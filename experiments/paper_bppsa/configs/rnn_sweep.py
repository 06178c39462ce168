"""The paper's vanilla-RNN sweeps (Wang et al. 2020, Fig. 5): T at B = 16 and B at T = 1000.

    bppsa reproduce rnn-sweep            # = bppsa run experiments/paper_bppsa/configs/rnn_sweep.py; 40-80 min on 2 CPU cores
    bppsa reproduce rnn-sweep --quick    # = ...rnn_sweep.py:quick; T in (10, 100, 1000, 3000), B in (2, 16, 64): a few minutes
    bppsa run experiments/paper_bppsa/configs/rnn_sweep.py:T        # the T sweep alone (Fig. 5a, B = 16): 30-60 min
    bppsa run experiments/paper_bppsa/configs/rnn_sweep.py:B        # the B sweep alone (Fig. 5b, T = 1000): 10-20 min
    bppsa run experiments/paper_bppsa/configs/rnn_sweep.py:smoke    # T = 10, B = 2; seconds (no cost-model probe)
    bppsa run experiments/paper_bppsa/configs/rnn_sweep.py:T10000-B1   # one point (rnn-T10000-B1): ~1 min
    bppsa run experiments/paper_bppsa/configs/rnn_sweep.py:T30000-B16  # one point (rnn-T30000-B16): a few minutes
    bppsa run experiments/paper_bppsa/configs/rnn_sweep.py:small-batch # T 10000, 1000 x B 1, 2 with GEMM rates: ~10 min
    bppsa bench --T 1000,3000 --B 1,2   # = bppsa run ...rnn_sweep.py with that grid (--config.grid_T, grid_B)

RNN(input 1, hidden 20) on bitstreams. At every point: forward, Jacobian generation, scan,
contraction, the whole backward and the training-step gradient of BPPSA and BPTT, the scan variants, the
peak memory and the cost model's `auto` choice (see experiments.bench). ``--config.gemm=true`` also
records bare batched-GEMM rates. Writes <name>.{json,md,png} into the work directory.
"""

import ml_collections

# name -> (grid_T, grid_B, repeats, gemm): the committed single-point results rnn-<name>
POINTS = {"T10000-B1": ((10000,), (1,), 5, False), "T30000-B16": ((30000,), (16,), 3, False),
          "small-batch": ((10000, 1000), (1, 2), 21, True)}
PRESETS = ("quick", "smoke", "T", "B", *POINTS)  # the arguments get_config takes: `bppsa run CONFIG:PRESET`


def get_config(arg=None):
    if arg not in (None, *PRESETS):
        raise ValueError(f"rnn_sweep takes no argument, 'quick', 'smoke', 'T', 'B' or one of {', '.join(POINTS)}; "
                         f"got {arg!r}")
    c = ml_collections.ConfigDict()
    c.task = "experiments.paper_bppsa.rnn_sweep:sweep_task"
    c.name = "rnn-sweep"
    c.hidden_size = 20
    c.T_values = (10, 30, 100, 300, 1000, 3000, 10000, 30000)
    c.B_values = (2, 4, 8, 16, 32, 64, 128, 256)
    c.B_fixed = 16
    c.T_fixed = 1000
    c.grid_T = ()  # a grid of points: every T here at every B of grid_B (what `bppsa bench` times)
    c.grid_B = ()
    c.cell = "rnn"  # "rnn" | "gru" | "lstm"
    c.input_size = 1
    c.scan = "blelloch"
    c.note = ""  # a line written into the result file (e.g. how loaded the machine was)
    c.repeats = 5
    c.auto = True
    c.gemm = False
    c.time_budget_s = ml_collections.config_dict.placeholder(float)  # seconds; later points are skipped
    if arg in POINTS:  # single points (the front page's): a grid, no sweep
        c.name, (c.grid_T, c.grid_B, c.repeats, c.gemm) = f"rnn-{arg}", POINTS[arg]
        c.T_values = c.B_values = ()
    elif arg in ("T", "B"):  # one of the two sweeps: the other's values left out
        c.name = f"rnn-sweep-{arg}"
        c[f"{'B' if arg == 'T' else 'T'}_values"] = ()
    elif arg == "quick":
        c.name = "rnn-sweep-quick"
        c.T_values = (10, 100, 1000, 3000)
        c.B_values = (2, 16, 64)
        c.repeats = 3
    elif arg == "smoke":
        c.name = "rnn-sweep-smoke"
        c.T_values = (10,)
        c.B_values = (2,)
        c.T_fixed = 10
        c.repeats = 1
        c.auto = False
    return c
