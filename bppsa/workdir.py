"""The work directory of ``bppsa run``: what bppsa owns there, its lock, and the names it writes.

The rule: **bppsa deletes or overwrites only files that this run (or the run it resumes) created,
inside its work directory, and never two runs at once in one directory.**

- **Ownership.** The marker ``.bppsa-run.json`` lists the entries of the work directory that
  bppsa created (a folder it created, e.g. ``bptt/``, is its own with everything in it). An
  entry is listed *before* it is created: while a run is active, a Python audit hook
  (:func:`sys.addaudithook`) sees every file or folder the process creates, renames, copies or
  deletes under the work directory; a new entry is added to the marker first, and writing to or
  deleting an existing entry the marker does not list raises :class:`bppsa.errors.UsageError`
  before it happens. A run killed with SIGKILL has therefore listed all it created, and what
  appears later (your notes) is never counted as bppsa's. ``--restart`` deletes the listed
  entries only.
- **Folders bppsa did not mark.** A folder without the marker that holds anything is not a bppsa
  work directory and is never modified: the run is refused with one line.
- **Lock.** ``.bppsa-lock`` is held (``flock``) while a run is active and names its pid and host;
  a second run on the same folder is refused naming them. A lock left by a process that died
  (kill -9) is taken over, with one line saying so. The file is removed when the run ends.
- **Names.** :func:`check_name` admits a plain file-name component only (``config.name``).
"""

from __future__ import annotations

import datetime
import fcntl
import json
import os
import shutil
import socket
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from .errors import UsageError

__all__ = ["MARKER", "LOCK", "check_name", "read_marker", "WorkDir"]

MARKER = ".bppsa-run.json"   # what bppsa created in a work directory
LOCK = ".bppsa-lock"         # held while a run is active: {"pid", "host", "since"}
_BOOKKEEPING = (MARKER, MARKER + ".tmp", LOCK)
_RESERVED = ("config", "summary")  # config.json and summary.json are the runner's own


def check_name(name: Any, key: str = "config.name") -> str:
    """``name`` if it is a plain file-name component bppsa may write ``<name>.json/.md/.png`` as; else UsageError."""
    shown = repr(name) if len(repr(name)) <= 80 else f"{repr(name)[:60]}... ({len(name)} characters)"
    if not isinstance(name, str):
        raise UsageError(f"{key} must be a string (a file name); got {shown}")
    bad = ("empty" if not name else "'/' or '\\' in it" if "/" in name or "\\" in name
           else "a leading '.'" if name.startswith(".") else "a control character" if not name.isprintable()
           else f"more than 200 bytes ({len(name.encode())})" if len(name.encode()) > 200
           else f"the runner's own {name}.json" if name in _RESERVED else None)
    if bad:
        raise UsageError(f"{key} must be a plain file name (bppsa writes <name>.json, .md and .png into the work "
                         f"directory): no '/', no leading '.', at most 200 bytes; got {shown}: {bad}")
    return name


def read_marker(workdir: str | os.PathLike) -> dict | None:
    """The marker of a bppsa work directory ({"status", "written", "progress"}), or None without one."""
    path = Path(workdir) / MARKER
    if not path.is_file():
        return None
    try:
        marker = json.loads(path.read_text())
        marker["written"] = sorted(set(marker["written"]))
    except (OSError, ValueError, KeyError, TypeError):
        raise UsageError(f"{str(path)!r} is not a bppsa work-directory marker (unreadable); "
                         f"move it away or pass another --workdir") from None
    for name in marker["written"]:
        if not isinstance(name, str) or name in ("", ".", "..") or Path(name).name != name:
            raise UsageError(f"{str(path)!r} lists {name!r}, not an entry name; not touching anything")
    return marker


def _entries(workdir: Path) -> list[str]:
    return sorted(p.name for p in workdir.iterdir() if p.name not in _BOOKKEEPING)


