"""The device-machine run: BPPSA against every baseline on one GPU and on 16 CPU cores. ::

    python -m experiments.paper_bppsa.gpu_run OUT [--dry-run]      (experiments/gpu/run.sh OUT)

Made for the machine this project is sometimes lent (one H200, 16 CPU cores, Python with jax,
flax, optax, numpy and torch; no ml_collections, librosa, soundfile or ray, and nothing is
installed): it imports none of those four. Under 8 minutes in all; every part has its own time
budget and every point is written the moment it is measured, so a run cut short still leaves
what it did::

    OUT/points.jsonl    one JSON record per point (or skipped point), appended
    OUT/summary.json    {"provenance": {...}, "points": [...], "skipped": [...]}, rewritten
                        atomically after every point

Parts: ``gpu`` -- the paper's RNN T sweep at B = 16 (to T = 30 000) and B sweep at T = 1000,
the IRMAS GRU shapes (3 settings x 3 batch sizes, synthetic inputs of those shapes) and the
precision check (:func:`experiments.gradient.gradient_errors` against float64 per ``precision=``
setting); ``cpu16`` -- in a subprocess on XLA CPU: RNN points at a few sizes and
sequence-parallel BPPSA over 1-16 host devices (:func:`experiments.extensions.scaling.measure`);
``parallel`` -- the parallel (Newton) forward: the jitted training step (value_and_grad) with
forward sequential / newton / quasi (:func:`experiments.extensions.parallel_step.measure_pairs`, Newton
iterations recorded) for an RNN T sweep to T = 100 000, the IRMAS GRU shapes and BlockGRU(H = 256)
with heads of 1 and 16, next to the roofline's and the forward cost model's predictions. The
other parts' times are the one timed training-step gradient of :mod:`experiments.gradient` (forward + backward
of a fixed random readout of every step), the methods built by
:func:`experiments.baselines.baseline_functions` and timed by :func:`bppsa.host.time_interleaved`::

    bptt_plain        autodiff through a plain ``lax.scan``
    bptt_unrolled     the best of ``lax.scan(..., unroll=u)``, u in :data:`bppsa.plan.rules.UNROLLS` ("best_unroll")
    bptt              ``bppsa.rnn(..., backward="bptt")`` (tuned BPTT: the unroll bppsa picks)
    bppsa_blelloch    bppsa.rnn, Blelloch scan, full float32 products
    bppsa_sequential  bppsa.rnn, sequential scan over the precomputed Jacobians
    cudnn             torch nn.RNN / nn.GRU forward + backward on CUDA (when torch and CUDA are there)
    bppsa_fused       bppsa_blelloch with ``kernels=`` the fused Pallas kernels (:mod:`bppsa.kernels`)
    bptt_fused        bptt with ``kernels=`` the fused kernels (a variant the kernels do not cover yet
                      is a reason in the point's ``errors``, never a lost point)

Where the time goes (:func:`measure_detail`, at the plan's ``detail_T``, ``detail_B`` and
``detail_irmas_B`` points, most wanted first, where the budget allows it): ``backward_ms`` (the
pullback alone), ``forward_ms`` (the forward alone) and ``launches`` (kernels per training step,
:mod:`experiments.paper_bppsa.launches`), keyed by the columns above. At the ``parallel`` part's
structured points also "newton/bppsa fused", and at BlockGRU heads of 1 pararnn-torch's fused
Triton Newton step (:mod:`experiments.paper_bppsa.pararnn_gpu`, from the wheel carried in
experiments/gpu/wheels) as ``ms["pararnn_torch_fused"]``. Every fused column is set against its
predicted time (:func:`fused_predictions`: the committed machine-code records
``experiments/results/gpu/machine_code.json`` and ``pararnn_machine_code.json``, read by point name and
pair) in the point's ``predicted_fused`` and the log's last table, measured / predicted on a GPU only.

``--dry-run`` (or BPPSA_ALLOW_CPU=1) runs tiny sizes on the CPU in about two minutes.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np

from bppsa import backprop, cells, host
from bppsa.plan.cost import forward_seconds
from bppsa.plan.options import PRECISIONS
from bppsa.plan.rules import UNROLLS
from experiments import baselines, gradient
from experiments.data.irmas import SHAPES as IRMAS_SHAPES
from experiments.extensions import parallel_step, roofline, scaling
from experiments.paper_bppsa import launches
from experiments.provenance import provenance, save_json

__all__ = ["BLOCKED", "PARALLEL_POINTS", "PARALLEL_PAIRS", "MACHINE_CODE", "PEER_MACHINE_CODE", "FUSED_PAIRS",
           "machine_code_point", "fused_predictions", "fused_table", "plan", "Summary", "Budget", "sweep",
           "measure_point", "run_gpu", "run_parallel", "run_cpu16", "main"]

BLOCKED = ("ml_collections", "librosa", "soundfile", "ray")  # absent on the device machine
H = 20  # hidden size of every paper model


def _fused() -> str:
    """The fused kernels' option (bppsa.kernels): compiled on the GPU; the dry run on a CPU interprets them."""
    return "pallas" if jax.default_backend() == "gpu" else "interpret"


def plan(dry: bool) -> dict:
    """Sizes and time budgets (seconds) of a full run, or of the tiny dry run."""
    if dry:
        return dict(T_sweep=(12,), B_sweep=(3,), B_sweep_T=12, irmas=(("s", 16),), irmas_T=8, precision_T=(16,),
                    detail_T=(12,), detail_B=(), detail_irmas_B=(),
                    unrolls=(1, 4), repeats=1, cpu16_points=((12, 2),), cpu16_devices=(1, 2),
                    cpu16_device_count=2, scaling=(16, 2),
                    parallel=(("T", "rnn", 1, 1, H, 12, 3), ("structured", "blockgru", 1, 4, 8, 16, 2),
                              ("structured", "blockgru", 2, 4, 8, 16, 2)),
                    budgets={"gpu/T": 25, "gpu/B": 7, "gpu/irmas": 7, "gpu/precision": 10, "parallel": 40, "cpu16": 20},
                    total=115)
    return dict(T_sweep=(30000, 1000, 10000, 100, 3000, 10), B_sweep=(2, 256, 16, 64, 4, 128, 8, 32), B_sweep_T=1000,
                irmas=tuple((s, b) for s in IRMAS_SHAPES for b in (16, 32, 64)), irmas_T=None,
                # backward alone, forward alone, launches (measure_detail), most wanted first, where the budget allows
                detail_T=(30000, 1000, 10000), detail_B=(2, 256), detail_irmas_B=(16,),
                precision_T=(1000, 10000, 30000), unrolls=UNROLLS, repeats=3,
                cpu16_points=((1000, 16), (10000, 16), (1000, 64)), cpu16_devices=(1, 2, 4, 8, 16),
                cpu16_device_count=16, scaling=(10000, 16),
                parallel=PARALLEL_POINTS,
                budgets={"gpu/T": 100, "gpu/B": 45, "gpu/irmas": 45, "gpu/precision": 45, "parallel": 90,
                         "cpu16": 105},
                total=450)


