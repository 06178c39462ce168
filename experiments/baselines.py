"""Every exact backward a JAX user could run for one RNN problem, timed side by side.

The baselines of bppsa's tables (:func:`experiments.bench.bench_point`, the RNN sweeps, the IRMAS grid)::

    bptt_unroll{u}   autodiff through ``lax.scan(..., unroll=u)`` for u in :data:`bppsa.plan.rules.UNROLLS`;
                     ``bptt_unroll1`` is the plain ``lax.scan`` ("bptt_plain" in the tables), the
                     fastest u the best unrolled scan a JAX expert would try ("best_unroll")
    bptt             ``bppsa.rnn(..., backward="bptt")``: the unroll :func:`bppsa.plan.rules.bptt_unroll` picks
    bppsa_{scan}     ``bppsa.rnn(..., backward="bppsa", scan=scan)`` for blelloch, associative,
                     sequential (the associative scan only up to ``max_scan_elements`` = T·B)
    cudnn            PyTorch's cuDNN ``nn.RNN`` / ``nn.GRU`` / ``nn.LSTM``, only when ``torch`` imports
                     and has a CUDA device (optional, never a dependency)

Each is the one timed gradient of :mod:`experiments.gradient` (``jax.grad`` w.r.t. the parameters of
its loss, a fixed random readout of every step, forward included, as a training loop runs it);
all are timed in one :func:`bppsa.host.time_interleaved` call (steady-state blocks, rotated
order), so the ratios between them come from the same load. ``auto`` is not timed separately: it
runs exactly one of the methods above (:func:`bppsa.plan.calibration.choose_backward`), whose time it is given.
"""

from __future__ import annotations

import jax.numpy as jnp

from bppsa.forward.inputs import validate_inputs
from bppsa.host import time_interleaved
from bppsa.plan import calibration, rules
from experiments import gradient
from experiments.tables import markdown_table

__all__ = ["SCANS", "baseline_functions", "backward_baselines", "baseline_table", "BASELINE_COLUMNS"]

SCANS = ("blelloch", "associative", "sequential")


def baseline_functions(cell, params, xs, h0, *, scans=SCANS, unrolls=rules.UNROLLS, cudnn: bool = True,
                       max_scan_elements: int = 200_000, seed: int = 0) -> dict:
    """``{name: zero-argument function}`` for every method in the module docstring: xs (T, B, I),
    h0 (B, H) [LSTM: (h0, c0)]; the readout R (T, B, H) of :func:`experiments.gradient.readout` (``seed``)."""
    xs = jnp.asarray(xs)
    T, B, _ = xs.shape
    validate_inputs(cell, params, xs, h0)
    R = gradient.readout(cell, T, B, xs.dtype, seed)
    scans = [s for s in scans if not (s == "associative" and T * B > max_scan_elements)]
    fns = gradient.gradient_functions(cell, params, xs, h0, R, gradient.method_names(unrolls=unrolls, scans=scans))
    if cudnn:
        f = gradient.cudnn_function(cell, xs, R)
        if f is not None:
            fns["cudnn"] = f
    return fns


def backward_baselines(cell, params, xs, h0, *, repeats: int = 5, block: int = 3, model=None,
                       **kw) -> dict:
    """Time :func:`baseline_functions` interleaved; the record of one point.

    Returns ``{"ms": {name: median ms}, "spread": {name: [min ms, max ms]}, "bptt_plain",
    "best_unroll", "bptt_unrolled" (its ms), "tuned_unroll", "fastest", "auto": {"choice": (backward,
    scan), "method", "ms", "ratio_to_fastest"}}``; ``model``: the cost model ``auto`` uses (None:
    :func:`bppsa.plan.calibration.default_cost_model`).
    """
    xs = jnp.asarray(xs)
    T, B, _ = xs.shape
    fns = baseline_functions(cell, params, xs, h0, **kw)
    t = time_interleaved(fns, repeats=repeats, block=block)
    ms = {k: 1e3 * v["median"] for k, v in t.items()}
    unrolled = {int(k[len("bptt_unroll"):]): v for k, v in ms.items() if k.startswith("bptt_unroll")}
    best_u = min(unrolled, key=lambda u: unrolled[u])
    backward, scan = calibration.choose_backward(cell, T, B, xs.dtype, cost_model=model)
    method = "bptt" if backward == "bptt" else f"bppsa_{scan}"
    fastest = min(ms, key=lambda k: ms[k])
    return {"ms": ms, "spread": {k: [1e3 * v["min"], 1e3 * v["max"]] for k, v in t.items()},
            "repeats": {k: v["repeats"] for k, v in t.items()},
            "bptt_plain": unrolled.get(1), "best_unroll": best_u, "bptt_unrolled": unrolled[best_u],
            "tuned_unroll": rules.bptt_unroll(cell, T, B, xs.dtype), "fastest": fastest,
            "auto": {"choice": [backward, scan], "method": method, "ms": ms.get(method),
                     "ratio_to_fastest": ms[method] / ms[fastest] if method in ms else None}}


BASELINE_COLUMNS = ("T", "B", "plain lax.scan", "best unrolled (u)", "bptt tuned (u)", "BPPSA blelloch",
                    "BPPSA assoc.", "BPPSA seq.", "cuDNN", "auto: pick (× fastest)", "BPPSA vs plain ×",
                    "BPPSA vs best baseline ×")


def _f(x):
    return "-" if x is None else f"{x:.2f}"


def baseline_table(points) -> str:
    """Markdown table of the ``"baselines"`` record of each point (ms, medians). BPPSA = its
    fastest scan; best baseline = the fastest of plain lax.scan, the best unrolled scan and cuDNN;
    × = baseline time / BPPSA time (> 1: BPPSA faster)."""
    rows = []
    for r in points:
        b = r.get("baselines")
        if not b:
            continue
        ms = b["ms"]
        bppsa = min(v for k, v in ms.items() if k.startswith("bppsa_"))
        base = min(v for v in (b["bptt_plain"], b["bptt_unrolled"], ms.get("cudnn")) if v is not None)
        a = b["auto"]
        rows.append([r["T"], r["B"], _f(b["bptt_plain"]), f"{_f(b['bptt_unrolled'])} ({b['best_unroll']})",
                     f"{_f(ms.get('bptt'))} ({b['tuned_unroll']})", _f(ms.get("bppsa_blelloch")),
                     _f(ms.get("bppsa_associative")), _f(ms.get("bppsa_sequential")), _f(ms.get("cudnn")),
                     f"{a['method']} ({_f(a['ratio_to_fastest'])})", f"{b['bptt_plain'] / bppsa:.2f}",
                     f"{base / bppsa:.2f}"])
    lines = [markdown_table(BASELINE_COLUMNS, rows, align="r" * len(BASELINE_COLUMNS)), "",
             "bptt tuned (u) is the program `lax.scan(..., unroll=u)` timed a second time under another name: "
             "where u equals the best unrolled scan's, the gap between the two columns is this run's noise floor."]
    return "\n".join(lines) + "\n"
