"""The package's layering (docs/architecture.md, "Layers"): imports go one way, no cycles, no private names.

Read from the source with ``ast`` (lazy imports inside functions count like top-level ones), so a
violation fails here even on a code path no other test runs.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "bppsa"

# Each layer may import only itself and the layers before it (docs/architecture.md). Matched by longest prefix.
LAYERS = [
    ("bppsa.errors", "bppsa.host", "bppsa.provenance", "bppsa.tables", "bppsa.timing", "bppsa.data", "bppsa._scan", "bppsa.scan", "bppsa.cells",
     "bppsa.structured"),
    ("bppsa.cost",),
    ("bppsa.options", "bppsa.newton", "bppsa._backward", "bppsa.backprop"),
    ("bppsa.parallel",),
    ("bppsa.nn", "bppsa.flax_cells", "bppsa.flax_structured", "bppsa._flax_state", "bppsa.train", "bppsa.tasks", "bppsa.sparse", "bppsa.vgg", "bppsa.hetero",
     "bppsa.sync"),
    ("bppsa.gradient", "bppsa.calibrate", "bppsa.baselines", "bppsa.bench"),
    ("bppsa.experiments",),
    ("bppsa.results", "bppsa.workdir", "bppsa.runner", "bppsa.cli"),
]
MAX_LINES = 450


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(PKG.rglob("*.py"))}


def _layer(module: str) -> int:
    best, rank = -1, None
    for i, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best:
                best, rank = len(prefix), i
    if rank is None:
        raise AssertionError(f"module {module} is in no layer of tests/test_architecture.py's LAYERS; "
                             "place it in docs/architecture.md's layers and here")
    return rank


def _resolve(importer: str, is_pkg: bool, node) -> list[str]:
    """The bppsa modules one import statement names (a name that is a submodule counts as it)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name == "bppsa" or a.name.startswith("bppsa.")]
    if node.level:
        base = importer.split(".") if is_pkg else importer.split(".")[:-1]
        base = base[: len(base) - (node.level - 1)]
        target = ".".join(base + ([node.module] if node.module else []))
    else:
        target = node.module or ""
    if not (target == "bppsa" or target.startswith("bppsa.")):
        return []
    out = []
    for a in node.names:
        sub = f"{target}.{a.name}"
        out.append(sub if sub in MODULES else target)
    return out


def _imports(module: str) -> list[tuple[str, int, list[str], object]]:
    path = MODULES[module]
    tree = ast.parse(path.read_text(), filename=str(path))
    is_pkg = path.name == "__init__.py"
    return [(module, node.lineno, _resolve(module, is_pkg, node), node)
            for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))]


def _graph() -> dict[str, set[str]]:
    g = {m: set() for m in MODULES}
    for m in MODULES:
        for _, _, targets, _ in _imports(m):
            g[m].update(t for t in targets if t != m and t in MODULES)
    return g


def test_every_module_is_in_a_layer():
    for m in MODULES:
        if m != "bppsa":
            _layer(m)


def test_imports_only_go_down():
    wrong = []
    for m in MODULES:
        if m == "bppsa":  # the root re-exports the public API
            continue
        for _, line, targets, _ in _imports(m):
            for t in targets:
                if t == "bppsa":
                    wrong.append(f"{MODULES[m].relative_to(ROOT)}:{line} imports the package root; "
                                 "import the module that defines the name")
                elif _layer(t) > _layer(m):
                    wrong.append(f"{MODULES[m].relative_to(ROOT)}:{line} ({m}, layer {_layer(m)}) imports "
                                 f"{t} (layer {_layer(t)})")
    assert not wrong, "imports that go up a layer:\n" + "\n".join(wrong)


