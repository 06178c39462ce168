"""pararnn-torch (ParaRNN's PyTorch implementation, Newton forward + parallel-reduction backward)
against bppsa: one training step, the same equations and the same weights, one CPU core each,
float32 (the task of experiments/extensions/configs/pararnn_peer.py). A benchmark, not a test.

The peer runs in its own venv (``config.peer_venv``, default ~/.cache/bppsa/pararnn-venv, created
on first use with ``pip install torch==2.13.0`` then ``pip install pararnn-torch==0.17.4
torch==2.13.0``, so pip keeps the CPU torch) through experiments/scripts/_pararnn_peer_driver.py;
the two processes exchange weights, inputs, outputs and gradients as .npz files (numpy only, no
pickle). With ``config.peer = "skip"`` (the smoke preset) the peer is not run, its venv is neither
looked for nor created, and only bppsa's side is measured and checked (against the float64
reference); the record says so (``"peer_run": false``) and the peer's columns are "—".

The step: states H = RNN(params, xs, h0) (T, B, H), loss L = Σ H ⊙ R (R fixed N(0, 1): a loss
of every state), gradient of L w.r.t. the parameters::

    peer eager      pararnn.newton_apply(cell, x, NewtonConfig(), h0=h0) and autograd through
                    its custom backward; K ≤ 3 Newton iterations, early stop at max|F| < 1e-5
    peer compiled   the same forward under torch.compile(fullgraph=True) with
                    compile_safe_config() (fixed K = 3)
    bppsa newton    bppsa.rnn(cell, params, xs, h0, backward="bppsa", forward="newton")
                    (only where bppsa.Options has the forward field; else "—"); default tol
                    (float32: 1e-5 relative), max_iter 50, on_fail="sequential". Its NewtonInfo
                    (return_info=True: iterations, converged, fell_back, residual) is returned
                    by the timed function itself and recorded per point; "newton fwd" times the
                    forward alone (jit of the loss, no gradient), for the profile
    bppsa quasi     the same with forward="quasi" (diagonal-Jacobian iterations, full
                    Jacobians in the backward), with its NewtonInfo
    bppsa seq       backward="bppsa" with the sequential forward (lax.scan)
    bptt            backward="bptt" (autodiff through lax.scan), for context

bppsa's steps are ``jax.jit(jax.value_and_grad(loss))``, timed by :func:`bppsa.host.time_interleaved`
(median ms); the peer's are the median of ``config.repeats`` calls after 2 warm-up calls. Both sides
run on one core: the task measures in a child process that pins itself (``os.sched_setaffinity``)
to ``config.core`` and has ``XLA_FLAGS=--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1``
before JAX is imported; the peer runs under ``taskset -c CORE`` with ``torch.set_num_threads(1)``.

The equations (pararnn's; rnn, gru = ``ParaGRU(mix="head", n_heads=1)``, gru_diag =
``ParaGRU(mix="diag")``), the bppsa cells that run them and the float64 reference:
:mod:`experiments.extensions.pararnn_equations`. Correctness first, at every point: both sides'
states must agree (``max |ΔH| < 1e-4``), and each side's gradient is compared with a float64 autodiff
reference through a plain sequential ``lax.scan`` (in a subprocess with x64): the error is
``max over parameters of max |g − g_ref| / max |g_ref|``.

Writes ``<name>``.json (rows, provenance, the peer's records) and ``<name>``.md into the work
directory; ``python -m experiments.extensions.pararnn_peer --render JSON`` rewrites JSON's .md
from the saved record, without a run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from bppsa.backprop import rnn
from bppsa.errors import UsageError, checked_by, require_choices, require_int
from bppsa.host import time_interleaved
from bppsa.plan.options import Options
from experiments import entry
from experiments.extensions.pararnn_equations import bppsa_cell, grad_error, make_point, save_point
from experiments.provenance import current_command, provenance, save_json
from experiments.tables import markdown_table

__all__ = ["POINTS", "EXTRA", "QUICK", "SMOKE", "ensure_peer_venv", "newton_available", "run_point", "measure",
           "check_pararnn_peer", "run", "markdown", "render", "main"]

REPO = Path(__file__).resolve().parents[2]
DRIVER = REPO / "experiments" / "scripts" / "_pararnn_peer_driver.py"
TORCH, PEER = "torch==2.13.0", "pararnn-torch==0.17.4"
IRMAS_HIDDEN = 20  # experiments/paper_bppsa/configs/irmas*.py: hidden_size
RNN_INPUT, RNN_HIDDEN = 1, 20  # experiments/paper_bppsa/configs/rnn_*.py: the paper's RNN(input 1, hidden 20)
#: name -> (kind, T, B, I, H). The GRU shapes are experiments.data.irmas.SHAPES "m" (F 24, T 517) and
#: "l" (F 12, T 1034) at the IRMAS grid's B = 16 and 32.
POINTS = {
    "rnn T=1000 B=2": ("rnn", 1000, 2, RNN_INPUT, RNN_HIDDEN),
    "rnn T=1000 B=16": ("rnn", 1000, 16, RNN_INPUT, RNN_HIDDEN),
    "rnn T=10000 B=1": ("rnn", 10000, 1, RNN_INPUT, RNN_HIDDEN),
    "gru T=517 B=16": ("gru", 517, 16, 24, IRMAS_HIDDEN),
    "gru T=1034 B=32": ("gru", 1034, 32, 12, IRMAS_HIDDEN),
}
#: the diagonal GRU, pararnn's own cell, at the hidden sizes 20, 64 and 256
EXTRA = {"gru_diag T=1034 B=32": ("gru_diag", 1034, 32, 12, IRMAS_HIDDEN),
         "gru_diag H=64 T=1034 B=32": ("gru_diag", 1034, 32, 12, 64),
         "gru_diag H=256 T=2048 B=8": ("gru_diag", 2048, 8, 12, 256)}
QUICK = {"rnn quick": ("rnn", 64, 2, 1, 8), "gru quick": ("gru", 64, 4, 6, 8),
         "gru_diag quick": ("gru_diag", 64, 4, 6, 8)}
SMOKE = {"rnn smoke": ("rnn", 8, 2, 1, 4)}
ALL_POINTS = {**POINTS, **EXTRA, **QUICK, **SMOKE}
STATE_TOL, GRAD_TOL = 1e-4, 1e-3


# ---------------------------------------------------------------- the peer's venv

def ensure_peer_venv(venv: Path) -> Path:
    """The venv's python, with pararnn importable; create and install when missing."""
    py = venv / "bin" / "python"
    if py.exists() and subprocess.run([py, "-c", "import pararnn, torch"], capture_output=True).returncode == 0:
        return py
    print(f"[peer] creating {venv} ({TORCH}, then {PEER})", flush=True)
    venv.parent.mkdir(parents=True, exist_ok=True)
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", str(venv)], check=True)
    pip = [str(py), "-m", "pip", "install", "-q"]
    subprocess.run(pip + [TORCH, "numpy"], check=True)  # the CPU wheel first, so nothing pulls a CUDA one
    if subprocess.run(pip + [PEER, TORCH]).returncode != 0:  # torch pinned in the same resolve
        subprocess.run(pip + ["--no-deps", PEER, "safetensors"], check=True)
    subprocess.run([py, "-c", "import pararnn"], check=True)
    return py


