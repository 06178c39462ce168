"""The paper's GRU on IRMAS (BPPSA, Wang et al., MLSys 2020, §5.2): ``bppsa reproduce irmas``.

1. Timing grid, B ∈ {16, 32, 64} × settings s/m/l, on the dataset's own feature arrays
   (xs (T, B, F) of the first B clips): forward, transposed-Jacobian generation, the BPPSA scan,
   the parameter-gradient contraction, the whole BPPSA backward, the BPTT backward and the
   training-step gradient each way (:func:`experiments.bench.time_components`, of the one timed loss
   :func:`experiments.gradient.loss`), with speedups — a markdown table in the paper's layout, JSON and a
   PNG bar chart.
2. Training: GRU(F, 20) -> linear head (11 classes) trained with BPTT and with BPPSA from the
   same initial parameters on the same batches; both loss/accuracy curves (they coincide up to
   float32 rounding), accuracy on a held-out split and, where a test set is present, the
   multi-label F1 on 3-second windows of the test clips.

:func:`run` is the task of ``experiments/paper_bppsa/configs/irmas{,_grid,_train}.py`` (``config.parts``
picks the grid, the training or both). Without ``config.data_dir`` it runs on the synthetic
stand-in (:mod:`experiments.data.synth_irmas`), generated on first use under ``config.synth_dir``; with
it, on the real IRMAS. :func:`shapes_task` (``experiments/paper_bppsa/configs/irmas_timing.py``) times the
grid on random inputs of the settings' shapes (:data:`experiments.data.irmas.SHAPES`), without data.
"""

from __future__ import annotations

import math
import time
from os import PathLike
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from bppsa import cells
from bppsa.errors import UsageError, checked_by, require_choices, require_int, require_ints
from bppsa.nn import SequenceClassifier
from experiments import entry
from experiments.bench import TABLE_HEADER, bench_point, save_record, time_components
from experiments.data import irmas
from experiments.data.cache import blocking_file
from experiments.data.synth_irmas import ensure_synthetic_irmas
from experiments.provenance import provenance, save_json
from experiments.tables import markdown_table
from experiments.train import compare_backward_training, evaluate

__all__ = ["timing_grid", "training_comparison", "grid_markdown", "training_markdown", "plot_grid",
           "plot_training", "stratified_split", "batch_clips", "predict_probs", "prepare_data", "save_grid",
           "save_training", "run", "shapes_task"]

NUM_CLASSES = len(irmas.CLASSES)

# --------------------------------------------------------------------------------------------
# Timing
# --------------------------------------------------------------------------------------------

def batch_clips(x: np.ndarray, B: int) -> np.ndarray:
    """The first B clips as time-major xs (T, B, F); fewer clips are cycled to fill B."""
    idx = np.arange(B) % len(x)
    return np.ascontiguousarray(np.swapaxes(x[idx], 0, 1))


def timing_grid(root, *, settings=("s", "m", "l"), batches=(16, 32, 64), repeats=5, hidden_size=20,
                scan="blelloch", cache_dir=None, seed=0, log=print) -> dict:
    """Time the GRU's components on IRMAS feature arrays for every (setting, B); a JSON-able record.

    ``log`` gets a line as each setting's features are ready and as each point finishes, with the
    point's number and the time since the grid began (a point compiles and times eight programs).
    """
    rows, skipped = [], {}
    start, points = time.perf_counter(), len(settings) * len(batches)
    for setting in settings:
        per_class = math.ceil(max(batches) / NUM_CLASSES)
        log(f"  setting {setting}: MFCC features of up to {per_class} clip{'s' * (per_class != 1)} per class "
            f"(extracted once, then read from the cache) ...")
        feats = irmas.load_features(root, setting, cache_dir, max_per_class=per_class, progress=False)
        skipped = {"files": feats.skipped, "folders": feats.skipped_folders}  # the same for every setting
        if len(feats.x) == 0:
            raise ValueError(f"no decodable clips under {root}; cannot time setting {setting!r}")
        T, F = feats.x.shape[1:]
        cell = cells.GRU(F, hidden_size)
        params = cell.init(jax.random.key(seed))
        for B in batches:
            xs = jnp.asarray(batch_clips(feats.x, B))
            h0 = jnp.zeros((B, hidden_size), xs.dtype)
            t = time_components(cell, params, xs, h0, scan=scan, repeats=repeats, warmup=1, seed=seed)
            row = {"setting": setting, "T": int(T), "F": int(F), "B": int(B), "H": hidden_size,
                   "clips": int(min(B, len(feats.x)))}
            for k, v in t.items():
                if isinstance(v, dict) and "median" in v:
                    row[k] = v
            row["speedup_backward"] = row["bptt_backward"]["median"] / row["bppsa_backward_full"]["median"]
            row["speedup_scan"] = row["bptt_backward"]["median"] / row["bppsa_backward"]["median"]
            row["speedup_step"] = row["step_bptt"]["median"] / row["step_bppsa"]["median"]
            rows.append(row)
            log(f"  [{len(rows)}/{points}, {time.perf_counter() - start:5.0f} s] "
                f"{setting}  T={T:5d} F={F:3d} B={B:3d}:  BPTT bwd {1e3 * row['bptt_backward']['median']:8.2f} ms, "
                f"BPPSA bwd {1e3 * row['bppsa_backward_full']['median']:8.2f} ms "
                f"(scan {1e3 * row['bppsa_backward']['median']:.2f}),  backward ×{row['speedup_backward']:.2f}, "
                f"step ×{row['speedup_step']:.2f}")
    return {"title": "IRMAS timing grid: GRU(F, 20), BPTT vs BPPSA backward (paper §5.2)",
            "plot": "experiments.paper_bppsa.irmas:plot_grid",
            "rows": rows, "skipped": skipped, "timer": "experiments.bench.time_components", "scan": scan,
            "repeats": repeats,
            "hidden_size": hidden_size,
            "dtype": "float32", "backend": jax.default_backend()}


