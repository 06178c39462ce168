"""Timing harness for BPPSA vs BPTT over the public API (``bppsa bench``; the experiments in
:mod:`experiments` build their sweeps from :func:`bench_point`).

Every timing here follows the one protocol of :mod:`bppsa.host` (compiled first, then
steady-state blocks of calls interleaved in a rotating order, medians with min and max).

Components (the paper's breakdown, Wang et al. 2020 §5)::

    forward          the ``lax.scan`` forward pass (shared by both methods)
    jacobian         transposed-Jacobian generation for all T steps (the paper's "FO"; for a
                     cell with diagonal structure, the RNN, only its factors (A, Wt))
    bppsa_backward   the scan alone (Blelloch by default) on precomputed Jacobians
    param_grads      the batched parameter-gradient contraction
    bppsa_backward_full  the whole BPPSA backward (jacobian + scan + contraction, one jit), i.e.
                     the backward function of ``jax.vjp`` of ``bppsa.rnn(..., backward="bppsa")``
    bptt_backward    the backward function of ``jax.vjp`` of ``bppsa.rnn(..., backward="bptt")``
                     (``lax.scan`` with the tuned unroll)
    step_bppsa, step_bptt  the timed training-step gradient (forward + backward w.r.t. the
                     parameters) of BPPSA and of tuned BPTT

Every backward, step and baseline here is of the one timed loss, :func:`experiments.gradient.loss` (a
fixed random readout of every step's hidden state): the backward functions are its
:func:`experiments.gradient.backward_functions`, the steps its :func:`experiments.gradient.gradient_functions`,
and the pieces (jacobian, scan, contraction) run on its cotangent.

Derived: ``speedup_backward = bptt_backward / bppsa_backward_full`` (what a user gains on the
backward pass), ``speedup_scan = bptt_backward / bppsa_backward`` (the paper's scan-only view)
and ``speedup_step = step_bptt / step_bppsa`` (the training-step gradient).
"""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp

from bppsa import cells
from bppsa.backward.pipeline import (
    root_and_offsets,
    scan_order,
    storage_inputs,
    stored_jacobians,
    stored_scan,
)
from bppsa.errors import UsageError
from bppsa.forward.inputs import validate_inputs
from bppsa.forward.sequential import forward_states
from bppsa.host import time_interleaved
from bppsa.plan.calibration import default_cost_model
from bppsa.plan.cost import CostModel
from bppsa.scan import scan as run_scan
from bppsa.scan.dense import blelloch_scan_stored, to_storage
from experiments import baselines as baselines_lib
from experiments import gradient
from experiments.tables import markdown_table

__all__ = ["time_components", "component_functions", "backward_times", "compiled_memory", "gradient_memory",
           "time_scans", "scan_inputs", "make_cell", "bench_point", "sweep_table", "table_cells", "save_record",
           "check_flags", "CELLS", "COMPONENTS", "TABLE_COLUMNS", "TABLE_HEADER"]

COMPONENTS = ("forward", "jacobian", "bppsa_backward", "param_grads", "bppsa_backward_full",
              "bptt_backward", "step_bppsa", "step_bptt")


def _bppsa_inputs(ss, s0, xs, ct):
    """Scan-order arrays, as :mod:`bppsa.backward.pipeline` builds them: (spr, xr, sr, v, ds)."""
    xr, sr, spr, ctr = scan_order(xs, ss, s0, ct)
    return (spr, xr, sr, *root_and_offsets(ctr))