#: Part ``parallel``, most wanted first: (sweep, cell kind, head size, I, H, T, B).
_irmas = lambda s: ("irmas", "gru", 1, IRMAS_SHAPES[s][0], H, IRMAS_SHAPES[s][1], 16)
PARALLEL_POINTS = (("T", "rnn", 1, 1, H, 10000, 16), _irmas("m"), ("structured", "blockgru", 1, 64, 256, 4096, 16),
                   ("structured", "blockgru", 16, 64, 256, 4096, 16), ("T", "rnn", 1, 1, H, 100000, 16),
                   ("T", "rnn", 1, 1, H, 1000, 16), _irmas("s"), _irmas("l"), ("T", "rnn", 1, 1, H, 100, 16),
                   ("T", "rnn", 1, 1, H, 30000, 16))
PARALLEL_PAIRS = ("sequential/bptt", "sequential/bppsa", "newton/bppsa", "quasi/bppsa")
#: At the structured points: newton/bppsa with the fused kernels (the fused scan of the Newton solve).
PARALLEL_FUSED = "newton/bppsa fused"
#: At the structured points of head size 1: pararnn-torch's fused Triton Newton step (its diagonal GRU).
PARARNN = "pararnn_torch_fused"
PARARNN_TIMEOUT = 90  # seconds: torch's import, Triton's first compile of pararnn's kernels, the timing

#: The machine-code check's records (``experiments.gpu.machine_code``, ``experiments.gpu.peer_machine_code``):
#: each fused kernel's predicted time, read by :func:`fused_predictions` (file reads, nothing compiled).
MACHINE_CODE = Path(__file__).resolve().parents[1] / "results" / "gpu" / "machine_code.json"
PEER_MACHINE_CODE = MACHINE_CODE.with_name("pararnn_machine_code.json")
#: The fused columns and the (forward/backward) pair the machine-code check compiles for each.
FUSED_PAIRS = {"bppsa_fused": "sequential/bppsa", "bptt_fused": "sequential/bptt", PARALLEL_FUSED: "newton/bppsa"}
#: Our kernels that run once a Newton iteration (the others once a training step).
NEWTON_KERNELS = ("newton._reduce", "newton._carry", "newton._apply")


def machine_code_point(part: str, sweep: str, kind: str, T: int, B: int, H: int, *, setting: str | None = None,
                       head: int = 1) -> str:
    """The name of a point of this script in the machine-code check (``experiments.gpu.machine_code.points``
    names its points with this).

    Args:
      part, sweep: the point's part ("gpu", "parallel") and sweep ("T", "B", "irmas", "structured").
      kind: the cell's kind ("rnn", "gru", "blockgru", ...; a class name is lower-cased).
      T, B, H: sequence length, batch, hidden size.
      setting: the IRMAS setting ("s", "m", "l").
      head: a structured cell's head size.
    """
    kind = kind.lower()
    if part == "gpu" and sweep == "T":
        return f"gpu/T {kind} T={T}"
    if part == "gpu" and sweep == "B":
        return f"gpu/B {kind} B={B}"
    if part == "gpu" and sweep == "irmas":
        return f"gpu/irmas {kind} {setting} B={B}"
    return f"parallel {kind} head={head} H={H}"


def _full_plan_sizes() -> dict[str, dict[str, int]]:
    """{machine_code_point name: {"T", "B", "H"}} of the full run's points with fused columns."""
    full, out = plan(False), {}
    for T in full["T_sweep"]:
        out[machine_code_point("gpu", "T", "rnn", T, 16, H)] = {"T": T, "B": 16, "H": H}
    for B in full["B_sweep"]:
        out[machine_code_point("gpu", "B", "rnn", full["B_sweep_T"], B, H)] = {"T": full["B_sweep_T"], "B": B, "H": H}
    for setting, B in full["irmas"]:
        T = IRMAS_SHAPES[setting][1]
        out[machine_code_point("gpu", "irmas", "gru", T, B, H, setting=setting)] = {"T": T, "B": B, "H": H}
    for sweep_, kind, head, _I, Hs, T, B in full["parallel"]:
        out[machine_code_point("parallel", sweep_, kind, T, B, Hs, head=head)] = {"T": T, "B": B, "H": Hs}
    return out


def _load(path: Path) -> dict | None:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


