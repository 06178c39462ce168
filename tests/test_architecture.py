"""The package's layering (docs/architecture.md, "Layers"): imports go one way, no cycles, no private names.

Read from the source with ``ast`` (lazy imports inside functions count like top-level ones), so a
violation fails here even on a code path no other test runs.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "bppsa"
HARNESS = ROOT / "experiments"

# The library, one subpackage (or core module) a layer; each layer may import only itself and the
# layers before it (docs/architecture.md). Matched by longest prefix.
LAYERS = [
    ("bppsa.errors", "bppsa.host", "bppsa.scan", "bppsa.cells", "bppsa.kernels"),
    ("bppsa.plan",),
    ("bppsa.forward",),
    ("bppsa.backward",),
    ("bppsa.backprop",),
    ("bppsa.parallel",),
    ("bppsa.nn", "bppsa.sparse"),
    ("bppsa.tasks",),
    ("bppsa.hetero", "bppsa.sync"),
    # the harness (experiments/): above the whole library, never imported by it
    ("experiments.provenance", "experiments.tables", "experiments.data", "experiments.figures"),
    ("experiments.train", "experiments.gradient"),
    ("experiments.calibrate", "experiments.baselines", "experiments.bench"),
    ("experiments.paper_bppsa", "experiments.paper_hetero", "experiments.paper_sync", "experiments.extensions",
     "experiments.gpu"),
    ("experiments.index", "experiments.workdir", "experiments.configfile", "experiments.failures",
     "experiments.interrupt", "experiments.publish", "experiments.runner", "experiments.cli"),
]
ROOTS = ("bppsa", "experiments")  # the package roots: bppsa re-exports the API, experiments defines entry()
MAX_TOP_LEVEL_MODULES = 12  # bppsa/*.py: the core stays a few flat modules; concepts are subpackages


# The modules of both packages (the harness's configs and standalone scripts are files, not modules).
SOURCES = sorted(PKG.rglob("*.py")) + [p for p in sorted(HARNESS.rglob("*.py"))
                                       if not ({"configs"} & set(p.relative_to(HARNESS).parts)
                                               or p.relative_to(HARNESS).parts[0] in ("scripts", "history"))]
MODULES = {".".join(parts[:-1] if parts[-1] == "__init__" else parts): p
           for p, parts in ((p, p.relative_to(ROOT).with_suffix("").parts) for p in SOURCES)}
LIBRARY = {m for m in MODULES if m == "bppsa" or m.startswith("bppsa.")}


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
        return [a.name for a in node.names if a.name.split(".")[0] in ROOTS]
    if node.level:
        base = importer.split(".") if is_pkg else importer.split(".")[:-1]
        base = base[: len(base) - (node.level - 1)]
        target = ".".join(base + ([node.module] if node.module else []))
    else:
        target = node.module or ""
    if target.split(".")[0] not in ROOTS:
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


def test_every_module_is_in_a_layer():
    for m in MODULES:
        if m not in ROOTS:
            _layer(m)


def test_imports_only_go_down():
    wrong = []
    for m in MODULES:
        if m in ROOTS:  # bppsa re-exports the public API; experiments' root defines entry() and imports nothing
            continue
        for _, line, targets, _ in _imports(m):
            for t in targets:
                if t == "experiments":
                    continue
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
    g = {m: set() for m in MODULES}
    for m in MODULES:
        for _, _, targets, _ in _imports(m):
            g[m].update(t for t in targets if t != m and t in MODULES)
    # A package's __init__ re-exports its submodules; an edge from a submodule back to its own
    # package is how "from . import x" reads, so the package node is left out of the cycle check.
    for m in g:
        g[m] = {t for t in g[m] if not (m.startswith(t + ".") and MODULES[t].name == "__init__.py")}
    cycles = _cycles(g)
    assert not cycles, "import cycles (lazy imports included):\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


# Private modules (``bppsa.nn._state``): the implementation behind a public face,
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
                if a.name.split(".")[0] in ROOTS:
                    aliases[a.asname or a.name.split(".")[0]] = a.asname and a.name or a.name.split(".")[0]
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


def test_import_changes_nothing_in_the_process():
    """``import bppsa`` neither tunes the allocator nor installs a policy (a fresh interpreter)."""
    import subprocess
    import sys
    code = ("import os, bppsa, bppsa.host as h; "
            "assert not h.allocator_tuned(), 'import bppsa tuned the allocator'; "
            "print('ok')")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


PAPERS = ("experiments.paper_", "experiments.extensions")  # task modules: called by name from configs


@pytest.mark.parametrize("module", sorted(m for m in MODULES if m not in MODULES_PRIVATE
                                          and not m.startswith(PAPERS)))
def test_every_public_module_lists_its_api(module):
    """``__all__`` is what a user is meant to call: present, and every name in it exists."""
    import importlib
    names = next((ast.literal_eval(node.value) for node in ast.parse(MODULES[module].read_text()).body
                  if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__"
                                                          for t in node.targets)), None)
    if MODULES[module].name == "__init__.py" and names is None:
        return  # a package without re-exports
    assert names is not None, f"{MODULES[module].relative_to(ROOT)} has no __all__"
    mod = importlib.import_module(module)
    missing = [n for n in names if not hasattr(mod, n)]
    assert not missing, f"{module}.__all__ names what it does not define: {missing}"


def test_the_package_root_is_the_curated_api():
    import bppsa
    assert {"rnn", "Options", "Plan", "NewtonInfo", "lyapunov", "cells", "scan", "forward", "backward",
            "plan", "BACKWARDS", "SCANS", "CostModel"} <= set(bppsa.__all__)
    assert not [n for n in bppsa.__all__ if n.startswith("_")]
    import bppsa.backprop
    # the entry and its one prologue (the mesh entry calls it too); what it runs is bppsa.forward/backward
    assert bppsa.backprop.__all__ == ["rnn", "prologue", "Problem", "compiled_solver"]


CORE = ("scan", "plan", "forward", "backward")  # the core's subpackages, by concept


@pytest.mark.parametrize("package", CORE)
def test_the_core_is_subpackages_by_concept(package):
    """The core is the scan, the plan, the forward and the backward, each a subpackage whose docstring
    says what lives there and what it may import, and whose ``__init__`` only re-exports its modules."""
    init = PKG / package / "__init__.py"
    doc = ast.get_docstring(ast.parse(init.read_text())) or ""
    assert "May import" in doc, f"bppsa/{package}/__init__.py: say what it may import"
    defs = [n.name for n in ast.parse(init.read_text()).body if isinstance(n, (ast.FunctionDef, ast.ClassDef))]
    assert not defs, f"bppsa/{package}/__init__.py defines {defs}: code lives in its modules"
    assert not [p.name for p in PKG.glob("_*.py") if p.name != "__init__.py"], "no private flat core modules"


# --------------------------------------------------------------------------------------------
# The library apart from the harness.
# --------------------------------------------------------------------------------------------

def test_the_library_names_no_path_of_the_harness():
    """The library's docstrings, comments and data name a measurement by its record's name
    ("measurements: scan-optimisation", docs/measurements.md links it), never a path into experiments/."""
    bad = [f"{p.relative_to(ROOT)}:{i}" for p in sorted(PKG.rglob("*")) if p.suffix in (".py", ".json")
           for i, line in enumerate(p.read_text().splitlines(), 1) if "experiments/" in line or "experiments." in line]
    assert not bad, "paths of the harness inside the library:\n" + "\n".join(bad)
    records = (ROOT / "docs" / "measurements.md").read_text()
    named = {n for p in PKG.rglob("*") if p.suffix in (".py", ".json")
             for n in re.findall(r"measurements: ([A-Za-z0-9_-]+)", p.read_text())}
    assert named and not [n for n in named if f"[{n}](" not in records], "docs/measurements.md: link every record"


def test_the_library_imports_nothing_of_the_harness():
    """No bppsa module names experiments (read from the source, lazy imports included)."""
    wrong = [f"{MODULES[m].relative_to(ROOT)}:{line} imports {t}" for m in sorted(LIBRARY)
             for _, line, targets, _ in _imports(m) for t in targets if t.split(".")[0] == "experiments"]
    assert not wrong, "the library imports the harness:\n" + "\n".join(wrong)


def test_importing_the_library_loads_no_harness_and_no_extra():
    """``import bppsa`` and every subpackage (a fresh interpreter): no module of experiments/ and
    none of the harness's or the extras' dependencies is loaded."""
    import subprocess
    import sys
    code = ("import sys, bppsa, bppsa.nn, bppsa.parallel, bppsa.sparse, bppsa.tasks, bppsa.hetero, bppsa.sync, "
            "bppsa.sync.ray_runtime; "
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('experiments', 'ray', 'librosa', 'soundfile', "
            "'ml_collections', 'orbax', 'matplotlib', 'tqdm', 'sklearn')); print(bad)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=180)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]", f"importing the library loaded {r.stdout.strip()}"


def test_import_loads_no_pallas():
    """``import bppsa`` (and a plain bppsa.rnn) leaves Pallas unloaded: the kernels load where asked for."""
    import subprocess
    import sys
    code = ("import sys, jax.numpy as jnp, bppsa; from bppsa import cells; c = cells.GRU(2, 3); "
            "bppsa.rnn(c, c.init(__import__('jax').random.key(0)), jnp.ones((4, 1, 2)), jnp.zeros((1, 3))); "
            "print('jax.experimental.pallas' in sys.modules, bppsa.kernels.__name__, "
            "'jax.experimental.pallas' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=180)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["False", "bppsa.kernels", "True"]


def test_the_library_layout():
    """bppsa/ is the library: a few flat core modules, concepts as subpackages, no experiments folder."""
    top = sorted(p.name for p in PKG.glob("*.py"))
    assert len(top) <= MAX_TOP_LEVEL_MODULES, f"bppsa/ has {len(top)} top-level modules: {top}"
    assert not (PKG / "experiments").exists()
    assert {"nn", "parallel", "sparse", "hetero", "sync", "tasks"} <= {p.name for p in PKG.iterdir() if p.is_dir()}
    hooks = [f"{p.relative_to(ROOT)}" for p in [*PKG.rglob("*.py"), *HARNESS.rglob("*.py")]
             if "addaudithook" in p.read_text()]
    assert not hooks, f"sys.addaudithook in {hooks}"


@pytest.mark.parametrize("package", sorted(m for m in LIBRARY if MODULES[m].name == "__init__.py" and m != "bppsa"))
def test_every_subpackage_says_what_lives_there(package):
    doc = ast.get_docstring(ast.parse(MODULES[package].read_text()))
    assert doc and len(doc.split()) >= 10, f"{MODULES[package].relative_to(ROOT)}: a module docstring saying what lives there"


def test_the_tests_mirror_the_packages():
    """One test folder per subpackage of bppsa (tests/core: the flat core modules) and one for the harness."""
    folders = {p.name for p in (ROOT / "tests").iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    subpackages = {p.name for p in PKG.iterdir() if (p / "__init__.py").exists()}
    assert subpackages | {"core", "experiments"} == folders, \
        f"no test folder for {sorted(subpackages | {'core', 'experiments'} - folders)}; no package for {sorted(folders - subpackages - {'core', 'experiments'})}"
    for folder in folders:
        assert list((ROOT / "tests" / folder).glob("test_*.py")), f"tests/{folder} holds no tests"


# --------------------------------------------------------------------------------------------
# The core's public API is annotated.
# --------------------------------------------------------------------------------------------

ANNOTATED = ("cells/base", "cells/recurrent", "cells/block", "cells/structure", "scan/*", "plan/options", "forward/*", "backward/*", "backprop",
             "host")


def _unannotated(source: str, where: str) -> list[str]:
    """``where:line name`` of each public function, and method of a public class (``__init__`` and
    ``__call__`` included), that leaves a parameter other than self/cls, or its return (except
    ``__init__``'s), unannotated."""
    out = []

    def visit(body, cls):
        for node in body:
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                visit(node.body, node.name)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if node.name.startswith("_") and node.name not in ("__init__", "__call__"):
                    continue
                a = node.args
                params = [*a.posonlyargs, *a.args, *a.kwonlyargs, *(p for p in (a.vararg, a.kwarg) if p)]
                missing = [p.arg for p in params if p.annotation is None and not (cls and p.arg in ("self", "cls"))]
                if missing or (node.returns is None and node.name != "__init__"):
                    out.append(f"{where}:{node.lineno} {cls + '.' if cls else ''}{node.name}")

    visit(ast.parse(source).body, None)
    return out


def _undocumented(source: str, where: str) -> list[str]:
    """The functions and classes of a module's ``__all__`` whose docstring lacks their sections: a
    function with parameters ``Args:``, one that returns something ``Returns:``; a class with
    fields or a constructor ``Args:`` or ``Attributes:``."""
    tree = ast.parse(source)
    names = next((ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign)
                  and any(isinstance(t, ast.Name) and t.id == "__all__" for t in n.targets)), [])
    out = []
    for node in tree.body:
        if not isinstance(node, (ast.FunctionDef, ast.ClassDef)) or node.name not in names:
            continue
        if any(ast.unparse(d) in ("overload", "typing.overload") for d in node.decorator_list):
            continue  # a typing stub: the implementation after it holds the docstring
        doc = ast.get_docstring(node) or ""
        if isinstance(node, ast.FunctionDef):
            a = node.args
            has_params = bool([*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg] != [None, None])
            returns = not (node.returns is not None and ast.unparse(node.returns) == "None")
            ok = (not has_params or "Args:" in doc) and (not returns or "Returns:" in doc or "Yields:" in doc)
        else:
            fields = [b for b in node.body if (isinstance(b, ast.AnnAssign) and "ClassVar" not in ast.unparse(b.annotation))
                      or (isinstance(b, ast.FunctionDef) and b.name == "__init__")]
            ok = not fields or "Args:" in doc or "Attributes:" in doc
        if not ok:
            out.append(f"{where}:{node.lineno} {node.name}")
    return out