def component_functions(cell, params, xs, h0, *, scan: str = "blelloch", seed: int = 0) -> dict:
    """The zero-argument, compiled-on-first-call functions :func:`time_components` times.

    {name: fn} for every name in :data:`COMPONENTS`, all of the one timed loss with the readout R
    (T, B, H) of :func:`experiments.gradient.readout` (``seed``).
    """
    xs = jnp.asarray(xs)
    s0 = validate_inputs(cell, params, xs, h0)
    T, B, _ = xs.shape
    R = gradient.readout(cell, T, B, xs.dtype, seed)
    ct = cell.flatten_state(gradient.out_cotangent(cell, R))  # (T, B, S): dL/d(flat states)

    fwd = jax.jit(lambda p, x, s: forward_states(cell, p, x, s))
    ss = jax.block_until_ready(fwd(params, xs, s0))

    spr, xr, sr, v, ds = jax.jit(_bppsa_inputs)(ss, s0, xs, ct)
    if scan == "blelloch":  # as bppsa.backward.pipeline does it: Jacobians generated in storage order
        # (for a cell with diagonal structure, its (A, Wt) factors: the matrices are never formed)
        spr_j, xr_j, sr_j, ds_j = jax.jit(storage_inputs)(spr, xr, sr, ds)
        scan_fn = jax.jit(lambda v, Ms, ds: stored_scan(v, Ms, ds, T))
        jac = jax.jit(lambda p, a, b, c: stored_jacobians(cell, p, a, b, c))
    else:
        spr_j, xr_j, sr_j, ds_j = spr, xr, sr, ds
        scan_fn = jax.jit(lambda v, Ms, ds: run_scan(v, Ms, ds, scan))
        jac = jax.jit(cell.transposed_jacobian)
    Ms = jax.block_until_ready(jac(params, spr_j, xr_j, sr_j))
    gs, _ = jax.block_until_ready(scan_fn(v, Ms, ds_j))
    pg = jax.jit(cell.param_grads)

    methods = {"bppsa": f"bppsa_{scan}", "bptt": "bptt"}
    bwd = gradient.backward_functions(cell, params, xs, h0, R, methods.values())
    step = gradient.gradient_functions(cell, params, xs, h0, R, methods.values())
    return {
        "forward": lambda: fwd(params, xs, s0),
        "jacobian": lambda: jac(params, spr_j, xr_j, sr_j),
        "bppsa_backward": lambda: scan_fn(v, Ms, ds_j),
        "param_grads": lambda: pg(params, spr, xr, sr, gs),
        "bppsa_backward_full": bwd[methods["bppsa"]],
        "bptt_backward": bwd["bptt"],
        "step_bppsa": step[methods["bppsa"]],
        "step_bptt": step["bptt"],
    }


def time_components(cell, params, xs, h0, *, scan: str = "blelloch", repeats: int = 5,
                    warmup: int = 1, seed: int = 0) -> dict:
    """Time the pieces of one BPPSA and one BPTT training-step gradient, interleaved in one process.

    Args:
      cell, params: a cell from :mod:`bppsa.cells` and its parameters.
      xs: (T, B, I) inputs; h0: (B, H) initial state (LSTM: (h0, c0)).
      scan: the BPPSA scan ("blelloch", "associative", "sequential").
      repeats, warmup: timed rounds and untimed warm-up calls (compilation is always excluded).
      seed: the readout of the one timed loss (:func:`experiments.gradient.readout`).

    Returns a dict with one entry per name in :data:`COMPONENTS`, each
    ``{"median", "min", "max", "repeats"}`` in seconds, plus ``speedup_backward``,
    ``speedup_scan`` and ``speedup_step`` (BPTT time / BPPSA time; > 1 means BPPSA is faster)
    and ``shape`` = {"T", "B", "I", "S", "dtype"}.
    """
    xs = jnp.asarray(xs)
    fns = component_functions(cell, params, xs, h0, scan=scan, seed=seed)
    out = time_interleaved(fns, repeats=repeats, warmup=warmup)
    med = {k: v["median"] for k, v in out.items()}
    out["speedup_backward"] = med["bptt_backward"] / med["bppsa_backward_full"]
    out["speedup_scan"] = med["bptt_backward"] / med["bppsa_backward"]
    out["speedup_step"] = med["step_bptt"] / med["step_bppsa"]
    T, B, I = xs.shape
    out["shape"] = {"T": T, "B": B, "I": I, "S": cell.state_size, "dtype": str(xs.dtype)}
    return out


