"""Experiments for sparse BPPSA over feed-forward chains (the paper's §5.3, pruned VGG-11).

Three parts, each writing JSON (with provenance) and a markdown table into a work directory:

- ``generation_benchmark``: analytic sparse transposed Jacobians vs ``jax.jacrev`` (dense) for
  VGG-11's conv, ReLU and max-pool layers on 32×32 inputs (one sample), median times and
  speedups (the paper's Table 1, last column). Shapes whose dense Jacobian exceeds
  ``max_dense_entries`` are not run through jacrev (reported as not measured).
- ``flop_experiment``: FLOPs of the backward pass of magnitude-pruned VGG-11 (32×32, one
  sample) for BP and BPPSA with sparse products — total work and critical path — against the
  pruning level and against L_m (the paper's Fig. 10 analysis), plus a plot.
- ``digits_retraining``: a small VGG-style network on scikit-learn's bundled 8×8 digits
  (upsampled to 16×16; no downloads): train dense with autodiff, prune by magnitude, retrain
  with the BPPSA backward pass (gradients checked against autodiff along the way), compare
  test accuracy with the unpruned network.

``run(config, workdir)`` is the task of ``experiments/paper_bppsa/configs/sparse_vgg.py``
(``bppsa reproduce sparse-vgg``).
"""

from __future__ import annotations

import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax import lax

from bppsa import sparse
from bppsa.host import time_fn
from bppsa.sparse import vgg
from bppsa.tasks.digits import load_digits
from experiments import entry
from experiments.provenance import provenance, save_json
from experiments.tables import markdown_table

__all__ = ["vgg11_layer_shapes", "generation_benchmark", "flop_experiment", "digits_retraining",
           "run"]


def _median_time(fn, repeats, slow_s=10.0):
    """Median seconds of ``fn()`` by :func:`bppsa.host.time_fn` after one compile call; when that
    call alone took more than ``slow_s`` seconds, one round (the jacrev of the largest layers)."""
    t = time.perf_counter()
    jax.block_until_ready(fn())  # compile
    slow = time.perf_counter() - t > slow_s
    return time_fn(fn, repeats=1 if slow else repeats, warmup=0)["median"]


def vgg11_layer_shapes(in_hw=32):
    """(kind, input shape (C, H, W), C_out or None) of VGG-11's conv, ReLU and max-pool layers."""
    C, H = 3, in_hw
    out = []
    for item in vgg.VGG11:
        if item == "M":
            out.append(("maxpool", (C, H, H), None))
            H //= 2
        else:
            out.append(("conv", (C, H, H), item))
            out.append(("relu", (item, H, H), None))
            C = item
    return out


