"""The parallel forward (:mod:`bppsa.forward.newton`) measured: Newton iterations, failure handling and the
whole training step for every forward × backward pair (the task of experiments/extensions/configs/parallel_step.py).

Parts (``config.parts``):

- ``iterations``: iterations to converge against T for each cell of ``config.iter_cells``, forward
  newton and quasi, at random initialisation (:func:`experiments.gradient.problem`). Every run records
  :class:`bppsa.forward.newton.NewtonInfo` and the largest ``|states − sequential forward's states|``.
- ``trained``: the same for the IRMAS GRU(F, H) after a short training run (``config.train_steps``
  Adam steps, BPTT, on the synthetic stand-in of :mod:`experiments.data.synth_irmas`, as
  :mod:`experiments.paper_bppsa.irmas` trains it) and before it, on the clips' features concatenated
  along time to length T.
- ``chaotic``: an RNN whose recurrent matrix is scaled to spectral radius ``config.chaotic_rho``:
  plain Newton, ELK (``damping=1.0``) and quasi-Newton; at the smallest T, ``max_iter = T`` and
  ``on_fail="raise"`` (in a subprocess: what it raises).
- ``steps``: the jitted training step (``jax.value_and_grad`` of :func:`experiments.gradient.loss`, a
  fixed readout of every state, w.r.t. the parameters) for every pair of :data:`FORWARDS` ×
  :data:`BACKWARDS` at each of ``config.step_points``, timed together by
  :func:`bppsa.host.time_interleaved`; tuned BPTT is (sequential, bptt) (``unroll=None``: the
  tuned unroll); ``forward="auto", backward="auto"`` runs exactly one of the pairs
  (:meth:`bppsa.Options.resolve`), whose time it is given, and the table says how far that is
  from the fastest pair. With a parallel forward ``backward="bptt"`` is the sequential scan of
  the same backward, the program of (forward, bppsa_seq): it is timed once, under that name.

Writes ``<name>``.json (with provenance) and ``<name>``.md. :func:`step_functions` and
:func:`measure_pairs` are also the GPU run's (:mod:`experiments.paper_bppsa.gpu_run`, part ``parallel``).
"""

from __future__ import annotations

import functools
import json
import subprocess
import sys
import time
import warnings
from os import PathLike

import jax
import jax.numpy as jnp
import numpy as np

from bppsa import backprop, cells
from bppsa.errors import UsageError, checked_by, require_choices, require_int, require_ints, require_number
from bppsa.forward import newton
from bppsa.host import time_interleaved
from bppsa.plan import options
from bppsa.plan.cost import forward_seconds
from bppsa.plan.options import Options
from bppsa.scan import SCANS
from experiments import entry, gradient
from experiments.extensions.predictability import fit_of, markdown_part, mean_iterations, plot, predictability
from experiments.provenance import provenance, save_json
from experiments.tables import markdown_table

spectral_radius = lambda W: float(np.max(np.abs(np.linalg.eigvals(np.asarray(W, np.float64)))))  # noqa: E731

__all__ = ["CELLS", "FORWARDS", "BACKWARDS", "make_cell", "cell_label", "timed_pair",
           "step_functions", "measure_pairs", "auto_pair", "iteration_row", "long_inputs", "run"]

CELLS = {**cells.BUILTIN, "blockrnn": cells.BlockRNN,
         "blockgru": cells.BlockGRU, "blocklstm": cells.BlockLSTM}
FORWARDS = ("sequential", "newton", "quasi")
#: backward name -> bppsa.rnn options
BACKWARDS = {"bptt": {"backward": "bptt"}, "bppsa": {"backward": "bppsa", "scan": "blelloch"},
             "bppsa_seq": {"backward": "bppsa", "scan": "sequential"}}


def make_cell(kind: str, I: int, H: int, head: int = 1):
    """A cell of :data:`CELLS` (block cells with ``head_size=head``)."""
    return CELLS[kind](I, H, head_size=head) if kind.startswith("block") else CELLS[kind](I, H)