def backward_times(cell, params, T: int, B: int, *, methods=("bptt", "bppsa"), scan: str | None = None,
                   repeats: int = 5, seed: int = 0, dtype=jnp.float32) -> dict[str, dict]:
    """Time the one timed gradient (:func:`experiments.gradient.gradient_fn`, forward included) of
    ``params`` for each backward ("bptt", "bppsa" with ``scan``, "auto"), interleaved.

    xs (T, B, I), h0 and the readout R (T, B, H) from :func:`experiments.gradient.problem` (``seed``).
    Returns {method: {median, min, max, repeats}}.
    """
    _, xs, h0, R = gradient.problem(cell, T, B, dtype=dtype, seed=seed)
    fns = {}
    for m in methods:
        if m == "bppsa":
            fns[m] = gradient.gradient_functions(cell, params, xs, h0, R, [f"bppsa_{scan or 'blelloch'}"])
        elif m in ("bptt", "auto"):
            fns[m] = gradient.gradient_functions(cell, params, xs, h0, R, [m],
                                                 **({"scan": scan} if m == "auto" else {}))
        else:
            raise ValueError(f"methods must name 'bptt', 'bppsa' or 'auto'; got {m!r}")
        fns[m] = next(iter(fns[m].values()))
    return time_interleaved(fns, repeats=repeats)


# --------------------------------------------------------------------------------------------
# Peak memory (XLA's compiled memory analysis) and the scan-variant comparison.
# --------------------------------------------------------------------------------------------

def compiled_memory(fn, *args) -> dict | None:
    """Bytes of a jitted ``fn(*args)`` from XLA's compiled memory analysis, or None if unavailable.

    ``peak`` = arguments + outputs + temporaries - aliased (an upper bound on what the program
    holds at once; XLA's buffer assignment reuses temporaries, so ``temp`` is already its peak).
    """
    try:
        m = jax.jit(fn).lower(*args).compile().memory_analysis()
    except Exception:  # noqa: BLE001 -- some backends do not implement it
        return None
    if m is None:
        return None
    rec = {k: int(getattr(m, f"{k}_size_in_bytes", 0) or 0) for k in ("argument", "output", "temp", "alias")}
    rec["peak"] = rec["argument"] + rec["output"] + rec["temp"] - rec["alias"]
    return rec


def gradient_memory(cell, params, xs, h0, *, scan: str = "blelloch", chunk_size: int | None = None,
                    seed: int = 0) -> dict:
    """Compiled peak memory (bytes) of the one timed gradient (:func:`experiments.gradient.gradient_fn`):
    {"bppsa": {...}, "bppsa_one_chunk": {...}, "bptt": {...}}; "bppsa" is the default
    (``chunk_size="auto"``), "bppsa_one_chunk" holds all T Jacobians. With ``chunk_size`` an
    extra entry ``"bppsa_chunked"`` for that chunk length. xs (T, B, I), h0 (B, H).
    """
    xs = jnp.asarray(xs)
    T, B, _ = xs.shape
    R = gradient.readout(cell, T, B, xs.dtype, seed)
    variants = [("bppsa", f"bppsa_{scan}", "auto"), ("bppsa_one_chunk", f"bppsa_{scan}", None), ("bptt", "bptt", None)]
    if chunk_size is not None:
        variants.append(("bppsa_chunked", f"bppsa_{scan}", chunk_size))
    return {name: compiled_memory(gradient.gradient_fn(cell, method,
                                                       **({} if method == "bptt" else {"chunk_size": cs})),
                                  params, xs, h0, R)
            for name, method, cs in variants}


