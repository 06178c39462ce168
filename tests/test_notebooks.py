"""Every notebook in notebooks/ runs top to bottom at small size, and is committed with the outputs of
one full-size run (``python notebooks/execute.py``), which the documentation site shows as they are.

Executing a notebook starts a kernel (a fresh Python that imports JAX and compiles its cells), so
the default run executes one: the walkthrough, whose cells assert the maths (the Jacobians, the
scan's prefixes and the gradients against autodiff). The slow run (``make test-all``) executes
every notebook; the output and parameters checks run on every notebook by default.
"""

import json
import os
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
DEFAULT_RUN = "01_walkthrough"  # the notebook executed in the default run; the others are slow


def test_there_are_notebooks():
    names = {p.name for p in NOTEBOOKS}
    assert {"01_walkthrough.ipynb", "02_speedups.ipynb", DEFAULT_RUN + ".ipynb"} <= names


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_committed_with_the_outputs_of_one_clean_run(path):
    nb = nbformat.read(path, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    counts = [c.get("execution_count") for c in code]
    assert counts == list(range(1, len(code) + 1)), (
        f"{path.name}: execution counts {counts}; run `python notebooks/execute.py {path.relative_to(ROOT)}` "
        "(top to bottom, one fresh kernel) and commit the outputs")
    errors = [i for i, c in enumerate(nb.cells) for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors, f"{path.name}: cells {errors} carry an error"
    assert any("image/png" in o.get("data", {}) for c in code for o in c.get("outputs", [])), \
        f"{path.name}: no figure among its outputs"
    params = [c for c in nb.cells if "parameters" in c.get("metadata", {}).get("tags", [])]
    assert params, f"{path.name}: no cell tagged 'parameters'"
    assert "BPPSA_NOTEBOOK_SMOKE" in params[0].source, f"{path.name}: its parameters ignore BPPSA_NOTEBOOK_SMOKE"


@pytest.fixture(scope="module")
def kernel_name(tmp_path_factory, monkeypatch_module):
    """A kernelspec for *this* interpreter (so the kernel sees the same packages), in a temp dir."""
    root = tmp_path_factory.mktemp("jupyter")
    spec = root / "kernels" / "bppsa-test"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "bppsa tests", "language": "python"}))
    monkeypatch_module.setenv("JUPYTER_PATH", str(root))
    monkeypatch_module.setenv("BPPSA_NOTEBOOK_SMOKE", "1")
    monkeypatch_module.setenv("MPLBACKEND", "Agg")
    # the kernel imports this checkout's bppsa, not whichever one is installed
    monkeypatch_module.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    return "bppsa-test"


@pytest.fixture(scope="module")
def monkeypatch_module():
    mp = pytest.MonkeyPatch()
    yield mp
    mp.undo()


@pytest.mark.timeout(600)
@pytest.mark.parametrize("path", [p if p.stem == DEFAULT_RUN else pytest.param(p, marks=pytest.mark.slow)
                                  for p in NOTEBOOKS], ids=[p.stem for p in NOTEBOOKS])
def test_notebook_executes(path, kernel_name):
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, kernel_name=kernel_name, timeout=300,
                            resources={"metadata": {"path": str(path.parent)}})
    for cell in nb.cells:  # run afresh: the committed outputs are not what is checked here
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    client.execute()  # raises CellExecutionError (with the cell and traceback) on any failure
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors


def test_every_notebook_is_a_page_of_the_site():
    """docs/notebooks is the notebooks folder (a link), and docs/index.md lists every notebook."""
    assert (ROOT / "docs" / "notebooks").resolve() == ROOT / "notebooks"
    index = (ROOT / "docs" / "index.md").read_text()
    missing = [p.stem for p in NOTEBOOKS if f"notebooks/{p.name}\n" not in index]
    assert not missing, f"notebooks not in docs/index.md's toctree: {missing}"
    conf = (ROOT / "docs" / "conf.py").read_text()
    assert '"myst_nb"' in conf and 'nb_execution_mode = "off"' in conf