def _cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(g[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles():
    g = _graph()
    # A package's __init__ re-exports its submodules; an edge from a submodule back to its own
    # package is how "from . import x" reads, so the package node is left out of the cycle check.
    for m in g:
        g[m] = {t for t in g[m] if not (m.startswith(t + ".") and MODULES[t].name == "__init__.py")}
    cycles = _cycles(g)
    assert not cycles, "import cycles (lazy imports included):\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


# Private modules (``bppsa._scan``, ``bppsa._backward``): the implementation behind a public face,
# importable inside the package and by tests, but not part of the API (``bppsa.__all__`` and each
# public module's ``__all__`` are).
MODULES_PRIVATE = {m for m in MODULES if m.split(".")[-1].startswith("_") and not m.endswith("__init__")}


def _private_uses(path: Path, own: str | None) -> list[str]:
    """Uses of another bppsa module's private names: ``from m import _x`` and ``alias._x`` (a
    private *module* is not a private name: see MODULES_PRIVATE)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    is_pkg = path.name == "__init__.py"
    aliases, bad = {}, []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("bppsa"):
                    aliases[a.asname or a.name.split(".")[0]] = a.asname and a.name or "bppsa"
        elif isinstance(node, ast.ImportFrom):
            targets = _resolve(own or "tests.x", is_pkg, node)
            for a, t in zip(node.names, targets):
                if not t:
                    continue
                if a.name.startswith("_") and not a.name.startswith("__") and t != own and t not in MODULES_PRIVATE:
                    bad.append(f"{path.relative_to(ROOT)}:{node.lineno} imports {t}.{a.name}")
                if t.endswith("." + a.name) or t == f"bppsa.{a.name}":
                    aliases[a.asname or a.name] = t
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases
                and node.attr.startswith("_") and not node.attr.startswith("__")
                and aliases[node.value.id] != own and f"{aliases[node.value.id]}.{node.attr}" not in MODULES_PRIVATE):
            bad.append(f"{path.relative_to(ROOT)}:{node.lineno} uses {node.value.id}.{node.attr}")
    return bad


def test_no_private_names_across_modules():
    bad = [b for m, p in MODULES.items() for b in _private_uses(p, m)]
    bad += [b for p in sorted((ROOT / "tests").rglob("*.py")) for b in _private_uses(p, None)]
    assert not bad, "uses of another module's private names:\n" + "\n".join(bad)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_module_size(module):
    n = len(MODULES[module].read_text().splitlines())
    assert n <= MAX_LINES, f"{MODULES[module].relative_to(ROOT)} has {n} lines; at most {MAX_LINES}"


def test_import_changes_nothing_in_the_process():
    """``import bppsa`` neither tunes the allocator nor installs a policy (a fresh interpreter)."""
    import subprocess
    import sys
    code = ("import os, bppsa, bppsa.host as h; "
            "assert not h.allocator_tuned(), 'import bppsa tuned the allocator'; "
            "print('ok')")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


def _declared_all(path: Path):
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            return ast.literal_eval(node.value)
    return None


@pytest.mark.parametrize("module", sorted(m for m in MODULES if m not in MODULES_PRIVATE
                                          and not m.startswith("bppsa.experiments")))
def test_every_public_module_lists_its_api(module):
    """``__all__`` is what a user is meant to call: present, and every name in it exists."""
    import importlib
    names = _declared_all(MODULES[module])
    if MODULES[module].name == "__init__.py" and names is None:
        return  # a package without re-exports
    assert names is not None, f"{MODULES[module].relative_to(ROOT)} has no __all__"
    mod = importlib.import_module(module)
    missing = [n for n in names if not hasattr(mod, n)]
    assert not missing, f"{module}.__all__ names what it does not define: {missing}"


def test_the_package_root_is_the_curated_api():
    import bppsa
    assert {"rnn", "Options", "cells", "scan", "BACKWARDS", "SCANS", "CostModel"} <= set(bppsa.__all__)
    assert not [n for n in bppsa.__all__ if n.startswith("_")]
    import bppsa.backprop
    assert bppsa.backprop.__all__ == ["rnn", "validate_inputs", "validate_params"]  # the pipeline is bppsa._backward