def grid_markdown(record: dict) -> str:
    """The timing grid as a markdown table in the paper's layout (ms, medians; speedup = BPTT / BPPSA)."""
    caption = (f"GRU(F, {record['hidden_size']}), float32 on {record['backend']}, times in ms (median of "
               f"{record.get('repeats', '?')} interleaved repeats after compilation, {record.get('timer', '?')}); "
               f"speedup = BPTT / BPPSA (> 1: BPPSA faster); BPPSA backward = the whole BPPSA backward in one jit "
               f"(Jacobian generation + scan + parameter gradients); step grad. = the training-step gradient "
               f"(forward + backward of the one timed loss, `experiments.gradient.loss`); "
               f"data: {record.get('data', {}).get('kind', '?')}.")
    keys = ("forward", "jacobian", "bppsa_backward", "param_grads", "bppsa_backward_full", "bptt_backward",
            "step_bppsa", "step_bptt")
    rows = []
    for r in record["rows"]:
        ms = {k: f"{1e3 * r[k]['median']:.2f}" for k in keys}
        rows.append([r["setting"], r["T"], r["F"], r["B"], *(ms[k] for k in keys[:6]),
                     f"**{r['speedup_backward']:.2f}×**", ms["step_bppsa"], ms["step_bptt"],
                     f"**{r['speedup_step']:.2f}×**"])
    header = ["setting", "T", "F", "B", "forward", "Jacobian gen.", "BPPSA scan", "param. grads", "BPPSA backward",
              "BPTT backward", "backward speedup", "step grad. BPPSA", "step grad. BPTT", "step speedup"]
    return caption + "\n\n" + markdown_table(header, rows, align="l" + "r" * 13) + "\n"


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


@nnx.jit
def _probs_padded(model, x, lengths):
    return jax.nn.softmax(model(x, seq_lengths=lengths), axis=-1)


