"""Provenance for every saved result: device, versions, date, command, git commit."""

from __future__ import annotations

import contextlib
import datetime
import importlib.metadata
import json
import os
import platform
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import jax

from bppsa.host import allocator_tuned, cpu_model

__all__ = ["provenance", "device_label", "save_json", "running_command", "current_command"]


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                             cwd=Path(__file__).resolve().parent)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def device_label() -> str:
    """"cpu" or "gpu" (the folder name under experiments/results/)."""
    return "gpu" if jax.default_backend() == "gpu" else jax.default_backend()


_RUNNING: list[str] = []


@contextlib.contextmanager
def running_command(command: str) -> Iterator[None]:
    """Within the block, :func:`provenance` records ``command`` (the runner's ``bppsa run ...``)."""
    _RUNNING.append(command)
    try:
        yield
    finally:
        _RUNNING.pop()


def current_command() -> str | None:
    """The command of the run in progress (set by :func:`running_command`), or None."""
    return _RUNNING[-1] if _RUNNING else None


def provenance(command: str | None = None) -> dict:
    """A JSON-able record of where and how a result was made.

    ``command``: default the run in progress (:func:`current_command`), else this process's argv.
    """
    devs = jax.devices()
    command = command if command is not None else current_command()
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": command if command is not None else " ".join([Path(sys.argv[0]).name] + sys.argv[1:]),
        "backend": jax.default_backend(),
        "device_kind": devs[0].device_kind if devs else None,
        "device_count": len(devs),
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "jax": jax.__version__,
        "jaxlib": _version("jaxlib"),
        "flax": _version("flax"),
        "optax": _version("optax"),
        "numpy": _version("numpy"),
        "git_commit": _git_commit(),
        "malloc_tuned": allocator_tuned(),
    }


def save_json(path: str | os.PathLike, record: dict) -> Path:
    """Write ``record`` as indented JSON (creating parent folders); return the path. The one result
    writer of the harness (the runner's tasks, ``bppsa bench``, the GPU script): the file is written
    beside its place and moved there, so a reader never sees half a record."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        tmp.write_text(json.dumps(record, indent=2, default=float) + "\n")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path