def fused_predictions(point: dict, ours: dict | None, peer: dict | None = None, *, on_gpu: bool) -> dict:
    """Measured and predicted ms of each fused column of a point: ours from the machine-code
    record's launches of the point's name (:func:`machine_code_point`) and the column's pair
    (:data:`FUSED_PAIRS`), the Newton kernels (:data:`NEWTON_KERNELS`) times the iterations the
    point's fused pair ran; pararnn-torch's (:data:`PARARNN`) from ``pararnn_machine_code.json``:
    its forward (init + 3 iterations) against its measured ``forward_ms``.

    Args:
      point: a record of this script (``part``, ``sweep``, ``cell``/``kind``, ``T``, ``B``, ``H``, ``ms``).
      ours, peer: the records of :data:`MACHINE_CODE` and :data:`PEER_MACHINE_CODE` (None: absent).
      on_gpu: whether ``ms`` was measured on a GPU; else ``ratio`` is None (CPU times, interpreted kernels).

    Returns:
      {column: {"measured_ms", "predicted_ms" (None: not in the record), "ratio" (measured /
      predicted), "what", "point"}} for the fused columns the point has.
    """
    ms = point.get("ms") or {}
    if point.get("part") not in ("gpu", "parallel"):  # cpu16: XLA on the CPU, no GPU kernel to predict
        return {}
    kind = point.get("kind") or str(point.get("cell", "")).split(" ")[0]
    name = machine_code_point(point.get("part", ""), str(point.get("sweep", "")), kind, point.get("T", 0),
                              point.get("B", 0), point.get("H", 0), setting=point.get("setting"),
                              head=point.get("head_size", 1))
    # the sizes the check compiled under this name: its record's, else the full plan's (a dry run's IRMAS
    # point has the full point's name at another T)
    sizes = {q["name"]: q for q in (ours or {}).get("points", [])} or _full_plan_sizes()
    same = name in sizes and all(sizes[name].get(k) == point.get(k) for k in ("T", "B", "H"))
    out = {}
    for col, pair in FUSED_PAIRS.items():
        if col not in ms:
            continue
        xs = [x for x in (ours or {}).get("launches", []) if x["point"] == name and x["pair"] == pair] if same else []
        pred, what = None, "the fused kernels of the training step"
        if xs and all(x.get("predicted") for x in xs):
            its = ((point.get("newton") or {}).get(col) or {}).get("iterations")
            newton = sum(x["predicted"]["us"] for x in xs if x["label"] in NEWTON_KERNELS)
            rest = sum(x["predicted"]["us"] for x in xs if x["label"] not in NEWTON_KERNELS)
            if newton and its is None:
                xs = []
            else:
                pred = (rest + newton * (its or 0)) / 1e3
                if newton:
                    what += f", the Newton kernels x {its} iterations"
        out[col] = {"measured_ms": ms[col], "predicted_ms": pred, "what": what, "point": name}
    if PARARNN in ms and peer:
        rec = point.get("pararnn") or {}
        q = next((x for x in peer.get("points", []) if x["name"] == name and x["T"] == point.get("T")
                  and x["B"] == point.get("B") and x["H"] == point.get("H")), None)
        pred = q["forward"]["pararnn_us"] / 1e3 if q and q["forward"].get("pararnn_us") else None
        iters = rec.get("iters")
        if pred is not None and q is not None and iters not in (None, 3):  # priced at 3 iterations: scale
            it_ms = q["pararnn"]["us_per_iteration"] / 1e3
            pred += (iters - 3) * it_ms
        out[PARARNN] = {"measured_ms": rec.get("forward_ms"), "predicted_ms": pred, "point": name,
                        "what": "pararnn-torch's forward alone (init + its Newton iterations)"}
    for v in out.values():
        m, p = v["measured_ms"], v["predicted_ms"]
        v["ratio"] = m / p if on_gpu and m and p else None
    return out


def _with_predictions(point: dict) -> dict:
    """``point`` with ``predicted_fused`` (:func:`fused_predictions`) where it has fused columns."""
    ms = point.get("ms") or {}
    if not (set(FUSED_PAIRS) | {PARARNN}) & set(ms):
        return point
    on_gpu = jax.default_backend() in ("gpu", "cuda")
    got = fused_predictions(point, _load(MACHINE_CODE), _load(PEER_MACHINE_CODE), on_gpu=on_gpu)
    if got:
        point["predicted_fused"] = got
    return point


