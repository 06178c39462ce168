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
import math

import jax
import numpy as np
import optax

from bppsa.errors import as_int, as_number
from bppsa.sync.policies import BARRIER, PROCEED, Policy, make_policy
from bppsa.tasks import task_from_spec
from bppsa.tasks.task import Task

__all__ = ["ComputeModel", "heterogeneous", "simulate", "check_simulation", "time_to_accuracy", "policy_label",
           "sgd", "MAX_EVALUATIONS", "MAX_PUSHES"]


def _is_number(v) -> bool:
    return as_number(v) is not None


def _is_worker(v, n: int) -> bool:
    return (i := as_int(v)) is not None and 0 <= i < n


def _number(name: str, v, minimum: float = 0.0) -> float:
    """A finite number >= minimum (ValueError naming the field otherwise)."""
    if (x := as_number(v)) is None or not minimum <= x < math.inf:
        raise ValueError(f"{name} must be a finite number >= {minimum:g}; got {v!r}")
    return float(x)


def _numbers(name: str, values, minimum: float = 0.0, strict: bool = False) -> np.ndarray:
    """A 1-D sequence of finite numbers >= minimum (> minimum when ``strict``)."""
    items = list(values) if isinstance(values, (list, tuple, np.ndarray)) else None
    bound = f"> {minimum:g}" if strict else f">= {minimum:g}"
    if items is None or not all(_is_number(v) for v in items):
        raise ValueError(f"{name} must be a sequence of finite numbers {bound}; got {values!r}")
    a = np.asarray(items, dtype=float)
    bad = ~np.isfinite(a) | ((a <= minimum) if strict else (a < minimum))
    if bad.any():
        i = int(np.argmax(bad))
        raise ValueError(f"{name} must be finite numbers {bound}; got {name}[{i}] = {items[i]!r} in {values!r}")
    return a