def generation_benchmark(*, in_hw=32, repeats=3, max_dense_entries=2 ** 26, kinds=("conv", "relu", "maxpool"),
                         seed=0, log=print):
    """Analytic vs jax.jacrev generation time per distinct VGG-11 layer shape; a list of rows."""
    rows, seen = [], set()
    key = jax.random.key(seed)
    for kind, shape, c_out in vgg11_layer_shapes(in_hw):
        if kind not in kinds or (kind, shape, c_out) in seen:
            continue
        seen.add((kind, shape, c_out))
        key, kx, kw = jax.random.split(key, 3)
        x = jax.random.normal(kx, shape, jnp.float32)
        if kind == "conv":
            w = jax.random.normal(kw, (c_out, shape[0], 3, 3), jnp.float32)
            f = lambda x, w=w: lax.conv_general_dilated(x[None], w, (1, 1), [(1, 1)] * 2,
                                                         dimension_numbers=("NCHW", "OIHW", "NCHW"))[0]
            gen = jax.jit(lambda w: sparse.conv2d_transposed_jacobian(w, shape, 1, 1))
            analytic = lambda gen=gen, w=w: gen(w)
            out_size = c_out * shape[1] * shape[2]
        elif kind == "relu":
            f = jax.nn.relu
            gen = jax.jit(sparse.relu_transposed_jacobian)
            analytic = lambda gen=gen, x=x: gen(x)
            out_size = x.size
        else:
            f = lambda x: lax.reduce_window(x, -jnp.inf, lax.max, (1, 2, 2), (1, 2, 2), "VALID")
            gen = jax.jit(lambda x: sparse.maxpool2d_transposed_jacobian(x, 2))
            analytic = lambda gen=gen, x=x: gen(x)
            out_size = x.size // 4
        t_an = _median_time(analytic, max(repeats, 5))
        J = analytic()
        dense_entries = int(x.size) * int(out_size)
        row = {"layer": kind, "input": list(shape), "output_size": out_size, "nse": int(J.nse),
               "density": J.nse / dense_entries, "analytic_s": t_an, "jacrev_s": None, "speedup": None}
        if dense_entries <= max_dense_entries:
            jac = jax.jit(jax.jacrev(f))
            row["jacrev_s"] = _median_time(lambda: jac(x), repeats)
            row["speedup"] = row["jacrev_s"] / t_an
            # the two agree (float32): a cheap guard that the timed code computes the same thing
            err = float(jnp.max(jnp.abs(J.todense() - jac(x).reshape(out_size, x.size).T)))
            row["max_abs_diff"] = err
        else:
            row["skipped"] = (f"dense Jacobian has {dense_entries:.3g} entries > "
                              f"max_dense_entries {max_dense_entries:.3g}")
        log(f"{kind:8s} {str(tuple(shape)):>15s} nse {row['nse']:>11,d}  analytic {1e3 * t_an:9.3f} ms  "
            + (f"jacrev {1e3 * row['jacrev_s']:10.1f} ms  speedup {row['speedup']:10.1f}x"
               if row["jacrev_s"] is not None else "jacrev not measured (" + row["skipped"] + ")"))
        rows.append(row)
    return rows


def _generation_md(rows):
    body = [[r["layer"], tuple(r["input"]), f"{r['nse']:,}", f"{r['density']:.2e}", f"{1e3 * r['analytic_s']:.3f}",
             f"{1e3 * r['jacrev_s']:.1f}" if r["jacrev_s"] is not None else "not measured",
             f"{r['speedup']:.0f}×" if r["speedup"] is not None else "—"] for r in rows]
    return markdown_table(["layer", "input (C, H, W)", "nnz of Jᵀ", "density", "analytic (ms)", "jax.jacrev (ms)",
                           "speedup"], body, align="llrrrrr") + "\n"


# --------------------------------------------------------------------------------------------
# FLOP analysis of pruned VGG-11.
# --------------------------------------------------------------------------------------------

def _vgg11_jacobians(width, sparsity, in_hw, seed):
    """Sparse transposed Jacobians of magnitude-pruned VGG-11 (channels × width) at one random input."""
    cfg = tuple(item if item == "M" else max(1, int(round(item * width))) for item in vgg.VGG11)
    layers, params = vgg.make_vgg(jax.random.key(seed), cfg, (3, in_hw, in_hw), num_classes=10)
    x = jax.random.normal(jax.random.key(seed + 1), (1, 3, in_hw, in_hw), jnp.float32)
    pruned, _ = vgg.magnitude_prune(params, sparsity)
    return layers, vgg.transposed_jacobians(layers, pruned, vgg.forward(layers, pruned, x))


def _flop_record(Js, width, sparsity, levels):
    r = vgg.flop_analysis(Js, levels)
    return {"width": width, "sparsity": sparsity, "L_m": r["levels"], "bp_flops": r["bp_flops"],
            "bppsa_flops": r["bppsa_flops"], "bppsa_critical": r["bppsa_critical"],
            "work_ratio": r["bppsa_flops"] / r["bp_flops"],
            "critical_path_ratio": r["bp_critical"] / r["bppsa_critical"],
            "jacobian_nnz": r["jacobian_nnz"], "records": r["records"]}


