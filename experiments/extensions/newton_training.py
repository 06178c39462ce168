"""The parallel forward through real training: the IRMAS GRU and a diagonal BlockGRU trained on the
synthetic IRMAS stand-in (:mod:`experiments.data.synth_irmas`, as :mod:`experiments.paper_bppsa.irmas`
prepares it) with each forward of ``config.forwards`` ("sequential", "newton", "auto"; the task of
experiments/extensions/configs/newton_training.py).

Every run starts from the same initialisation and sees the same batches (Adam, a linear head on the
last state, cross-entropy). Per step it records the loss, the batch accuracy, the step's seconds and,
for a parallel forward, :class:`bppsa.forward.newton.NewtonInfo`: the iterations, whether they converged,
the largest Lyapunov exponent along the batch's states and the iterations it predicts. The summary
compares each run's losses with the sequential forward's (the parallel forward's states differ by
rounding, so the runs drift apart only as rounding does). Writes ``<name>``.json, ``.md`` and
``<name>``.png (iterations, exponent and loss against the step).
"""

from __future__ import annotations

import time
import warnings
from os import PathLike

import jax
import jax.numpy as jnp
import numpy as np
import optax

from bppsa import backprop, cells
from bppsa.errors import checked_by, require_choices, require_int, require_number
from bppsa.forward import newton
from experiments import entry
from experiments.provenance import provenance, save_json
from experiments.tables import markdown_table

__all__ = ["MODELS", "train", "summaries", "run"]

MODELS = {"GRU": lambda F, H: cells.GRU(F, H), "BlockGRU k=1": lambda F, H: cells.BlockGRU(F, H, 1)}


def _batches(N: int, B: int, steps: int, seed: int) -> np.ndarray:
    """(steps, B) example indices, the same for every run."""
    rng = np.random.default_rng(seed)
    return np.stack([rng.choice(N, B, replace=False) for _ in range(steps)])


