"""Every file the documentation names is in the clone: README.md, docs/**/*.md (the site's pages), the
experiments' READMEs, the notebooks' cells and the package's docstrings (module, class and function) and
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
DOCS = [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").rglob("*.md") if "_build" not in p.parts),
        ROOT / "experiments" / "README.md", ROOT / "experiments" / "gpu" / "README.md"]
SUFFIXES = ("py", "md", "json", "ipynb", "sh", "toml", "txt", "csv", "png", "cfg", "yaml", "yml")

# A path-like token: word characters, dots, dashes and slashes, not preceded by a path character
# (so the tail of a URL or of an absolute path is not taken on its own).
_TOKEN = re.compile(r"(?<![\w./~:<>{}*$-])[\w.-]+(?:/[\w.-]+)*/?(?![\w/{}<>*])")
_SUFFIX = re.compile(r"\.(?:%s)$" % "|".join(SUFFIXES))
PLACEHOLDERS = {"NAME", "OUT", "DIR", "PATH", "FILE", "SPEC", "workdir", "path"}
IGNORED_DIRS = {line.strip().strip("/") for line in (ROOT / ".gitignore").read_text().splitlines()
                if line.startswith("/") and line.rstrip().endswith("/")}  # root folders: /data/, /runs/, /docs/_build/


SKIP_DIRS = {".git", ".venv", ".hypothesis", ".pytest_cache", "__pycache__", "build", "_build"}
TRACKED = [rel.as_posix() for rel in (p.relative_to(ROOT) for p in ROOT.rglob("*"))
           if not (set(rel.parts) & SKIP_DIRS or rel.parts[0].endswith(".egg-info"))]
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
        ignored = first in IGNORED_DIRS or any(tok.strip("/").startswith(d + "/") or tok.strip("/") == d
                                               for d in IGNORED_DIRS)  # docs/_build/html: built, not committed
        if set(stems) & PLACEHOLDERS or stems[-1].startswith("my_") or ignored:
            continue
        if not has_slash and tok.endswith(".json"):
            continue
        if has_slash and (first in TOP or first in PACKAGE_DIRS):
            out.add(tok)
        elif _SUFFIX.search(tok) and re.search(r"[A-Za-z_]", tok.rsplit(".", 1)[0]):
            if "." in tok.rsplit(".", 1)[0] and "/" not in tok:  # bppsa.plan.cost.py-like dotted names: skip
                continue
            out.add(tok)
    return out


def exists(path: str, base: Path) -> bool:
    p = path.rstrip("/")
    if (ROOT / p).exists() or (base / p).exists() or (PKG / p).exists():
        return True
    return any(t == p or t.endswith("/" + p) for t in TRACKED)


def test_the_documents_exist():
    assert (ROOT / "docs" / "architecture.md").exists()
    assert all(d.exists() for d in DOCS if d.name == "README.md" and d.parent == ROOT)


def test_every_mentioned_file_exists():
    def sources():
        def comments(path: Path):
            with path.open("rb") as f:
                for tok in tokenize.tokenize(f.readline):
                    if tok.type == tokenize.COMMENT:
                        yield tok.start[0], tok.string

        def docstrings(path: Path):
            tree = ast.parse(path.read_text(), filename=str(path))
            for node in ast.walk(tree):
                if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                    doc = ast.get_docstring(node, clean=False)
                    if doc:
                        yield getattr(node, "lineno", 1), doc

        for doc in DOCS:
            if doc.exists():
                yield doc.relative_to(ROOT).as_posix(), doc.parent, doc.read_text()
        for nb in sorted((ROOT / "notebooks").glob("*.ipynb")):
            for i, cell in enumerate(json.loads(nb.read_text())["cells"]):
                yield f"{nb.relative_to(ROOT).as_posix()} cell {i}", nb.parent, "".join(cell["source"])
        for py in sorted(PKG.rglob("*.py")):
            for line, text in [*docstrings(py), *comments(py)]:
                yield f"{py.relative_to(ROOT).as_posix()}:{line}", py.parent, text

    missing = sorted({f"{where}: {path}" for where, base, text in sources() for path in candidates(text)
                      if not exists(path, base)})
    assert not missing, "files mentioned in the documentation but absent from the clone:\n" + "\n".join(missing)


@pytest.mark.parametrize("text, found", [
    ("see `bppsa/hetero/partition.py` and NOTES.md §2", {"bppsa/hetero/partition.py", "NOTES.md"}),
    ("package data bppsa/plan/cost_models/{cpu,gpu}.json, https://x.org/a/b.md, /tmp/x.py", set()),
    ("written to experiments/results/<device>/ and ~/.cache/bppsa; bppsa.plan.cost.py", set()),
    ("the T/P steps, B/P examples and/or a 1/2 split", set()),
    ("[table](results/cpu/bptt-unroll.md), `irmas.py`", {"results/cpu/bptt-unroll.md", "irmas.py"}),
    ("bppsa run experiments/<paper>/configs/NAME.py writes OUT/summary.json, workdir/config.json, runs.json; "
     "python my_train.py; data/irmas/IRMAS", set()),
])
def test_candidates(text, found):
    assert candidates(text) == found


def test_a_missing_file_is_caught():
    assert not exists("NOTES.md", ROOT) and not exists("bppsa/gpu_run.py", ROOT)
    assert exists("hetero/partition.py", ROOT) and exists("irmas.py", ROOT)
    assert exists("results/cpu/bptt-unroll.md", ROOT / "experiments")


# The front page and the documentation site (`make docs` builds it; .ci/run runs that).
README = ROOT / "README.md"
SITE = ROOT / "docs"
GUIDES = ["backward", "cells", "parallel_forward", "flax", "devices", "hetero", "sync", "runner"]


def _toctree_entries(page: Path) -> set[str]:
    """The documents listed in the ```{toctree} blocks of a MyST page."""
    entries = set()
    for block in re.findall(r"```\{toctree\}\n(.*?)```", page.read_text(), flags=re.S):
        entries |= {line.strip() for line in block.splitlines() if line.strip() and not line.startswith(":")}
    return entries


def test_the_readme_is_a_front_page():
    text = README.read_text()
    assert len(text.splitlines()) <= 160, "README.md is the front page: at most 160 lines (the rest belongs in docs/)"
    commands = re.findall(r"^make (\w+)", text, flags=re.M)
    assert commands[:2] == ["reproduce", "test"], commands  # the two set-up commands, first
    assert "creates its own virtual environment" in text


def test_every_guide_is_in_the_site():
    assert sorted(p.stem for p in (SITE / "guides").glob("*.md")) == sorted(GUIDES)
    entries = _toctree_entries(SITE / "index.md")
    missing = [f"guides/{g}" for g in GUIDES if f"guides/{g}" not in entries]
    assert not missing, f"guides not in the toctree of docs/index.md: {missing}"
    assert {"results", "architecture", "api/index"} <= entries


def test_every_public_module_has_an_api_page():
    """One page per public module or subpackage of bppsa (docs/api/bppsa.NAME.rst), each in the toctree."""
    public = {"bppsa"} | {f"bppsa.{p.stem if p.is_file() else p.name}" for p in PKG.iterdir()
                          if not p.name.startswith("_") and (p.suffix == ".py" or (p / "__init__.py").exists())}
    public.add("experiments")  # the harness: one page
    pages = {p.stem for p in (SITE / "api").glob("*.rst")}
    assert public == pages, f"no page: {sorted(public - pages)}; no module: {sorted(pages - public)}"
    assert _toctree_entries(SITE / "api" / "index.md") == pages


def test_the_api_page_of_bppsa_names_every_export():
    import bppsa

    page = (SITE / "api" / "bppsa.rst").read_text()
    missing = [n for n in bppsa.__all__ if f"bppsa.{n}" not in page]
    assert not missing, f"docs/api/bppsa.rst does not name {missing}"


def test_make_docs_is_strict_and_run_by_ci():
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^docs: \$\(STAMP\)\n\t.*sphinx-build -W --keep-going .* docs docs/_build/html", makefile, re.M)
    steps = re.findall(r"^make ([\w-]+)", (ROOT / ".ci" / "run").read_text(), flags=re.M)
    assert steps == ["lint", "docs", "test", "machine-code"], steps


# Every figure the README or the site quotes comes from a committed result: in each block (a
# paragraph, a list item or a table row) that links result files (experiments/results/**/*.md),
# every decimal number (2.82, 0.65×, 1.1e-6, 102.69 ms) is one of the numbers of those files (the
# .md and its .json), rounded as quoted. Integers (shapes, counts, seeds) and `code` are not checked.
_DECIMAL = re.compile(r"(?<![\w.])[-+]?\d+\.\d+(?:[eE][-+]?\d+)?")
_ANY_NUMBER = re.compile(r"(?<![\w.])[-+]?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")


def _blocks(text: str) -> list[str]:
    """Paragraphs, list items and table rows of a Markdown text (code fences dropped)."""
    out, cur, fenced = [], [], False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
            continue
        if fenced:
            continue
        if not line.strip() or line.startswith("|") or re.match(r"\s*[-*] ", line):
            if cur:
                out.append("\n".join(cur))
            cur = [] if line.startswith("|") or not line.strip() else [line]
            if line.startswith("|"):
                out.append(line)
        else:
            cur.append(line)
    return out + (["\n".join(cur)] if cur else [])


def quoted_numbers(block: str) -> list[str]:
    """The decimal numbers of a block, outside link targets and `code`."""
    return _DECIMAL.findall(re.sub(r"`[^`]*`", "", re.sub(r"\]\([^)]*\)", "]", block)))


