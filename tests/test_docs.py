"""Every file the documentation names is in the clone: README.md, docs/*.md, the experiments'
READMEs, the notebooks' cells and the package's docstrings (module, class and function) and
comments.

A mention counts as a path when it has a ``/`` and starts at a top-level entry of the repository
or at a package folder (``bppsa/...``, ``experiments/...``, ``cost_models/cpu.json``), or when it
ends in a file suffix (.py, .md, .json, ...). It exists when it names a file or folder of the clone
relative to the repository root, to the document's folder, to the package, or as the tail of a
path in the clone (``hetero/partition.py``; a bare ``irmas.py`` matches any file of that name).
Not checked: templates (``{cpu,gpu}.json``, ``<device>/``), globs, URLs, absolute and home
paths; placeholders (``NAME.py``, ``OUT/``, ``workdir/``, ``path/to/``, ``my_train.py``); folders
that .gitignore keeps out of the repository (``data/irmas``: downloads and caches); bare ``.json``
names (the files a run writes: ``summary.json``).
"""

from __future__ import annotations

import ast
import json
import re
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "bppsa"
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "experiments" / "README.md",
        ROOT / "experiments" / "gpu" / "README.md"]
SUFFIXES = ("py", "md", "json", "ipynb", "sh", "toml", "txt", "csv", "png", "cfg", "yaml", "yml")

# A path-like token: word characters, dots, dashes and slashes, not preceded by a path character
# (so the tail of a URL or of an absolute path is not taken on its own).
_TOKEN = re.compile(r"(?<![\w./~:<>{}*$-])[\w.-]+(?:/[\w.-]+)*/?(?![\w/{}<>*])")
_SUFFIX = re.compile(r"\.(?:%s)$" % "|".join(SUFFIXES))
PLACEHOLDERS = {"NAME", "OUT", "DIR", "PATH", "FILE", "SPEC", "workdir", "path"}
IGNORED_DIRS = {line.strip().strip("/") for line in (ROOT / ".gitignore").read_text().splitlines()
                if line.startswith("/") and line.rstrip().endswith("/")}  # root folders: /data/, /runs/


def _tracked() -> list[str]:
    skip = {".git", ".venv", ".hypothesis", ".pytest_cache", "__pycache__", "build"}
    out = []
    for p in ROOT.rglob("*"):
        rel = p.relative_to(ROOT)
        if not (set(rel.parts) & skip or rel.parts[0].endswith(".egg-info")):
            out.append(rel.as_posix())
    return out


TRACKED = _tracked()
TOP = {Path(p).parts[0] for p in TRACKED} | {"bppsa", "tests", "docs", "experiments", "notebooks"}
PACKAGE_DIRS = {Path(p).relative_to("bppsa").parts[0] for p in TRACKED
                if p.startswith("bppsa/") and (ROOT / p).is_dir()}


def candidates(text: str) -> set[str]:
    """The path-like mentions in ``text`` (see the module docstring)."""
    out = set()
    for m in _TOKEN.finditer(text):
        tok = m.group(0).rstrip(".")
        if not tok or tok.startswith("."):  # ".py", "..."
            if not tok.startswith(".ci/"):
                continue
        has_slash = "/" in tok.strip("/")
        first = tok.split("/")[0]
        stems = [seg.split(".")[0] for seg in tok.strip("/").split("/")]
        if set(stems) & PLACEHOLDERS or stems[-1].startswith("my_") or first in IGNORED_DIRS:
            continue
        if not has_slash and tok.endswith(".json"):
            continue
        if has_slash and (first in TOP or first in PACKAGE_DIRS):
            out.add(tok)
        elif _SUFFIX.search(tok) and re.search(r"[A-Za-z_]", tok.rsplit(".", 1)[0]):
            if "." in tok.rsplit(".", 1)[0] and "/" not in tok:  # bppsa.cost.py-like dotted names: skip
                continue
            out.add(tok)
    return out


def exists(path: str, base: Path) -> bool:
    p = path.rstrip("/")
    if (ROOT / p).exists() or (base / p).exists() or (PKG / p).exists():
        return True
    return any(t == p or t.endswith("/" + p) for t in TRACKED)


def _docstrings(path: Path):
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                yield getattr(node, "lineno", 1), doc


def _comments(path: Path):
    with path.open("rb") as f:
        for tok in tokenize.tokenize(f.readline):
            if tok.type == tokenize.COMMENT:
                yield tok.start[0], tok.string


def _sources():
    for doc in DOCS:
        if doc.exists():
            yield doc.relative_to(ROOT).as_posix(), doc.parent, doc.read_text()
    for nb in sorted((ROOT / "notebooks").glob("*.ipynb")):
        for i, cell in enumerate(json.loads(nb.read_text())["cells"]):
            yield f"{nb.relative_to(ROOT).as_posix()} cell {i}", nb.parent, "".join(cell["source"])
    for py in sorted(PKG.rglob("*.py")):
        for line, text in [*_docstrings(py), *_comments(py)]:
            yield f"{py.relative_to(ROOT).as_posix()}:{line}", py.parent, text


def test_the_documents_exist():
    assert (ROOT / "docs" / "architecture.md").exists()
    assert all(d.exists() for d in DOCS if d.name == "README.md" and d.parent == ROOT)


def test_every_mentioned_file_exists():
    missing = sorted({f"{where}: {path}" for where, base, text in _sources() for path in candidates(text)
                      if not exists(path, base)})
    assert not missing, "files mentioned in the documentation but absent from the clone:\n" + "\n".join(missing)


@pytest.mark.parametrize("text, found", [
    ("see `bppsa/hetero/partition.py` and NOTES.md §2", {"bppsa/hetero/partition.py", "NOTES.md"}),
    ("package data bppsa/data/cost_models/{cpu,gpu}.json, https://x.org/a/b.md, /tmp/x.py", set()),
    ("written to experiments/results/<device>/ and ~/.cache/bppsa; bppsa.cost.py", set()),
    ("the T/P steps, B/P examples and/or a 1/2 split", set()),
    ("[table](results/cpu/bptt-unroll.md), `irmas.py`", {"results/cpu/bptt-unroll.md", "irmas.py"}),
    ("bppsa run experiments/configs/NAME.py writes OUT/summary.json, workdir/config.json, runs.json; "
     "python my_train.py; data/irmas/IRMAS", set()),
])
def test_candidates(text, found):
    assert candidates(text) == found


def test_a_missing_file_is_caught():
    assert not exists("NOTES.md", ROOT) and not exists("bppsa/gpu_run.py", ROOT)
    assert exists("hetero/partition.py", ROOT) and exists("irmas.py", ROOT)
    assert exists("results/cpu/bptt-unroll.md", ROOT / "experiments")
