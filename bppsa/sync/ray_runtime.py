"""A real parameter-server runtime on Ray: one server actor, N worker actors, the same policies.

The server (an asyncio actor) holds the parameters and an optax optimizer, applies each push on
arrival, and asks the policy (:mod:`bppsa.sync.policies`) what the pusher does next; a push that
must wait simply does not return until the policy releases it, and the reply carries the
parameters to continue from. Workers compute real JAX gradients on the parameters they pulled and
sleep for an injected per-worker slowdown (heterogeneous or straggling workers) — all wall-clock.

Failures: a worker that dies is detected (a) by the driver, whose ``ray.wait`` on the worker's
``run`` task raises ``RayActorError``, or (b) by the server, when a worker that is not waiting has
neither pushed nor pulled for ``dead_timeout`` seconds. The worker is then removed from the
policy: ASP/SSP/DSSP continue without it, BSP/ElasticBSP drop it from the barrier set; both are
logged. Every push carries a per-worker sequence number and the server applies each (worker, seq)
at most once, so a retried push is never applied twice; every push is answered "applied",
"duplicate" (applied before) or "refused" (it arrived after training stopped, or from a worker whose
death Ray had already confirmed: a push still in flight when its sender was killed), and the
workers count them, so none is lost silently. A worker dropped by the timeout that turns out to be
alive is taken back (``policy.join``) when its next push arrives. ::

    from bppsa.sync.ray_runtime import run_ray
    log = run_ray({"name": "digits_cnn"}, "ssp", num_workers=3, policy_options={"s": 3},
                  duration_s=20, delays=[0.0, 0.0, 0.05])      # local Ray unless address= is given
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any, cast

import numpy as np

__all__ = ["run_ray", "init_ray", "ParameterServer", "Worker"]

_REPO_ROOT = str(Path(__file__).resolve().parents[2])


def _to_numpy(tree):
    import jax
    return jax.tree.map(np.asarray, tree)


class ParameterServer:
    """The server actor's logic (wrapped with ``ray.remote`` by :func:`run_ray`).

    Args:
      task_spec: the task's spec ``{"name": ..., **options}`` (:func:`bppsa.tasks.task_from_spec`).
      policy: the policy's name (:func:`bppsa.sync.make_policy`).
      policy_options: its options (None: none).
      num_workers: the workers 0 … num_workers − 1.
      learning_rate: the server's SGD learning rate.
      seed: seeds the initial parameters.
      dead_timeout: seconds after which a worker that is not waiting and has neither pushed nor
        pulled is declared dead.
      eval_every: seconds between test evaluations.
    """

    def __init__(self, task_spec, policy, policy_options, num_workers, learning_rate, seed,
                 dead_timeout, eval_every):
        import jax

        from bppsa.sync.policies import make_policy
        from bppsa.tasks import task_from_spec

        self.task = task_from_spec(task_spec)
        self.policy = make_policy(policy, num_workers, **(policy_options or {}))
        from bppsa.sync.simulator import sgd
        self.opt = sgd(learning_rate)
        self.params = self.task.init(jax.random.key(seed))
        self.opt_state = self.opt.init(self.params)
        self._step = self.task.server_step(self.opt)
        self._acc = self.task.accuracy_fn()
        self.version = 0
        self.t0 = time.monotonic()
        self.num_workers = num_workers
        self.dead_timeout = float(dead_timeout)
        self.eval_every = float(eval_every)
        self.last_seq = {p: 0 for p in range(num_workers)}
        self.last_seen = {p: 0.0 for p in range(num_workers)}
        self.events: dict[int, asyncio.Event] = {}
        self.wait_since: dict[int, float] = {}
        self.wait_total = {p: 0.0 for p in range(num_workers)}
        self.applied: list[tuple[int, int, float]] = []
        self.duplicates: list[tuple[int, int]] = []
        self.refused: list[tuple[int, int]] = []
        self.confirmed_dead: set[int] = set()
        self.staleness: dict[int, int] = {}
        self.dead: list[dict] = []
        self.rejoined: list[dict] = []
        self.curve: list[dict] = []
        self.barriers = 0
        self.stopped = False
        self._wait_kind: dict[int, str] = {}
        self._params_np = _to_numpy(self.params)
        # compile the server step and the evaluation before the clock starts
        zeros = jax.tree.map(jax.numpy.zeros_like, self.params)
        jax.block_until_ready(self._step(self.params, self.opt_state, zeros))
        jax.block_until_ready(self._acc(self.params))

    def now(self):
        return time.monotonic() - self.t0

    async def start(self):
        """Reset the clock and start the failure monitor and the periodic evaluation."""
        self.t0 = time.monotonic()
        for p in self.last_seen:
            self.last_seen[p] = 0.0
        self._evaluate()
        asyncio.get_running_loop().create_task(self._monitor())
        return True

    def _evaluate(self):
        loss, acc = self._acc(self.params)
        self.curve.append({"time": self.now(), "version": self.version, "loss": float(loss),
                           "accuracy": float(acc)})

    async def _monitor(self):
        next_eval = self.eval_every
        while not self.stopped:
            await asyncio.sleep(min(0.1, self.eval_every))
            t = self.now()
            for p in sorted(self.policy.active):
                if p not in self.policy.waiting and t - self.last_seen[p] > self.dead_timeout:
                    self._declare_dead(p, "timeout")
            if t >= next_eval:
                self._evaluate()
                next_eval += self.eval_every

    def _declare_dead(self, p, how):
        if p not in self.policy.active:
            return
        d = self.policy.remove(p, self.now())
        self.dead.append({"worker": p, "time": self.now(), "detected_by": how,
                          "last_seen": self.last_seen[p]})
        self._finish_wait(p)
        self._release(d.release)

    def _finish_wait(self, p):
        if p in self.wait_since:
            self.wait_total[p] += self.now() - self.wait_since.pop(p)
        ev = self.events.pop(p, None)
        if ev is not None:
            ev.set()

    def _release(self, workers):
        from bppsa.sync.policies import BARRIER
        if workers and any(self._wait_kind.get(q) == BARRIER for q in workers):
            self.barriers += 1
        for q in workers:
            self._wait_kind.pop(q, None)
            self.last_seen[q] = self.now()
            self._finish_wait(q)

    async def report_dead(self, worker):
        """The driver saw the worker's actor die: drop it for good (a push still in flight is refused)."""
        self.confirmed_dead.add(worker)
        self._declare_dead(worker, "driver")
        return True

    async def pull(self, worker):
        """(params, version, stop): where a worker starts."""
        self.last_seen[worker] = self.now()
        return self._params_np, self.version, self.stopped

    async def push(self, worker, seq, grads, pulled_version):
        """Apply (worker, seq) once; return (params, version, stop, status) when the worker may go on.

        status: "applied"; "duplicate" (this seq was applied before: a retry); "refused" (training
        had stopped: nothing applied, and the worker is told to stop).
        """
        from bppsa.sync.policies import PROCEED
        if self.stopped:
            self.refused.append((worker, seq))
            return self._params_np, self.version, True, "refused"
        if worker in self.confirmed_dead:  # sent just before its actor died: the sender is gone
            self.refused.append((worker, seq))
            return self._params_np, self.version, True, "refused"
        if seq <= self.last_seq.get(worker, 0):
            self.duplicates.append((worker, seq))
            return self._params_np, self.version, self.stopped, "duplicate"
        if worker not in self.policy.active:  # declared dead but alive after all: take it back
            d = self.policy.join(worker, self.now())
            self.rejoined.append({"worker": worker, "time": self.now()})
            if d.kind != PROCEED and worker not in d.release:
                self._wait_kind[worker] = d.kind
                blocked = self._block(worker)
                self._release(d.release)
                await blocked
                if self.stopped or worker not in self.policy.active:
                    self.refused.append((worker, seq))
                    return self._params_np, self.version, True, "refused"
        self.last_seq[worker] = seq
        s = self.version - pulled_version
        self.staleness[s] = self.staleness.get(s, 0) + 1
        self.params, self.opt_state = self._step(self.params, self.opt_state, grads)
        self.version += 1
        self.applied.append((worker, seq, self.now()))
        self._params_np = _to_numpy(self.params)
        d = self.policy.push(worker, self.now())
        if d.kind != PROCEED and worker not in d.release:  # a barrier its own arrival opened: go on
            self._wait_kind[worker] = d.kind
            blocked = self._block(worker)
            self._release(d.release)
            await blocked
        else:
            self._release(tuple(q for q in d.release if q != worker))
        self.last_seen[worker] = self.now()
        return self._params_np, self.version, self.stopped, "applied"

    def _block(self, worker):
        """Register ``worker`` as waiting; return the awaitable that ends when it is released."""
        ev = asyncio.Event()
        self.events[worker] = ev
        self.wait_since[worker] = self.now()
        return ev.wait()

    async def stop(self):
        """Stop training: every waiting and future push returns with stop = True."""
        self.stopped = True
        self._evaluate()
        for p in list(self.events):
            self._finish_wait(p)
        return True

    async def stats(self):
        per_worker = {p: 0 for p in range(self.num_workers)}
        for w, _, _ in self.applied:
            per_worker[w] += 1
        return {"version": self.version, "applied": list(self.applied), "duplicates": list(self.duplicates),
                "refused": list(self.refused),
                "pushes": per_worker, "wait": dict(self.wait_total), "barriers": self.barriers,
                "staleness_hist": dict(sorted(self.staleness.items())), "dead": list(self.dead),
                "rejoined": list(self.rejoined), "curve": list(self.curve), "time": self.now(),
                "active": sorted(self.policy.active)}