def cell_label(kind: str, head: int = 1) -> str:
    return CELLS[kind].__name__ + (f" k={head}" if kind.startswith("block") else "")


def timed_pair(forward: str, backward: str) -> str:
    """The name under which (forward, backward) is timed: the same program runs once."""
    return f"{forward}/bppsa_seq" if forward != "sequential" and backward == "bptt" else f"{forward}/{backward}"


def auto_pair(cell, T: int, B: int) -> str:
    """The pair ``forward="auto", backward="auto"`` runs here (its timed name)."""
    o = Options(forward="auto", backward="auto").resolve(cell, T, B, jnp.float32)
    backward = "bptt" if o.backward == "bptt" else ("bppsa" if o.scan == "blelloch" else "bppsa_seq")
    return timed_pair(o.forward, backward)


def step_functions(cell, params, xs, h0, R, pairs) -> dict:
    """``{"forward/backward": zero-argument jitted training step}`` returning ((loss, info), grads)."""
    def make(opts):
        def loss(p, x, h, r):
            out, info = backprop.rnn(cell, p, x, h, return_info=True, **opts)
            return gradient.loss(cell, out, r), info
        return functools.partial(jax.jit(jax.value_and_grad(loss, has_aux=True)), params, xs, h0, R)
    return {name: make({"forward": name.split("/")[0], **BACKWARDS[name.split("/")[1]]}) for name in pairs}


def _info(info) -> dict | None:
    return None if info is None else {k: getattr(np.asarray(v), "item")() for k, v in info._asdict().items()}


def measure_pairs(cell, T: int, B: int, pairs, *, repeats: int, seed: int = 0) -> dict:
    """Time the training step of every pair (names "forward/backward") on :func:`experiments.gradient.problem`
    interleaved: ``{"times": {pair: stats}, "info": {pair: NewtonInfo dict or None}, "loss_diff"}``."""
    params, xs, h0, R = gradient.problem(cell, T, B, seed=seed)
    fns = step_functions(cell, params, xs, h0, R, pairs)
    first = {name: jax.block_until_ready(fn()) for name, fn in fns.items()}  # compiles; the warm-up
    losses = {name: float(v[0][0]) for name, v in first.items()}
    times = time_interleaved(fns, repeats=repeats, warmup=0, block=2)
    return {"times": times, "info": {name: _info(v[0][1]) for name, v in first.items()},
            "loss_diff": max(losses.values()) - min(losses.values())}


# ---- (a) iterations ----------------------------------------------------------------------------

def _max_diff(a, b) -> float:
    """max |a − b| by numpy (NaN propagates; jnp.max on CPU drops NaNs of large arrays, jax 0.10.2)."""
    return max(float(np.max(np.abs(np.asarray(x) - np.asarray(y)))) for x, y in zip(*map(jax.tree.leaves, (a, b))))


def iteration_row(cell, params, xs, h0, ref, forward: str, **opts) -> dict:
    """One parallel forward (jitted, ``return_info``): its NewtonInfo, ``max |states − ref|``, and the
    seconds of one call after compilation (one call, not a benchmark)."""
    fn = jax.jit(lambda p, x, h: backprop.rnn(cell, p, x, h, forward=forward, return_info=True, **opts))
    t0 = time.perf_counter()
    jax.block_until_ready(fn(params, xs, h0))
    t1 = time.perf_counter()
    out, info = jax.block_until_ready(fn(params, xs, h0))
    finite = all(bool(np.isfinite(np.asarray(x)).all()) for x in jax.tree.leaves(out))
    return {"forward": forward, **(_info(info) or {}), "max_abs_diff": _max_diff(out, ref), "states_finite": finite,
            "first_call_s": t1 - t0, "call_s": time.perf_counter() - t1}


def _sequential(cell, params, xs, h0):
    return jax.jit(lambda p, x, h: backprop.rnn(cell, p, x, h, backward="bptt"))(params, xs, h0)