def test_the_public_api_says_its_arguments_and_results():
    """Every public function and class of the library (its module's ``__all__``) documents its
    arguments and result in Args/Returns sections (with shapes where arrays are involved)."""
    probe = ('__all__ = ["f", "g", "C", "D"]\n'
             'def f(a):\n    """Args:\n      a: x.\n\n    Returns:\n      y.\n    """\n'
             'def g(a):\n    """Does g."""\n'
             'class C:\n    """Attributes:\n      n: x.\n    """\n    n: int\n'
             'class D:\n    """A D."""\n    n: int\n'
             'def _h(a): ...\n')
    assert _undocumented(probe, "probe") == ["probe:9 g", "probe:16 D"]
    bad = [b for m, p in MODULES.items() if m in LIBRARY for b in _undocumented(p.read_text(), str(p.relative_to(ROOT)))]
    assert not bad, "public functions and classes without Args/Returns:\n" + "\n".join(bad)


def test_the_core_is_annotated():
    """Every public function and method of the core modules annotates its parameters and return."""
    probe = ("def f(a, b: int) -> int: ...\ndef g(a: int): ...\ndef _h(a): ...\n"
             "class C:\n    def __init__(self, a: int): ...\n    def m(self, a) -> None: ...\n"
             "class _D:\n    def m(self, a): ...\n")
    assert _unannotated(probe, "probe") == ["probe:1 f", "probe:2 g", "probe:6 C.m"]
    bad = []
    for name in ANNOTATED:
        paths = sorted(PKG.glob(f"{name}.py"))
        assert paths, f"bppsa/{name}.py is gone: update ANNOTATED"
        for path in paths:
            bad += _unannotated(path.read_text(), str(path.relative_to(ROOT)))
    assert not bad, "public functions with unannotated parameters or return:\n" + "\n".join(bad)


