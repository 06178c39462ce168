"""pararnn-torch (ParaRNN's PyTorch implementation) against bppsa: one training step, the same
equations and weights, one CPU core each, float32 (the peer in its own venv, run through
experiments/scripts/_pararnn_peer_driver.py).

    bppsa run experiments/extensions/configs/pararnn_peer.py                              # the five points, ~15-20 min (13.4 min measured with extra)
    bppsa run experiments/extensions/configs/pararnn_peer.py --config.extra=true --config.forward=newton   # + the diagonal GRU at H = 20, 64, 256, insisting on bppsa's Newton forward (the committed run)
    bppsa run experiments/extensions/configs/pararnn_peer.py:quick                        # three tiny points (T = 64), a few minutes (mostly torch.compile)
    bppsa run experiments/extensions/configs/pararnn_peer.py:smoke                        # bppsa's side only, one tiny RNN, no torch: seconds (~15-25 s loaded)
    bppsa run experiments/extensions/configs/pararnn_peer.py --config.peer_venv=DIR       # an existing venv with pararnn-torch

The peer's venv (``peer_venv``) is created on first use (``pip install torch==2.13.0``, then
``pararnn-torch==0.17.4``) when ``peer = "run"``. The smoke preset sets ``peer = "skip"``: the
peer is not run and its venv is neither looked for nor created; bppsa's states and gradients are
checked against the float64 reference only, and the result says that the peer was not run.
Points by name (``points``): "rnn T=1000 B=2", "rnn T=1000 B=16", "rnn T=10000 B=1",
"gru T=517 B=16", "gru T=1034 B=32", "gru_diag T=1034 B=32", "gru_diag H=64 T=1034 B=32",
"gru_diag H=256 T=2048 B=8" (the last three: what ``extra`` adds), the quick
ones and "rnn smoke". Writes pararnn-peer.{json,md} (quick: pararnn-peer-quick, smoke:
pararnn-peer-smoke) into the work directory (--publish: into experiments/results/<device>/).
Task: experiments.extensions.pararnn_peer:run.
"""

import ml_collections

PRESETS = ("quick", "smoke")  # the arguments get_config takes: `bppsa run CONFIG:PRESET`


def get_config(arg=None):
    if arg not in (None, *PRESETS):
        raise ValueError(f"pararnn_peer takes no argument, 'quick' or 'smoke'; got {arg!r}")
    c = ml_collections.ConfigDict()
    c.task = "experiments.extensions.pararnn_peer:run"
    c.name = "pararnn-peer"
    c.points = ("rnn T=1000 B=2", "rnn T=1000 B=16", "rnn T=10000 B=1", "gru T=517 B=16", "gru T=1034 B=32")
    c.extra = False              # also the diagonal-GRU points (H = 20, 64, 256)
    c.peer = "run"               # "skip": bppsa's side only (no torch)
    c.peer_venv = "~/.cache/bppsa/pararnn-venv"  # venv with pararnn-torch (created here when missing)
    c.forward = "auto"           # bppsa newton column: "auto" = when bppsa.Options has forward="newton"; "newton" insists; "sequential" leaves it out
    c.core = 0                   # the one core both sides run on
    c.repeats = 5
    c.no_compile = False         # True: skip the peer's torch.compile
    if arg == "quick":
        c.name = "pararnn-peer-quick"
        c.points = ("rnn quick", "gru quick", "gru_diag quick")
    if arg == "smoke":
        c.name = "pararnn-peer-smoke"
        c.points = ("rnn smoke",)
        c.peer = "skip"
        c.repeats = 1
    return c