def flop_experiment(*, sparsities=(0.9, 0.95), width=1.0, widths=(0.25, 0.5), width_sweep_sparsity=0.9,
                    level_sweep_sparsity=0.9, in_hw=32, seed=0, on_update=None, log=print):
    """FLOPs of BP vs BPPSA with sparse products for pruned VGG-11 (one sample, random input).

    Three sweeps: the full scan against the pruning level (at ``width``), against the problem
    size (channel multiplier ``widths`` at ``width_sweep_sparsity``), and against L_m (at
    ``width`` and ``level_sweep_sparsity``; None skips it). ``on_update(result)`` is called
    after every record, so a long run can save what it has.
    """
    def log_rec(tag, r, t):
        log(f"{tag}: BP {r['bp_flops']:.3e} FLOPs; BPPSA (L_m = {r['L_m']}) total {r['bppsa_flops']:.3e} "
            f"({r['work_ratio']:.1f}× BP), critical path {r['bppsa_critical']:.3e} "
            f"(BP/BPPSA {r['critical_path_ratio']:.3f}×)  [{time.perf_counter() - t:.1f} s]")

    layers = None
    by_sparsity, by_width, by_levels = [], [], []

    def result():
        return {"in_hw": in_hw, "width": width, "layers": [l.kind for l in layers] if layers else [],
                "by_sparsity": by_sparsity, "by_width": sorted(by_width, key=lambda r: r["width"]),
                "by_levels": by_levels}

    def update():
        if on_update is not None:
            on_update(result())

    for s in sparsities:
        t = time.perf_counter()
        layers, Js = _vgg11_jacobians(width, s, in_hw, seed)
        by_sparsity.append(_flop_record(Js, width, s, None))
        log_rec(f"width {width:g}, sparsity {s:.2f}", by_sparsity[-1], t)
        update()
        if s == level_sweep_sparsity:
            for L in range(sparse.scan_depth(len(Js)) + 1):
                t = time.perf_counter()
                by_levels.append(_flop_record(Js, width, s, L))
                log_rec(f"  L_m = {L}", by_levels[-1], t)
                update()
        del Js
    for w in widths:
        t = time.perf_counter()
        done = [r for r in by_sparsity if w == width and r["sparsity"] == width_sweep_sparsity]
        if done:
            by_width.append(done[0])
            continue
        layers, Js = _vgg11_jacobians(w, width_sweep_sparsity, in_hw, seed)
        by_width.append(_flop_record(Js, w, width_sweep_sparsity, None))
        log_rec(f"width {w:g}, sparsity {width_sweep_sparsity:.2f}", by_width[-1], t)
        update()
        del Js
    return result()


def _flops_md(res):
    header = ["width", "sparsity", "L_m", "BP FLOPs (= its critical path)", "BPPSA FLOPs", "BPPSA / BP work",
              "BPPSA critical path", "BP / BPPSA critical path"]
    out = []
    for title, rs in (("Full BPPSA scan against the pruning level", res["by_sparsity"]),
                      ("Full BPPSA scan against the problem size (channel width of VGG-11)", res["by_width"]),
                      ("Hybrid knob L_m (0 = plain BP)", res["by_levels"])):
        if rs:
            body = [[f"{r['width']:g}", f"{r['sparsity']:.2f}", r["L_m"], f"{r['bp_flops']:.3e}",
                     f"{r['bppsa_flops']:.3e}", f"{r['work_ratio']:.2f}×", f"{r['bppsa_critical']:.3e}",
                     f"{r['critical_path_ratio']:.3f}×"]
                    for r in rs]
            out += [f"{title}:", "", markdown_table(header, body, align="r" * len(header)), ""]
    return "\n".join(out)


