"""Execute the notebooks in place at full size, so that their outputs (tables, figures) are committed
and the documentation site shows them as run (``make notebooks``; docs/conf.py never executes them).

    python notebooks/execute.py [notebooks/05_flax_drop_in.ipynb ...]   # default: every notebook

Each notebook runs top to bottom in a fresh kernel of this interpreter, with this clone first on
PYTHONPATH (the notebooks import the harness, experiments/); any error stops the run and leaves the
file unchanged. Takes about 5 to 15 minutes on a shared 2-core CPU.
"""

import os
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]


def execute(path: Path, timeout: int = 1800) -> float:
    """Run ``path`` in place (outputs replaced); returns the seconds it took."""
    nb = nbformat.read(path, as_version=4)
    start = time.perf_counter()
    NotebookClient(nb, kernel_name="python3", timeout=timeout,
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    nb.metadata.pop("widgets", None)
    nbformat.write(nb, path)
    return time.perf_counter() - start


def main(argv: list[str]) -> int:
    os.environ.pop("BPPSA_NOTEBOOK_SMOKE", None)  # full size: the committed outputs are the real ones
    os.environ["MPLBACKEND"] = "module://matplotlib_inline.backend_inline"
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in [str(ROOT), os.environ.get("PYTHONPATH", "")] if p)
    paths = [Path(a).resolve() for a in argv] or sorted((ROOT / "notebooks").glob("*.ipynb"))
    for path in paths:
        print(f"{path.name}: {execute(path):.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