def predict_probs(model, x, batch_size=256, lengths=None) -> np.ndarray:
    """Softmax outputs (N, classes) of ``model`` on x (N, T, F); with ``lengths`` (N,) a padded
    batch: each row is read at its last real frame (``seq_lengths`` of :class:`bppsa.nn.RNN`)."""
    if lengths is None:
        return np.concatenate([np.asarray(_probs(model, jnp.asarray(x[i:i + batch_size])))
                               for i in range(0, len(x), batch_size)])
    return np.concatenate([np.asarray(_probs_padded(model, jnp.asarray(x[i:i + batch_size]),
                                                    jnp.asarray(lengths[i:i + batch_size])))
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
              "plot": "experiments.paper_bppsa.irmas:plot_training",
              "first_step_loss_diff_above_1e-3": diverge,
              "config": {"setting": setting, "steps": steps, "batch_size": batch_size,
                         "learning_rate": learning_rate, "hidden_size": hidden_size, "holdout": holdout,
                         "seed": seed, "num_train": int(len(tr)), "num_heldout": int(len(te)),
                         "T": int(feats.x.shape[1]), "F": int(F)},
              "curves": curves, "max_loss_diff": diff, "heldout": final,
              "train_seconds": {m: curves[m][-1]["time"] for m in curves}, "wall_seconds": wall,
              "skipped": {"files": feats.skipped, "folders": feats.skipped_folders},
              "chance_accuracy": 1.0 / NUM_CLASSES}
    if test_root is not None:
        test = irmas.load_test_features(test_root, setting, cache_dir)
        record["test"] = {"clips": len(test.paths), "windows": int(len(test.x)), "skipped": test.skipped}
        for m, model in models.items():
            pred = irmas.clip_predictions(predict_probs(model, test.x, lengths=test.lengths), test.clip,
                                          len(test.paths))
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
             ""]
    test = "test" in record
    rows = []
    for m in ("bptt", "bppsa"):
        h, ev = record["curves"][m][-1], record["heldout"][m]
        rows.append([m.upper(), f"{h['loss']:.4f}", f"{ev['loss']:.4f}", f"{ev['accuracy']:.3f}",
                     f"{record['train_seconds'][m]:.1f}",
                     *([f"{record['test'][m]['micro_f1']:.3f}", f"{record['test'][m]['macro_f1']:.3f}"]
                       if test else [])])
    header = ["method", "final train loss", "held-out loss", "held-out accuracy", "training time (s)",
              *(["test micro F1", "test macro F1"] if test else [])]
    lines.append(markdown_table(header, rows, align="l" + "r" * (len(header) - 1)))
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
    a1.set_xlabel("step")
    a1.set_ylabel("cross-entropy")
    a1.legend()
    a2.set_xlabel("step")
    a2.set_ylabel("accuracy")
    a2.legend()
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
                 synth_dir: str | Path = "data/synth-irmas", log=print):
    """(training root, test root or None, "real" | "synthetic"): the real IRMAS, or the stand-in (made if needed)."""
    if data_dir is not None:
        root = irmas.find_training_root(data_dir)
        return root, _test_root(Path(data_dir)), "real"
    root = ensure_synthetic_irmas(synth_dir, clips_per_class=clips_per_class, seed=seed, test_clips=test_clips,
                                  test_seconds=test_seconds, log=log)
    return irmas.find_training_root(root), (root if test_clips else None), "synthetic"


def save_grid(rec, workdir: PathLike, name="irmas_grid") -> None:
    """The grid record as ``name``.json, .md (:func:`grid_markdown`) and .png (:func:`plot_grid`)."""
    save_json(entry(workdir, f"{name}.json"), rec)
    entry(workdir, f"{name}.md").write_text(grid_markdown(rec))
    plot_grid(rec, entry(workdir, f"{name}.png"))


def save_training(rec, workdir: PathLike, name="irmas_train") -> None:
    """The training record as ``name``.json, .md (:func:`training_markdown`) and .png (:func:`plot_training`)."""
    save_json(entry(workdir, f"{name}.json"), rec)
    entry(workdir, f"{name}.md").write_text(training_markdown(rec))
    plot_training(rec, entry(workdir, f"{name}.png"))


def check_run(config) -> None:
    """The ranges of :func:`run`'s config (UsageError naming the key), checked before anything is written."""
    parts = require_choices(config, "parts", ("grid", "train"), many=True)
    if "grid" in parts:
        require_choices(config, "settings", tuple(irmas.SETTINGS), many=True)
        require_ints(config, "batches", allow_empty=False)
        require_int(config, "repeats")
    if "train" in parts:
        require_choices(config, "setting", tuple(irmas.SETTINGS))
        require_int(config, "steps")
        require_int(config, "batch_size")
    require_int(config, "hidden_size")
    require_int(config, "clips_per_class")
    if config.cache_dir and (blocker := blocking_file(config.cache_dir)) is not None:
        raise UsageError(f"config.cache_dir {config.cache_dir!r} is not a folder ({str(blocker)!r} is a file); "
                         "expected a folder for the feature cache, or '' for one inside the work directory")


