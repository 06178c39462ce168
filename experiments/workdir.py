"""The work directory of ``bppsa run``: what bppsa owns there, its lock, and the names it writes.

The rule: **bppsa deletes or overwrites only files that this run (or the run it resumes) created,
inside its work directory, and never two runs at once in one directory.**

- **Ownership, by construction.** The marker ``.bppsa-run.json`` lists the entries of the work
  directory that bppsa created (a folder it created, e.g. ``bptt/``, is its own with everything in
  it). bppsa records them through its own writer, never by watching the process's file calls: the
  runner writes ``config.json`` and ``summary.json`` through :meth:`WorkDir.entry` and hands the
  task a :class:`RunDir`, whose :meth:`RunDir.entry` ``(name) -> Path`` is how a task obtains each
  top-level path it creates. ``entry`` checks the name (:func:`check_entry`), refuses an existing
  entry the marker does not list with a one-line :class:`bppsa.errors.UsageError` (it is left as
  it is), and adds a new name to the marker on disk *before* it returns the path: a run killed
  with SIGKILL right after has it listed. What is written inside a listed folder (by a child
  process, or by orbax and tensorstore) is covered by that folder. Nothing watches a task that
  writes past the writer; an entry that appears during a run without it (yours, or such a task's)
  is never counted as bppsa's: the run names it in one line on stderr, the writer never hands it
  out, and ``--restart`` keeps it. ``--restart`` deletes the listed entries only.
- **Folders bppsa did not mark.** A folder without the marker that holds anything is not a bppsa
  work directory and is never modified: the run is refused with one line.
- **Lock.** ``.bppsa-lock`` is held (``flock``) while a run is active and names its pid and host;
  a second run on the same folder is refused naming them. A lock left by a process that died
  (kill -9) is taken over, with one line saying so. The file is removed when the run ends.
- **The run's end tells the truth.** :meth:`WorkDir.finish` checks that the work directory is
  still the folder the run started in (it was not removed or replaced under the run: what was
  written through open files would be lost) and that the entries an earlier run left are still
  there; otherwise the run fails (:class:`experiments.RunFailed`) and the marker says why (``"damaged"``). The
  marker records the entries present when a run ended (``"present"``); the next run refuses, in
  one line, a work directory where one of them is gone or that a damaged run left, until
  ``--restart``. A marker that cannot be written (disk full) never hides the run's own error.
- **Names.** :func:`check_name` admits a plain file-name component only (``config.name``);
  :func:`check_entry` the same for each entry a run creates.
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
from pathlib import Path
from typing import Any

from bppsa.errors import UsageError

__all__ = ["MARKER", "LOCK", "check_name", "check_entry", "read_marker", "WorkDir", "RunDir"]

MARKER = ".bppsa-run.json"   # what bppsa created in a work directory
LOCK = ".bppsa-lock"         # held while a run is active: {"pid", "host", "since"}
_BOOKKEEPING = (MARKER, MARKER + ".tmp", LOCK)
_RESERVED = ("config", "summary")  # config.json and summary.json are the runner's own
_RUNNERS = tuple(f"{n}.json" for n in _RESERVED)


def _identity(path: Path) -> tuple[int, int] | None:
    """(device, inode) of ``path``, or None when it is gone."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _shown(name: Any) -> str:
    size = len(name) if isinstance(name, str) else len(repr(name))
    return repr(name) if len(repr(name)) <= 80 else f"{repr(name)[:60]}... ({size} characters)"


def _problem(name: str, limit: int) -> str | None:
    """What makes ``name`` no plain file-name component (None: nothing)."""
    return ("empty" if not name else "'/' or '\\' in it" if "/" in name or "\\" in name
            else "a leading '.'" if name.startswith(".") else "a control character" if not name.isprintable()
            else f"more than {limit} bytes ({len(name.encode())})" if len(name.encode()) > limit else None)


def check_name(name: Any, key: str = "config.name") -> str:
    """``name`` if it is a plain file-name component bppsa may write ``<name>.json/.md/.png`` as; else UsageError."""
    if not isinstance(name, str):
        raise UsageError(f"{key} must be a string (a file name); got {_shown(name)}")
    bad = _problem(name, 200) or (f"the runner's own {name}.json" if name in _RESERVED else None)
    if bad:
        raise UsageError(f"{key} must be a plain file name (bppsa writes <name>.json, .md and .png into the work "
                         f"directory): no '/', no leading '.', at most 200 bytes; got {_shown(name)}: {bad}")
    return name