class Worker:
    """A worker actor's logic: pull, compute a real gradient, sleep the injected slowdown, push.

    Args:
      worker: this worker's id.
      task_spec: the task's spec ``{"name": ..., **options}`` (:func:`bppsa.tasks.task_from_spec`).
      server: the :class:`ParameterServer` actor's handle.
      batch_size: samples per gradient, drawn with replacement from the training set.
      seed: seeds the batch draws (with the worker's id).
      delay: seconds slept per iteration (the injected slowdown).
      slowdowns: tuples (worker, start_s, end_s, extra_s) of every worker: this worker's add extra_s
        seconds to each iteration that ends its compute in [start_s, end_s) (seconds since the run
        started).
    """

    def __init__(self, worker, task_spec, server, batch_size, seed, delay, slowdowns):
        import jax

        from bppsa.tasks import task_from_spec
        self.worker = worker
        self.task = task_from_spec(task_spec)
        self.grad = self.task.grad_fn()
        self.server = server
        self.batch_size = batch_size
        self.rng = np.random.default_rng([seed, worker, 1])
        self.delay = float(delay)
        self.slowdowns = [s for s in slowdowns if s[0] == worker]
        self.jax = jax

    def ready(self):
        # compile once before the clock starts
        p = self.task.init(self.jax.random.key(0))
        idx = np.arange(self.batch_size) % len(self.task.x_train)
        self.grad(p, self.task.x_train[idx], self.task.y_train[idx])
        return self.worker

    def run(self, max_iterations, t0_wall):
        import ray
        params, version, stop = ray.get(self.server.pull.remote(self.worker))
        seq = 0
        acked = refused = 0
        while not stop and seq < max_iterations:
            idx = self.rng.integers(0, len(self.task.x_train), size=self.batch_size)
            _, g = self.grad(params, self.task.x_train[idx], self.task.y_train[idx])
            g = _to_numpy(g)
            t = time.time() - t0_wall
            extra = sum(x for w, a, b, x in self.slowdowns if a <= t < b)
            if self.delay + extra > 0:
                time.sleep(self.delay + extra)
            seq += 1
            params, version, stop, status = ray.get(self.server.push.remote(self.worker, seq, g, version))
            acked += status in ("applied", "duplicate")
            refused += status == "refused"
        return {"worker": self.worker, "pushes_acked": acked, "pushes_refused": refused}