# ---------------------------------------------------------------- one point

def newton_available():
    try:
        Options(forward="newton")
    except (TypeError, ValueError):
        return False
    return True


_REFERENCE = ("import sys; from experiments.extensions.pararnn_equations import reference_main; "
              "reference_main(sys.argv[1], sys.argv[2])")


def run_point(name, spec, opts, peer_python, use_newton, workdir):
    """One row: the float64 reference, the peer (unless ``peer_python`` is None), bppsa's methods,
    checked, then timed. ``opts``: repeats, core, no_compile."""
    kind, T, B, I, H = spec
    params, xs, h0, R = make_point(kind, T, B, I, H)
    tag = name.replace(" ", "_").replace("=", "")
    inp = workdir / f"{tag}.npz"
    save_point(inp, kind, params, xs, h0, R)

    t0 = time.perf_counter()
    ref_out = workdir / f"{tag}_ref.npz"
    subprocess.run([sys.executable, "-c", _REFERENCE, str(inp), str(ref_out)], check=True,
                   env={**os.environ, "JAX_ENABLE_X64": "1"})
    ref = np.load(ref_out)
    ref_grads = {k[len("grad__"):]: ref[k] for k in ref.files if k.startswith("grad__")}

    row = {"point": name, "kind": kind, "T": T, "B": B, "I": I, "H": H, "peer": None}
    pd = None
    if peer_python is not None:
        print(f"[{name}] peer ...", flush=True)
        peer_out, peer_json = workdir / f"{tag}_peer.npz", workdir / f"{tag}_peer.json"
        cmd = ["taskset", "-c", str(opts["core"]), str(peer_python), str(DRIVER), "--inp", str(inp),
               "--out", str(peer_out), "--json", str(peer_json), "--repeats", str(opts["repeats"])]
        if opts["no_compile"]:
            cmd.append("--no-compile")
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"peer driver failed at {name}:\n{proc.stderr[-3000:]}")
        row["peer"] = json.loads(peer_json.read_text())
        pd = np.load(peer_out)
        peer_grads = {k[len("grad__"):]: pd[k] for k in pd.files if k.startswith("grad__")}
        peer_cgrads = {k[len("compiled_grad__"):]: pd[k] for k in pd.files if k.startswith("compiled_grad__")}
        row["peer_state_err"] = float(np.abs(pd["hs"] - ref["hs"]).max())
        row["peer_grad_err"] = grad_error(peer_grads, ref_grads)
        if peer_cgrads:
            row["peer_compiled_grad_err"] = grad_error(peer_cgrads, ref_grads)
            row["peer_compiled_state_err"] = float(np.abs(pd["compiled_hs"] - ref["hs"]).max())

    print(f"[{name}] bppsa ...", flush=True)
    cell, to_params, to_peer = bppsa_cell(kind, I, H)
    bp = {k: jnp.asarray(v) for k, v in to_params(params).items()}
    xs_j, h0_j, R_j = jnp.asarray(xs), jnp.asarray(h0), jnp.asarray(R)
    methods = {"bppsa seq": {"backward": "bppsa"}, "bptt": {"backward": "bptt"}}
    if use_newton:
        methods = {"bppsa newton": {"backward": "bppsa", "forward": "newton"},
                   "bppsa quasi": {"backward": "bppsa", "forward": "quasi"}, **methods}
        methods["bppsa seq"]["forward"] = "sequential"
    parallel = [m for m, kw in methods.items() if kw.get("forward") in ("newton", "quasi")]

    def make(kw, grad=True):
        info = kw.get("forward") in ("newton", "quasi")

        def loss(p, xs, h0, R):  # the data as arguments: XLA must not fold it in as constants
            out = rnn(cell, p, xs, h0, return_info=info, **kw)
            hs, inf = out if info else (out, None)
            return jnp.vdot(hs, R), (hs, inf)
        f = jax.jit(jax.value_and_grad(loss, has_aux=True) if grad else loss)
        return lambda: f(bp, xs_j, h0_j, R_j)

    fns = {m: make(kw) for m, kw in methods.items()}
    timed = dict(fns)
    if use_newton:  # the forward alone (the loss, no gradient): how the step splits
        timed["bppsa newton fwd"] = make(methods["bppsa newton"], grad=False)
        timed["bppsa seq fwd"] = make(methods["bppsa seq"], grad=False)
    for m, fn in fns.items():  # the first call: trace and compile, timed (what a user waits for once per shape)
        t0 = time.perf_counter()
        (_, (hs, inf)), g = jax.block_until_ready(fn())
        row[f"{m} compile_s"] = time.perf_counter() - t0
        hs = np.asarray(hs)
        if m in parallel:
            row[f"{m} info"] = {k: np.asarray(v).item() for k, v in inf._asdict().items()}
        if pd is not None:
            row[f"{m} state_vs_peer"] = float(np.abs(hs - pd["hs"]).max())
        else:  # no peer: the states against the float64 reference's
            row[f"{m} state_vs_ref"] = float(np.abs(hs - ref["hs"]).max())
        row[f"{m} grad_err"] = grad_error({k: np.asarray(v) for k, v in to_peer(g).items()}, ref_grads)
    bad = [k for k in row if k.endswith(("state_vs_peer", "state_vs_ref")) and row[k] > STATE_TOL]
    bad += [k for k in row if k.endswith("grad_err") and row[k] > GRAD_TOL]
    row["check_failed"] = bad
    if bad:
        print(f"[{name}] CHECK FAILED: {[(k, row[k]) for k in bad]}", flush=True)
    times = time_interleaved(timed, repeats=opts["repeats"], warmup=1, block=2)
    for m in parallel:  # the info of the timed calls: the same inputs, so the same as above
        (_, (_, inf)), _ = fns[m]()
        row[f"{m} info last"] = {k: np.asarray(v).item() for k, v in inf._asdict().items()}
    row["fell_back"] = [m for m in parallel if row[f"{m} info"]["fell_back"] or row[f"{m} info last"]["fell_back"]]
    if row["fell_back"]:
        print(f"[{name}] FELL BACK to the sequential forward: {row['fell_back']}", flush=True)
    for m, s in times.items():
        row[f"{m} ms"] = s["median"] * 1e3
        row[f"{m} samples"] = s
    row["wall_s"] = time.perf_counter() - t0
    peer = row["peer"]
    said = "peer not run" if peer is None else \
        f"peer eager {peer['eager_ms']:.1f} ms, compiled {peer.get('compiled_ms', float('nan')):.1f} ms"
    print(f"[{name}] {said}, "
          + ", ".join(f"{m} {row[f'{m} ms']:.1f} ms" for m in timed)
          + "".join(f"; {m} {row[f'{m} info']}" for m in parallel), flush=True)
    return row