def _flops_plot(res, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    panels = [(k, x, lab) for k, x, lab in (("by_sparsity", "sparsity", "pruning sparsity"),
                                             ("by_width", "width", "channel width of VGG-11 (problem size)"),
                                             ("by_levels", "L_m", "L_m (tree levels; 0 = plain BP)")) if res[k]]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.6 * len(panels), 3.8), squeeze=False)
    for ax, (k, xkey, xlabel) in zip(axes[0], panels):
        rs = res[k]
        xs = [r[xkey] for r in rs]
        ax.plot(xs, [r["bp_flops"] for r in rs], "o-", label="BP (total = critical path)")
        ax.plot(xs, [r["bppsa_flops"] for r in rs], "s--", label="BPPSA total")
        ax.plot(xs, [r["bppsa_critical"] for r in rs], "^-", label="BPPSA critical path")
        ax.set_yscale("log")
        if k == "by_width":
            ax.set_xscale("log", base=2)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("backward-pass FLOPs")
        fixed = {"by_sparsity": f"width {rs[0]['width']:g}", "by_width": f"sparsity {rs[0]['sparsity']:.2f}",
                 "by_levels": f"width {rs[0]['width']:g}, sparsity {rs[0]['sparsity']:.2f}"}[k]
        ax.set_title(f"pruned VGG-11 {res['in_hw']}×{res['in_hw']}, {fixed}", fontsize=9)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# --------------------------------------------------------------------------------------------
# Retraining a pruned small VGG on scikit-learn's digits.
# --------------------------------------------------------------------------------------------

def _accuracy(layers, params, x, y):
    logits = jax.jit(lambda p, x: vgg.forward(layers, p, x)[-1])(params, jnp.asarray(x))
    return float(jnp.mean(jnp.argmax(logits, -1) == jnp.asarray(y)))


