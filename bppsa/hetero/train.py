r"""Heterogeneity-aware data-parallel training: strategies, data placement, replica back-ends.

Three strategies (``STRATEGIES``):

- ``"uniform"``: equal split, plain average — the slowest replica sets the pace;
- ``"proportional-mean"``: :math:`b_i \propto s_i`, plain average :math:`\frac{1}{P} \sum_i g_i` — fast, but biased;
- ``"proportional-weighted"``: :math:`b_i \propto s_i`, :math:`g = \sum_i b_i g_i / \sum_i b_i`
  (``psum(Σ∇ℓ) / psum(b_i)``) — the method: fast and exact.

Two ways to run P replicas of different speed:

- :class:`SimulatedReplicas`: one process, P devices of a mesh, a time model for the clock (fast
  sweeps): replica i's step takes :math:`f_i \, t(b_i)`, t fitted to real timings of the local
  gradient on this machine;
- :class:`~bppsa.hetero.processes.ProcessReplicas`: P processes under ``jax.distributed``; replica i
  computes its local gradient, then really sleeps :math:`\tau f_i b_i` before the collective, so
  fast replicas really wait there.

Both feed one loop, :func:`train`.
"""

from __future__ import annotations

from functools import partial
from typing import Callable, Sequence

import jax
import numpy as np
import optax

from bppsa.hetero.partition import partition
from bppsa.hetero.profile import Rebalancer, TimeModel, balanced_speeds, bound_speeds, fit_time_model, nominal_speeds
from bppsa.hetero.spmd import data_mesh, local_grad_sum, make_spmd_grad, pad_local_batch, replica_batches
from bppsa.host import time_fn
from bppsa.tasks import make_task
from bppsa.tasks.task import Task

__all__ = ["STRATEGIES", "PLACEMENTS", "SPEED_RULES", "TRAINING_KEYS", "ShardSampler", "SimulatedReplicas",
           "as_schedule", "slowdowns_at", "measure_time_model", "task_options", "task_from_config", "train"]

STRATEGIES = {"uniform": (False, "mean"), "proportional-mean": (True, "mean"),
              "proportional-weighted": (True, "weighted")}  # name -> (proportional split?, average)
PLACEMENTS = ("iid", "label")
SPEED_RULES = ("nominal", "balanced")  # throughput at B/P (the paper's), or balanced_speeds' fixed point
TRAINING_KEYS = ("batch_size", "epochs", "learning_rate")


def task_options(config) -> dict:
    """The task's options in one entry of an experiment's ``tasks`` config (a mapping): its keys other
    than :data:`TRAINING_KEYS` (which are the trainer's).

    Args:
      config: one entry of the ``tasks`` config, a mapping of task options and training keys.

    Returns:
      A new dict of the task's options.
    """
    return {k: v for k, v in dict(config).items() if k not in TRAINING_KEYS}


def task_from_config(name: str, config) -> Task:
    """:func:`bppsa.tasks.make_task` from one entry of an experiment's ``tasks`` config (:func:`task_options`).

    Args:
      name: the task's name (one of :data:`bppsa.tasks.TASKS`).
      config: the entry, a mapping of the task's options and :data:`TRAINING_KEYS`.

    Returns:
      The :class:`~bppsa.tasks.task.Task` (cached per name and options within the process).

    Raises:
      ValueError: for an unknown task name or option.
    """
    return make_task(name, **task_options(config))


