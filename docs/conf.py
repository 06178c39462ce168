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

from sphinx.util import logging

_log = logging.getLogger(__name__)

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


# Docstrings are written to be read as plain text in a terminal (|x| for an absolute value, a * for a
# product or an unpacking, indented continuation lines) and use Sphinx roles for links. Where such a
# docstring is not valid reStructuredText, :func:`_plain_text_docstring` makes the smallest change
# that renders it as written, rather than editing the library's docstrings for the site's sake:
# only docstrings that docutils would warn about are touched, and one still broken after these steps
# fails the build (a warning, -W).
_ROLE = re.compile(r"(?::[\w-]+)+:`([^`]*)`")
_LITERAL = re.compile(r"(``.+?``)")
_ROLE_THEN_WORD = re.compile(r"((?::[\w-]+)+:`[^`]*`|``[^`]+``)(?=\w)")  # :class:`Cell`s -> :class:`Cell`\ s


def _docutils_problems(lines: list[str]) -> list[str]:
    """The warnings and errors docutils reports for ``lines`` (Sphinx roles read as literals)."""
    from docutils import nodes
    from docutils.core import publish_doctree
    from docutils.utils import Reporter

    text = _ROLE.sub(lambda m: "``" + m.group(1).replace("`", "") + "``", "\n".join(lines))
    doctree = publish_doctree(text, settings_overrides={"report_level": Reporter.WARNING_LEVEL,
                                                         "halt_level": Reporter.SEVERE_LEVEL + 1,
                                                         "warning_stream": False})
    messages = [*doctree.findall(nodes.system_message), *doctree.transform_messages]  # the latter: substitutions
    return [m.astext() for m in messages if m["level"] >= Reporter.WARNING_LEVEL]


def _escape_outside_literals(line: str, chars: str) -> str:
    """``line`` with each of ``chars`` backslash-escaped, except inside ``literals`` and roles."""
    parts = _LITERAL.split(line)
    for i in range(0, len(parts), 2):  # the even parts are outside ``literals``
        out, last = [], 0
        for m in _ROLE.finditer(parts[i]):
            out += [_escape(parts[i][last:m.start()], chars), m.group(0)]
            last = m.end()
        parts[i] = "".join([*out, _escape(parts[i][last:], chars)])
    return "".join(parts)


def _escape(text: str, chars: str) -> str:
    for c in chars:
        text = re.sub(r"(?<!\\)" + re.escape(c), lambda m: "\\" + m.group(0), text)
    return text


def _separate_indented_blocks(lines: list[str]) -> list[str]:
    """A blank line wherever the indentation changes between two non-blank lines, so that an
    indented continuation (a formula, an aligned list) is a block quote, not a syntax error."""
    out: list[str] = []
    for line in lines:
        if out and out[-1].strip() and line.strip():
            prev = len(out[-1]) - len(out[-1].lstrip())
            if len(line) - len(line.lstrip()) != prev:
                out.append("")
        out.append(line)
    return out


def _plain_text_docstring(app, what, name, obj, options, lines):
    if not _docutils_problems(lines):
        return
    fixed = list(lines)
    _log.verbose("docstring of %s rendered as plain text (not valid reStructuredText as written)", name)
    for step in (lambda ls: [_ROLE_THEN_WORD.sub(r"\1\\ ", s) for s in ls],
                 lambda ls: [_escape_outside_literals(s, "|") for s in ls],
                 lambda ls: [_escape_outside_literals(s, "*") for s in ls],
                 _separate_indented_blocks):
        fixed = step(fixed)
        if not _docutils_problems(fixed):
            break
    lines[:] = fixed  # still broken: Sphinx reports it, and -W fails the build


def setup(app):
    app.connect("source-read", _link_repository_files)
    return {"parallel_read_safe": True}
