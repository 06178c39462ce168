"""A roofline model of one H200 for the RNN/GRU gradient step: what BPTT and BPPSA should cost. ::

    python -m experiments.extensions.roofline [--out experiments/results/gpu-roofline.md]
    python -m experiments.extensions.roofline --compare OUT/summary.json   (a GPU run's results)

Pure numpy arithmetic, no JAX. Every kernel costs a launch latency plus the larger of its memory
time (bytes / HBM bandwidth) and its compute time (flops / rate); kernels run one after another.

* BPTT (autodiff through ``lax.scan``): T sequential steps in a device ``while`` loop. Each step
  is a few tiny kernels (B·H·(H + I) multiply-adds: far below one microsecond of memory or
  compute), so it is *latency-bound*: T·(k_fwd + k_bwd)·launch + loop iterations·iteration
  overhead (twice: forward and backward loops). Unrolling by u divides the iterations, not the
  kernels (XLA does not fuse GEMMs of consecutive steps), so ``bptt_unrolled`` is the u = 32 case.
* BPPSA (``bppsa.rnn``, Blelloch scan): the same sequential forward, then about 2·⌈log₂ T⌉ levels
  of batched products (up-sweep: matrix-matrix, S³ per block; down-sweep: vector-matrix, S² per
  block), each a few kernels, *bandwidth- or compute-bound* on the wide bottom levels and
  latency-bound near the root; plus the Jacobians (formed for the GRU, never for the RNN: its
  level 0 is one GEMM of vectors) and the parameter-gradient contraction over all T·B steps.

Hardware figures (NVIDIA H200 SXM datasheet, public): HBM3e 4.8 TB/s; FP32 (CUDA cores) 67
TFLOP/s; TF32 Tensor Core 989 TFLOP/s with 2:4 sparsity, i.e. ~495 dense. Latencies (assumed:
the usual few-microsecond CUDA kernel launch, e.g. NVIDIA's CUDA Graphs write-ups; XLA's GPU
``while`` loop also copies its predicate to the host every iteration): 3 µs per kernel, 8 µs per
loop iteration. The model is a lower bound for the kernels it counts (peak rates, perfect
overlap inside a kernel); small batched GEMMs reach a fraction of peak, which only moves the
bandwidth/compute terms of BPPSA, not the latency-bound BPTT.
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from experiments.data.irmas import SHAPES as IRMAS_SHAPES
from experiments.tables import markdown_table

__all__ = ["H200", "Device", "KERNELS", "predict", "sweep_points", "table", "compare", "compare_table", "main"]


@dataclass(frozen=True)
class Device:
    name: str
    hbm_bytes_per_s: float      # HBM bandwidth
    fp32_flops: float           # float32 on CUDA cores (precision "highest")
    tf32_flops: float           # TF32 tensor cores, dense (precision "default" may use it)
    launch_s: float             # one kernel launch, back to back on a stream
    loop_iteration_s: float     # one iteration of a device while loop (predicate to host)


H200 = Device("NVIDIA H200 SXM", hbm_bytes_per_s=4.8e12, fp32_flops=67e12, tf32_flops=989e12 / 2,
              launch_s=3e-6, loop_iteration_s=8e-6)

# Kernels per time step (after XLA fusion) of one step's forward and backward, and per scan level.
KERNELS = {
    "RNN": {"fwd": 2, "bwd": 5},     # GEMM, bias+tanh | tanh', GEMM to h, 2 weight-gradient GEMMs, sum
    "GRU": {"fwd": 4, "bwd": 10},    # 2 GEMMs + gate fusions | their transposes and gate derivatives
    "up_level": 4, "down_level": 3,  # batched matmul, offset vecmat, add, slice | vecmat, add, concat
    "fixed": 16,                     # storage permutes, Jacobian generation, parameter-gradient GEMMs
}
UNROLL = 32  # the largest unroll the baseline tries


def _kernel(dev: Device, bytes_: float, flops: float, rate: float) -> float:
    return dev.launch_s + max(bytes_ / dev.hbm_bytes_per_s, flops / rate)


def predict(cell: str, T: int, B: int, I: int, H: int = 20, *, device: Device = H200, tf32: bool = False) -> dict:
    """Predicted seconds of one gradient step (forward + backward) and of the backward alone.

    Returns {"bptt_plain", "bptt_unrolled", "bppsa_blelloch", "bppsa_backward", "bptt_backward", "bound"}
    (the method names of every table: :mod:`experiments.baselines`) where
    ``bound`` says what limits BPPSA's backward ("latency", "bandwidth" or "compute").
    """
    if cell not in ("RNN", "GRU"):
        raise ValueError(f"cell must be 'RNN' or 'GRU'; got {cell!r}")
    if min(T, B, I, H) < 1:
        raise ValueError(f"T, B, I, H must be >= 1; got {(T, B, I, H)}")
    k = KERNELS[cell]
    rate = device.tf32_flops if tf32 else device.fp32_flops
    gates = 3 if cell == "GRU" else 1
    step_bytes = 4 * B * (I + 2 * H) * gates
    step_flops = 2 * B * gates * H * (H + I)
    per_step = lambda n: n * _kernel(device, step_bytes / n, step_flops / n, rate)
    fwd = T * per_step(k["fwd"]) + T * device.loop_iteration_s
    bwd_steps = T * per_step(k["bwd"])
    bptt_bwd = bwd_steps + T * device.loop_iteration_s
    bptt_unrolled = fwd - T * device.loop_iteration_s + bwd_steps + 2 * math.ceil(T / UNROLL) * device.loop_iteration_s

    S = H  # state size (GRU and RNN: hidden)
    levels = max(1, math.ceil(math.log2(T + 1)))
    terms = {"latency": 0.0, "bandwidth": 0.0, "compute": 0.0}

    def level(kernels, n_blocks, bytes_per_block, flops_per_block):
        b, f = n_blocks * bytes_per_block, n_blocks * flops_per_block
        terms["latency"] += kernels * device.launch_s
        terms["bandwidth"] += b / device.hbm_bytes_per_s
        terms["compute"] += f / rate
        return kernels * device.launch_s + max(b / device.hbm_bytes_per_s, f / rate)

    bwd = 0.0
    n = T
    for _ in range(levels):  # up-sweep: n/2 matrix products (read 2, write 1), offsets as vectors
        pairs = max(1, n // 2)
        bwd += level(KERNELS["up_level"], pairs * B, 4 * (3 * S * S + 3 * S), 2 * S ** 3 + 2 * S * S)
        n = max(1, (n + 1) // 2)
    n = 1
    for _ in range(levels):  # down-sweep: vector-matrix products
        bwd += level(KERNELS["down_level"], n * B, 4 * (S * S + 3 * S), 2 * S * S)
        n = min(T, 2 * n)
    jac_bytes = 4 * T * B * S * S if cell == "GRU" else 4 * (T // 2) * B * S * S  # GRU: all; RNN: level 0
    grad_bytes = 4 * T * B * (S + I + 2 * S) * gates
    grad_flops = 2 * T * B * gates * S * (S + I)
    bwd += level(KERNELS["fixed"], 1, jac_bytes + grad_bytes, grad_flops + 2 * T * B * S * S * gates)
    bound = max(terms, key=lambda k: terms[k])
    return {"bptt_plain": fwd + bptt_bwd, "bptt_unrolled": bptt_unrolled, "bppsa_blelloch": fwd + bwd,
            "bppsa_backward": bwd, "bptt_backward": bptt_bwd, "bound": bound}


def sweep_points() -> list[dict]:
    """The GPU run's sweep points (experiments/gpu/run.sh): T at B = 16, B at T = 1000, IRMAS GRU."""
    pts = [dict(sweep="T", cell="RNN", T=T, B=16, I=1) for T in (10, 100, 1000, 3000, 10000, 30000)]
    pts += [dict(sweep="B", cell="RNN", T=1000, B=B, I=1) for B in (2, 4, 8, 16, 32, 64, 128, 256)]
    pts += [dict(sweep="irmas", cell="GRU", T=T, B=B, I=I, setting=s) for s, (I, T) in IRMAS_SHAPES.items()
            for B in (16, 32, 64)]
    return pts