class WorkDir:
    """One run's hold on its work directory: ``with WorkDir(path) as wd:`` checks and locks it.

    ``wd.marker`` is the marker (None in a new or empty folder, until :meth:`start`). Inside
    :meth:`recording`, whatever the process writes under the folder is listed before it is written.
    """

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.marker: dict | None = None
        self._fd: int | None = None
        self._mutex = threading.Lock()

    # -- opening: the checks, the lock ------------------------------------------------------
    def __enter__(self) -> WorkDir:
        where = str(self.path)
        if self.path.exists() and not self.path.is_dir():
            raise UsageError(f"--workdir {where!r} is a file, not a folder; pass a new folder or one bppsa made")
        self._refuse_unmarked()
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise UsageError(f"cannot create the work directory {where!r}: {e.strerror}; "
                             f"pass another --workdir") from None
        self._lock()
        try:
            self._refuse_unmarked()  # again under the lock: another run may have started meanwhile
        except UsageError:
            self._unlock()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self._unlock()

    def _refuse_unmarked(self) -> None:
        self.marker = read_marker(self.path) if self.path.is_dir() else None
        try:
            entries = _entries(self.path) if self.marker is None and self.path.is_dir() else []
        except OSError as e:
            raise UsageError(f"cannot read the work directory {str(self.path)!r} ({e.strerror}); "
                             f"pass another --workdir") from None
        if entries:
            shown = ", ".join(entries[:3]) + (f" and {len(entries) - 3} more" if len(entries) > 3 else "")
            raise UsageError(f"{str(self.path)!r} is not a bppsa work directory (no {MARKER}) and holds files bppsa "
                             f"did not create ({shown}); bppsa never modifies such a folder: pass a new or empty "
                             f"--workdir (or move the files away)")

    def _lock(self) -> None:
        where, path = str(self.path), self.path / LOCK
        while True:
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as e:
                raise UsageError(f"the work directory {where!r} is not writable ({e.strerror}); "
                                 f"pass another --workdir") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _holder(fd)
                os.close(fd)
                raise UsageError(f"the work directory {where!r} is in use by another bppsa run ({holder}); wait "
                                 f"for it to end or pass another --workdir") from None
            try:
                same = os.fstat(fd).st_ino == os.stat(path).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)  # the holder removed the file as we opened it: take the new one
        previous = _holder(fd)
        if previous:  # the last holder ended without removing the file: it was killed
            print(f"bppsa run: took over the lock of {where!r} from {previous}, which is no longer running",
                  file=sys.stderr)
        mine = json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                           "since": datetime.datetime.now().isoformat(timespec="seconds")})
        os.ftruncate(fd, 0)
        os.pwrite(fd, mine.encode(), 0)
        self._fd = fd

    def _unlock(self) -> None:
        if self._fd is not None:
            (self.path / LOCK).unlink(missing_ok=True)  # still holding it: see the inode check in _lock
            os.close(self._fd)
            self._fd = None

    # -- the marker ---------------------------------------------------------------------------
    def write_marker(self) -> None:
        assert self.marker is not None
        tmp = self.path / (MARKER + ".tmp")
        with _quiet():
            tmp.write_text(json.dumps(self.marker, indent=1) + "\n")
            os.replace(tmp, self.path / MARKER)

    def start(self, progress: bool) -> None:
        """A run begins: the marker says "running" (a killed run keeps it so)."""
        self.marker = {"bppsa": "work directory", "status": "running", "progress": progress,
                       "written": (self.marker or {}).get("written", [])}
        self.write_marker()

    def finish(self, status: str) -> None:
        """A run ends with ``status`` ("done", "failed", "refused": its task refused the input)."""
        assert self.marker is not None
        made = set(self.marker["written"]) - {"config.json"}
        self.marker.update(status=status, progress=self.marker["progress"] or (status != "refused" and bool(made)))
        self.write_marker()

    def never_started(self) -> bool:
        """No run here made progress: each one's task refused its input (UsageError) or wrote nothing."""
        m = self.marker
        return m is not None and m.get("status") != "running" and not m.get("progress", True)

    def remove_written(self) -> list[str]:
        """Delete the entries the marker lists as bppsa's; everything else stays. Returns the names removed."""
        removed = []
        for name in (self.marker or {}).get("written", []):
            target = self.path / name
            with _quiet():
                if target.is_dir() and not target.is_symlink():
                    shutil.rmtree(target)
                elif target.exists() or target.is_symlink():
                    target.unlink()
                else:
                    continue
            removed.append(name)
        if self.marker is not None:
            self.marker.update(written=[], progress=False, status="restarted")
            self.write_marker()
        return removed

    # -- recording what the process writes --------------------------------------------------
    @contextmanager
    def recording(self) -> Iterator[None]:
        """While active, every entry the process creates under the folder is listed first (see the module doc)."""
        assert self.marker is not None, "start() first"
        _install_hook()
        roots = {os.path.abspath(self.path), os.path.realpath(self.path)}
        check = lambda path, create: self._check(roots, path, create)
        _ACTIVE.append(check)
        try:
            yield
        finally:
            _ACTIVE.remove(check)

    def _check(self, roots: set[str], path: str, create: bool) -> None:
        for root in roots:
            if path.startswith(root + os.sep):
                top = path[len(root) + 1:].split(os.sep, 1)[0]
                break
        else:
            return
        assert self.marker is not None
        with self._mutex:
            if top in self.marker["written"] or top == "":
                return
            exists = os.path.lexists(os.path.join(next(iter(roots)), top))
            if create and not exists and top not in _BOOKKEEPING:
                self.marker["written"] = sorted({*self.marker["written"], top})
                self.write_marker()  # listed before it is created
                return
        if exists or top in _BOOKKEEPING:
            raise UsageError(f"the run tried to {'write' if create else 'delete'} {top!r} in the work directory "
                             f"{str(self.path)!r}, which bppsa did not create; it is left as it is: move it away or "
                             f"pass another --workdir")


