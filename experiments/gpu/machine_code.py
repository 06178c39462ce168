"""The fused kernels' machine code for an H100 (sm_90a), compiled on a machine without a GPU: every
kernel at every size its ``kernels=`` path accepts, a table of what each one costs the GPU, and a
check that fails on a spill, on too much shared memory, or on a kernel that does not compile.

Two processes, because jaxlib and the ``triton`` package each embed their own MLIR and cannot share
one interpreter:

1. **dump** (this module, the project's environment): the training steps of :func:`points` are
   exported for CUDA with ``kernels="pallas"`` through the public entry (:func:`bppsa.rnn` under
   ``jax.grad``, ``jax.export``: :func:`bppsa.kernels.cuda_module`), so the kernels are exactly
   those the plan runs, with the warps, grids and blocks the kernels choose. Each Triton kernel's
   IR is kept as text (a wrap of Pallas's ``lower_jaxpr_to_triton_module``; the bytecode inside the
   custom call does not parse in pip triton), with its ``num_warps``/``num_stages`` (the custom
   call's backend config) and its grid. Identical kernels (same IR, warps, stages) are written once.
2. **compile** (:mod:`experiments.gpu.machine_code_compile`, run by path in an environment with
   ``triton==3.6.0``, the GPU machine's version, which ships ``ptxas`` and ``cuobjdump``):
   ``triton.compile`` to PTX and an sm_90a cubin, ``ptxas -v`` for registers and spills,
   ``cuobjdump`` for shared memory and the SASS of the loops.

This module then renders the table (:func:`render`) with its provenance into
``experiments/results/gpu/machine_code.{md,json}``. ``make machine-code`` builds the triton
environment (``.venv-triton``) and runs all three steps::

    python -m experiments.gpu.machine_code [--out DIR] [--only SUBSTR] [--triton-python PY] [--no-write]

What it cannot tell: on the GPU, XLA compiles the kernels' bytecode with its own Triton fork and
its own pass list; the numbers here are Triton 3.6's pipeline on the same IR, close but not
guaranteed identical. It times nothing.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, cast

__all__ = ["Point", "points", "dump", "MODEL", "predict", "NEWTON_PARALLEL", "newton_waves", "render", "check_points",
           "main",
           "ROOT", "RESULTS"]

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "experiments" / "results" / "gpu"
COMPILER = Path(__file__).resolve().with_name("machine_code_compile.py")
TRITON_PYTHON = ROOT / ".venv-triton" / "bin" / "python"


@dataclasses.dataclass(frozen=True)
class Point:
    """One training step whose kernels are compiled.

    Attributes:
      name: a label (where the point comes from and its sizes).
      kind: "rnn", "gru", "lstm" (:mod:`bppsa.cells`), "blockgru" or "blockrnn" (:mod:`bppsa.cells`).
      I, H, T, B: input size, hidden size, sequence length, batch.
      pairs: the (forward, backward) pairs run with ``kernels="pallas"``.
      head: a structured cell's head size.
    """

    name: str
    kind: str
    I: int
    H: int
    T: int
    B: int
    pairs: tuple[tuple[str, str], ...]
    head: int = 1

    def cell(self) -> Any:
        from bppsa import cells
        if self.kind in ("blockgru", "blockrnn"):
            make = cells.BlockGRU if self.kind == "blockgru" else cells.BlockRNN
            return make(self.I, self.H, head_size=self.head)
        return cells.BUILTIN[self.kind](self.I, self.H)


SEQUENTIAL = (("sequential", "bppsa"), ("sequential", "bptt"))  # bppsa_fused, bptt_fused of the GPU script
NEWTON = (("newton", "bppsa"),)


def points() -> list[Point]:
    """The GPU script's points (:mod:`experiments.paper_bppsa.gpu_run`'s full plan: the T and B
    sweeps, the IRMAS shapes, the structured points of the parallel part, each with the fused pairs
    the script runs there), then the largest sizes each kernel accepts (the kernels' own limits,
    read from their modules, so the check follows them): the fused recurrence and adjoint loop at
    each cell's ``HIDDEN_LIMITS``, the scans at blocks of ``LANE_BLOCK`` and ``MAX_BLOCK`` (dense: the Newton
    forward's solve; factored: BPPSA's backward), the Newton step at ``MAX_UNITS``."""
    from bppsa.kernels import newton, recurrence, scan
    from experiments.paper_bppsa import gpu_run

    full, H, name = gpu_run.plan(False), gpu_run.H, gpu_run.machine_code_point  # the script reads by these names
    out = [Point(name("gpu", "T", "rnn", T, 16, H), "rnn", 1, H, T, 16, SEQUENTIAL) for T in full["T_sweep"]]
    out += [Point(name("gpu", "B", "rnn", full["B_sweep_T"], B, H), "rnn", 1, H, full["B_sweep_T"], B, SEQUENTIAL)
            for B in full["B_sweep"]]
    for setting, B in full["irmas"]:
        I, T = gpu_run.IRMAS_SHAPES[setting]
        out.append(Point(name("gpu", "irmas", "gru", T, B, H, setting=setting), "gru", I, H, T, B, SEQUENTIAL))
    for sweep, kind, head, I, Hs, T, B in full["parallel"]:
        if kind in ("blockgru", "blockrnn"):  # the fused pair runs at the structured points only
            out.append(Point(name("parallel", sweep, kind, T, B, Hs, head=head), kind, I, Hs, T, B, NEWTON, head))
    from bppsa import cells
    K = scan.MAX_BLOCK
    for kind in ("rnn", "gru", "lstm"):  # each kind's own limit (recurrence.HIDDEN_LIMITS: the GRU's is lower)
        Hmax = recurrence.HIDDEN_LIMITS[cells.BUILTIN[kind]]
        # BPPSA's backward also scans S x S blocks (S = 2H for an LSTM): its largest H is where S <= MAX_BLOCK
        Hscan = min(Hmax, K // (2 if kind == "lstm" else 1))
        if Hscan == Hmax:
            out.append(Point(f"limit {kind} H={Hmax}", kind, 12, Hmax, 1000, 16, SEQUENTIAL))
        else:
            out.append(Point(f"limit {kind} H={Hmax}", kind, 12, Hmax, 1000, 16, (("sequential", "bptt"),)))
            out.append(Point(f"limit {kind} bppsa H={Hscan}", kind, 12, Hscan, 1000, 16, (("sequential", "bppsa"),)))
    # the dense scan's largest block: the Newton forward's solve of S x S Jacobians (LSTM: S = 2H)
    out += [Point(f"limit {kind} newton S={K}", kind, 12, K // (2 if kind == "lstm" else 1), 1000, 16, NEWTON)
            for kind in ("rnn", "gru", "lstm")]
    out += [Point(f"limit blockgru head={k}", "blockgru", 64, 256, 4096, 16, NEWTON, k)
            for k in (scan.LANE_BLOCK, K)]
    out += [Point(f"limit {kind} head=1 H={newton.MAX_UNITS}", kind, 64, newton.MAX_UNITS, 4096, 16, NEWTON)
            for kind in ("blockgru", "blockrnn")]
    return out


def _capture():
    """Wrap Pallas's Triton lowering and the custom call it emits: returns (captured list, restore)."""
    from jax._src.interpreters import mlir
    from jax._src.pallas.triton import lowering as tl

    from bppsa.kernels.lowering import TRITON_CALL

    captured: list[dict[str, Any]] = []
    # Pallas's registration calls ``mlir.custom_call`` through the module: the wrap is seen there
    orig_lower, orig_cc = tl.lower_jaxpr_to_triton_module, cast(Any, mlir.custom_call)

    def lower(jaxpr, *a, **k):
        res = orig_lower(jaxpr, *a, **k)
        src = getattr(jaxpr.debug_info, "func_src_info", None) or ""
        captured.append({"asm": res.module.operation.get_asm(enable_debug_info=False), "grid": list(res.grid),
                         "src": str(src)})
        return res

    def custom_call(*a: Any, backend_config: Any = None, **k: Any) -> Any:
        target = k.get("call_target_name", a[0] if a else None)
        if target == TRITON_CALL and captured and "num_warps" not in captured[-1] and backend_config:
            get = lambda key: int(str(backend_config[key]).split(":")[0])  # noqa: E731  ("4 : i32")
            captured[-1].update(name=str(backend_config["name"]).strip('"'), num_warps=get("num_warps"),
                                num_stages=get("num_stages"))
        return orig_cc(*a, backend_config=backend_config, **k)

    tl.lower_jaxpr_to_triton_module = lower
    mlir.custom_call = custom_call

    def restore():
        tl.lower_jaxpr_to_triton_module = orig_lower
        mlir.custom_call = orig_cc
    return captured, restore


