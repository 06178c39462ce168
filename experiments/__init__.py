"""The experiment harness: the runner, work directories, results, provenance and the ``bppsa``
command, and one folder per paper (``paper_bppsa``, ``paper_hetero``, ``paper_sync``,
``extensions``) holding the task functions of its results and, in ``configs/``, their configs.

A config in ``experiments/<paper>/configs/NAME.py`` sets ``task = "experiments.<paper>.<module>:<function>"``;
``bppsa run experiments/<paper>/configs/NAME.py`` (or ``bppsa reproduce NAME``) calls it as
``function(config, workdir) -> summary``. The library (``bppsa``) never imports this package.

A task obtains each top-level path it creates in ``workdir`` from :func:`entry` (files, and
folders it then fills: a training run's checkpoints, a feature cache, a child process's output),
so that bppsa lists it as its own before it exists (:mod:`experiments.workdir`); it reads through
``Path(workdir)``. A task called directly with a folder of yours (a test's ``tmp_path``) writes there.

A run tells the truth about failure: a task whose part fails (a replica, a subprocess, a launch
timeout) calls :func:`part_failed`, which fails the run (:class:`RunFailed`: one line, exit status
1, the work directory marked failed) unless the config sets ``keep_partial = True``; then the task
carries on and returns the failures as its summary's ``"failed_parts"``, and the runner marks the
run and its summary partial and never publishes it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

__all__ = ["entry", "RunFailed", "part_failed"]


class RunFailed(RuntimeError):
    """A run failed for a reason that is not a bug (a part of the task failed, the work directory
    vanished, the disk is full): the ``bppsa`` command prints the message as one line and exits 1.
    ``abandon_threads``: a write failed, and so did the library's background writers; the command
    ends at once rather than let them print their tracebacks as they wind down."""

    def __init__(self, message: str, *, abandon_threads: bool = False) -> None:
        super().__init__(message)
        self.abandon_threads = abandon_threads


def part_failed(config: Any, part: str, error: BaseException | str, failed_parts: list[dict]) -> None:
    """A part of a task failed (a replica, a subprocess, a launch timeout): raise :class:`RunFailed`,
    or, when the config sets ``keep_partial = True``, append ``{"part", "error"}`` to ``failed_parts``
    (which the task returns as its summary's ``"failed_parts"``)."""
    text = " ".join(str(error).split())
    text = text if len(text) <= 2000 else text[:1000] + " ... " + text[-990:]
    if not config.get("keep_partial", False):
        hint = " (set --config.keep_partial=True to keep the other results)" if "keep_partial" in config else ""
        raise RunFailed(f"{part} failed: {text}; the run is marked failed{hint}") from (
            error if isinstance(error, BaseException) else None)
    failed_parts.append({"part": part, "error": text})


def entry(workdir: str | os.PathLike, name: str) -> Path:
    """``workdir/name``, for the task to create: through the run's writer (``workdir.entry(name)``)
    when ``workdir`` is what ``bppsa run`` hands a task (:class:`experiments.workdir.RunDir`), which lists
    ``name`` in the work directory's marker first and refuses an entry bppsa did not create; a
    plain folder is the caller's own, where nothing is recorded."""
    writer = getattr(workdir, "entry", None)
    if callable(writer):
        path = writer(name)
        assert isinstance(path, Path)
        return path
    return Path(workdir) / name
