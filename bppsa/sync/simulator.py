"""A deterministic discrete-event simulator of parameter-server training under a sync policy.

Time is virtual: each worker's iteration takes a time drawn from its :class:`ComputeModel`, while
the gradients are real — computed with JAX on the parameters that worker actually pulled, so the
staleness effects on convergence are real. The server applies each update on arrival with an
optax optimizer and asks the policy (:mod:`bppsa.sync.policies`) who waits.

Same arguments and seed ⇒ the same result (event ties are broken by a sequence number; every
random draw comes from a numpy generator seeded by (seed, worker)).
"""

from __future__ import annotations

import dataclasses
import heapq

import jax
import numpy as np
import optax

from ..data.task import Task
from ..tasks import task_from_spec
from .policies import BARRIER, PROCEED, Policy, make_policy

__all__ = ["ComputeModel", "heterogeneous", "simulate", "time_to_accuracy", "policy_label", "sgd"]


@dataclasses.dataclass(frozen=True)
class ComputeModel:
    """Per-worker iteration times (virtual seconds).

    Args:
      means: (n,) mean compute time of one iteration per worker (e.g. a 2.5× slower GPU: 2.5).
      sigma: log-normal noise: time = mean · exp(σ·z − σ²/2), z ~ N(0, 1) (mean-preserving).
      stragglers: tuples (worker, start, end, factor): iterations starting in [start, end) take
        ``factor`` times longer (a transient straggler).
      join_times: (n,) when each worker joins (0 = from the start); late joiners must have the
        highest worker ids.
      comm: fixed push + pull latency added to every iteration.
      deaths: tuples (worker, time): the worker dies then; its in-flight update never arrives and
        the server notices after ``detect_timeout``.
      detect_timeout: how long after a death the server drops the worker.
    """
    means: tuple
    sigma: float = 0.1
    stragglers: tuple = ()
    join_times: tuple | None = None
    comm: float = 0.0
    deaths: tuple = ()
    detect_timeout: float = 0.0

    def __post_init__(self):
        m = np.asarray(self.means, dtype=float)
        if m.ndim != 1 or m.size < 1 or np.any(m <= 0):
            raise ValueError(f"means must be a non-empty 1-D sequence of positive times; got {self.means!r}")
        if self.sigma < 0:
            raise ValueError(f"sigma must be >= 0; got {self.sigma}")
        if self.join_times is not None:
            j = np.asarray(self.join_times, dtype=float)
            if j.shape != m.shape or np.any(j < 0):
                raise ValueError(f"join_times must be {m.size} non-negative times; got {self.join_times!r}")
            initial = np.nonzero(j == 0)[0]
            if initial.size == 0 or initial.max() != initial.size - 1:
                raise ValueError("workers that join at time 0 must be 0..k-1 (late joiners last); "
                                 f"got join_times {self.join_times!r}")
        for s in self.stragglers:
            if len(s) != 4 or not 0 <= s[0] < m.size or s[3] <= 0:
                raise ValueError("each straggler must be (worker, start, end, factor>0) with a valid worker; "
                                 f"got {s!r}")

    @property
    def num_workers(self) -> int:
        return len(self.means)

    def join_time(self, p) -> float:
        return 0.0 if self.join_times is None else float(self.join_times[p])

    def sample(self, p: int, t: float, rng: np.random.Generator) -> float:
        d = float(self.means[p]) * float(np.exp(self.sigma * rng.standard_normal() - 0.5 * self.sigma ** 2))
        for w, start, end, factor in self.stragglers:
            if w == p and start <= t < end:
                d *= factor
        return d + self.comm


def heterogeneous(num_workers: int = 4, ratio: float = 2.5, base: float = 1.0, **kwargs) -> ComputeModel:
    """Mixed GPUs: the first half of the workers take ``base``, the rest ``ratio·base`` per iteration."""
    fast = (num_workers + 1) // 2
    return ComputeModel(means=tuple([base] * fast + [ratio * base] * (num_workers - fast)), **kwargs)