def train(cell, x: np.ndarray, y: np.ndarray, forward: str, config, log=print) -> dict:
    """``config.steps`` Adam steps of cell + linear head with ``forward``; the per-step records."""
    H, C = cell.hidden_size, int(y.max()) + 1
    kc, kh = jax.random.split(jax.random.key(config.seed))
    params = {"cell": cell.init(kc), "W": jax.random.normal(kh, (H, C)) / np.sqrt(H), "b": jnp.zeros((C,))}
    opt = optax.adam(config.learning_rate)
    state = opt.init(params)
    parallel = forward != "sequential"

    def loss_fn(p, xb, yb):
        xs = jnp.swapaxes(xb, 0, 1)  # (T, B, F)
        out = backprop.rnn(cell, p["cell"], xs, jnp.zeros((xb.shape[0], H)), forward=forward, return_info=parallel)
        hs, info = out if parallel else (out, None)
        logits = hs[-1] @ p["W"] + p["b"]
        loss = optax.softmax_cross_entropy_with_integer_labels(logits, yb).mean()
        return loss, (jnp.mean(jnp.argmax(logits, -1) == yb), info)

    @jax.jit
    def step(p, s, xb, yb):
        (loss, (acc, info)), g = jax.value_and_grad(loss_fn, has_aux=True)(p, xb, yb)
        u, s = opt.update(g, s, p)
        return optax.apply_updates(p, u), s, loss, acc, info

    records = []
    for k, idx in enumerate(_batches(len(x), config.batch, config.steps, config.seed)):
        t0 = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", newton.NewtonFallbackWarning)
            params, state, loss, acc, info = jax.block_until_ready(step(params, state, x[idx], y[idx]))
        r = {"step": k, "loss": float(loss), "accuracy": float(acc), "step_s": time.perf_counter() - t0}
        if info is not None:
            r.update(iterations=int(info.iterations), converged=bool(info.converged), fell_back=bool(info.fell_back),
                     lle=float(info.lle), predicted=int(info.predicted))
        records.append(r)
        if k % max(1, config.steps // 10) == 0 or k == config.steps - 1:
            log(f"    step {k:>4} loss {r['loss']:.4f} acc {r['accuracy']:.2f}"
                + (f" it {r['iterations']} lle {r['lle']:+.3f}" if info is not None else "") + f" {r['step_s']:.3f} s")
    return {"records": records}


def _summary(run: dict, base: dict | None) -> dict:
    rs = run["records"]
    last = rs[-max(1, len(rs) // 10):]
    out = {"final_loss": float(np.mean([r["loss"] for r in last])),
           "final_accuracy": float(np.mean([r["accuracy"] for r in last])),
           "median_step_s": float(np.median([r["step_s"] for r in rs[1:]] or [rs[0]["step_s"]]))}
    if "iterations" in rs[0]:
        its = [r["iterations"] for r in rs]
        out.update(iterations_median=float(np.median(its)), iterations_max=int(max(its)),
                   iterations_first=its[0], iterations_last=its[-1], fell_back=sum(r["fell_back"] for r in rs),
                   lle_first=rs[0]["lle"], lle_last=rs[-1]["lle"], lle_max=max(r["lle"] for r in rs),
                   predicted_median=float(np.median([r["predicted"] for r in rs])))
    if base is not None:
        out["max_abs_loss_diff_vs_sequential"] = max(abs(a["loss"] - b["loss"])
                                                     for a, b in zip(rs, base["records"]))
    return out


def summaries(runs: dict) -> dict:
    """``{forward: run}`` -> the same with each run's ``"summary"``, once every forward has run: the loss
    difference from the sequential forward's only where that forward ran (in any order)."""
    return {fwd: {**run, "summary": _summary(run, runs.get("sequential"))} for fwd, run in runs.items()}


def _plot(record, path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    models = list(record["runs"])
    fig, axes = plt.subplots(3, len(models), figsize=(5.5 * len(models), 8.5), squeeze=False, sharex=True)
    for j, model in enumerate(models):
        for fwd, run in record["runs"][model].items():
            rs = run["records"]
            steps = [r["step"] for r in rs]
            axes[2][j].plot(steps, [r["loss"] for r in rs], label=fwd, lw=0.8)
            if "iterations" in rs[0]:
                axes[0][j].plot(steps, [r["iterations"] for r in rs], label=f"{fwd} measured", lw=0.8)
                axes[0][j].plot(steps, [r["predicted"] for r in rs], "--", label=f"{fwd} predicted", lw=0.8)
                axes[1][j].plot(steps, [r["lle"] for r in rs], label=fwd, lw=0.8)
        axes[0][j].set(title=model, ylabel="Newton iterations")
        axes[1][j].set(ylabel="largest Lyapunov exponent")
        axes[1][j].axhline(0, color="k", lw=0.5)
        axes[2][j].set(ylabel="training loss", xlabel="training step")
        for ax in axes[:, j]:
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def markdown(record) -> str:
    p, c = record["provenance"], record["config"]
    rows = []
    for model, runs in record["runs"].items():
        for fwd, run in runs.items():
            s = run["summary"]
            rows.append([model, fwd, f"{s['final_loss']:.4f}", f"{s['final_accuracy']:.3f}",
                         f"{s['max_abs_loss_diff_vs_sequential']:.1e}" if "max_abs_loss_diff_vs_sequential" in s
                         else "—", f"{1e3 * s['median_step_s']:.1f}",
                         *((f"{s['iterations_first']} → {s['iterations_last']} (median {s['iterations_median']:.0f}, "
                            f"max {s['iterations_max']})", f"{s['lle_first']:+.3f} → {s['lle_last']:+.3f}",
                            f"{s['predicted_median']:.0f}", s["fell_back"]) if "iterations_first" in s
                           else ("—", "—", "—", "—"))])
    d = record["data"]
    return "\n".join([
        f"# {record['title']}", "",
        f"`{p['command']}` — {p['date']}, {p['backend']} / {p['cpu']} ({p['cpu_count']} cores), jax {p['jax']}, "
        f"commit {str(p.get('git_commit'))[:10]}; float32. Whole run {record['wall_s'] / 60:.1f} min.", "",
        f"Data: the {d['kind']} IRMAS stand-in, setting {d['setting']}, {d['clips']} clips of T = {d['T']} frames × "
        f"F = {d['F']} MFCCs; hidden size {c['hidden']}, {c['steps']} Adam steps at lr {c['learning_rate']}, batch "
        f"{c['batch']}, the same initialisation and batches for every forward. Final loss/accuracy: the mean of the "
        "last tenth of the steps (batch accuracy). Iterations and exponent: first → last step.", "",
        markdown_table(["model", "forward", "final loss", "final accuracy", "max |loss − sequential's|",
                        "median step ms", "Newton iterations", "Lyapunov exponent", "predicted (median)",
                        "steps fallen back"], rows, align="llrrrrllrr"), "",
        f"![iterations, exponent and loss against the step]({record['name']}.png)", ""])


def check(config) -> None:
    require_choices(config, "forwards", ("sequential", "newton", "quasi", "auto"), many=True)
    require_choices(config, "models", tuple(MODELS), many=True)
    for key in ("steps", "batch", "hidden", "clips_per_class"):
        require_int(config, key)
    require_number(config, "learning_rate")


@checked_by(check)
def run(config, workdir: PathLike) -> dict:
    """Task of ``experiments/extensions/configs/newton_training.py``."""
    from experiments.data import irmas as irmas_data
    from experiments.paper_bppsa.irmas import prepare_data

    check(config)
    t0 = time.perf_counter()
    root, _, kind = prepare_data(None, clips_per_class=config.clips_per_class, test_clips=0, seed=config.seed,
                                 synth_dir=config.synth_dir or entry(workdir, "synth-irmas"), log=print)
    feats = irmas_data.load_features(root, config.setting, config.cache_dir or entry(workdir, "cache"), progress=False)
    x, y = np.asarray(feats.x, np.float32), np.asarray(feats.y)
    record: dict = {"title": "The parallel forward through training: Newton iterations, the Lyapunov exponent and "
                             "the loss per step", "name": config.name, "config": config.to_dict(),
                    "data": {"kind": kind, "setting": config.setting, "clips": int(len(x)), "T": int(x.shape[1]),
                             "F": int(x.shape[2])}, "runs": {}}
    for model in config.models:
        cell = MODELS[model](x.shape[2], config.hidden)
        runs: dict = {}
        for fwd in config.forwards:
            print(f"== {model}, forward={fwd} ==", flush=True)
            runs[fwd] = train(cell, x, y, fwd, config)
        record["runs"][model] = summaries(runs)
    record["wall_s"] = time.perf_counter() - t0
    record["provenance"] = provenance()
    save_json(entry(workdir, f"{config.name}.json"), record)
    entry(workdir, f"{config.name}.md").write_text(markdown(record))
    _plot(record, entry(workdir, f"{config.name}.png"))
    return {f"{m} {f} {k}": v for m, runs in record["runs"].items() for f, r in runs.items()
            for k, v in r["summary"].items() if k in ("final_loss", "iterations_median", "lle_last")}