class Summary:
    """Appends each record to OUT/points.jsonl and rewrites OUT/summary.json atomically."""

    def __init__(self, out):
        self.out = Path(out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.lines = self.out / "points.jsonl"

    def set_provenance(self, part: str, record: dict):
        (self.out / f"provenance-{part}.json").write_text(json.dumps(record, indent=2, default=str) + "\n")
        self.write()

    def add(self, point: dict | None = None, *, skipped: dict | None = None):
        with open(self.lines, "a") as f:
            f.write(json.dumps({"point": point} if point is not None else {"skipped": skipped}, default=float) + "\n")
            f.flush()
        self.write()

    def write(self) -> dict:
        records = [json.loads(line) for line in self.lines.read_text().splitlines() if line.strip()] \
            if self.lines.exists() else []
        prov = {}
        for part in ("gpu", "cpu16"):
            p = self.out / f"provenance-{part}.json"
            if p.exists():
                prov[part] = json.loads(p.read_text())
        top = dict(prov.get("gpu") or prov.get("cpu16") or {})
        top["parts"] = prov
        summary = {"provenance": top, "points": [r["point"] for r in records if "point" in r],
                   "skipped": [r["skipped"] for r in records if "skipped" in r]}
        save_json(self.out / "summary.json", summary)  # the harness's one result writer (atomic)
        return summary


class Budget:
    """A part's time budget: a point is started only when the previous point's time, scaled by
    the square root of the work ratio (compiling, which does not grow with T·B, is much of a
    point's time), still fits before the part's (or the whole run's) end."""

    def __init__(self, seconds: float, deadline: float):
        self.end = min(time.monotonic() + seconds, deadline)
        self.last = None  # (work, seconds)

    def allows(self, work: float) -> bool:
        left = self.end - time.monotonic()
        if left <= 0:
            return False
        if self.last is None:
            return True
        w, s = self.last
        return s * max((work / w) ** 0.5, 0.3) <= left

    def record(self, work: float, seconds: float):
        self.last = (work, seconds)


def _peak_mb():
    stats = jax.devices()[0].memory_stats()
    return None if not stats or "peak_bytes_in_use" not in stats else stats["peak_bytes_in_use"] / 2 ** 20


def _error(e: BaseException) -> str:
    return f"{type(e).__name__}: {str(e)[:200]}"


#: The columns timed with the fused kernels (bppsa.kernels): name -> the method of experiments.gradient.
FUSED = {"bppsa_fused": "bppsa_blelloch", "bptt_fused": "bptt"}
#: The methods of the backward-alone, forward-alone and launch measurements: column -> (method, fused).
DETAIL = {"bptt_plain": ("bptt_unroll1", False), "bptt": ("bptt", False), "bppsa_blelloch": ("bppsa_blelloch", False),
          "bppsa_fused": ("bppsa_blelloch", True), "bptt_fused": ("bptt", True)}
FORWARD_DETAIL = ("bptt_plain", "bppsa_blelloch", "bppsa_fused")  # lax.scan, bppsa's sequential forward xla / fused


def _ready(fns: dict, errors: dict, prefix: str) -> dict:
    """The functions of ``fns`` whose first call (the compile) succeeds; a failure costs its column
    only and is recorded in ``errors`` under ``prefix + name``."""
    ok = {}
    for name, fn in fns.items():
        try:
            jax.block_until_ready(fn())
            ok[name] = fn
        except Exception as e:  # noqa: BLE001 -- a missing kernel variant (UsageError) or a failed compile
            errors[prefix + name] = _error(e)
    return ok


def measure_detail(cell, params, xs, h0, R, steps: dict, *, repeats: int, cudnn_parts: dict | None = None) -> dict:
    """Where a training step's time goes: the backward alone, the forward alone, and the kernels launched.

    Args:
      cell, params, xs, h0, R: the point's problem (:func:`experiments.gradient.problem`).
      steps: ``{column: zero-argument training-step gradient}`` as timed (their launches are counted
        from the programs already compiled; cudnn has none).
      repeats: rounds of :func:`bppsa.host.time_interleaved`.
      cudnn_parts: :func:`experiments.gradient.cudnn_parts` or None.

    Returns:
      ``{"backward_ms": {column: median ms}, "forward_ms": {...}, "launches": {column:
      launches.count's dict}, "errors": {"backward/" | "forward/" | "launches/" + column: message}}``.
      Backward alone: the pullback (``jax.vjp``'s function at ∂L/∂out, the forward run once
      outside the timing; :func:`experiments.gradient.backward_functions`), for bppsa its
      Jacobians, scan and parameter gradients; cuDNN: ``loss.backward(retain_graph=True)``.
      Forward alone: the jitted forward (``lax.scan``; ``bppsa.rnn``'s sequential forward, XLA or
      fused); cuDNN: the forward with autograd recording.
    """
    errors: dict = {}
    bwd: dict = {}
    for col, (method, fused) in DETAIL.items():
        try:
            opts = {"kernels": _fused()} if fused else {}
            bwd[col] = gradient.backward_functions(cell, params, xs, h0, R, [method], **opts)[method]
        except Exception as e:  # noqa: BLE001 -- the forward run by jax.vjp failed: this column only
            errors["backward/" + col] = _error(e)
    fwd: dict = {}
    for col in FORWARD_DETAIL:
        method, fused = DETAIL[col]
        fwd[col] = gradient.forward_functions(cell, params, xs, h0, [method],
                                              **({"kernels": _fused()} if fused else {}))[method]
    if cudnn_parts is not None:
        bwd["cudnn"], fwd["cudnn"] = cudnn_parts["backward"], cudnn_parts["forward"]
    out: dict = {"backward_ms": {}, "forward_ms": {}, "launches": {}, "errors": errors}
    for key, fns in (("backward_ms", bwd), ("forward_ms", fwd)):
        ok = _ready(fns, errors, key.split("_")[0] + "/")
        if ok:
            st = host.time_interleaved(ok, repeats=repeats, warmup=1, block=2)
            out[key] = {k: v["median"] * 1e3 for k, v in st.items()}
    for col, fn in steps.items():
        if col == "cudnn":
            continue
        try:
            out["launches"][col] = launches.count(fn)
        except Exception as e:  # noqa: BLE001 -- an HLO text this parser does not know costs the count only
            errors["launches/" + col] = _error(e)
    return out


def measure_point(part: str, cell, T: int, B: int, *, unrolls, repeats, cudnn=False, extra=None,
                  detail: bool = False) -> dict:
    """One point: every method interleaved; ms are medians of one training-step gradient.

    Args:
      part: the part's name ("gpu", "cpu16").
      cell: the cell (RNN or GRU, hidden size :data:`H`).
      T, B: sequence length and batch size.
      unrolls: the unrolls of ``lax.scan`` tried (bptt_unrolled: the fastest).
      repeats: rounds of :func:`bppsa.host.time_interleaved`.
      cudnn: time torch's cuDNN too (where torch sees CUDA).
      extra: keys added to the record.
      detail: also :func:`measure_detail` (backward alone, forward alone, launches).

    Returns:
      The point's record: ``ms`` by column (those of the module docstring, plus bppsa_fused and
      bptt_fused where the fused kernels run this problem), ``best_unroll``, ``ms_by_unroll``,
      ``spread_ms``, ``peak_mb``; with ``detail`` ``backward_ms``, ``forward_ms``, ``launches``;
      ``fused_error`` (bppsa_fused) and ``errors`` ({column: message}) for the columns that failed.
    """
    params, xs, h0, R = gradient.problem(cell, T, B)
    fns = baselines.baseline_functions(cell, params, xs, h0, scans=("blelloch", "sequential"), unrolls=unrolls,
                                       cudnn=False)
    kind = type(cell).__name__
    cudnn_error, parts = None, None
    if cudnn:
        try:  # a torch failure costs the cuDNN column, not the point
            parts = gradient.cudnn_parts(cell, xs, R) if detail else None
            fn = parts["step"] if parts is not None else gradient.cudnn_function(cell, xs, R)
            if fn is not None:
                fn()
                fns["cudnn"] = fn
        except Exception as e:  # noqa: BLE001
            cudnn_error, parts = _error(e), None
    errors: dict = {}
    fused = {col: gradient.gradient_functions(cell, params, xs, h0, R, [m], kernels=_fused())[m]
             for col, m in FUSED.items()}
    # the fused forward (bppsa.kernels) with the Blelloch backward, and tuned BPTT with the fused kernels
    # (its adjoint loop); a kernel variant not there yet (UsageError) costs its column only
    fns.update(_ready(fused, errors, ""))
    fused_error = errors.pop("bppsa_fused", None)
    st = host.time_interleaved(fns, repeats=repeats, warmup=1, block=2)
    ms = {k: v["median"] * 1e3 for k, v in st.items()}
    spread = {k: [v["min"] * 1e3, v["max"] * 1e3] for k, v in st.items()}
    best = min(unrolls, key=lambda u: ms[f"bptt_unroll{u}"])
    # the names of every table (experiments.baselines): bptt = tuned BPTT, bptt_plain = the plain scan
    out_ms = {"bptt_plain": ms["bptt_unroll1"], "bptt_unrolled": ms[f"bptt_unroll{best}"], "bptt": ms["bptt"],
              "bppsa_blelloch": ms["bppsa_blelloch"], "bppsa_sequential": ms["bppsa_sequential"]}
    out_ms.update({k: ms[k] for k in ("cudnn", *FUSED) if k in ms})
    more: dict = {}
    if detail:
        steps = {col: fns[name] for col, name in (("bptt_plain", "bptt_unroll1"), ("bptt", "bptt"),
                                                  ("bppsa_blelloch", "bppsa_blelloch"), *((c, c) for c in FUSED))
                 if name in fns}
        d = measure_detail(cell, params, xs, h0, R, steps, repeats=repeats, cudnn_parts=parts)
        errors.update(d.pop("errors"))
        more.update(d)
    return {"part": part, "cell": kind, "T": T, "B": B, "H": H, "I": cell.input_size, "ms": out_ms,
            "best_unroll": best, "ms_by_unroll": {u: ms[f"bptt_unroll{u}"] for u in unrolls},
            "spread_ms": spread, "repeats": repeats, "peak_mb": _peak_mb(), "grad_rel_err": {}, **more,
            **({"cudnn_error": cudnn_error} if cudnn_error else {}),
            **({"fused_error": fused_error} if fused_error else {}), **({"errors": errors} if errors else {}),
            **(extra or {})}


#: A point's detail (:func:`measure_detail`) taken as this many times its work: about twice its time
#: by :class:`Budget`'s square-root rule (a second compile of every method, two more timings).
DETAIL_WORK = 4


def sweep(summary: "Summary", budget: "Budget", points, measure) -> None:
    """Measure ``points`` in order while the budget allows; a point asking for ``detail`` gets it
    only where the budget allows :data:`DETAIL_WORK` times its work.

    Args:
      summary: where each point (or skipped point) is written as it finishes.
      budget: the sweep's time budget.
      points: [(label, work, kwargs)]: the point's label, its work in the budget's units, and the
        keyword arguments of ``measure``.
      measure: ``measure(**kwargs) -> dict``, one point's record.
    """
    for label, work, kw in points:
        if not budget.allows(work):
            summary.add(skipped={**label, "reason": "time budget"})
            print(f"  skipped {label}: time budget", flush=True)
            continue
        dropped = bool(kw.get("detail")) and not budget.allows(work * DETAIL_WORK)
        if dropped:
            kw = {**kw, "detail": False}
        t0 = time.monotonic()
        try:
            point = _with_predictions(measure(**kw))
            if dropped:
                point["detail_skipped"] = "time budget"
        except Exception as e:  # noqa: BLE001 -- one failed point must not lose the run
            summary.add(skipped={**label, "reason": f"{type(e).__name__}: {str(e)[:300]}"})
            print(f"  failed {label}: {type(e).__name__}: {e}", flush=True)
            continue
        budget.record(work, time.monotonic() - t0)
        summary.add(point)
        print(f"  {label}: " + ", ".join(f"{k} {v:.3g}" for k, v in point.get("ms", {}).items())
              + (f" grad_rel_err {point['grad_rel_err']}" if point.get("grad_rel_err") else ""), flush=True)
        for key in ("backward_ms", "forward_ms"):
            if point.get(key):
                print(f"    {key}: " + ", ".join(f"{k} {v:.3g}" for k, v in point[key].items()), flush=True)
        if point.get("launches"):
            print("    launches: " + ", ".join(f"{k} {v['total']}" + ("" if v["exact"] else "+")
                                          for k, v in point["launches"].items()), flush=True)
        if point.get("errors"):
            print(f"    column errors: {sorted(point['errors'])}", flush=True)
        if point.get("predicted_fused"):
            print("    fused kernels, measured / predicted ms: " + "; ".join(
                f"{k} {_fmt(v)}" for k, v in point["predicted_fused"].items()), flush=True)


GPU_SWEEPS = ("gpu/T", "gpu/B", "gpu/irmas", "gpu/precision")


def run_gpu(summary: Summary, pl: dict, deadline: float, only: str | None = None):
    """Part ``gpu``: the T and B sweeps (RNN 1 -> 20), the IRMAS GRU shapes, the precision check;
    ``only`` (one of :data:`GPU_SWEEPS`) runs that sweep alone."""
    rnn = cells.RNN(input_size=1, hidden_size=H)
    common = dict(unrolls=pl["unrolls"], repeats=pl["repeats"], cudnn=True)

    def rnn_point(sweep, T, B, detail=False):
        return measure_point("gpu", rnn, T, B, extra={"sweep": sweep}, detail=detail, **common)

    parts = [
        ("gpu/T", [({"part": "gpu", "sweep": "T", "T": T, "B": 16}, T * 16,
                    dict(sweep="T", T=T, B=16, detail=T in pl["detail_T"])) for T in pl["T_sweep"]], rnn_point),
        ("gpu/B", [({"part": "gpu", "sweep": "B", "T": pl["B_sweep_T"], "B": B}, pl["B_sweep_T"] * B,
                    dict(sweep="B", T=pl["B_sweep_T"], B=B, detail=B in pl["detail_B"])) for B in pl["B_sweep"]],
         rnn_point),
    ]

    def irmas_point(setting, B, detail=False):
        I, T = IRMAS_SHAPES[setting]
        T = pl["irmas_T"] or T
        return measure_point("gpu", cells.GRU(input_size=I, hidden_size=H), T, B,
                             extra={"sweep": "irmas", "setting": setting}, detail=detail, **common)

    parts.append(("gpu/irmas", [({"part": "gpu", "sweep": "irmas", "setting": s, "B": B},
                                 IRMAS_SHAPES[s][1] * B * 3, dict(setting=s, B=B, detail=B in pl["detail_irmas_B"]))
                                for s, B in pl["irmas"]], irmas_point))

    def precision_point(T):
        params, xs, h0, R = gradient.problem(rnn, T, 16)
        fns = {prec: gradient.gradient_functions(rnn, params, xs, h0, R, ["bppsa_blelloch"], precision=prec)
               ["bppsa_blelloch"] for prec in PRECISIONS}
        st = host.time_interleaved(fns, repeats=pl["repeats"], warmup=1, block=2)
        variants = {f"bppsa:{p}": ("bppsa_blelloch", {"precision": p}) for p in PRECISIONS}
        variants.update({f"bptt:{p}": ("bptt_unroll1", {"matmul_precision": p}) for p in ("default", "highest")})
        x64 = bool(jax.config.read("jax_enable_x64"))
        jax.config.update("jax_enable_x64", True)  # the float64 reference, for this point only
        try:
            errors = gradient.gradient_errors(rnn, T, 16, variants)
        finally:  # the parts after this one time float32 programs as a user runs them, x64 off
            jax.config.update("jax_enable_x64", x64)
        return {"part": "gpu", "sweep": "precision", "cell": "RNN", "T": T, "B": 16, "H": H, "I": 1,
                "ms": {}, "bppsa_ms_by_precision": {k: v["median"] * 1e3 for k, v in st.items()},
                "best_unroll": None, "peak_mb": _peak_mb(), "grad_rel_err": errors}

    parts.append(("gpu/precision", [({"part": "gpu", "sweep": "precision", "T": T, "B": 16}, T * 16 * 4,
                                     dict(T=T)) for T in pl["precision_T"]], precision_point))
    end = time.monotonic()  # each sweep ends where the budgets so far add up to: one's slack is the next's
    for name, points, measure in parts:
        if only is not None and name != only:
            continue
        end = max(end, time.monotonic()) + pl["budgets"][name]  # an overrun is not the next sweep's loss
        print(f"{name}: {len(points)} points, budget {pl['budgets'][name]} s", flush=True)
        sweep(summary, Budget(end - time.monotonic(), deadline), points, measure)


def measure_pairs_fused(cell, T: int, B: int, *, repeats: int, seed: int = 0) -> tuple[dict, dict]:
    """:func:`experiments.extensions.parallel_step.measure_pairs` of :data:`PARALLEL_PAIRS` plus
    :data:`PARALLEL_FUSED` (``forward="newton", backward="bppsa", kernels=`` the fused kernels),
    all timed in one interleaved call.

    Args:
      cell: the cell.
      T, B: sequence length and batch size.
      repeats: rounds of :func:`bppsa.host.time_interleaved`.
      seed: :func:`experiments.gradient.problem`'s seed.

    Returns:
      ``(measure_pairs' record, {PARALLEL_FUSED: message} where the fused pair failed, else {})``.
    """
    params, xs, h0, R = gradient.problem(cell, T, B, seed=seed)
    fns = parallel_step.step_functions(cell, params, xs, h0, R, PARALLEL_PAIRS)

    def loss(p, x, h, r):
        out, info = backprop.rnn(cell, p, x, h, return_info=True, forward="newton", backward="bppsa", scan="blelloch",
                                 kernels=_fused())  # parallel_step.BACKWARDS["bppsa"], fused
        return gradient.loss(cell, out, r), info

    fns[PARALLEL_FUSED] = functools.partial(jax.jit(jax.value_and_grad(loss, has_aux=True)), params, xs, h0, R)
    first, errors = {}, {}
    for name, fn in fns.items():  # compiles; the warm-up
        try:
            first[name] = jax.block_until_ready(fn())
        except Exception as e:  # noqa: BLE001 -- only the fused pair may fail (a kernel not there yet)
            if name != PARALLEL_FUSED:
                raise
            errors[name] = _error(e)
    fns = {k: v for k, v in fns.items() if k in first}
    losses = {name: float(v[0][0]) for name, v in first.items()}
    times = host.time_interleaved(fns, repeats=repeats, warmup=0, block=2)
    info = {name: None if v[0][1] is None else {k: np.asarray(x).item() for k, x in v[0][1]._asdict().items()}
            for name, v in first.items()}
    return {"times": times, "info": info, "loss_diff": max(losses.values()) - min(losses.values())}, errors


def pararnn_point(I: int, Hs: int, T: int, B: int, *, repeats: int, seconds: float) -> dict:
    """pararnn-torch's fused Newton step at this shape (:mod:`experiments.paper_bppsa.pararnn_gpu`),
    in a subprocess given ``seconds`` at most.

    Args:
      I, Hs, T, B: the shape (the diagonal GRU I -> Hs, sequence length, batch).
      repeats: timed calls.
      seconds: the subprocess's time limit.

    Returns:
      pararnn_gpu's record, or ``{"skipped": reason}`` (no GPU: the dry run; no time; a failure).
    """
    if jax.default_backend() not in ("gpu", "cuda"):
        return {"skipped": f"no CUDA device (JAX backend {jax.default_backend()}): pararnn-torch's fused "
                           "Newton step is CUDA/Triton only"}
    if seconds < 15:
        return {"skipped": "time budget"}
    cmd = [sys.executable, "-m", "experiments.paper_bppsa.pararnn_gpu", "--I", str(I), "--H", str(Hs), "--T", str(T),
           "--B", str(B), "--repeats", str(repeats)]
    try:
        root = Path(__file__).resolve().parents[2]  # the child imports experiments.* wherever this was started
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds, cwd=root,
                           env={**os.environ, "PYTHONPATH": os.pathsep.join(
                               [str(root), *filter(None, [os.environ.get("PYTHONPATH")])])})
    except subprocess.TimeoutExpired:
        return {"skipped": f"timed out after {seconds:.0f} s"}
    lines = r.stdout.strip().splitlines()
    try:
        return json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        return {"skipped": f"exit {r.returncode}: {r.stderr.strip()[-300:]}"}


