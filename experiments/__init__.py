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
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["entry"]


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
