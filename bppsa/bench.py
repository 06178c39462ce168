"""Timing harness for BPPSA vs BPTT (``bppsa bench``, ``bppsa reproduce rnn-sweep``).

Every timing here follows one protocol: the functions under test are jitted and compiled
first (``warmup`` calls, excluded), then called ``repeats`` times *interleaved* (one call of
each function per round), each call ended by ``jax.block_until_ready``; we report the median,
min and max in seconds. Interleaving makes ratios fair on a shared, noisy machine.

Components (the paper's breakdown, Wang et al. 2020 §5):

    forward          the ``lax.scan`` forward pass (shared by both methods)
    jacobian         transposed-Jacobian generation for all T steps (the paper's "FO")
    bppsa_backward   the scan alone (Blelloch by default) on precomputed Jacobians
    param_grads      the batched parameter-gradient contraction
    bppsa_backward_full  the whole BPPSA backward (jacobian + scan + contraction, one jit), i.e.
                     the backward function of ``jax.vjp`` of ``bppsa.rnn(..., backward="bppsa")``
    bptt_backward    the backward function of ``jax.vjp`` of the plain ``lax.scan`` forward
    step_bppsa, step_bptt  one training step: forward + backward + Adam update of the cell and a
                     linear classifier head on the last hidden state (the paper's model)

Derived: ``speedup_backward = bptt_backward / bppsa_backward_full`` (what a user gains on the
backward pass), ``speedup_scan = bptt_backward / bppsa_backward`` (the paper's scan-only view)
and ``speedup_step = step_bptt / step_bppsa`` (overall training step).
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from . import backprop
from . import scan as scan_lib

__all__ = ["time_components", "component_functions", "time_interleaved", "make_train_step", "COMPONENTS"]

COMPONENTS = ("forward", "jacobian", "bppsa_backward", "param_grads", "bppsa_backward_full",
              "bptt_backward", "step_bppsa", "step_bptt")


def _stats(samples) -> dict:
    s = np.asarray(samples, dtype=float)
    return {"median": float(np.median(s)), "min": float(s.min()), "max": float(s.max()),
            "repeats": int(s.size)}


def time_interleaved(fns: dict, *, repeats: int = 5, warmup: int = 1) -> dict:
    """Time zero-argument callables interleaved: {name: fn} -> {name: {median, min, max, repeats}}.

    Each ``fn()`` must return JAX arrays (a pytree); the call is ended by ``block_until_ready``.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1; got {repeats}")
    if warmup < 0:
        raise ValueError(f"warmup must be >= 0; got {warmup}")
    for fn in fns.values():  # compile (the first call) plus the requested warm-up calls
        for _ in range(max(warmup, 1)):
            jax.block_until_ready(fn())
    samples = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            jax.block_until_ready(fn())
            samples[name].append(time.perf_counter() - t0)
    return {name: _stats(s) for name, s in samples.items()}


def _head_init(key, H, num_classes, dtype):
    bound = 1.0 / float(H) ** 0.5
    k1, k2 = jax.random.split(key)
    return {"W": jax.random.uniform(k1, (H, num_classes), dtype, -bound, bound),
            "b": jax.random.uniform(k2, (num_classes,), dtype, -bound, bound)}


def make_train_step(cell, backward: str, scan: str = "blelloch", learning_rate: float = 1e-3,
                    chunk_size: int | None = None):
    """A jitted ``step(state, xs, h0, labels) -> (state, loss)``; state = (params, head, opt_state).

    The model is the paper's: ``cell`` over xs (T, B, I), a linear head on the last hidden state,
    softmax cross-entropy against labels (B,), one Adam update.
    """
    tx = optax.adam(learning_rate)
    kw = {} if chunk_size is None else {"chunk_size": chunk_size}

    def loss_fn(weights, xs, h0, labels):
        params, head = weights
        out = backprop.rnn(cell, params, xs, h0, backward=backward, scan=scan, **kw)
        hs = out[0] if isinstance(out, tuple) else out
        logits = hs[-1] @ head["W"] + head["b"]
        return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

    @jax.jit
    def step(state, xs, h0, labels):
        params, head, opt_state = state
        loss, grads = jax.value_and_grad(loss_fn)((params, head), xs, h0, labels)
        updates, opt_state = tx.update(grads, opt_state, (params, head))
        params, head = optax.apply_updates((params, head), updates)
        return (params, head, opt_state), loss

    def init(params, head):
        return params, head, tx.init((params, head))

    return step, init


def _bppsa_inputs(cell, ss, s0, xs, ct):
    """Scan-order arrays, as :mod:`bppsa.backprop` builds them: (spr, xr, sr, v, ds)."""
    xr, sr = xs[::-1], ss[::-1]
    spr = jnp.concatenate([ss[-2::-1], s0[None]], axis=0) if ss.shape[0] > 1 else s0[None]
    ctr = ct[::-1]
    ds = jnp.concatenate([ctr[1:], jnp.zeros_like(ctr[:1])], axis=0)
    return spr, xr, sr, ctr[0], ds