def run_parallel(summary: Summary, pl: dict, deadline: float):
    """Part ``parallel``: the training step per forward (:data:`PARALLEL_PAIRS`; sequential/bptt is
    tuned BPTT) at :data:`PARALLEL_POINTS`, Newton iterations, and the predictions: the roofline's
    (RNN/GRU, sequential forward) and :func:`bppsa.plan.cost.forward_seconds`' (the forward alone).
    At the structured points also :data:`PARALLEL_FUSED`, and at those of head size 1 :data:`PARARNN`
    (``ms[PARARNN]``, its record under ``pararnn``); a failed column is a reason in ``errors``."""
    def measure(sweep, kind, head, I, Hs, T, B):
        cell = parallel_step.make_cell(kind, I, Hs, head)
        errors, more = {}, {}
        if sweep == "structured":
            m, errors = measure_pairs_fused(cell, T, B, repeats=pl["repeats"])
        else:
            m = parallel_step.measure_pairs(cell, T, B, PARALLEL_PAIRS, repeats=pl["repeats"])
        pred = {f"forward_model/{f}": forward_seconds(cell, T, B, f, "gpu") * 1e3 for f in parallel_step.FORWARDS}
        if kind in ("rnn", "gru"):
            r = roofline.predict(kind.upper(), T, B, I, Hs)
            pred.update({"roofline/sequential/bptt_plain": r["bptt_plain"] * 1e3,
                         "roofline/sequential/bppsa_blelloch": r["bppsa_blelloch"] * 1e3})
        ms = {k: v["median"] * 1e3 for k, v in m["times"].items()}
        if sweep == "structured" and kind == "blockgru" and head == 1:
            rec = pararnn_point(I, Hs, T, B, repeats=pl["repeats"],
                                seconds=min(PARARNN_TIMEOUT, deadline - time.monotonic() - 5))
            if "ms" in rec:
                ms[PARARNN] = rec["ms"]
                more["pararnn"] = rec
            else:
                errors[PARARNN] = rec.get("skipped", "no record")
        return {"part": "parallel", "sweep": sweep, "cell": parallel_step.cell_label(kind, head), "kind": kind,
                "T": T, "B": B,
                "H": Hs, "I": I, "head_size": head, "ms": ms,
                "spread_ms": {k: [v["min"] * 1e3, v["max"] * 1e3] for k, v in m["times"].items()},
                "newton": {k: v for k, v in m["info"].items() if v is not None}, "loss_diff": m["loss_diff"],
                "auto": parallel_step.auto_pair(cell, T, B), "predicted_ms": pred, "best_unroll": None,
                "repeats": pl["repeats"], "peak_mb": _peak_mb(), "grad_rel_err": {}, **more,
                **({"errors": errors} if errors else {})}

    keys = ("sweep", "kind", "head", "I", "Hs", "T", "B")
    points = [({"part": "parallel", "sweep": p[0], "cell": p[1], "head_size": p[2], "T": p[5], "B": p[6]},
               p[4] * p[5] * p[6], dict(zip(keys, p))) for p in pl["parallel"]]
    print(f"parallel: {len(points)} points, budget {pl['budgets']['parallel']} s", flush=True)
    sweep(summary, Budget(deadline - time.monotonic(), deadline), points, measure)  # all that is left before cpu16


