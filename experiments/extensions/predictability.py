"""Predicted against measured Newton iterations (part ``predictability`` of the parallel-step task,
:mod:`experiments.extensions.parallel_step`): for cells at random initialisation, the IRMAS GRU before
and after training, an Elman RNN across recurrent spectral radii (contracting, the edge of chaos,
expanding), a saturating RNN (radius 10) and slowly forgetting diagonal GRUs, each forward of
``config.pred_forwards`` ("elk": Newton with ``damping=1``) at each T of ``config.pred_T``:

- measured: ``NewtonInfo.iterations`` / ``converged``, the exponent along the returned states
  (``info.lle``) and the iterations it predicts (``info.predicted``,
  :func:`bppsa.forward.newton.predicted_iterations`);
- ``forward="auto"``'s choice: on this backend (the plan's), and what the accelerator model would
  choose (:func:`bppsa.plan.cost.choose_forward` with backend "gpu": the break-even iterations, the
  exponent along the first :data:`bppsa.forward.newton.PROBE_STEPS` states and its prediction).

The rows, a table and a scatter plot (``<name>_predictability.png``) go into the parallel-step record.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from bppsa import backprop, cells
from bppsa.forward import newton
from bppsa.forward.lyapunov import lyapunov
from bppsa.plan import cost
from bppsa.plan.options import Options
from experiments import gradient
from experiments.tables import markdown_table

__all__ = ["predictability", "mean_iterations", "fit_of", "markdown_part", "plot"]

FORWARD_OPTIONS = {"newton": ("newton", {}), "quasi": ("quasi", {}), "elk": ("newton", {"damping": 1.0})}


def _scaled_rnn(I: int, H: int, rho: float):
    """(cell, inputs(T, B, seed) -> (params, xs, h0)): an RNN with W_h at spectral radius ``rho``."""
    cell = cells.RNN(I, H)

    def inputs(T, B, seed):
        p, xs, h0, _ = gradient.problem(cell, T, B, seed=seed)
        W = np.asarray(p["W_h"], np.float64)
        return {**p, "W_h": p["W_h"] * (rho / float(np.max(np.abs(np.linalg.eigvals(W)))))}, xs, h0
    return cell, inputs


def _slow_gru(I: int, H: int, gate: float):
    """A diagonal GRU whose update gate is ≈ ``gate`` (its bias set to logit(gate))."""
    cell = cells.BlockGRU(I, H, 1)

    def inputs(T, B, seed):
        p, xs, h0, _ = gradient.problem(cell, T, B, seed=seed)
        b = np.array(p["b_x"])
        b[H:2 * H] = np.log(gate / (1 - gate))
        return {**p, "b_x": jnp.asarray(b, p["b_x"].dtype), "b_h": p["b_h"].at[H:2 * H].set(0.0)}, xs, h0
    return cell, inputs


def _groups(config, trained: dict | None, make_cell, cell_label, long_inputs):
    """(group, label, cell, inputs(T, B, seed) -> (params, xs, h0)) of every case."""
    I, H = config.iter_I, config.iter_H
    out = []
    for kind, head in config.iter_cells:
        cell = make_cell(kind, I, H, head)
        out.append(("random", cell_label(kind, head), cell,
                    lambda T, B, seed, cell=cell: gradient.problem(cell, T, B, seed=seed)[:3]))
    if trained:
        for weights, params in trained["params"].items():
            def inputs(T, B, seed, params=params):
                xs = jnp.asarray(long_inputs(trained["x"], T, B))
                return params, xs, jnp.zeros((B, H), xs.dtype)
            out.append(("trained" if "trained" in weights else "random", f"GRU {weights}", trained["cell"], inputs))
    for rho in config.pred_rhos:
        group = "contracting" if rho < 1.2 else ("edge of chaos" if rho < 1.8 else "expanding")
        out.append((group, f"RNN ρ={rho}", *_scaled_rnn(I, H, rho)))
    out.append(("saturating", "RNN ρ=10", *_scaled_rnn(I, H, 10.0)))
    for gate in config.pred_gates:
        out.append(("slowly forgetting", f"BlockGRU k=1 gate {gate}", *_slow_gru(I, H, gate)))
    return out


def predictability(config, trained: dict | None, tools: dict, log=print) -> list[dict]:
    """The rows (module docstring). ``trained``: {"cell", "x" (clips), "params": {weights: params}};
    ``tools``: the parallel-step task's ``iteration_row``, ``make_cell``, ``cell_label``, ``long_inputs``."""
    rows, iteration_row = [], tools["iteration_row"]
    for group, label, cell, inputs in _groups(config, trained, tools["make_cell"], tools["cell_label"],
                                              tools["long_inputs"]):
        for T in config.pred_T:
            params, xs, h0 = inputs(T, config.iter_B, config.seed)
            ref = jax.jit(lambda p, x, h, cell=cell: backprop.rnn(cell, p, x, h, backward="bptt"))(params, xs, h0)
            here = Options(forward="auto").plan(cell, xs, cell.flatten_state(h0)).forward
            gpu, gate = cost.choose_forward(cell, T, config.iter_B, backend="gpu")
            probe = float(jnp.max(lyapunov(cell, params, xs[:newton.PROBE_STEPS], h0)))
            probe_k = int(newton.predicted_iterations(probe, T))
            auto_gpu = "newton" if gate is not None and probe < 0 and probe_k <= gate else "sequential"
            for fwd in config.pred_forwards:
                kind, kw = FORWARD_OPTIONS[fwd]
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", newton.NewtonFallbackWarning)
                    r = iteration_row(cell, params, xs, h0, ref, kind, scan=config.iter_scan, **kw)
                row = {"group": group, "cell": label, "T": int(T), "B": config.iter_B, **r, "forward": fwd,
                       "auto_here": here, "auto_gpu": auto_gpu, "gpu_gate": gate, "probe_lle": probe,
                       "probe_predicted": probe_k}
                rows.append(row)
                log(f"  {label:<26} T={T:<6} {fwd:<6} it {row['iterations']:>3} conv {row['converged']!s:<5} "
                    f"lle {row['lle']:+.3f} predicted {row['predicted']:>3}; auto here {here}, gpu {auto_gpu}")
    return rows


