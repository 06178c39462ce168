"""The paper's vanilla-RNN sweeps (Wang et al. 2020, Fig. 5): BPPSA vs BPTT over T and over B.

Configs: ``experiments/paper_bppsa/configs/rnn_sweep.py`` (both sweeps, ``bppsa reproduce rnn-sweep``;
its presets ``:T`` and ``:B`` run one of them: T at B = 16, B at T = 1000), with the task
:func:`sweep_task`; ``core_accuracy.py`` (float32 gradient error, :func:`accuracy_task`).
Every point is one :func:`experiments.bench.bench_point`; with ``config.gemm`` the sweep also records the
bare batched-GEMM rates (:func:`gemm_rates`) and the up-sweep products' rate (:func:`product_rate`).
"""

from __future__ import annotations

import time
from pathlib import Path

import jax
import jax.numpy as jnp

from bppsa import cells
from bppsa.errors import UsageError, checked_by, require_int, require_ints
from bppsa.host import time_interleaved
from bppsa.plan.calibration import default_cost_model
from bppsa.scan import SCANS
from bppsa.scan.dense import batched_matmul, bottom_layout, diagonal_products
from experiments import entry, gradient
from experiments.bench import CELLS, TABLE_HEADER, bench_point, make_cell, save_record
from experiments.provenance import provenance, save_json
from experiments.tables import markdown_table

__all__ = ["run_sweep", "plot_sweep", "save_sweep", "sweep_task", "check_sweep_task", "gemm_rates", "product_rate",
           "gradient_errors", "accuracy_task", "check_accuracy_task", "T_SWEEP", "B_SWEEP", "T_SWEEP_QUICK",
           "B_SWEEP_QUICK"]

T_SWEEP = (10, 30, 100, 300, 1000, 3000, 10000, 30000)        # at B = 16 (the paper's Fig. 5a)
B_SWEEP = (2, 4, 8, 16, 32, 64, 128, 256)                     # at T = 1000 (Fig. 5b)
T_SWEEP_QUICK = (10, 100, 1000, 3000)
B_SWEEP_QUICK = (2, 16, 64)


def run_sweep(*, T_values=T_SWEEP, B_values=B_SWEEP, T_fixed: int = 1000, B_fixed: int = 16,
              grid_T=(), grid_B=(), hidden_size: int = 20, cell: str = "rnn", input_size: int = 1, repeats: int = 5,
              scan: str = "blelloch", auto: bool = True, memory: bool = True, unrolls=None,
              max_scan_elements: int = 200_000, time_budget_s: float | None = None,
              log=print) -> dict:
    """The paper's two sweeps: T at B = ``B_fixed`` and B at T = ``T_fixed``, and a grid of points
    (every T of ``grid_T`` at every B of ``grid_B``: what ``bppsa bench`` times). Returns the record.

    ``time_budget_s``: stop starting new points once this much wall time has passed (the
    skipped points are listed in ``record["skipped"]``). ``auto``: time every baseline at each
    point (:mod:`experiments.baselines`) and record ``auto``'s choice by the cost model in use
    (:func:`bppsa.plan.calibration.default_cost_model`: this machine's calibration, else the shipped model;
    no probe). ``unrolls``: the ``lax.scan`` unrolls timed as baselines (None: all of
    :data:`bppsa.plan.rules.UNROLLS`).
    """
    c = make_cell(cell, input_size, hidden_size)
    model = default_cost_model() if auto else None
    record = {"config": {"cell": cell, "input_size": input_size, "hidden_size": hidden_size,
                         "T_values": list(T_values), "B_values": list(B_values), "T_fixed": T_fixed,
                         "B_fixed": B_fixed, "grid_T": list(grid_T), "grid_B": list(grid_B),
                         "repeats": repeats, "scan": scan, "dtype": "float32"},
              "cost_model": model.to_json() if model else None, "sweeps": {}, "skipped": []}
    start = time.perf_counter()
    for name, pts in (("T sweep", [(T, B_fixed) for T in T_values]),
                      ("B sweep", [(T_fixed, B) for B in B_values]),
                      ("grid", [(T, B) for T in grid_T for B in grid_B])):
        log(f"\n{name} ({type(c).__name__}, H = {hidden_size}, {scan} scan, median of {repeats})\n{TABLE_HEADER}")
        out = []
        for T, B in pts:
            if time_budget_s is not None and time.perf_counter() - start > time_budget_s:
                record["skipped"].append({"sweep": name, "T": T, "B": B, "why": "time budget"})
                log(f"skipped T = {T}, B = {B}: time budget of {time_budget_s:.0f} s spent")
                continue
            out.append(bench_point(c, T, B, scan=scan, repeats=repeats, model=model, memory=memory,
                                   baselines={"unrolls": tuple(unrolls)} if auto and unrolls else auto,
                                   max_scan_elements=max_scan_elements, log=log))
        record["sweeps"][name] = out
    record["wall_s"] = time.perf_counter() - start
    return record