def kernel_label(src: str, name: str) -> str:
    """"module.function" of a kernel from its jaxpr's source info ("_kernel at /x/bppsa/kernels/scan.py:205")."""
    parts = src.split(" at ")
    if len(parts) == 2:
        return f"{Path(parts[1].split(':')[0]).stem}.{parts[0].strip()}"
    return name or "kernel"


def _step_module(point: Point, forward: str, backward: str) -> str:
    import jax
    import jax.numpy as jnp

    from bppsa import backprop
    from bppsa.kernels import cuda_module

    cell = point.cell()
    params = cell.init(jax.random.key(0), jnp.float32)
    xs = jax.ShapeDtypeStruct((point.T, point.B, cell.input_size), jnp.float32)
    h0 = cell.unflatten_state(jnp.zeros((point.B, cell.state_size), jnp.float32))

    def loss(p, x, h):
        return jnp.sum(cell.hidden(backprop.rnn(cell, p, x, h, kernels="pallas", forward=forward, backward=backward)))
    return cuda_module(jax.grad(loss), params, xs, h0)


def _launched(module: str, captured: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The captured kernels in the order of the module's Triton calls: a kernel called twice whose
    lowering JAX reused (the Newton loop's reduce, also run once before the loop) is lowered, and
    captured, once, but is two calls with the same Triton IR; as captured where the calls' IRs do
    not pair one-to-one with the captured kernels."""
    from bppsa.kernels.lowering import TRITON_CALL

    blobs = [part.split('ir = "', 1)[1].split('"', 1)[0] if 'ir = "' in part else ""
             for part in module.split(TRITON_CALL)[1:]]
    distinct = list(dict.fromkeys(blobs))
    if len(blobs) == len(captured) or len(distinct) != len(captured) or "" in distinct:
        return captured
    return [captured[distinct.index(b)] for b in blobs]


def dump(out: str | Path, only: str | None = None, selected: list[Point] | None = None) -> dict[str, Any]:
    """Export every point's fused training steps for CUDA and write each distinct kernel's TTIR
    (``<id>.ttir``) and ``manifest.json`` under ``out``.

    Args:
      out: the folder (created).
      only: keep the points whose name contains this.
      selected: the points (default :func:`points`).

    Returns:
      The manifest: ``kernels`` {id: {file, label, name, num_warps, num_stages}}, ``launches``
      [{point, pair, index, kernel, grid}] in the order the steps launch them, ``errors`` [{point,
      pair, error}] (a step that does not lower), ``points`` (their fields).
    """
    import warnings

    import jax
    warnings.filterwarnings("ignore", category=DeprecationWarning)  # the Triton backend's deprecation
    jax.config.update("jax_platforms", "cpu")
    from bppsa.kernels.lowering import TRITON_CALL

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    chosen = [p for p in (selected if selected is not None else points()) if not only or only in p.name]
    manifest: dict[str, Any] = {"kernels": {}, "launches": [], "errors": [],
                                "points": [dataclasses.asdict(p) for p in chosen]}
    captured, restore = _capture()
    try:
        for p in chosen:
            for forward, backward in p.pairs:
                pair = f"{forward}/{backward}"
                captured.clear()
                t0 = time.monotonic()
                try:
                    module = _step_module(p, forward, backward)
                except Exception as e:  # noqa: BLE001 -- every point's failure is reported, the rest go on
                    manifest["errors"].append({"point": p.name, "pair": pair,
                                               "error": f"lowering: {type(e).__name__}: {e}"[:2000]})
                    print(f"{p.name} {pair}: LOWERING FAILED: {str(e)[:300]}", file=sys.stderr)
                    continue
                launched = _launched(module, captured)
                if module.count(TRITON_CALL) != len(launched):
                    manifest["errors"].append({"point": p.name, "pair": pair, "error": (
                        f"{module.count(TRITON_CALL)} Triton calls in the module, {len(captured)} kernels captured")})
                for i, c in enumerate(launched):
                    key = hashlib.sha256(f"{c['asm']}|{c.get('num_warps')}|{c.get('num_stages')}".encode())
                    kid = key.hexdigest()[:12]
                    if kid not in manifest["kernels"]:
                        (out / f"{kid}.ttir").write_text(c["asm"])
                        manifest["kernels"][kid] = {"file": f"{kid}.ttir", "label": kernel_label(c["src"], c.get(
                            "name", "")), "name": c.get("name"), "num_warps": c.get("num_warps"),
                                                    "num_stages": c.get("num_stages")}
                    manifest["launches"].append({"point": p.name, "pair": pair, "index": i, "kernel": kid,
                                                 "grid": c["grid"]})
                print(f"{p.name} {pair}: {len(captured)} kernel(s), {time.monotonic() - t0:.1f} s", file=sys.stderr)
    finally:
        restore()
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return manifest


# ------------------------------------------------------------------------------------- the table ---

def _fits(row: dict[str, Any], limits: dict[str, int]) -> str | None:
    """Why a compiled kernel fails the check, or None."""
    if "error" in row:
        return "does not compile" + (" (timeout)" if str(row["error"]).startswith("timeout") else "")
    spill = row["spill_store"] + row["spill_load"]
    if spill:
        return f"spills {row['spill_store']}/{row['spill_load']} B"
    if row["smem"] > limits["smem_per_block"]:
        return f"shared memory {row['smem']} B > {limits['smem_per_block']} B"
    if row["blocks_per_sm"] < 1:
        return "no block fits an SM"
    return None


#: The H100 constants of the predicted time, all in one place: a simple, stated model, not a tuned
#: one (the first GPU run checks it: measured / predicted per kernel).
MODEL = {
    "clock_hz": 1.755e9,         # SM clock under sustained load (H100 SXM; boost 1.98 GHz)
    "issue_per_cycle": 4,        # warp-instructions an SM issues a cycle (4 schedulers, 1 each)
    "global_latency": 260,       # cycles: a global load served by L2 (a step's operands were just written)
    "smem_latency": 30,          # cycles: a shared-memory load
    "barrier_latency": 24,       # cycles: each block-wide barrier
    "mufu_latency": 20,          # cycles: a special-function op (exp, tanh's pieces, reciprocal)
    "hbm_bandwidth": 3.35e12,    # bytes/s (H100 SXM HBM3)
    "launch_s": 3e-6,            # a kernel launch inside one XLA program, back to back
}


def predict(row: dict[str, Any], programs: int, limits: dict[str, int], model: dict[str, float] = MODEL
            ) -> dict[str, Any] | None:
    """A launch's predicted time from its machine code: the main loop (the largest SASS loop, run
    ``row["trips"][0]`` times, read from the TTIR) costs a program, an iteration, its warp's
    instructions issued (``ceil(warps / 4)`` warps share a scheduler) plus one exposed wait of each
    kind it has (a global load from L2, less the loop's ``ldg_lead``: the instructions issued
    between the load and the first read of its value, one a cycle, so a load issued a step ahead
    waits for nothing; each barrier, a shared-memory load, a special function); where ``r`` blocks
    share an SM, at least their instructions' issue time. Waves (``ceil(programs /
    (blocks/SM x SMs))``) run one after another. The loop's global traffic of every program over the
    HBM bandwidth bounds it from below; one launch overhead is added.

    Returns:
      {"us", "compute_us", "traffic_us", "cycles_per_iteration", "iterations"}, or None for a kernel
      that did not compile or fits no SM.
    """
    if "error" in row or row.get("blocks_per_sm", 0) < 1:
        return None
    warps, per_sm = row["num_warps"], row["blocks_per_sm"]
    loop = row["loops"][0] if row.get("loops") else None
    trips = (row.get("trips") or [None])[0]
    if loop is None or not trips:  # straight-line code: every instruction once
        loop = {"instructions": row["sass_instructions"], "kinds": {}, "ldg_bytes": 0, "stg_bytes": 0}
        trips = 1
    kinds, n = loop["kinds"], loop["instructions"]
    issue = lambda w: n * -(-w // model["issue_per_cycle"])  # noqa: E731  (cycles, w warps on an SM)
    # a global load's wait, less the instructions issued before its value is read (one a cycle)
    lead = loop.get("ldg_lead") or 0
    wait = (max(0, model["global_latency"] - lead) * (kinds.get("ldg", 0) > 0)
            + model["barrier_latency"] * kinds.get("bar", 0)
            + model["smem_latency"] * (kinds.get("lds", 0) > 0) + model["mufu_latency"] * (kinds.get("mufu", 0) > 0))
    resident = min(per_sm, -(-programs // limits["sms"]))
    cycles = max(issue(warps) + wait, issue(warps * resident))
    waves = -(-programs // (per_sm * limits["sms"]))
    compute = waves * trips * cycles / model["clock_hz"]
    traffic = programs * trips * (loop["ldg_bytes"] + loop["stg_bytes"]) * warps / model["hbm_bandwidth"]
    us = (max(compute, traffic) + model["launch_s"]) * 1e6
    return {"us": round(us, 2), "compute_us": round(compute * 1e6, 2), "traffic_us": round(traffic * 1e6, 2),
            "cycles_per_iteration": int(cycles), "iterations": int(trips)}


#: The Newton step's parallel kernels, whose grids must make :data:`bppsa.kernels.newton.MIN_WAVES` waves.
NEWTON_PARALLEL = ("newton._reduce", "newton._apply")


def newton_waves(launches: list[dict[str, Any]]) -> list[str]:
    """The check's Newton rule: every launch of the Newton step's parallel kernels
    (:data:`NEWTON_PARALLEL`) at the check's points has at least
    :data:`bppsa.kernels.newton.MIN_WAVES` waves (programs / (blocks per SM x SMs)); one failure
    line for each launch that has fewer."""
    from bppsa.kernels.newton import MIN_WAVES
    return [f"{x['point']} {x['pair']}: {x['label']} {'x'.join(map(str, x['grid']))} makes {x['waves']} waves "
            f"(< {MIN_WAVES})" for x in launches
            if x["label"] in NEWTON_PARALLEL and (x["waves"] is None or x["waves"] < MIN_WAVES)]


def render(manifest: dict[str, Any], compiled: dict[str, Any], provenance: dict[str, Any],
           limits: dict[str, int]) -> tuple[dict[str, Any], str]:
    """The check's record and its Markdown.

    Args:
      manifest: the dump's (:func:`dump`).
      compiled: the compile side's ``compiled.json`` (``versions``, ``kernels``).
      provenance: where and how the table was made.
      limits: the GPU's limits (:data:`experiments.gpu.machine_code_compile.H100`).

    Returns:
      (record, markdown): the record has ``provenance``, ``limits``, ``kernels`` (per id: the
      dump's fields, the compiled row, ``fail`` where it fails), ``launches`` (each with its
      programs and waves), ``failures`` (one line each) and ``errors`` (the dump's).
    """
    kernels: dict[str, Any] = {}
    failures = [f"{e['point']} {e['pair']}: {e['error']}" for e in manifest["errors"]]
    for kid, k in manifest["kernels"].items():
        row = {**k, **compiled["kernels"].get(kid, {"error": "not compiled"})}
        if row.get("loops"):  # the main loop in full; of the others, their size
            row["loops"] = row["loops"][:1] + [{key: lp[key] for key in ("start", "end", "instructions")}
                                               for lp in row["loops"][1:]]
        why = _fits(row, limits)
        if why:
            row["fail"] = why
            failures.append(f"{k['label']} [{kid}] ({k['num_warps']} warps): {why}")
        kernels[kid] = row
    launches = []
    for launch in manifest["launches"]:
        row = kernels[launch["kernel"]]
        programs = 1
        for g in launch["grid"]:
            programs *= g
        per_wave = row.get("blocks_per_sm", 0) * limits["sms"]
        launches.append({**launch, "label": row["label"], "programs": programs,
                         "waves": round(programs / per_wave, 3) if per_wave else None,
                         "predicted": predict(row, programs, limits)})
    failures += newton_waves(launches)
    steps: dict[str, dict[str, Any]] = {}
    for x in launches:  # the kernels' predicted time of each point's training step
        step = steps.setdefault(f"{x['point']} | {x['pair']}", {"point": x["point"], "pair": x["pair"], "us": 0.0})
        known = step["us"] is not None and x["predicted"] is not None
        step["us"] = round(step["us"] + x["predicted"]["us"], 2) if known else None
    record = {"provenance": provenance, "limits": limits, "model": MODEL, "points": manifest.get("points", []),
              "kernels": kernels, "launches": launches,
              "steps": list(steps.values()), "failures": failures, "errors": manifest["errors"]}
    return record, _markdown(record)


_KIND_COLUMNS = ("fp32", "mufu", "ldg", "stg", "lds", "sts", "bar", "shfl", "local", "int/other", "ctrl")


def _points_of(record: dict[str, Any]) -> dict[str, list[str]]:
    where: dict[str, list[str]] = {}
    for launch in record["launches"]:
        names = where.setdefault(launch["kernel"], [])
        if launch["point"] not in names:
            names.append(launch["point"])
    return where


def _signature(k: dict[str, Any]) -> tuple:
    """What a row of the kernels' table shows of a kernel (kernels equal in it share the row)."""
    loop = k["loops"][0] if k.get("loops") else {"instructions": 0, "kinds": {}}
    return (k["label"], k["num_warps"], k.get("regs"), k.get("spill_store"), k.get("spill_load"), k.get("smem"),
            k.get("blocks_per_sm"), loop["instructions"], tuple(sorted(loop["kinds"].items())), k.get("fail"))


def _markdown(record: dict[str, Any]) -> str:
    prov, limits = record["provenance"], record["limits"]
    kernels, where = record["kernels"], _points_of(record)
    n_fail = sum(1 for k in kernels.values() if "fail" in k)
    lines = [
        "# The fused kernels' machine code (sm_90a, compiled on a CPU)",
        "",
        f"*{prov.get('date', '?')}, commit {str(prov.get('git_commit') or '?')[:10]}, jax {prov.get('jax', '?')}, "
        f"triton {prov.get('triton', '?')}, ptxas {prov.get('ptxas', '?')}, {prov.get('runtime_s', '?')} s "
        f"(the kernels' compiles {prov.get('compile_s', '?')} s)* — "
        f"`{prov.get('command', '')}`",
        "",
        f"Every fused kernel the GPU script's points and the kernels' largest accepted sizes launch "
        f"(`experiments.gpu.machine_code.points`), from Pallas's Triton IR through triton "
        f"{prov.get('triton', '?')}'s own pipeline to an sm_90a cubin: {len(kernels)} distinct kernels, "
        f"{len(record['launches'])} launches at {len({x['point'] for x in record['launches']})} points. "
        f"**{'Passes' if not record['failures'] else 'Fails'}**: {n_fail} kernel(s) fail "
        f"(a spill, more than {limits['smem_per_block'] // 1024} KiB of shared memory a block, no compile)"
        + (f", {len(record['errors'])} step(s) do not lower" if record["errors"] else "")
        + f"; {len(newton_waves(record['launches']))} Newton launch(es) under 4 waves (`newton_waves`)"
        + f" of {sum(x['label'] in NEWTON_PARALLEL for x in record['launches'])}, each at "
        + ", ".join(sorted({f'{x["waves"]}' for x in record['launches'] if x['label'] in NEWTON_PARALLEL}))
        + " waves.",
        "",
        "On the GPU, XLA compiles the same kernels with its own Triton fork and pass list: these numbers "
        "are close to what runs there, not guaranteed identical. Waves: programs / (blocks per SM × "
        f"{limits['sms']} SMs). The loop: the largest backward branch's span in the SASS (instructions a "
        "warp executes an iteration), by kind.",
        "",
        "## The kernels",
        "",
        "Kernels with the same machine-code figures (the same code at other lengths and batches: their "
        "IR differs only in constants) share a row; every kernel's own row is in the JSON.",
        "",
        "| kernel | warps | regs | spill st/ld (B) | smem (B) | blocks/SM | loop instr | "
        + " | ".join(_KIND_COLUMNS) + " | kernels | points | verdict |",
        "|---|--:|--:|--:|--:|--:|--:|" + "--:|" * len(_KIND_COLUMNS) + "--:|---|---|",
    ]
    groups: dict[tuple, list[str]] = {}
    for kid in sorted(kernels, key=lambda i: (kernels[i]["label"], where.get(i, [""])[0])):
        groups.setdefault(_signature(kernels[kid]), []).append(kid)
    for ids in groups.values():
        k = kernels[ids[0]]
        pts = [p for kid in ids for p in where.get(kid, [])]
        pts_text = ", ".join(pts[:2]) + (f" (+{len(pts) - 2})" if len(pts) > 2 else "")
        verdict = f"**{k['fail']}**" if "fail" in k else "ok"
        if "error" in k:
            lines.append(f"| {k['label']} | {k['num_warps']} | – | – | – | – | – | "
                         + " | ".join("–" for _ in _KIND_COLUMNS) + f" | {len(ids)} | {pts_text} | {verdict} |")
            continue
        loop = k["loops"][0] if k.get("loops") else {"instructions": 0, "kinds": {}}
        lines.append(
            f"| {k['label']} | {k['num_warps']} | {k['regs']} | {k['spill_store']}/{k['spill_load']} | "
            f"{k['smem']} | {k['blocks_per_sm']} | {loop['instructions']} | "
            + " | ".join(str(loop["kinds"].get(c, 0)) for c in _KIND_COLUMNS)
            + f" | {len(ids)} | {pts_text} | {verdict} |")
    lines += ["", "## The training steps' launches and predicted times", "",
              "Each launch: kernel, grid, waves, predicted µs. Predicted: `experiments.gpu.machine_code.predict` "
              "with the constants of `MODEL` (in the JSON): the main loop's instructions issued plus one exposed "
              "wait of each kind an iteration (a global load's less the instructions between it and its use), "
              "times its iterations (from the TTIR) and the waves, bounded below "
              "by its global traffic over HBM's bandwidth; a launch's overhead added. The fused kernels only "
              "(XLA's own operations around them are not counted), each once: the Newton forward runs its kernels "
              "once an iteration, and a kernel lowered once but called twice (the same jitted entry at the same "
              "shapes: a block-diagonal cell's Newton solve and BPPSA scan) is listed once. Untuned: the first "
              "GPU run checks it.",
              "",
              "| point | pair | launches | predicted µs |", "|---|---|---|--:|"]
    by_step: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for x in record["launches"]:
        by_step.setdefault((x["point"], x["pair"]), []).append(x)
    totals = {(st["point"], st["pair"]): st["us"] for st in record.get("steps", [])}
    for (point, pair), xs in by_step.items():
        parts = []
        for x in xs:
            pr = x.get("predicted") or {}
            parts.append(f"{x['label']} {'×'.join(map(str, x['grid']))} "
                         f"({'–' if x['waves'] is None else x['waves']} w, {pr.get('us', '–')})")
        total = totals.get((point, pair))
        lines.append(f"| {point} | {pair} | {'; '.join(parts)} | {'–' if total is None else total} |")
    if record["failures"]:
        lines += ["", "## Failures", ""] + [f"- {f}" for f in record["failures"]]
    return "\n".join(lines) + "\n"


def _provenance(versions: dict[str, str], runtime: float, argv: list[str]) -> dict[str, Any]:
    from experiments.provenance import provenance
    prov = provenance(" ".join(["python", "-m", "experiments.gpu.machine_code", *argv]))
    prov.update(backend="cuda (compiled only, not run)",
                device_kind=f"NVIDIA H100 (sm_90a), compiled by triton {versions.get('triton', '?')}",
                runtime_s=round(runtime, 1), **versions)
    try:
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "bppsa"], capture_output=True, text=True,
                               cwd=ROOT, timeout=10).stdout.strip()
        prov["bppsa_modified"] = bool(dirty)
    except (OSError, subprocess.SubprocessError):
        pass
    return prov


