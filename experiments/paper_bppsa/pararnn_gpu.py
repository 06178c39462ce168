"""pararnn-torch's fused Triton Newton step on CUDA, the peer of the GPU run's structured points.

    python -m experiments.paper_bppsa.pararnn_gpu --I 64 --H 256 --T 4096 --B 16 [--repeats 3]

prints one JSON object: ``{"ms": training-step median, "forward_ms", "samples_ms", "iters",
"scan_backend", "pararnn", "torch", "triton", "source"}`` or ``{"skipped": reason}``.

The cell is ``pararnn.ParaGRU(I, H, mix="diag", max_recurrent_norm=None)``: pararnn's diagonal
GRU, the equations of ``bppsa.cells.BlockGRU(I, H, head_size=1)`` up to its z gate's sign
(:mod:`experiments.extensions.pararnn_equations`), with its own random weights (times only). One
training step: ``newton_apply(cell, x, NewtonConfig(scan_backend="fused", residual_fail=None), h0=h0)``
(the fused Triton Alg. 1 custom op, fixed K = 3 Newton iterations: ``fused_early_exit`` is off by
default; no divergence check, so no host sync: ``max_residual``, max |F| after K, is read once),
the loss Σ H ⊙ R, and ``torch.autograd.grad`` w.r.t. the parameters (pararnn's eq. 2.6 reverse
scan, Triton); CUDA synchronised after each call; float32, x (B, T, I) batch-first as pararnn
wants it. ``forward_ms``: the forward alone under ``torch.no_grad()``.

The device machine has torch and triton but no internet and no pararnn: :func:`ensure_pararnn`
installs the wheel carried in ``experiments/gpu/wheels`` (``experiments/gpu/fetch_wheels.sh``
downloads it here) into a temporary folder with ``pip install --no-deps --no-index --target``
(or unpacks it, a pure-Python wheel, where pip cannot) and puts that folder on ``sys.path``.
The GPU run starts this module in a subprocess with a timeout: Triton's first compile of the
kernels is paid there, and a hang costs the column, not the run.
"""

from __future__ import annotations

import argparse
import importlib
import json
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Any

__all__ = ["WHEELS", "PEER", "ensure_pararnn", "measure", "main"]

REPO = Path(__file__).resolve().parents[2]
WHEELS = REPO / "experiments" / "gpu" / "wheels"
PEER = "pararnn-torch==0.17.4"  # the version of experiments/extensions/pararnn_peer.py


def ensure_pararnn(wheels: Path = WHEELS) -> tuple[Any, str]:
    """Import pararnn, installing the carried wheel into a temporary folder when it is not importable.

    Args:
      wheels: the folder holding ``pararnn_torch-*.whl``.

    Returns:
      ``(module, source)``: source "installed" (importable as it was) or "wheel <name>"; the module
      is None where it cannot be had, source then saying why.
    """
    try:
        return importlib.import_module("pararnn"), "installed"
    except ImportError as e:
        missing = e
    found = sorted(Path(wheels).glob("pararnn_torch-*.whl"))
    if not found:
        return None, f"pararnn does not import ({missing}) and no wheel in {wheels} (experiments/gpu/fetch_wheels.sh)"
    wheel = found[-1]
    target = tempfile.mkdtemp(prefix="pararnn-wheel-")
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--quiet",
                        "--disable-pip-version-check", "--target", target, str(wheel)],
                       capture_output=True, text=True)
    how = f"wheel {wheel.name}"
    if r.returncode != 0:  # no pip there: a py3-none-any wheel is a zip of the package as installed
        with zipfile.ZipFile(wheel) as z:
            z.extractall(target)
        how += " (unzipped: pip failed: " + (r.stderr.strip().splitlines() or ["?"])[-1][:120] + ")"
    sys.path.insert(0, target)
    importlib.invalidate_caches()
    try:
        return importlib.import_module("pararnn"), how
    except Exception as e:  # noqa: BLE001 -- e.g. torch or triton missing: the reason is the record
        return None, f"{how} installed into {target} but pararnn does not import: {type(e).__name__}: {str(e)[:200]}"


def _median_ms(fn, repeats: int, warmup: int) -> tuple[float, list[float]]:
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(samples), samples


