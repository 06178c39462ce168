"""Every exact backward a JAX user could run for one RNN problem, timed side by side.

The baselines of bppsa's tables (:func:`bppsa.bench.bench_point`, the RNN sweeps, the IRMAS grid):

    bptt_unroll{u}   autodiff through ``lax.scan(..., unroll=u)`` for u in :data:`bppsa.cost.UNROLLS`;
                     ``bptt_unroll1`` is the plain ``lax.scan`` ("bptt_plain" in the tables), the
                     fastest u the best unrolled scan a JAX expert would try ("best_unroll")
    bptt             ``bppsa.rnn(..., backward="bptt")``: the unroll :func:`bppsa.cost.bptt_unroll` picks
    bppsa_{scan}     ``bppsa.rnn(..., backward="bppsa", scan=scan)`` for blelloch, associative,
                     sequential (the associative scan only up to ``max_scan_elements`` = T·B)
    cudnn            PyTorch's cuDNN ``nn.RNN`` / ``nn.GRU`` / ``nn.LSTM``, only when ``torch`` imports
                     and has a CUDA device (optional, never a dependency)

Each is one jitted ``jax.grad`` (w.r.t. the parameters) of a loss with a cotangent on every
step, forward included, as a training loop runs it; all are timed in one
:func:`bppsa.timing.time_interleaved` call (steady-state blocks, rotated order), so the ratios
between them come from the same load. ``auto`` is not timed separately: it runs exactly one of
the methods above (:func:`bppsa.cost.choose_backward`), whose time it is given.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from . import backprop
from . import cost as cost_lib
from .timing import time_interleaved

__all__ = ["SCANS", "baseline_functions", "cudnn_function", "backward_baselines", "baseline_table",
           "BASELINE_HEADER"]

SCANS = ("blelloch", "associative", "sequential")


def _loss_grad(fwd, cell, ct):
    def loss(p):
        return jnp.vdot(cell.hidden(fwd(p)), ct)
    return jax.jit(jax.grad(loss))


def cudnn_function(cell, T: int, B: int, dtype=jnp.float32):
    """A zero-argument function running PyTorch's cuDNN forward + backward of the same problem
    (``nn.RNN`` tanh / ``nn.GRU`` / ``nn.LSTM`` of the cell's sizes), or None when torch does not
    import, has no CUDA device, or the cell has no cuDNN counterpart."""
    kind = {"RNN": "RNN", "GRU": "GRU", "LSTM": "LSTM"}.get(type(cell).__name__)
    if kind is None:
        return None
    try:
        import torch
        if not torch.cuda.is_available():
            return None
    except Exception:  # noqa: BLE001 -- optional: any import failure means no cuDNN baseline
        return None
    tdtype = {jnp.dtype(jnp.float32): torch.float32, jnp.dtype(jnp.float64): torch.float64}[jnp.dtype(dtype)]
    mod = getattr(torch.nn, kind)(cell.input_size, cell.hidden_size).to("cuda", tdtype)
    x = torch.randn(T, B, cell.input_size, device="cuda", dtype=tdtype)
    ct = torch.randn(T, B, cell.hidden_size, device="cuda", dtype=tdtype)

    def run():
        mod.zero_grad(set_to_none=True)
        out, _ = mod(x)
        (out * ct).sum().backward()
        torch.cuda.synchronize()
        return None

    return run


def baseline_functions(cell, params, xs, h0, *, scans=SCANS, unrolls=cost_lib.UNROLLS, cudnn: bool = True,
                       max_scan_elements: int = 200_000, seed: int = 0) -> dict:
    """``{name: zero-argument function}`` for every method in the module docstring."""
    xs = jnp.asarray(xs)
    T, B, _ = xs.shape
    s0 = backprop.validate_inputs(cell, params, xs, h0)
    ct = jax.random.normal(jax.random.key(seed), (T, B, cell.hidden_size), xs.dtype)
    fns = {}
    for u in unrolls:
        g = _loss_grad(lambda p, u=u: cell.unflatten_state(backprop.forward_states(cell, p, xs, s0, unroll=u)),
                       cell, ct)
        fns[f"bptt_unroll{u}"] = lambda g=g: g(params)
    g = _loss_grad(lambda p: backprop.rnn(cell, p, xs, h0, backward="bptt"), cell, ct)
    fns["bptt"] = lambda g=g: g(params)
    for s in scans:
        if s == "associative" and T * B > max_scan_elements:
            continue
        g = _loss_grad(lambda p, s=s: backprop.rnn(cell, p, xs, h0, backward="bppsa", scan=s), cell, ct)
        fns[f"bppsa_{s}"] = lambda g=g: g(params)
    if cudnn:
        f = cudnn_function(cell, T, B, xs.dtype)
        if f is not None:
            fns["cudnn"] = f
    return fns


def backward_baselines(cell, params, xs, h0, *, repeats: int = 5, block: int = 3, model=None,
                       **kw) -> dict:
    """Time :func:`baseline_functions` interleaved; the record of one point.

    Returns ``{"ms": {name: median ms}, "spread": {name: [min ms, max ms]}, "bptt_plain",
    "best_unroll", "bptt_unrolled" (its ms), "tuned_unroll", "fastest", "auto": {"choice": (backward,
    scan), "method", "ms", "ratio_to_fastest"}}``; ``model``: the cost model ``auto`` uses (None:
    :func:`bppsa.cost.default_cost_model`).
    """
    xs = jnp.asarray(xs)
    T, B, _ = xs.shape
    fns = baseline_functions(cell, params, xs, h0, **kw)
    t = time_interleaved(fns, repeats=repeats, block=block)
    ms = {k: 1e3 * v["median"] for k, v in t.items()}
    unrolled = {int(k[len("bptt_unroll"):]): v for k, v in ms.items() if k.startswith("bptt_unroll")}
    best_u = min(unrolled, key=unrolled.get)
    backward, scan = cost_lib.choose_backward(cell, T, B, xs.dtype, cost_model=model)
    method = "bptt" if backward == "bptt" else f"bppsa_{scan}"
    fastest = min(ms, key=ms.get)
    return {"ms": ms, "spread": {k: [1e3 * v["min"], 1e3 * v["max"]] for k, v in t.items()},
            "repeats": {k: v["repeats"] for k, v in t.items()},
            "bptt_plain": unrolled.get(1), "best_unroll": best_u, "bptt_unrolled": unrolled[best_u],
            "tuned_unroll": cost_lib.bptt_unroll(cell, T, B, xs.dtype), "fastest": fastest,
            "auto": {"choice": [backward, scan], "method": method, "ms": ms.get(method),
                     "ratio_to_fastest": ms[method] / ms[fastest] if method in ms else None}}


BASELINE_HEADER = ("| T | B | plain lax.scan | best unrolled (u) | bptt tuned (u) | BPPSA blelloch | "
                   "BPPSA assoc. | BPPSA seq. | cuDNN | auto: pick (× fastest) | BPPSA vs plain × | "
                   "BPPSA vs best baseline × |")


def _f(x):
    return "-" if x is None else f"{x:.2f}"


def baseline_table(points) -> str:
    """Markdown table of the ``"baselines"`` record of each point (ms, medians). BPPSA = its
    fastest scan; best baseline = the fastest of plain lax.scan, the best unrolled scan and cuDNN;
    × = baseline time / BPPSA time (> 1: BPPSA faster)."""
    lines = [BASELINE_HEADER, "|" + "---:|" * (BASELINE_HEADER.count("|") - 1)]
    for r in points:
        b = r.get("baselines")
        if not b:
            continue
        ms = b["ms"]
        bppsa = min(v for k, v in ms.items() if k.startswith("bppsa_"))
        base = min(v for v in (b["bptt_plain"], b["bptt_unrolled"], ms.get("cudnn")) if v is not None)
        a = b["auto"]
        auto = f"{a['method']} ({_f(a['ratio_to_fastest'])})"
        lines.append(f"| {r['T']} | {r['B']} | {_f(b['bptt_plain'])} | {_f(b['bptt_unrolled'])} ({b['best_unroll']}) | "
                     f"{_f(ms.get('bptt'))} ({b['tuned_unroll']}) | {_f(ms.get('bppsa_blelloch'))} | "
                     f"{_f(ms.get('bppsa_associative'))} | {_f(ms.get('bppsa_sequential'))} | {_f(ms.get('cudnn'))} | "
                     f"{auto} | {b['bptt_plain'] / bppsa:.2f} | {base / bppsa:.2f} |")
    lines += ["", "bptt tuned (u) is the program `lax.scan(..., unroll=u)` timed a second time under another name: "
              "where u equals the best unrolled scan's, the gap between the two columns is this run's noise floor."]
    return "\n".join(lines) + "\n"
