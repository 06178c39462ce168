"""Stop signals in the ``bppsa`` command: Ctrl-C (SIGINT) and SIGTERM end it with one line and exit code
128 + the signal's number (130, 143) at any moment (the imports, a compile, a step, a checkpoint, the
end), and the run resumes from where it stopped. (Before the command's first line runs, in the few
tens of milliseconds the interpreter takes to start, a signal ends it as it ends any program.)

:func:`install` is the first thing the command does, before it imports JAX. From then on a stop signal
is recorded (:func:`received`: the truth about whether the command was interrupted) and raises
:class:`Interrupted` (a ``KeyboardInterrupt``) in the main thread, so the run unwinds through its
``finally`` blocks (the work directory's marker written, its lock released, the metrics closed); the
command then calls :func:`end`: the line, and :func:`leave`, which flushes the standard streams and
ends the process with ``os._exit``, without interpreter shutdown: shutdown destroys JAX's client while
a compile that the signal left behind still runs on one of XLA's threads, and that thread then
crashes (SIGSEGV, exit code 139, in about half of the signals sent during a compile).

An :class:`Interrupted` does not always reach the command as itself:

- Raised inside an extension module's import (numpy's, from jaxlib's), it becomes an ``ImportError``
  ("numpy._core.multiarray failed to import", "Encountered an error while initializing the
  extension"), and other code turns it into other exceptions: the command ends as interrupted
  whatever exception follows a recorded signal.
- It can be dropped: Python ignores an exception raised in a garbage-collection callback (JAX
  registers one) or in a ``__del__`` (it would print "Exception ignored in ..."), C code prints one
  and replaces it (numpy's C API, through ``sys.excepthook``), and code that catches ``ImportError``
  drops one chained to it; this module's hooks keep the first two silent. An :class:`Interrupted`
  dropped before the command took note of it (freed: :meth:`Interrupted.__del__`) has its signal
  sent again :data:`AGAIN_S` later by a thread of this module, to wherever the main thread is by
  then, until one unwinds the run. A signal that lands while Python reports a dropped one (in the
  unraisable hook), or while an unrelated exception is handled after an earlier signal, is sent
  again the same way.
- A further stop signal while the run unwinds from one (an :class:`Interrupted` being handled, or in
  the chain of what is) is ignored, so the clean-up it runs is not cut short (it takes well under a
  second; SIGKILL ends the process at once, and a killed run resumes too).

Once the command's work is done (everything saved), :func:`stop_at_once` makes a stop signal during
interpreter shutdown print the line and :func:`leave` at once. From the last exit callback on, the
interpreter tears down its modules and JAX's C++ runtime (a few tenths of a second), where Python
stops running handlers and a stop signal would kill the finished command (exit code -2): that
callback makes the process ignore stop signals, and the command ends with its own exit code.
"""

from __future__ import annotations

import atexit
import os
import queue
import signal
import sys
import threading
import time
from typing import Any, NoReturn

__all__ = ["SIGNALS", "AGAIN_S", "Interrupted", "install", "received", "describe", "end", "stop_at_once",
           "leave"]

SIGNALS = (signal.SIGINT, signal.SIGTERM)
AGAIN_S = 0.01  # a dropped Interrupted's signal is sent again this many seconds later

_received: int | None = None  # the first stop signal since install()
_over = False  # the command took note of the signal (end()): nothing is sent again
_again: queue.SimpleQueue[int] = queue.SimpleQueue()  # signals to send again; put() is safe in handlers and __del__
_main: int | None = None  # the main thread's ident, once install() ran


class Interrupted(KeyboardInterrupt):
    """A stop signal reached the ``bppsa`` command; ``signum`` is the signal's number."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    def __del__(self) -> None:
        # freed before the command took note of it: dropped (a gc callback, an ImportError caught)
        if _main is not None and not _over:
            _again.put(self.signum)


def describe(signum: int) -> str:
    """How the command's last line names the signal: "Ctrl-C" for SIGINT, else its name ("SIGTERM")."""
    return "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name


def received() -> int | None:
    """The first stop signal the process received since :func:`install` (None: none)."""
    return _received


