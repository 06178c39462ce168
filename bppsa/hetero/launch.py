"""Spawn a local multi-process JAX job and collect each process's exit code and output.

``spawn(argv, n)`` starts n copies of ``python argv...`` on loopback with the same environment
contract as ``bppsa launch`` (:data:`bppsa.parallel.mesh.ENV`), waits for them with a timeout and
returns one :class:`ProcessResult` per process — the form experiments and tests need, where
``bppsa launch`` streams output for people. In each child, :func:`init_distributed` joins the job
through :func:`bppsa.parallel.initialize` (gloo CPU collectives, coordinator bound to loopback).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass

from ..parallel.launch import free_port
from ..parallel.mesh import ENV

__all__ = ["free_port", "spawn", "init_distributed", "ProcessResult"]


@dataclass
class ProcessResult:
    process_id: int
    returncode: int | None  # None: killed at the timeout
    output: str


def _child_env(port: int, n: int, i: int, extra: dict | None) -> dict:
    env = dict(os.environ)
    # one CPU device per process: drop a forced host device count (e.g. the test session's 8)
    flags = re.sub(r"--xla_force_host_platform_device_count=\S+", "", env.get("XLA_FLAGS", "")).strip()
    env["XLA_FLAGS"] = flags
    env["JAX_PLATFORMS"] = "cpu"
    # children import the same bppsa as the parent (a worktree may shadow an installed copy)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = os.pathsep.join([root] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env[ENV["coordinator"]] = f"127.0.0.1:{port}"
    env[ENV["num_processes"]] = str(n)
    env[ENV["process_id"]] = str(i)
    env[ENV["timeout"]] = "60"
    env.update(extra or {})
    return env


def spawn(argv: list[str], num_processes: int, *, timeout: float = 120.0, env: dict | None = None,
          cwd: str | None = None) -> list[ProcessResult]:
    """Run ``python *argv`` as ``num_processes`` cooperating processes; kill all at ``timeout`` s.

    ``env`` adds variables to every child. Returns one :class:`ProcessResult` per process, in
    process-id order; output is stdout and stderr together.
    """
    if num_processes < 1:
        raise ValueError(f"num_processes must be >= 1; got {num_processes}")
    if timeout <= 0:
        raise ValueError(f"timeout must be > 0 seconds; got {timeout}")
    port = free_port()
    procs = [subprocess.Popen([sys.executable, *argv], env=_child_env(port, num_processes, i, env), cwd=cwd,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for i in range(num_processes)]
    deadline = time.monotonic() + timeout
    results = []
    for i, p in enumerate(procs):
        try:
            out, _ = p.communicate(timeout=max(deadline - time.monotonic(), 0.1))
            results.append(ProcessResult(i, p.returncode, out))
        except subprocess.TimeoutExpired:
            for q in procs:  # one straggler blocks the others at the next collective: stop them all
                if q.poll() is None:
                    q.kill()
            out, _ = p.communicate()
            results.append(ProcessResult(i, None, out))
    return results


def init_distributed(*, x64: bool | None = None) -> tuple[int, int]:
    """In a spawned child: join the job from the environment; returns (process id, process count).

    Must run before any other JAX call in the process.
    """
    import jax

    from ..parallel.mesh import initialize

    if ENV["num_processes"] not in os.environ:
        raise RuntimeError(f"init_distributed: {ENV['num_processes']} is not set; start this process with "
                           "bppsa.hetero.launch.spawn or bppsa launch")
    if x64 is not None:
        jax.config.update("jax_enable_x64", x64)
    initialize()
    return jax.process_index(), jax.process_count()
