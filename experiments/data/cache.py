"""An ``.npz`` cache of arrays derived from a folder of files (the IRMAS features, :mod:`experiments.data.irmas`).

A cache file is keyed by :func:`cache_key` (what it was computed from: file names, sizes and
mtimes, plus the caller's settings) and holds that key. :func:`load_cache` returns its arrays, or
None when it is missing or holds another key; a file that cannot be read (truncated, corrupted,
not an ``.npz``) is set aside as ``<name>.corrupt`` (never deleted) with a warning, so the caller
recomputes it. :func:`check_cache_dir` refuses a cache folder that is a file (or cannot be made)
with one line, before any work; :func:`save_cache` writes atomically (a temporary file, then a rename). ::

    key = cache_key(("train", "m"), root, [(path, label), ...])
    arrays = load_cache(path, key)      # {"key": ..., "x": ...} or None: compute, then
    save_cache(path, key=np.array(key), x=x)
"""

from __future__ import annotations

import hashlib
import os
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from bppsa.errors import UsageError

__all__ = ["CACHE_VERSION", "cache_key", "blocking_file", "check_cache_dir", "load_cache", "save_cache",
           "set_aside"]

CACHE_VERSION = 1


def cache_key(parts: tuple, root: Path, files: Iterable[tuple[Path, Any]]) -> str:
    """SHA-256 (hex) of ``parts`` and, for each (path, label), its path relative to ``root``, the
    label, its size and mtime: a changed, added or removed file changes the key."""
    h = hashlib.sha256()
    h.update(repr((CACHE_VERSION, *parts)).encode())
    for p, label in files:
        st = p.stat()
        h.update(repr((str(p.relative_to(root)), label, st.st_size, st.st_mtime_ns)).encode())
    return h.hexdigest()


def blocking_file(path: str | os.PathLike) -> Path | None:
    """The first of ``path`` and its parents that exists but is not a folder (so no folder can be
    made there), or None. Creates nothing: a config check can call it before anything is written."""
    path = Path(path)
    for p in (path, *path.parents):
        if p.exists() or p.is_symlink():
            return None if p.is_dir() else p
    return None


def check_cache_dir(cache_dir: str | os.PathLike, what: str = "cache_dir") -> Path:
    """The cache folder, created if missing; UsageError (one line, naming ``what``) when it or a
    parent is a file, or it cannot be made."""
    path = Path(cache_dir)
    blocker = blocking_file(path)
    if blocker is not None:
        where = "is a file" if blocker == path else f"is inside {str(blocker)!r}, which is a file"
        raise UsageError(f"{what} {str(path)!r} {where}; expected a folder for the feature cache")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"{what} {str(path)!r} cannot be created ({e.strerror or e}); expected a folder "
                         "for the feature cache") from None
    return path


def set_aside(path: Path, why: str) -> Path | None:
    """Rename ``path`` to ``<name>.corrupt`` (``.corrupt1``, … if taken) and warn; None if it cannot be moved."""
    names = (path.name + (".corrupt" if k == 0 else f".corrupt{k}") for k in range(1000))
    dest = next((d for d in map(path.with_name, names) if not d.exists()), path.with_name(path.name + ".corrupt"))
    try:
        os.replace(path, dest)
    except OSError as e:
        warnings.warn(f"cache file {str(path)!r} cannot be read ({why}) nor moved aside ({e.strerror or e}); "
                      "recomputing it", RuntimeWarning, stacklevel=3)
        return None
    warnings.warn(f"cache file {str(path)!r} cannot be read ({why}); moved it to {dest.name!r} and recomputing",
                  RuntimeWarning, stacklevel=3)
    return dest


def load_cache(path: Path, key: str) -> dict[str, np.ndarray] | None:
    """The arrays in ``path`` if it holds ``key``; None when it is missing or holds another key, or
    when it cannot be read: then it is moved aside by :func:`set_aside` (a warning names it)."""
    if not path.exists():
        return None
    try:
        with np.load(path, allow_pickle=False) as z:
            if str(z["key"]) != key:
                return None  # stale: recomputed and overwritten
            return {k: z[k] for k in z.files}
    except Exception as e:  # noqa: BLE001 -- truncated zip, bad CRC, not an npz, a missing array: all unreadable
        why = " ".join(f"{type(e).__name__}: {e}".split())[:200]
        set_aside(path, why)
        return None


def save_cache(path: Path, **arrays) -> None:
    """Write ``arrays`` to ``path`` (.npz) atomically: a temporary file in the same folder, then a rename."""
    check_cache_dir(path.parent)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}.npz")
    np.savez(tmp, **arrays)
    os.replace(tmp, path)
