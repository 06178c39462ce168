"""pararnn-torch's own Newton forward after k = 0..K iterations against its sequential unroll, on the
CPU (its pure-torch path, ``scan_backend="eager"``); runs in the peer's own venv (torch, pararnn,
triton importable), started by experiments/gpu/peer_machine_code.py::

    PEER_PYTHON experiments/scripts/_pararnn_iterations_driver.py --inp point.npz [--iterations 6]

Reads a point of experiments/extensions/pararnn_equations.py (``save_point``; kind "gru_diag"),
builds ``ParaGRU(mix="diag")`` with its weights (``_pararnn_peer_driver.build_cell``) and prints one
JSON object: {"errors": [max |H_k − H_seq| for k = 0..K], "first_iterate", "torch", "pararnn"},
H_k = ``newton_apply(cell, x, NewtonConfig(max_iters=k, scan_backend="eager", residual_fail=None,
residual_atol=None), h0=h0)`` under ``torch.no_grad()`` and H_seq = ``sequential_apply``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch
from pararnn import NewtonConfig, newton_apply, sequential_apply

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _pararnn_peer_driver import build_cell  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--inp", required=True)
    ap.add_argument("--iterations", type=int, default=6)
    a = ap.parse_args()
    torch.set_num_threads(1)
    d = np.load(a.inp)
    kind, xs, h0_np = str(d["kind"]), d["xs"], d["h0"]
    T, B, I = xs.shape
    H = h0_np.shape[1]
    cell = build_cell(kind, I, H)
    with torch.no_grad():
        for name, p in cell.named_parameters():
            p.copy_(torch.from_numpy(d["param__" + name]))
        x = torch.from_numpy(np.ascontiguousarray(xs.transpose(1, 0, 2)))  # (B, T, I)
        h0 = torch.from_numpy(h0_np)
        seq = sequential_apply(cell, x, h0=h0)
        errors = []
        for k in range(a.iterations + 1):
            cfg = NewtonConfig(max_iters=k, scan_backend="eager", residual_fail=None, residual_atol=None)
            errors.append(float((newton_apply(cell, x, cfg, h0=h0) - seq).abs().max()))
    import pararnn
    print(json.dumps({"errors": errors, "first_iterate": "newton_apply(max_iters=0)", "torch": torch.__version__,
                      "pararnn": getattr(pararnn, "__version__", "0.17.4"), "kind": kind, "T": T, "B": B, "H": H}))


if __name__ == "__main__":
    main()
