"""The compile side of :mod:`experiments.gpu.peer_machine_code`: pararnn-torch's fused Newton step
of the diagonal GRU compiled to sm_90a, no GPU and no torch. Run BY PATH with the python of the
environment holding ``triton==3.6.0`` (never jax)::

    .venv-triton/bin/python experiments/gpu/pararnn_compile.py SRC OUT --T 4096 --B 16 --H 20 64 256

SRC is the folder the pararnn-torch wheel unzips to (it holds ``pararnn/``). Its kernel modules
(``pararnn/kernels/newton_gru.py``, ``scan_diag.py``, ``_fused_common.py``, ``precision.py``) are
imported as files with a stand-in ``torch`` module (they use torch only in their host code, which
is not run) and without ``pararnn/__init__.py``. Each Triton kernel that
``newton_gru._newton_gru_fused_impl`` launches is compiled with the launch's own arguments: the
arguments are rebuilt as that function builds them (float32, contiguous ``wx`` (B, T, 3H), ``h``
(B, T, H), chunk aggregates (B, T/128, H)) and specialised by triton's own
``native_specialize_impl`` (an int equal to 1 becomes a constant, multiples of 16 and aligned
pointers get ``tt.divisibility`` 16), as ``JITFunction.run`` does on the GPU; triton's default
warps (4) and stages (3). The machine code is read by :func:`machine_code_compile.read_machine_code`.

Writes ``OUT/pararnn_compiled.json``: ``versions``, ``kernels`` {id: row (+ ``label``,
``num_warps``, ``num_stages``)} and ``launches`` [{H, kernel, label, grid, per}] with ``per``
"forward" (once a forward) or "iteration" (once a Newton iteration).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import tempfile
import types
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run by path: the repository's experiments package
from experiments.gpu.machine_code_compile import read_machine_code, tool_version, tools  # noqa: E402

__all__ = ["BLOCK_T", "BLOCK_D", "CHUNK_PAD", "NUM_WARPS", "NUM_STAGES", "load_kernels", "launches",
           "compile_launch", "main"]

BLOCK_T, BLOCK_D, CHUNK_PAD = 128, 32, 64  # newton_gru's and scan_diag's tiles (read back from the modules)
NUM_WARPS, NUM_STAGES = 4, 3  # triton's defaults for CUDA: pararnn's launches name none


class _Tensor:
    """What triton's specialisation reads of a tensor argument: ``data_ptr`` and ``dtype``."""

    def __init__(self, *shape: int):
        self.shape = shape
        self.dtype = "torch.float32"

    def data_ptr(self) -> int:
        return 1 << 20  # the caching allocator's blocks are 512-byte aligned

    def stride(self) -> tuple[int, ...]:
        out, s = [], 1
        for n in reversed(self.shape):
            out.append(s)
            s *= n
        return tuple(reversed(out))


def load_kernels(src: Path) -> dict[str, Any]:
    """pararnn's kernel modules from the unzipped wheel, imported with a stand-in ``torch``."""
    fake = types.ModuleType("torch")
    fake.Tensor = object  # type: ignore[attr-defined]
    for name in ("float16", "bfloat16", "float32"):
        setattr(fake, name, f"torch.{name}")
    fake.compiler = types.SimpleNamespace(is_compiling=lambda: False)  # type: ignore[attr-defined]
    sys.modules.setdefault("torch", fake)
    for pkg in ("pararnn", "pararnn.kernels"):  # the packages without their __init__ (torch, nn, cells)
        mod = types.ModuleType(pkg)
        mod.__path__ = [str(src / pkg.replace(".", "/"))]  # type: ignore[attr-defined]
        sys.modules[pkg] = mod
    mods = {}
    for name in ("precision", "_fused_common", "scan_diag", "newton_gru"):
        full = f"pararnn.kernels.{name}"
        spec = importlib.util.spec_from_file_location(full, src / "pararnn" / "kernels" / f"{name}.py")
        assert spec and spec.loader
        mod = importlib.util.module_from_spec(spec)
        sys.modules[full] = mod
        spec.loader.exec_module(mod)
        mods[name] = mod
    return mods


