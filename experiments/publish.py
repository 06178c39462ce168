"""``bppsa run --publish``: a complete result copied into ``experiments/results/<device>/``, all of its
files or none, and the files of the earlier result that it no longer makes removed."""

from __future__ import annotations

import os
import re
import shutil
import sys
from pathlib import Path

from experiments import RunFailed
from experiments.failures import write_error
from experiments.workdir import WorkDir

__all__ = ["publish_result"]


def publish_result(wd: WorkDir, name: str, dest: Path) -> list[str]:
    """Copy the result ``name`` of a finished run into ``dest``: all its files or none.

    The result is ``<name>.json`` (required), ``<name>.md``, ``<name>.png`` and ``<name>_<part>.png``, each
    an entry bppsa wrote in the work directory. Every file is first copied beside its destination, then
    renamed over it; a file of an earlier ``<name>`` result in ``dest`` that this one does not have (an old
    ``.png``) is removed. Returns the paths written.
    """
    listed = set((wd.marker or {}).get("written", []))
    pattern = re.compile(re.escape(name) + r"(\.(json|md|png)|_[A-Za-z0-9_-]+\.png)")
    files = sorted(n for n in listed if pattern.fullmatch(n) and (wd.path / n).is_file())
    if f"{name}.json" not in files:
        raise RunFailed(f"--publish: the task wrote no {name}.json into {str(wd.path)!r}; nothing was published")
    dest.mkdir(parents=True, exist_ok=True)
    staged = [(dest / f".{n}.publishing", dest / n) for n in files]
    try:
        for (tmp, _), n in zip(staged, files):
            shutil.copy2(wd.path / n, tmp)
    except OSError as e:
        for tmp, _ in staged:
            tmp.unlink(missing_ok=True)
        raise RunFailed(f"--publish: {write_error(e) or e}; nothing was published") from e
    stale = [f for f in _result_files(dest, name) if f.name not in files]
    for tmp, target in staged:
        os.replace(tmp, target)
    for f in stale:
        f.unlink()
        print(f"bppsa run: removed {str(f)!r}, a file of the earlier {name} result that this run does not make",
              file=sys.stderr)
    return [str(target) for _, target in staged]


def _result_files(dest: Path, name: str) -> list[Path]:
    """The files of result ``name`` in ``dest``: ``<name>.*`` and ``<name>_*.png`` that no longer-named result
    (``<name>_x.json`` beside them) owns."""
    results = sorted((p.stem for p in dest.glob("*.json")), key=len, reverse=True)
    out = []
    for f in dest.iterdir():
        if not f.is_file() or f.name.startswith("."):
            continue
        owner = next((r for r in results if f.name.startswith((r + ".", r + "_"))), None)
        if owner == name and (f.suffix in (".json", ".md", ".png")):
            out.append(f)
    return sorted(out)
