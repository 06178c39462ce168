"""The compile side of :mod:`experiments.gpu.machine_code`: run BY PATH with the python of an
environment holding ``triton==3.6.0`` (never jax: the two embed different MLIRs)::

    .venv-triton/bin/python experiments/gpu/machine_code_compile.py DIR

DIR holds the dump side's ``manifest.json`` and ``<id>.ttir`` files. Each kernel is compiled by
``triton.compile(ttir, target=GPUTarget("cuda", 90, 32))`` to PTX and an sm_90a cubin (no GPU, no
driver), then read with the ``ptxas`` and ``cuobjdump`` that triton ships: ``ptxas -arch=sm_90a -v``
(registers, spill stores/loads, stack), ``cuobjdump --dump-resource-usage`` (registers, static
shared memory; triton's ``metadata.shared`` is the dynamic part) and ``cuobjdump -sass`` (every
instruction; a loop is a backward branch). Writes ``DIR/compiled.json``: ``versions`` and per
kernel id its row (or ``error``). Exit status 0 when it ran (the check's verdict is the dump side's).

The parsers and the H100 limits here use only the standard library, so the project's tests import
this module without triton.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

__all__ = ["H100", "parse_ptxas", "parse_resource_usage", "sass_instructions", "sass_loops", "sass_program",
           "opcode_kind", "access_bytes", "loop_trips", "occupancy", "compile_kernel", "read_machine_code", "tools",
           "tool_version", "main"]

#: The H100 (SXM, sm_90) limits the table uses.
H100 = {
    "sms": 132,
    "regs_per_sm": 65536,
    "smem_per_sm": 228 * 1024,
    "smem_per_block": 227 * 1024,  # the most a block may have (opt-in)
    "smem_reserved_per_block": 1024,
    "max_blocks_per_sm": 32,
    "max_warps_per_sm": 64,
    "reg_alloc_unit": 256,  # registers a warp, allocated in units of this
}


def parse_ptxas(text: str) -> dict[str, int]:
    """``ptxas -v``'s report of one kernel: registers, spill stores/loads (bytes), stack frame (bytes).

    Raises:
      ValueError: the text has no "Used N registers" line.
    """
    regs = re.search(r"Used (\d+) registers", text)
    if not regs:
        raise ValueError(f"no register count in ptxas's output: {text[:500]!r}")
    spill = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", text)
    stack = re.search(r"(\d+) bytes stack frame", text)
    return {"regs": int(regs.group(1)), "spill_store": int(spill.group(1)) if spill else 0,
            "spill_load": int(spill.group(2)) if spill else 0, "stack": int(stack.group(1)) if stack else 0}


def parse_resource_usage(text: str) -> dict[str, int]:
    """``cuobjdump --dump-resource-usage``'s figures of the (first) kernel ("Function NAME:" and the
    line after it): REG, STACK, SHARED, LOCAL, CONSTANT[0], ... as ints.

    Raises:
      ValueError: no kernel in the text.
    """
    m = re.search(r"Function [^\n]*:\s*\n([^\n]*)", text)
    if not m:
        raise ValueError(f"no kernel's resource usage in cuobjdump's output: {text[:500]!r}")
    return {k: int(v) for k, v in re.findall(r"([A-Z_]+(?:\[\d+\])?):(\d+)", m.group(1))}


_INSTRUCTION = re.compile(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")


def sass_instructions(sass: str) -> list[tuple[int, str, str]]:
    """The instructions of a ``cuobjdump -sass`` listing: (address, opcode, text), the predicate
    (``@P0``) skipped; the opcode keeps its modifiers ("FFMA.FTZ")."""
    out = []
    for line in sass.splitlines():
        m = _INSTRUCTION.match(line)
        if m:
            text = m.group(2).strip()
            words = text.split()
            op = words[1] if words[0].startswith("@") and len(words) > 1 else words[0]
            out.append((int(m.group(1), 16), op, text))
    return out


#: Instruction kinds of the table, by opcode (without modifiers).
KINDS = {
    "fp32": ("FFMA", "FMUL", "FADD", "FMNMX", "FSETP", "FSEL", "FCHK", "FSET", "FRND", "FSWZADD"),
    "mufu": ("MUFU",),
    "mma": ("HMMA", "HGMMA", "WGMMA", "IMMA", "DMMA"),
    "ldg": ("LDG",),
    "stg": ("STG", "RED", "ATOM", "ATOMG"),
    "lds": ("LDS", "LDSM"),
    "sts": ("STS",),
    "local": ("LDL", "STL"),
    "bar": ("BAR", "MEMBAR", "SYNCS", "WARPSYNC"),
    "shfl": ("SHFL",),
    "ctrl": ("BRA", "BSSY", "BSYNC", "EXIT", "CALL", "RET", "JMP", "BREAK", "WARPSYNC", "YIELD", "NOP"),
}
_KIND_OF = {op: kind for kind, ops in KINDS.items() for op in ops}


def opcode_kind(op: str) -> str:
    """The kind of an opcode ("FFMA.FTZ" -> "fp32"): one of :data:`KINDS`, else "int/other"."""
    return _KIND_OF.get(op.split(".")[0], "int/other")


def sass_loops(sass: str) -> list[dict[str, Any]]:
    """The loops of a SASS listing, largest first: each backward branch (target below its own
    address) closes one; per loop its span, instruction count, counts by :func:`opcode_kind` and
    the opcodes (without modifiers) with their counts."""
    ins = sass_instructions(sass)
    loops = []
    for addr, op, text in ins:
        if not op.startswith("BRA"):
            continue
        m = re.search(r"0x([0-9a-f]+)", text.split("BRA", 1)[1])
        if not m or int(m.group(1), 16) >= addr:
            continue
        lo = int(m.group(1), 16)
        loops.append({"start": lo, "end": addr, **_summary([o for a, o, _ in ins if lo <= a <= addr]),
                      "ldg_lead": load_lead([(o, t) for a, o, t in ins if lo <= a <= addr])})
    return sorted(loops, key=lambda d: -d["instructions"])


def _summary(body: list[str]) -> dict[str, Any]:
    """Instructions, counts by kind, global bytes a warp loads/stores, opcodes of a list of opcodes."""
    kinds: dict[str, int] = {}
    ops: dict[str, int] = {}
    moved = {"ldg": 0, "stg": 0}
    for o in body:
        kinds[opcode_kind(o)] = kinds.get(opcode_kind(o), 0) + 1
        ops[o.split(".")[0]] = ops.get(o.split(".")[0], 0) + 1
        if o.startswith(("LDG", "STG")):
            moved[opcode_kind(o)] += access_bytes(o) * 32
    return {"instructions": len(body), "kinds": kinds, "ldg_bytes": moved["ldg"], "stg_bytes": moved["stg"],
            "opcodes": dict(sorted(ops.items(), key=lambda kv: -kv[1]))}


def sass_program(sass: str) -> dict[str, Any]:
    """The whole kernel's SASS summarised as :func:`sass_loops` summarises a loop: every instruction
    once, up to the last EXIT (the branch-to-self and NOP padding after it left out)."""
    ops = [o for _, o, _ in sass_instructions(sass)]
    last = max((i for i, o in enumerate(ops) if o.startswith("EXIT")), default=len(ops) - 1)
    return {"start": 0, "end": None, **_summary(ops[:last + 1])}


def _registers(operand: str, width: int = 1) -> set[int]:
    """The registers an operand names ("R48" -> {48}; "R16.64" -> {16, 17}; "[R2+0x80]" -> {2})."""
    out: set[int] = set()
    for m in re.finditer(r"\bR(\d+)(\.64)?", operand):
        n = int(m.group(1))
        out.update(range(n, n + (2 if m.group(2) else width)))
    return out


def load_lead(body: list[tuple[str, str]]) -> int | None:
    """The fewest instructions of a loop between a global load and the first instruction that reads
    what it loaded (wrapping round the back edge: a load issued a step ahead leads by most of the
    loop), None without a global load. ``body``: the loop's (opcode, text) in order."""
    lead = None
    for i, (op, text) in enumerate(body):
        if not op.startswith("LDG"):
            continue
        args = text.split(op, 1)[1].split(",")
        loaded = _registers(args[0], access_bytes(op) // 4)
        for j in range(1, len(body) + 1):
            op2, text2 = body[(i + j) % len(body)]
            rest = text2.split(op2, 1)[1].split(",")
            store = op2.startswith(("STG", "STS", "ST."))
            read = set().union(*(_registers(a, access_bytes(op2) // 4 if store else 1)
                                 for a in (rest if store else rest[1:]))) if rest else set()
            if loaded & read:
                lead = j if lead is None else min(lead, j)
                break
    return lead


def access_bytes(op: str) -> int:
    """Bytes one thread moves with a global load or store ("LDG.E.128" -> 16; 4 without a width)."""
    mods = op.split(".")[1:]
    for m, n in (("128", 16), ("64", 8), ("U16", 2), ("S16", 2), ("U8", 1), ("S8", 1)):
        if m in mods:
            return n
    return 4


_CONST = re.compile(r"^\s*(%[\w.]+) = arith\.constant (-?\d+) : i(?:32|64)\s*$")
_SCALAR_OP = re.compile(r"^\s*(%[\w.]+) = arith\.(addi|subi|muli) (%[\w.]+), (%[\w.]+) : i(?:32|64)\s*$")
_FOR = re.compile(r"^(\s*)(?:%[\w.:]+ = )?scf\.for %[\w.]+ = (%[\w.]+) to (%[\w.]+) step (%[\w.]+)")


def loop_trips(ttir: str) -> list[int | None]:
    """The trip counts of a TTIR module's outermost ``scf.for`` loops, in order (None where a bound
    is not a constant of scalar additions and products)."""
    env: dict[str, int] = {}
    found: list[tuple[int, int | None]] = []
    for line in ttir.splitlines():
        m = _CONST.match(line)
        if m:
            env[m.group(1)] = int(m.group(2))
            continue
        m = _SCALAR_OP.match(line)
        if m and m.group(3) in env and m.group(4) in env:
            a, b = env[m.group(3)], env[m.group(4)]
            env[m.group(1)] = {"addi": a + b, "subi": a - b, "muli": a * b}[m.group(2)]
            continue
        m = _FOR.match(line)
        if m:
            lo, hi, step = (env.get(m.group(i)) for i in (2, 3, 4))
            trips = None if lo is None or hi is None or not step else max(0, -(-(hi - lo) // step))
            found.append((len(m.group(1)), trips))
    if not found:
        return []
    top = min(depth for depth, _ in found)
    return [t for depth, t in found if depth == top]


def occupancy(regs: int, warps: int, smem: int, static: int = 0, limits: dict[str, int] = H100) -> int:
    """Blocks of ``warps`` warps that fit one SM at ``regs`` registers a thread and ``smem`` bytes of
    shared memory a block (``static`` of them cuobjdump's static SHARED; 0 where one does not fit)."""
    unit = limits["reg_alloc_unit"]
    per_warp = -(-regs * 32 // unit) * unit
    by_regs = limits["regs_per_sm"] // (per_warp * warps) if regs else limits["max_blocks_per_sm"]
    # a block that uses shared memory also takes the reserved 1 KiB (cuobjdump's static SHARED
    # already counts it where the kernel has one)
    by_smem = (limits["smem_per_sm"] // max(smem, smem + limits["smem_reserved_per_block"] - static) if smem
               else limits["max_blocks_per_sm"])
    return max(0, min(by_regs, by_smem, limits["max_blocks_per_sm"], limits["max_warps_per_sm"] // warps))


def tools() -> tuple[str, str]:
    """The ptxas and cuobjdump that triton ships (paths)."""
    import triton  # pyright: ignore[reportMissingImports]  (the triton environment's, not the project's)
    bindir = Path(str(triton.__file__)).parent / "backends" / "nvidia" / "bin"
    return str(bindir / "ptxas"), str(bindir / "cuobjdump")


def compile_kernel(path: Path, num_warps: int, num_stages: int) -> dict[str, Any]:
    """Compile one TTIR file for sm_90a and read its machine code; writes ``.ptx``, ``.cubin`` and
    ``.sass`` beside it. Returns the row (see the module docstring)."""
    import triton  # pyright: ignore[reportMissingImports]
    from triton.backends.compiler import GPUTarget  # pyright: ignore[reportMissingImports]

    k = triton.compile(str(path), target=GPUTarget("cuda", 90, 32),
                       options={"num_warps": num_warps, "num_stages": num_stages})
    return read_machine_code(k, path.with_suffix(""), num_warps, path.read_text())


def read_machine_code(k: Any, stem: Path, num_warps: int, ttir: str) -> dict[str, Any]:
    """The row of a compiled kernel ``k`` (triton's ``CompiledKernel``): writes ``stem.ptx``,
    ``stem.cubin`` and ``stem.sass`` and reads them with ptxas and cuobjdump (the module
    docstring); ``ttir`` gives the loops' trip counts."""
    ptxas, cuobjdump = tools()
    ptx = k.asm["ptx"]
    Path(f"{stem}.ptx").write_text(ptx)
    Path(f"{stem}.cubin").write_bytes(k.asm["cubin"])
    target = re.search(r"\.target\s+(\w+)", ptx)
    arch = target.group(1) if target else "sm_90a"
    v = subprocess.run([ptxas, f"-arch={arch}", "-v", f"{stem}.ptx", "-o", os.devnull],
                       capture_output=True, text=True, check=True).stderr
    usage = parse_resource_usage(subprocess.run([cuobjdump, "--dump-resource-usage", f"{stem}.cubin"],
                                                capture_output=True, text=True, check=True).stdout)
    sass = subprocess.run([cuobjdump, "-sass", f"{stem}.cubin"], capture_output=True, text=True, check=True).stdout
    Path(f"{stem}.sass").write_text(sass)
    info = parse_ptxas(v)
    regs: int = usage.get("REG", info["regs"])  # the cubin's, which the launch uses
    row: dict[str, Any] = {"arch": arch, **info, "regs": regs}
    row["smem_static"], row["smem_dynamic"] = usage.get("SHARED", 0), int(k.metadata.shared)
    row["smem"] = row["smem_static"] + row["smem_dynamic"]
    row["blocks_per_sm"] = occupancy(regs, num_warps, row["smem"], row["smem_static"])
    row["sass_instructions"] = len(sass_instructions(sass))
    row["loops"] = sass_loops(sass)[:4]
    row["program"] = sass_program(sass)
    row["trips"] = loop_trips(ttir)
    row["ieee_dot"] = "mma" not in ptx  # Precision.HIGHEST: fma.rn.f32 only, no TF32 tensor-core op
    return row


def tool_version(tool: str) -> str:
    """A CUDA tool's version ("12.8.93"), from its ``--version``."""
    out = subprocess.run([tool, "--version"], capture_output=True, text=True).stdout
    m = re.search(r"release ([\d.]+), V([\d.]+)", out)
    return m.group(2) if m else out.strip().splitlines()[-1] if out.strip() else "?"


#: Seconds one kernel's compile may take (triton's passes, LLVM, ptxas) before it counts as a failure.
TIMEOUT = 600


def _compile_entry(args: tuple[str, str, int, int, float]) -> tuple[str, dict[str, Any]]:
    """Compile one kernel in a child process of its own (a timeout can end it), its row as JSON on stdout."""
    kid, path, warps, stages, timeout = args
    cmd = [sys.executable, str(Path(__file__).resolve()), "--kernel", path, str(warps), str(stages)]
    t0 = time.monotonic()
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return kid, {"error": f"timeout: no machine code after {timeout:.0f} s"}
    if r.returncode != 0 or not r.stdout.strip():
        return kid, {"error": f"compile process exited {r.returncode}: {r.stderr.strip()[-1500:]}"}
    return kid, {**json.loads(r.stdout.strip().splitlines()[-1]), "compile_s": round(time.monotonic() - t0, 1)}


def _one(path: str, warps: int, stages: int) -> int:
    try:
        row = compile_kernel(Path(path), warps, stages)
    except Exception as e:  # noqa: BLE001 -- a kernel that does not compile is a row, the check's failure
        row = {"error": f"{type(e).__name__}: {e}"[:2000]}
    print(json.dumps(row))
    return 0


def main(argv: list[str] | None = None) -> int:
    """``DIR [-j JOBS] [-t SECONDS]``: compile every kernel of DIR/manifest.json (JOBS at a time,
    default min(4, cores); each in a process of its own, ended after SECONDS, default
    :data:`TIMEOUT`) and write DIR/compiled.json."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--kernel"] and len(args) == 4:
        return _one(args[1], int(args[2]), int(args[3]))
    jobs, timeout = min(4, os.cpu_count() or 1), float(TIMEOUT)
    for flag in ("-j", "-t"):
        if flag in args:
            i = args.index(flag)
            value = args[i + 1]
            del args[i:i + 2]
            jobs, timeout = (max(1, int(value)), timeout) if flag == "-j" else (jobs, float(value))
    if len(args) != 1:
        print("usage: machine_code_compile.py DIR [-j JOBS] [-t SECONDS]", file=sys.stderr)
        return 2
    import triton  # pyright: ignore[reportMissingImports]

    folder = Path(args[0])
    manifest = json.loads((folder / "manifest.json").read_text())
    os.environ.setdefault("TRITON_CACHE_DIR", tempfile.mkdtemp(prefix="triton-cache-"))
    ptxas, cuobjdump = tools()
    result: dict[str, Any] = {"versions": {"triton": triton.__version__, "ptxas": tool_version(ptxas),
                                           "cuobjdump": tool_version(cuobjdump)}, "kernels": {}}
    work = [(kid, str(folder / k["file"]), k["num_warps"], k["num_stages"], timeout)
            for kid, k in manifest["kernels"].items()]
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(jobs) as pool:
        rows = dict(_report(kid, row, manifest) for kid, row in pool.map(_compile_entry, work))
    result["kernels"] = {kid: rows[kid] for kid, *_ in work}
    (folder / "compiled.json").write_text(json.dumps(result, indent=1))
    return 0


def _report(kid: str, row: dict[str, Any], manifest: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    k = manifest["kernels"][kid]
    brief = row.get("error", "")[:200] or (f"{row['regs']} regs, spill {row['spill_store']}/{row['spill_load']}"
                                            f" B, smem {row['smem']} B")
    print(f"{kid} {k['label']} ({k['num_warps']} warps): {brief}", file=sys.stderr, flush=True)
    return kid, row


if __name__ == "__main__":
    sys.exit(main())
