"""pararnn-torch's equations in JAX, the points and the float64 reference of the pararnn-torch
comparison (experiments.extensions.pararnn_peer, the task of experiments/extensions/configs/pararnn_peer.py).

A point (:func:`make_point`) is the weights under the peer's parameter names, the inputs, h0 and
the loss's fixed R; :func:`save_point` writes it as the .npz the peer's driver
(experiments/scripts/_pararnn_peer_driver.py) reads (numpy only, no pickle). :func:`step_fn` and
:func:`gru_jacobian_fn` are pararnn's equations; :func:`bppsa_cell` the bppsa cell that runs them,
with the parameter maps both ways; :func:`reference_main` the float64 states and gradients by
autodiff through a plain sequential ``lax.scan`` (run in a subprocess with x64 on);
:func:`grad_error` the error measure.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from bppsa import cells

__all__ = ["make_point", "save_point", "load_point", "step_fn", "gru_jacobian_fn", "bppsa_cell",
           "structured_gru_available", "structured_diag_gru", "reference_main", "grad_error"]


# ---------------------------------------------------------------- the points

def make_point(kind, T, B, I, H, seed=0):
    """Weights (PyTorch's U(±1/√H) for every tensor), inputs (the paper's bitstreams for the RNN,
    N(0, 1) features for the GRU), h0 U(±0.5), R N(0, 1); float32, peer parameter names."""
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
    np.savez(path, kind=np.array(kind), xs=xs, h0=h0, R=R, **{"param__" + k: v for k, v in params.items()})


def load_point(path):
    d = np.load(path)
    params = {k[len("param__"):]: d[k] for k in d.files if k.startswith("param__")}
    return str(d["kind"]), params, d["xs"], d["h0"], d["R"]


# ---------------------------------------------------------------- the equations, in JAX

def step_fn(kind):
    """Per-example step (params in peer names, h (H,), x (I,)) -> h' (H,): pararnn's equations."""

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
    convention field on cells.GRU; a diagonal / block-diagonal cell from bppsa.cells for
    gru_diag and mix="head") replaces the Generic here, with its own parameter mapping."""
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
    """Whether bppsa.cells has the BlockGRU that runs the diagonal GRU exactly."""
    return hasattr(cells, "BlockGRU")


def structured_diag_gru(I, H):
    """pararnn's diagonal GRU as ``bppsa.cells.BlockGRU(I, H, head_size=1, hidden_bias=False)``.

    Exact: with a diagonal recurrence a_n ⊙ (h ⊙ r) = r ⊙ (a_n ⊙ h), so the reset position does
    not matter (no hidden bias), and pararnn's z is 1 − bppsa's z, i.e. bppsa's z gate has the
    negated pre-activation (z columns of W_x, b_x and W_h negated). Gate order (z, r, n) ->
    (r, z, n); W_h (N = H, k = 1, 3)."""
    cell = cells.BlockGRU(I, H, 1, hidden_bias=False)

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
    jax.config.update("jax_enable_x64", True)
    kind, params, xs, h0, R = load_point(inp)
    f = jax.vmap(step_fn(kind), in_axes=(None, 0, 0))
    p64 = {k: jnp.asarray(v, jnp.float64) for k, v in params.items()}
    xs, h0, R = (jnp.asarray(a, jnp.float64) for a in (xs, h0, R))

    def states(p):
        def step(h, x):
            h = f(p, h, x)
            return h, h
        return jax.lax.scan(step, h0, xs)[1]

    hs = states(p64)
    grads = jax.grad(lambda p: jnp.vdot(states(p), R))(p64)
    arrays: dict[str, Any] = {"hs": np.asarray(hs), **{"grad__" + k: np.asarray(v) for k, v in grads.items()}}
    np.savez(out, **arrays)


def grad_error(grads, ref):
    """``max over parameters of max |g − g_ref| / max |g_ref|``."""
    return max(float(np.abs(np.asarray(grads[k], np.float64) - ref[k]).max() / np.abs(ref[k]).max()) for k in ref)
