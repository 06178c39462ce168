"""Stop signals in the ``bppsa`` command: Ctrl-C (SIGINT) and SIGTERM end it with one line and exit code
128 + the signal's number (130, 143) at any moment (the imports, a compile, a step, a checkpoint, the
end), and the run resumes from where it stopped. (Before the command's first line runs, in the few
tens of milliseconds the interpreter takes to start, a signal ends it as it ends any program.)

:func:`install` is the first thing the command does, before it imports JAX. From then on a stop signal
raises :class:`Interrupted` (a ``KeyboardInterrupt``) in the main thread, so the run unwinds through
its ``finally`` blocks (the work directory's marker written, its lock released, the metrics closed);
the command prints its line and ends with :func:`leave`, which flushes the standard streams and ends
the process with ``os._exit``, without interpreter shutdown: shutdown destroys JAX's client while a
compile that the signal left behind still runs on one of XLA's threads, and that thread then crashes
(SIGSEGV, exit code 139, in about half of the signals sent during a compile).

Two more places where a plain ``KeyboardInterrupt`` goes astray:

- Python ignores an exception raised in a garbage-collection callback (JAX registers one) or in a
  ``__del__``: it prints "Exception ignored in ..." and goes on, and the run would end with exit code
  0. Such an :class:`Interrupted` is raised again, silently, :data:`AGAIN_S` later (where the main
  thread is by then), until it unwinds the run.
- A further stop signal while the run unwinds is ignored, so the clean-up it runs is not cut short
  (it takes well under a second; SIGKILL ends the process at once, and a killed run resumes too).

Once the command's work is done (everything saved), :func:`stop_at_once` makes a stop signal during
interpreter shutdown print the line and :func:`leave` at once. From the last exit callback on, the
interpreter tears down its modules and JAX's C++ runtime (a few tenths of a second), where Python
stops running handlers and a stop signal would kill the finished command (exit code -2): that
callback makes the process ignore stop signals, and the command ends with its own exit code.
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
import threading
from typing import Any

__all__ = ["SIGNALS", "AGAIN_S", "Interrupted", "install", "describe", "stop_at_once", "leave"]

SIGNALS = (signal.SIGINT, signal.SIGTERM)
AGAIN_S = 0.01  # an Interrupted that Python ignored is raised again this many seconds later


class Interrupted(KeyboardInterrupt):
    """A stop signal reached the ``bppsa`` command; ``signum`` is the signal's number."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def describe(signum: int) -> str:
    """How the command's last line names the signal: "Ctrl-C" for SIGINT, else its name ("SIGTERM")."""
    return "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name


def install() -> None:
    """Turn SIGINT and SIGTERM into :class:`Interrupted` in the main thread (see the module docstring).

    For the command's own process only (it changes the process's signal handlers and
    ``sys.unraisablehook``); call it from the main thread, before the heavy imports. A signal the
    process was started ignoring (SIGINT in a shell script's background job) stays ignored, as Python
    leaves it.
    """
    for signum in _handled():
        signal.signal(signum, _raise)
    # registered before the libraries' own: the last exit callback to run (see the module docstring)
    atexit.register(_ignore)
    previous = sys.unraisablehook

    def hook(unraisable: Any) -> None:
        if not isinstance(unraisable.exc_value, Interrupted):
            previous(unraisable)
            return
        # from another thread: a signal sent from here would be handled inside this very hook
        again = threading.Timer(AGAIN_S, signal.pthread_kill,
                                (threading.main_thread().ident, unraisable.exc_value.signum))
        again.daemon = True
        again.start()

    sys.unraisablehook = hook


def _raise(signum: int, frame: Any) -> None:
    """The handler :func:`install` sets: raise :class:`Interrupted`, unless one is already unwinding (being
    handled, or the context of what is)."""
    unwinding = sys.exc_info()[1]
    while unwinding is not None:
        if isinstance(unwinding, Interrupted):
            return
        unwinding = unwinding.__context__
    raise Interrupted(signum)


def _handled() -> list[int]:
    """The stop signals this process does not ignore."""
    return [signum for signum in SIGNALS if signal.getsignal(signum) is not signal.SIG_IGN]


def _ignore() -> None:
    for signum in SIGNALS:
        signal.signal(signum, signal.SIG_IGN)


def stop_at_once(line: str) -> None:
    """From now on a stop signal prints ``line`` (its ``{}`` filled with :func:`describe` of the signal) on
    stderr and ends the process with :func:`leave`: for the command's last moments, its work done and saved."""
    def stop(signum: int, frame: Any) -> None:
        try:
            print(line.format(describe(signum)), file=sys.stderr)
        except (AttributeError, OSError, ValueError):  # sys.stderr gone or closed this late in shutdown
            pass
        leave(128 + signum)

    for signum in _handled():
        signal.signal(signum, stop)


def leave(code: int) -> None:
    """End the process with exit code ``code`` now: flush the standard streams and the logging handlers,
    then ``os._exit``, skipping interpreter shutdown (which can crash after a signal: the module docstring)."""
    if "logging" in sys.modules:
        sys.modules["logging"].shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (AttributeError, OSError, ValueError):  # no stream, a closed pipe: nothing more can be said there
            pass
    os._exit(code)
