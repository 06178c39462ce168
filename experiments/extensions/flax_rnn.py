"""``nnx.RNN`` vs ``bppsa.nn.RNN`` in flax (the task of experiments/extensions/configs/flax_rnn.py):
two parts (``config.parts``), written into one ``<name>``.json (with provenance) and ``<name>``.md.

``step``: a flax classifier's training step. The model is the one a flax user writes: a recurrent
layer over a flax cell and a linear head on the final carry; only the layer's class differs
(:data:`LAYERS`: ``nnx.RNN`` and ``bppsa.nn.RNN`` with a ``backward``). One training step =
forward + backward + Adam update, one ``nnx.jit``. Measured on one core in child processes
(:func:`step_child`), all layers in one process and each layer in processes of its own, with
compile seconds and the spread of the ratios (:func:`step_rows`). Rows in the record's ``"rows"``.

``cells``: flax's four cells (:data:`FLAX_CELLS`), one training step's gradient, with and without
``seq_lengths``. For each cell and shape (T, B, I, H) the same cell (the same Params) is driven by
each layer of :data:`CELL_LAYERS`::

    nnx.RNN     nnx.RNN(cell) (flax's scan, unroll 1; gradients by autodiff through it)
    bppsa       bppsa.nn.RNN(cell, backward="bppsa")
    auto        bppsa.nn.RNN(cell, backward="auto"): its choice is Options.resolve's for
                the cell bppsa runs (bppsa.nn.cells.adapt) at this T, B, float32
    identity    bppsa.nn.RNN(cell, backward="bppsa", padding="identity") (rows with
                seq_lengths only: padded steps are identity maps, the scan stops at max(seq_lengths))

The timed step is ``jax.jit`` over the module's split state of ``nnx.value_and_grad`` (w.r.t.
the cell's ``nnx.Param``s) of ``experiments.gradient``'s loss with padded steps masked,
L = Σ_{b,t < len_b} ⟨y[b, t], R[b, t]⟩, y (B, T, H) the layer's outputs, R (B, T, H) ~ N(0, 1)
fixed; seq_lengths (B,) uniform in [T/2, T] ("yes" rows) or None ("no"; then the mask is all
ones). Before timing, every layer's outputs (at valid steps) are checked against ``nnx.RNN``'s
(allclose, rtol 1e-4) and its gradient's largest difference from ``nnx.RNN``'s, relative to the
largest entry, is recorded (and must be < 1e-3). Times: :func:`bppsa.host.time_interleaved`
(all layers of a row interleaved in rotated blocks, the compile dropped), median ms. Rows in the
record's ``"cells"`` (with the rounds, the part's wall time and the load average).
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from bppsa import nn
from bppsa.errors import UsageError, checked_by, require_choices, require_int
from bppsa.host import time_interleaved
from bppsa.nn import RNN
from bppsa.nn import cells as flax_cells
from bppsa.plan.options import Options
from experiments import entry
from experiments.provenance import provenance, save_json
from experiments.tables import markdown_table
from experiments.train import make_train_step

__all__ = ["PARTS", "LAYERS", "CELLS", "STEP_MODES", "FLAX_CELLS", "CELL_LAYERS", "make_step", "step_child",
           "step_rows", "loss", "grad_step", "auto_choice", "cell_point", "cell_rows", "check_flax_rnn", "run",
           "markdown", "loss_gap"]

PARTS = ("step", "cells")

# ---------------------------------------------------------------- part "step": a classifier's training step

#: The layers compared: name -> constructor of the recurrent layer from a flax cell.
LAYERS = {
    "nnx.RNN": nnx.RNN,
    "auto": functools.partial(RNN, backward="auto"),
    "bptt": functools.partial(RNN, backward="bptt"),
    "bppsa": functools.partial(RNN, backward="bppsa"),
}
CELLS = {"simple": nnx.SimpleCell, "gru": nnx.GRUCell, "lstm": nnx.LSTMCell, "olstm": nnx.OptimizedLSTMCell}
STEP_MODES = ("one", "separate")


class _Classifier(nnx.Module):
    def __init__(self, layer, cell, hidden_size, num_classes, *, rngs):
        self.rnn = layer(cell)
        self.head = nnx.Linear(hidden_size, num_classes, rngs=rngs)

    def __call__(self, x):
        carry, _ = self.rnn(x, return_carry=True)
        return self.head(carry[1] if isinstance(carry, tuple) else carry)


def make_step(layer, kind, input_size, hidden_size, num_classes, seed=0, learning_rate=1e-3):
    """A training step ``step(x, y) -> (loss, accuracy)`` (x (B, T, I) float32, y (B,) ints) of a
    fresh classifier with ``layer``: the one training step of :func:`experiments.train.make_train_step`
    (``nnx.jit`` of value_and_grad of the cross-entropy + Adam), the model and optimizer bound by
    ``nnx.cached_partial`` (no graph traversal per call)."""
    rngs = nnx.Rngs(seed)
    model = _Classifier(layer, CELLS[kind](input_size, hidden_size, rngs=rngs), hidden_size, num_classes, rngs=rngs)
    optimizer = nnx.Optimizer(model, optax.adam(learning_rate), wrt=nnx.Param)
    return nnx.cached_partial(make_train_step(), model, optimizer)


def step_child(o: dict) -> dict:
    """One process's measurement (run by :func:`step_rows` in a child pinned to one core, XLA
    single-threaded): the layers ``o["layers"]`` at the row ``o["row"]`` ((kind, I, H, T, B,
    classes)), each a fresh classifier from the same seed. Returns per layer the compile seconds
    (the first call), the losses of the first ``o["check_steps"]`` steps and the per-round medians
    (``o["rounds"]`` rotated rounds of ``block`` timed calls after one untimed: ``o["block"]``, or as many
    as fill ``o["min_block_s"]`` seconds at the slowest layer's check-step time where that is more;
    returned)."""
    kind, I, H, T, B, classes = o["row"]
    rng = np.random.default_rng(o["seed"])
    x = jnp.asarray(rng.standard_normal((B, T, I)), jnp.float32)
    y = jnp.asarray(rng.integers(0, classes, B), jnp.int32)
    jax.block_until_ready(jax.jit(lambda a: a * 2)(x))  # JAX's own first-use costs, paid by no layer
    steps, compile_s, losses, call_s = {}, {}, {}, 0.0
    for name in o["layers"]:
        step = make_step(LAYERS[name], kind, I, H, classes, o["seed"])
        t0 = time.perf_counter()
        first = float(jax.block_until_ready(step(x, y))[0])
        compile_s[name] = time.perf_counter() - t0
        losses[name] = [first]
        for _ in range(o["check_steps"] - 1):
            t0 = time.perf_counter()
            losses[name].append(float(step(x, y)[0]))
            call_s = max(call_s, time.perf_counter() - t0)
        steps[name] = functools.partial(step, x, y)
    block = max(o["block"], int(np.ceil(o.get("min_block_s", 0.0) / call_s)) if call_s > 0 else 0)
    names, rounds = list(steps), {name: [] for name in steps}
    for r in range(o["rounds"]):
        for name in names[r % len(names):] + names[:r % len(names)]:
            jax.block_until_ready(steps[name]())
            samples = []
            for _ in range(block):
                t0 = time.perf_counter()
                jax.block_until_ready(steps[name]())
                samples.append(time.perf_counter() - t0)
            rounds[name].append(float(np.median(samples)))
    return {"compile_s": compile_s, "losses": losses, "rounds": rounds, "block": block}


_STEP_CHILD = ("import json, os, sys; o = json.loads(sys.argv[1]); os.sched_setaffinity(0, {o['core']}); "
               "from experiments.extensions.flax_rnn import step_child; print('RESULT ' + json.dumps(step_child(o)))")


def _child(o: dict) -> dict:
    env = dict(os.environ, XLA_FLAGS=(os.environ.get("XLA_FLAGS", "")
                                      + " --xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1").strip())
    out = subprocess.run([sys.executable, "-c", _STEP_CHILD, json.dumps(o)], env=env, check=True,
                         capture_output=True, text=True).stdout
    return json.loads(next(line for line in out.splitlines() if line.startswith("RESULT "))[7:])


def _spread(values) -> list[float]:
    return [float(np.min(values)), float(np.max(values))]


def step_rows(config) -> list[dict]:
    """Part "step": each of ``config.shapes`` ((kind, I, H, T, B, classes) rows), the layers of
    ``config.layers`` (the first is the reference), measured on one core (``config.core``) in each
    of ``config.step_modes``: "one" = all layers in one process (interleaved rounds); "separate" =
    each layer in a process of its own, ``config.separate_rounds`` processes per layer (what a user
    who switches sees). Per layer: median ms, compile s, and the ratio to the reference with its
    spread ([min, max] of the per-round ratios in "one", of the per-process ratios in "separate");
    the largest loss difference from the reference over the first steps (the same training run)."""
    rows = []
    ref = config.layers[0]
    for shape in config.shapes:
        o = {"row": list(shape), "seed": config.seed, "check_steps": config.check_steps, "core": config.core,
             "rounds": config.repeats, "block": config.block, "min_block_s": float(config.get("min_block_s", 0.0))}
        row: dict = {"cell": shape[0], "I": shape[1], "H": shape[2], "T": shape[3], "B": shape[4],
                     "classes": shape[5]}
        for mode in config.step_modes:
            if mode == "one":
                got = _child(dict(o, layers=list(config.layers)))
                per = {n: got["rounds"][n] for n in config.layers}
                compile_s, losses, blocks = got["compile_s"], got["losses"], [got["block"]]
            else:
                names, per, compile_s, losses, blocks = list(config.layers), {n: [] for n in config.layers}, {}, {}, []
                comp: dict = {n: [] for n in names}
                for k in range(config.separate_rounds):
                    for n in names[k % len(names):] + names[:k % len(names)]:
                        got = _child(dict(o, layers=[n], rounds=max(1, config.repeats // 2)))
                        per[n].append(float(np.median(got["rounds"][n])))
                        comp[n].append(got["compile_s"][n])
                        losses[n], blocks = got["losses"][n], blocks + [got["block"]]
                compile_s = {n: float(np.median(v)) for n, v in comp.items()}
            ratios = {n: (np.asarray(per[n]) / np.asarray(per[ref])).tolist() for n in config.layers}
            gap = loss_gap(losses, ref)
            row[mode] = {"median_s": {n: float(np.median(v)) for n, v in per.items()}, "samples_s": per,
                         "compile_s": compile_s, "block": blocks,
                         "ratio": {n: float(np.median(per[n]) / np.median(per[ref])) for n in config.layers},
                         "ratio_spread": {n: _spread(r) for n, r in ratios.items()}, "max_loss_diff": gap}
        rows.append(row)
        print(_step_table([row], config.layers, config.step_modes).splitlines()[-1], flush=True)
    return rows


def loss_gap(losses: dict, ref: str) -> float | None:
    """The largest ``|loss - the reference layer's loss|`` over the other layers' first steps (None: no other layer)."""
    others = [n for n in losses if n != ref]
    return max((float(np.max(np.abs(np.asarray(losses[n]) - np.asarray(losses[ref])))) for n in others), default=None)


def _step_table(rows, layers, modes) -> str:
    ref = layers[0]
    cols = ["cell", "T", "B", "I", "H"]
    for mode in modes:
        cols += [f"{n} ms ({mode})" for n in layers]
        cols += [f"{n} / {ref} ({mode})" for n in layers[1:]]
        cols += [f"compile s ({mode})"]
    cols += ["max loss diff"]
    out = []
    for r in rows:
        cells = [r["cell"], r["T"], r["B"], r["I"], r["H"]]
        for mode in modes:
            m = r[mode]
            cells += [f"{1e3 * m['median_s'][n]:.2f}" for n in layers]
            cells += [f"{m['ratio'][n]:.2f} [{m['ratio_spread'][n][0]:.2f}, {m['ratio_spread'][n][1]:.2f}]"
                      for n in layers[1:]]
            cells += [" / ".join(f"{m['compile_s'][n]:.1f}" for n in layers)]
        gaps = [r[mode]["max_loss_diff"] for mode in modes if r[mode]["max_loss_diff"] is not None]
        cells += [f"{max(gaps):.1e}" if gaps else "—"]
        out.append(cells)
    return markdown_table(cols, out, align="l" + "r" * (len(cols) - 1))


# ---------------------------------------------------------------- part "cells": flax's four cells, one gradient

FLAX_CELLS = {"SimpleCell": nnx.SimpleCell, "GRUCell": nnx.GRUCell, "LSTMCell": nnx.LSTMCell,
              "OptimizedLSTMCell": nnx.OptimizedLSTMCell}
CELL_LAYERS = {
    "nnx.RNN": lambda cell: nnx.RNN(cell),
    "bppsa": lambda cell: nn.RNN(cell, backward="bppsa"),
    "auto": lambda cell: nn.RNN(cell, backward="auto"),
    "identity": lambda cell: nn.RNN(cell, backward="bppsa", padding="identity"),
}
RTOL, GRAD_TOL = 1e-4, 1e-3


def loss(model, x, lengths, mask, R):
    """experiments.gradient's loss over valid steps: x (B, T, I), lengths (B,) or None, mask (B, T),
    R (B, T, H) -> (loss, masked outputs (B, T, H))."""
    y = model(x, seq_lengths=lengths) * mask[..., None]
    return jnp.vdot(y, R), y


def grad_step(layer, x, lengths, mask, R):
    """A zero-argument callable: the jitted ``((loss, masked outputs), ∂loss/∂Params)`` of
    ``layer`` on these arrays (the outputs come back for the check; they are computed anyway)."""
    graphdef, state = nnx.split(layer)

    @jax.jit
    def step(state, x, lengths, mask, R):
        return nnx.value_and_grad(loss, has_aux=True)(nnx.merge(graphdef, state), x, lengths, mask, R)

    return functools.partial(step, state, x, lengths, mask, R)


def auto_choice(cell, T, B, I) -> str:
    """What ``backward="auto"`` runs for this flax cell at (T, B), float32: "bptt" or "bppsa:<scan>"."""
    opts = Options(backward="auto").resolve(flax_cells.adapt(cell, None, I), T, B, jnp.float32)
    return "bptt" if opts.backward == "bptt" else f"bppsa:{opts.scan}"


def _rel(a, ref) -> float:
    a, ref = (np.concatenate([np.ravel(np.asarray(v, np.float64)) for v in jax.tree.leaves(t)]) for t in (a, ref))
    return float(np.max(np.abs(a - ref)) / np.max(np.abs(ref)))


def cell_point(kind, T, B, I, H, ragged, *, repeats, seed=0):
    """One row: every layer's step over the same ``kind`` cell at (T, B, I, H), checked, then timed."""
    rng = np.random.default_rng(seed)
    x = jnp.asarray(rng.standard_normal((B, T, I)), jnp.float32)
    R = jnp.asarray(rng.standard_normal((B, T, H)), jnp.float32)
    lengths = jnp.asarray(rng.integers(T // 2, T + 1, B), jnp.int32) if ragged else None
    mask = (jnp.arange(T)[None, :] < (jnp.full((B,), T) if lengths is None else lengths)[:, None]).astype(jnp.float32)
    cell = FLAX_CELLS[kind](I, H, rngs=nnx.Rngs(seed))
    names = [n for n in CELL_LAYERS if ragged or n != "identity"]
    layers = {n: CELL_LAYERS[n](cell) for n in names}
    fns, ys, grads, compile_s = {}, {}, {}, {}
    for n, layer in layers.items():
        fns[n] = grad_step(layer, x, lengths, mask, R)
        t0 = time.perf_counter()
        (_, ys[n]), grads[n] = jax.block_until_ready(fns[n]())  # compiles
        compile_s[n] = time.perf_counter() - t0
        np.testing.assert_allclose(np.asarray(ys[n]), np.asarray(ys["nnx.RNN"]), rtol=RTOL, atol=1e-6,
                                   err_msg=f"{kind} T={T} B={B} seq_lengths={ragged}: {n}'s outputs vs nnx.RNN's")
    grad_diff = {n: _rel(grads[n], grads["nnx.RNN"]) for n in names if n != "nnx.RNN"}
    bad = {n: d for n, d in grad_diff.items() if not d < GRAD_TOL}
    if bad:
        raise AssertionError(f"{kind} T={T} B={B}: gradients differ from nnx.RNN's by {bad} (max |Δ| / max |g|), "
                             f"expected < {GRAD_TOL}")
    times = time_interleaved(fns, repeats=repeats, warmup=0)
    return {"cell": kind, "seq_lengths": ragged, "T": T, "B": B, "I": I, "H": H,
            "lengths": None if lengths is None else np.asarray(lengths).tolist(),
            "auto_choice": auto_choice(cell, T, B, I), "times": times, "compile_s": compile_s,
            "grad_rel_diff": grad_diff}


def _loadavg() -> str:
    return " ".join(f"{v:.2f}" for v in os.getloadavg())


def cell_rows(config) -> dict:
    """Part "cells": for each of ``config.cells_shapes`` ((T, B, I, H)), each of ``config.cells_kinds``
    and seq_lengths no / yes, :func:`cell_point` with ``config.cells_repeats`` rounds; returns
    ``{"rows", "repeats", "wall_s", "loadavg": {"start", "end"}}``."""
    load_start, start, rows = _loadavg(), time.perf_counter(), []
    for T, B, I, H in config.cells_shapes:
        for kind in config.cells_kinds:
            for ragged in (False, True):
                rows.append(cell_point(kind, T, B, I, H, ragged, repeats=config.cells_repeats, seed=config.cells_seed))
                print(_cells_table(rows[-1:]).splitlines()[-1] if rows[1:] else _cells_table(rows), flush=True)
    return {"rows": rows, "repeats": config.cells_repeats, "wall_s": time.perf_counter() - start,
            "loadavg": {"start": load_start, "end": _loadavg()}}


def _ms(r, n):
    return f"{1e3 * r['times'][n]['median']:.2f}" if n in r["times"] else "—"


def _ratio(r, n):
    return f"{r['times']['nnx.RNN']['median'] / r['times'][n]['median']:.2f}x" if n in r["times"] else "—"


_CELL_COLUMNS = ["cell", "seq_lengths", "T", "B", "I", "H", "nnx.RNN ms", "bppsa ms", "auto ms", "auto chose",
                 "identity ms", "nnx.RNN / bppsa", "nnx.RNN / auto", "nnx.RNN / identity",
                 "compile s (nnx.RNN / bppsa / auto / identity)", "compile bppsa / auto", "max grad diff"]


def _compile(r) -> list[str]:
    c = r["compile_s"]
    return [" / ".join(f"{c[n]:.1f}" if n in c else "—" for n in ("nnx.RNN", "bppsa", "auto", "identity")),
            f"{c['bppsa'] / c['auto']:.1f}" if "bppsa" in c and "auto" in c else "—"]


def _cells_table(rows) -> str:
    return markdown_table(_CELL_COLUMNS, [[r["cell"], "yes" if r["seq_lengths"] else "no", r["T"], r["B"], r["I"],
                                           r["H"], _ms(r, "nnx.RNN"), _ms(r, "bppsa"), _ms(r, "auto"),
                                           r["auto_choice"], _ms(r, "identity"), _ratio(r, "bppsa"),
                                           _ratio(r, "auto"), _ratio(r, "identity"), *_compile(r),
                                           f"{max(r['grad_rel_diff'].values()):.1e}"] for r in rows],
                          align="ll" + "r" * 7 + "l" + "r" * 7)


# ---------------------------------------------------------------- the task

def _shape_rows(config, key: str, what: str, first: int = 0) -> None:
    """``config.<key>`` must be a non-empty list of rows of ``what``'s width, ints >= 1 from ``first`` on."""
    rows, width = config[key], len(what.split(","))
    ok = isinstance(rows, (list, tuple)) and len(rows) > 0 and all(
        isinstance(r, (list, tuple)) and len(r) == width
        and all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in r[first:]) for r in rows)
    if not ok:
        raise UsageError(f"config.{key} must be a non-empty list of {what} rows (ints >= 1); got {rows!r}")


def check_flax_rnn(config) -> None:
    """The ranges of :func:`run`'s config (UsageError naming the key)."""
    parts = require_choices(config, "parts", PARTS, many=True)
    if "step" in parts:
        _shape_rows(config, "shapes", "(kind, I, H, T, B, classes)", first=1)
        bad = [s[0] for s in config.shapes if s[0] not in CELLS]
        if bad:
            raise UsageError(f"config.shapes: cell kind must be one of {sorted(CELLS)}; got {bad!r}")
        require_choices(config, "layers", tuple(LAYERS), many=True)
        require_choices(config, "step_modes", STEP_MODES, many=True)
        for key in ("repeats", "check_steps", "block", "separate_rounds"):
            require_int(config, key)
        if not (isinstance(m := config.get("min_block_s", 0.0), (int, float)) and 0 <= m <= 60):
            raise UsageError(f"config.min_block_s must be seconds in [0, 60]; got {m!r}")
        require_int(config, "core", 0)
        if config.core not in os.sched_getaffinity(0):
            raise UsageError(f"config.core must be a core this process may run on, one of "
                             f"{sorted(os.sched_getaffinity(0))}; got {config.core}")
    if "cells" in parts:
        _shape_rows(config, "cells_shapes", "(T, B, I, H)")
        require_choices(config, "cells_kinds", tuple(FLAX_CELLS), many=True)
        require_int(config, "cells_repeats")
        require_int(config, "cells_seed", 0)
    require_int(config, "seed", 0)


@checked_by(check_flax_rnn)
def run(config, workdir) -> dict:
    """Task of ``experiments/extensions/configs/flax_rnn.py``: the parts in ``config.parts``, one
    record ``<name>``.json (+ ``.md``); returns the median ms of each layer per row."""
    check_flax_rnn(config)
    parts = tuple(config.parts)
    start, load_start = time.perf_counter(), _loadavg()
    record: dict = {"title": "nnx.RNN vs bppsa.nn.RNN in flax: a classifier's training step and flax's four cells",
                    "config": config.to_dict(), "parts": list(parts)}
    summary = {}
    if "step" in parts:
        record["rows"] = step_rows(config)
        summary["step"] = {f"{r['cell']} T={r['T']} B={r['B']} {m}": r[m]["median_s"]
                           for r in record["rows"] for m in config.step_modes}
    if "cells" in parts:
        record["cells"] = cell_rows(config)
        summary["cells"] = {f"{r['cell']} T={r['T']} B={r['B']} seq_lengths={'yes' if r['seq_lengths'] else 'no'}":
                            {n: t["median"] for n, t in r["times"].items()} for r in record["cells"]["rows"]}
    record.update(wall_s=time.perf_counter() - start, loadavg={"start": load_start, "end": _loadavg()},
                  provenance=provenance())
    save_json(entry(workdir, f"{config.name}.json"), record)
    entry(workdir, f"{config.name}.md").write_text(markdown(record))
    return summary


_STEP_LAYERS = ("nnx.RNN = `nnx.RNN(cell)`; auto, bptt, bppsa = `bppsa.nn.RNN(cell, backward=...)`.")


def markdown(record) -> str:
    p, c = record["provenance"], record["config"]
    lines = [
        f"# {record['title']}", "",
        f"`{p['command']}` — {p['date']}, {p['backend']} / {p['device_kind']} / {p['cpu']} ({p['cpu_count']} cores), "
        f"jax {p['jax']}, jaxlib {p['jaxlib']}, flax {p['flax']}, commit {(p.get('git_commit') or '?')[:7]}, "
        f"{record['wall_s'] / 60:.1f} min, load average (1, 5, 15 min) {record['loadavg']['start']} at the start, "
        f"{record['loadavg']['end']} at the end", ""]
    if "rows" in record:
        lines += [
            "## A flax classifier's training step", "",
            "One training step (forward + backward + Adam, one `nnx.jit`) of a flax classifier: the recurrent "
            "layer over the flax cell, a linear head on the final carry, float32; " + _STEP_LAYERS + " One core "
            f"(core {c['core']}, XLA single-threaded), each measurement in a child process. \"one\": all layers "
            f"in one process, {c['repeats']} rotated rounds of {c['block']} timed calls, or as many as fill "
            f"{c.get('min_block_s', 0.0)} s where that is more (median per round); "
            f"\"separate\": each layer in its own process, {c['separate_rounds']} processes per layer. ms: "
            "median; ratio = layer time / nnx.RNN time (< 1: faster than nnx.RNN), [min, max] over the rounds "
            "(one) or the processes (separate); compile s: the first call (the layers in column order). Max loss "
            "diff: the largest difference of the first steps' training losses from nnx.RNN's (the same run).",
            "", _step_table(record["rows"], c["layers"], c["step_modes"]), ""]
    if "cells" in record:
        cells = record["cells"]
        lines += [
            "## flax's cells: training-step gradient times", "",
            "One training step's gradient: `jax.jit` of `nnx.value_and_grad` w.r.t. the cell's Params of "
            "`experiments.gradient`'s loss with padded steps masked (Σ over valid steps of ⟨output, R⟩, R fixed "
            "N(0, 1)), float32, the same cell (same Params) in every layer. seq_lengths \"yes\": uniform in [T/2, T]. "
            "nnx.RNN = `nnx.RNN(cell)`; bppsa = `bppsa.nn.RNN(cell, backward=\"bppsa\")`; auto = "
            "`backward=\"auto\"` (its choice: `Options.resolve` for the adapted cell); identity = "
            "`backward=\"bppsa\", padding=\"identity\"`. "
            f"Median ms over {cells['repeats']} interleaved rotated rounds (`bppsa.host`); the machine is "
            "shared, so read the ratios (> 1: bppsa.nn.RNN faster). Outputs equal nnx.RNN's (allclose, rtol "
            "1e-4) in every row; max grad diff: the largest |g − g_nnx.RNN| / max |g_nnx.RNN| over the bppsa layers. "
            "compile s: each layer's first call (compile and one run; this process, the layers in column order), "
            "and bppsa's over auto's (auto: BPTT here, the training step BPPSA is an alternative to). "
            f"This part: {cells['wall_s'] / 60:.1f} min, load average {cells['loadavg']['start']} at its start, "
            f"{cells['loadavg']['end']} at its end.",
            "", _cells_table(cells["rows"]), ""]
    return "\n".join(lines)