class ShardSampler:
    """Each replica draws its b_i samples per step from its own shard of the training set.

    Shard sizes are proportional to the replica batch sizes, so one epoch (N // B steps) visits
    every sample about once. placement="iid": random shards; "label": shards cut from the
    label-sorted data (data locality — replicas hold different classes), where plain averaging's
    over-weighting of slow replicas becomes a bias towards their classes.

    Args:
      y: (N,) the training labels (their number, and for "label" their values, are read).
      counts: (P,) the replica batch sizes b_i (``set_counts`` changes them and cuts new shards).
      placement: "iid" or "label" (:data:`PLACEMENTS`).
      seed: seeds the shards and the order each replica draws its shard in.

    Raises:
      ValueError: for an unknown placement.
    """

    def __init__(self, y: np.ndarray, counts, placement: str = "iid", seed: int = 0):
        if placement not in PLACEMENTS:
            raise ValueError(f"placement must be one of {PLACEMENTS}; got {placement!r}")
        self.y, self.placement = np.asarray(y), placement
        self.rng = np.random.default_rng(seed)
        self.set_counts(counts)

    def set_counts(self, counts):
        self.counts = np.asarray(counts, np.int64)
        perm = self.rng.permutation(len(self.y))
        if self.placement == "label":
            perm = perm[np.argsort(self.y[perm], kind="stable")]
        sizes = partition(np.maximum(self.counts, 1e-9), len(self.y), min_per_replica=0)
        edges = np.concatenate([[0], np.cumsum(sizes)])
        self.shards = [perm[a:b] for a, b in zip(edges[:-1], edges[1:])]
        self.order = [self.rng.permutation(s) for s in self.shards]
        self.pos = [0] * len(self.shards)

    def next(self) -> list[np.ndarray]:
        """Indices for one step: one array of b_i indices per replica."""
        out = []
        for i, b in enumerate(self.counts):
            take = []
            while b > 0 and len(self.shards[i]):
                if self.pos[i] == len(self.order[i]):
                    self.order[i], self.pos[i] = self.rng.permutation(self.shards[i]), 0
                k = min(b, len(self.order[i]) - self.pos[i])
                take.append(self.order[i][self.pos[i]:self.pos[i] + k])
                self.pos[i] += k
                b -= k
            out.append(np.concatenate(take) if take else np.zeros(0, np.int64))
        return out


def measure_time_model(loss_fn: Callable, params, x: np.ndarray, y: np.ndarray, probe_batches: Sequence[int],
                       repeats: int = 5) -> TimeModel:
    """Fit t(b) = α + β·b to real timings of one replica's local gradient on this machine.

    Args:
      loss_fn: the per-sample loss, ``loss_fn(params, x, y) -> (b,)``.
      params: the parameter pytree.
      x: (N, ...) inputs; the first b rows are timed at batch size b.
      y: (N,) their labels.
      probe_batches: the batch sizes to time (each in 1..N; two distinct ones or more to fit α).
      repeats: timings per batch size (their median is taken: :func:`bppsa.host.time_fn`).

    Returns:
      The fitted :class:`~bppsa.hetero.profile.TimeModel`.
    """
    fn = jax.jit(partial(local_grad_sum, loss_fn))

    def step_time(b):
        xp, yp, mask = pad_local_batch(x[:b], y[:b], b)
        return time_fn(lambda: fn(params, xp, yp, mask), repeats=repeats)["median"]

    return fit_time_model(list(probe_batches), [step_time(int(b)) for b in probe_batches])


_JIT: dict = {}


def _cached(key, build):
    """Jitted functions shared across runs, for keys that name everything the function reads
    (settings, not a caller's function: that one's program is made with the object that holds
    it, so it never outlives what it closed over)."""
    if key not in _JIT:
        _JIT[key] = build()
    return _JIT[key]


def as_schedule(slowdowns) -> list:
    """(P,) slowdown factors, or already a schedule [(start_step, (P,) factors), ...] -> a schedule.

    Args:
      slowdowns: (P,) slowdown factors f_i (finite, > 0; speed ∝ 1/f_i), or a schedule
        [(start_step, (P,) factors), ...].

    Returns:
      The schedule, a list [(start_step, list of P factors), ...]; [(0, slowdowns)] for plain factors.

    Raises:
      ValueError: for factors that are not finite and > 0, or entries of different lengths.
    """
    drift = isinstance(slowdowns[0], (tuple, list)) and len(slowdowns[0]) == 2 and np.ndim(slowdowns[0][1]) == 1
    schedule = [(int(a), list(f)) for a, f in slowdowns] if drift else [(0, list(slowdowns))]
    for _, f in schedule:
        f = np.asarray(f, np.float64)
        if f.ndim != 1 or f.size != len(schedule[0][1]) or not np.all(np.isfinite(f)) or (f <= 0).any():
            raise ValueError(f"slowdowns must be positive factors, one per replica (or a schedule of them); "
                             f"got {slowdowns!r}")
    return schedule