# ---------------------------------------------------------------- the run (in the pinned child process)

def measure(opts: dict, workdir, command: str | None = None) -> dict:
    """Every point of ``opts["points"]`` (names of :data:`ALL_POINTS`) by :func:`run_point`; writes
    ``<name>``.json and ``<name>``.md into ``workdir`` and returns the record. Run it in a process
    pinned to ``opts["core"]`` with single-threaded XLA (what :func:`run` starts)."""
    load0 = list(os.getloadavg())
    have = newton_available()
    use_newton = have and opts["forward"] != "sequential"
    print(f"bppsa forward='newton': {'yes' if use_newton else 'no (not available)' if not have else 'no'}", flush=True)
    peer_python = opts["peer_python"]
    peer = None if peer_python is None else Path(peer_python)
    t0 = time.perf_counter()
    rows = []
    with tempfile.TemporaryDirectory(prefix="pararnn-peer-") as tmp:
        for name in opts["points"]:
            rows.append(run_point(name, ALL_POINTS[name], opts, peer, use_newton, Path(tmp)))
    peer0 = (rows[0]["peer"] if rows else None) or {}
    record = {"rows": rows, "repeats": opts["repeats"], "core": opts["core"], "wall_s": time.perf_counter() - t0,
              "bppsa_forward_newton": use_newton, "peer_run": peer_python is not None, "peer_python": peer_python,
              "peer_versions": {"torch": peer0.get("torch"), "pararnn": peer0.get("pararnn")},
              "loadavg": [load0, list(os.getloadavg())], "config": opts["config"], "provenance": provenance(command)}
    dirty = subprocess.run(["git", "status", "--porcelain", "--", "bppsa"], capture_output=True, text=True,
                           cwd=REPO).stdout.split("\n")
    record["bppsa_uncommitted"] = [line[3:] for line in dirty if line.strip()]
    save_json(entry(workdir, f"{opts['name']}.json"), record)
    entry(workdir, f"{opts['name']}.md").write_text(markdown(record))
    return record


