"""Calibration of the cost model (:mod:`bppsa.cost`) on this device: a short probe that times
the real BPTT and BPPSA backward functions at a few (T, B), fitted with :meth:`CostModel.fit`
and cached per device (``bppsa bench --calibrate``, or :func:`load_cost_model` from Python).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from . import backprop, cells
from . import cost as cost_lib
from .cost import CostModel
from .timing import time_interleaved

__all__ = ["PROBE_POINTS", "DENSE_PROBE_POINTS", "calibrate", "load_cost_model"]


PROBE_POINTS = ((64, 1), (512, 1), (4096, 1), (16384, 1), (256, 2), (2048, 2), (256, 8), (1024, 4),
                (512, 32))
# Points probed a second time with the RNN's diagonal structure switched off, so that b_dense
# (cells whose Jacobians are formed: GRU, LSTM, generic) is measured, not guessed.
DENSE_PROBE_POINTS = ((4096, 1), (1024, 4), (512, 32))


def calibrate(*, points=PROBE_POINTS, dense_points=DENSE_PROBE_POINTS, hidden_size: int = 20,
              repeats: int = 5, dtype=jnp.float32, scan: str = "blelloch") -> CostModel:
    """Fit :class:`bppsa.cost.CostModel` on this device from a short probe (vanilla RNN, a few
    (T, B); the ``dense_points`` again with ``cells.RNN(..., diagonal=False)``).

    Each probe point times the three backward functions ``backward="auto"`` chooses among (the
    ``jax.vjp`` backward of tuned BPTT, of BPPSA with ``scan`` and with the sequential scan),
    interleaved. Seconds on a CPU; the result is cached by :func:`load_cost_model`.
    """
    cell = cells.RNN(1, hidden_size)
    params = cell.init(jax.random.key(0), dtype)
    features = {k: [] for k in cost_lib.METHODS}
    seconds = {k: [] for k in cost_lib.METHODS}
    apply_vjp = jax.jit(lambda f, c: f(c))
    dense = cells.RNN(1, hidden_size, diagonal=False)
    probes = [(cell, T, B) for T, B in points] + [(dense, T, B) for T, B in dense_points]
    for c, T, B in probes:
        xs = jax.random.normal(jax.random.key(T + B), (T, B, 1), dtype)
        s0 = jnp.zeros((B, hidden_size), dtype)
        ct = jnp.ones((T, B, hidden_size), dtype)
        _, vb = jax.vjp(lambda p, x, s: backprop.forward_states(c, p, x, s), params, xs, s0)
        _, vp = jax.vjp(lambda p, x, s: backprop.bppsa_states(c, scan, "auto", p, x, s), params, xs, s0)
        _, vq = jax.vjp(lambda p, x, s: backprop.bppsa_states(c, "sequential", "auto", p, x, s), params, xs, s0)
        t = time_interleaved({"bptt": lambda: apply_vjp(vb, ct), "bppsa": lambda: apply_vjp(vp, ct),
                              "bppsa_sequential": lambda: apply_vjp(vq, ct)}, repeats=repeats)
        f = cost_lib.cost_features(c, T, B, jnp.dtype(dtype).itemsize)
        for k in features:
            features[k].append(f[k])
            seconds[k].append(t[k]["min"])
    meta = {"device": cost_lib.device_key(), "model_version": cost_lib.COST_MODEL_VERSION, "points": [list(p) for p in points],
            "dense_points": [list(p) for p in dense_points], "hidden_size": hidden_size,
            "scan": scan, "dtype": str(jnp.dtype(dtype)), "measured": seconds}
    return CostModel.fit(features, seconds, meta)


def load_cost_model(*, recalibrate: bool = False, **calibrate_kw) -> CostModel:
    """The cached :class:`bppsa.cost.CostModel` for this device (:func:`bppsa.cost.load`); probe
    (:func:`calibrate`) and cache it when missing, stale or ``recalibrate``."""
    model = None if recalibrate else cost_lib.load()
    if model is None:
        model = calibrate(**calibrate_kw)
        cost_lib.save(model)
    return model
