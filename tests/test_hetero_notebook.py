"""notebooks/03_hetero.ipynb runs top to bottom at small sizes (BPPSA_NOTEBOOK_SMOKE=1)."""

import os
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK = ROOT / "notebooks" / "03_hetero.ipynb"


def test_notebook_is_committed_without_outputs():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and all(not c.outputs and c.execution_count is None for c in code)
    assert "BPPSA_NOTEBOOK_SMOKE" in code[0].source  # the parameters cell comes first


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_notebook_runs_in_smoke_mode(monkeypatch):
    from nbclient import NotebookClient

    monkeypatch.setenv("BPPSA_NOTEBOOK_SMOKE", "1")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=4")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    NotebookClient(nb, timeout=500, kernel_name="python3", resources={"metadata": {"path": str(ROOT / "notebooks")}}).execute()
    out = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    assert "4 devices" in out and "weighted:" in out and "proportional-weighted" in out and "rebalance_every" in out
