"""Replicas as real processes under ``jax.distributed``, at emulated speeds.

One replica per process (one CPU device each, processes in process-index order). Every step a
replica computes the gradient sum over its own b_i samples (its own shape: a slow replica does
less work), then waits as a device f_i times slower than the fastest would, then joins one
all-reduce of (gradient sum, count) — so fast replicas really wait at the collective.

Two emulation modes (:data:`EMULATIONS`):

- ``"sleep"`` (default): the step takes its own compute plus a sleep of τ·f_i·b_i, with one τ
  (seconds per sample) calibrated once per run as ``sleep_scale`` × this machine's compute time
  per sample at the nominal batch, or given. The configured heterogeneity then shows whatever
  the machine's load: on 2 shared cores four processes contend for compute, but not for sleep.
- ``"stretch"``: the step takes f_i × its compute (a sleep of (f_i − 1)× the median of the recent
  compute times at that shape). Contention on a busy host is multiplied by f_i.

:meth:`ProcessReplicas.profile` times replicas one at a time (the others wait at a barrier),
rejects outliers (:func:`~bppsa.hetero.profile.robust_median`) and fits t_i(b) = α_i + β_i·b to
each replica's whole step; every process gets every replica's model and the same speeds.
"""

from __future__ import annotations

import time
from functools import partial
from typing import Callable

import jax
import numpy as np

from bppsa.hetero.profile import TimeModel, fit_time_model, robust_median
from bppsa.hetero.spmd import data_mesh, local_grad_sum, make_allreduce
from bppsa.hetero.train import as_schedule, slowdowns_at

__all__ = ["EMULATIONS", "ProcessReplicas"]

EMULATIONS = ("sleep", "stretch")


def _sleep_until(deadline: float):
    while (left := deadline - time.perf_counter()) > 0:
        time.sleep(left)


