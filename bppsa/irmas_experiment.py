"""``bppsa reproduce irmas``: the paper's GRU on IRMAS (BPPSA, Wang et al., MLSys 2020, §5.2).

1. Timing grid, B ∈ {16, 32, 64} × settings s/m/l, on the dataset's own feature arrays
   (xs (T, B, F) of the first B clips): forward, transposed-Jacobian generation, the BPPSA scan,
   the parameter-gradient contraction, the whole BPPSA backward, the BPTT backward and one
   training step each way, with speedups — a markdown table in the paper's layout, JSON and a
   PNG bar chart.
2. Training: GRU(F, 20) -> linear head (11 classes) trained with BPTT and with BPPSA from the
   same initial parameters on the same batches; both loss/accuracy curves (they coincide up to
   float32 rounding), accuracy on a held-out split and, where a test set is present, the
   multi-label F1 on 3-second windows of the test clips.

Without ``--data-dir`` it runs on the synthetic stand-in (:mod:`bppsa.data.synth_irmas`),
generated on first use under ``data/synth-irmas`` (``--quick``: 20 clips per class) or
``data/synth-irmas-full`` (60 per class); with ``--data-dir`` on the real IRMAS.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from . import cells
from .data import irmas
from .data.synth_irmas import ensure_synthetic_irmas
from .nn import SequenceClassifier
from .provenance import provenance, save_json
from .train import compare_backward_training, evaluate

__all__ = ["timing_grid", "training_comparison", "grid_markdown", "training_markdown", "plot_grid",
           "plot_training", "stratified_split", "prepare_data", "grid_task", "train_task", "main", "QUICK", "FULL"]

NUM_CLASSES = len(irmas.CLASSES)
DEFAULT_CACHE_DIR = "data/cache"

# The two presets of the command (and of experiments/configs/irmas_*.py).
QUICK = dict(synth_dir="data/synth-irmas", clips_per_class=20, test_clips=22, test_seconds=(5.0, 8.0), batches=(16, 32, 64),
             settings=("s", "m", "l"), repeats=3, train_setting="m", steps=200, batch_size=16,
             learning_rate=3e-3, eval_every=25)
FULL = dict(synth_dir="data/synth-irmas-full", clips_per_class=60, test_clips=55, test_seconds=(5.0, 20.0), batches=(16, 32, 64),
            settings=("s", "m", "l"), repeats=7, train_setting="m", steps=1500, batch_size=16,
            learning_rate=3e-4, eval_every=100)


# --------------------------------------------------------------------------------------------
# Timing
# --------------------------------------------------------------------------------------------

def _batch(x: np.ndarray, B: int) -> np.ndarray:
    """The first B clips as time-major xs (T, B, F); fewer clips are cycled to fill B."""
    idx = np.arange(B) % len(x)
    return np.ascontiguousarray(np.swapaxes(x[idx], 0, 1))


def timing_grid(root, *, settings=("s", "m", "l"), batches=(16, 32, 64), repeats=5, hidden_size=20,
                scan="blelloch", cache_dir=None, seed=0, log=print) -> dict:
    """Time the GRU's components on IRMAS feature arrays for every (setting, B); a JSON-able record."""
    from .bench import time_components

    rows = []
    for setting in settings:
        feats = irmas.load_features(root, setting, cache_dir, max_per_class=math.ceil(max(batches) / NUM_CLASSES),
                                    progress=False)
        if len(feats.x) == 0:
            raise ValueError(f"no decodable clips under {root}; cannot time setting {setting!r}")
        T, F = feats.x.shape[1:]
        cell = cells.GRU(F, hidden_size)
        params = cell.init(jax.random.key(seed))
        for B in batches:
            xs = jnp.asarray(_batch(feats.x, B))
            h0 = jnp.zeros((B, hidden_size), xs.dtype)
            t = time_components(cell, params, xs, h0, scan=scan, repeats=repeats, warmup=1, num_classes=NUM_CLASSES)
            row = {"setting": setting, "T": int(T), "F": int(F), "B": int(B), "H": hidden_size,
                   "clips": int(min(B, len(feats.x)))}
            for k, v in t.items():
                if isinstance(v, dict) and "median" in v:
                    row[k] = v
            row["speedup_backward"] = row["bptt_backward"]["median"] / row["bppsa_backward_full"]["median"]
            row["speedup_scan"] = row["bptt_backward"]["median"] / row["bppsa_backward"]["median"]
            row["speedup_step"] = row["step_bptt"]["median"] / row["step_bppsa"]["median"]
            rows.append(row)
            log(f"  {setting}  T={T:5d} F={F:3d} B={B:3d}:  BPTT bwd {1e3 * row['bptt_backward']['median']:8.2f} ms, "
                f"BPPSA bwd {1e3 * row['bppsa_backward_full']['median']:8.2f} ms "
                f"(scan {1e3 * row['bppsa_backward']['median']:.2f}),  backward ×{row['speedup_backward']:.2f}, "
                f"step ×{row['speedup_step']:.2f}")
    return {"title": "IRMAS timing grid: GRU(F, 20), BPTT vs BPPSA backward (paper §5.2)",
            "plot": "bppsa.irmas_experiment:plot_grid",
            "rows": rows, "timer": "bppsa.bench.time_components", "scan": scan, "repeats": repeats, "hidden_size": hidden_size,
            "dtype": "float32", "backend": jax.default_backend()}