def time_scans(v, Ms, ds=None, *, methods=("blelloch", "associative", "sequential"), repeats: int = 5,
               warmup: int = 1) -> dict:
    """The scan alone for each method on the same (v, Ms, ds), interleaved: {method: stats}."""
    fns = {}
    for m in methods:
        if m == "blelloch":  # as the backward runs it: elements already in storage order
            n = Ms.shape[0]
            st = jax.jit(lambda a: to_storage(a, n))
            args = (v, st(Ms), None if ds is None else st(ds))
            f = jax.jit(lambda v, M, d: blelloch_scan_stored(v, M, d, n))
        else:
            args = (v, Ms, ds)
            f = jax.jit(lambda v, M, d, m=m: run_scan(v, M, d, m))
        fns[m] = lambda f=f, args=args: f(*args)
    return time_interleaved(fns, repeats=repeats, warmup=warmup)


def scan_inputs(cell, params, xs, h0, *, seed: int = 0):
    """(v, Ms, ds) exactly as the BPPSA backward builds them for the one timed loss (readout ``seed``)."""
    xs = jnp.asarray(xs)
    s0 = validate_inputs(cell, params, xs, h0)
    R = gradient.readout(cell, xs.shape[0], xs.shape[1], xs.dtype, seed)
    ct = cell.flatten_state(gradient.out_cotangent(cell, R))

    @jax.jit
    def build(params, xs, s0, ct):
        ss = forward_states(cell, params, xs, s0)
        spr, xr, sr, v, ds = _bppsa_inputs(ss, s0, xs, ct)
        return v, cell.transposed_jacobian(params, spr, xr, sr), ds

    return build(params, xs, s0, ct)


# --------------------------------------------------------------------------------------------
# One point of a sweep, its table and `bppsa bench`.
# --------------------------------------------------------------------------------------------

CELLS = {"rnn": "RNN", "gru": "GRU", "lstm": "LSTM"}


def make_cell(kind: str, input_size: int, hidden_size: int):
    """The cell named ``kind`` ("rnn", "gru" or "lstm") of the given sizes."""
    if kind not in CELLS:
        raise ValueError(f"cell must be one of {sorted(CELLS)}; got {kind!r}")
    return getattr(cells, CELLS[kind])(input_size, hidden_size)