def _sweep(config, label, cell, inputs, forwards, log, **opts) -> list[dict]:
    """Rows of every T of ``config.iter_T`` and forward; inputs(T) -> (params, xs, h0)."""
    rows = []
    for T in config.iter_T:
        params, xs, h0 = inputs(T)
        ref = _sequential(cell, params, xs, h0)
        for fwd in forwards:
            row = {"cell": label, "T": T, "B": xs.shape[1], **iteration_row(cell, params, xs, h0, ref, fwd, **opts)}
            rows.append(row)
            log(f"  {label:<13} T={T:<6} {fwd:<7} it {row['iterations']:>2} conv {row['converged']!s:<5} "
                f"res {row['residual']:.1e} diff {row['max_abs_diff']:.1e} ({row['first_call_s']:.1f} s)")
    return rows


def iterations(config, log=print) -> list[dict]:
    """Part ``iterations``: random initialisation, every cell of ``config.iter_cells``."""
    rows = []
    for kind, head in config.iter_cells:
        cell = make_cell(kind, config.iter_I, config.iter_H, head)
        inputs = lambda T, cell=cell: gradient.problem(cell, T, config.iter_B, seed=config.seed)[:3]
        rows += [{"weights": "random", **r} for r in _sweep(config, cell_label(kind, head), cell, inputs,
                                                              config.forwards, log, scan=config.iter_scan)]
    return rows