def _tuples(name: str, values, size: int, shape: str) -> list:
    """A sequence of ``size``-tuples (ValueError naming the field and the expected ``shape`` otherwise)."""
    items = list(values) if isinstance(values, (list, tuple)) else None
    if items is None or any(not isinstance(t, (list, tuple)) or len(t) != size for t in items):
        raise ValueError(f"{name} must be a sequence of {shape} tuples; got {values!r}")
    return [tuple(t) for t in items]


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

    Raises:
      ValueError: naming the field, for means that are not finite and > 0, a sigma, comm or
      detect_timeout that is not a finite number >= 0, join_times that are not one finite time >= 0
      per worker with the workers joining at 0 numbered first, or a malformed straggler or death.
    """
    means: tuple
    sigma: float = 0.1
    stragglers: tuple = ()
    join_times: tuple | None = None
    comm: float = 0.0
    deaths: tuple = ()
    detect_timeout: float = 0.0

    def __post_init__(self):
        m = _numbers("means", self.means, minimum=0.0, strict=True)
        if m.size < 1:
            raise ValueError(f"means must be a non-empty sequence of finite times > 0; got {self.means!r}")
        n = m.size
        for name in ("sigma", "comm", "detect_timeout"):  # numpy and JAX scalars are stored as floats
            object.__setattr__(self, name, _number(name, getattr(self, name)))
        if self.join_times is not None:
            j = _numbers("join_times", self.join_times)
            if j.shape != m.shape:
                raise ValueError(f"join_times must be {n} finite times >= 0 (one per worker); got {self.join_times!r}")
            initial = np.nonzero(j == 0)[0]
            if initial.size == 0 or initial.max() != initial.size - 1:
                raise ValueError("workers that join at time 0 must be 0..k-1 (late joiners last); "
                                 f"got join_times {self.join_times!r}")
        for s in _tuples("stragglers", self.stragglers, 4, "(worker, start, end, factor)"):
            what = f"each straggler must be (worker in 0..{n - 1}, start >= 0, end > start, finite factor > 0)"
            ok = _is_worker(s[0], n) and all(_is_number(v) for v in s[1:])
            if not ok or not (0 <= s[1] < s[2] and 0 < s[3] < math.inf) or math.isnan(s[2]):
                raise ValueError(f"{what}; got {s!r} in stragglers={self.stragglers!r}")
        dead = set()
        for d in _tuples("deaths", self.deaths, 2, "(worker, time)"):
            if not _is_worker(d[0], n) or not _is_number(d[1]) or not 0 <= d[1] < math.inf or as_int(d[0]) in dead:
                raise ValueError(f"each death must be (worker in 0..{n - 1}, finite time >= 0), one per worker; "
                                 f"got {d!r} in deaths={self.deaths!r}")
            dead.add(as_int(d[0]))

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
    """Mixed GPUs: the first half of the workers take ``base``, the rest ``ratio·base`` per iteration.

    Args:
      num_workers: n; the first (n + 1) // 2 are the fast ones.
      ratio: how many times longer a slow worker's iteration takes.
      base: a fast worker's mean iteration time (virtual seconds).
      **kwargs: the other fields of :class:`ComputeModel` (sigma, stragglers, join_times, comm,
        deaths, detect_timeout).

    Returns:
      The :class:`ComputeModel`.
    """
    fast = (num_workers + 1) // 2
    return ComputeModel(means=tuple([base] * fast + [ratio * base] * (num_workers - fast)), **kwargs)


def policy_label(name: str, options: dict | None = None) -> str:
    """Table label: "BSP", "ASP", "SSP s=3", "DSSP(3,12)", "ElasticBSP R=15".

    Args:
      name: the policy's name (case, "-" and "_" ignored).
      options: its options (s, s_L, r_max, R; a missing one shows its default). None: none.

    Returns:
      The label, a str; an unknown name as given.
    """
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
    """One optax.sgd per learning rate, so a task's jitted server step is reused across runs.

    Args:
      learning_rate: SGD's learning rate (a hashable number).

    Returns:
      The ``optax.sgd(learning_rate)`` made by the first call with that rate.
    """
    if learning_rate not in _SGD:
        _SGD[learning_rate] = optax.sgd(learning_rate)
    return _SGD[learning_rate]


MAX_EVALUATIONS = 100_000  # test-set evaluations per run: max_time / eval_every
MAX_PUSHES = 1_000_000  # expected updates per run: max_time · Σ 1 / (mean_p + comm)
MAX_EVENTS = 10 * (MAX_EVALUATIONS + MAX_PUSHES)  # the loop's hard bound, whatever the noise draws


def check_simulation(compute: ComputeModel, *, max_time: float, eval_every: float, batch_size: int = 32,
                     max_pushes: int | None = None) -> None:
    """Refuse a run that cannot end or would not end in reasonable time (ValueError naming the value).

    max_time and eval_every must be finite and > 0, with at most :data:`MAX_EVALUATIONS` test
    evaluations (max_time / eval_every); unless ``max_pushes`` bounds them, the expected number of
    updates, max_time · Σ_p 1 / (means_p + comm) (a renewal rate: the noise is mean-preserving),
    must be at most :data:`MAX_PUSHES`.

    Args:
      compute: the workers' :class:`ComputeModel`.
      max_time: virtual seconds to simulate.
      eval_every: virtual seconds between test evaluations.
      batch_size: samples per gradient, an int >= 1.
      max_pushes: a bound on the number of updates (an int >= 1) that replaces the expected-updates
        check; None: no bound.

    Raises:
      ValueError: for a compute that is not a :class:`ComputeModel`, a max_time or eval_every that
      is not finite and > 0, more than :data:`MAX_EVALUATIONS` evaluations, a batch_size or
      max_pushes that is not an int >= 1, or more than :data:`MAX_PUSHES` expected updates.
    """
    if not isinstance(compute, ComputeModel):
        raise ValueError(f"compute must be a ComputeModel; got {type(compute).__name__}")
    for name, v in (("max_time", max_time), ("eval_every", eval_every)):
        if not _is_number(v) or not 0 < v < math.inf:
            raise ValueError(f"{name} must be a finite number of virtual seconds > 0; got {v!r}")
    if max_time / eval_every > MAX_EVALUATIONS:
        raise ValueError(f"max_time / eval_every must be at most {MAX_EVALUATIONS} test evaluations; got "
                         f"max_time = {max_time:g}, eval_every = {eval_every:g} ({max_time / eval_every:.3g}); "
                         "use a larger eval_every")
    if (n := as_int(batch_size)) is None or n < 1:
        raise ValueError(f"batch_size must be an int >= 1; got {batch_size!r}")
    if max_pushes is not None:
        if (n := as_int(max_pushes)) is None or n < 1:
            raise ValueError(f"max_pushes must be an int >= 1 or None; got {max_pushes!r}")
        return
    expected = max_time * sum(1.0 / (float(m) + compute.comm) for m in compute.means)
    if expected > MAX_PUSHES:
        raise ValueError(f"about {expected:.3g} updates expected in max_time = {max_time:g} virtual s with means "
                         f"{tuple(compute.means)} and comm = {compute.comm:g}; at most {MAX_PUSHES} are allowed: "
                         "shorten max_time or pass max_pushes")


def simulate(task, policy: str, compute: ComputeModel, *, policy_options: dict | None = None,
             optimizer: optax.GradientTransformation | None = None, learning_rate: float = 0.05,
             batch_size: int = 32, max_time: float = 100.0, eval_every: float = 1.0, seed: int = 0,
             target: float | None = None, stop_at_target: bool = False, max_pushes: int | None = None) -> dict:
    """Simulate PS training of ``task`` under ``policy``; return a JSON-able log.

    Runs that cannot end, or not in reasonable time, are refused first (:func:`check_simulation`).

    Args:
      task: a :class:`~bppsa.tasks.task.Task` or its spec ``{"name": ..., **options}`` for
        :func:`bppsa.tasks.task_from_spec`.
      policy: "bsp" | "asp" | "ssp" | "dssp" | "elasticbsp" (:func:`~bppsa.sync.policies.make_policy`).
      compute: the workers' :class:`ComputeModel`.
      policy_options: the policy's arguments (s; s_L, r_max; R, method).
      optimizer: the server's optax optimizer (default: SGD with ``learning_rate``).
      learning_rate: the default optimizer's learning rate.
      batch_size: samples per gradient, drawn with replacement from the training set.
      max_time: virtual seconds to simulate.
      eval_every: virtual seconds between test evaluations.
      seed: seeds the initial parameters and every worker's batch and iteration-time draws.
      target: test accuracy whose first reaching time is reported (and ends the run if
        ``stop_at_target``).
      stop_at_target: end the run at the first evaluation that reaches ``target``.
      max_pushes: end the run after this many updates (None: only max_time ends it).

    Returns:
      A dict with ``curve`` (time, pushes, test loss, test accuracy), ``wait`` per worker,
      ``pushes`` per worker, ``total_pushes``, ``staleness_hist`` (staleness -> count), ``barriers``,
      ``time_to_target``, ``final_accuracy``, ``end_time``, ``deaths_detected``, the run's settings,
      and ``dssp_controller`` / ``elastic_barriers`` records for DSSP / ElasticBSP.

    Raises:
      ValueError: for a run :func:`check_simulation` refuses, an unknown policy or option, a bad task
      spec, or a run past the event backstop (:data:`MAX_EVALUATIONS` and :data:`MAX_PUSHES`).

    Examples:
      Five virtual seconds of SSP on three workers, the slowest 2× slower than the fastest:

      >>> from bppsa import sync
      >>> log = sync.simulate({"name": "digits_cnn", "channels": [4, 8]}, "ssp", sync.heterogeneous(3, 2.0),
      ...                     policy_options={"s": 2}, max_time=5, eval_every=5)
      >>> log["pushes"], log["total_pushes"], log["end_time"]
      ([4, 4, 2], 10, 5)
      >>> 0.0 <= log["final_accuracy"] <= 1.0
      True
    """
    check_simulation(compute, max_time=max_time, eval_every=eval_every, batch_size=batch_size,
                     max_pushes=max_pushes)
    if not isinstance(task, Task):
        task = task_from_spec(task)
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
    events = 0
    while heap:
        t, _, kind, p = heapq.heappop(heap)
        if t > max_time:
            break
        events += 1
        if events > MAX_EVENTS:  # a backstop: check_simulation's estimate refuses such runs up front
            raise ValueError(f"the simulation passed {MAX_EVENTS} events before max_time = {max_time:g} "
                             f"(at t = {t:.3g}); shorten max_time or make iterations longer (means, comm)")
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
    """The first time in ``curve`` (list of {"time", "accuracy"}) with accuracy >= target, or None.

    Args:
      curve: the records, in time order (:func:`simulate`'s ``curve``).
      target: the test accuracy to reach.

    Returns:
      The time of the first record with accuracy >= target, or None when none reaches it.
    """
    for r in curve:
        if r["accuracy"] >= target:
            return r["time"]
    return None