def component_functions(cell, params, xs, h0, *, scan: str = "blelloch", num_classes: int = 10,
                        seed: int = 0) -> dict:
    """The zero-argument, compiled-on-first-call functions :func:`time_components` times.

    {name: fn} for every name in :data:`COMPONENTS`; the backward functions use a random
    cotangent on every step (seeded), the step functions a random head and labels.
    """
    xs = jnp.asarray(xs)
    s0 = backprop._validate(cell, params, xs, h0)
    T, B, I = xs.shape
    S = cell.state_size
    dtype = xs.dtype
    key = jax.random.key(seed)
    k_ct, k_head, k_lab = jax.random.split(key, 3)
    ct = jax.random.normal(k_ct, (T, B, S), dtype)

    fwd = jax.jit(lambda p, x, s: backprop._forward(cell, p, x, s))
    ss = jax.block_until_ready(fwd(params, xs, s0))

    spr, xr, sr, v, ds = jax.jit(lambda ss, s0, xs, ct: _bppsa_inputs(cell, ss, s0, xs, ct))(ss, s0, xs, ct)
    jac = jax.jit(cell.transposed_jacobian)
    Ms = jax.block_until_ready(jac(params, spr, xr, sr))
    scan_fn = jax.jit(lambda v, Ms, ds: scan_lib.scan(v, Ms, ds, scan))
    gs, _ = jax.block_until_ready(scan_fn(v, Ms, ds))
    pg = jax.jit(cell.param_grads)

    _, vjp_bptt = jax.vjp(lambda p, x, s: backprop._forward(cell, p, x, s), params, xs, s0)
    _, vjp_bppsa = jax.vjp(backprop._bppsa_fn(cell, scan), params, xs, s0)
    apply_vjp = jax.jit(lambda f, c: f(c))

    head = _head_init(k_head, cell.hidden_size, num_classes, dtype)
    labels = jax.random.randint(k_lab, (B,), 0, num_classes)
    steps = {}
    for m in ("bppsa", "bptt"):
        step, init = make_train_step(cell, m, scan)
        steps[m] = (step, init(params, head))

    return {
        "forward": lambda: fwd(params, xs, s0),
        "jacobian": lambda: jac(params, spr, xr, sr),
        "bppsa_backward": lambda: scan_fn(v, Ms, ds),
        "param_grads": lambda: pg(params, spr, xr, sr, gs),
        "bppsa_backward_full": lambda: apply_vjp(vjp_bppsa, ct),
        "bptt_backward": lambda: apply_vjp(vjp_bptt, ct),
        "step_bppsa": lambda: steps["bppsa"][0](steps["bppsa"][1], xs, h0, labels),
        "step_bptt": lambda: steps["bptt"][0](steps["bptt"][1], xs, h0, labels),
    }


def time_components(cell, params, xs, h0, *, scan: str = "blelloch", repeats: int = 5,
                    warmup: int = 1, num_classes: int = 10, seed: int = 0) -> dict:
    """Time the pieces of one BPPSA and one BPTT training step, interleaved in one process.

    Args:
      cell, params: a cell from :mod:`bppsa.cells` and its parameters.
      xs: (T, B, I) inputs; h0: (B, H) initial state (LSTM: (h0, c0)).
      scan: the BPPSA scan ("blelloch", "associative", "sequential").
      repeats, warmup: timed rounds and untimed warm-up calls (compilation is always excluded).
      num_classes: width of the linear head used by the training-step timings.

    Returns a dict with one entry per name in :data:`COMPONENTS`, each
    ``{"median", "min", "max", "repeats"}`` in seconds, plus ``speedup_backward``,
    ``speedup_scan`` and ``speedup_step`` (BPTT time / BPPSA time; > 1 means BPPSA is faster)
    and ``shape`` = {"T", "B", "I", "S", "dtype"}.
    """
    xs = jnp.asarray(xs)
    fns = component_functions(cell, params, xs, h0, scan=scan, num_classes=num_classes, seed=seed)
    out = time_interleaved(fns, repeats=repeats, warmup=warmup)
    med = {k: v["median"] for k, v in out.items()}
    out["speedup_backward"] = med["bptt_backward"] / med["bppsa_backward_full"]
    out["speedup_scan"] = med["bptt_backward"] / med["bppsa_backward"]
    out["speedup_step"] = med["step_bptt"] / med["step_bppsa"]
    T, B, I = xs.shape
    out["shape"] = {"T": T, "B": B, "I": I, "S": cell.state_size, "dtype": str(xs.dtype)}
    return out