def _holder(fd: int) -> str:
    """"pid N on HOST since T" from a lock file's text ("" when empty)."""
    text = os.pread(fd, 4096, 0).decode(errors="replace").strip()
    if not text:
        return ""
    try:
        h = json.loads(text)
        return f"pid {h['pid']} on {h['host']} since {h['since']}"
    except (ValueError, KeyError, TypeError):
        return f"lock file text {text[:80]!r}"


# The audit hook: one per process, installed on the first recording run; it does nothing while
# no run records. Each active run's check is called with (absolute path, creates?) per path.
_ACTIVE: list[Callable[[str, bool], None]] = []
_LOCAL = threading.local()
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
# event -> ((argument index of a path, creates?), ...); dir_fd-relative calls are skipped (rmtree's
# per-file removals: the rmtree itself was checked)
_EVENTS = {"os.mkdir": ((0, True),), "os.rename": ((0, False), (1, True)), "os.remove": ((0, False),),
           "os.rmdir": ((0, False),), "shutil.rmtree": ((0, False),), "os.symlink": ((1, True),),
           "os.link": ((1, True),), "shutil.copyfile": ((1, True),), "shutil.move": ((0, False), (1, True)),
           "os.truncate": ((0, True),)}
_DIR_FD = {"os.mkdir": 2, "os.rename": 2, "os.remove": 1, "os.rmdir": 1, "shutil.rmtree": 1, "os.symlink": 2,
           "os.link": 2}
_hooked = False


@contextmanager
def _quiet() -> Iterator[None]:
    """bppsa's own bookkeeping (the marker, --restart): not checked by the hook."""
    previous = getattr(_LOCAL, "quiet", False)
    _LOCAL.quiet = True
    try:
        yield
    finally:
        _LOCAL.quiet = previous


def _hook(event: str, args: tuple) -> None:
    if not _ACTIVE or getattr(_LOCAL, "quiet", False):
        return
    if event == "open":
        if not (isinstance(args[2], int) and args[2] & _WRITE_FLAGS):
            return
        targets = ((0, True),)
    elif event in _EVENTS:
        dir_fd = args[_DIR_FD[event]] if event in _DIR_FD else None
        if dir_fd not in (None, -1):
            return
        targets = _EVENTS[event]
    else:
        return
    for index, create in targets:
        path = args[index]
        if isinstance(path, (str, bytes, os.PathLike)):
            path = os.path.abspath(os.fsdecode(path))
            for check in list(_ACTIVE):
                check(path, create)


def _install_hook() -> None:
    global _hooked
    if not _hooked:
        sys.addaudithook(_hook)
        _hooked = True
