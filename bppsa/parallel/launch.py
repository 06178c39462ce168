"""``bppsa launch -n N [--devices-per-process K] -- COMMAND …``: N local processes, one JAX job.

For development on one machine: it picks a free loopback port, starts N copies of COMMAND as
subprocesses with the coordinator address and their process id in the environment (see
:data:`bppsa.parallel.mesh.ENV`; the worker calls :func:`bppsa.parallel.initialize`), puts this
bppsa first on their PYTHONPATH, gives each K simulated CPU devices, prefixes their output with
``[i]`` (read as UTF-8, other bytes shown as U+FFFD; lines quoted in a report are cut to
:data:`REPORT_LINE_CHARS`) and watches them:

- all exit 0 → exit 0;
- one exits non-zero (or is killed, e.g. JAX aborting on a lost peer) → the others get
  ``--grace`` seconds to finish, are then stopped, and the launcher reports which process failed,
  how, and its last output lines, exiting 1;
- one exits 0 while others keep running past ``--grace`` (a peer waiting for a process that left)
  → the rest are stopped and reported, exit 1;
- the launcher gets SIGTERM, SIGINT (Ctrl-C) or SIGHUP → it forwards that signal to every
  process, and exits 128 + the signal's number (143, 130, 129) once they are gone;
- nothing finishes within ``--timeout`` → every process is stopped and reported, exit 124.

Each process runs in its own session, so a signal reaches it only through the launcher.
"Stopped" means: the signal (SIGTERM unless the launcher got another one) goes to the process's
whole process group; what is still running ``--kill-after`` seconds later gets SIGKILL (a second
signal to the launcher kills at once), and the report names every process that had to be killed.
``--timeout`` bounds everything, a stop in progress included: at ``timeout`` seconds the
processes get SIGTERM and at most :data:`TIMEOUT_KILL_S` seconds later SIGKILL, so the launcher
returns within about ``timeout + 1`` seconds whatever the processes do. (Signals are handled when
:func:`launch` runs in the main thread.)

So a process that dies or never joins surfaces as a clear error within a bounded time instead of
a hang, and no process outlives the launcher. On a cluster, run the same COMMAND under the
cluster's launcher instead (``srun``: JAX reads SLURM_NTASKS / SLURM_PROCID / SLURM_STEP_NODELIST
itself).
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from typing import TextIO

from bppsa.errors import UsageError, as_int
from bppsa.parallel.mesh import ENV

__all__ = ["main", "launch", "free_port"]

_FRAME = re.compile(r"^\s*@\s+0x")  # a line of a native (absl) stack trace


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago.

    Returns:
      The port number (another process may take it before it is used).
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker_env(base, i, n, port, devices, timeout):
    env = dict(base)
    # workers import the same bppsa as the launcher (a checkout may shadow an installed copy)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    paths = [root] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    env[ENV["coordinator"]] = f"127.0.0.1:{port}"
    env[ENV["num_processes"]] = str(n)
    env[ENV["process_id"]] = str(i)
    env[ENV["timeout"]] = str(max(1, int(timeout)))
    if devices is not None:
        flags = re.sub(r"--xla_force_host_platform_device_count=\S+", "", env.get("XLA_FLAGS", ""))
        env["XLA_FLAGS"] = f"{flags.strip()} --xla_force_host_platform_device_count={devices}".strip()
        env.setdefault("JAX_PLATFORMS", "cpu")
    return env


REPORT_LINE_CHARS = 500  # a worker's output line quoted in a report is cut to this many characters
PORTS = range(1, 65536)


def _cut(line: str, limit: int = REPORT_LINE_CHARS) -> str:
    return line if len(line) <= limit else f"{line[:limit]} … ({len(line) - limit} more characters)"


def _pump(stream, prefix, tail, out):
    """Copy a worker's output lines to ``out`` (prefixed) and keep the last ones, cut, in ``tail``.

    Reads to the end whatever comes: undecodable bytes arrive as U+FFFD (the pipe is opened with
    errors="replace"), and a line ``out`` cannot take is written escaped, or dropped, while the
    pipe keeps being drained, so a worker never blocks on a full pipe.
    """
    try:
        for line in iter(stream.readline, ""):
            tail.append(_cut(line.rstrip("\n")))
            text = f"{prefix}{line}"
            try:
                try:
                    out.write(text)
                except UnicodeEncodeError:  # e.g. an ASCII terminal and a U+FFFD
                    out.write(text.encode("ascii", "backslashreplace").decode("ascii"))
                out.flush()
            except (OSError, ValueError):
                pass  # our own output is gone (closed, a broken pipe): keep draining the worker's
    finally:
        stream.close()


TIMEOUT_KILL_S = 1.0  # at --timeout: seconds from SIGTERM to SIGKILL
_SIGNALS = tuple(getattr(signal, n) for n in ("SIGTERM", "SIGINT", "SIGHUP") if hasattr(signal, n))


def _status(p):
    """p's exit code (negative: killed by that signal) or None while it runs, without reaping it:
    an unreaped process keeps its pid, so its process group can still be signalled safely."""
    if p.returncode is not None:
        return p.returncode
    if not hasattr(os, "waitid"):  # macOS before Python 3.13
        return p.poll()
    try:
        r = os.waitid(os.P_PID, p.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return p.poll()
    if r is None:
        return None
    return r.si_status if r.si_code == os.CLD_EXITED else -r.si_status


def _signal_groups(procs, sig):
    for p in procs:
        try:
            os.killpg(p.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def _stop(procs, sig, wait, received):
    """Send ``sig`` to every process group, give the processes ``wait`` seconds (cut short by a
    new signal in ``received``), SIGKILL the groups (stragglers and leftover children alike) and
    reap the processes. Returns the indices of the processes that were still running when killed."""
    procs = [p for p in procs if p.returncode is None]  # unreaped: their pids (= group ids) are still theirs
    _signal_groups(procs, sig)
    end, seen = time.monotonic() + max(0.0, wait), len(received)
    while time.monotonic() < end and len(received) == seen and any(_status(p) is None for p in procs):
        time.sleep(0.02)
    killed = [p for p in procs if _status(p) is None]
    _signal_groups(procs, signal.SIGKILL)
    for p in procs:
        p.wait()
    return killed


def _describe(code):
    if code is None:
        return "was still running"
    if code < 0:
        try:
            return f"was killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def _signame(sig):
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


class _Handlers:
    """Record SIGTERM/SIGINT/SIGHUP in a list while active (main thread only; elsewhere a no-op)."""

    def __init__(self):
        self.received, self._old = [], {}

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for sig in _SIGNALS:
                self._old[sig] = signal.signal(sig, lambda signum, frame: self.received.append(signum))
        return self.received

    def __exit__(self, *exc):
        for sig, handler in self._old.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)


def launch(command: Sequence[str], n: int, *, devices_per_process: int | None = None, timeout: float = 600.0,
           grace: float = 30.0, kill_after: float = 5.0, port: int | None = None, out: TextIO | None = None,
           err: TextIO | None = None) -> int:
    """Run ``command`` (a list) as ``n`` processes of one JAX job; return the exit code (see module).

    Args:
      command: the program and its arguments, run as it is by every process.
      n: the number of processes.
      devices_per_process: simulated CPU devices per process (sets ``XLA_FLAGS`` and ``JAX_PLATFORMS=cpu``);
        None: the environment's setting.
      timeout: seconds before every process is stopped (finite: it bounds the whole job).
      grace: seconds the others may run on after one process has exited.
      kill_after: seconds between the stop signal and SIGKILL.
      port: the coordinator's TCP port on 127.0.0.1; None: a free one (:func:`free_port`).
      out: where the processes' prefixed output goes (default ``sys.stdout``).
      err: where the failure report goes (default ``sys.stderr``).

    Returns:
      The exit code: 0 when every process exited 0; 1 when one failed, or exited while the others kept
      running past ``grace``; 124 on ``timeout``; 128 + the signal's number on SIGTERM, SIGINT or SIGHUP.

    Raises:
      ValueError: an empty ``command``, an ``n`` or ``devices_per_process`` that is not a positive int, a
      ``timeout`` that is not > 0, or a negative ``grace`` or ``kill_after``.

      bppsa.errors.UsageError: an infinite ``timeout``, a ``port`` outside 1..65535, or a ``command``
      that cannot be started.
    """
    stdout: TextIO = sys.stdout if out is None else out
    stderr: TextIO = sys.stderr if err is None else err
    if not command:
        raise ValueError("command must be a non-empty list (the program after `--`)")
    if (count := as_int(n)) is None or count < 1:
        raise ValueError(f"n (number of processes) must be a positive int; got {n!r}")
    n = count
    if devices_per_process is not None:
        if (count := as_int(devices_per_process)) is None or count < 1:
            raise ValueError(f"devices_per_process must be a positive int; got {devices_per_process!r}")
        devices_per_process = count
    if not (timeout > 0 and grace >= 0 and kill_after >= 0):
        raise ValueError(f"timeout must be > 0, grace and kill_after >= 0; got timeout={timeout}, grace={grace}, "
                         f"kill_after={kill_after}")
    if timeout == float("inf"):
        raise UsageError(f"timeout must be a finite number of seconds > 0 (it bounds the whole job); got {timeout}")
    if port is None:
        port = free_port()
    elif (number := as_int(port)) is None or number not in PORTS:
        raise UsageError(f"port must be a TCP port in 1..65535 (or None: a free one); got {port!r}")
    else:
        port = number
    lock = threading.Lock()

    class _Locked:
        def write(self, s):
            with lock:
                stdout.write(s)

        def flush(self):
            stdout.flush()

    procs, tails, pumps = [], [], []
    start = time.monotonic()
    with _Handlers() as received:
        try:
            for i in range(n):
                env = _worker_env(os.environ, i, n, port, devices_per_process, timeout)
                try:
                    p = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, encoding="utf-8", errors="replace",
                                         start_new_session=True)
                except OSError as e:  # not found, not executable
                    raise UsageError(f"cannot start COMMAND {command[0]!r}: {e.strerror or e}; expected a program "
                                     f"on PATH or a path to an executable") from None
                tail = collections.deque(maxlen=200)
                t = threading.Thread(target=_pump, args=(p.stdout, f"[{i}] ", tail, _Locked()), daemon=True)
                t.start()
                procs.append(p)
                tails.append(tail)
                pumps.append(t)
            rc, failure, codes = _watch(procs, start, timeout, grace, received)
            now = time.monotonic()
            # every stop ends by timeout + TIMEOUT_KILL_S, however long --kill-after is
            wait = min(kill_after, max(0.0, start + timeout + TIMEOUT_KILL_S - now))
            sig = received[0] if received else signal.SIGTERM
            killed = [procs.index(p) for p in _stop(procs, sig, wait, received)]
        finally:
            if any(p.returncode is None for p in procs):  # an exception on the way: leave no process behind
                _stop(procs, signal.SIGKILL, 0.0, received)
    end = time.monotonic() + 2.0
    for t in pumps:
        t.join(timeout=max(0.0, end - time.monotonic()))
    if rc != 0:
        elapsed = time.monotonic() - start
        running = [i for i, c in enumerate(codes) if c is None]
        if rc == 124:
            lines = [f"bppsa launch: timed out after {timeout:g} s; processes {running} were still running "
                     f"(a peer that never joined, or a hang) and were stopped"]
        elif rc > 128:
            lines = [f"bppsa launch: received {_signame(rc - 128)} after {now - start:.1f} s; forwarded it to "
                     f"processes {running} (exit code {rc} = 128 + {rc - 128})"]
            codes = [p.returncode for p in procs]
        elif failure is not None:
            i = failure[0]
            lines = [f"bppsa launch: process {i} of {n} {_describe(codes[i])} after "
                     f"{failure[1] - start:.1f} s"]
            if running:
                lines.append(f"  processes {running} were still running {grace:g} s later (probably "
                             f"waiting for the missing peer) and were stopped")
        else:
            done = [i for i, c in enumerate(codes) if c == 0]
            lines = [f"bppsa launch: processes {done} finished but processes {running} were still running "
                     f"{grace:g} s later (waiting for a peer that left?) and were stopped"]
        why = (f"was still running at a second signal ({_signame(received[-1])})" if len(received) > 1 else
               f"did not exit within {wait:.1f} s of {_signame(sig)}")
        lines.extend(f"  process {i} {why} and was killed (SIGKILL)" for i in killed)
        for i, c in enumerate(codes):
            lines.append(f"  process {i}: {_describe(c)}")
            useful = [line for line in tails[i] if line.strip() and not _FRAME.match(line)]
            if c not in (0,) and useful:  # its last words, without native stack frames
                lines.extend(f"    | {line}" for line in useful[-8:])  # cut by _pump
        lines.append(f"  (coordinator 127.0.0.1:{port}, {elapsed:.1f} s in all)")
        stderr.write("\n".join(lines) + "\n")
        stderr.flush()
    return rc


def _watch(procs, start, timeout, grace, received):
    """Poll until the job is decided: (exit code, (first failed index, time) or None, codes then)."""
    failure, first_exit = None, None
    while True:
        codes = [_status(p) for p in procs]
        now = time.monotonic()
        if all(c == 0 for c in codes):
            return 0, failure, codes
        if received:
            return 128 + received[0], failure, codes
        bad = [i for i, c in enumerate(codes) if c not in (None, 0)]
        if bad and failure is None:
            failure = (bad[0], now)
        if first_exit is None and any(c is not None for c in codes):
            first_exit = now
        running = [i for i, c in enumerate(codes) if c is None]
        if failure is not None and (not running or now - failure[1] > grace):
            return 1, failure, codes
        if failure is None and first_exit is not None and now - first_exit > grace:
            return 1, failure, codes
        if now - start > timeout:
            return 124, failure, codes
        time.sleep(0.05)


def main(argv: Sequence[str] | None = None) -> int:
    """``bppsa launch``: parse the command line and :func:`launch` the COMMAND after ``--``.

    Args:
      argv: the arguments after ``bppsa launch`` (default ``sys.argv[1:]``): ``-n N``,
        ``--devices-per-process K``, ``--timeout S``, ``--grace S``, ``--kill-after S``, ``--port P``,
        then ``--`` and COMMAND (a leading ``python`` is replaced by this interpreter).

    Returns:
      :func:`launch`'s exit code.

    Raises:
      SystemExit: (exit code 2, argparse's) a missing COMMAND or ``-n``, or a value out of range.

      bppsa.errors.UsageError: an infinite ``--timeout`` or a ``--port`` outside 1..65535.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" in argv:
        cut = argv.index("--")
        opts, command = argv[:cut], argv[cut + 1:]
    else:
        opts, command = argv, []
    ap = argparse.ArgumentParser(
        prog="bppsa launch", description="Run COMMAND as N local processes of one JAX job "
        "(jax.distributed on 127.0.0.1, gloo collectives on CPU).",
        usage="bppsa launch -n N [--devices-per-process K] [--timeout S] [--grace S] [--kill-after S] [--port P] "
              "-- COMMAND ...")
    ap.add_argument("-n", "--num-processes", type=int, required=True, help="number of processes")
    ap.add_argument("--devices-per-process", type=int, default=None,
                    help="simulated CPU devices per process (sets XLA_FLAGS and JAX_PLATFORMS=cpu)")
    ap.add_argument("--timeout", type=float, default=600.0,
                    help="seconds before everything is stopped (a hard bound: SIGKILL at most 1 s later)")
    ap.add_argument("--grace", type=float, default=30.0,
                    help="seconds the others may run on after one process has exited")
    ap.add_argument("--kill-after", type=float, default=5.0,
                    help="seconds between the stop signal (SIGTERM, or the SIGINT/SIGHUP the launcher got) "
                         "and SIGKILL")
    ap.add_argument("--port", type=int, default=None, help="coordinator port (default: a free one)")
    args = ap.parse_args(opts)
    if not command:
        ap.error("no COMMAND given; put it after `--`, e.g. bppsa launch -n 2 -- python -m bppsa.parallel.selfcheck")
    if args.num_processes < 1:
        ap.error(f"-n must be >= 1; got {args.num_processes}")
    if args.devices_per_process is not None and args.devices_per_process < 1:
        ap.error(f"--devices-per-process must be >= 1; got {args.devices_per_process}")
    if not args.timeout > 0:
        ap.error(f"--timeout must be > 0 seconds; got {args.timeout:g}")
    if args.timeout == float("inf"):
        raise UsageError(f"--timeout must be a finite number of seconds (it bounds the whole job); "
                         f"got {args.timeout:g}")
    if args.port is not None and args.port not in PORTS:
        raise UsageError(f"--port must be a TCP port in 1..65535 (leave it out for a free one); got {args.port}")
    for flag, value in (("--grace", args.grace), ("--kill-after", args.kill_after)):
        if not value >= 0:
            ap.error(f"{flag} must be >= 0 seconds; got {value:g}")
    if command[0] == "python":  # the interpreter running bppsa, so the worker sees the same packages
        command = [sys.executable] + command[1:]
    return launch(command, args.num_processes, devices_per_process=args.devices_per_process,
                  timeout=args.timeout, grace=args.grace, kill_after=args.kill_after, port=args.port)


if __name__ == "__main__":
    sys.exit(main())
