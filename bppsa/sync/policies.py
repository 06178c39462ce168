"""Synchronization policies for parameter-server training, behind one small interface.

The server calls the policy on three events and acts on the :class:`Decision` it returns:

- ``push(worker, time)`` — the server has just applied ``worker``'s update (its clock t_p goes up by
  one). ``decision.kind`` says what the pusher does next: ``"proceed"`` (pull and compute the next
  update now), ``"wait"`` (block until released; ``decision.until`` is the slowest worker's clock it
  waits for) or ``"barrier"`` (block at the barrier; ``decision.at`` is the barrier's number for BSP,
  its predicted time for ElasticBSP).
- ``join(worker, time)`` — a worker arrives (late joiners); its decision is what it does first.
- ``remove(worker, time)`` — a worker is gone (dead); waiting workers may be released.

Every decision also lists ``release``: the waiting workers that may go on now; the runtime wakes
each one and lets it pull the current parameters. ``release`` includes the pusher itself when its
own arrival opens a barrier (BSP, ElasticBSP): then it goes on at once despite ``kind``.
All updates are applied on arrival (as DSSP's Algorithm 1 does); the policies only decide who waits.

Papers:

- BSP, ASP and SSP(s): Ho et al., "More effective distributed ML via a stale synchronous parallel
  parameter server", NIPS 2013.
- DSSP(s_L, r_max): Zhao, An, Liu, Chen, "Dynamic Stale Synchronous Parallel Distributed Training
  for Deep Learning", ICDCS 2019, Algorithms 1–2.
- ElasticBSP(R): Zhao, Papagelis, An, Chen, Liu, Hu, "Elastic Bulk Synchronous Parallel Model for
  Distributed Deep Learning", ICDM 2019; "ZipLine" in Machine Learning 2021.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from bppsa.errors import as_int
from bppsa.sync.zipline import ZIPLINE_METHODS, zipline

__all__ = ["Decision", "Policy", "BSP", "ASP", "SSP", "DSSP", "ElasticBSP", "make_policy", "POLICIES",
           "dssp_controller"]

PROCEED, WAIT, BARRIER = "proceed", "wait", "barrier"


@dataclasses.dataclass(frozen=True)
class Decision:
    """What the worker that caused the event does next, and which waiting workers go on now.

    Attributes:
      kind: "proceed" (pull and go on), "wait" or "barrier".
      until: for "wait", the slowest worker's clock the worker waits for; else None.
      at: for "barrier", the barrier's number (BSP) or its predicted time (ElasticBSP; None while a
        worker has no measured interval yet); else None.
      release: the waiting workers (ids, ascending) that may go on now; it may hold the worker
        itself.
    """
    kind: str = PROCEED  # "proceed" | "wait" | "barrier"
    until: int | None = None  # wait: the slowest worker's clock to wait for
    at: float | None = None  # barrier: its number (BSP) or its predicted time (ElasticBSP)
    release: tuple = ()


class Policy:
    """Base class: tracks each active worker's clock t_p (its pushes applied) and who is waiting.

    Args:
      num_workers: the workers 0 … num_workers−1 active from the start (others may ``join``).

    Raises:
      ValueError: for a num_workers that is not an int >= 1.
    """

    name = "policy"

    def __init__(self, num_workers: int):
        if (n := as_int(num_workers)) is None or n < 1:
            raise ValueError(f"num_workers must be an int >= 1; got {num_workers!r}")
        self.clock = {p: 0 for p in range(n)}
        self.active = set(self.clock)
        self.waiting: dict[int, str] = {}  # worker -> "wait" | "barrier"
        self.removed: list[int] = []

    # -- helpers
    def slowest_clock(self) -> int:
        return min(self.clock[q] for q in self.active) if self.active else 0

    def _check_worker(self, worker, *, known=True):
        if known and worker not in self.active:
            raise ValueError(f"worker {worker!r} is not an active worker; active: {sorted(self.active)}")

    # -- events
    def push(self, worker: int, time: float) -> Decision:
        self._check_worker(worker)
        if worker in self.waiting:
            raise ValueError(f"worker {worker} pushed while waiting ({self.waiting[worker]})")
        self.clock[worker] += 1
        return self._on_push(worker, float(time))

    def join(self, worker: int, time: float) -> Decision:
        if worker in self.active:
            raise ValueError(f"worker {worker} already active")
        self.clock[worker] = self.slowest_clock()
        self.active.add(worker)
        return self._on_join(worker, float(time))

    def remove(self, worker: int, time: float) -> Decision:
        if worker not in self.active:
            return Decision()
        self.active.discard(worker)
        self.waiting.pop(worker, None)
        self.removed.append(worker)
        return Decision(release=self._release(float(time)))

    # -- to override
    def _on_push(self, worker, time) -> Decision:
        return Decision(release=self._release(time))

    def _on_join(self, worker, time) -> Decision:
        return Decision()

    def _release(self, time) -> tuple:
        """Waiting workers that may go on now (they are removed from ``waiting``)."""
        return ()

    def _release_where(self, ok) -> tuple:
        out = tuple(sorted(q for q in self.waiting if ok(q)))
        for q in out:
            del self.waiting[q]
        return out

    def __repr__(self):
        return f"{type(self).__name__}({self.describe()})"

    def describe(self) -> str:
        return self.name


class ASP(Policy):
    """Asynchronous parallel: every push is applied on arrival and no worker ever waits.

    Args:
      num_workers: the workers active from the start (:class:`Policy`).
    """

    name = "ASP"


class SSP(Policy):
    """Stale synchronous parallel (Ho et al., NIPS 2013): worker p may run at most s iterations ahead.

    On a push: if t_p − t_slowest ≤ s the worker proceeds, else it waits until the slowest worker's
    clock reaches t_p − s (so it blocks exactly when it would be s + 1 ahead).

    Args:
      num_workers: the workers active from the start (:class:`Policy`).
      s: the staleness threshold, the most iterations a worker may run ahead of the slowest (an int >= 0).

    Raises:
      ValueError: for a num_workers that is not an int >= 1 or an s that is not an int >= 0.
    """

    name = "SSP"

    def __init__(self, num_workers: int, s: int = 3):
        super().__init__(num_workers)
        if (n := as_int(s)) is None or n < 0:
            raise ValueError(f"s (staleness threshold) must be an int >= 0; got {s!r}")
        self.s = n

    def describe(self):
        return f"s={self.s}"

    def _threshold(self, worker):
        return self.s

    def _on_push(self, worker, time):
        release = self._release(time)
        if self.clock[worker] - self.slowest_clock() <= self._threshold(worker):
            return Decision(release=release)
        self.waiting[worker] = WAIT
        return Decision(WAIT, until=self.clock[worker] - self._threshold(worker), release=release)

    def _release(self, time):
        lo = self.slowest_clock()
        return self._release_where(lambda q: self.clock[q] - lo <= self._threshold(q))


def dssp_controller(latest_p, previous_p, latest_slow, previous_slow, r_max: int) -> int:
    r"""DSSP's synchronization controller (Zhao et al., ICDCS 2019, Algorithm 2).

    Predicts the fastest worker p's pushes P_i = latest_p + i·I_p (i = 0 … r_max) and the slowest
    worker's S_k = latest_slow + (k + 1)·I_slow (k = 0 … r_max), with I = latest − previous, and
    returns the i minimising :math:`\min_k |S_k - P_i|` (the smallest on a tie).

    Args:
      latest_p: the fastest worker's latest push time.
      previous_p: its push time before that.
      latest_slow: the slowest worker's latest push time.
      previous_slow: its push time before that.
      r_max: the largest allowance, an int >= 0.

    Returns:
      The allowance r* in 0 … r_max (an int), the extra iterations the fastest worker may run.
    """
    I_p, I_s = latest_p - previous_p, latest_slow - previous_slow
    P = latest_p + np.arange(r_max + 1) * I_p
    S = latest_slow + (np.arange(r_max + 1) + 1) * I_s
    gap = np.min(np.abs(S[None, :] - P[:, None]), axis=1)
    return int(np.argmin(gap))


class DSSP(SSP):
    """Dynamic SSP(s_L, r_max) (Zhao et al., ICDCS 2019, Algorithm 1).

    On a push from p (after t_p ← t_p + 1 and applying the update): if r_p > 0, r_p ← r_p − 1 and p
    proceeds; else if t_p − t_slowest ≤ s_L it proceeds; else if p is the fastest worker, r_p ←
    :func:`dssp_controller` (from each worker's last two push times) and p proceeds if r_p > 0;
    otherwise p waits until t_p − t_slowest ≤ s_L. The fastest worker may thus run up to about
    s_L + r_max iterations ahead of the slowest, by an allowance the controller picks per push.

    Args:
      num_workers: the workers active from the start (:class:`Policy`).
      s_L: the staleness threshold below which a worker always proceeds, an int >= 0.
      r_max: the largest allowance the controller may grant, an int >= 0.

    Raises:
      ValueError: for a num_workers that is not an int >= 1, or an s_L or r_max that is not an int >= 0.
    """

    name = "DSSP"

    def __init__(self, num_workers: int, s_L: int = 3, r_max: int = 12):
        super().__init__(num_workers, s=s_L)
        if (n := as_int(r_max)) is None or n < 0:
            raise ValueError(f"r_max must be an int >= 0; got {r_max!r}")
        self.s_L, self.r_max = self.s, n
        self.r = {p: 0 for p in self.clock}
        self.push_times = {p: [] for p in self.clock}  # last two push times (previous, latest)
        self.controller_calls: list[tuple[int, int]] = []  # (worker, r*) for each controller decision

    def describe(self):
        return f"s_L={self.s_L}, r_max={self.r_max}"

    def _on_join(self, worker, time):
        self.r[worker] = 0
        self.push_times[worker] = []
        return Decision()

    def _on_push(self, worker, time):
        pt = self.push_times[worker]
        pt.append(time)
        del pt[:-2]
        release = self._release(time)
        if self.r[worker] > 0:
            self.r[worker] -= 1
            return Decision(release=release)
        lo = self.slowest_clock()
        if self.clock[worker] - lo <= self.s_L:
            return Decision(release=release)
        if self.clock[worker] == max(self.clock[q] for q in self.active):
            slow = min(sorted(self.active), key=lambda q: self.clock[q])
            a, b = self.push_times[worker], self.push_times[slow]
            if len(a) == 2 and len(b) == 2:
                r = dssp_controller(a[1], a[0], b[1], b[0], self.r_max)
                self.controller_calls.append((worker, r))
                self.r[worker] = r
                if r > 0:
                    return Decision(release=release)
        self.waiting[worker] = WAIT
        return Decision(WAIT, until=self.clock[worker] - self.s_L, release=release)

    def _release(self, time):
        lo = self.slowest_clock()
        return self._release_where(lambda q: self.clock[q] - lo <= self.s_L)


class BSP(Policy):
    """Bulk synchronous parallel: every worker waits at a barrier after each push.

    The barrier after clock k opens when every active worker has pushed k times; everyone then
    pulls the same parameters.

    Args:
      num_workers: the workers active from the start (:class:`Policy`).
    """

    name = "BSP"

    def _on_push(self, worker, time):
        self.waiting[worker] = BARRIER
        return Decision(BARRIER, at=self.clock[worker], release=self._release(time))

    def _on_join(self, worker, time):
        # the joiner waits at the next barrier and then starts with everyone else
        self.waiting[worker] = BARRIER
        return Decision(BARRIER, at=self.clock[worker] + 1, release=self._release(time))

    def _release(self, time):
        if self.active and all(self.waiting.get(q) == BARRIER for q in self.active):
            return self._release_where(lambda q: True)
        return ()


class ElasticBSP(Policy):
    """ElasticBSP(R) (Zhao et al., ICDM 2019; Machine Learning 2021).

    When a barrier opens, the server predicts each worker's next R push times from its latest
    iteration interval (row p: start + i·I_p, i = 1 … R, start = the barrier's time), picks one per
    row with :func:`~bppsa.sync.zipline` (min of max − min) and sets the next barrier at the max of
    the chosen set. Worker p then runs ``indices[p] + 1`` iterations freely (each push applied on
    arrival) and waits at the barrier, where everyone pulls the same parameters. The interval I_p
    is the compute time of p's latest iteration (push time − the time it last started), so time
    spent waiting does not count. Before every worker has one measured interval, barriers come after
    every push (as BSP).

    Args:
      num_workers: the workers active from the start (:class:`Policy`).
      R: the prediction horizon, each worker's next pushes predicted per barrier (an int >= 1).
      method: the :func:`~bppsa.sync.zipline` solver (a key of
        :data:`~bppsa.sync.zipline.ZIPLINE_METHODS`); not checked until the first planned barrier.

    Raises:
      ValueError: for a num_workers or R that is not an int >= 1, or an unknown method.
    """

    name = "ElasticBSP"

    def __init__(self, num_workers: int, R: int = 15, method: str = "window"):
        super().__init__(num_workers)
        if (n := as_int(R)) is None or n < 1:
            raise ValueError(f"R (prediction horizon) must be an int >= 1; got {R!r}")
        if method not in ZIPLINE_METHODS:  # checked here, not at the first barrier mid-run
            raise ValueError(f"method must be one of {sorted(ZIPLINE_METHODS)}; got {method!r}")
        self.R, self.method = n, method
        self.start = {p: 0.0 for p in self.clock}  # when each worker started its current iteration
        self.interval = {p: None for p in self.clock}
        self.quota = {p: 1 for p in self.clock}  # pushes left before the next barrier
        self.barrier_at = None
        self.barriers: list[dict] = []  # one record per barrier plan

    def describe(self):
        return f"R={self.R}"

    def _on_push(self, worker, time):
        self.interval[worker] = time - self.start[worker]
        self.start[worker] = time
        self.quota[worker] -= 1
        if self.quota[worker] > 0:
            return Decision(release=self._release(time))
        self.waiting[worker] = BARRIER
        return Decision(BARRIER, at=self.barrier_at, release=self._release(time))

    def _on_join(self, worker, time):
        self.interval[worker] = None
        self.waiting[worker] = BARRIER
        return Decision(BARRIER, at=self.barrier_at, release=self._release(time))

    def _plan(self, time):
        workers = sorted(self.active)
        for q in workers:
            self.start[q] = time
        known = [iv for iv in (self.interval[q] for q in workers) if iv is not None]
        if len(known) != len(workers):  # some worker has no interval estimate yet
            for q in workers:
                self.quota[q] = 1
            self.barrier_at = None
            self.barriers.append({"time": time, "quota": {q: 1 for q in workers}, "at": None})
            return
        steps = np.arange(1, self.R + 1)
        times = np.array([[time + i * max(iv, 0.0) for i in steps] for iv in known])
        idx, _ = zipline(times, self.method)
        for row, q in enumerate(workers):
            self.quota[q] = int(idx[row]) + 1
        self.barrier_at = float(times[np.arange(len(workers)), idx].max())
        self.barriers.append({"time": time, "quota": {q: self.quota[q] for q in workers},
                              "at": self.barrier_at})

    def _release(self, time):
        if self.active and all(self.waiting.get(q) == BARRIER for q in self.active):
            out = self._release_where(lambda q: True)
            self._plan(time)
            return out
        return ()


POLICIES = {"bsp": BSP, "asp": ASP, "ssp": SSP, "dssp": DSSP, "elasticbsp": ElasticBSP}


def make_policy(name: str, num_workers: int, **kwargs) -> Policy:
    """A policy by name: "bsp" | "asp" | "ssp" (s) | "dssp" (s_L, r_max) | "elasticbsp" (R, method).

    Args:
      name: the policy's name (:data:`POLICIES`; case, "-" and "_" ignored).
      num_workers: the workers active from the start.
      **kwargs: the policy's options (above).

    Returns:
      The new :class:`Policy`.

    Raises:
      ValueError: for an unknown name, an option the policy does not take, or a bad num_workers or
      option value.

    Examples:
      SSP with staleness 1: worker 0 may run one push ahead of worker 1, not two:

      >>> from bppsa import sync
      >>> policy = sync.make_policy("ssp", 2, s=1)
      >>> policy.push(0, time=1.0).kind
      'proceed'
      >>> d = policy.push(0, time=2.0)
      >>> d.kind, d.until                                  # wait until worker 1's clock is 1
      ('wait', 1)
      >>> policy.push(1, time=2.5).release                 # worker 1's push releases worker 0
      (0,)
    """
    key = str(name).lower().replace("-", "").replace("_", "")
    if key not in POLICIES:
        raise ValueError(f"unknown policy {name!r}; expected one of {sorted(POLICIES)}")
    try:
        return POLICIES[key](num_workers, **kwargs)
    except TypeError as e:
        raise ValueError(f"bad options {kwargs} for policy {name!r}: {e}") from None