def digits_retraining(*, cfg=(8, "M", 16, "M"), hidden=(32,), sparsity=0.8, dense_steps=400, retrain_steps=200,
                      batch_size=32, learning_rate=3e-3, levels=None, check_every=20, margin=0.02, seed=0,
                      log=print):
    """Train dense (autodiff), prune, retrain with BPPSA; returns a JSON-able record."""
    xtr, ytr, xte, yte = load_digits(size=16, seed=seed)
    xtr, xte = xtr[:, None], xte[:, None]  # (N, 1, 16, 16): one input channel
    layers, params = vgg.make_vgg(jax.random.key(seed), cfg, xtr.shape[1:], hidden=hidden, num_classes=10)
    opt = optax.adam(learning_rate)
    rng = np.random.default_rng(seed)

    def batch():
        i = rng.choice(len(ytr), batch_size, replace=False)
        return jnp.asarray(xtr[i]), jnp.asarray(ytr[i])

    ad_grad = jax.jit(jax.value_and_grad(lambda p, x, y: vgg.loss(layers, p, x, y)))

    @jax.jit
    def update(p, state, g, masks):
        u, state = opt.update(g, state, p)
        p = optax.apply_updates(p, u)
        return (p if masks is None else vgg.apply_masks(p, masks)), state

    log(f"digits: {len(ytr)} train / {len(yte)} test, input {xtr.shape[1:]}, layers "
        f"{[l.kind for l in layers]}")
    state = opt.init(params)
    t0 = time.perf_counter()
    for _ in range(dense_steps):
        _, g = ad_grad(params, *batch())
        params, state = update(params, state, g, None)
    dense_time = time.perf_counter() - t0
    acc_dense = _accuracy(layers, params, xte, yte)
    log(f"dense (autodiff, {dense_steps} Adam steps): test accuracy {acc_dense:.4f}")

    pruned, masks = vgg.magnitude_prune(params, sparsity)
    acc_pruned = _accuracy(layers, pruned, xte, yte)
    log(f"magnitude-pruned to sparsity {sparsity}: test accuracy {acc_pruned:.4f} before retraining")

    params, state = pruned, opt.init(pruned)
    checks, curve, t_bppsa = [], [], 0.0
    for step in range(1, retrain_steps + 1):
        x, y = batch()
        t = time.perf_counter()
        value, g, _ = vgg.bppsa_value_and_grad(layers, params, x, y, levels)
        jax.block_until_ready(g)
        t_bppsa += time.perf_counter() - t
        if step == 1 or step % check_every == 0 or step == retrain_steps:
            ref_value, ref = ad_grad(params, x, y)
            scale = max(float(jnp.max(jnp.abs(a))) for a in jax.tree.leaves(ref))
            err = max(float(jnp.max(jnp.abs(a - b))) for a, b in zip(jax.tree.leaves(g), jax.tree.leaves(ref)))
            checks.append({"step": step, "max_abs_diff": err, "max_abs_grad": scale,
                           "loss_diff": abs(float(value) - float(ref_value))})
            curve.append({"step": step, "loss": float(value)})
        params, state = update(params, state, vgg.apply_masks(g, masks), masks)
    acc_retrained = _accuracy(layers, params, xte, yte)
    kept = sum(int(m["w"].sum()) for m in masks if m)
    total = sum(int(m["w"].size) for m in masks if m)
    worst = max(c["max_abs_diff"] / c["max_abs_grad"] for c in checks)
    log(f"retrained with BPPSA (L_m = {levels}, {retrain_steps} steps, {t_bppsa / retrain_steps * 1e3:.0f} ms "
        f"per backward): test accuracy {acc_retrained:.4f}; unpruned {acc_dense:.4f}; "
        f"max relative gradient difference to autodiff {worst:.2e}")
    return {"config": {"cfg": list(map(str, cfg)), "hidden": list(hidden), "sparsity": sparsity,
                       "dense_steps": dense_steps, "retrain_steps": retrain_steps, "batch_size": batch_size,
                       "learning_rate": learning_rate, "levels": levels, "margin": margin, "seed": seed},
            "weights_kept": kept, "weights_total": total, "accuracy_dense": acc_dense,
            "accuracy_pruned": acc_pruned, "accuracy_retrained": acc_retrained,
            "within_margin": acc_retrained >= acc_dense - margin,
            "gradient_checks": checks, "max_relative_grad_diff": worst, "loss_curve": curve,
            "bppsa_backward_s_per_step": t_bppsa / retrain_steps, "dense_training_s": dense_time}


def _retrain_md(r):
    c = r["config"]
    body = [["network", f"conv/ReLU/pool {' '.join(c['cfg'])}, hidden {c['hidden']}, 16×16 digits"],
            ["weights kept after magnitude pruning",
             f"{r['weights_kept']:,} / {r['weights_total']:,} (sparsity {c['sparsity']})"],
            [f"test accuracy, unpruned (autodiff, {c['dense_steps']} steps)", f"{r['accuracy_dense']:.4f}"],
            ["test accuracy, pruned, before retraining", f"{r['accuracy_pruned']:.4f}"],
            [f"test accuracy, pruned, retrained with BPPSA ({c['retrain_steps']} steps, L_m = {c['levels']})",
             f"{r['accuracy_retrained']:.4f}"],
            [f"within {c['margin']:.2f} of unpruned", r["within_margin"]],
            [f"max relative BPPSA − autodiff gradient difference over {len(r['gradient_checks'])} checks",
             f"{r['max_relative_grad_diff']:.2e}"],
            ["BPPSA backward per step (eager sparse, CPU)", f"{1e3 * r['bppsa_backward_s_per_step']:.0f} ms"]]
    return markdown_table(["quantity", "value"], body, align="lr") + "\n"


# --------------------------------------------------------------------------------------------
# Entry points.
# --------------------------------------------------------------------------------------------