def slowdowns_at(schedule, step):
    """The slowdown factors in force at ``step`` of a schedule [(start_step, (P,) factors), ...].

    Args:
      schedule: the schedule (:func:`as_schedule`), its entries in order of start_step.
      step: the training step.

    Returns:
      (P,) float64, the factors of the last entry with start_step ≤ step (the first entry's before
      any has started).
    """
    current = schedule[0][1]
    for start, f in schedule:
        if step >= start:
            current = f
    return np.asarray(current, np.float64)


class SimulatedReplicas:
    """P replicas on P devices of one process; the clock is a time model (for fast sweeps).

    Replica i's step on b_i samples takes f_i·base.time(b_i)·ε (ε log-normal jitter), and a step
    takes the slowest replica's time plus ``comm_s`` for the all-reduce. The gradients are real:
    :func:`~bppsa.hetero.spmd.make_spmd_grad` on a mesh of P local devices.

    Args:
      loss_fn: the per-sample loss, ``loss_fn(params, x, y) -> (b,)``.
      slowdowns: (P,) factors f_i > 0 (speed ∝ 1/f_i), or a schedule [(step, (P,)), ...] for speeds
        that drift (:func:`as_schedule`).
      base: the fitted time model of one replica (from :func:`measure_time_model`).
      comm_s: the all-reduce's seconds, added to every step.
      jitter: σ of ε = exp(σ·z), z ~ N(0, 1) (0: no jitter).
      seed: seeds the jitter (``reset`` restarts it).

    Raises:
      ValueError: for slowdowns that are not positive factors, one per replica, or more replicas than
      devices.
    """

    def __init__(self, loss_fn: Callable, slowdowns, base: TimeModel, *, comm_s: float = 0.0,
                 jitter: float = 0.05, seed: int = 0):
        self.schedule = as_schedule(slowdowns)
        self.num_replicas = len(self.schedule[0][1])
        self.base, self.comm_s, self.jitter = base, comm_s, jitter
        self.reset(seed)
        mesh = data_mesh(self.num_replicas)
        # made with these replicas, not kept in a module-level cache: loss_fn may read arrays it
        # closes over, and a program kept beyond this object would keep their first values
        self.grad_fns = {a: make_spmd_grad(loss_fn, mesh, average=a) for a in ("weighted", "mean")}

    def reset(self, seed: int):
        """Restart the timing jitter's random stream (each training run calls this)."""
        self.rng = np.random.default_rng(seed + 7919)

    def _times(self, counts, step):
        f = slowdowns_at(self.schedule, step)
        eps = self.rng.lognormal(0.0, self.jitter, size=len(f)) if self.jitter else 1.0
        return f * self.base.time(counts) * eps

    def profile(self, probe_batches, repeats: int = 3, **data) -> list[TimeModel]:
        """Each replica's time model, fitted to (emulated) timings at the probe sizes (``data`` unused)."""
        pb = np.asarray(probe_batches)
        samples = np.array([[np.median([self._times(np.full(self.num_replicas, b), 0)[i] for _ in range(repeats)])
                             for b in pb] for i in range(self.num_replicas)])
        return [fit_time_model(pb, samples[i]) for i in range(self.num_replicas)]

    def step(self, params, x, y, index_lists, counts, average, step):
        """grads, mean loss, per-replica busy times (P,), step wall time (s)."""
        idx = np.concatenate(index_lists)
        # pad every replica to B: one compiled shape whatever the partition (the clock is modelled)
        xp, yp, mask = replica_batches(x[idx], y[idx], counts, b_max=max(int(np.sum(counts)), 1))
        g, loss, _ = self.grad_fns[average](params, xp, yp, mask)
        times = self._times(counts, step)
        return g, loss, times, float(times.max()) + self.comm_s