def bench_point(cell, T: int, B: int, *, scan: str = "blelloch", repeats: int = 5, warmup: int = 1,
                dtype=jnp.float32, seed: int = 0, scan_variants=("blelloch", "associative", "sequential"),
                max_scan_elements: int = 200_000, memory: bool = True, chunk_size: int | None = None,
                model: CostModel | None = None, baselines: bool | dict = True, log=print) -> dict:
    """One sweep point: components, speedups, scan variants, peak memory, and with ``baselines``
    every baseline (:func:`experiments.baselines.backward_baselines`: plain and unrolled lax.scan, tuned
    BPTT, BPPSA with each scan, cuDNN when torch has CUDA) with the `auto` choice (``model``, or
    :func:`bppsa.plan.calibration.default_cost_model` when None) and its time over the fastest method's; a
    dict for ``baselines`` is passed on to it as keywords (e.g. fewer ``unrolls``).

    Scan variants are timed only when T·B <= ``max_scan_elements`` (the associative scan is
    slow and memory hungry on a CPU); skipped variants are recorded as skipped. Parameters,
    inputs and the loss's readout: :func:`experiments.gradient.problem` (``seed``).
    """
    params, xs, h0, _ = gradient.problem(cell, T, B, dtype=dtype, seed=seed)
    rec = {"T": T, "B": B, "H": cell.hidden_size, "cell": type(cell).__name__, "scan": scan,
           "dtype": str(jnp.dtype(dtype))}
    t = time_components(cell, params, xs, h0, scan=scan, repeats=repeats, warmup=warmup, seed=seed)
    rec["components"] = {k: t[k] for k in COMPONENTS}
    for k in ("speedup_backward", "speedup_scan", "speedup_step"):
        rec[k] = t[k]
    rec["speedup_backward_min"] = t["bptt_backward"]["min"] / t["bppsa_backward_full"]["min"]
    rec["speedup_step_min"] = t["step_bptt"]["min"] / t["step_bppsa"]["min"]
    if scan_variants:
        if T * B <= max_scan_elements:
            v, Ms, ds = scan_inputs(cell, params, xs, h0, seed=seed)
            rec["scans"] = time_scans(v, Ms, ds, methods=scan_variants, repeats=repeats, warmup=warmup)
            del v, Ms, ds
        else:
            rec["scans"] = {"skipped": f"T*B = {T * B} > max_scan_elements = {max_scan_elements}"}
    if memory:
        rec["memory"] = gradient_memory(cell, params, xs, h0, scan=scan, chunk_size=chunk_size, seed=seed)
        rec["memory"]["jacobian_bytes"] = T * B * cell.state_size ** 2 * jnp.dtype(dtype).itemsize
    if baselines:  # every method timed together; auto = the method choose_backward runs, vs the fastest
        kw = {"max_scan_elements": max_scan_elements, **(baselines if isinstance(baselines, dict) else {})}
        b = rec["baselines"] = baselines_lib.backward_baselines(cell, params, xs, h0, repeats=repeats, model=model,
                                                                seed=seed, **kw)
        rec["auto"] = {"choice": b["auto"]["method"], "faster_measured": b["fastest"],
                       "slowdown_vs_best": b["auto"]["ratio_to_fastest"],
                       "predicted_s": m.predict(cell, T, B, dtype) if (m := model or default_cost_model()) else None}
    log(markdown_table(TABLE_COLUMNS, [table_cells(rec)]).splitlines()[-1])
    return rec


def _ms(x):
    return f"{1e3 * x:.2f}"


TABLE_COLUMNS = ("T", "B", "fwd ms", "FO (jac) ms", "scan ms", "contract ms", "BPPSA bwd ms", "BPTT bwd ms",
                 "bwd ×", "step BPPSA ms", "step BPTT ms", "step ×", "auto", "peak MB BPPSA / BPTT")
TABLE_HEADER = markdown_table(TABLE_COLUMNS, [])  # the header and separator lines, for logs


def table_cells(r) -> list:
    """One :func:`bench_point` record as the cells of a :data:`TABLE_COLUMNS` row."""
    c = {k: _ms(v["median"]) for k, v in r["components"].items()}
    auto = r.get("auto")
    mem = r.get("memory") or {}
    mb = lambda m: f"{m['peak'] / 2 ** 20:.1f}" if m else "?"
    return [r["T"], r["B"], c["forward"], c["jacobian"], c["bppsa_backward"], c["param_grads"],
            c["bppsa_backward_full"], c["bptt_backward"], f"{r['speedup_backward']:.2f}", c["step_bppsa"],
            c["step_bptt"], f"{r['speedup_step']:.2f}",
            f"{auto['choice']} ({auto['slowdown_vs_best']:.2f})" if auto else "-",
            f"{mb(mem.get('bppsa'))} / {mb(mem.get('bptt'))}" if mem else "-"]


def sweep_table(points, title: str = "") -> str:
    """The sweep as markdown tables (medians; × = BPTT time / BPPSA time, > 1: BPPSA faster)."""
    lines = [f"#### {title}", ""] if title else []
    lines.append(markdown_table(TABLE_COLUMNS, [table_cells(r) for r in points]))
    scans = [r for r in points if isinstance(r.get("scans"), dict) and "skipped" not in r["scans"]]
    if scans:
        methods = list(scans[0]["scans"])
        lines += ["", "Scan variants (the scan alone on the same Jacobians, formed as (T, B, S, S) matrices, "
                  "one chunk, median ms):", "",
                  markdown_table(["T", "B", *methods],
                                 [[r["T"], r["B"], *(_ms(r["scans"][m]["median"]) for m in methods)] for r in scans])]
    return "\n".join(lines) + "\n"