def run(config, workdir) -> dict:
    """Task of ``experiments/paper_bppsa/configs/sparse_vgg.py``: the parts named in ``config.parts``, one
    result ``<name>``.json (each part's full record under its name), ``.md`` (each part's table) and
    ``.png`` (the FLOPs plot). The record is rewritten after each part (and after each FLOPs row), so an
    interrupted run leaves what it measured. Returns a summary of each part."""
    Path(workdir).mkdir(parents=True, exist_ok=True)  # a folder of yours when called directly
    parts = tuple(config.parts)
    record: dict = {"title": "sparse BPPSA over pruned VGG: Jacobian generation, backward-pass FLOPs, "
                             "retraining on digits", "config": config.to_dict(), "parts": list(parts)}
    summary: dict = {}

    def save():
        save_json(entry(workdir, f"{config.name}.json"), {**record, "summary": summary, "provenance": provenance()})
        entry(workdir, f"{config.name}.md").write_text(_combined_md(record))

    if "generation" in parts:
        g = config.generation
        rows = generation_benchmark(in_hw=g.in_hw, repeats=g.repeats, max_dense_entries=g.max_dense_entries,
                                    kinds=tuple(g.kinds))
        record["generation"] = {"title": f"analytic sparse transposed Jacobians vs jax.jacrev, VGG-11 layers at "
                                         f"{g.in_hw}×{g.in_hw} (one sample; median of {g.repeats} rounds by "
                                         "bppsa.host, 1 round when the compile call took > 10 s)",
                                "rows": rows}
        summary["generation_speedups"] = {f"{r['layer']} {tuple(r['input'])}": r["speedup"] for r in rows}
        save()
    if "flops" in parts:
        f = config.flops

        def update(res):
            record["flops"] = {"title": "backward-pass FLOPs of pruned VGG-11, BP vs BPPSA with sparse products "
                                        "(critical path = sum over tree levels of the largest product)", **res}
            save()

        res = flop_experiment(sparsities=tuple(f.sparsities), width=f.width, widths=tuple(f.widths),
                              width_sweep_sparsity=f.width_sweep_sparsity, in_hw=f.in_hw,
                              level_sweep_sparsity=f.level_sweep_sparsity, on_update=update)
        summary["flops"] = [{k: r[k] for k in ("width", "sparsity", "L_m", "work_ratio", "critical_path_ratio")}
                            for r in res["by_sparsity"] + res["by_width"] + res["by_levels"]]
        update(res)
        _flops_plot(res, entry(workdir, f"{config.name}.png"))
    if "retrain" in parts:
        t = config.retrain
        res = digits_retraining(cfg=tuple(t.cfg), hidden=tuple(t.hidden), sparsity=t.sparsity,
                                dense_steps=t.dense_steps, retrain_steps=t.retrain_steps,
                                batch_size=t.batch_size, learning_rate=t.learning_rate,
                                levels=None if t.levels < 0 else t.levels,
                                check_every=t.check_every, margin=t.margin)
        record["retrain"] = {"title": "pruned small VGG on digits, retrained with the BPPSA backward pass", **res}
        summary["retrain"] = {k: res[k] for k in ("accuracy_dense", "accuracy_pruned", "accuracy_retrained",
                                                  "within_margin", "max_relative_grad_diff")}
        save()
    save()
    return summary


def _combined_md(record) -> str:
    """The result's markdown: one section per part that ran, each with its table."""
    out = [f"# {record['title']}", ""]
    if "generation" in record:
        out += [f"## Jacobian generation — {record['generation']['title']}", "",
                _generation_md(record["generation"]["rows"])]
    if "flops" in record:
        res = record["flops"]
        out += [f"## FLOPs — {res['title']}, {res['in_hw']}×{res['in_hw']}, one sample", "", _flops_md(res)]
    if "retrain" in record:
        out += [f"## Retraining — {record['retrain']['title']}", "", _retrain_md(record["retrain"])]
    return "\n".join(out)