def check_entry(name: Any) -> str:
    """``name`` if it is a plain file-name component a run may create in its work directory; else UsageError."""
    bad = "not a string" if not isinstance(name, str) else _problem(name, 255)
    if bad:
        raise UsageError(f"a run creates entries of its work directory by plain names (no '/', no leading '.', "
                         f"at most 255 bytes); got {_shown(name)}: {bad}")
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

    ``wd.marker`` is the marker (None in a new or empty folder, until :meth:`start`). Between
    :meth:`start` and :meth:`finish`, :meth:`entry` hands out (and lists first) each entry the run
    creates; :meth:`run_dir` is the task's view of it.
    """

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.marker: dict | None = None
        self._fd: int | None = None
        self._mutex = threading.Lock()
        self._active = False
        self._before: set[str] = set()  # the entries there when the run started
        self._identity: tuple[int, int] | None = None  # the folder the run started in
        self.damaged: str | None = None  # why the work directory failed the run (see finish)

    # -- opening: the checks, the lock ------------------------------------------------------
    def __enter__(self) -> WorkDir:
        where = str(self.path)
        if self.path.is_symlink() and not self.path.exists():
            raise UsageError(f"--workdir {where!r} is a symbolic link to {os.readlink(self.path)!r}, which does not "
                             f"exist; create that folder, or pass another --workdir")
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
        tmp.write_text(json.dumps(self.marker, indent=1) + "\n")
        os.replace(tmp, self.path / MARKER)  # atomic: a kill leaves the old marker or the new one

    def start(self, progress: bool) -> None:
        """A run begins: the marker says "running" (a killed run keeps it so)."""
        old = self.marker or {}
        self.marker = {"bppsa": "work directory", "status": "running", "progress": progress,
                       "written": old.get("written", []), "present": old.get("present", [])}
        self.write_marker()
        self._before, self._active = set(_entries(self.path)), True
        self._identity = _identity(self.path)

    def finish(self, status: str) -> str | None:
        """A run ends with ``status`` ("done", "partial", "failed", "refused": its task refused the input).

        Returns what went wrong with the work directory itself (None: nothing): it was removed or
        replaced during the run, or entries that were there when the run started are gone, or the
        marker could not be written. The marker then says "failed" (when it can be written).
        """
        assert self.marker is not None
        with self._mutex:
            self._active = False
        where = str(self.path)
        damaged = None
        if _identity(self.path) != self._identity or not self._holds_lock():
            damaged = (f"the work directory {where!r} was removed or replaced while the run was writing to it "
                       f"(what the run wrote there, e.g. through open files, is lost)")
        else:
            gone = sorted(n for n in self._before & set(self.marker["written"]) if not os.path.lexists(self.path / n))
            if gone:
                damaged = (f"{', '.join(map(repr, gone))} of the work directory {where!r}, written by bppsa, were "
                           f"removed while the run was going")
        listed = set(self.marker["written"])
        present = sorted(n for n in listed if os.path.lexists(self.path / n))
        made = set(present) - {"config.json"}
        self.damaged = damaged
        if damaged:
            status = "failed"
        self.marker.update(status=status, present=present,
                           progress=self.marker["progress"] or (status != "refused" and bool(made)))
        if damaged:
            self.marker["damaged"] = damaged
        else:
            self.marker.pop("damaged", None)
        try:
            if self.path.is_dir():  # a vanished folder that the run recreated in part: its marker says so
                self.write_marker()
        except OSError as e:
            try:
                (self.path / (MARKER + ".tmp")).unlink(missing_ok=True)  # a half-written one (disk full)
            except OSError:
                pass
            problem = (f"could not record the end of the run in {str(self.path / MARKER)!r} ({e.strerror}); its "
                       f"marker still says the run is going, so the same command resumes it")
            return f"{damaged}; {problem}" if damaged else problem
        try:
            stray = sorted(set(_entries(self.path)) - self._before - listed)
        except OSError:
            stray = []
        if stray:  # created during the run, not through entry(): not bppsa's (never deleted or overwritten)
            print(f"bppsa run: {', '.join(map(repr, stray))} appeared in {where!r} during the run without "
                  f"bppsa's writer; they are not counted as bppsa's (--restart keeps them)", file=sys.stderr)
        return damaged

    def _holds_lock(self) -> bool:
        """The lock file this run holds is still the one in the folder."""
        if self._fd is None:
            return True
        try:
            return os.fstat(self._fd).st_ino == os.stat(self.path / LOCK).st_ino
        except OSError:
            return False

    def check_intact(self) -> None:
        """Before a resume: refuse (one line) a work directory that a damaged run left, or where entries that
        were there when the last run ended are gone (removed after bppsa wrote them)."""
        m, where = self.marker or {}, str(self.path)
        if m.get("damaged"):
            raise UsageError(f"the last run in {where!r} failed: {m['damaged']}; what it left there is incomplete: "
                             f"pass --restart to delete what bppsa wrote and start over, or pass another --workdir")
        gone = sorted(n for n in m.get("present", []) if n in m.get("written", [])
                      and not os.path.lexists(self.path / n))
        if gone:
            raise UsageError(f"{', '.join(map(repr, gone))} of the work directory {where!r}, written by bppsa, "
                             f"{'is' if len(gone) == 1 else 'are'} gone since the last run ended; it cannot be "
                             f"resumed: pass --restart to delete what bppsa wrote and start over, or pass another "
                             f"--workdir")

    def never_started(self) -> bool:
        """No run here made progress: each one's task refused its input (UsageError) or wrote nothing."""
        m = self.marker
        return m is not None and m.get("status") != "running" and not m.get("progress", True)

    def remove_written(self) -> list[str]:
        """Delete the entries the marker lists as bppsa's; everything else stays. Returns the names removed."""
        removed = []
        for name in (self.marker or {}).get("written", []):
            target = self.path / name
            if target.is_dir() and not target.is_symlink():
                shutil.rmtree(target)
            elif target.exists() or target.is_symlink():
                target.unlink()
            else:
                continue
            removed.append(name)
        if self.marker is not None:
            self.marker.update(written=[], present=[], progress=False, status="restarted")
            self.marker.pop("damaged", None)
            self.write_marker()
        return removed

    # -- the writer: each entry the run creates, listed before it exists ----------------------
    def entry(self, name: str) -> Path:
        """The path of the entry ``name`` of the work directory, for this run to create or overwrite.

        A name the marker lists (this run's, or the run it resumes) is returned as it is; a new name
        is added to the marker on disk first. An existing entry the marker does not list (yours),
        bppsa's bookkeeping, or a name that is not a plain file-name component raises UsageError.
        """
        check_entry(name)
        with self._mutex:
            if not self._active or self.marker is None:
                raise RuntimeError(f"no run is active in {str(self.path)!r}: entry({name!r}) is for a run's task")
            if name in self.marker["written"]:
                return self.path / name
            if os.path.lexists(self.path / name):
                raise UsageError(f"the run tried to write {name!r} in the work directory {str(self.path)!r}, which "
                                 f"bppsa did not create; it is left as it is: move it away or pass another --workdir")
            self.marker["written"] = sorted({*self.marker["written"], name})
            self.write_marker()  # listed before it is created
            return self.path / name

    def run_dir(self) -> RunDir:
        """The task's view of this work directory (see :class:`RunDir`)."""
        return RunDir(self)