def long_inputs(x: np.ndarray, T: int, B: int) -> np.ndarray:
    """(T, B, F) from clips x (N, T0, F): all frames concatenated, row b starting at b/B of the way."""
    frames = x.reshape(-1, x.shape[-1])
    starts = np.arange(B) * (len(frames) // B)
    return np.stack([np.take(frames, np.arange(s, s + T), axis=0, mode="wrap") for s in starts], axis=1)


def trained(config, workdir: PathLike, log=print, keep: dict | None = None) -> dict:
    """Part ``trained``: the IRMAS GRU before and after ``config.train_steps`` Adam steps (``keep``:
    receives the cell, the clips and both parameter sets, for part ``predictability``)."""
    from flax import nnx  # the training's imports, only here

    from bppsa.nn import SequenceClassifier
    from experiments.data import irmas as irmas_data
    from experiments.paper_bppsa.irmas import NUM_CLASSES, prepare_data
    from experiments.train import fit

    root, _, kind = prepare_data(None, clips_per_class=config.clips_per_class, test_clips=0, seed=config.seed,
                                 synth_dir=config.synth_dir or entry(workdir, "synth-irmas"), log=log)
    feats = irmas_data.load_features(root, config.setting, config.cache_dir or entry(workdir, "cache"), progress=False)
    cell = cells.GRU(feats.x.shape[2], config.iter_H)
    model = SequenceClassifier(cell, NUM_CLASSES, backward="bptt", rngs=nnx.Rngs(config.seed))
    params_of = lambda: jax.tree.map(lambda v: jnp.asarray(v[...]), model.rnn.params,
                                     is_leaf=lambda v: isinstance(v, nnx.Variable))
    before = params_of()
    t0 = time.perf_counter()
    hist = fit(model, feats.x, feats.y, steps=config.train_steps, batch_size=config.train_batch,
               learning_rate=config.learning_rate, seed=config.seed, progress=False)
    info = {"data": kind, "clips": int(len(feats.x)), "setting": config.setting, "T": int(feats.x.shape[1]),
            "F": int(feats.x.shape[2]), "steps": config.train_steps, "learning_rate": config.learning_rate,
            "first_loss": hist[0]["loss"], "final_loss": float(np.mean([h["loss"] for h in hist[-10:]])),
            "final_accuracy": float(np.mean([h["accuracy"] for h in hist[-10:]])),
            "train_s": time.perf_counter() - t0,
            "recurrent_spectral_radius": {}}
    log(f"  trained GRU({info['F']}, {config.iter_H}) {config.train_steps} steps: loss {info['first_loss']:.3f} -> "
        f"{info['final_loss']:.3f} ({info['train_s']:.0f} s)")
    rows, sets = [], {"IRMAS init": before, "IRMAS trained": params_of()}
    (keep if keep is not None else {}).update(cell=cell, x=feats.x, params=sets)
    for weights, params in sets.items():
        info["recurrent_spectral_radius"][weights] = spectral_radius(params["W_h"][:, 2 * config.iter_H:])

        def inputs(T, params=params):
            xs = jnp.asarray(long_inputs(feats.x, T, config.iter_B))
            return params, xs, jnp.zeros((config.iter_B, config.iter_H), xs.dtype)
        rows += [{"weights": weights, **r} for r in _sweep(config, "GRU", cell, inputs, config.forwards, log,
                                                            scan=config.iter_scan)]
    return {"training": info, "rows": rows}


_PROBE = """
import json, sys, jax, numpy as np
from bppsa import backprop, cells
from experiments import gradient
I, H, B, T, rho, seed, scan, max_iter = json.loads(sys.argv[1])
cell = cells.RNN(I, H)
p, xs, h0, _ = gradient.problem(cell, T, B, seed=seed)
p = {**p, "W_h": p["W_h"] * (rho / float(np.max(np.abs(np.linalg.eigvals(np.asarray(p["W_h"], np.float64))))))}
out = {"T": T, "raised": None}
try:
    jax.block_until_ready(jax.jit(lambda a, b, c: backprop.rnn(cell, a, b, c, forward="newton", on_fail="raise",
                                                                scan=scan, max_iter=max_iter))(p, xs, h0))
except Exception as e:
    out.update(raised=type(e).__name__, names_NewtonDidNotConverge="NewtonDidNotConverge" in str(e),
               message=next((ln for ln in str(e).splitlines() if "NewtonDidNotConverge" in ln),
                            str(e).splitlines()[0])[:300])
print(json.dumps(out))
"""


def raise_probe(config, T: int, max_iter: int = 100) -> dict:
    """``on_fail="raise"`` on the chaotic problem at T, in a subprocess (a failing debug callback
    must not share this process): what the caller sees."""
    arg = json.dumps([config.iter_I, config.iter_H, config.iter_B, T, config.chaotic_rho, config.seed,
                      config.iter_scan, max_iter])
    r = subprocess.run([sys.executable, "-c", _PROBE, arg], capture_output=True, text=True, timeout=600)
    return json.loads(r.stdout.strip().splitlines()[-1]) if r.returncode == 0 else {"T": T, "error": r.stderr[-300:]}


def chaotic(config, log=print) -> dict:
    """Part ``chaotic``: an RNN with W_h scaled to spectral radius ``config.chaotic_rho``."""
    cell = cells.RNN(config.iter_I, config.iter_H)
    rows, raised = [], None
    for T in config.chaotic_T:
        params, xs, h0, _ = gradient.problem(cell, T, config.iter_B, seed=config.seed)
        params = {**params, "W_h": params["W_h"] * (config.chaotic_rho / spectral_radius(params["W_h"]))}
        ref = _sequential(cell, params, xs, h0)
        variants = [("newton", "newton", {}), ("ELK damping=1", "newton", {"damping": 1.0}), ("quasi", "quasi", {})]
        if T == min(config.chaotic_T):
            variants.append((f"newton max_iter={T}", "newton", {"max_iter": int(T)}))
        for label, fwd, kw in variants:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", newton.NewtonFallbackWarning)
                row = {"variant": label, "T": int(T), "B": config.iter_B,
                       **iteration_row(cell, params, xs, h0, ref, fwd, scan=config.iter_scan, **kw)}
            rows.append(row)
            log(f"  chaotic T={T:<6} {label:<18} it {row['iterations']:>3} conv {row['converged']!s:<5} fell_back "
                f"{row['fell_back']!s:<5} res {row['residual']:.1e} diff {row['max_abs_diff']:.1e}")
        if raised is None and any(r["T"] == T and r["variant"] == "newton" and r["fell_back"] for r in rows):
            raised = raise_probe(config, int(T))  # at the first T where the default Newton does not converge
    return {"rho": config.chaotic_rho, "rows": rows, "on_fail_raise": raised}


# ---- (b) the training step ---------------------------------------------------------------------

def step_times(config, log=print) -> list[dict]:
    """Part ``steps``: every pair at every point of ``config.step_points`` ((kind, head, I, H, T, B))."""
    pairs = list(dict.fromkeys(timed_pair(f, b) for f in FORWARDS for b in BACKWARDS))
    rows = []
    for kind, head, I, H, T, B in config.step_points:
        cell = make_cell(kind, I, H, head)
        t0 = time.perf_counter()
        m = measure_pairs(cell, T, B, pairs, repeats=config.repeats, seed=config.seed)
        med = {p: s["median"] for p, s in m["times"].items()}
        auto = auto_pair(cell, T, B)
        fastest = min(med, key=lambda p: med[p])
        row = {"cell": cell_label(kind, head), "I": I, "H": H, "T": T, "B": B, **m, "auto": auto, "fastest": fastest,
               "auto_over_fastest": med[auto] / med[fastest], "tuned_bptt": "sequential/bptt",
               "predicted_forward_s": {f: forward_seconds(cell, T, B, f) for f in FORWARDS},
               "wall_s": time.perf_counter() - t0}
        rows.append(row)
        log(f"  {row['cell']} T={T} B={B}: " + ", ".join(f"{p} {1e3 * v:.1f}" for p, v in med.items())
            + f" ms; auto {auto} ({row['auto_over_fastest']:.2f}x fastest {fastest}); {row['wall_s']:.0f} s")
    return rows


# ---- Markdown ----------------------------------------------------------------------------------

def _its(r) -> str:  # measured iterations, ✗ not converged, [predicted] where recorded
    p = r.get("predicted", -1)
    return f"{r['iterations']}" + ("" if r["converged"] else " ✗") + (f" [{p}]" if p >= 0 else "")


def _iteration_table(rows) -> str:
    Ts = sorted({r["T"] for r in rows})
    groups: dict = {}
    for r in rows:
        groups.setdefault((r["cell"], r["weights"], r["forward"]), {})[r["T"]] = r
    body = []
    for (cell, weights, fwd), by_T in groups.items():
        rs = list(by_T.values())
        body.append([cell, weights, fwd, *(_its(by_T[T]) if T in by_T else "" for T in Ts),
                     f"{max(r['residual'] for r in rs):.1e}", f"{max(r['max_abs_diff'] for r in rs):.1e}",
                     "yes" if any(r["fell_back"] for r in rs) else "no"])
    return markdown_table(["cell", "weights", "forward", *(f"T={T}" for T in Ts), "max residual",
                           "max abs(states − seq.)", "fell back"], body, align="lll" + "r" * (len(Ts) + 2) + "l")


def markdown(record) -> str:
    p, c = record["provenance"], record["config"]
    out = [f"# {record['title']}", "",
           f"`{p['command']}` — {p['date']}, {p['backend']} / {p['device_kind']} / {p['cpu']} "
           f"({p['cpu_count']} cores), "
           f"jax {p['jax']}, commit {str(p.get('git_commit'))[:10]}; float32, tol {options.tolerance(jnp.float32)} "
           f"(relative residual), max_iter {options.DEFAULT_MAX_ITER}. Whole run {record['wall_s'] / 60:.1f} min.", "",
           *([f"**Note.** {record['note']}", ""] if record.get("note") else [])]
    if "iterations" in record or "trained" in record:
        rows = record.get("iterations", []) + record.get("trained", {}).get("rows", [])
        out += ["## Iterations to converge", "",
                f"Newton iterations (scans) of `bppsa.rnn(..., forward=..., return_info=True)`, B = {c['iter_B']}, "
                f"H = {c['iter_H']}, linear solves by the `{c['iter_scan']}` scan (the iteration count does not depend "
                "on the scan but through rounding; the step-time table below records the Blelloch runs' counts). "
                "✗: not converged within max_iter (the sequential forward's states returned instead). "
                "[n]: the iterations `info.predicted` foresees from the Lyapunov exponent (recorded from now on). "
                "max abs(states − seq.): against the sequential forward (`lax.scan`) over all T.", "",
                _iteration_table(rows), ""]
        for fwd, m in record["mean_iterations"].items():
            out.append(f"- {fwd}: mean {m['mean']:.1f}, median {m['median']:.0f}, max {m['max']} iterations over "
                       f"{m['runs']} converged runs ({m['unconverged']} not converged)")
        out.append("")
    if "trained" in record:
        t = record["trained"]["training"]
        out += [f"Training: GRU({t['F']}, {c['iter_H']}) on the {t['data']} IRMAS stand-in (setting {t['setting']}, "
                f"{t['clips']} clips), {t['steps']} Adam steps at lr {t['learning_rate']}, B = {c['train_batch']}, "
                f"BPTT: loss {t['first_loss']:.3f} → {t['final_loss']:.3f} (last 10 steps; batch accuracy "
                f"{t['final_accuracy']:.2f}), {t['train_s']:.0f} s. Spectral radius of the candidate's recurrent "
                "matrix W_hn: " + ", ".join(f"{k} {v:.2f}" for k, v in t["recurrent_spectral_radius"].items())
                + ". Inputs: the clips' MFCC frames concatenated along time to length T.", ""]
    if "chaotic" in record:
        ch = record["chaotic"]
        out += [f"## Chaotic RNN (recurrent spectral radius {ch['rho']})", "",
                markdown_table(["T", "variant", "iterations", "converged", "fell back", "residual of the iterate",
                                "states finite", "max abs(states − seq.)"],
                               [[r["T"], r["variant"], r["iterations"], r["converged"], r["fell_back"],
                                 f"{r['residual']:.2e}", r.get("states_finite", "?"), f"{r['max_abs_diff']:.1e}"]
                                for r in ch["rows"]], align="rlrllrlr"), ""]
        rz = ch.get("on_fail_raise") or {}
        what = (f"raised {rz['raised']} — {rz.get('message', '')}" if rz.get("raised") else
                f"the probe failed — {rz['error'].strip().splitlines()[-1]}" if rz.get("error") else
                "nothing raised (the default Newton converged there).")
        out += [f"`on_fail=\"raise\"` at T = {rz.get('T')}: {what}", ""] if rz else []
    out += markdown_part(record) if "predictability" in record else []
    if "steps" in record:
        out += ["## The training step, every forward × backward", "",
                "`jax.jit(jax.value_and_grad(loss))` w.r.t. the parameters, the loss a fixed random readout of every "
                "state (`experiments.gradient.loss`), median [min] ms over interleaved blocks (`bppsa.host`, "
                f"{c['repeats']} rounds); ×: time / tuned BPTT's (sequential forward, backward=\"bptt\", "
                "tuned unroll). "
                "With a parallel forward backward=\"bptt\" is the sequential scan of the same backward (the "
                "bppsa_seq column's program). auto = `forward=\"auto\", backward=\"auto\"`: the pair it resolves "
                "to, given that pair's time.", ""]
        summary, grid = [], []
        for r in record["steps"]:
            med = {k: v["median"] for k, v in r["times"].items()}
            base = med[r["tuned_bptt"]]
            its = {f: (r["info"].get(f"{f}/bppsa") or {}).get("iterations") for f in ("newton", "quasi")}
            summary.append([r["cell"], r["I"], r["H"], r["T"], r["B"], f"{1e3 * base:.2f}",
                            f"{r['fastest']} {1e3 * med[r['fastest']]:.2f}", r["auto"],
                            f"{r['auto_over_fastest']:.2f}", its["newton"], its["quasi"]])
            for f in FORWARDS:
                cellv = []
                for b in BACKWARDS:
                    k, s = timed_pair(f, b), r["times"][timed_pair(f, b)]
                    cellv.append(f"{1e3 * s['median']:.2f} [{1e3 * s['min']:.2f}] ({s['median'] / base:.2f}×)"
                                 + (" =seq" if k != f"{f}/{b}" else ""))
                grid.append([f"{r['cell']} T={r['T']} B={r['B']}", f, *cellv])
        out += [markdown_table(["cell", "I", "H", "T", "B", "tuned BPTT ms", "fastest pair ms", "auto's choice",
                                "auto / fastest", "newton it.", "quasi it."], summary, align="lrrrrrllrrr"), "",
                markdown_table(["point", "forward", "bptt", "bppsa (blelloch)", "bppsa (sequential scan)"], grid,
                               align="lllll"), "", "=seq: the same program as the sequential-scan column.", ""]
    return "\n".join(out)


# ---- The task ----------------------------------------------------------------------------------

PARTS = ("iterations", "trained", "chaotic", "predictability", "steps")


def check(config) -> None:
    """The ranges of :func:`run`'s config (UsageError naming the key)."""
    require_choices(config, "parts", PARTS, many=True)
    for key in ("iter_B", "iter_H", "iter_I", "train_steps", "train_batch", "clips_per_class", "repeats"):
        require_int(config, key)
    require_choices(config, "forwards", options.KINDS, many=True)
    require_choices(config, "iter_scan", tuple(SCANS))
    for key in ("iter_T", "chaotic_T", "pred_T"):
        require_ints(config, key, allow_empty=False)
    require_choices(config, "pred_forwards", ("newton", "quasi", "elk"), many=True)
    for key in ("chaotic_rho", "learning_rate"):
        require_number(config, key)
    for key, rows, width in (("iter_cells", config.iter_cells, 2), ("step_points", config.step_points, 6)):
        for r in rows:
            if len(r) != width or r[0] not in CELLS or any(isinstance(v, bool) or not isinstance(v, int) or v < 1
                                                             for v in r[1:]):
                what = "kind, head" if width == 2 else "kind, head, I, H, T, B"
                raise UsageError(f"config.{key}: each row must be ({what})"
                                 f" with kind one of {sorted(CELLS)} and positive ints; got {tuple(r)!r}")


@checked_by(check)
def run(config, workdir: PathLike) -> dict:
    """Task of ``experiments/extensions/configs/parallel_step.py``: the parts in ``config.parts``."""
    check(config)
    parts = tuple(config.parts)
    record: dict = {"title": "The parallel forward: Newton iterations and the training step per forward × backward",
                    "config": config.to_dict()}
    t0, kept = time.perf_counter(), {}
    if "iterations" in parts:
        print("== iterations, random initialisation ==", flush=True)
        record["iterations"] = iterations(config)
    if "trained" in parts:
        print("== iterations, the IRMAS GRU before and after training ==", flush=True)
        record["trained"] = trained(config, workdir, keep=kept)
    if "predictability" in parts:  # after "trained": its weights are one of the cases
        print("== predicted against measured iterations ==", flush=True)
        rows = predictability(config, kept if "trained" in parts else None, {f.__name__: f for f in (
            iteration_row, make_cell, cell_label, long_inputs)})
        record["predictability"] = {"rows": rows, "fit": fit_of(rows)}
        plot(rows, entry(workdir, f"{config.name}_predictability.png"))
    if "chaotic" in parts:
        print(f"== chaotic RNN, spectral radius {config.chaotic_rho} ==", flush=True)
        record["chaotic"] = chaotic(config)
    if "steps" in parts:
        print("== training step, every forward x backward ==", flush=True)
        record["steps"] = step_times(config)
    record["mean_iterations"] = mean_iterations(record)
    record["wall_s"] = time.perf_counter() - t0
    record["provenance"] = provenance()
    save_json(entry(workdir, f"{config.name}.json"), record)
    entry(workdir, f"{config.name}.md").write_text(markdown(record))
    steps = record.get("steps", [])
    return {"mean_iterations": record["mean_iterations"],
            "auto_over_fastest_max": max((r["auto_over_fastest"] for r in steps), default=None),
            "auto": {f"{r['cell']} T={r['T']} B={r['B']}": r["auto"] for r in steps}}