class ProcessReplicas:
    """This process's replica of a multi-process job (see the module docstring).

    After :meth:`calibrate`, ``calibration`` holds τ, the compute time per sample and the
    all-reduce time; after :meth:`profile`, ``profile_log`` holds every replica's timings.
    Construct it after ``jax.distributed`` is initialised, in every process.

    Args:
      loss_fn: the per-sample loss, ``loss_fn(params, x, y) -> (b,)``.
      slowdowns: (P,) factors f_i (speed ∝ 1/f_i; :func:`~bppsa.hetero.profile.slowdowns_from_mix`),
        one per process, or a schedule [(step, (P,)), ...] for speeds that drift; ``schedule`` may be
        replaced between runs.
      emulation: ``"sleep"`` or ``"stretch"`` (:data:`EMULATIONS`).
      tau: seconds of sleep per sample at f = 1 (``"sleep"`` only), >= 0; None: :meth:`calibrate`
        sets it.
      sleep_scale: τ = sleep_scale × the compute time per sample, where :meth:`calibrate` sets τ (> 0).

    Raises:
      ValueError: for an unknown emulation, a tau below 0, a sleep_scale not above 0, or slowdowns
      that are not positive factors, one per process.
    """

    def __init__(self, loss_fn: Callable, slowdowns, *, emulation: str = "sleep", tau: float | None = None,
                 sleep_scale: float = 8.0):
        if emulation not in EMULATIONS:
            raise ValueError(f"emulation must be one of {EMULATIONS}; got {emulation!r}")
        if tau is not None and not tau >= 0:
            raise ValueError(f"tau must be >= 0 seconds per sample; got {tau!r}")
        if not sleep_scale > 0:
            raise ValueError(f"sleep_scale must be > 0; got {sleep_scale!r}")
        self.pid, self.num_replicas = jax.process_index(), jax.process_count()
        self.schedule = as_schedule(slowdowns)
        if len(self.schedule[0][1]) != self.num_replicas:
            raise ValueError(f"slowdowns must have one factor per process ({self.num_replicas}); got {slowdowns!r}")
        self.emulation, self.tau, self.sleep_scale = emulation, tau, float(sleep_scale)
        self.allreduce = make_allreduce(data_mesh())
        self.local = jax.jit(partial(local_grad_sum, loss_fn))
        self._warm: set = set()
        self._tc: dict = {}
        self.calibration: dict | None = None
        self.profile_log: list | None = None

    def reset(self, seed: int):
        pass

    def barrier(self):
        self.allreduce({"barrier": np.zeros(1)})

    def _share(self, values: dict) -> dict:
        """Every process's ``values`` (dict of floats or equal-length lists), as (P, ...) arrays."""
        rows = {k: np.zeros((self.num_replicas,) + np.shape(v)) for k, v in values.items()}
        for k, v in values.items():
            rows[k][self.pid] = v
        return self.allreduce(rows)

    def _compute(self, params, x, y):
        """(gradient sum, loss sum, count) on these rows, and its seconds (compiled beforehand)."""
        if len(x) == 0:
            return None, 0.0
        mask = np.ones(len(x), bool)
        if x.shape not in self._warm:
            jax.block_until_ready(self.local(params, x, y, mask))
            self._warm.add(x.shape)
        t0 = time.perf_counter()
        out = jax.block_until_ready(self.local(params, x, y, mask))
        return out, time.perf_counter() - t0

    def _busy(self, params, x, y, step):
        """One replica step without the collective: compute, then the emulated slowdown."""
        tau = self.tau
        if self.emulation == "sleep" and tau is None:
            raise RuntimeError("ProcessReplicas(emulation='sleep') needs tau: pass it or call calibrate() first")
        f = float(slowdowns_at(self.schedule, step)[self.pid])
        t0 = time.perf_counter()
        out, tc = self._compute(params, x, y)
        if out is not None and self.emulation == "sleep":
            assert tau is not None  # checked above: "sleep" without tau raised
            _sleep_until(t0 + tc + tau * f * len(x))
        elif out is not None and f > 1:
            # stretch by the median of this shape's recent compute times, so that one hiccup of a
            # busy host is not multiplied by f
            recent = self._tc.setdefault(x.shape, [])
            recent[:] = (recent + [tc])[-9:]
            time.sleep((f - 1) * float(np.median(recent)))
        return out, time.perf_counter() - t0

    def calibrate(self, params, x, y, batch: int, repeats: int = 7) -> dict:
        """Measure once per run: compute per sample at ``batch`` (process 0 alone, the others at a
        barrier), τ = ``sleep_scale`` × that (unless τ was given), and the all-reduce's time."""
        per_sample = 0.0
        self.barrier()
        if self.pid == 0:
            xb, yb = x[:batch], y[:batch]
            per_sample = robust_median([self._compute(params, xb, yb)[1] for _ in range(repeats)])["median"] / len(xb)
        per_sample = float(self._share({"c": per_sample})["c"].sum())
        if self.tau is None:
            self.tau = self.sleep_scale * per_sample
        tree = {"g": jax.tree.map(np.asarray, params), "n": 0.0, "t": np.zeros(self.num_replicas)}
        self.allreduce(tree)  # compile
        comm = []
        for _ in range(repeats):
            self.barrier()
            t0 = time.perf_counter()
            self.allreduce(tree)
            comm.append(time.perf_counter() - t0)
        comm = float(self._share({"c": robust_median(comm)["median"]})["c"].max())
        self.calibration = {"emulation": self.emulation, "batch": int(batch), "compute_per_sample_s": per_sample,
                            "tau_s": float(self.tau), "sleep_scale": self.sleep_scale, "allreduce_s": comm}
        return self.calibration

    def profile(self, probe_batches, repeats: int = 3, *, params=None, x=None, y=None) -> list[TimeModel]:
        """Every replica's t(b) = α + β·b, timed one replica at a time; the same list on every process."""
        if x is None or y is None or params is None:
            raise ValueError("ProcessReplicas.profile needs params=, x= and y= (the training data)")
        probes = [int(b) for b in probe_batches]
        for b in probes:  # every process compiles every probe shape at once, before anyone is timed
            self._compute(params, x[:b], y[:b])
        stats = []
        for r in range(self.num_replicas):
            self.barrier()  # replica r alone; the others wait at the next barrier
            if r == self.pid:
                stats = [robust_median([self._busy(params, x[:b], y[:b], 0)[1] for _ in range(repeats)])
                         for b in probes]
        self.barrier()
        mine = fit_time_model(probes, [s["median"] for s in stats])
        shared = self._share({"alpha": mine.alpha, "beta": mine.beta,
                              "median_s": [s["median"] for s in stats], "spread": [s["spread"] for s in stats],
                              "rejected": [s["rejected"] for s in stats]})
        models = [TimeModel(float(a), float(b)) for a, b in zip(shared["alpha"], shared["beta"])]
        self.profile_log = [{"replica": i, "probe_batches": probes, "repeats": int(repeats),
                             "median_s": shared["median_s"][i].tolist(), "spread": shared["spread"][i].tolist(),
                             "rejected": [int(v) for v in shared["rejected"][i]],
                             "alpha_s": models[i].alpha, "beta_s": models[i].beta}
                            for i in range(self.num_replicas)]
        return models

    def _tree(self, out, params, busy, average):
        if out is None:
            g = jax.tree.map(lambda p: np.zeros(np.shape(p), np.asarray(p).dtype), params)
            loss_sum, n = 0.0, 0.0
        else:
            g, loss_sum, n = jax.tree.map(np.asarray, out)
        n = float(n)
        t = np.zeros(self.num_replicas)
        t[self.pid] = busy  # one-hot: every process sees every replica's busy time, so all re-balance alike
        if average == "weighted":
            return {"g": g, "loss": loss_sum, "n": n, "t": t}
        return {"g": jax.tree.map(lambda a: a / max(n, 1.0), g), "k": float(n > 0), "loss": loss_sum, "n": n, "t": t}

    def step(self, params, x, y, index_lists, counts, average, step):
        """grads, mean loss, per-replica busy times (P,), this step's wall time (s)."""
        mine = index_lists[self.pid]
        xl, yl = x[mine], y[mine]
        sig = (average, tuple(int(c) for c in counts))
        if sig not in self._warm:
            # a new split: every process compiles its local step and the all-reduce here, before the
            # clock starts (the all-reduce doubles as a barrier), so no one's compile is counted as
            # another's waiting time
            out, _ = self._compute(params, xl, yl)
            self.allreduce(jax.tree.map(np.zeros_like, self._tree(out, params, 0.0, average)))
            self._warm.add(sig)
        t0 = time.perf_counter()
        out, busy = self._busy(params, xl, yl, step)
        s = self.allreduce(self._tree(out, params, busy, average))
        denom = s["n"] if average == "weighted" else s["k"]
        g = jax.tree.map(lambda a: a / max(float(denom), 1.0), s["g"])
        return g, float(s["loss"]) / max(float(s["n"]), 1.0), s["t"], time.perf_counter() - t0