def plot_sweep(record, path) -> None:
    """Backward and step speedups vs T (B fixed) and vs B (T fixed), log axes."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    parts = [(name, pts) for name, pts in record["sweeps"].items() if pts]
    fig, axes = plt.subplots(1, len(parts), figsize=(5.5 * len(parts), 3.8), squeeze=False)
    for ax, (name, pts) in zip(axes[0], parts):
        key = "T" if pts[0]["B"] == pts[-1]["B"] and len({p["T"] for p in pts}) > 1 else "B"
        xs = [p[key] for p in pts]
        ax.plot(xs, [p["speedup_backward"] for p in pts], "o-", label="backward (BPTT / BPPSA)")
        ax.plot(xs, [p["speedup_step"] for p in pts], "s--", label="training step")
        if pts and "scans" in pts[0]:
            ax.plot(xs, [p["speedup_scan"] for p in pts], "^:", label="scan alone vs BPTT backward")
        ax.axhline(1.0, color="gray", lw=0.8)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel(key)
        ax.set_ylabel("speedup of BPPSA over BPTT")
        fixed = f"B = {pts[0]['B']}" if key == "T" else f"T = {pts[0]['T']}"
        ax.set_title(f"{name}: {fixed}, H = {pts[0]['H']}")
        ax.legend(fontsize=8)
    fig.suptitle(f"BPPSA vs BPTT, {record['provenance']['backend']} ({record['provenance']['cpu']})"
                 if record["provenance"]["backend"] == "cpu" else
                 f"BPPSA vs BPTT, {record['provenance']['device_kind']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def save_sweep(record, outdir, name: str) -> list:
    """Write ``name``.json (with provenance), .md (:func:`experiments.bench.save_record`) and .png; the paths."""
    for ext in ("json", "md"):  # what save_record writes
        entry(outdir, f"{name}.{ext}")
    paths = save_record(record, outdir, name)
    if any(record["sweeps"].values()):
        plot_sweep(record, entry(outdir, f"{name}.png"))
        paths.append(Path(outdir) / f"{name}.png")
    return paths


def check_sweep_task(config) -> None:
    """The ranges of :func:`sweep_task`'s config (UsageError naming the key)."""
    for key in ("T_values", "B_values", "grid_T", "grid_B"):
        require_ints(config, key)
    if not (config.T_values or config.B_values or (config.grid_T and config.grid_B)):
        raise UsageError("nothing to time: config.T_values, config.B_values and config.grid_T x config.grid_B "
                         "are all empty; expected at least one point")
    if config.cell not in CELLS:
        raise UsageError(f"config.cell must be one of {sorted(CELLS)}; got {config.cell!r}")
    if config.scan not in SCANS:
        raise UsageError(f"config.scan must be one of {sorted(SCANS)}; got {config.scan!r}")
    require_int(config, "input_size")
    for key in ("T_fixed", "B_fixed", "hidden_size", "repeats"):
        require_int(config, key)
    budget = config.time_budget_s
    if budget is not None and not budget > 0:
        raise UsageError(f"config.time_budget_s must be a number of seconds > 0, or unset; got {budget!r}")