def install() -> None:
    """Turn SIGINT and SIGTERM into :class:`Interrupted` in the main thread (see the module docstring).

    For the command's own process only (it changes the process's signal handlers and
    ``sys.unraisablehook``, and starts a daemon thread); call it from the main thread, before the
    heavy imports. A signal the process was started ignoring (SIGINT in a shell script's background
    job) stays ignored, as Python leaves it. The handlers come last: a signal before them is Python's
    own ``KeyboardInterrupt`` (SIGINT) or ends the process (SIGTERM).
    """
    global _main
    _main = threading.main_thread().ident
    threading.Thread(target=_send_again, args=(_main,), name="bppsa-interrupt", daemon=True).start()
    # registered before the libraries' own: the last exit callback to run (see the module docstring)
    atexit.register(_ignore)
    previous = sys.unraisablehook

    def hook(unraisable: Any) -> None:
        if not isinstance(unraisable.exc_value, Interrupted):  # an Interrupted: dropped, silently
            previous(unraisable)

    _HOOKS.add(hook.__code__)
    sys.unraisablehook = hook
    printer = sys.excepthook

    def excepthook(kind: type[BaseException], value: BaseException, tb: Any) -> None:
        if not _unwinding(value):  # an Interrupted: the command's line says it
            printer(kind, value, tb)

    _HOOKS.add(excepthook.__code__)
    sys.excepthook = excepthook
    for signum in _handled():
        signal.signal(signum, _raise)


_HOOKS: set[Any] = set()  # the code of the hooks install() set: a signal there is sent again


def _send_again(main: int) -> None:
    """The thread that sends a dropped signal again, to the main thread (see the module docstring)."""
    while True:
        signum = _again.get()
        time.sleep(AGAIN_S)
        while not _again.empty():  # several at once: one is enough
            _again.get_nowait()
        if _over:
            return
        signal.pthread_kill(main, signum)


def _raise(signum: int, frame: Any) -> None:
    """The handler :func:`install` sets: record the signal and raise :class:`Interrupted`, unless one is
    already unwinding (being handled, or in the chain of what is), or (sent again later) where
    raising would lose it."""
    global _received
    earlier = _received
    if earlier is None:
        _received = signum
    if _over:
        return
    while frame is not None:
        if frame.f_code in _HOOKS:  # raised in a hook, it would be reported, not raised
            _again.put(signum)
            return
        frame = frame.f_back
    handled = sys.exc_info()[1]
    if _unwinding(handled):
        return
    if handled is not None and earlier is not None:  # e.g. the ImportError an earlier Interrupted became
        _again.put(signum)
        return
    raise Interrupted(signum)


def _unwinding(error: BaseException | None) -> bool:
    """Whether ``error`` is an :class:`Interrupted` or has one in its chain (context or cause)."""
    seen: set[int] = set()
    todo = [error]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        if isinstance(e, Interrupted):
            return True
        seen.add(id(e))
        todo += [e.__context__, e.__cause__]
    return False


def _handled() -> list[int]:
    """The stop signals this process does not ignore."""
    return [signum for signum in SIGNALS if signal.getsignal(signum) is not signal.SIG_IGN]


def _ignore() -> None:
    for signum in SIGNALS:
        signal.signal(signum, signal.SIG_IGN)


def end(line: str, signum: int) -> NoReturn:
    """The interrupted command's end: ignore further stop signals, print ``line`` (its ``{}`` filled
    with :func:`describe` of ``signum``) on stderr and :func:`leave` with exit code 128 + ``signum``."""
    global _over
    _over = True
    for s in _handled():
        signal.signal(s, signal.SIG_IGN)
    _say(line.format(describe(signum)))
    leave(128 + signum)


def raise_from_now() -> None:
    """From now on a stop signal raises :class:`Interrupted` again (:func:`install`'s handlers), after
    :func:`stop_at_once` held the command's start: called where its work begins, its modules
    imported. A no-op in a process where :func:`install` was not called (the command called from Python)."""
    if _main is None or _over:
        return
    for signum in _handled():
        signal.signal(signum, _raise)


def stop_at_once(line: str) -> None:
    """From now on a stop signal prints ``line`` (its ``{}`` filled with :func:`describe` of the signal) on
    stderr and ends the process with :func:`leave`: for the command's start (its imports: nothing done
    yet, and an exception raised inside an extension module's initialisation, such as jaxlib's, can
    leave it half made and crash the process on the next import of it) until :func:`raise_from_now`,
    and for its last moments, its work done and saved."""
    def stop(signum: int, frame: Any) -> None:
        _say(line.format(describe(signum)))
        leave(128 + signum)

    for signum in _handled():
        signal.signal(signum, stop)


def _say(line: str) -> None:
    try:
        print(line, file=sys.stderr)
    except (AttributeError, OSError, ValueError):  # sys.stderr gone or closed this late in shutdown
        pass


def leave(code: int) -> NoReturn:
    """End the process with exit code ``code`` now: flush the standard streams and the logging handlers,
    then ``os._exit``, skipping interpreter shutdown (which can crash after a signal: the module docstring)."""
    try:
        # a signal can land while logging itself is being imported (half made: no shutdown yet)
        shutdown = getattr(sys.modules.get("logging"), "shutdown", None)
        if shutdown is not None:
            shutdown()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (AttributeError, OSError, ValueError):  # no stream, a closed pipe: nothing more to say there
                pass
    finally:  # whatever failed above (a handler's own error), the process ends now, with this code
        os._exit(code)