def table(device: Device = H200) -> str:
    """The markdown table of predictions at every sweep point (ms) and the predicted ratios."""
    rows = []
    for p in sweep_points():
        r = predict(p["cell"], p["T"], p["B"], p["I"], device=device)
        label = p["sweep"] + (f" {p['setting']}" if "setting" in p else "")
        rows.append([label, p["cell"], p["T"], p["B"], f"{r['bptt_plain'] * 1e3:.3g}",
                     f"{r['bptt_unrolled'] * 1e3:.3g}", f"{r['bppsa_blelloch'] * 1e3:.3g}",
                     f"{r['bppsa_backward'] * 1e3:.3g}", f"{r['bptt_backward'] * 1e3:.3g}",
                     f"{r['bptt_backward'] / r['bppsa_backward']:.1f}x",
                     f"{r['bptt_unrolled'] / r['bppsa_blelloch']:.2f}x", r["bound"]])
    return markdown_table(["sweep", "cell", "T", "B", "BPTT ms", "unrolled ms", "BPPSA ms", "BPPSA bwd ms",
                           "BPTT bwd ms", "bwd ratio", "step ratio vs unrolled", "BPPSA bwd bound"],
                          rows, align="llrrrrrrrrrl")


def compare(summary) -> list[dict]:
    """Predicted against measured ms for every gpu point of a GPU run's summary (a dict or a path
    to summary.json) that has times: one row per (point, method) with the ratio measured/predicted."""
    if not isinstance(summary, dict):
        summary = json.loads(Path(summary).read_text())
    rows = []
    for p in summary.get("points", []):
        ms = p.get("ms") or {}
        if p.get("part") != "gpu" or p.get("cell") not in ("RNN", "GRU") or "bppsa_blelloch" not in ms:
            continue
        pred = predict(p["cell"], int(p["T"]), int(p["B"]), int(p.get("I", 1)), int(p.get("H", 20)))
        for method in ("bptt_plain", "bptt_unrolled", "bppsa_blelloch"):
            if method in ms:
                predicted = pred[method] * 1e3
                rows.append({"sweep": p.get("sweep"), "cell": p["cell"], "T": p["T"], "B": p["B"],
                             "method": method, "predicted_ms": predicted, "measured_ms": float(ms[method]),
                             "measured_over_predicted": float(ms[method]) / predicted})
    return rows