@checked_by(check_sweep_task)
def sweep_task(config, workdir) -> dict:
    """Task of ``experiments/paper_bppsa/configs/rnn_sweep.py`` (and ``bppsa bench``): the sweeps, saved to
    ``workdir``."""
    rec = run_sweep(T_values=tuple(config.T_values), B_values=tuple(config.B_values),
                    T_fixed=config.T_fixed, B_fixed=config.B_fixed, grid_T=tuple(config.grid_T),
                    grid_B=tuple(config.grid_B), cell=config.cell, input_size=config.input_size,
                    hidden_size=config.hidden_size, scan=config.scan, repeats=config.repeats,
                    auto=config.auto, time_budget_s=config.time_budget_s, unrolls=config.get("unrolls"))
    rec["sweeps"] = {k: v for k, v in rec["sweeps"].items() if v}
    if config.note:
        rec["note"] = config.note
    if config.gemm:
        rec["gemm_gflops"] = gemm_rates(S=config.hidden_size)
        for k, v in rec["gemm_gflops"].items():
            print(f"{k:40s} {v:7.1f} GFLOP/s")
        H = config.hidden_size
        for r in (r for pts in rec["sweeps"].values() for r in pts):
            # the whole scan's effective rate: its ~n matrix products' flops / the whole scan's time
            r["scan_gflops"] = 2 * r["T"] * r["B"] * H ** 3 / r["components"]["bppsa_backward"]["min"] / 1e9
            # the products alone (the up-sweep's bottom levels, as the scan runs them)
            r["product_rate"] = product_rate(r["T"], r["B"], H,
                                             structured=isinstance(cells.structure_of(cells.RNN(1, H)), cells.Scaled))
            print(f"T={r['T']} B={r['B']}: scan {r['scan_gflops']:.1f} GFLOP/s effective, "
                  f"up-sweep products {r['product_rate']['gflops']:.1f} GFLOP/s")
    print("wrote " + ", ".join(map(str, save_sweep(rec, workdir, config.name))))
    return {name: [{"T": p["T"], "B": p["B"], "speedup_backward": p["speedup_backward"],
                    "speedup_step": p["speedup_step"]} for p in pts] for name, pts in rec["sweeps"].items()}


def gemm_rates(*, n: int = 4096, S: int = 20, large: int = 1024, repeats: int = 7, dtype=jnp.float32) -> dict:
    """GFLOP/s (from the min time) of a bare batch of n S x S products in the layouts we tried, and of
    one large GEMM, interleaved: the ceiling the scan's batched products are compared against."""
    k1, k2 = jax.random.split(jax.random.key(0))
    A = jax.random.normal(k1, (n, S, S), dtype) / S
    Bm = jax.random.normal(k2, (n, S, S), dtype) / S
    At, Bt = jnp.moveaxis(A, 0, -1), jnp.moveaxis(Bm, 0, -1)
    X = jax.random.normal(k1, (large, large), dtype)
    forms = {
        "batched matmul (n, S, S)": (jax.jit(jnp.matmul), (A, Bm)),
        "batched matmul (n/16, 16, S, S)": (
            jax.jit(lambda a, b: jnp.matmul(a.reshape(-1, 16, S, S), b.reshape(-1, 16, S, S))), (A, Bm)),
        "fused multiply-add over k (n, S, S)": (
            jax.jit(lambda a, b: sum(a[:, :, k, None] * b[:, None, k, :] for k in range(S))), (A, Bm)),
        "scan's form: fused multiply-add on halves of (2n, S, S)": (
            jax.jit(lambda x: batched_matmul(x[:n], x[n:])), (jnp.concatenate([A, Bm]),)),
        "einsum batch-last (S, S, n)": (jax.jit(lambda a, b: jnp.einsum("ikn,kjn->ijn", a, b)), (At, Bt)),
        "RNN structure: diag(a) Wt diag(b) Wt as diag(a)·(b @ K), one (n, S) @ (S, S^2) GEMM": (
            jax.jit(lambda a, b, w: diagonal_products(a, b, w)), (A[:, 0], Bm[:, 0], A[0])),
        f"large GEMM {large}^3": (jax.jit(jnp.matmul), (X, X)),
    }
    t = time_interleaved({k: (lambda f=f, a=a: f(*a)) for k, (f, a) in forms.items()}, repeats=repeats)
    flops = {k: (2 * large ** 3 if k.startswith("large") else 2 * n * S ** 3) for k in forms}
    return {k: flops[k] / t[k]["min"] / 1e9 for k in forms}