def policy_label(name: str, options: dict | None = None) -> str:
    """Table label: "BSP", "ASP", "SSP s=3", "DSSP(3,12)", "ElasticBSP R=15"."""
    o = options or {}
    key = name.lower().replace("_", "").replace("-", "")
    if key == "ssp":
        return f"SSP s={o.get('s', 3)}"
    if key == "dssp":
        return f"DSSP({o.get('s_L', 3)},{o.get('r_max', 12)})"
    if key == "elasticbsp":
        return f"ElasticBSP R={o.get('R', 15)}"
    return {"bsp": "BSP", "asp": "ASP"}.get(key, name)


_SGD: dict = {}


def sgd(learning_rate):
    """One optax.sgd per learning rate, so a task's jitted server step is reused across runs."""
    if learning_rate not in _SGD:
        _SGD[learning_rate] = optax.sgd(learning_rate)
    return _SGD[learning_rate]


def simulate(task, policy: str, compute: ComputeModel, *, policy_options: dict | None = None,
             optimizer: optax.GradientTransformation | None = None, learning_rate: float = 0.05,
             batch_size: int = 32, max_time: float = 100.0, eval_every: float = 1.0, seed: int = 0,
             target: float | None = None, stop_at_target: bool = False, max_pushes: int | None = None) -> dict:
    """Simulate PS training of ``task`` under ``policy``; return a JSON-able log.

    Args:
      task: a :class:`~bppsa.data.task.Task` or its spec ``{"name": ..., **options}`` for
        :func:`bppsa.tasks.task_from_spec`.
      policy: "bsp" | "asp" | "ssp" | "dssp" | "elasticbsp"; ``policy_options`` its arguments.
      compute: the workers' :class:`ComputeModel`.
      optimizer: the server's optax optimizer (default: SGD with ``learning_rate``).
      max_time: virtual seconds to simulate; eval_every: virtual seconds between test evaluations.
      target: test accuracy whose first reaching time is reported (and ends the run if
        ``stop_at_target``).

    Returns a dict with ``curve`` (time, pushes, test loss, test accuracy), ``wait`` per worker,
    ``pushes`` per worker, ``staleness_hist`` (staleness -> count), ``barriers``,
    ``time_to_target``, ``final_accuracy``, ``dssp_controller`` / ``elastic_barriers`` records.
    """
    if not isinstance(task, Task):
        task = task_from_spec(task)
    if max_time <= 0 or eval_every <= 0:
        raise ValueError(f"max_time and eval_every must be > 0; got {max_time}, {eval_every}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1; got {batch_size}")
    n = compute.num_workers
    initial = [p for p in range(n) if compute.join_time(p) == 0]
    pol: Policy = make_policy(policy, len(initial), **(policy_options or {}))
    opt = optimizer if optimizer is not None else sgd(learning_rate)
    grad_fn = task.grad_fn()
    acc_fn = task.accuracy_fn()
    server_step = task.server_step(opt)

    params = task.init(jax.random.key(seed))
    opt_state = opt.init(params)
    version = 0
    xtr, ytr = task.x_train, task.y_train
    batch_rng = [np.random.default_rng([seed, p, 1]) for p in range(n)]
    time_rng = [np.random.default_rng([seed, p, 2]) for p in range(n)]

    heap, seq = [], [0]

    def schedule(t, kind, p):
        heapq.heappush(heap, (t, seq[0], kind, p))
        seq[0] += 1

    pulled = [None] * n
    pulled_version = [0] * n
    alive = [True] * n
    wait_since: list[float | None] = [None] * n
    wait_kind = [None] * n
    wait_total = [0.0] * n
    pushes = [0] * n
    staleness = {}
    barriers = 0
    deaths_detected = []

    def start(p, t):
        pulled[p] = params
        pulled_version[p] = version
        schedule(t + compute.sample(p, t, time_rng[p]), "push", p)

    def release(qs, t):
        nonlocal barriers
        if any(wait_kind[q] == BARRIER for q in qs):
            barriers += 1
        for q in qs:
            wait_total[q] += t - wait_since[q]
            wait_since[q] = wait_kind[q] = None
            if alive[q]:
                start(q, t)

    def block(p, kind, t):
        wait_since[p], wait_kind[p] = t, kind

    def act(p, d, t):
        """Carry out a policy decision for worker p: run on or wait, then release whom it frees."""
        if d.kind == PROCEED:
            start(p, t)
        else:
            block(p, d.kind, t)
        release(d.release, t)

    for p in initial:
        start(p, 0.0)
    for p in range(n):
        if compute.join_time(p) > 0:
            schedule(compute.join_time(p), "join", p)
    for w, t_death in compute.deaths:
        schedule(float(t_death), "death", int(w))
    k_eval = 0
    schedule(0.0, "eval", -1)

    curve = []
    time_to_target = None
    t = 0.0
    total = 0
    while heap:
        t, _, kind, p = heapq.heappop(heap)
        if t > max_time:
            break
        if kind == "eval":
            loss, acc = (float(v) for v in acc_fn(params))
            curve.append({"time": t, "pushes": total, "loss": loss, "accuracy": acc})
            if target is not None and time_to_target is None and acc >= target:
                time_to_target = t
                if stop_at_target:
                    break
            k_eval += 1
            schedule(k_eval * eval_every, "eval", -1)
        elif kind == "push":
            if not alive[p]:
                continue  # died while computing: the update never arrives
            idx = batch_rng[p].integers(0, len(xtr), size=batch_size)
            _, g = grad_fn(pulled[p], xtr[idx], ytr[idx])
            s = version - pulled_version[p]
            staleness[s] = staleness.get(s, 0) + 1
            params, opt_state = server_step(params, opt_state, g)
            version += 1
            pushes[p] += 1
            total += 1
            act(p, pol.push(p, t), t)
            if max_pushes is not None and total >= max_pushes:
                break
        elif kind == "join":
            act(p, pol.join(p, t), t)
        elif kind == "death":
            alive[p] = False
            schedule(t + compute.detect_timeout, "detect", p)
        elif kind == "detect":
            d = pol.remove(p, t)
            deaths_detected.append({"worker": p, "time": t})
            if wait_since[p] is not None:
                wait_total[p] += t - wait_since[p]
                wait_since[p] = None
            release(d.release, t)
    end = min(t, max_time)
    for q, since in enumerate(wait_since):  # workers still waiting at the end
        if since is not None:
            wait_total[q] += end - since
    if not curve or curve[-1]["time"] < end:
        loss, acc = (float(v) for v in acc_fn(params))
        curve.append({"time": end, "pushes": total, "loss": loss, "accuracy": acc})
        if target is not None and time_to_target is None and acc >= target:
            time_to_target = end
    opts = dict(policy_options or {})
    out = {"policy": policy, "policy_options": opts, "label": policy_label(policy, opts),
           "seed": seed, "curve": curve, "wait": wait_total, "pushes": pushes, "total_pushes": total,
           "staleness_hist": {int(k): v for k, v in sorted(staleness.items())}, "barriers": barriers,
           "time_to_target": time_to_target, "target": target,
           "final_accuracy": curve[-1]["accuracy"], "end_time": end, "deaths_detected": deaths_detected}
    controller_calls = getattr(pol, "controller_calls", None)  # DSSP's
    if controller_calls is not None:
        out["dssp_controller"] = [list(c) for c in controller_calls]
    elastic_barriers = getattr(pol, "barriers", None)  # ElasticBSP's
    if isinstance(elastic_barriers, list):
        out["elastic_barriers"] = len(elastic_barriers)
    return out


def time_to_accuracy(curve, target: float):
    """The first time in ``curve`` (list of {"time", "accuracy"}) with accuracy >= target, or None."""
    for r in curve:
        if r["accuracy"] >= target:
            return r["time"]
    return None