def _library_sources():
    for path in sorted((ROOT / "bppsa").rglob("*.py")):
        yield path.relative_to(ROOT).as_posix(), ast.parse(path.read_text())


def test_decided_once_and_dispatched_once():
    """Every choice is the plan's: no module outside bppsa/plan compares ``kernels`` to a string or
    reaches the kernels' modules (bppsa/plan/backends.py is the one dispatch), ``closure.lift`` is
    called in one place (the entries' prologue), and every custom_jvp/custom_vjp is the one rule's
    (bppsa/backward/)."""
    compares, kernel_imports, lifts, custom, decided = [], [], [], [], []
    for where, tree in _library_sources():
        in_plan, in_kernels = where.startswith("bppsa/plan/"), where.startswith("bppsa/kernels/")
        for node in ast.walk(tree):
            if isinstance(node, ast.Compare) and not in_plan and not in_kernels:
                sides = [node.left, *node.comparators]
                names = {s.attr for s in sides if isinstance(s, ast.Attribute)} | \
                    {s.id for s in sides if isinstance(s, ast.Name)}
                if "kernels" in names and any(isinstance(s, ast.Constant) and isinstance(s.value, str) for s in sides):
                    compares.append(f"{where}:{node.lineno}")
                # which backward runs is the plan's (plan.adjoint, plan.differentiation), not plan.backward's
                if any(isinstance(s, ast.Attribute) and s.attr == "backward" and isinstance(s.value, ast.Name)
                       and s.value.id == "plan" for s in sides):
                    decided.append(f"{where}:{node.lineno} plan.backward")
            # whether BPTT runs the cell's analytic adjoint is decided while planning (Plan.cell_adjoint)
            if isinstance(node, ast.Attribute) and node.attr == "has_adjoint" and not in_plan \
                    and not where.startswith("bppsa/cells/") and not where.startswith("bppsa/nn/"):
                decided.append(f"{where}:{node.lineno} has_adjoint")
            if isinstance(node, (ast.Import, ast.ImportFrom)) and not in_plan and not in_kernels \
                    and where != "bppsa/__init__.py":  # the package root: bppsa.kernels as a public module
                mods = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                    [node.module or ""] + [f"{node.module}.{a.name}" for a in node.names]
                if any(m == "bppsa.kernels" or m.startswith("bppsa.kernels.") for m in mods):
                    kernel_imports.append(f"{where}:{node.lineno}")
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "lift" \
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "closure":
                lifts.append(where)
            if isinstance(node, ast.Attribute) and node.attr in ("custom_jvp", "custom_vjp") \
                    and not where.startswith("bppsa/backward/"):
                custom.append(f"{where}:{node.lineno}")
    assert not compares, f"kernels compared to a string below the plan: {compares}"
    assert not decided, f"the backward decided below the plan: {decided}"
    assert not kernel_imports, f"the kernels reached outside the plan's dispatch (bppsa/plan/backends.py): {kernel_imports}"
    assert lifts == ["bppsa/backprop.py"], lifts
    assert not custom, f"a custom_jvp/custom_vjp outside bppsa/backward/: {custom}"


def test_a_plan_is_its_own_type():
    """``Plan`` is not an ``Options``: every field concrete, its own frozen type."""
    from bppsa.plan.options import Options, Plan
    assert not issubclass(Plan, Options) and Plan.__dataclass_params__.frozen  # type: ignore[attr-defined]


def test_each_cells_maths_once():
    """The kernels ask the cell for its step (``gate_step``, given the recurrent products they compute):
    no activation, gate or per-cell step function is written in bppsa/kernels/."""
    for where, tree in _library_sources():
        if not where.startswith("bppsa/kernels/"):
            continue
        names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} | \
            {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
        assert not names & {"ACTIVATIONS", "sigmoid", "tanh"}, (where, names & {"ACTIVATIONS", "sigmoid", "tanh"})
        steps = [n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name.endswith("_step")
                 and n.name.lstrip("_").split("_")[0] in ("rnn", "gru", "lstm")]
        assert not steps, (where, steps)
