"""A minimal local multi-process spawner for ``jax.distributed`` on loopback (127.0.0.1).

``spawn(argv, n)`` starts n copies of ``python argv...`` with the coordinator address, the
process count and the process id in the environment, waits for them with a timeout, and
returns their exit codes and output. In each child, :func:`init_distributed` reads that
environment, selects CPU collectives over gloo, and calls ``jax.distributed.initialize``.
(The project launcher, ``bppsa launch``, can take this over.)
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from dataclasses import dataclass

__all__ = ["free_port", "spawn", "init_distributed", "ProcessResult", "ENV_COORDINATOR",
           "ENV_NUM_PROCESSES", "ENV_PROCESS_ID"]

ENV_COORDINATOR = "BPPSA_COORDINATOR"
ENV_NUM_PROCESSES = "BPPSA_NUM_PROCESSES"
ENV_PROCESS_ID = "BPPSA_PROCESS_ID"


@dataclass
class ProcessResult:
    process_id: int
    returncode: int | None  # None: killed at the timeout
    output: str


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _child_env(port: int, n: int, i: int, extra: dict | None) -> dict:
    env = dict(os.environ)
    # one CPU device per process: drop a forced host device count (e.g. the test session's 8)
    flags = re.sub(r"--xla_force_host_platform_device_count=\S+", "", env.get("XLA_FLAGS", "")).strip()
    env["XLA_FLAGS"] = flags
    env["JAX_PLATFORMS"] = "cpu"
    # children import the same bppsa as the parent (a worktree may shadow an installed copy)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = os.pathsep.join([root] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env[ENV_COORDINATOR] = f"127.0.0.1:{port}"
    env[ENV_NUM_PROCESSES] = str(n)
    env[ENV_PROCESS_ID] = str(i)
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
    """In a spawned child: initialise ``jax.distributed`` from the environment; returns (id, n).

    Must run before any other JAX call in the process. CPU collectives go over gloo.
    """
    import jax

    try:
        addr, n, i = os.environ[ENV_COORDINATOR], int(os.environ[ENV_NUM_PROCESSES]), int(os.environ[ENV_PROCESS_ID])
    except KeyError as e:
        raise RuntimeError(f"init_distributed: {e.args[0]} is not set; start this process with "
                           "bppsa.hetero.launch.spawn") from None
    if x64 is not None:
        jax.config.update("jax_enable_x64", x64)
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=addr, num_processes=n, process_id=i,
                               initialization_timeout=60)
    return i, n