def init_ray(address: str | None = None, *, num_cpus: int = 2) -> None:
    """Start a local Ray with ``num_cpus`` CPUs (no dashboard), or join the cluster at ``address``.

    A local Ray's worker processes get this bppsa first on their PYTHONPATH, so the actors import
    the same code as the driver.

    Args:
      address: the cluster's address ("auto" or "ray://host:port"); None starts a local Ray.
      num_cpus: the local Ray's CPUs (not used with an address).
    """
    import ray

    if address is None:
        paths = [_REPO_ROOT] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
        ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=False, configure_logging=False)
    else:
        ray.init(address=address, log_to_driver=False)


def run_ray(task_spec, policy: str, *, num_workers: int = 3, policy_options: dict | None = None,
            duration_s: float = 20.0, delays=None, slowdowns=(), kill: tuple | None = None,
            dead_timeout: float = 10.0, learning_rate: float = 0.05, batch_size: int = 32, seed: int = 0,
            eval_every: float = 1.0, max_iterations: int = 10**9, address: str | None = None,
            num_cpus: int | None = None, shutdown: bool | None = None, log=print) -> dict:
    """Train ``task_spec`` for ``duration_s`` wall-clock seconds with a PS on Ray; return the server's log.

    Args:
      task_spec: the task's spec ``{"name": ..., **options}`` (:func:`bppsa.tasks.task_from_spec`).
      policy, policy_options: as :func:`bppsa.sync.make_policy`.
      num_workers: the number of worker actors.
      duration_s: wall-clock seconds of training, after setup (> 0).
      delays: (num_workers,) seconds each worker sleeps per iteration (its injected slowdown;
        None: zeros).
      slowdowns: tuples (worker, start_s, end_s, extra_s): transient stragglers.
      kill: (worker, at_s): ``ray.kill`` that worker at that time (a failure test).
      dead_timeout: a worker that is computing but silent this long is declared dead (> 0).
      learning_rate: the server's SGD learning rate.
      batch_size: samples per gradient.
      seed: seeds the initial parameters and the workers' batch draws.
      eval_every: seconds between the server's test evaluations.
      max_iterations: each worker stops after this many pushes.
      address: an existing Ray cluster ("auto" or "ray://host:port"); None starts a local Ray with
        ``num_cpus`` CPUs (stopped again at the end unless ``shutdown=False``).
      num_cpus: the local Ray's CPUs (None: 2).
      shutdown: stop Ray at the end; None: only a Ray this call started.
      log: called with each line of progress (default ``print``).

    Returns:
      The server's ``stats()`` (a dict) plus ``workers`` (each worker's own count of acknowledged
      pushes, or the error that ended it), ``detect_delay`` (kill → detection, seconds), timing
      (``wall_s``, ``setup_s``, ``killed_at``) and the policy and its options.

    Raises:
      ValueError: for an unknown policy or option, delays that are not one per worker, a duration_s
      or dead_timeout not above 0, or a malformed ``kill``.
    """
    import ray
    from ray.exceptions import RayError

    from bppsa.sync.policies import make_policy
    make_policy(policy, num_workers, **(policy_options or {}))  # validate before starting anything
    delays = [0.0] * num_workers if delays is None else [float(d) for d in delays]
    if len(delays) != num_workers:
        raise ValueError(f"delays must have num_workers = {num_workers} entries; got {len(delays)}")
    if duration_s <= 0 or dead_timeout <= 0:
        raise ValueError(f"duration_s and dead_timeout must be > 0; got {duration_s}, {dead_timeout}")
    if kill is not None and (len(kill) != 2 or not 0 <= int(kill[0]) < num_workers or not kill[1] >= 0):
        raise ValueError(f"kill must be (worker in 0..{num_workers - 1}, seconds >= 0) or None; got {kill!r}")
    started = False
    if not ray.is_initialized():
        init_ray(address, num_cpus=num_cpus or 2)
        started = True
    # Ray's stubs type actor classes and handles loosely (no overload of ray.remote takes actor options
    # such as max_concurrency; handles' methods show up as plain functions without .remote): treat the
    # actor classes, and so their handles, as Any.
    Server: Any = ray.remote(num_cpus=0, max_concurrency=1000)(ParameterServer)  # pyright: ignore[reportCallIssue]
    Work: Any = ray.remote(num_cpus=0, max_restarts=0)(Worker)
    server = Server.remote(dict(task_spec), policy, policy_options or {}, num_workers, learning_rate, seed,
                           dead_timeout, eval_every)
    workers = [Work.remote(p, dict(task_spec), server, batch_size, seed, delays[p], list(slowdowns))
               for p in range(num_workers)]
    t_setup = time.time()
    try:
        ray.get([w.ready.remote() for w in workers] + [server.stats.remote()], timeout=300)
        ray.get(server.start.remote(), timeout=60)
        t0 = time.time()
        log(f"ray runtime: {num_workers} workers and the server ready in {t0 - t_setup:.1f} s")
        refs = {w.run.remote(max_iterations, t0): p for p, w in enumerate(workers)}
        results: dict[int, dict] = {}
        killed_at = None
        pending = list(refs)
        while pending and time.time() - t0 < duration_s:
            if kill is not None and killed_at is None and time.time() - t0 >= kill[1]:
                ray.kill(workers[kill[0]], no_restart=True)
                killed_at = time.time() - t0
                log(f"killed worker {kill[0]} at {killed_at:.2f} s")
            done, pending = ray.wait(pending, num_returns=1, timeout=0.1)
            for ref in done:
                p = refs[ref]
                try:
                    results[p] = ray.get(ref)
                except RayError as e:  # the worker died
                    results[p] = {"worker": p, "error": type(e).__name__, "message": str(e)[-2000:]}
                    ray.get(server.report_dead.remote(p), timeout=60)
                    log(f"worker {p} died ({type(e).__name__}); dropped from the policy")
        ray.get(server.stop.remote(), timeout=60)
        done, pending = ray.wait(pending, num_returns=len(pending), timeout=60) if pending else ([], [])
        for ref in done:
            try:
                results[refs[ref]] = ray.get(ref)
            except RayError as e:
                results[refs[ref]] = {"worker": refs[ref], "error": type(e).__name__}
        for ref in pending:
            results[refs[ref]] = {"worker": refs[ref], "error": "did not stop within 60 s"}
        # one ObjectRef in, the server's stats() dict out (ray.get's overloads pick the list case for Any)
        stats = cast(dict, ray.get(server.stats.remote(), timeout=60))
        stats["workers"] = [results.get(p) for p in range(num_workers)]
        stats["wall_s"] = time.time() - t0
        stats["setup_s"] = t0 - t_setup
        stats["killed_at"] = killed_at
        det = [d["time"] for d in stats["dead"] if kill is not None and d["worker"] == kill[0]]
        stats["detect_delay"] = (det[0] - killed_at) if det and killed_at is not None else None
        stats["policy"], stats["policy_options"] = policy, dict(policy_options or {})
        return stats
    finally:
        for a in workers + [server]:
            try:
                ray.kill(a, no_restart=True)
            except Exception:  # already dead
                pass
        if shutdown or (shutdown is None and started):
            ray.shutdown()
