"""Scaling of sequence-parallel BPPSA: backward time vs number of devices (1, 2, 4, 8), per combine.

    bppsa reproduce scaling            # = bppsa run experiments/extensions/configs/scaling.py; ~5–10 min on 2 shared CPU cores (compiles dominate)
    bppsa reproduce scaling --quick    # = ...scaling.py:quick, the same as :smoke; ~15 s idle, ~1 min on the loaded 2-core machine (T = 64, B = 2, 1 and 2 devices)
    bppsa reproduce scaling --workdir experiments/results/cpu   # written beside the committed results

On CPU the devices are simulated (``--xla_force_host_platform_device_count``; the task re-runs
itself in a subprocess when this process has too few) and share the host's cores, so the table
shows overheads, per-device work and communication volume, not speed-up. Writes scaling.json
(with provenance), scaling.md and scaling.png into the work directory.
"""

import ml_collections

PRESETS = ("quick", "smoke")  # the arguments get_config takes: `bppsa run CONFIG:PRESET`


def get_config(arg=None):
    if arg not in (None, *PRESETS):
        raise ValueError(f"scaling takes no argument, 'quick' or 'smoke'; got {arg!r}")
    config = ml_collections.ConfigDict()
    config.task = "experiments.extensions.scaling:run_scaling"
    config.cell = "rnn"          # the paper's vanilla RNN: input 1, hidden 20
    config.I = 1
    config.H = 20
    config.T = 1024              # divisible by every device count
    config.B = 16
    config.dtype = "float32"
    config.devices = (1, 2, 4, 8)
    config.repeats = 9
    config.seed = 0
    config.combines = ("logstep", "allgather", "chain")
    config.diagnostic = True     # also time one batched-matmul level as one op vs in pieces
    if arg in ("quick", "smoke"):
        config.T = 64
        config.B = 2
        config.devices = (1, 2)
        config.repeats = 2
        config.combines = ("logstep",)
        config.diagnostic = False
    return config