def save_record(record, outdir, name: str, command: str | None = None) -> list:
    """Write ``name``.json (with provenance) and ``name``.md (the tables) under ``outdir``; return the paths."""
    from experiments.provenance import provenance, save_json
    out = Path(outdir)
    out.mkdir(parents=True, exist_ok=True)
    record.setdefault("provenance", provenance(command))
    paths = [save_json(out / f"{name}.json", record)]
    md = [f"`{record['provenance']['command']}` — {record['provenance']['date']}, "
          f"{record['provenance']['backend']} / {record['provenance']['device_kind']} / "
          f"{record['provenance']['cpu']}, jax {record['provenance']['jax']}", "",
          *([f"Note: {record['note']}", ""] if record.get("note") else []),
          "Medians in ms; × = BPTT time / BPPSA time (> 1: BPPSA faster). Every time is of the one "
          "timed loss, `experiments.gradient.loss` (a fixed random readout of every step's hidden state). "
          "BPTT = `lax.scan` autodiff with the tuned unroll (`bppsa.plan.rules.bptt_unroll`). BPPSA bwd = the whole "
          "BPPSA backward as `bppsa.rnn` runs it by default (FO + scan + contraction, one jit; on "
          "CPU in chunks of at most 8 MiB of Jacobians, `chunk_size=\"auto\"`; the RNN's Jacobians "
          "are never formed: FO generates only their diagonal factors, and its chunks bound its "
          "first-level products instead); FO, scan and "
          "contract = those pieces on all T steps at once, so on CPU they can add up to more than "
          "the whole. step = the training-step gradient (forward + backward w.r.t. the parameters). "
          "auto = the cost model's choice (its time / the faster method's time). Peak MB from XLA's "
          "compiled memory analysis of the training-step gradient (default chunking).", ""]
    for sweep, pts in record["sweeps"].items():
        if pts:
            md.append(sweep_table(pts, sweep))
        if any(p.get("baselines") for p in pts):
            md += [f"Baselines, {sweep} (the same training-step gradient, forward included, median ms of "
                   "all methods interleaved; × = baseline time / BPPSA time, BPPSA = its fastest scan):",
                   "", baselines_lib.baseline_table(pts)]
    if record.get("skipped"):
        md.append("Skipped: " + ", ".join(f"T={s['T']} B={s['B']} ({s['why']})" for s in record["skipped"]) + "\n")
    (out / f"{name}.md").write_text("\n".join(md))
    paths.append(out / f"{name}.md")
    return paths


def _int_list(s: str, flag: str = "--T"):
    """``"10,100"`` -> [10, 100]; UsageError naming ``flag`` unless every item is an int >= 1."""
    try:
        vals = [int(x) for x in s.split(",") if x.strip()]
    except ValueError:
        vals = []
    if not vals or min(vals) < 1:
        raise UsageError(f"{flag} must be a comma-separated list of ints >= 1 (e.g. 100,1000); got {s!r}")
    return vals


def check_flags(a) -> tuple[list, list]:
    """``bppsa bench``'s flags, all checked before anything is timed: (Ts, Bs); UsageError naming the flag.
    (The work directory ``--out`` is the runner's to check, as for every run.)"""
    Ts, Bs = _int_list(a.T, "--T"), _int_list(a.B, "--B")
    for flag, value in (("--repeats", a.repeats), ("--hidden", a.hidden), ("--input", a.input)):
        if value < 1:
            raise UsageError(f"{flag} must be an int >= 1; got {value}")
    if not a.name or a.name in (".", "..") or any(c in a.name for c in "/\\\0"):
        raise UsageError(f"--name must be a plain file name (it names <out>/<name>.json and .md); got {a.name!r}")
    return Ts, Bs