def measure(I: int, H: int, T: int, B: int, *, repeats: int = 3, warmup: int = 2, wheels: Path = WHEELS) -> dict:
    """Time pararnn-torch's fused training step of the diagonal GRU on CUDA (the module docstring).

    Args:
      I, H: input and hidden size.
      T, B: sequence length and batch size.
      repeats: timed calls (the median is ``ms``).
      warmup: untimed calls first (the first compiles the Triton kernels).
      wheels: where :func:`ensure_pararnn` looks for the wheel.

    Returns:
      The record of the module docstring, or ``{"skipped": reason}`` (no torch, no CUDA, no
      pararnn, or the fused path not taken).
    """
    try:
        import torch  # pyright: ignore[reportMissingImports] -- on the device machine only
    except ImportError as e:
        return {"skipped": f"torch does not import: {e}"}
    if not torch.cuda.is_available():
        return {"skipped": "no CUDA device: pararnn-torch's fused Newton step is CUDA/Triton only"}
    pararnn, source = ensure_pararnn(wheels)
    if pararnn is None:
        return {"skipped": source}
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cell = pararnn.ParaGRU(I, H, mix="diag", max_recurrent_norm=None).to("cuda")
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(B, T, I, device="cuda", generator=gen)
    R = torch.randn(B, T, H, device="cuda", generator=gen)
    h0 = torch.zeros(B, H, device="cuda")
    # fixed K = 3 with no host sync: residual_fail=None drops the divergence check's extra step
    # evaluation and sync per call (pararnn's training preset, compile_safe_config, does the same)
    cfg = pararnn.NewtonConfig(scan_backend="fused", residual_fail=None)
    params = [p for p in cell.parameters() if p.requires_grad]

    def step():
        hs = pararnn.newton_apply(cell, x, cfg, h0=h0)
        grads = torch.autograd.grad((hs * R).sum(), params)
        torch.cuda.synchronize()
        return grads

    def forward():
        with torch.no_grad():
            pararnn.newton_apply(cell, x, cfg, h0=h0)
        torch.cuda.synchronize()

    stats = pararnn.NewtonStats()
    with torch.no_grad():  # compiles; says which path ran and how far from converged K = 3 left it
        pararnn.newton_apply(cell, x, cfg, h0=h0, stats=stats)
    torch.cuda.synchronize()
    if stats.scan_backend != "fused":
        return {"skipped": f"pararnn resolved scan_backend {stats.scan_backend!r}, not the fused kernels"}
    ms, samples = _median_ms(step, repeats, warmup)
    fwd_ms, _ = _median_ms(forward, repeats, 1)
    import triton  # pyright: ignore[reportMissingImports] -- pararnn's fused path imported it already

    return {"ms": ms, "forward_ms": fwd_ms, "samples_ms": samples, "iters": stats.iters,
            "max_residual": stats.max_residual, "scan_backend": stats.scan_backend,
            "cell": f"ParaGRU(mix='diag') {I}->{H}", "T": T, "B": B,
            "pararnn": getattr(pararnn, "__version__", None), "torch": torch.__version__,
            "triton": getattr(triton, "__version__", None), "source": source}


def main(argv=None) -> int:
    """Print :func:`measure`'s record as one JSON line.

    Args:
      argv: the command line (``--I --H --T --B [--repeats] [--wheels]``); None: sys.argv.

    Returns:
      0 (a skip is a record, not a failure).
    """
    ap = argparse.ArgumentParser(prog="python -m experiments.paper_bppsa.pararnn_gpu",
                                 description=(__doc__ or "").split("\n")[0])
    for k in ("I", "H", "T", "B"):
        ap.add_argument(f"--{k}", type=int, required=True)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--wheels", default=str(WHEELS))
    a = ap.parse_args(argv)
    try:
        rec = measure(a.I, a.H, a.T, a.B, repeats=a.repeats, wheels=Path(a.wheels))
    except Exception as e:  # noqa: BLE001 -- the GPU run records the failure as the column's reason
        rec = {"skipped": f"{type(e).__name__}: {str(e)[:300]}"}
    print(json.dumps(rec, default=str), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