def mean_iterations(record) -> dict:
    """Mean / median / max iterations per forward over the converged runs at random and trained weights."""
    rows = record.get("iterations", []) + record.get("trained", {}).get("rows", [])
    out = {}
    for fwd in ("newton", "quasi"):
        its = [r["iterations"] for r in rows if r["forward"] == fwd and r["converged"]]
        if its:
            failed = sum(1 for r in rows if r["forward"] == fwd and not r["converged"])
            out[fwd] = {"mean": float(np.mean(its)), "median": float(np.median(its)), "max": int(max(its)),
                        "runs": len(its), "unconverged": failed}
    return out


def fit_of(rows) -> dict:
    """How the prediction did on the converged Newton rows: the share within 2x and the median ratio."""
    ok = [r for r in rows if r["forward"] == "newton" and r["converged"] and r["predicted"] > 0]
    ratio = np.array([r["predicted"] / max(r["iterations"], 1) for r in ok])
    return {"runs": len(ok), "within_2x": float(np.mean((ratio >= 0.5) & (ratio <= 2))) if ok else None,
            "median_ratio": float(np.median(ratio)) if ok else None,
            "unconverged_newton": sum(1 for r in rows if r["forward"] == "newton" and not r["converged"])}


def markdown_part(record) -> list[str]:
    rows = record["predictability"]["rows"]
    fit = record["predictability"]["fit"]
    body = [[r["group"], r["cell"], r["T"], r["forward"], f"{r['lle']:+.3f}", r["predicted"],
             f"{r['iterations']}" + ("" if r["converged"] else " ✗"), r["auto_here"],
             f"{r['auto_gpu']} ({r['probe_predicted']} vs {r['gpu_gate']:.0f})" if r["gpu_gate"] else r["auto_gpu"],
             f"{r['max_abs_diff']:.1e}"] for r in rows]
    return ["## Predicted against measured iterations", "",
            "The largest Lyapunov exponent λ along the returned states (`info.lle`), the iterations it predicts "
            "(`info.predicted` = min(T, ⌊3 + 1/(1 − e^λ)⌋) for λ < 0, T otherwise; ×2 for quasi) and the measured "
            "count (✗: not converged within max_iter, the sequential states returned). elk: `damping=1`. "
            "auto here: `forward=\"auto\"` on this backend; auto (GPU model): what the accelerator's model would run "
            "(the prediction from the first 64 states against the break-even iterations).", "",
            markdown_table(["group", "cell", "T", "forward", "λ", "predicted", "measured", "auto here",
                            "auto (GPU model)", "max abs(states − seq.)"], body, align="llrlrrrllr"), "",
            f"Converged Newton runs: {fit['runs']}; prediction within 2× of the measured count in "
            f"{100 * (fit['within_2x'] or 0):.0f} %, median predicted / measured {fit['median_ratio'] or 0:.2f}; "
            f"Newton did not converge in {fit['unconverged_newton']} runs.", ""]


def plot(rows, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6.4, 5.2))
    for j, group in enumerate(dict.fromkeys(r["group"] for r in rows)):
        rs = [r for r in rows if r["group"] == group and r["forward"] == "newton" and r["predicted"] > 0]
        ok, failed = [r for r in rs if r["converged"]], [r for r in rs if not r["converged"]]
        ax.scatter([r["predicted"] for r in ok], [r["iterations"] for r in ok], label=group, alpha=0.8, color=f"C{j}")
        ax.scatter([r["predicted"] for r in failed], [r["iterations"] for r in failed], marker="x",
                   color=f"C{j}")  # x: not converged within max_iter
    lim = [1, max([r["predicted"] for r in rows] + [r["iterations"] for r in rows] + [10]) * 1.5]
    ax.plot(lim, lim, "k--", lw=0.8, label="predicted = measured")
    ax.set(xscale="log", yscale="log", xlim=lim, ylim=lim, xlabel="predicted iterations (from the Lyapunov exponent)",
           ylabel="measured Newton iterations", title="Newton iterations: predicted vs measured (float32)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
