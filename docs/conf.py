"""Sphinx configuration of the bppsa documentation site (``make docs``: warnings are errors).

Pages are Markdown (MyST) except the API reference (``api/*.rst``, autodoc over the docstrings,
Google style with Sphinx roles: napoleon). The guides link the committed result files under
``experiments/`` (outside this folder) with plain relative Markdown links, so that they work on a
code host too; :func:`_link_repository_files` turns a link to a committed result or design note
into a link to its page (docs/results/, docs/design-notes/, docs/harness/) and any other such link into a download
of the file, so the built site carries the results it cites.

Docstrings are valid reStructuredText as written (Examples as doctests, maths as ``:math:``):
nothing here rewrites them. :func:`_reexported` resolves a reference by a re-exported name
(``bppsa.Options``) to where the object is documented; :func:`_signature` shows a flax module's
constructor signature and the type aliases by name.
"""

from __future__ import annotations

import os
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
    "sphinx.ext.intersphinx",
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

# --- The notebooks and the committed results as pages (myst-nb) --------------------------------------
# myst_nb reads the notebooks (docs/notebooks links to ../notebooks) and loads myst_parser itself. The
# notebooks are shown with their committed outputs (notebooks/execute.py makes them), never executed
# here, so the build stays fast and offline. docs/results/, docs/design-notes/ and docs/harness/ are
# one-line pages that include experiments/results/**.md, experiments/history/*.md and the harness's
# READMEs (the figures: docs/_static/figures, drawn by `python -m experiments.figures`).
extensions = [e for e in extensions if e != "myst_parser"] + ["myst_nb"]
source_suffix = {**source_suffix, ".md": "myst-nb", ".ipynb": "myst-nb"}
nb_execution_mode = "off"
_PAGES = {ROOT / "experiments" / "results": DOCS / "results",
          ROOT / "experiments" / "history": DOCS / "design-notes",
          ROOT / "experiments": DOCS / "harness"}  # the harness's READMEs (experiments/README.md, gpu/README.md)


def _page_of(target: Path) -> Path | None:
    """The site page that includes the committed Markdown file ``target`` (a result, a design note)."""
    for folder, pages in _PAGES.items():
        if target.suffix == ".md" and folder in target.parents and (pages / target.relative_to(folder)).is_file():
            return pages / target.relative_to(folder)
    return None

exclude_patterns += ["notebooks/execute.py", "**.ipynb_checkpoints"]

# autodoc: each module's __all__ is its API (tests/test_architecture.py checks that), in source order.
# Every automodule says :members: itself (its __all__) or lists them: a "members" default here would
# override those lists (Sphinx 9 replaces an explicit list by a non-string default).
autodoc_default_options = {"member-order": "bysource", "undoc-members": False}
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
# Annotations shown under their public names: the aliases for names as the source writes them, and
# jax.lax.Precision, a class of jax._src that autodoc would otherwise print by that private path.
import jax.lax  # noqa: E402

jax.lax.Precision.__module__ = "jax.lax"
autodoc_type_aliases = {"PyTree": "bppsa.PyTree", "Array": "jax.Array",
                        "ArrayLike": "jax.typing.ArrayLike", "DTypeLike": "jax.typing.DTypeLike",
                        "Mesh": "jax.sharding.Mesh"}
napoleon_attr_annotations = False  # the types are in the signature; evaluated here they would be private names

# Links to JAX, flax and optax. The build runs offline: the inventories are small hand-written ones,
# committed (docs/_inventories/make_inventories.py writes them; add a name there when a page needs it).
intersphinx_mapping = {
    "jax": ("https://docs.jax.dev/en/latest/", str(DOCS / "_inventories" / "jax.inv")),
    "flax": ("https://flax.readthedocs.io/en/latest/", str(DOCS / "_inventories" / "flax.inv")),
    "optax": ("https://optax.readthedocs.io/en/latest/", str(DOCS / "_inventories" / "optax.inv")),
}
intersphinx_timeout = 1

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
        if (page := _page_of(target)) is not None:  # a result or a design note: its page in the site
            return f"]({os.path.relpath(page, base)})"
        if target.is_file() and DOCS not in target.parents:
            return f"](path:{m.group(1)})"
        return m.group(0)

    source[0] = _LINK.sub(rewrite, source[0])


