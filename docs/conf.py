"""Sphinx configuration of the bppsa documentation site (``make docs``: warnings are errors).

Pages are Markdown (MyST) except the API reference (``api/*.rst``, autodoc over the docstrings,
Google style with Sphinx roles: napoleon). The guides link the committed result files under
``experiments/`` (outside this folder) with plain relative Markdown links, so that they work on a
code host too; :func:`_link_repository_files` turns each such link into a download of the file,
so the built site carries the results it cites.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
sys.path.insert(0, str(ROOT))  # the checkout's bppsa, also without an installed package

project = "bppsa"
author = "the bppsa authors"
copyright = "the bppsa authors, Apache-2.0"  # noqa: A001 (Sphinx's name)
release = version = __import__("bppsa").__version__  # the one source: bppsa/__init__.py

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
exclude_patterns = ["_build"]
root_doc = "index"
html_theme = "furo"
html_title = "bppsa"
html_static_path: list[str] = []

# MyST: GitHub-style heading anchors, so that `[x](guide.md#a-heading)` resolves as on a code host.
myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence", "dollarmath"]

# autodoc: each module's __all__ is its API (tests/test_architecture.py checks that), in source order.
autodoc_default_options = {"members": True, "member-order": "bysource", "undoc-members": False}
autodoc_typehints = "signature"
autodoc_preserve_defaults = True  # show `chunk_size="auto"`, not a repr of an evaluated constant
autodoc_mock_imports: list[str] = []
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False
# The one "Raises:" section (bppsa.backprop.rnn) is prose, not napoleon's "Type: description" lines:
# render it as a titled text section (napoleon would make each of its lines an exception type).
napoleon_custom_sections = [("Raises", "_prose")]
napoleon_use_ivar = True  # "Attributes:" as fields: a dataclass's fields are autodoc members already (no duplicates)

# Markdown links to files of the repository outside docs/ (the committed results, experiments'
# READMEs, notebooks, scripts): relative paths that exist on disk.
_LINK = re.compile(r"\]\((?!#)(?![a-z][a-z0-9+.-]*:)([^)\s#]+)\)")


def _link_repository_files(app, docname, source):
    """Rewrite ``[text](../../experiments/x.md)`` as a MyST ``path:`` link (a download of the file)
    when the target is a file of the clone outside docs/; links between pages stay page links."""
    if not app.env.doc2path(docname).suffix == ".md":
        return
    base = Path(app.env.doc2path(docname)).parent

    def rewrite(m):
        target = (base / m.group(1)).resolve()
        if target.is_file() and DOCS not in target.parents:
            return f"](path:{m.group(1)})"
        return m.group(0)

    source[0] = _LINK.sub(rewrite, source[0])


def setup(app):
    app.connect("source-read", _link_repository_files)
    return {"parallel_read_safe": True}