class RunDir(os.PathLike[str]):
    """The work directory as ``bppsa run`` hands it to a task: ``function(config, workdir: RunDir)``.

    It reads as a path (``workdir / "x"``, ``os.fspath``, ``str``, ``Path(workdir)``: plain paths,
    for reading), and :meth:`entry` is the writer: ``workdir.entry("x.json")`` is the path of a
    top-level entry the task creates, listed as bppsa's before it is returned (see the module doc).
    ``experiments.entry(workdir, name)`` does the same and also takes a plain folder.
    """

    def __init__(self, workdir: WorkDir):
        self._workdir = workdir
        self.path = workdir.path

    def entry(self, name: str) -> Path:
        """``workdir/name`` for the task to create (a file, or a folder that is then its own with what is in it)."""
        if name in _RUNNERS:
            raise UsageError(f"the task tried to write {name!r} in the work directory {str(self.path)!r}: that is "
                             f"the runner's own file; name the task's output otherwise")
        return self._workdir.entry(name)

    def __fspath__(self) -> str:
        return os.fspath(self.path)

    def __truediv__(self, other: str | os.PathLike[str]) -> Path:
        return self.path / other

    def __str__(self) -> str:
        return str(self.path)

    def __repr__(self) -> str:
        return f"RunDir({str(self.path)!r})"


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
