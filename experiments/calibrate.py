"""Calibration of the cost model (:mod:`bppsa.plan.cost`) on this device: a short probe that times
the real BPTT and BPPSA backward functions at a few (T, B), fitted with :meth:`CostModel.fit`
and cached per device (``bppsa bench --calibrate``, or :func:`load_cost_model` from Python).
"""

from __future__ import annotations

import jax.numpy as jnp

from bppsa import cells
from bppsa.host import time_interleaved
from bppsa.plan import calibration
from bppsa.plan import cost as cost_lib
from bppsa.plan.cost import CostModel
from experiments import gradient

__all__ = ["PROBE_POINTS", "DENSE_PROBE_POINTS", "GATED_PROBE_POINTS", "calibrate", "probe_cells", "load_cost_model"]


PROBE_POINTS = ((64, 1), (512, 1), (4096, 1), (16384, 1), (256, 2), (2048, 2), (256, 8), (1024, 4),
                (512, 32))
# Points probed a second time with the RNN's diagonal structure switched off, so that b_dense
# (cells whose Jacobians are formed: GRU, LSTM, generic) is measured, not guessed.
DENSE_PROBE_POINTS = ((4096, 1), (1024, 4), (512, 32))
# Points probed with a GRU and an LSTM (G = 3, 4 gates): a gated step costs BPTT more latency than
# the RNN's and BPPSA more Jacobian work, which a probe of the RNN alone cannot tell apart (its fit
# mispredicted the gated cells by up to 8x and chose BPPSA where BPTT was twice as fast).
GATED_PROBE_POINTS = ((4096, 1), (1024, 4), (512, 16))


def calibrate(*, points=PROBE_POINTS, dense_points=DENSE_PROBE_POINTS, gated_points=GATED_PROBE_POINTS,
              hidden_size: int = 20, repeats: int = 5, dtype=jnp.float32, scan: str = "blelloch") -> CostModel:
    """Fit :class:`bppsa.plan.cost.CostModel` on this device from a short probe (vanilla RNN, a few
    (T, B); the ``dense_points`` again with ``cells.RNN(..., diagonal=False)``; the
    ``gated_points`` with ``cells.GRU`` and ``cells.LSTM``: :func:`probe_cells`).

    Each probe point times the backward alone (:func:`experiments.gradient.backward_functions`, the one
    timed loss) of the three methods ``backward="auto"`` chooses among (tuned BPTT, BPPSA with
    ``scan`` and with the sequential scan), interleaved. Seconds on a CPU; the result is cached by
    :func:`load_cost_model`.
    """
    features = {k: [] for k in cost_lib.METHODS}
    seconds = {k: [] for k in cost_lib.METHODS}
    names = {"bptt": "bptt", "bppsa": f"bppsa_{scan}", "bppsa_sequential": "bppsa_sequential"}
    probes = probe_cells(points, dense_points, gated_points, hidden_size)
    for c, T, B in probes:
        params, xs, h0, R = gradient.problem(c, T, B, dtype=dtype, seed=T + B)
        fns = gradient.backward_functions(c, params, xs, h0, R, names.values())
        t = time_interleaved({k: fns[m] for k, m in names.items()}, repeats=repeats)
        f = cost_lib.cost_features(c, T, B, jnp.dtype(dtype).itemsize)
        for k in features:
            features[k].append(f[k])
            seconds[k].append(t[k]["min"])
    meta = {"device": calibration.device_key(), "model_version": calibration.COST_MODEL_VERSION,
            "points": [list(p) for p in points],
            "dense_points": [list(p) for p in dense_points], "gated_points": [list(p) for p in gated_points],
            "hidden_size": hidden_size,
            "scan": scan, "dtype": str(jnp.dtype(dtype)), "measured": seconds}
    return CostModel.fit(features, seconds, meta)


def probe_cells(points, dense_points, gated_points, hidden_size: int) -> list:
    """The probe's (cell, T, B) in order: the RNN at ``points``, the RNN without its diagonal
    structure at ``dense_points``, then a GRU and an LSTM at ``gated_points`` (input size 1)."""
    dense = cells.RNN(1, hidden_size, diagonal=False)
    gated = [(cell, T, B) for cell in (cells.GRU(1, hidden_size), cells.LSTM(1, hidden_size)) for T, B in gated_points]
    return [(cells.RNN(1, hidden_size), T, B) for T, B in points] + [(dense, T, B) for T, B in dense_points] + gated


def load_cost_model(*, recalibrate: bool = False, **calibrate_kw) -> CostModel:
    """The cached :class:`bppsa.plan.cost.CostModel` for this device (:func:`bppsa.plan.calibration.load`); probe
    (:func:`calibrate`) and cache it when missing, stale or ``recalibrate``."""
    model = None if recalibrate else calibration.load()
    if model is None:
        model = calibrate(**calibrate_kw)
        calibration.save(model)
    return model
