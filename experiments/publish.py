"""``bppsa run --publish``: a complete result copied into ``experiments/results/<device>/``, all of its
files or none, and the files of the earlier result that it no longer makes removed; publishing the same
result again rewrites nothing."""

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


def publish_result(wd: WorkDir, name: str, dest: Path, as_name: str | None = None) -> list[str]:
    """Copy the result ``name`` of a finished run into ``dest`` as ``as_name`` (default ``name``): all its
    files or none.

    The result is ``<name>.json`` (required), ``<name>.md``, ``<name>.png`` and ``<name>_<part>.png``, each
    an entry bppsa wrote in the work directory; published as ``<as_name>.json`` etc., the ``.md``'s links to
    its own plots renamed with them. Every file that differs from its destination is first copied beside
    it, then renamed over it (a file already holding the same bytes is not rewritten: publishing the same
    result again changes nothing); a file of an earlier ``<as_name>`` result in ``dest`` that this one does
    not have (an old ``.png``) is removed. Returns the paths of the result in ``dest``.
    """
    as_name = as_name or name
    listed = set((wd.marker or {}).get("written", []))
    pattern = re.compile(re.escape(name) + r"(\.(json|md|png)|_[A-Za-z0-9_-]+\.png)")
    files = sorted(n for n in listed if pattern.fullmatch(n) and (wd.path / n).is_file())
    if f"{name}.json" not in files:
        raise RunFailed(f"--publish: the task wrote no {name}.json into {str(wd.path)!r}; nothing was published")
    targets = {n: as_name + n[len(name):] for n in files}
    dest.mkdir(parents=True, exist_ok=True)
    staged = [(dest / f".{targets[n]}.publishing", dest / targets[n], n) for n in files
              if not _same(_content(wd.path / n, targets), dest / targets[n])]
    try:
        for tmp, _, n in staged:
            if n != targets[n] and n.endswith(".md"):
                tmp.write_bytes(_content(wd.path / n, targets))
            else:
                shutil.copy2(wd.path / n, tmp)
    except OSError as e:
        for tmp, _, _ in staged:
            tmp.unlink(missing_ok=True)
        raise RunFailed(f"--publish: {write_error(e) or e}; nothing was published") from e
    stale = [f for f in _result_files(dest, as_name) if f.name not in targets.values()]
    for tmp, target, _ in staged:
        os.replace(tmp, target)
    for f in stale:
        f.unlink()
        print(f"bppsa run: removed {str(f)!r}, a file of the earlier {as_name} result that this run does not make",
              file=sys.stderr)
    return [str(dest / targets[n]) for n in files]


def _content(source: Path, targets: dict[str, str]) -> bytes:
    """The bytes ``source`` is published as: a renamed result's ``.md`` links to its plots by their new names."""
    data = source.read_bytes()
    if source.suffix == ".md":
        for old, new in targets.items():
            if old != new and old.endswith(".png"):
                data = data.replace(f"]({old})".encode(), f"]({new})".encode())
    return data


def _same(data: bytes, target: Path) -> bool:
    """``target`` exists and holds exactly ``data``."""
    try:
        return target.is_file() and target.stat().st_size == len(data) and target.read_bytes() == data
    except OSError:
        return False


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
