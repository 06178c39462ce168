"""The guides' Python examples run as written (each guide's ```python blocks, in order, in one fresh
interpreter from the clone's root), and the guides are for users: no engineering log (the one-off
records of experiments/history/ are the site's design notes, linked from docs/design_notes.md)."""

import re
from pathlib import Path

import pytest

from tests.test_readme import _run, python_blocks

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
# every user-facing page with examples; cells.md's blocks run in tests/cells/test_user_cell.py
RUN = ["getting_started", "guides/devices", "guides/hetero", "guides/sync", "guides/runner"]


# the default run: the getting-started page and the runner's guide; the pages on devices, heterogeneous
# data parallelism and synchronisation (their examples are the unit tests' features): make test-all
@pytest.mark.parametrize("page", [p if p in ("getting_started", "guides/runner")
                                  else pytest.param(p, marks=pytest.mark.slow) for p in RUN])
def test_the_examples_run_as_written(page, monkeypatch):
    monkeypatch.setenv("MPLBACKEND", "Agg")
    blocks = python_blocks((DOCS / f"{page}.md").read_text())
    assert blocks, f"docs/{page}.md has no ```python example"
    r = _run(blocks)
    assert r.returncode == 0, f"an example of docs/{page}.md does not run as written:\n{r.stderr[-3000:]}"


@pytest.mark.parametrize("page", sorted(p.stem for p in (DOCS / "guides").glob("*.md")))
def test_every_guide_opens_with_an_example(page):
    text = (DOCS / "guides" / f"{page}.md").read_text()
    assert "```python" in text, f"docs/guides/{page}.md has no Python example"


_LOG = [r"experiments/history/", r"\btests/\w+", r"\bR\d+\.\d+\b", r"\bthe peer\b", r"\bthe GPU machine\b",
        r"\bthe newest here\b", r"bppsa\.backward\.rule\.solved_states"]


@pytest.mark.parametrize("page", sorted(p.stem for p in (DOCS / "guides").glob("*.md")))
def test_the_guides_carry_no_engineering_log(page):
    text = (DOCS / "guides" / f"{page}.md").read_text()
    found = [m.group(0) for pattern in _LOG for m in re.finditer(pattern, text)]
    assert not found, f"docs/guides/{page}.md: {found} (history links belong in the design notes)"
