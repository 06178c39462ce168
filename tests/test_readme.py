"""Every Python example of README.md runs as written after a plain ``import bppsa``.

The README's ```python blocks are run in order, in one namespace (a later block may use the names
an earlier one defined, as a reader who pastes them into one session would), in a fresh
interpreter with JAX's defaults (float32, no x64): what a reader gets. A failing block is named
with its number, its first line and the error.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"

_BLOCK = re.compile(r"^```python[ \t]*\n(.*?)^```[ \t]*$", re.S | re.M)

# Runs the blocks (a JSON list on stdin) one after another in one namespace; on the first failure
# prints "block N failed: <error>" and exits 1.
_DRIVER = """
import json, sys, traceback
blocks = json.load(sys.stdin)
namespace = {"__name__": "__main__"}
for i, code in enumerate(blocks, 1):
    try:
        exec(compile(code, f"README.md python block {i}", "exec"), namespace)
    except BaseException as e:
        first = code.strip().splitlines()[0]
        tb = traceback.format_exc(limit=-3)
        print(f"block {i} ({first!r}) failed: {type(e).__name__}: {e}\\n{tb}", file=sys.stderr)
        sys.exit(1)
    print(f"block {i} ok", flush=True)
"""


def python_blocks(text: str) -> list[str]:
    """The bodies of the ```python fenced blocks of a Markdown text, in order."""
    return _BLOCK.findall(text)


def test_python_blocks_are_found():
    text = "a\n```python\nx = 1\n```\n```bash\nls\n```\n```python\ny = x\n```\n"
    assert python_blocks(text) == ["x = 1\n", "y = x\n"]


def test_the_readme_has_a_python_example():
    assert python_blocks(README.read_text()), "README.md has no ```python block"


def _run(blocks: list[str], timeout: float = 600) -> subprocess.CompletedProcess:
    env = {k: v for k, v in __import__("os").environ.items() if k != "JAX_ENABLE_X64"}
    env["JAX_PLATFORMS"] = "cpu"
    return subprocess.run([sys.executable, "-c", _DRIVER], input=json.dumps(blocks), capture_output=True,
                          text=True, cwd=ROOT, env=env, timeout=timeout)


def test_a_failing_block_is_named():
    r = _run(["import bppsa\n", "bppsa.no_such_thing\n"], timeout=120)
    assert r.returncode == 1 and "block 1 ok" in r.stdout
    assert "block 2 ('bppsa.no_such_thing') failed: AttributeError" in r.stderr


def test_every_readme_python_block_runs_as_written():
    blocks = python_blocks(README.read_text())
    r = _run(blocks)
    assert r.returncode == 0, f"a README example does not run as written:\n{r.stderr[-3000:]}"
    assert r.stdout.split() == " ".join(f"block {i} ok" for i in range(1, len(blocks) + 1)).split()


def test_subpackages_are_reachable_after_import_bppsa():
    """In a fresh interpreter: `import bppsa` loads none of the lazy subpackages; each is then reachable."""
    names = ["nn", "sparse", "hetero", "sync"]
    code = (f"import sys, bppsa; names = {names!r}; loaded = [n for n in names if 'bppsa.' + n in sys.modules]; "
            "assert not loaded, loaded; print(*[getattr(bppsa, n).__name__ for n in names])")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 0 and r.stdout.split() == [f"bppsa.{n}" for n in names], r.stderr


def test_an_unknown_attribute_is_an_attribute_error():
    import bppsa
    with pytest.raises(AttributeError, match="has no attribute 'no_such_thing'"):
        bppsa.no_such_thing  # noqa: B018
    assert "nn" in dir(bppsa)
