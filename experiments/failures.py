"""How a run's failures are told: a write that failed for lack of room (:func:`write_error`), the
parts of a task that failed (:func:`failed_parts`), a config key the task read but the config lacks
(:func:`missing_key`), and the error reports of the library's background threads, held back while a
task runs (:func:`quiet_background`) so that a full disk is one line, not orbax's hundreds."""

from __future__ import annotations

import contextlib
import errno
import os
import re
import sys
from collections.abc import Iterator
from typing import Any

import ml_collections

__all__ = ["write_error", "failed_parts", "missing_key", "Background", "quiet_background"]


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit - 3] + "..."


_WRITE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EIO}
_TENSORSTORE = re.compile(r'(?:local file|Failed writing:) "([^"]+)".*?(No space left on device|File too large|'
                          r'Disk quota exceeded|Read-only file system)', re.S)


def write_error(error: BaseException, where: str | os.PathLike | None = None) -> str | None:
    """"cannot write PATH: REASON" when ``error`` (or what caused it) is an OS error of writing: disk full,
    quota, file too large, read-only; also as orbax/tensorstore word it. None for anything else. ``where``
    names the place when the error does not (e.g. the work directory)."""
    seen, todo = set(), [error]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in _WRITE_ERRNOS:
            place = (repr(str(e.filename)) if e.filename else f"in {str(where)!r}" if where is not None
                     else "a file")
            return f"cannot write {place}: {e.strerror or os.strerror(e.errno or 0)}"
        found = _TENSORSTORE.search(str(e)) if isinstance(e, (ValueError, RuntimeError)) else None
        if found:
            return f"cannot write {found.group(1)!r}: {found.group(2)}"
        todo += [e.__cause__, e.__context__]
    return None


def failed_parts(summary: dict) -> list[str]:
    """The task's ``"failed_parts"`` ([{"part", "error"}] or strings) as one-line texts."""
    parts = summary.get("failed_parts") or []
    out = []
    for p in parts if isinstance(parts, list) else [parts]:
        text = f"{p.get('part', '?')}: {p.get('error', '?')}" if isinstance(p, dict) else str(p)
        out.append(_cut(" ".join(text.split()), 300))
    return out


def missing_key(error: BaseException, config: ml_collections.ConfigDict) -> str | None:
    """A one-line message when ``error`` is a ConfigDict's "no such key" raised to the task (else None)."""
    tb = error.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if tb is None or "ml_collections" not in tb.tb_frame.f_code.co_filename:
        return None
    text = str(error.args[0]) if error.args else str(error)
    found = re.search(r"'([^']+)'", text)
    key = found.group(1) if found else text
    return (f"the task {config.task!r} reads config key {key!r}, which this config does not have; add it to the "
            f"config file (see the task's docstring for its keys)")


class Background:
    """What the library's background threads (orbax's savers) reported while a task ran."""

    def __init__(self) -> None:
        self.records: list[Any] = []  # absl log records and threading.excepthook arguments, in order
        self.replaced = False  # a one-line message replaces them

    def hint(self) -> str:
        n = sum(not isinstance(r, str) for r in self.records) + sum(
            r.startswith("Traceback") for r in self.records if isinstance(r, str))
        return f" ({n} error report{'s' if n != 1 else ''} of background threads held back; --debug shows them)" \
            if n else ""


@contextlib.contextmanager
def quiet_background(background: Background) -> Iterator[Background]:
    """Hold back the error reports of background threads (absl log records, thread exceptions) while a task
    runs; they are shown, in order, when the task ends, unless it ended in a write error (disk full), whose
    one line replaces them. ``bppsa --debug`` leaves them alone."""
    import logging
    import threading
    if os.environ.get("BPPSA_DEBUG"):  # bppsa --debug
        yield background
        return
    absl = logging.getLogger("absl")

    class Hold(logging.Filter):
        def filter(self, record: logging.LogRecord) -> bool:
            if record.levelno >= logging.ERROR and record.threadName != "MainThread":
                background.records.append(record)
                return False
            return True

    hold, old_hook, old_stderr = Hold(), threading.excepthook, sys.stderr
    absl.addFilter(hold)
    threading.excepthook = background.records.append
    sys.stderr = _HeldStderr(old_stderr, background.records)  # what native threads print (PyErr_Print)
    try:
        yield background
    finally:
        absl.removeFilter(hold)
        threading.excepthook = old_hook
        sys.stderr = old_stderr
        if not background.replaced:
            for item in background.records:
                if isinstance(item, logging.LogRecord):
                    absl.handle(item)
                elif isinstance(item, str):
                    old_stderr.write(item)
                else:
                    old_hook(item)


class _HeldStderr:
    """sys.stderr while a task runs: what other threads write, and tracebacks printed outside Python's
    own exception handling (a native library's callback, on any thread), are appended to ``held``;
    the rest (progress bars, warnings) goes through."""

    def __init__(self, stream: Any, held: list[Any]) -> None:
        import threading
        self._stream, self._held, self._main = stream, held, threading.main_thread()
        self._in_traceback = False

    def write(self, text: str) -> int:
        import threading
        if threading.current_thread() is not self._main:
            self._held.append(text)
            return len(text)
        if text.startswith("Traceback (most recent call last)"):
            self._in_traceback = True
        if not self._in_traceback:
            return self._stream.write(text)
        self._held.append(text)
        last = text.rstrip("\n").rsplit("\n", 1)[-1]
        if _EXCEPTION_LINE.match(last):  # the traceback's last line: "SomeError: message"
            self._in_traceback = False
        return len(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


_EXCEPTION_LINE = re.compile(r"[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt|Warning)\b")