def run_cpu16(summary: Summary, pl: dict, deadline: float):
    """Part ``cpu16`` (run in its own process on XLA CPU with the host devices): RNN points, then
    sequence-parallel BPPSA (bppsa.parallel) over 1, 2, 4, ... host devices."""
    rnn = cells.RNN(input_size=1, hidden_size=H)
    budget = Budget(0.55 * pl["budgets"]["cpu16"], deadline)  # the rest is the scaling's
    sweep(summary, budget, [({"part": "cpu16", "T": T, "B": B}, T * B, dict(T=T, B=B)) for T, B in pl["cpu16_points"]],
           lambda T, B: measure_point("cpu16", rnn, T, B, unrolls=pl["unrolls"], repeats=pl["repeats"],
                                      extra={"sweep": "sizes", "threads": os.cpu_count()}))
    T, B = pl["scaling"]

    def scaling_point(P):  # experiments.extensions.scaling's measurement, one device count
        (row,) = scaling.measure(devices=(P,), T=T, B=B, H=H, repeats=pl["repeats"], combines=("logstep",),
                                 diagnostic=False, log=lambda s: None)["rows"]
        return {"part": "cpu16", "sweep": "sequence-parallel", "cell": "RNN", "T": T, "B": B, "H": H, "I": 1,
                "devices": P, "ms": {"bppsa_sharded_backward": row["backward_logstep_s"] * 1e3,
                                     "forward_sharded": row["forward_s"] * 1e3},
                "best_unroll": None, "peak_mb": _peak_mb(), "grad_rel_err": {}}

    sweep(summary, Budget(pl["budgets"]["cpu16"], deadline),
           [({"part": "cpu16", "sweep": "sequence-parallel", "devices": P}, T * B, dict(P=P))
            for P in pl["cpu16_devices"]], scaling_point)