def grid_markdown(record: dict) -> str:
    """The timing grid as a markdown table in the paper's layout (ms, medians; speedup = BPTT / BPPSA)."""
    caption = (f"GRU(F, {record['hidden_size']}), float32 on {record['backend']}, times in ms (median of "
               f"{record.get('repeats', '?')} interleaved repeats after compilation, {record.get('timer', '?')}); "
               f"speedup = BPTT / BPPSA (> 1: BPPSA faster); BPPSA backward = the whole BPPSA backward in one jit "
               f"(Jacobian generation + scan + parameter gradients); data: {record.get('data', {}).get('kind', '?')}.")
    lines = [caption, "",
        "| setting | T | F | B | forward | Jacobian gen. | BPPSA scan | param. grads | BPPSA backward | "
        "BPTT backward | backward speedup | step BPPSA | step BPTT | step speedup |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in record["rows"]:
        ms = {k: 1e3 * r[k]["median"] for k in ("forward", "jacobian", "bppsa_backward", "param_grads",
                                                 "bppsa_backward_full", "bptt_backward", "step_bppsa", "step_bptt")}
        lines.append(
            f"| {r['setting']} | {r['T']} | {r['F']} | {r['B']} | {ms['forward']:.2f} | {ms['jacobian']:.2f} | "
            f"{ms['bppsa_backward']:.2f} | {ms['param_grads']:.2f} | {ms['bppsa_backward_full']:.2f} | "
            f"{ms['bptt_backward']:.2f} | **{r['speedup_backward']:.2f}×** | {ms['step_bppsa']:.2f} | "
            f"{ms['step_bptt']:.2f} | **{r['speedup_step']:.2f}×** |")
    return "\n".join(lines) + "\n"


def plot_grid(record: dict, path) -> None:
    """The grid's bar chart (one panel per setting) from its JSON record."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    settings = list(dict.fromkeys(r["setting"] for r in record["rows"]))
    fig, axes = plt.subplots(1, len(settings), figsize=(4.2 * len(settings), 3.6), squeeze=False)
    parts = (("forward", "forward"), ("jacobian", "Jacobian gen."), ("bppsa_backward", "BPPSA scan"),
             ("bppsa_backward_full", "BPPSA backward"), ("bptt_backward", "BPTT backward"))
    for ax, s in zip(axes[0], settings):
        rows = [r for r in record["rows"] if r["setting"] == s]
        x = np.arange(len(rows))
        w = 0.8 / len(parts)
        for i, (k, label) in enumerate(parts):
            ax.bar(x + (i - len(parts) / 2 + 0.5) * w, [1e3 * r[k]["median"] for r in rows], w, label=label)
        for j, r in enumerate(rows):
            ax.annotate(f"×{r['speedup_backward']:.2f}", (j, 1e3 * max(r["bptt_backward"]["median"],
                                                                      r["bppsa_backward_full"]["median"])),
                        ha="center", va="bottom", fontsize=8)
        ax.set_xticks(x, [f"B={r['B']}" for r in rows])
        ax.set_title(f"setting {s}: T={rows[0]['T']}, F={rows[0]['F']}")
        ax.set_ylabel("ms (median)")
    axes[0][0].legend(fontsize=7)
    fig.suptitle(f"GRU(F, {record['hidden_size']}) on IRMAS features, {record['backend']}: "
                 "backward speedup BPTT / BPPSA above the bars", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# --------------------------------------------------------------------------------------------
# Training
# --------------------------------------------------------------------------------------------

def stratified_split(y: np.ndarray, holdout: float, seed: int):
    """(train indices, held-out indices): ``holdout`` of every class held out (at least one if it has two)."""
    if not 0 < holdout < 1:
        raise ValueError(f"holdout must be in (0, 1); got {holdout}")
    rng = np.random.default_rng(seed)
    tr, te = [], []
    for c in np.unique(y):
        idx = rng.permutation(np.flatnonzero(y == c))
        k = int(round(holdout * len(idx))) if len(idx) > 1 else 0
        k = max(k, 1) if len(idx) > 1 else 0
        te.extend(idx[:k])
        tr.extend(idx[k:])
    return np.sort(np.array(tr, int)), np.sort(np.array(te, int))


@nnx.jit
def _probs(model, x):
    return jax.nn.softmax(model(x), axis=-1)


def predict_probs(model, x, batch_size=256) -> np.ndarray:
    """Softmax outputs (N, classes) of ``model`` on x (N, T, F)."""
    return np.concatenate([np.asarray(_probs(model, jnp.asarray(x[i:i + batch_size])))
                           for i in range(0, len(x), batch_size)])


def training_comparison(root, *, setting="m", steps=200, batch_size=16, learning_rate=3e-4, hidden_size=20,
                        holdout=0.2, eval_every=25, seed=0, cache_dir=None, test_root=None, log=print) -> dict:
    """Train the GRU with BPTT and with BPPSA from the same start; a JSON-able record of both runs."""
    feats = irmas.load_features(root, setting, cache_dir)
    tr, te = stratified_split(feats.y, holdout, seed)
    if len(tr) < batch_size or len(te) == 0:
        raise ValueError(f"need at least batch_size = {batch_size} training clips and one held-out clip; "
                         f"got {len(tr)} and {len(te)} from {len(feats.y)} clips")
    F = feats.x.shape[2]
    cell = cells.GRU(F, hidden_size)
    models = {}

    def make_model(backward):
        models[backward] = SequenceClassifier(cell, NUM_CLASSES, backward=backward, rngs=nnx.Rngs(seed))
        return models[backward]

    log(f"training GRU({F}, {hidden_size}) -> {NUM_CLASSES} classes, setting {setting} (T = {feats.x.shape[1]}): "
        f"{len(tr)} train / {len(te)} held-out clips, B = {batch_size}, {steps} Adam steps, lr = {learning_rate}")
    t0 = time.perf_counter()
    curves = compare_backward_training(make_model, feats.x[tr], feats.y[tr], steps=steps, batch_size=batch_size,
                                       learning_rate=learning_rate, seed=seed,
                                       eval_data=(feats.x[te], feats.y[te]), eval_every=eval_every)
    wall = time.perf_counter() - t0
    gaps = [abs(a["loss"] - b["loss"]) for a, b in zip(curves["bptt"], curves["bppsa"])]
    diff = max(gaps)
    diverge = next((curves["bptt"][i]["step"] for i, g in enumerate(gaps) if g > 1e-3), None)
    final = {m: evaluate(models[m], feats.x[te], feats.y[te]) for m in models}
    record = {"title": "IRMAS training: GRU with BPTT vs BPPSA from the same start (paper §5.2)",
              "plot": "bppsa.irmas_experiment:plot_training",
              "first_step_loss_diff_above_1e-3": diverge,
              "config": {"setting": setting, "steps": steps, "batch_size": batch_size,
                         "learning_rate": learning_rate, "hidden_size": hidden_size, "holdout": holdout,
                         "seed": seed, "num_train": int(len(tr)), "num_heldout": int(len(te)),
                         "T": int(feats.x.shape[1]), "F": int(F)},
              "curves": curves, "max_loss_diff": diff, "heldout": final,
              "train_seconds": {m: curves[m][-1]["time"] for m in curves}, "wall_seconds": wall,
              "skipped": feats.skipped, "chance_accuracy": 1.0 / NUM_CLASSES}
    if test_root is not None:
        test = irmas.load_test_features(test_root, setting, cache_dir)
        record["test"] = {"clips": len(test.paths), "windows": int(len(test.x)), "skipped": test.skipped}
        for m, model in models.items():
            pred = irmas.clip_predictions(predict_probs(model, test.x), test.clip, len(test.paths))
            record["test"][m] = irmas.multilabel_f1(test.labels, pred)
    return record


def training_markdown(record: dict) -> str:
    c = record["config"]
    lines = [f"GRU({c['F']}, {c['hidden_size']}), setting {c['setting']} (T = {c['T']}), {c['steps']} Adam steps, "
             f"lr {c['learning_rate']}, B = {c['batch_size']}, {c['num_train']} train / {c['num_heldout']} held-out "
             f"clips; max |loss BPTT − loss BPPSA| over the run: {record['max_loss_diff']:.2e}"
             + (f" (first above 1e-3 at step {record['first_step_loss_diff_above_1e-3']}: float32 rounding "
                "differences of the two backward passes, amplified by training)"
                if record.get("first_step_loss_diff_above_1e-3") else ""), "",
             "| method | final train loss | held-out loss | held-out accuracy | training time (s) |"
             + (" test micro F1 | test macro F1 |" if "test" in record else ""),
             "|---|---:|---:|---:|---:|" + ("---:|---:|" if "test" in record else "")]
    for m in ("bptt", "bppsa"):
        h, ev = record["curves"][m][-1], record["heldout"][m]
        line = (f"| {m.upper()} | {h['loss']:.4f} | {ev['loss']:.4f} | {ev['accuracy']:.3f} | "
                f"{record['train_seconds'][m]:.1f} |")
        if "test" in record:
            line += f" {record['test'][m]['micro_f1']:.3f} | {record['test'][m]['macro_f1']:.3f} |"
        lines.append(line)
    lines.append(f"\nchance accuracy: {record['chance_accuracy']:.3f}")
    return "\n".join(lines) + "\n"


def plot_training(record: dict, path) -> None:
    """Loss and held-out accuracy curves of both methods from the training JSON record."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 3.6))
    for m, style in (("bptt", "-"), ("bppsa", "--")):
        h = record["curves"][m]
        a1.plot([r["step"] for r in h], [r["loss"] for r in h], style, label=f"{m.upper()} train loss", alpha=0.8)
        ev = [r for r in h if "eval_accuracy" in r]
        a2.plot([r["step"] for r in ev], [r["eval_accuracy"] for r in ev], style + "o", ms=3,
                label=f"{m.upper()} held-out accuracy")
    a2.axhline(record["chance_accuracy"], color="grey", lw=0.8, ls=":", label="chance")
    a1.set_xlabel("step"), a1.set_ylabel("cross-entropy"), a1.legend()
    a2.set_xlabel("step"), a2.set_ylabel("accuracy"), a2.legend()
    c = record["config"]
    fig.suptitle(f"GRU on IRMAS features (setting {c['setting']}): BPTT vs BPPSA from the same start "
                 f"(max loss difference {record['max_loss_diff']:.1e})", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# --------------------------------------------------------------------------------------------
# Entry points: experiment tasks (configs) and the command
# --------------------------------------------------------------------------------------------

def _test_root(data_root: Path):
    """The folder holding IRMAS-TestingData* next to (or inside) the training data, or None."""
    for d in (data_root, data_root.parent):
        if any(d.glob("IRMAS-TestingData*")):
            return d
    return None


def prepare_data(data_dir=None, *, clips_per_class=20, test_clips=0, test_seconds=(5.0, 8.0), seed=0,
                 synth_dir="data/synth-irmas", log=print):
    """(training root, test root or None, "real" | "synthetic"): the real IRMAS, or the stand-in (made if needed)."""
    if data_dir is not None:
        root = irmas.find_training_root(data_dir)
        return root, _test_root(Path(data_dir)), "real"
    root = ensure_synthetic_irmas(synth_dir, clips_per_class=clips_per_class, seed=seed, test_clips=test_clips,
                                  test_seconds=test_seconds, log=log)
    return irmas.find_training_root(root), (root if test_clips else None), "synthetic"


def _cfg(config, key, default=None):
    return config[key] if key in config else default


def _dirs(config, workdir: Path):
    """(synth_dir, cache_dir) of a config; "" means a folder inside the work directory."""
    synth = _cfg(config, "synth_dir", "") or workdir / "synth-irmas"
    cache = _cfg(config, "cache_dir", "") or workdir / "cache"
    return synth, cache


def _command():
    from .runner import current_command
    return current_command()


def grid_task(config, workdir: Path) -> dict:
    """Experiment task (``experiments/configs/irmas_grid.py``): the timing grid, saved to workdir."""
    workdir = Path(workdir)
    synth, cache = _dirs(config, workdir)
    root, _, kind = prepare_data(_cfg(config, "data_dir"), clips_per_class=config.clips_per_class,
                                 test_clips=_cfg(config, "test_clips", 0),
                                 test_seconds=tuple(_cfg(config, "test_seconds", (5.0, 8.0))),
                                 seed=config.seed, synth_dir=synth)
    rec = timing_grid(root, settings=tuple(config.settings), batches=tuple(config.batches), repeats=config.repeats,
                      hidden_size=config.hidden_size, cache_dir=cache, seed=config.seed)
    rec["data"] = {"kind": kind, "root": str(root)}
    rec["provenance"] = provenance(_command())
    _save_grid(rec, workdir)
    sb = [r["speedup_backward"] for r in rec["rows"]]
    return {"speedup_backward_min": min(sb), "speedup_backward_max": max(sb),
            "speedup_backward": {f"{r['setting']}/B={r['B']}": r["speedup_backward"] for r in rec["rows"]},
            "speedup_step": {f"{r['setting']}/B={r['B']}": r["speedup_step"] for r in rec["rows"]}}


def train_task(config, workdir: Path) -> dict:
    """Experiment task (``experiments/configs/irmas_train.py``): BPTT vs BPPSA training, saved to workdir."""
    workdir = Path(workdir)
    synth, cache = _dirs(config, workdir)
    root, test_root, kind = prepare_data(_cfg(config, "data_dir"), clips_per_class=config.clips_per_class,
                                         test_clips=config.test_clips, test_seconds=tuple(config.test_seconds),
                                         seed=config.seed, synth_dir=synth)
    rec = training_comparison(root, setting=config.setting, steps=config.steps, batch_size=config.batch_size,
                              learning_rate=config.learning_rate, hidden_size=config.hidden_size,
                              eval_every=config.eval_every, seed=config.seed, cache_dir=cache, test_root=test_root)
    rec["data"] = {"kind": kind, "root": str(root)}
    rec["provenance"] = provenance(_command())
    _save_training(rec, workdir)
    return {"max_loss_diff": rec["max_loss_diff"],
            "heldout_accuracy": {m: v["accuracy"] for m, v in rec["heldout"].items()}}


def _save_grid(rec, workdir: Path, name="irmas_grid"):
    save_json(workdir / f"{name}.json", rec)
    (workdir / f"{name}.md").write_text(grid_markdown(rec))
    plot_grid(rec, workdir / f"{name}.png")


def _save_training(rec, workdir: Path, name="irmas_train"):
    save_json(workdir / f"{name}.json", rec)
    (workdir / f"{name}.md").write_text(training_markdown(rec))
    plot_training(rec, workdir / f"{name}.png")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="bppsa reproduce irmas", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data-dir", default=None,
                   help="the real IRMAS: the IRMAS-TrainingData folder or its parent (test data, "
                        "IRMAS-TestingData-Part*, is used when it sits beside it); default: the synthetic stand-in")
    p.add_argument("--quick", action="store_true", help="small sizes: a few minutes on 2 CPU cores")
    p.add_argument("--workdir", default="runs/irmas", help="where results go (default: %(default)s)")
    p.add_argument("--synth-dir", default=None,
                   help="where the stand-in lives (default: data/synth-irmas with --quick, else data/synth-irmas-full)")
    p.add_argument("--cache-dir", default=DEFAULT_CACHE_DIR, help="feature cache (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, default=None, help="training steps (default: 200 quick, 1500 full)")
    p.add_argument("--lr", type=float, default=None,
                   help="Adam learning rate (default: the paper's 3e-4; 3e-3 with --quick)")
    p.add_argument("--repeats", type=int, default=None, help="timed repeats per component (default: 3 quick, 7 full)")
    p.add_argument("--settings", default=None, help="comma-separated subset of s,m,l for the grid")
    p.add_argument("--batches", default=None, help="comma-separated batch sizes for the grid (default: 16,32,64)")
    p.add_argument("--clips-per-class", type=int, default=None,
                   help="stand-in size (default: 20 quick, 60 full; ignored with --data-dir)")
    p.add_argument("--test-clips", type=int, default=None, help="stand-in test clips (default: 22 quick, 55 full)")
    p.add_argument("--skip-grid", action="store_true")
    p.add_argument("--skip-train", action="store_true")
    a = p.parse_args(argv)
    cfg = dict(QUICK if a.quick else FULL)
    for key, val in (("steps", a.steps), ("learning_rate", a.lr), ("repeats", a.repeats),
                     ("clips_per_class", a.clips_per_class), ("test_clips", a.test_clips)):
        if val is not None:
            cfg[key] = val
    if a.batches:
        try:
            cfg["batches"] = tuple(int(b) for b in a.batches.split(","))
        except ValueError:
            p.error(f"--batches must be comma-separated positive ints; got {a.batches!r}")
        if min(cfg["batches"]) < 1:
            p.error(f"--batches must be comma-separated positive ints; got {a.batches!r}")
    cfg["batch_size"] = min(cfg["batch_size"], 11 * cfg["clips_per_class"] - 11)
    if a.settings:
        cfg["settings"] = tuple(s.strip() for s in a.settings.split(","))
        for s in cfg["settings"]:
            irmas.num_frames(s)  # ValueError on an unknown setting
    out = Path(a.workdir)
    t_start = time.perf_counter()
    root, test_root, kind = prepare_data(a.data_dir, clips_per_class=cfg["clips_per_class"],
                                         test_clips=cfg["test_clips"], test_seconds=cfg["test_seconds"],
                                         seed=a.seed, synth_dir=a.synth_dir or cfg["synth_dir"])
    print(f"IRMAS ({kind}) training data: {root}" + (f"; test data under {test_root}" if test_root else ""))
    prov = provenance("bppsa reproduce irmas " + " ".join(argv if argv is not None else sys.argv[1:]))
    if not a.skip_grid:
        print(f"\n== timing grid: GRU(F, 20), B ∈ {cfg['batches']} × settings {cfg['settings']}, "
              f"median of {cfg['repeats']} (float32, {jax.default_backend()}) ==")
        grid = timing_grid(root, settings=cfg["settings"], batches=cfg["batches"], repeats=cfg["repeats"],
                           cache_dir=a.cache_dir, seed=a.seed)
        grid["data"] = {"kind": kind, "root": str(root)}
        grid["provenance"] = prov
        _save_grid(grid, out)
        print(f"\ntiming: {grid['timer']}; times in ms (median), speedup = BPTT / BPPSA\n")
        print(grid_markdown(grid))
    if not a.skip_train:
        print("\n== training: BPTT vs BPPSA from the same initial parameters ==")
        rec = training_comparison(root, setting=cfg["train_setting"], steps=cfg["steps"],
                                  batch_size=cfg["batch_size"], learning_rate=cfg["learning_rate"],
                                  eval_every=cfg["eval_every"], seed=a.seed, cache_dir=a.cache_dir,
                                  test_root=test_root)
        rec["data"] = {"kind": kind, "root": str(root)}
        rec["provenance"] = prov
        _save_training(rec, out)
        every = cfg["eval_every"] * max(1, cfg["steps"] // (10 * cfg["eval_every"]))
        print(f"{'step':>5} {'loss BPTT':>10} {'loss BPPSA':>11} {'held-out acc BPTT':>18} {'BPPSA':>6}")
        for x, y in zip(rec["curves"]["bptt"], rec["curves"]["bppsa"]):
            if x["step"] % every == 0 or x["step"] == cfg["steps"]:
                acc = (f"{x['eval_accuracy']:18.3f} {y['eval_accuracy']:6.3f}" if "eval_accuracy" in x else "")
                print(f"{x['step']:5d} {x['loss']:10.5f} {y['loss']:11.5f} {acc}")
        print()
        print(training_markdown(rec))
    print(f"wrote results to {out}/ (irmas_grid.*, irmas_train.*) in {time.perf_counter() - t_start:.0f} s")
    return 0