_CHILD = ("import json, os, sys; opts = json.loads(sys.argv[1]); os.sched_setaffinity(0, {opts['core']}); "
          "from experiments.extensions.pararnn_peer import measure; measure(opts, sys.argv[2], sys.argv[3])")


def check_pararnn_peer(config) -> None:
    """The ranges of :func:`run`'s config (UsageError naming the key)."""
    require_choices(config, "points", tuple(ALL_POINTS), many=True)
    require_choices(config, "peer", ("run", "skip"))
    require_choices(config, "forward", ("auto", "newton", "sequential"))
    require_int(config, "core", 0)
    require_int(config, "repeats")
    for key in ("extra", "no_compile"):
        require_choices(config, key, (True, False))
    if not config.peer_venv:
        raise UsageError("config.peer_venv must name the peer's venv folder (created when missing); got ''")


@checked_by(check_pararnn_peer)
def run(config, workdir) -> dict:
    """Task of ``experiments/extensions/configs/pararnn_peer.py``: the peer's venv (when
    ``config.peer == "run"``), then :func:`measure` in a child process pinned to ``config.core``
    with single-threaded XLA; returns the median ms of each side per point."""
    check_pararnn_peer(config)
    if config.core not in os.sched_getaffinity(0):
        raise UsageError(f"config.core must be a core this process may run on, one of "
                         f"{sorted(os.sched_getaffinity(0))}; got {config.core}")
    if config.forward == "newton" and not newton_available():
        raise UsageError("config.forward = 'newton', but bppsa.Options has no forward='newton' yet; "
                         "use 'auto' or 'sequential'")
    points = list(config.points) + [n for n in EXTRA if config.extra and n not in config.points]
    peer_python = ensure_peer_venv(Path(config.peer_venv).expanduser()) if config.peer == "run" else None
    opts = {"points": points, "repeats": config.repeats, "core": config.core, "no_compile": config.no_compile,
            "forward": config.forward, "name": config.name, "config": config.to_dict(),
            "peer_python": None if peer_python is None else str(peer_python)}
    for ext in ("json", "md"):  # the child writes these: listed as bppsa's before it starts
        entry(workdir, f"{config.name}.{ext}")
    env = dict(os.environ, XLA_FLAGS=(os.environ.get("XLA_FLAGS", "")
                                      + " --xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1").strip())
    command = current_command() or " ".join(sys.argv)
    subprocess.run([sys.executable, "-c", _CHILD, json.dumps(opts), str(workdir), command], env=env, check=True)
    record = json.loads((Path(workdir) / f"{config.name}.json").read_text())
    return {r["point"]: {"peer eager ms": (r["peer"] or {}).get("eager_ms"),
                         "peer compiled ms": (r["peer"] or {}).get("compiled_ms"),
                         **{k: v for k, v in r.items() if k.endswith(" ms")}, "check_failed": r["check_failed"]}
            for r in record["rows"]}


