"""pararnn-torch (ParaRNN's PyTorch implementation, Newton forward + parallel-reduction backward)
against bppsa: one training step, the same equations and the same weights, one CPU core each,
float32. A benchmark, not a test.

    .venv/bin/python experiments/scripts/pararnn_peer_bench.py                  # the five points, ~20 min
    .venv/bin/python experiments/scripts/pararnn_peer_bench.py --quick          # three tiny points (writes under runs/)
    .venv/bin/python experiments/scripts/pararnn_peer_bench.py --peer-venv DIR  # an existing venv with pararnn-torch
    .venv/bin/python experiments/scripts/pararnn_peer_bench.py --forward newton # insist on bppsa's Newton forward

The peer runs in its own venv (default ~/.cache/bppsa/pararnn-venv, created on first use with
``pip install torch==2.13.0`` then ``pip install pararnn-torch==0.17.4 torch==2.13.0``, so pip
keeps the CPU torch) through experiments/scripts/_pararnn_peer_driver.py; the two processes exchange
weights, inputs, outputs and gradients as .npz files (numpy only, no pickle).

The step: states H = RNN(params, xs, h0) (T, B, H), loss L = Σ H ⊙ R (R fixed N(0, 1): a loss
of every state), gradient of L w.r.t. the parameters.

    peer eager      ``pararnn.newton_apply(cell, x, NewtonConfig(), h0=h0)`` and autograd through
                    its custom backward; K ≤ 3 Newton iterations, early stop at max|F| < 1e-5
    peer compiled   the same forward under ``torch.compile(fullgraph=True)`` with
                    ``compile_safe_config()`` (fixed K = 3)
    bppsa newton    ``bppsa.rnn(cell, params, xs, h0, backward="bppsa", forward="newton")``
                    (only where bppsa.Options has the ``forward`` field; else "—"); default tol
                    (float32: 1e-5 relative), max_iter 50, on_fail="sequential". Its NewtonInfo
                    (``return_info=True``: iterations, converged, fell_back, residual) is returned
                    by the timed function itself and recorded per point; "newton fwd" times the
                    forward alone (jit of the loss, no gradient), for the profile
    bppsa quasi     the same with ``forward="quasi"`` (diagonal-Jacobian iterations, full
                    Jacobians in the backward), with its NewtonInfo
    bppsa seq       ``backward="bppsa"`` with the sequential forward (lax.scan)
    bptt            ``backward="bptt"`` (autodiff through lax.scan), for context

bppsa's steps are ``jax.jit(jax.value_and_grad(loss))``, timed by :func:`bppsa.host.time_interleaved`
(median ms); the peer's are the median of --repeats calls after --warmup calls. Both sides run on
one core: this process pins itself (``os.sched_setaffinity``) to --core and sets
``XLA_FLAGS=--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1`` before JAX is
imported; the peer runs under ``taskset -c CORE`` with ``torch.set_num_threads(1)``.

Equations (pararnn's, the parameter names its torch modules use; A (in, out), W (out, in)):

    rnn       h' = tanh(W_x x + b_x + W_h h + b_h)       pararnn has no Elman cell: a cell written
              to its RNNCell protocol (analytic dense Jacobian, driver's ElmanCell); bppsa:
              ``cells.RNN(I, H, "tanh")`` with W_x ← W_x.weightᵀ, W_h ← W_hᵀ (exact).
    gru       z = σ(h A_z + W_z x + b_z),  r = σ(h A_r + W_r x + b_r),
              n = tanh((h ⊙ r) A_n + W_n x + b_n),  h' = (1 − z) ⊙ h + z ⊙ n
              ``pararnn.ParaGRU(mix="head", n_heads=1)`` (dense A_*). The reset gate acts *before*
              the recurrent product and z weights the candidate: ``bppsa.cells.GRU`` (PyTorch's
              r ⊙ (h W_hn + b_hn), h' = (1 − z) n + z h) cannot express it, so bppsa runs it as
              ``cells.Generic`` with these equations and their analytic Jacobian (below).
              ``structured.BlockGRU(head_size=H)`` is not it either: its reset also acts after
              the recurrent product, r ⊙ (h W_hn), ≠ (h ⊙ r) A_n for a dense A_n.
    gru_diag  the same with A_* = diag(a_*) (``ParaGRU(mix="diag")``, pararnn's default and the
              ParaRNN paper's cell; ``max_recurrent_norm=None``); bppsa:
              ``structured.BlockGRU(I, H, 1, hidden_bias=False)`` with the z gate negated (exact,
              :func:`structured_diag_gru`), else ``cells.Generic`` (diagonal Jacobian as H × H).

Correctness first, at every point: both sides' states must agree (max |ΔH| < 1e-4), and each
side's gradient is compared with a float64 autodiff reference through a plain sequential
``lax.scan`` of the equations above (run in a subprocess with x64): the error is
max over parameters of max |g − g_ref| / max |g_ref|.

Writes ``--out``.json (rows, provenance, the peer's records) and ``--out``.md (default
experiments/results/cpu/pararnn-peer).
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

REPO = Path(__file__).resolve().parents[2]
DRIVER = Path(__file__).resolve().parent / "_pararnn_peer_driver.py"
DEFAULT_VENV = Path.home() / ".cache" / "bppsa" / "pararnn-venv"
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
EXTRA = {"gru_diag T=1034 B=32": ("gru_diag", 1034, 32, 12, IRMAS_HIDDEN)}
QUICK = {"rnn quick": ("rnn", 64, 2, 1, 8), "gru quick": ("gru", 64, 4, 6, 8),
         "gru_diag quick": ("gru_diag", 64, 4, 6, 8)}
STATE_TOL, GRAD_TOL = 1e-4, 1e-3


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--points", nargs="*", default=None,
                    help=f"names from {list(POINTS) + list(EXTRA)} (default: the first five)")
    ap.add_argument("--extra", action="store_true", help="also the diagonal-GRU point")
    ap.add_argument("--quick", action="store_true", help="three tiny points, out under runs/")
    ap.add_argument("--peer-venv", type=Path, default=DEFAULT_VENV,
                    help="venv with pararnn-torch (created here when missing)")
    ap.add_argument("--forward", choices=("auto", "newton", "sequential"), default="auto",
                    help="bppsa newton column: auto = when bppsa.Options has forward='newton'")
    ap.add_argument("--core", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--no-compile", action="store_true", help="skip the peer's torch.compile")
    ap.add_argument("--out", default=None)
    ap.add_argument("--render", metavar="JSON", help="rewrite JSON's .md from the saved record, no run")
    ap.add_argument("--_reference", nargs=2, metavar=("IN", "OUT"), help=argparse.SUPPRESS)
    return ap.parse_args(argv)


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


# ---------------------------------------------------------------- the points

def make_point(kind, T, B, I, H, seed=0):
    """Weights (PyTorch's U(±1/√H) for every tensor), inputs (the paper's bitstreams for the RNN,
    N(0, 1) features for the GRU), h0 U(±0.5), R N(0, 1); float32, peer parameter names."""
    import numpy as np
    rng = np.random.default_rng(seed)
    bound = H ** -0.5
    u = lambda *s: rng.uniform(-bound, bound, s).astype(np.float32)  # noqa: E731
    if kind == "rnn":
        params = {"W_x.weight": u(H, I), "W_x.bias": u(H), "W_h": u(H, H), "b_h": u(H)}
        xs = (rng.random((T, B, I)) < 0.5).astype(np.float32)
    elif kind in ("gru", "gru_diag"):
        shape = (1, H, H) if kind == "gru" else (H,)
        params = {"W_x.weight": u(3 * H, I), "W_x.bias": u(3 * H),
                  "a_z" if kind == "gru_diag" else "A_z": u(*shape),
                  "a_r" if kind == "gru_diag" else "A_r": u(*shape),
                  "a_n" if kind == "gru_diag" else "A_n": u(*shape)}
        xs = rng.standard_normal((T, B, I)).astype(np.float32)
    else:
        raise ValueError(kind)
    h0 = rng.uniform(-0.5, 0.5, (B, H)).astype(np.float32)
    R = rng.standard_normal((T, B, H)).astype(np.float32)
    return params, xs, h0, R


def save_point(path, kind, params, xs, h0, R):
    import numpy as np
    np.savez(path, kind=np.array(kind), xs=xs, h0=h0, R=R, **{"param__" + k: v for k, v in params.items()})


def load_point(path):
    import numpy as np
    d = np.load(path)
    params = {k[len("param__"):]: d[k] for k in d.files if k.startswith("param__")}
    return str(d["kind"]), params, d["xs"], d["h0"], d["R"]


# ---------------------------------------------------------------- the equations, in JAX

def step_fn(kind):
    """Per-example step (params in peer names, h (H,), x (I,)) -> h' (H,): pararnn's equations."""
    import jax
    import jax.numpy as jnp

    def rnn(p, h, x):
        return jnp.tanh(p["W_x.weight"] @ x + p["W_x.bias"] + p["W_h"] @ h + p["b_h"])

    def gru(p, h, x):
        H = h.shape[-1]
        wx = p["W_x.weight"] @ x + p["W_x.bias"]
        if kind == "gru":
            mz, mr, mn = (lambda v: v @ p["A_z"][0]), (lambda v: v @ p["A_r"][0]), (lambda v: v @ p["A_n"][0])
        else:
            mz, mr, mn = (lambda v: v * p["a_z"]), (lambda v: v * p["a_r"]), (lambda v: v * p["a_n"])
        z = jax.nn.sigmoid(mz(h) + wx[:H])
        r = jax.nn.sigmoid(mr(h) + wx[H:2 * H])
        n = jnp.tanh(mn(h * r) + wx[2 * H:])
        return h + z * (n - h)

    return rnn if kind == "rnn" else gru


def gru_jacobian_fn(kind):
    """Analytic M[i, j] = ∂h'_i/∂h_j of :func:`step_fn`'s GRU for one example:
    M = diag(1 − z) + diag(u_z) A_zᵀ + diag(u_n) A_nᵀ (diag(r) + diag(q) A_rᵀ),
    u_z = (n − h) z (1 − z), u_n = z (1 − n²), q = h r (1 − r)  (A_* = diag(a_*) for gru_diag).

    The H³ term A_nᵀ diag(q) A_rᵀ = Σ_k q_k A_nᵀ[:, k] A_rᵀ[k, :] is q @ P with P (H, H·H) the
    fixed outer products (not batched under Generic's vmap), so over T·B examples it is one
    (T·B, H) @ (H, H²) GEMM instead of T·B batched (H, H) @ (H, H) products: 2.4x faster on
    gru T=517 B=16 (6.7 vs 15.8 ms per evaluation of every step's Jacobian), the same values."""
    import jax
    import jax.numpy as jnp

    def jac(p, h, x):
        H = h.shape[-1]
        wx = p["W_x.weight"] @ x + p["W_x.bias"]
        if kind == "gru":
            Az, Ar, An = p["A_z"][0], p["A_r"][0], p["A_n"][0]
            z = jax.nn.sigmoid(h @ Az + wx[:H])
            r = jax.nn.sigmoid(h @ Ar + wx[H:2 * H])
            n = jnp.tanh((h * r) @ An + wx[2 * H:])
            u_z, u_n, q = (n - h) * z * (1 - z), z * (1 - n * n), h * r * (1 - r)
            P = jnp.einsum("ik,kj->kij", An.T, Ar.T).reshape(H, H * H)
            du = An.T * r[None, :] + (q @ P).reshape(H, H)
            return jnp.diag(1 - z) + u_z[:, None] * Az.T + u_n[:, None] * du
        az, ar, an = p["a_z"], p["a_r"], p["a_n"]
        z = jax.nn.sigmoid(az * h + wx[:H])
        r = jax.nn.sigmoid(ar * h + wx[H:2 * H])
        n = jnp.tanh(an * (h * r) + wx[2 * H:])
        d = (1 - z) + (n - h) * z * (1 - z) * az + z * (1 - n * n) * an * (r + h * r * (1 - r) * ar)
        return jnp.diag(d)

    return jac


def bppsa_cell(kind, I, H):
    """(cell, to_params(peer params) -> bppsa params, to_peer(bppsa grads) -> peer-named grads).

    The plug-in point: a bppsa cell that expresses pararnn's GRU natively (a reset-before
    convention field on cells.GRU; a diagonal / block-diagonal cell from bppsa.structured for
    gru_diag and mix="head") replaces the Generic here, with its own parameter mapping."""
    from bppsa import cells
    if kind == "rnn":
        cell = cells.RNN(I, H, nonlinearity="tanh")
        to_params = lambda p: {"W_x": p["W_x.weight"].T, "b_x": p["W_x.bias"],  # noqa: E731
                               "W_h": p["W_h"].T, "b_h": p["b_h"]}
        to_peer = lambda g: {"W_x.weight": g["W_x"].T, "W_x.bias": g["b_x"],  # noqa: E731
                             "W_h": g["W_h"].T, "b_h": g["b_h"]}
        return cell, to_params, to_peer
    if kind == "gru_diag" and structured_gru_available():
        return structured_diag_gru(I, H)
    cell = cells.Generic(step_fn(kind), jacobian_fn=gru_jacobian_fn(kind), hidden_size=H, input_size=I)
    return cell, dict, dict


def structured_gru_available():
    try:
        from bppsa import structured
    except ImportError:
        return False
    return hasattr(structured, "BlockGRU")


def structured_diag_gru(I, H):
    """pararnn's diagonal GRU as ``bppsa.structured.BlockGRU(I, H, head_size=1, hidden_bias=False)``.

    Exact: with a diagonal recurrence a_n ⊙ (h ⊙ r) = r ⊙ (a_n ⊙ h), so the reset position does
    not matter (no hidden bias), and pararnn's z is 1 − bppsa's z, i.e. bppsa's z gate has the
    negated pre-activation (z columns of W_x, b_x and W_h negated). Gate order (z, r, n) ->
    (r, z, n); W_h (N = H, k = 1, 3)."""
    import jax.numpy as jnp

    from bppsa import structured
    cell = structured.BlockGRU(I, H, 1, hidden_bias=False)

    def to_params(p):
        Wz, Wr, Wn = jnp.split(jnp.asarray(p["W_x.weight"]), 3, axis=0)
        bz, br, bn = jnp.split(jnp.asarray(p["W_x.bias"]), 3)
        return {"W_x": jnp.concatenate([Wr.T, -Wz.T, Wn.T], axis=1),
                "b_x": jnp.concatenate([br, -bz, bn]),
                "W_h": jnp.stack([p["a_r"], -p["a_z"], p["a_n"]], axis=-1)[:, None, :]}

    def to_peer(g):
        gr, gz, gn = jnp.split(g["W_x"], 3, axis=1)
        br, bz, bn = jnp.split(g["b_x"], 3)
        return {"W_x.weight": jnp.concatenate([-gz.T, gr.T, gn.T], axis=0),
                "W_x.bias": jnp.concatenate([-bz, br, bn]),
                "a_r": g["W_h"][:, 0, 0], "a_z": -g["W_h"][:, 0, 1], "a_n": g["W_h"][:, 0, 2]}

    return cell, to_params, to_peer


# ---------------------------------------------------------------- float64 reference (subprocess)

def reference_main(inp, out):
    """Float64 states and gradients by autodiff through a plain lax.scan (run with x64 on)."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    jax.config.update("jax_enable_x64", True)
    kind, params, xs, h0, R = load_point(inp)
    f = jax.vmap(step_fn(kind), in_axes=(None, 0, 0))
    p64 = {k: jnp.asarray(v, jnp.float64) for k, v in params.items()}
    xs, h0, R = (jnp.asarray(a, jnp.float64) for a in (xs, h0, R))

    def states(p):
        return jax.lax.scan(lambda h, x: (f(p, h, x),) * 2, h0, xs)[1]

    hs = states(p64)
    grads = jax.grad(lambda p: jnp.vdot(states(p), R))(p64)
    np.savez(out, hs=np.asarray(hs), **{"grad__" + k: np.asarray(v) for k, v in grads.items()})


def grad_error(grads, ref):
    """max over parameters of max |g − g_ref| / max |g_ref|."""
    import numpy as np
    return max(float(np.abs(np.asarray(grads[k], np.float64) - ref[k]).max() / np.abs(ref[k]).max()) for k in ref)


# ---------------------------------------------------------------- one point

def newton_available():
    import bppsa
    try:
        bppsa.Options(forward="newton")
    except (TypeError, ValueError):
        return False
    return True


def run_point(name, spec, args, peer_python, use_newton, workdir):
    import jax
    import jax.numpy as jnp
    import numpy as np

    import bppsa
    from bppsa.host import time_interleaved

    kind, T, B, I, H = spec
    params, xs, h0, R = make_point(kind, T, B, I, H)
    tag = name.replace(" ", "_").replace("=", "")
    inp = workdir / f"{tag}.npz"
    save_point(inp, kind, params, xs, h0, R)

    t0 = time.perf_counter()
    ref_out = workdir / f"{tag}_ref.npz"
    subprocess.run([sys.executable, __file__, "--_reference", str(inp), str(ref_out)], check=True,
                   env={**os.environ, "JAX_ENABLE_X64": "1"})
    ref = np.load(ref_out)
    ref_grads = {k[len("grad__"):]: ref[k] for k in ref.files if k.startswith("grad__")}

    print(f"[{name}] peer ...", flush=True)
    peer_out, peer_json = workdir / f"{tag}_peer.npz", workdir / f"{tag}_peer.json"
    cmd = ["taskset", "-c", str(args.core), str(peer_python), str(DRIVER), "--inp", str(inp),
           "--out", str(peer_out), "--json", str(peer_json), "--repeats", str(args.repeats)]
    if args.no_compile:
        cmd.append("--no-compile")
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"peer driver failed at {name}:\n{proc.stderr[-3000:]}")
    peer = json.loads(peer_json.read_text())
    pd = np.load(peer_out)
    peer_grads = {k[len("grad__"):]: pd[k] for k in pd.files if k.startswith("grad__")}
    peer_cgrads = {k[len("compiled_grad__"):]: pd[k] for k in pd.files if k.startswith("compiled_grad__")}

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

        def loss(p):
            out = bppsa.rnn(cell, p, xs_j, h0_j, return_info=info, **kw)
            hs, inf = out if info else (out, None)
            return jnp.vdot(hs, R_j), (hs, inf)
        f = jax.jit(jax.value_and_grad(loss, has_aux=True) if grad else loss)
        return lambda: f(bp)

    fns = {m: make(kw) for m, kw in methods.items()}
    timed = dict(fns)
    if use_newton:  # the forward alone (the loss, no gradient): how the step splits
        timed["bppsa newton fwd"] = make(methods["bppsa newton"], grad=False)
        timed["bppsa seq fwd"] = make(methods["bppsa seq"], grad=False)
    row = {"point": name, "kind": kind, "T": T, "B": B, "I": I, "H": H, "peer": peer}
    dh_peer_ref = float(np.abs(pd["hs"] - ref["hs"]).max())
    row["peer_state_err"] = dh_peer_ref
    row["peer_grad_err"] = grad_error(peer_grads, ref_grads)
    if peer_cgrads:
        row["peer_compiled_grad_err"] = grad_error(peer_cgrads, ref_grads)
        row["peer_compiled_state_err"] = float(np.abs(pd["compiled_hs"] - ref["hs"]).max())
    for m, fn in fns.items():
        (_, (hs, inf)), g = fn()
        hs = np.asarray(hs)
        if m in parallel:
            row[f"{m} info"] = {k: np.asarray(v).item() for k, v in inf._asdict().items()}
        row[f"{m} state_vs_peer"] = float(np.abs(hs - pd["hs"]).max())
        row[f"{m} grad_err"] = grad_error({k: np.asarray(v) for k, v in to_peer(g).items()}, ref_grads)
    bad = [k for k in row if k.endswith("state_vs_peer") and row[k] > STATE_TOL]
    bad += [k for k in row if k.endswith("grad_err") and row[k] > GRAD_TOL]
    row["check_failed"] = bad
    if bad:
        print(f"[{name}] CHECK FAILED: {[(k, row[k]) for k in bad]}", flush=True)
    times = time_interleaved(timed, repeats=args.repeats, warmup=1, block=2)
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
    print(f"[{name}] peer eager {peer['eager_ms']:.1f} ms, compiled {peer.get('compiled_ms', float('nan')):.1f} ms, "
          + ", ".join(f"{m} {row[f'{m} ms']:.1f} ms" for m in timed)
          + "".join(f"; {m} {row[f'{m} info']}" for m in parallel), flush=True)
    return row


def fmt(v, spec=".2f"):
    return "—" if v is None else format(v, spec)


def write_outputs(out, rows, args, use_newton, peer_python, wall_s, load0):
    from experiments.provenance import provenance, save_json

    prov = provenance()
    peer0 = rows[0]["peer"] if rows else {}
    record = {"rows": rows, "repeats": args.repeats, "core": args.core, "wall_s": wall_s,
              "bppsa_forward_newton": use_newton, "peer_python": str(peer_python),
              "peer_versions": {"torch": peer0.get("torch"), "pararnn": peer0.get("pararnn")},
              "loadavg": [load0, list(os.getloadavg())], "provenance": prov}
    dirty = subprocess.run(["git", "status", "--porcelain", "--", "bppsa"], capture_output=True, text=True,
                           cwd=REPO).stdout.split("\n")
    record["bppsa_uncommitted"] = [line[3:] for line in dirty if line.strip()]
    save_json(f"{out}.json", record)
    render_md(out, record)
    return record


def render_md(out, record):
    """``out``.md from a saved record (``--render JSON`` redoes it without rerunning)."""
    from experiments.tables import markdown_table

    rows, prov, load0 = record["rows"], record["provenance"], record["loadavg"][0]
    use_newton, wall_s, repeats, core = (record["bppsa_forward_newton"], record["wall_s"], record["repeats"],
                                         record["core"])
    peer0 = rows[0]["peer"] if rows else {}
    header = ["point", "I", "H", "peer eager ms", "peer compiled ms", "peer iters (eager/compiled)",
              "bppsa newton ms", "newton fwd ms", "newton iters", "bppsa quasi ms", "quasi iters",
              "bppsa seq+bppsa ms", "seq fwd ms", "bptt ms", "peer compiled / bppsa newton",
              "peer compiled / bppsa seq", "grad err peer (eager/compiled)", "grad err bppsa (newton/quasi/seq)"]

    def iters(r, m):
        info = r.get(f"{m} info")
        if info is None:
            return "—"
        return f"{info['iterations']}" + ("" if info["converged"] else " (not conv.)") + (
            " FELL BACK" if info["fell_back"] else "")

    lines = []
    for r in rows:
        p = r["peer"]
        pc = p.get("compiled_ms")
        bn, bs = r.get("bppsa newton ms"), r["bppsa seq ms"]
        lines.append([
            r["point"], r["I"], r["H"], fmt(p["eager_ms"]), fmt(pc),
            f"{p['eager_iters']}/{p.get('compiled_iters', '—')}", fmt(bn), fmt(r.get("bppsa newton fwd ms")),
            iters(r, "bppsa newton"), fmt(r.get("bppsa quasi ms")), iters(r, "bppsa quasi"),
            fmt(bs), fmt(r.get("bppsa seq fwd ms")), fmt(r["bptt ms"]),
            "—" if pc is None or bn is None else f"{pc / bn:.2f}x",
            "—" if pc is None else f"{pc / bs:.2f}x",
            f"{r['peer_grad_err']:.1e}/{fmt(r.get('peer_compiled_grad_err'), '.1e')}",
            f"{fmt(r.get('bppsa newton grad_err'), '.1e')}/{fmt(r.get('bppsa quasi grad_err'), '.1e')}"
            f"/{r['bppsa seq grad_err']:.1e}",
        ])
    table = markdown_table(header, lines, align=["l"] + ["r"] * (len(header) - 1))
    newton_note = ("bppsa newton = `forward=\"newton\"` + `backward=\"bppsa\"` (default tol, float32 1e-5 "
                   "relative residual; max_iter 50; on_fail=\"sequential\"), bppsa quasi = `forward=\"quasi\"`; "
                   "iters = NewtonInfo.iterations (`return_info=True`, from the timed function; linear solves, "
                   "each after one evaluation of every step, plus one final evaluation); newton fwd / seq fwd = "
                   "the forward alone (jit of the loss, no gradient)." if use_newton else
                   f"**bppsa newton: not available** (bppsa.Options has no `forward` field at commit "
                   f"{str(prov.get('git_commit'))[:7]}); the bppsa columns are `forward=\"sequential\"` "
                   "(lax.scan) + `backward=\"bppsa\"` and BPTT only. Rerun with `--forward newton` once it lands.")
    failed = [(r["point"], r["check_failed"]) for r in rows if r["check_failed"]]
    fell = [(r["point"], r["fell_back"]) for r in rows if r.get("fell_back")]
    partial = [r["point"] for r in rows if r["peer"].get("compiled_fullgraph") is False]
    notes = []
    if fell:
        notes.append(f"**Fell back to the sequential forward** (not converged within max_iter): {fell}.")
    elif use_newton:
        notes.append("Every newton and quasi forward converged (no fallback).")
    if partial:
        notes.append(f"Compiled with graph breaks (`fullgraph=False`; `fullgraph=True` refused: a custom cell's "
                     f"backward is `torch.autograd.grad` on its step, which Dynamo does not trace): {', '.join(partial)}.")
    if record.get("bppsa_uncommitted"):
        notes.append("bppsa was the working tree, with uncommitted changes in "
                     f"{', '.join(record['bppsa_uncommitted'])}.")
    notes.append(f"Load average {' '.join(f'{v:.2f}' for v in record['loadavg'][1])} at the end (a shared 2-core "
                 "machine): read the ratios more than the milliseconds.")
    md = f"""# pararnn-torch vs bppsa: one training step on one CPU core

`{prov['command']}` — {prov['date']}, {prov['cpu']}, one core each (core {core}; XLA single-threaded, torch 1 thread), jax {prov['jax']}, torch {peer0.get('torch')}, pararnn-torch {peer0.get('pararnn')}, commit {str(prov.get('git_commit'))[:7]}, {wall_s / 60:.1f} min, load average {load0[0]:.2f} at the start

One training step: states H (T, B, H) of the RNN from h0, loss Σ H ⊙ R (R fixed N(0, 1)), gradient w.r.t. every parameter; float32; the same equations and weights on both sides (PyTorch's U(±1/√H) init, h0 U(±0.5), RNN inputs Bernoulli(0.5) bitstreams, GRU inputs N(0, 1)). Peer eager = `pararnn.newton_apply(cell, x, NewtonConfig(), h0=h0)` + autograd through its eq. 2.6 backward (K ≤ 3, early stop at max|F| < 1e-5; iterations = residual evaluations); peer compiled = the forward under `torch.compile(fullgraph=True)` with `compile_safe_config()` (K = 3 fixed). Peer: median of {repeats} calls after 2 warm-up calls; bppsa: `jax.jit(jax.value_and_grad(loss))`, median of {repeats} interleaved rounds (`bppsa.host`). {newton_note} Cells: rnn = tanh Elman, pararnn side a cell written to its `RNNCell` protocol with the analytic dense Jacobian (pararnn ships no Elman cell), bppsa `cells.RNN(I, H, "tanh")`; gru = `ParaGRU(mix="head", n_heads=1)` (dense A_*, reset before the recurrent product, h' = (1 − z) h + z n), bppsa `cells.Generic` with the same equations and their analytic Jacobian (its H³ term as one GEMM; `cells.GRU`'s PyTorch convention, and `structured.BlockGRU(head_size=H)`'s, r ⊙ (h W_hn), cannot express this GRU); gru_diag = `ParaGRU(mix="diag", max_recurrent_norm=None)` (pararnn's default GRU, A_* = diag(a_*)), bppsa `structured.BlockGRU(I, H, 1, hidden_bias=False)` with the z gate negated (exact). Grad err: max over parameters of max |g − g_ref| / max |g_ref|, g_ref float64 autodiff through a sequential lax.scan. States agree (max |H_bppsa − H_peer| < {STATE_TOL:g}) and grad err < {GRAD_TOL:g} everywhere{'' if not failed else ' EXCEPT ' + repr(failed)}. Ratios > 1: bppsa faster.

{table}

{chr(10).join(notes)}
"""
    Path(f"{out}.md").write_text(md)
    print(table)


def main(argv=None):
    args = parse_args(argv)
    if args._reference:
        return reference_main(*args._reference)
    if args.render:
        return render_md(args.render.removesuffix(".json"), json.loads(Path(args.render).read_text()))
    # one core, single-threaded XLA: before JAX is imported
    os.sched_setaffinity(0, {args.core})
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                               + " --xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1").strip()
    load0 = list(os.getloadavg())
    if args.quick:
        points = dict(QUICK)
    else:
        table = {**POINTS, **EXTRA}
        names = args.points or list(POINTS) + (list(EXTRA) if args.extra else [])
        unknown = [n for n in names if n not in table]
        if unknown:
            raise SystemExit(f"unknown points {unknown}; choose from {list(table)}")
        points = {n: table[n] for n in names}
    out = args.out or (str(REPO / "runs" / "pararnn-peer-quick") if args.quick
                       else str(REPO / "experiments" / "results" / "cpu" / "pararnn-peer"))
    peer_python = ensure_peer_venv(args.peer_venv)
    have = newton_available()
    if args.forward == "newton" and not have:
        raise SystemExit("bppsa.Options has no forward='newton' yet; run with --forward auto or sequential")
    use_newton = have and args.forward != "sequential"
    print(f"bppsa forward='newton': {'yes' if use_newton else 'no (not available)' if not have else 'no'}", flush=True)
    t0 = time.perf_counter()
    rows = []
    with tempfile.TemporaryDirectory(prefix="pararnn-peer-") as tmp:
        for name, spec in points.items():
            rows.append(run_point(name, spec, args, peer_python, use_newton, Path(tmp)))
    write_outputs(out, rows, args, use_newton, peer_python, time.perf_counter() - t0, load0)


if __name__ == "__main__":
    main()