def check_points(selected: list[Point], out: str | Path, triton_python: str) -> dict[str, Any] | None:
    """The check at some points, with no provenance and nothing written but the working files under
    ``out``: :func:`dump`, each kernel's loop trips, the compile side (``triton_python``), :func:`render`.

    Returns:
      The record, or None where the compile side failed.
    """
    from experiments.gpu.machine_code_compile import H100, loop_trips
    out = Path(out)
    manifest = dump(out, selected=selected)
    for k in manifest["kernels"].values():
        k["trips"] = loop_trips((out / k["file"]).read_text())
    if subprocess.call([triton_python, str(COMPILER), str(out)]) != 0:
        return None
    return render(manifest, json.loads((out / "compiled.json").read_text()), {}, dict(H100))[0]


def main(argv: list[str] | None = None) -> int:
    """The check: dump, compile (another interpreter), render; exit status 1 on any failure."""
    ap = argparse.ArgumentParser(prog="python -m experiments.gpu.machine_code",
                                 description="Compile every fused kernel to sm_90a and check its machine code.")
    ap.add_argument("--out", default=None, help="the working folder (TTIR, PTX, cubin, SASS); default a temporary one")
    ap.add_argument("--only", default=None, help="only the points whose name contains this")
    ap.add_argument("--triton-python", default=os.environ.get("BPPSA_TRITON_PYTHON", str(TRITON_PYTHON)),
                    help="the python of the environment with triton==3.6.0 (default .venv-triton/bin/python)")
    ap.add_argument("--results", default=str(RESULTS), help="where machine_code.{md,json} go")
    ap.add_argument("--no-write", action="store_true", help="print the table, write no result")
    ap.add_argument("--jobs", "-j", type=int, default=int(os.environ.get("BPPSA_MACHINE_CODE_JOBS", "0")) or None,
                    help="compile processes (default min(4, cores))")
    ap.add_argument("--timeout", type=float, default=None, help="seconds one kernel's compile may take (default 600)")
    ap.add_argument("--reuse", action="store_true", help="use the dump (and the compiled kernels) already in --out")
    a = ap.parse_args(argv)
    t0 = time.monotonic()
    if not Path(a.triton_python).exists():
        print(f"error: no triton environment at {a.triton_python} (make machine-code builds .venv-triton)",
              file=sys.stderr)
        return 2
    out = Path(a.out) if a.out else Path(tempfile.mkdtemp(prefix="bppsa-machine-code-"))
    if a.reuse and (out / "manifest.json").exists():
        manifest = json.loads((out / "manifest.json").read_text())
    else:
        manifest = dump(out, a.only)
    from experiments.gpu.machine_code_compile import H100, loop_trips
    for k in manifest["kernels"].values():  # the main loop's iterations, from the TTIR's bounds
        k["trips"] = loop_trips((out / k["file"]).read_text())
    done = out / "compiled.json"
    if not (a.reuse and done.exists() and set(json.loads(done.read_text())["kernels"]) >= set(manifest["kernels"])):
        rc = subprocess.call([a.triton_python, str(COMPILER), str(out)] + (["-j", str(a.jobs)] if a.jobs else [])
                             + (["-t", str(a.timeout)] if a.timeout else []))
        if rc != 0:
            print(f"error: the compile side exited {rc}", file=sys.stderr)
            return 1
    compiled = json.loads(done.read_text())
    prov = _provenance(compiled["versions"], time.monotonic() - t0, list(sys.argv[1:] if argv is None else argv))
    prov["compile_s"] = round(sum(r.get("compile_s", 0.0) for r in compiled["kernels"].values()), 1)
    record, md = render(manifest, compiled, prov, dict(H100))
    print(md)
    if not a.no_write and not a.only:
        from experiments.provenance import save_json
        save_json(Path(a.results) / "machine_code.json", record)
        (Path(a.results) / "machine_code.md").write_text(md)
    print(f"machine code: {len(record['kernels'])} kernels, {len(record['failures'])} failure(s), "
          f"{time.monotonic() - t0:.0f} s; files under {out}", file=sys.stderr)
    return 1 if record["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