# ---------------------------------------------------------------- the table

def _fmt(v, spec=".2f"):
    return "—" if v is None else format(v, spec)


def _iters(r, m):
    info = r.get(f"{m} info")
    if info is None:
        return "—"
    return f"{info['iterations']}" + ("" if info["converged"] else " (not conv.)") + (
        " FELL BACK" if info["fell_back"] else "")


_HEADER = ["point", "I", "H", "peer eager ms", "peer compiled ms", "peer iters (eager/compiled)",
           "bppsa newton ms", "newton fwd ms", "newton iters", "bppsa quasi ms", "quasi iters",
           "bppsa seq+bppsa ms", "seq fwd ms", "bptt ms", "peer compiled / bppsa newton",
           "peer compiled / bppsa seq", "bppsa compile s (newton/seq+bppsa/bptt)", "grad err peer (eager/compiled)",
           "grad err bppsa (newton/quasi/seq)"]


def _line(r) -> list:
    p = r["peer"] or {}
    pc = p.get("compiled_ms")
    bn, bs = r.get("bppsa newton ms"), r["bppsa seq ms"]
    return [
        r["point"], r["I"], r["H"], _fmt(p.get("eager_ms")), _fmt(pc),
        f"{p['eager_iters']}/{p.get('compiled_iters', '—')}" if p else "—", _fmt(bn),
        _fmt(r.get("bppsa newton fwd ms")), _iters(r, "bppsa newton"), _fmt(r.get("bppsa quasi ms")),
        _iters(r, "bppsa quasi"), _fmt(bs), _fmt(r.get("bppsa seq fwd ms")), _fmt(r["bptt ms"]),
        "—" if pc is None or bn is None else f"{pc / bn:.2f}x",
        "—" if pc is None else f"{pc / bs:.2f}x",
        "/".join(_fmt(r.get(f"{m} compile_s"), ".1f") for m in ("bppsa newton", "bppsa seq", "bptt")),
        f"{_fmt(r.get('peer_grad_err'), '.1e')}/{_fmt(r.get('peer_compiled_grad_err'), '.1e')}" if p else "—",
        f"{_fmt(r.get('bppsa newton grad_err'), '.1e')}/{_fmt(r.get('bppsa quasi grad_err'), '.1e')}"
        f"/{r['bppsa seq grad_err']:.1e}",
    ]