def is_quoted_from(quoted: str, numbers: list[float]) -> bool:
    """``quoted`` (e.g. "0.65", "1.1e-6") is one of ``numbers`` rounded to its last digit."""
    mantissa, _, exponent = quoted.lower().partition("e")
    ulp = 10.0 ** (-len(mantissa.split(".")[1]) + (int(exponent) if exponent else 0))
    q = float(quoted)
    return any(abs(x - q) <= ulp / 2 * (1 + 1e-9) for x in numbers)


def test_every_quoted_number_is_in_the_result_it_links():
    quotes = []
    for doc in [README, *sorted(p for p in SITE.rglob("*.md") if "_build" not in p.parts)]:
        for block in _blocks(doc.read_text()):
            links = re.findall(r"\]\(([^)#]*(?:experiments/(?:results|history)|design-notes)/[^)#]*\.md)", block)
            # a link to a design note's page (docs/design-notes/X.md) quotes experiments/history/X.md
            paths = [(doc.parent / link).resolve() for link in links]
            paths = [ROOT / "experiments" / "history" / p.relative_to(SITE / "design-notes")
                     if SITE / "design-notes" in p.parents else p for p in paths]
            files = [f for p in paths for f in (p, p.with_suffix(".json"))]
            if links:
                quotes.append((str(doc.relative_to(ROOT)), block, files))
    assert len(quotes) >= 20 and sum(len(quoted_numbers(b)) for _, b, _ in quotes) >= 60  # the check reads the tables
    wrong = []
    for where, block, files in quotes:
        numbers = [float(n) for f in files if f.exists() for n in _ANY_NUMBER.findall(f.read_text())]
        missing = [q for q in quoted_numbers(block) if not is_quoted_from(q, numbers)]
        if missing:
            wrong.append(f"{where}: {missing} not in {[f.name for f in files if f.exists()]}: {block[:80]!r}")
    assert not wrong, "numbers quoted without a committed result behind them:\n" + "\n".join(wrong)


def test_a_misquoted_number_is_caught():
    assert is_quoted_from("0.65", [0.6512]) and is_quoted_from("1.1e-6", [1.1266e-06])
    assert is_quoted_from("102.69", [102.689]) and not is_quoted_from("102.69", [102.7])
    assert not is_quoted_from("5.4", [3.1, 6.8, 3.9, 7.1]) and not is_quoted_from("8.3e-7", [8.4e-07])
    assert quoted_numbers("BPPSA 2.82× [rnn](../x/rnn-1.5.md), `lax.scan(unroll=1.5)`; 0.65×") == ["2.82", "0.65"]
    assert _blocks("a\nb\n\n| x | 1.5 |\n- item 2.5\n```\n9.9\n```\n") == ["a\nb", "| x | 1.5 |", "- item 2.5"]
