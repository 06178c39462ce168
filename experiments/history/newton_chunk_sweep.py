"""The fused Newton step's chunk length by the machine-code model: what four waves cost.

    python experiments/history/newton_chunk_sweep.py [--triton-python PY] [--H 20 64 256] [--C 64 32 16 8]

For each chunk length C (``default``: :func:`bppsa.kernels.newton.chunking`'s) and each head-1
BlockGRU (T = 4096, B = 16, I = 64, the peer points of
:mod:`experiments.gpu.peer_machine_code`), the Newton training step is exported for CUDA with the
chunk length forced (:func:`bppsa.kernels.newton.chunking` wrapped, JAX's caches cleared between
lengths), its kernels compiled to sm_90a by the machine-code check
(:mod:`experiments.gpu.machine_code`), and the launches of one Newton iteration
(``newton._reduce``, ``_carry``, ``_apply``) priced by its ``predict``. Prints a table and writes
``experiments/history/newton-chunks.json``. It times nothing: the first GPU run checks the model.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from experiments.gpu import machine_code as mc  # noqa: E402  (the repository on the path first)

OUT = ROOT / "experiments" / "history" / "newton-chunks.json"
ITERATION = ("newton._reduce", "newton._carry", "newton._apply")


def sweep(Hs: list[int], Cs: list[int | None], triton_python: str, work: Path) -> list[dict[str, Any]]:
    """Each (C, H)'s iteration: the three launches' grids, waves and predicted µs, and their sum."""
    import jax

    import bppsa.kernels.newton as newton

    chosen = newton.chunking
    rows: list[dict[str, Any]] = []
    try:
        for C in Cs:
            jax.clear_caches()  # the kernels' jitted entries would keep the last length's grid
            newton.chunking = (lambda T, tiles, chunk=None, C=C:  # type: ignore[assignment]
                               chosen(T, tiles, C if chunk is None else chunk))
            folder = work / f"C{C or 'default'}"
            points = [mc.Point(f"sweep H={H} C={C or 'default'}", "blockgru", 64, H, 4096, 16, mc.NEWTON, 1)
                      for H in Hs]
            record = mc.check_points(points, folder, triton_python)
            if record is None:
                raise RuntimeError(f"the compile side failed at C={C}")
            for p, H in zip(points, Hs, strict=True):
                launches: dict[str, Any] = {}
                for x in record["launches"]:
                    if x["point"] == p.name and x["label"] in ITERATION and x["label"] not in launches:
                        launches[x["label"]] = {"grid": x["grid"], "waves": x["waves"],
                                                "us": (x["predicted"] or {}).get("us")}
                total = sum(v["us"] for v in launches.values()) if all(v["us"] for v in launches.values()) else None
                grid = launches["newton._reduce"]["grid"]
                rows.append({"H": H, "C": C or chosen(4096, grid[1] * grid[2])[0], "default": C is None,
                             "launches": launches, "us_per_iteration": round(total, 2) if total else None})
    finally:
        newton.chunking = chosen
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python experiments/history/newton_chunk_sweep.py")
    ap.add_argument("--triton-python", default=str(mc.TRITON_PYTHON))
    ap.add_argument("--H", type=int, nargs="*", default=[20, 64, 256])
    ap.add_argument("--C", nargs="*", default=["default", "64", "32", "16", "8"])
    a = ap.parse_args(argv)
    Cs = [None if c == "default" else int(c) for c in a.C]
    rows = sweep(a.H, Cs, a.triton_python, Path(tempfile.mkdtemp(prefix="bppsa-newton-chunks-")))
    print("| H | C | default | reduce grid (waves) | carry µs | reduce µs | apply µs | µs an iteration |")
    print("|--:|--:|---|---|--:|--:|--:|--:|")
    for r in sorted(rows, key=lambda r: (r["H"], -r["C"], not r["default"])):
        red, car, app = (r["launches"].get(k, {}) for k in ITERATION)
        print(f"| {r['H']} | {r['C']} | {'yes' if r['default'] else ''} | {'×'.join(map(str, red.get('grid', [])))} "
              f"({red.get('waves')}) | {car.get('us')} | {red.get('us')} | {app.get('us')} | {r['us_per_iteration']} |")
    from experiments.provenance import provenance, save_json
    command = " ".join(["python experiments/history/newton_chunk_sweep.py", *(sys.argv[1:] if argv is None else argv)])
    save_json(OUT, {"provenance": provenance(command), "T": 4096, "B": 16, "I": 64, "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