def _reexported(app, env, node, contnode):
    """Resolve a Python reference by a re-exported name (``bppsa.Options``, ``bppsa.scan.blelloch_scan``)
    to where the object is documented (``bppsa.plan.options.Options``), as a user writes it."""
    import importlib

    if node.get("refdomain") != "py":
        return None
    target = node["reftarget"]
    parts = target.split(".")
    if parts[0] not in ("bppsa", "experiments"):
        return None
    obj = None
    for i in range(len(parts) - 1, 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        try:
            for name in parts[i:]:
                obj = getattr(obj, name)
        except AttributeError:
            return None
        break
    module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    if not module or not qualname or f"{module}.{qualname}" == target:
        return None
    return env.get_domain("py").resolve_xref(env, node["refdoc"], app.builder, node["reftype"],
                                             f"{module}.{qualname}", node, contnode)


_ALIAS_REPR = re.compile(r"TypeAliasForwardRef\('([^']+)'\)")


def _signature(app, what, name, obj, options, signature, return_annotation):
    """A flax module's constructor signature, not its metaclass's ``(*args, **kwargs)``; and every
    signature with the names of ``autodoc_type_aliases`` as written (Sphinx 9 prints an alias inside
    a union, ``PyTree | None``, as ``TypeAliasForwardRef('bppsa.PyTree')``)."""
    import inspect

    from flax import nnx

    if what != "class" or not (isinstance(obj, type) and issubclass(obj, nnx.Module)) or "__init__" not in vars(obj):
        if signature is None and return_annotation is None:
            return None
        return (None if signature is None else _ALIAS_REPR.sub(r"\1", signature),
                None if return_annotation is None else _ALIAS_REPR.sub(r"\1", return_annotation))
    from sphinx.util.inspect import signature as sphinx_signature
    from sphinx.util.inspect import stringify_signature

    sig = sphinx_signature(obj.__init__, bound_method=True, type_aliases=app.config.autodoc_type_aliases)
    params = [p.replace(default=_Source(p.default)) if p.default is not inspect.Parameter.empty else p
              for p in sig.parameters.values()]
    return _ALIAS_REPR.sub(r"\1", stringify_signature(sig.replace(parameters=params), show_return_annotation=False)), None


class _Source:
    """A default shown as written in the source (``jnp.float32``, not the class's repr)."""

    def __init__(self, value):
        self.value = value

    def __repr__(self):
        import jax.numpy as jnp

        return {jnp.float32: "jnp.float32"}.get(self.value, repr(self.value))


def _link_included_files(app, relative_path, parent_docname, content):
    """In a result or design note included by its page: a link to a committed result or note goes to
    its page, and a link to another file of the clone (a .json, a script) is a download of it. A link
    that the generated results index copied from a result's table (named relative to that result's
    folder) is looked up by its file name."""
    source = (Path(app.srcdir) / relative_path).resolve()

    def resolve(target: str) -> Path:
        path = (source.parent / target).resolve()
        if not path.exists():
            found = sorted(source.parent.rglob(Path(target).name))
            path = found[0] if found else path
        return path

    def link(m):
        target = resolve(m.group(2))
        if (page := _page_of(target)) is not None:
            return f"{m.group(1)}](/{page.relative_to(DOCS).as_posix()})"
        if target.is_file() and DOCS not in target.parents:
            return f"{m.group(1)}](path:/{os.path.relpath(target, DOCS)})"
        return m.group(0)

    def image(m):
        target = resolve(m.group(2))
        return f"{m.group(1)}]({os.path.relpath(target, source.parent)})" if target.is_file() else m.group(0)

    content[0] = re.sub(r"(!\[[^\]]*)\]\(([^)\s#:]+)\)", image, content[0])
    content[0] = _headings_under_a_title(content[0])
    content[0] = re.sub(r"((?<!!)\[[^\]]*)\]\((?!#)(?![a-z][a-z0-9+.-]*:)([^)\s#]+)\)", link, content[0])


def _headings_under_a_title(text: str) -> str:
    """A file without a title (# heading), included under its page's: its headings raised so the
    highest is a section (##) of the page."""
    levels = [len(m.group(1)) for m in re.finditer(r"^(#{1,6}) ", text, flags=re.M)]
    if not levels or min(levels) <= 2 or 1 in levels:
        return text
    shift = min(levels) - 2
    return re.sub(r"^(#{1,6}) ", lambda m: "#" * (len(m.group(1)) - shift) + " ", text, flags=re.M)


def setup(app):
    app.connect("source-read", _link_repository_files)
    app.connect("include-read", _link_included_files)
    app.connect("missing-reference", _reexported)
    app.connect("autodoc-process-signature", _signature, priority=100)  # before any handler that returns one
    return {"parallel_read_safe": True}