def _spawn_cpu16(out: Path, dry: bool, pl: dict, deadline: float):
    """Run part cpu16 in a subprocess: JAX_PLATFORMS=cpu and the host devices set before JAX starts."""
    seconds = max(0.0, min(pl["budgets"]["cpu16"], deadline - time.monotonic()))
    if seconds < 5:
        Summary(out).add(skipped={"part": "cpu16", "reason": "time budget"})
        return
    env = {**os.environ, "JAX_PLATFORMS": "cpu",
           "XLA_FLAGS": f"--xla_force_host_platform_device_count={pl['cpu16_device_count']}"}
    cmd = [sys.executable, "-m", "experiments.paper_bppsa.gpu_run", str(out), "--part", "cpu16",
           "--budget", f"{seconds:.1f}"] + (["--dry-run"] if dry else [])
    try:
        subprocess.run(cmd, env=env, timeout=seconds + 30, check=False)
    except subprocess.TimeoutExpired:
        Summary(out).add(skipped={"part": "cpu16", "reason": "subprocess timed out; its points so far are kept"})


def _table(summary: dict) -> str:
    rows = ["part  sweep              cell    T      B    plain/bppsa  unrolled/bppsa  cudnn/bppsa"]
    for p in summary["points"]:
        ms = p.get("ms") or {}
        if p["part"] == "parallel":
            its = {k.replace("/bppsa", ""): v["iterations"] for k, v in p["newton"].items()}
            rows.append(f"parallel {p['sweep']:<15} {p['cell']:<5} {p['T']:>6} {p['B']:>4}    tuned BPTT / "
                        + ", ".join(f"{k}: {ms['sequential/bptt'] / v:.2f}" for k, v in ms.items()) + f"; its {its}")
        if "bppsa_blelloch" not in ms:
            continue
        r = lambda k: f"{ms[k] / ms['bppsa_blelloch']:.2f}" if k in ms else "-"
        rows.append(f"{p['part']:<5} {str(p.get('sweep', '')):<18} {p['cell']:<5} {p['T']:>6} {p['B']:>4}"
                    f"    {r('bptt_plain'):>8}    {r('bptt_unrolled'):>10}     {r('cudnn'):>8}")
    return "\n".join(rows)


def _fmt(v: dict) -> str:
    m, p = v["measured_ms"], v["predicted_ms"]
    ratio = "n/a (CPU)" if v["ratio"] is None and m is not None and p is not None else (
        "-" if v["ratio"] is None else f"{v['ratio']:.2f}")
    return (f"{'-' if m is None else f'{m:.3g}'} / {'-' if p is None else f'{p:.3g}'} "
            f"(ratio {ratio})")


