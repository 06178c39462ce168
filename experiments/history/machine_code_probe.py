"""The fused kernels' machine code at the issue-60 target sizes, with no GPU: every kernel lowered for
CUDA here (Pallas's Triton IR, as text) and compiled to sm_90a by pip ``triton==3.6.0`` (the GPU
machine's version; it ships ``ptxas`` and ``cuobjdump``) in a second interpreter: registers, spill
bytes, shared memory, grid, the main loop's instructions. The pipeline is the reference tool
``../shared/tools/compile_sm90.py`` (``--tool``); this script only picks the cases: the sequential
kernels at T = 1000, B = 16 and the largest hidden size each cell is accepted at (RNN and LSTM 64,
GRU 32), the scans at n = 30 000 (k = 1, 2, 20, 64; factored Q = 1, 4, 5 at S = 20, 40, 64: RNN,
GRU, LSTM), the diagonal GRU's Newton step at H = 20, 64, 256, 1024 and (T, B) = (4096, 16), (1024,
8). The entry points choose their warps by size unless ``--warps`` is given.

    python experiments/history/machine_code_probe.py OUT --tool ../shared/tools/compile_sm90.py \\
        --triton-python /path/to/triton-venv/bin/python [--warps 4] [--only SUBSTR]
        # about 4 min on a 2-core CPU; writes OUT/*.ttir ... *.sass, OUT/report.json, the table to stdout
"""

import argparse
import importlib.util
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def cases(warps):
    """(name, fn, args) for every kernel form at the target sizes."""
    import jax
    import jax.numpy as jnp

    from bppsa import cells, structured
    from bppsa.kernels.adjoint import fused_adjoint
    from bppsa.kernels.newton import fused_newton_step
    from bppsa.kernels.recurrence import fused_states
    from bppsa.kernels.scan import chunked_scan, chunked_scan_factored

    w = {} if warps is None else {"num_warps": warps}
    f32, sds, T, B, n = jnp.float32, jax.ShapeDtypeStruct, 1000, 16, 30_000
    dense = {"rnn": (lambda H: cells.RNN(1, H), (20, 64)), "gru": (lambda H: cells.GRU(12, H), (20, 32)),
             "lstm": (lambda H: cells.LSTM(12, H), (20, 64))}
    for name, (make, sizes) in dense.items():
        for H in sizes:
            cell = make(H)
            p, xs, s0 = cell.init(jax.random.key(0), f32), sds((T, B, cell.input_size), f32), sds((B, cell.state_size), f32)
            ss = sds((T, B, cell.state_size), f32)
            yield (f"recurrence_{name}_H{H}", (lambda c: lambda p, x, s: fused_states(c, p, x, s, **w))(cell), (p, xs, s0))
            yield (f"adjoint_{name}_H{H}", (lambda c: lambda p, x, s, a, b: fused_adjoint(c, p, x, s, a, b, **w))(cell),
                   (p, xs, s0, ss, ss))
    for k in (1, 2, 20, 64):  # block-diagonal (k < 20): B·20/k rows of k; dense: B rows
        rows = B * (20 // k if k < 20 else 1)
        yield (f"scan_k{k}", lambda v, M, d: chunked_scan(v, M, d, **w),
               (sds((rows, k), f32), sds((n, rows, k, k), f32), sds((n, rows, k), f32)))
    for Q, S in ((1, 20), (4, 20), (5, 40), (1, 64), (4, 64), (5, 64)):
        yield (f"scan_factored_Q{Q}_S{S}", lambda v, A, W, d: chunked_scan_factored(v, A, W, d, **w),
               (sds((B, S), f32), sds((Q, n, B, S), f32), sds((Q, S, S), f32), sds((n, B, S), f32)))
    for H in (20, 64, 256, 1024):
        for Tn, Bn in ((4096, 16), (1024, 8)):
            cell = structured.BlockGRU(64, H, head_size=1)
            yield (f"newton_gru_H{H}_T{Tn}_B{Bn}",
                   (lambda c: lambda p, x, s, h: fused_newton_step(c, p, x, s, h, **w))(cell),
                   (cell.init(jax.random.key(0), f32), sds((Tn, Bn, 64), f32), sds((Bn, H), f32),
                    sds((Tn, Bn, H), f32)))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--tool", required=True, help="the path of compile_sm90.py")
    ap.add_argument("--triton-python", required=True, help="a Python with triton==3.6.0")
    ap.add_argument("--warps", type=int, default=None, help="num_warps for every entry point (default: by size)")
    ap.add_argument("--only", default=None)
    a = ap.parse_args()
    spec = importlib.util.spec_from_file_location("compile_sm90", a.tool)
    assert spec is not None and spec.loader is not None, a.tool
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    picked = [c for c in cases(a.warps) if a.only is None or a.only in c[0]]
    rc = tool.dump(a.out, cases=picked)
    return rc or subprocess.call([a.triton_python, a.tool, "compile", a.out, "--json", f"{a.out}/report.json"])


if __name__ == "__main__":
    sys.exit(main())