def launches(mods: dict[str, Any], T: int, B: int, H: int) -> list[tuple[str, Any, tuple, dict, tuple[int, ...]]]:
    """(per, kernel, args, constexprs, grid) of every Triton launch of ``_newton_gru_fused_impl``
    (T > 128: more than one chunk, the ``_gru_apply_update_kernel`` path) and the chunk scan it
    calls (``scan_diag._incl_pad64``, T <= 128 * 64), in launch order."""
    ng, sd = mods["newton_gru"], mods["scan_diag"]
    bt, bd, pad = ng._BLOCK_T, ng._BLOCK_D, sd._CHUNK_PAD
    assert (bt, bd, pad) == (BLOCK_T, BLOCK_D, CHUNK_PAD), (bt, bd, pad)
    nc, nd = -(-T // bt), -(-H // bd)
    if not 1 < nc <= pad:
        raise ValueError(f"T={T} gives {nc} chunks of {bt}: this check covers 1 < chunks <= {pad}")
    wx, h, h0, a = _Tensor(B, T, 3 * H), _Tensor(B, T, H), _Tensor(B, H), _Tensor(H)
    j_loc, r_loc = _Tensor(B, T, H), _Tensor(B, T, H)
    agg_j, agg_r, incl_j, incl_r = (_Tensor(B, nc, H) for _ in range(4))
    cs, n_seq, btab = a, 0, h0  # no cu_seqlens, no block table: dummy pointers, as the host code passes
    tiles = {"BLOCK_T": bt, "BLOCK_D": bd, "HAS_CU": False, "HAS_BT": False}
    grid = (B, nc, nd)
    init = (wx, h, a, a, a, h0, H, T, *wx.stride(), *h.stride(), *h0.stride(), cs, n_seq, btab)
    local = (h, wx, a, a, a, h0, j_loc, r_loc, agg_j, agg_r, T, H, *h.stride(), *h0.stride(), *wx.stride(),
             *j_loc.stride(), *r_loc.stride(), *agg_j.stride(), *agg_r.stride(), cs, n_seq, btab)
    incl = (agg_j, agg_r, incl_j, incl_r, nc, H, *agg_j.stride(), *agg_r.stride(), *incl_j.stride(),
            *incl_r.stride())
    apply = (h, j_loc, r_loc, incl_r, T, H, 1.0, *h.stride(), *j_loc.stride(), *r_loc.stride(), *incl_r.stride())
    return [("forward", ng._gru_init_kernel, init, tiles, grid),
            ("iteration", ng._gru_cell_local_scan_kernel, local, tiles, grid),
            ("iteration", sd._chunk_incl_kernel, incl, {"CHUNK_PAD": pad, "BLOCK_D": bd}, (B, nd)),
            ("iteration", ng._gru_apply_update_kernel, apply, {"BLOCK_T": bt, "BLOCK_D": bd}, grid)]


def compile_launch(fn: Any, args: tuple, constexprs: dict[str, Any], stem: Path) -> dict[str, Any]:
    """Compile one launch for sm_90a as ``JITFunction.run`` would (the module docstring)."""
    import triton  # pyright: ignore[reportMissingImports]
    from triton._C.libtriton import native_specialize_impl  # pyright: ignore[reportMissingImports]
    from triton.backends.compiler import BaseBackend, GPUTarget  # pyright: ignore[reportMissingImports]

    names = fn.arg_names
    values = list(args) + [constexprs[n] for n in names[len(args):]]
    if len(values) != len(names):
        raise ValueError(f"{fn.__name__}: {len(values)} arguments for {len(names)} parameters {names}")
    signature, consts, attrs = {}, {}, {}
    for i, (name, v) in enumerate(zip(names, values)):
        if name in constexprs:
            signature[name], consts[(i,)] = "constexpr", v
            continue
        ty, attr = native_specialize_impl(BaseBackend, v, False, True, True)
        signature[name] = ty
        if ty == "constexpr":
            consts[(i,)] = v
        elif isinstance(attr, str) and attr:
            attrs[(i,)] = BaseBackend.parse_attr(attr)
    src = triton.compiler.ASTSource(fn=fn, signature=signature, constexprs=consts, attrs=attrs)
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": NUM_WARPS,
                                                                       "num_stages": NUM_STAGES})
    ttir = k.asm["ttir"]
    Path(f"{stem}.ttir").write_text(ttir)
    row = read_machine_code(k, stem, NUM_WARPS, ttir)
    row["signature"] = {n: (f"{signature[n]}={values[i]}" if signature[n] == "constexpr" else signature[n])
                        for i, n in enumerate(names)}
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Compile pararnn-torch's fused diagonal-GRU Newton step for sm_90a.")
    ap.add_argument("src", help="the unzipped pararnn-torch wheel (holds pararnn/)")
    ap.add_argument("out", help="where pararnn_compiled.json and the PTX/cubin/SASS go")
    ap.add_argument("--T", type=int, default=4096)
    ap.add_argument("--B", type=int, default=16)
    ap.add_argument("--H", type=int, nargs="+", default=[256])
    a = ap.parse_args(argv)
    import os

    import triton  # pyright: ignore[reportMissingImports]
    os.environ.setdefault("TRITON_CACHE_DIR", tempfile.mkdtemp(prefix="triton-cache-"))
    mods = load_kernels(Path(a.src))
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    ptxas, cuobjdump = tools()
    result: dict[str, Any] = {"versions": {"triton": triton.__version__, "ptxas": tool_version(ptxas),
                                           "cuobjdump": tool_version(cuobjdump)},
                              "T": a.T, "B": a.B, "kernels": {}, "launches": []}
    for H in a.H:
        for per, fn, args, consts, grid in launches(mods, a.T, a.B, H):
            kid = f"{fn.__name__}.H{H}"
            try:
                row = compile_launch(fn, args, consts, out / kid)
            except Exception as e:  # noqa: BLE001 -- a kernel that does not compile is a row
                row = {"error": f"{type(e).__name__}: {e}"[:2000]}
            label = f"{fn.fn.__module__.rsplit('.', 1)[-1]}.{fn.__name__}"
            result["kernels"][kid] = {"label": label, "num_warps": NUM_WARPS, "num_stages": NUM_STAGES, **row}
            result["launches"].append({"H": H, "kernel": kid, "label": label, "grid": list(grid), "per": per})
            brief = row.get("error", "")[:200] or f"{row['regs']} regs, spill {row['spill_store']}/{row['spill_load']}"
            print(f"{kid}: {brief}", file=sys.stderr, flush=True)
    (out / "pararnn_compiled.json").write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
