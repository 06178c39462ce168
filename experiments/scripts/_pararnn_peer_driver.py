"""The pararnn-torch side of the pararnn-torch comparison (experiments/extensions/pararnn_peer.py, the task
of experiments/extensions/configs/pararnn_peer.py); runs in the peer's own venv.

    PEER_PYTHON experiments/scripts/_pararnn_peer_driver.py --inp point.npz --out peer.npz --json peer.json

Not importable from bppsa's venv (it imports torch and pararnn only). Reads one benchmark point
written by experiments/extensions/pararnn_peer.py with numpy (no pickle):

    kind           str: "rnn" (an Elman cell written to pararnn's RNNCell protocol, below),
                   "gru" (pararnn.ParaGRU(mix="head", n_heads=1): a dense GRU) or
                   "gru_diag" (pararnn.ParaGRU(mix="diag"): the paper's diagonal GRU)
    xs (T, B, I), h0 (B, H), R (T, B, H)     float32, time-major like bppsa
    param__NAME    the cell's parameters under their torch names (cell.named_parameters())

builds the cell with exactly those weights and times one training step, the forward
``pararnn.newton_apply(cell, x, config, h0=h0)`` (Newton + parallel scan, Danieli et al. Alg. 1)
and the gradient of L = Σ_{t,b,i} H[t,b,i] R[t,b,i] w.r.t. the parameters (pararnn's
custom backward: one reverse scan, eq. 2.6, then the cell's VJP), with one intra-op and one
inter-op thread, eager (``NewtonConfig()``: K = 3, early stop at max|F| < 1e-5) and under
``torch.compile`` (``compile_safe_config()``: fixed K = 3, no host syncs). Writes the eager
outputs and gradients (and the compiled ones) to --out and the timings, iteration counts and
agreement with pararnn's sequential unroll to --json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import warnings

import numpy as np
import pararnn
import torch
from pararnn import NewtonConfig, NewtonStats, ParaGRU, compile_safe_config, newton_apply, sequential_apply
from torch import nn


class ElmanCell(nn.Module):
    """h' = tanh(x W_xᵀ + b_x + h W_hᵀ + b_h): pararnn ships no Elman cell, its protocol takes any
    module with ``hidden_size`` and ``step(h_prev, x)``; this one also gives the analytic dense
    Jacobian (``step_with_jacobian``, layout [..., out, in]) and reuses ``W_x(x)`` (``wx=``),
    the fast paths pararnn's own cells use. Backward: pararnn's autograd VJP of ``step``."""

    jac_structure = "dense"
    state_slots = 1

    def __init__(self, input_size: int, hidden_size: int):
        super().__init__()
        self.input_size = self.d_in = input_size
        self.hidden_size = self.d_h = hidden_size
        self.W_x = nn.Linear(input_size, hidden_size, bias=True)
        self.W_h = nn.Parameter(torch.empty(hidden_size, hidden_size))
        self.b_h = nn.Parameter(torch.empty(hidden_size))

    def step(self, h_prev, x=None, *, wx=None):
        if wx is None:
            wx = self.W_x(x)
        return torch.tanh(wx + h_prev @ self.W_h.T + self.b_h)

    def step_with_jacobian(self, h_prev, x=None, *, wx=None):
        h = self.step(h_prev, x, wx=wx)
        return h, (1.0 - h * h).unsqueeze(-1) * self.W_h


def build_cell(kind: str, input_size: int, hidden_size: int) -> nn.Module:
    if kind == "rnn":
        return ElmanCell(input_size, hidden_size)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # mix='head' warns that it is the Dreamer-style cell
        if kind == "gru":
            return ParaGRU(input_size, hidden_size, mix="head", n_heads=1)
        if kind == "gru_diag":
            return ParaGRU(input_size, hidden_size, mix="diag", max_recurrent_norm=None)
    raise ValueError(f"unknown kind {kind!r}")


def median_ms(fn, repeats: int, warmup: int) -> tuple[float, list[float]]:
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(samples), samples


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--inp", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--json", required=True)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--no-compile", action="store_true")
    args = ap.parse_args()

    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)
    d = np.load(args.inp)  # allow_pickle stays False
    kind = str(d["kind"])
    xs, h0_np, R_np = d["xs"], d["h0"], d["R"]
    T, B, I = xs.shape
    H = h0_np.shape[1]
    cell = build_cell(kind, I, H)
    with torch.no_grad():
        for name, p in cell.named_parameters():
            src = d["param__" + name]
            if tuple(src.shape) != tuple(p.shape):
                raise ValueError(f"{name}: npz shape {src.shape}, cell shape {tuple(p.shape)}")
            p.copy_(torch.from_numpy(src))
    params = [p for _, p in cell.named_parameters()]
    names = [n for n, _ in cell.named_parameters()]
    x = torch.from_numpy(np.ascontiguousarray(xs.transpose(1, 0, 2)))  # (B, T, I)
    h0 = torch.from_numpy(h0_np)
    R = torch.from_numpy(np.ascontiguousarray(R_np.transpose(1, 0, 2)))  # (B, T, H)

    eager_cfg = NewtonConfig()
    stats = NewtonStats()

    def step_eager(st=None):
        hs = newton_apply(cell, x, eager_cfg, h0=h0, stats=st)
        loss = (hs * R).sum()
        grads = torch.autograd.grad(loss, params)
        return hs, grads

    hs, grads = step_eager(stats)
    with torch.no_grad():
        seq = sequential_apply(cell, x, h0=h0)
    record = {
        "kind": kind, "T": T, "B": B, "I": I, "H": H,
        "torch": torch.__version__, "pararnn": pararnn.__version__,
        "threads": torch.get_num_threads(), "interop_threads": torch.get_num_interop_threads(),
        "eager_config": {"max_iters": eager_cfg.max_iters, "residual_atol": eager_cfg.residual_atol,
                         "scan_backend": stats.scan_backend, "jacobian": eager_cfg.jacobian},
        "eager_iters": stats.iters,
        "eager_residual_history": list(stats.residual_history),
        "eager_max_residual": stats.max_residual,
        "newton_vs_sequential_max_abs": float((hs.detach() - seq).abs().max()),
    }
    med, samples = median_ms(lambda: step_eager(), args.repeats, args.warmup)
    record["eager_ms"], record["eager_samples_ms"] = med, samples
    out = {"hs": hs.detach().numpy().transpose(1, 0, 2)}
    out.update({"grad__" + n: g.numpy() for n, g in zip(names, grads)})

    if not args.no_compile:
        comp_cfg = compile_safe_config()

        def fwd(x_):
            return newton_apply(cell, x_, comp_cfg, h0=h0)

        for fullgraph in (True, False):
            compiled = torch.compile(fwd, fullgraph=fullgraph)

            def step_compiled():
                hs_ = compiled(x)
                return hs_, torch.autograd.grad((hs_ * R).sum(), params)

            try:
                t0 = time.perf_counter()
                hs_c, grads_c = step_compiled()
                record["compile_s"] = time.perf_counter() - t0
                record["compiled_fullgraph"] = fullgraph
                break
            except Exception as e:  # noqa: BLE001 - recorded, then the next mode is tried
                record.setdefault("compile_errors", []).append(f"fullgraph={fullgraph}: {type(e).__name__}: {e}"[:500])
                torch._dynamo.reset()
        else:
            hs_c = None
        if hs_c is not None:
            record["compiled_config"] = {"max_iters": comp_cfg.max_iters, "residual_atol": comp_cfg.residual_atol}
            record["compiled_iters"] = comp_cfg.max_iters
            med, samples = median_ms(step_compiled, args.repeats, args.warmup)
            record["compiled_ms"], record["compiled_samples_ms"] = med, samples
            out["compiled_hs"] = hs_c.detach().numpy().transpose(1, 0, 2)
            out.update({"compiled_grad__" + n: g.numpy() for n, g in zip(names, grads_c)})
    np.savez(args.out, **out)
    with open(args.json, "w") as f:
        json.dump(record, f, indent=2)


if __name__ == "__main__":
    main()