@checked_by(check_run)
def run(config, workdir: PathLike) -> dict:
    """Task of ``experiments/paper_bppsa/configs/irmas{,_grid,_train}.py``: the parts in ``config.parts``.

    "grid": :func:`timing_grid` -> irmas_grid.{json,md,png}; "train": :func:`training_comparison`
    -> irmas_train.{json,md,png}, both in ``workdir``. ``config.synth_dir`` / ``config.cache_dir``
    "" mean a folder inside the work directory.
    """
    check_run(config)
    parts = tuple(config.parts)
    synth = config.synth_dir or entry(workdir, "synth-irmas")
    cache = config.cache_dir or entry(workdir, "cache")
    root, test_root, kind = prepare_data(config.data_dir, clips_per_class=config.clips_per_class,
                                         test_clips=config.test_clips, test_seconds=tuple(config.test_seconds),
                                         seed=config.seed, synth_dir=synth)
    print(f"IRMAS ({kind}) training data: {root}" + (f"; test data under {test_root}" if test_root else ""))
    summary = {}
    if "grid" in parts:
        print(f"\n== timing grid: GRU(F, {config.hidden_size}), B ∈ {tuple(config.batches)} × settings "
              f"{tuple(config.settings)}, median of {config.repeats} (float32, {jax.default_backend()}) ==")
        rec = timing_grid(root, settings=tuple(config.settings), batches=tuple(config.batches),
                          repeats=config.repeats, hidden_size=config.hidden_size, cache_dir=cache, seed=config.seed)
        rec["data"] = {"kind": kind, "root": str(root)}
        rec["provenance"] = provenance()
        save_grid(rec, workdir)
        print(grid_markdown(rec))
        sb = [r["speedup_backward"] for r in rec["rows"]]
        summary.update(speedup_backward_min=min(sb), speedup_backward_max=max(sb),
                       speedup_backward={f"{r['setting']}/B={r['B']}": r["speedup_backward"] for r in rec["rows"]},
                       speedup_step={f"{r['setting']}/B={r['B']}": r["speedup_step"] for r in rec["rows"]})
    if "train" in parts:
        print("\n== training: BPTT vs BPPSA from the same initial parameters ==")
        rec = training_comparison(root, setting=config.setting, steps=config.steps, batch_size=config.batch_size,
                                  learning_rate=config.learning_rate, hidden_size=config.hidden_size,
                                  eval_every=config.eval_every, seed=config.seed, cache_dir=cache,
                                  test_root=test_root)
        rec["data"] = {"kind": kind, "root": str(root)}
        rec["provenance"] = provenance()
        save_training(rec, workdir)
        print(training_markdown(rec))
        summary.update(max_loss_diff=rec["max_loss_diff"],
                       heldout_accuracy={m: v["accuracy"] for m, v in rec["heldout"].items()})
    wrote = {"grid": "irmas_grid", "train": "irmas_train"}
    print(f"\nthe results, in {Path(workdir)}: "
          + "; ".join(f"{wrote[p]}.json, {wrote[p]}.md (the table) and {wrote[p]}.png (the figure)" for p in parts))
    return summary


def check_shapes_task(config) -> None:
    """The ranges of :func:`shapes_task`'s config (UsageError naming the key)."""
    require_choices(config, "settings", tuple(irmas.SHAPES), many=True)
    require_ints(config, "batches", allow_empty=False)
    require_int(config, "repeats")
    require_int(config, "hidden_size")


@checked_by(check_shapes_task)
def shapes_task(config, workdir: PathLike) -> dict:
    """Task of ``experiments/paper_bppsa/configs/irmas_timing.py``: the grid's timing on random inputs of each
    setting's shape (GRU(F, H), 11 classes, no data needed); ``<name>``.{json,md} in ``workdir``."""
    check_shapes_task(config)
    start = time.perf_counter()
    pts, skipped = [], []
    print(TABLE_HEADER)
    for s in config.settings:
        F, T = irmas.SHAPES[s]
        for B in config.batches:
            if config.time_budget_s is not None and time.perf_counter() - start > config.time_budget_s:
                skipped.append({"sweep": "irmas", "T": T, "B": B, "why": "time budget"})
                continue
            r = bench_point(cells.GRU(F, config.hidden_size), T, B, repeats=config.repeats, scan_variants=(),
                            memory=False,
                            baselines={"unrolls": tuple(config.unrolls)} if config.get("unrolls") else True)
            r["setting"] = s
            pts.append(r)
    record = {"config": config.to_dict(), "sweeps": {"IRMAS GRU grid (synthetic inputs)": pts}, "skipped": skipped,
              **({"note": config.note} if config.get("note") else {})}
    for ext in ("json", "md"):  # what save_record writes
        entry(workdir, f"{config.name}.{ext}")
    save_record(record, workdir, config.name)
    return {f"{p['setting']}/B={p['B']}": {"speedup_backward": p["speedup_backward"],
                                           "speedup_step": p["speedup_step"]} for p in pts}