def compare_table(rows) -> str:
    """Markdown of :func:`compare`'s rows, with the median measured/predicted ratio per method."""
    if not rows:
        return "No GPU points with times in this summary."
    out = [markdown_table(["sweep", "cell", "T", "B", "method", "predicted ms", "measured ms", "measured / predicted"],
                          [[r["sweep"], r["cell"], r["T"], r["B"], r["method"], f"{r['predicted_ms']:.3g}",
                            f"{r['measured_ms']:.3g}", f"{r['measured_over_predicted']:.2f}"] for r in rows],
                          align="llrrlrrr")]
    out.append("")
    for method in ("bptt_plain", "bptt_unrolled", "bppsa_blelloch"):
        ratios = [r["measured_over_predicted"] for r in rows if r["method"] == method]
        if ratios:
            out.append(f"- {method}: median measured / predicted {float(np.median(ratios)):.2f} "
                       f"over {len(ratios)} points")
    return "\n".join(out)


def document(device: Device = H200, provenance_line: str = "") -> str:
    """The committed markdown: assumptions, then the table."""
    d = asdict(device)
    return "\n".join([
        f"# Roofline model of the {device.name}: BPTT and BPPSA at the GPU run's sweep points", "",
        provenance_line, "",
        "Predictions, not measurements (see `experiments/extensions/roofline.py` for the model). Figures: HBM "
        f"{d['hbm_bytes_per_s'] / 1e12:.1f} TB/s, FP32 {d['fp32_flops'] / 1e12:.0f} TFLOP/s, TF32 tensor "
        f"{d['tf32_flops'] / 1e12:.0f} TFLOP/s dense (NVIDIA H200 SXM datasheet); kernel launch "
        f"{d['launch_s'] * 1e6:.0f} µs and while-loop iteration {d['loop_iteration_s'] * 1e6:.0f} µs (assumed). "
        "Times are one gradient step (forward + backward, ms), as the GPU run measures them; "
        "\"bwd\" columns are the backward alone. Ratios > 1: BPPSA faster.", "",
        "Reading: BPTT is T steps of a few microsecond-scale kernels, so its time grows linearly in T and "
        "hardly with B; BPPSA's backward is ~2·log₂T levels and stays latency-bound until T·B·S³ work "
        "outgrows the launch latencies. The forward is sequential for both, so the whole-step ratio is "
        "bounded by (forward + BPTT backward) / forward ≈ 1 + k_bwd/k_fwd, however large the backward ratio.",
        "", table(device), ""])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m experiments.extensions.roofline",
                                 description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--out", default=None, help="write the markdown table here (default: print it)")
    ap.add_argument("--compare", default=None, metavar="SUMMARY", help="a GPU run's summary.json to compare with")
    args = ap.parse_args(argv)
    if args.compare:
        print(compare_table(compare(args.compare)))
        return 0
    from experiments.provenance import current_command, provenance  # the line only; the model needs no JAX
    prov = provenance(current_command())
    cmd = "python -m experiments.extensions.roofline" + (f" --out {args.out}" if args.out else "")
    line = f"Generated by `{cmd}` on {prov['date']} at commit {prov['git_commit']}."
    text = document(H200, line)
    if args.out:
        Path(args.out).write_text(text)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