def product_rate(T: int, B: int, S: int = 20, *, structured: bool = False, repeats: int = 7,
                 dtype=jnp.float32) -> dict:
    """GFLOP/s of the Blelloch scan's up-sweep matrix products alone, as the scan runs them: the
    bottom levels of :func:`bppsa.scan.dense.blelloch_scan_stored` (fused multiply-adds on contiguous
    halves) on random elements in storage order, without offsets, vector products or the top.
    ``structured``: as :func:`bppsa.scan.dense.blelloch_scan_stored_diag` runs them for elements
    diag(a) Wᵀ (the RNN), level 0 from the vectors (one GEMM and a row scaling), the rest as above;
    the flops counted are the same 2·S³ per product. Returns {"gflops", "flops", "min_s", "levels"}."""
    k, m, N = bottom_layout(T)
    k1, k2 = jax.random.split(jax.random.key(0))
    if structured:
        X = jax.random.uniform(k1, (N, B, S), dtype)
        Wt = jax.random.normal(k2, (S, S), dtype) / S ** 0.5
    else:
        X = jax.random.normal(k1, (N, B, S, S), dtype) / S
        Wt = None

    @jax.jit
    def products(X, Wt):
        for level in range(k):
            h = X.shape[0] // 2
            if level == 0 and structured:
                X = diagonal_products(X[:h], X[h:], Wt)
            else:
                X = batched_matmul(X[:h], X[h:])
        return X

    t = time_interleaved({"products": lambda: products(X, Wt)}, repeats=repeats)["products"]["min"]
    flops = sum(2 * (N >> (level + 1)) * B * S ** 3 for level in range(k))
    return {"gflops": flops / t / 1e9 if flops else 0.0, "flops": flops, "min_s": t, "levels": k}


# --------------------------------------------------------------------------------------------
# Float32 gradient error of BPPSA vs BPTT and of both vs a float64 reference.
# --------------------------------------------------------------------------------------------

def gradient_errors(T: int, B: int, hidden_size: int = 20, seed: int = 0) -> dict:
    """Max relative parameter-gradient errors of the RNN(1, H) on bitstreams xs (T, B, 1), of the
    one timed loss (:func:`experiments.gradient.gradient_errors`): BPPSA vs tuned BPTT in float32, and
    each in float32 vs float64 autodiff through ``lax.scan`` (needs ``jax_enable_x64``)."""
    e = gradient.gradient_errors(cells.RNN(1, hidden_size), T, B,
                                 {"bppsa": ("bppsa_blelloch", {}), "bptt": ("bptt", {})},
                                 pairs=[("bppsa", "bptt")], seed=seed)
    return {"T": T, "B": B, "H": hidden_size, "bppsa_vs_bptt_f32": e["bppsa vs bptt"],
            "bppsa_f32_vs_f64": e["bppsa"], "bptt_f32_vs_f64": e["bptt"]}


def check_accuracy_task(config) -> None:
    """The ranges of :func:`accuracy_task`'s config (UsageError naming the key)."""
    require_ints(config, "lengths", allow_empty=False)
    require_int(config, "batch_size")
    require_int(config, "hidden_size")
    require_int(config, "seed", 0)


@checked_by(check_accuracy_task)
def accuracy_task(config, workdir) -> dict:
    """Task of ``experiments/paper_bppsa/configs/core_accuracy.py``: :func:`gradient_errors` per T, saved as
    ``<name>.{json,md}`` in ``workdir``."""
    previous = jax.config.jax_enable_x64  # pyright: ignore[reportAttributeAccessIssue] -- JAX sets options dynamically
    jax.config.update("jax_enable_x64", True)
    try:
        rows = []
        for T in config.lengths:
            rows.append(gradient_errors(T, config.batch_size, config.hidden_size, config.seed))
            print(rows[-1], flush=True)
    finally:
        jax.config.update("jax_enable_x64", previous)
    md = markdown_table(["T", "B", "H", "max rel. error BPPSA vs BPTT (f32)", "BPPSA f32 vs f64", "BPTT f32 vs f64"],
                        [[r["T"], r["B"], r["H"], f"{r['bppsa_vs_bptt_f32']:.2e}", f"{r['bppsa_f32_vs_f64']:.2e}",
                          f"{r['bptt_f32_vs_f64']:.2e}"] for r in rows], align="rrrrrr")
    save_json(entry(workdir, f"{config.name}.json"), {"rows": rows, "provenance": provenance()})
    entry(workdir, f"{config.name}.md").write_text("Float32 gradient error (max abs difference / max abs gradient), "
                                                   "vanilla RNN, hidden 20, bitstream inputs; the one timed loss "
                                                   "(`experiments.gradient.loss`, a fixed random readout of every "
                                                   "step), "
                                                   "reference: float64 autodiff through `lax.scan`.\n\n" + md + "\n")
    return {"rows": rows}