def fused_table(summary: dict) -> str:
    """Per point with fused columns: measured ms, predicted ms (the machine-code check's) and their
    ratio (on a GPU only)."""
    rows = [f"{'point (machine-code name)':<34} {'column':<22} {'measured ms':>12} {'predicted ms':>13} "
            f"{'measured/predicted':>19}"]
    for p in summary["points"]:
        for col, v in (p.get("predicted_fused") or {}).items():
            m, pr = v["measured_ms"], v["predicted_ms"]
            ratio = (f"{v['ratio']:.2f}" if v["ratio"] is not None else
                     "n/a (CPU)" if m is not None and pr is not None else "-")
            rows.append(f"{v['point']:<34} {col:<22} {'-' if m is None else f'{m:.4g}':>12} "
                        f"{'-' if pr is None else f'{pr:.4g}':>13} {ratio:>19}")
    return "\n".join(rows) if len(rows) > 1 else ""


def _detail_table(summary: dict) -> str:
    """Where the time goes, per point that measured it: backward-alone ratios and launches per step."""
    rows = ["sweep  cell    T      B    backward plain/bppsa  tuned/bppsa   forward bppsa/lax.scan   "
            "launches per step (plain lax.scan, tuned BPTT, bppsa, bppsa fused)"]
    for p in summary["points"]:
        b, f, n = p.get("backward_ms") or {}, p.get("forward_ms") or {}, p.get("launches") or {}
        if not (b or n):
            continue
        r = lambda d, k, ref: f"{d[k] / d[ref]:.2f}" if k in d and ref in d else "-"
        c = lambda k: "-" if k not in n else f"{n[k]['total']}" + ("" if n[k]["exact"] else "+")
        rows.append(f"{str(p.get('sweep', '')):<6} {p['cell']:<5} {p['T']:>6} {p['B']:>4}    "
                    f"{r(b, 'bptt_plain', 'bppsa_blelloch'):>18}  {r(b, 'bptt', 'bppsa_blelloch'):>11}   "
                    f"{r(f, 'bppsa_blelloch', 'bptt_plain'):>22}   "
                    + ", ".join(c(k) for k in ("bptt_plain", "bptt", "bppsa_blelloch", "bppsa_fused")))
    return "\n".join(rows) if len(rows) > 1 else ""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m experiments.paper_bppsa.gpu_run",
                                 description=(__doc__ or "").split("\n")[0])
    ap.add_argument("out", help="output folder (summary.json, points.jsonl)")
    ap.add_argument("--dry-run", action="store_true", help="tiny sizes on any backend (also: BPPSA_ALLOW_CPU=1)")
    ap.add_argument("--part", choices=("all", "gpu", "parallel", "cpu16", *GPU_SWEEPS), default="all",
                    help="one part, or one sweep of part gpu (its budget is then the whole run's)")
    ap.add_argument("--budget", type=float, default=None,
                    help="seconds for the whole run (default: the plan's); every part's budget scales with it")
    args = ap.parse_args(argv)
    dry = args.dry_run or os.environ.get("BPPSA_ALLOW_CPU", "0") == "1"
    pl = plan(dry)
    if args.budget is not None:
        if not args.budget > 0:
            ap.error(f"--budget must be a positive number of seconds; got {args.budget}")
        scale, pl["total"] = args.budget / pl["total"], args.budget
        pl["budgets"] = {k: v * scale for k, v in pl["budgets"].items()}
    deadline = time.monotonic() + pl["total"]
    out = Path(args.out)
    summary = Summary(out)
    host.tune_allocator()
    if args.part == "cpu16":  # the subprocess: all of its budget is part cpu16's
        pl["budgets"]["cpu16"] = pl["total"]
        summary.set_provenance("cpu16", provenance())
        run_cpu16(summary, pl, deadline)
        return 0
    backend = jax.default_backend()
    if backend not in ("gpu", "cuda") and not dry:
        print(f"error: no GPU visible to JAX (backend: {backend}). Check nvidia-smi and the jax[cuda] "
              "install, or pass --dry-run (BPPSA_ALLOW_CPU=1) for a tiny run on the CPU.", file=sys.stderr)
        return 1
    try:  # optional: the cuDNN baseline's library
        import torch  # pyright: ignore[reportMissingImports] -- optional dependency, absent in the lint env
        torch_version = torch.__version__
        tf32 = bool(torch.backends.cudnn.allow_tf32) if torch.cuda.is_available() else None
    except Exception:  # noqa: BLE001 -- any failure to import means "no cuDNN baseline"
        torch_version = tf32 = None
    prov = provenance()
    prov.update(dry_run=dry, plan={k: v for k, v in pl.items()}, torch=torch_version, cudnn_allow_tf32=tf32)
    summary.set_provenance("gpu", prov)
    print(f"{'dry run' if dry else 'run'} on {backend}: {jax.devices()}", flush=True)
    later = {"all": pl["budgets"]["parallel"] + pl["budgets"]["cpu16"], "gpu": 0}
    if args.part in ("all", "gpu"):
        run_gpu(summary, pl, deadline - later[args.part])
    if args.part in GPU_SWEEPS:
        pl["budgets"][args.part] = pl["total"]
        run_gpu(summary, pl, deadline, only=args.part)
    if args.part in ("all", "parallel"):
        run_parallel(summary, pl, deadline - (pl["budgets"]["cpu16"] if args.part == "all" else 0))
    if args.part in ("all", "cpu16"):
        print(f"cpu16: subprocess, budget {pl['budgets']['cpu16']} s", flush=True)
        _spawn_cpu16(out, dry, pl, deadline)
    final = summary.write()
    present = [m for m in BLOCKED if m in sys.modules]
    print(f"\n{len(final['points'])} points, {len(final['skipped'])} skipped -> {out / 'summary.json'}")
    print("times relative to bppsa (> 1: BPPSA faster):\n" + _table(final))
    detail = _detail_table(final)
    if detail:
        print("\nwhere the time goes (backward alone, forward alone, kernels launched per training step):\n" + detail)
    fused = fused_table(final)
    if fused:
        print("\nthe fused kernels, measured against the machine-code check's prediction (experiments/results/gpu/"
              "machine_code.json, pararnn_machine_code.json; '-': the point is not in them):\n" + fused)
    if present:
        print(f"warning: imported {present}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