def train(task: Task, replicas, *, strategy: str, batch_size: int, epochs: int, learning_rate: float = 1e-3,
          seed: int = 0, placement: str = "iid", probe_batches: Sequence[int] = (8, 32, 64),
          profile_repeats: int = 3, speeds: Sequence[float] | np.ndarray | None = None, speed_rule: str = "nominal",
          min_per_replica: int = 1, max_speed_ratio: float = 16.0, rebalance_every: int = 0,
          rebalance_tolerance: float = 0.05, log: Callable[[str], None] | None = None) -> dict:
    """Train ``task`` for ``epochs`` epochs of N // B steps on ``replicas`` with ``strategy``.

    Speeds come from ``speeds`` when given, else from profiling each replica at
    ``probe_batches`` (ignored by ``uniform``): ``speed_rule="nominal"`` takes each replica's
    throughput at the nominal batch B/P, ``"balanced"`` :func:`~bppsa.hetero.profile.balanced_speeds`'
    fixed point; profiled speeds more than ``max_speed_ratio``× from the replicas' median are
    clipped (and logged). Every replica gets at least ``min_per_replica`` samples.
    ``rebalance_every`` K > 0 re-estimates speeds from the step times of the last K steps and
    re-partitions when that pays by more than ``rebalance_tolerance`` (logged).

    Args:
      task: the :class:`~bppsa.tasks.task.Task` to train (N = its number of training samples).
      replicas: a :class:`SimulatedReplicas` or :class:`~bppsa.hetero.processes.ProcessReplicas`
        (P = its ``num_replicas``).
      strategy: "uniform", "proportional-mean" or "proportional-weighted" (:data:`STRATEGIES`).
      batch_size: B, the global batch size, in 1..N.
      epochs: the number of epochs (>= 1).
      learning_rate: Adam's learning rate.
      seed: seeds the initial parameters, the sampler and the replicas' jitter.
      placement: "iid" or "label", the data placement (:class:`ShardSampler`).
      probe_batches: the batch sizes replicas are profiled at (those above N are skipped).
      profile_repeats: timings per probe size.
      speeds: (P,) given speeds (no profiling); None: profiled. Ignored by "uniform".
      speed_rule: "nominal" or "balanced" (:data:`SPEED_RULES`).
      min_per_replica: the fewest samples any replica gets.
      max_speed_ratio: the factor from the median beyond which profiled speeds are clipped.
      rebalance_every: K, re-balance from the last K steps' times (proportional strategies only);
        0: never.
      rebalance_tolerance: the predicted relative gain a re-partition must exceed.
      log: called with each line of progress (None: silent).

    Returns:
      A JSON-able record (a dict) with the per-epoch ``history`` (epoch, step, clock time, test
      accuracy, train loss; epoch 0 before training), ``step_times``, ``final_accuracy``,
      ``time_per_epoch`` and ``total_time`` (clock seconds), ``speeds``, ``initial_partition`` and
      ``final_partition``, ``repartitions`` (the switches), ``speeds_clipped``, the profile
      (``time_models`` and ``profile``: None unless profiled) and the run's settings.

    Raises:
      ValueError: for an unknown strategy or speed_rule, a batch_size outside 1..N, epochs < 1, speeds
      that are not one per replica, or a batch_size below P·min_per_replica.
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {list(STRATEGIES)}; got {strategy!r}")
    if speed_rule not in SPEED_RULES:
        raise ValueError(f"speed_rule must be one of {SPEED_RULES}; got {speed_rule!r}")
    n = len(task.x_train)
    if not 1 <= batch_size <= n:
        raise ValueError(f"batch_size must be in 1..{n} (the training set size); got {batch_size}")
    if epochs < 1:
        raise ValueError(f"epochs must be >= 1; got {epochs}")
    log = log or (lambda s: None)
    proportional, average = STRATEGIES[strategy]
    P = replicas.num_replicas
    params = jax.tree.map(lambda a: np.asarray(a), task.init(jax.random.key(seed)))
    replicas.reset(seed)

    models, clipped = None, []
    if not proportional:
        s = np.ones(P)
    elif speeds is not None:
        s = np.asarray(speeds, np.float64)
        if s.shape != (P,):
            raise ValueError(f"speeds must have one entry per replica ({P}); got {list(speeds)}")
    else:
        models = replicas.profile([b for b in probe_batches if b <= n], profile_repeats,
                                  params=params, x=task.x_train, y=task.y_train)
        s = nominal_speeds(models, batch_size) if speed_rule == "nominal" else balanced_speeds(models, batch_size)
        s, clipped = bound_speeds(s, max_speed_ratio)
        if clipped:
            log(f"speeds of replicas {clipped} were more than {max_speed_ratio:g}x from the median: clipped")
    counts = partition(s, batch_size, min_per_replica)
    initial = counts.copy()
    log(f"{strategy}: speeds {np.round(s / s.max(), 3).tolist()} -> batches {counts.tolist()}")
    rebalancer = Rebalancer(np.array(s, np.float64), every=rebalance_every if proportional else 0,
                            tolerance=rebalance_tolerance, min_per_replica=min_per_replica)
    sampler = ShardSampler(task.y_train, counts, placement, seed)

    tx = optax.adam(learning_rate)
    opt_state = tx.init(params)

    def adam_step(p, o, g):
        u, o2 = tx.update(g, o, p)
        return optax.apply_updates(p, u), o2

    # adam_step reads only tx, made from learning_rate: the key names all it reads
    apply = _cached(("adam", learning_rate), lambda: jax.jit(adam_step))
    # the task's own jitted accuracy (kept by the task, with the test data it reads)
    accuracy = task.accuracy_fn()

    steps_per_epoch = n // batch_size
    clock, step, step_times = 0.0, 0, []
    history = [{"epoch": 0, "step": 0, "time": 0.0, "accuracy": float(accuracy(params)[1]),
                "loss": None}]
    for epoch in range(1, epochs + 1):
        losses = []
        for _ in range(steps_per_epoch):
            g, loss, times, wall = replicas.step(params, task.x_train, task.y_train, sampler.next(), counts,
                                                 average, step)
            params, opt_state = apply(params, opt_state, g)
            clock += wall
            step_times.append(float(wall))
            step += 1
            losses.append(float(loss))
            rebalancer.observe(counts, times)
            new = rebalancer.maybe_repartition(step, batch_size, counts)
            if new is not None:
                log(f"step {step}: re-partition {counts.tolist()} -> {new.tolist()}")
                counts = new
                sampler.set_counts(counts)
        acc = float(accuracy(params)[1])
        history.append({"epoch": epoch, "step": step, "time": clock, "accuracy": acc,
                        "loss": float(np.mean(losses))})
        log(f"epoch {epoch}: time {clock:.3f} s, loss {np.mean(losses):.4f}, test accuracy {acc:.4f}")
    return {"strategy": strategy, "average": average, "placement": placement, "seed": seed,
            "batch_size": batch_size, "epochs": epochs, "speeds": [float(v) for v in s],
            "time_models": None if models is None else [{"alpha": m.alpha, "beta": m.beta} for m in models],
            "profile": getattr(replicas, "profile_log", None) if models is not None else None,
            "speeds_clipped": clipped, "min_per_replica": min_per_replica,
            "initial_partition": [int(v) for v in initial],
            "final_partition": [int(v) for v in counts], "repartitions": rebalancer.log,
            "history": history, "step_times": step_times, "final_accuracy": history[-1]["accuracy"],
            "time_per_epoch": clock / epochs, "total_time": clock}