def markdown(record) -> str:
    """The record's .md: the provenance line, what was measured, the table, the notes."""
    rows, prov, load0 = record["rows"], record["provenance"], record["loadavg"][0]
    use_newton, wall_s, repeats, core = (record["bppsa_forward_newton"], record["wall_s"], record["repeats"],
                                         record["core"])
    peer_run = record.get("peer_run", True)
    versions = record["peer_versions"]
    table = markdown_table(_HEADER, [_line(r) for r in rows], align=["l"] + ["r"] * (len(_HEADER) - 1))
    newton_note = ("bppsa newton = `forward=\"newton\"` + `backward=\"bppsa\"` (default tol, float32 1e-5 "
                   "relative residual; max_iter 100; on_fail=\"sequential\"), bppsa quasi = `forward=\"quasi\"`; "
                   "iters = NewtonInfo.iterations (`return_info=True`, from the timed function; linear solves, "
                   "each after one evaluation of every step, plus one final evaluation); newton fwd / seq fwd = "
                   "the forward alone (jit of the loss, no gradient); compile s: the first call of each training "
                   "step (trace and XLA compile, paid once per shape)." if use_newton else
                   f"**bppsa newton: not run** (bppsa.Options has no `forward` field at commit "
                   f"{str(prov.get('git_commit'))[:7]}, or config.forward = \"sequential\"); the bppsa columns are "
                   "`forward=\"sequential\"` (lax.scan) + `backward=\"bppsa\"` and BPTT only.")
    failed = [(r["point"], r["check_failed"]) for r in rows if r["check_failed"]]
    fell = [(r["point"], r["fell_back"]) for r in rows if r.get("fell_back")]
    partial = [r["point"] for r in rows if (r["peer"] or {}).get("compiled_fullgraph") is False]
    notes = []
    if not peer_run:
        notes.append("**The peer was not run** (config.peer = \"skip\": no torch, no pararnn-torch): its columns "
                     "are \"—\", and bppsa's states were checked against the float64 reference's instead of the "
                     "peer's. This table measures bppsa's side only.")
    if fell:
        notes.append(f"**Fell back to the sequential forward** (not converged within max_iter): {fell}.")
    elif use_newton:
        notes.append("Every newton and quasi forward converged (no fallback).")
    if partial:
        notes.append("Compiled with graph breaks (`fullgraph=False`; `fullgraph=True` refused: a custom cell's "
                     "backward is `torch.autograd.grad` on its step, which Dynamo does not trace): "
                     f"{', '.join(partial)}.")
    if record.get("bppsa_uncommitted"):
        notes.append("bppsa was the working tree, with uncommitted changes in "
                     f"{', '.join(record['bppsa_uncommitted'])}.")
    notes.append(f"Load average {' '.join(f'{v:.2f}' for v in record['loadavg'][1])} at the end (a shared 2-core "
                 "machine): read the ratios more than the milliseconds.")
    states = "max |H_bppsa − H_peer|" if peer_run else "max |H_bppsa − H_ref|"
    head = (f"`{prov['command']}` — {prov['date']}, {prov['cpu']}, one core each (core {core}; XLA single-threaded, "
            f"torch 1 thread), jax {prov['jax']}, torch {versions.get('torch') or '— (not run)'}, pararnn-torch "
            f"{versions.get('pararnn') or '— (not run)'}, commit {str(prov.get('git_commit'))[:7]}, "
            f"{wall_s / 60:.1f} min, load average {load0[0]:.2f} at the start")
    text = (
        "One training step: states H (T, B, H) of the RNN from h0, loss Σ H ⊙ R (R fixed N(0, 1)), gradient w.r.t. "
        "every parameter; float32; the same equations and weights on both sides (PyTorch's U(±1/√H) init, h0 "
        "U(±0.5), RNN inputs Bernoulli(0.5) bitstreams, GRU inputs N(0, 1)). Peer eager = `pararnn.newton_apply(cell, "
        "x, NewtonConfig(), h0=h0)` + autograd through its eq. 2.6 backward (K ≤ 3, early stop at max|F| < 1e-5; "
        "iterations = residual evaluations); peer compiled = the forward under `torch.compile(fullgraph=True)` with "
        f"`compile_safe_config()` (K = 3 fixed). Peer: median of {repeats} calls after 2 warm-up calls; bppsa: "
        f"`jax.jit(jax.value_and_grad(loss))`, median of {repeats} interleaved rounds (`bppsa.host`). {newton_note} "
        "Cells: rnn = tanh Elman, pararnn side a cell written to its `RNNCell` protocol with the analytic dense "
        "Jacobian (pararnn ships no Elman cell), bppsa `cells.RNN(I, H, \"tanh\")`; gru = `ParaGRU(mix=\"head\", "
        "n_heads=1)` (dense A_*, reset before the recurrent product, h' = (1 − z) h + z n), bppsa `cells.Generic` "
        "with the same equations and their analytic Jacobian (its H³ term as one GEMM; `cells.GRU`'s PyTorch "
        "convention, and `structured.BlockGRU(head_size=H)`'s, r ⊙ (h W_hn), cannot express this GRU); gru_diag = "
        "`ParaGRU(mix=\"diag\", max_recurrent_norm=None)` (pararnn's default GRU, A_* = diag(a_*)), bppsa "
        "`structured.BlockGRU(I, H, 1, hidden_bias=False)` with the z gate negated (exact). Grad err: max over "
        "parameters of max |g − g_ref| / max |g_ref|, g_ref float64 autodiff through a sequential lax.scan. States "
        f"agree ({states} < {STATE_TOL:g}) and grad err < {GRAD_TOL:g} "
        f"everywhere{'' if not failed else ' EXCEPT ' + repr(failed)}. Ratios > 1: bppsa faster.")
    return "\n".join(["# pararnn-torch vs bppsa: one training step on one CPU core", "", head, "", text, "", table, "",
                      *notes, ""])


def render(json_path) -> Path:
    """Rewrite ``json_path``'s .md (beside it) from the saved record, without a run; the .md's path."""
    path = Path(json_path)
    out = path.with_suffix(".md")
    out.write_text(markdown(json.loads(path.read_text())))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Rewrite a saved pararnn-peer record's .md (the run: bppsa run "
                                             "experiments/extensions/configs/pararnn_peer.py).")
    ap.add_argument("--render", metavar="JSON", required=True, help="the record whose .md is rewritten")
    print(render(ap.parse_args(argv).render))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
