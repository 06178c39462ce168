"""Kernel launches per call of a jitted program, counted from its compiled HLO.

    count(fn, *args) -> {"total", "top_level", "by_kind", "loops", "unknown_trip_counts", "copies", "exact"}

Where the time of a small-hidden-size RNN step goes on a GPU is mostly launch overhead: a
plain ``lax.scan`` backward runs its loop body's kernels T times, BPPSA's scan O(log T) times.
This module reads that off the program XLA compiled (``jax.jit(f).lower(*a).compile().as_text()``),
without running it:

- a ``fusion`` is one kernel (on a GPU: a generated kernel, a Triton fusion or a cuBLAS call in a
  ``kCustom`` fusion), a ``custom-call`` one (cuBLAS ``__cublas$gemm``, Pallas's
  ``__gpu$xla.gpu.triton``, cuDNN...), a ``dot``/``convolution`` left unfused one, and any other
  computing instruction one (on the CPU backend, which fuses less, these are most of them);
- instructions that only name or move buffers launch nothing (parameter, constant,
  get-tuple-element, tuple, bitcast, ...); ``copy`` is counted apart (``copies``: a memcpy, not a
  kernel, where XLA keeps it out of a fusion);
- a ``while`` loop counts its body's launches times its trip count, which XLA writes into the
  loop's ``backend_config`` (``"known_trip_count":{"n":"T"}``); a loop without one is counted once
  and listed in ``unknown_trip_counts`` (the total is then a lower bound, ``exact`` False). Its
  condition is not counted: with a known trip count XLA's GPU runtime does not evaluate it;
- ``call`` (e.g. the GPU's command-buffer outlining: kernels replayed as one CUDA graph, still
  kernels), ``async-start`` and ``conditional`` (the largest branch) count what they run.

On the GPU this is the number of kernels one call launches (up to the runtime's own bookkeeping);
on the CPU (the dry run) it is approximate: XLA CPU runs each counted instruction as a thunk.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from typing import Any

import jax

__all__ = ["NO_LAUNCH", "hlo_text", "count_text", "count"]

#: Instructions that launch nothing: names, views, control flow (counted by what it runs).
NO_LAUNCH = frozenset({
    "parameter", "constant", "get-tuple-element", "tuple", "bitcast", "while", "conditional", "call",
    "after-all", "add-dependency", "opt-barrier", "partition-id", "replica-id", "domain", "async-start",
    "async-update", "async-done", "copy-done", "send-done", "recv-done", "get-dimension-size",
})

_HEADER = re.compile(r"^(ENTRY\s+)?%?([\w.\-$]+)\s*\(.*\{\s*$")
_INSTR = re.compile(r"^\s+(?:ROOT\s+)?%?([\w.\-$]+)\s*=\s*(.*)$")
_OPCODE = re.compile(r"\s*([a-z][a-z0-9\-]*)\(")
_CALLED = re.compile(r"\b(calls|to_apply|body|condition|true_computation|false_computation)=%?([\w.\-$]+)")
_BRANCHES = re.compile(r"branch_computations=\{([^}]*)\}")
_TRIP = re.compile(r'"known_trip_count"\s*:\s*\{\s*"n"\s*:\s*"?(\d+)"?')
_TARGET = re.compile(r'custom_call_target="([^"]*)"')
_FUSION_KIND = re.compile(r'"kind"\s*:\s*"([^"]*)"')


def hlo_text(fn: Callable, *args: Any) -> str:
    """The optimised HLO text XLA compiled for ``fn(*args)``.

    Args:
      fn: a function of arrays; a jitted function (or a ``functools.partial`` of one, as
        :func:`experiments.gradient.gradient_functions` returns) is lowered as it is, so a
        program already run is found in JAX's caches rather than compiled again.
      *args: its arguments (arrays or pytrees of them).

    Returns:
      ``jax.jit(fn).lower(*args).compile().as_text()``.
    """
    inner = getattr(fn, "func", None)
    if inner is not None and hasattr(inner, "lower"):  # functools.partial(jitted, *bound)
        args = tuple(getattr(fn, "args", ())) + args
        fn = inner
    jitted: Any = fn if hasattr(fn, "lower") else jax.jit(fn)
    text = jitted.lower(*args).compile().as_text()
    if not isinstance(text, str):
        raise ValueError(f"XLA gave no HLO text for {getattr(fn, '__name__', fn)!r}")
    return text


def _shape_end(rest: str) -> int:
    """Index just past the result shape at the start of ``rest`` (a tuple shape is parenthesised)."""
    if not rest.startswith("("):
        return rest.find(" ") if " " in rest else len(rest)
    depth = 0
    for i, ch in enumerate(rest):
        depth += ch == "("
        depth -= ch == ")"
        if depth == 0:
            return i + 1
    return len(rest)


def _parse(text: str) -> tuple[dict[str, list[tuple[str, str]]], str | None]:
    """``({computation: [(opcode, the instruction's text after its shape)]}, entry name)``."""
    comps: dict[str, list[tuple[str, str]]] = {}
    entry, current = None, None
    for line in text.splitlines():
        if current is None:
            m = _HEADER.match(line)
            if m and not line.startswith(" "):
                current = m.group(2)
                comps[current] = []
                if m.group(1):
                    entry = current
            continue
        if line.startswith("}"):
            current = None
            continue
        m = _INSTR.match(line)
        if m is None:
            continue
        rest = m.group(2)
        rest = rest[_shape_end(rest):]
        op = _OPCODE.match(rest)
        if op:
            comps[current].append((op.group(1), rest))
    return comps, entry


def _kind(op: str, rest: str) -> str:
    """The launch's kind: "gemm", "triton" (Pallas and Triton fusions), "fusion", "custom-call" or "other"."""
    if op == "custom-call":
        m = _TARGET.search(rest)
        target = m.group(1).lower() if m else ""
        if "triton" in target:
            return "triton"
        return "gemm" if any(w in target for w in ("gemm", "cublas", "matmul", "dot")) else "custom-call"
    if op == "fusion":
        kinds = " ".join(_FUSION_KIND.findall(rest)).lower()
        if "triton" in kinds:
            return "triton"
        return "gemm" if any(w in kinds for w in ("gemm", "cublas", "matmul", "dot")) else "fusion"
    return "gemm" if op in ("dot", "convolution") else "other"


def count_text(text: str) -> dict:
    """Count the launches of one call of a compiled program from its HLO text (see the module docstring).

    Args:
      text: the optimised HLO module text (:func:`hlo_text`), GPU or CPU.

    Returns:
      ``{"total": kernels per call (loop bodies times their trip counts), "top_level": the entry
      computation's own kernels (each loop counted as 0), "by_kind": {kind: kernels per call},
      "loops": [{"trip_count": int or None, "body": the body's kernels per trip (nested loops
      multiplied out)}] for every loop met (a nested one once per enclosing path, listed before
      it), "unknown_trip_counts": loops counted once for want of a trip count, "copies": copies
      per call, "exact": no unknown trip count}``.
    """
    comps, entry = _parse(text)
    if entry is None:
        raise ValueError("no ENTRY computation in this HLO text")
    unknown, loops = [0], []

    def walk(name: str, seen: tuple) -> Counter:
        """Launches per call of computation ``name`` by kind ("copy" included), loops multiplied out."""
        c: Counter = Counter()
        if name in seen or name not in comps:  # a recursive or missing reference: nothing to count
            return c
        seen = seen + (name,)
        for op, rest in comps[name]:
            called = dict(_CALLED.findall(rest))
            if op == "while":
                m = _TRIP.search(rest)
                n = int(m.group(1)) if m else 1
                unknown[0] += m is None
                body = walk(called.get("body", ""), seen)
                loops.append({"trip_count": int(m.group(1)) if m else None,
                              "body": sum(v for k, v in body.items() if k != "copy")})
                c.update({k: v * n for k, v in body.items()})
            elif op in ("call", "async-start"):
                c.update(walk(called.get("to_apply", called.get("calls", "")), seen))
            elif op == "conditional":
                m = _BRANCHES.search(rest)
                names = [s.strip().lstrip("%") for s in (m.group(1) if m else "").split(",")]
                names += [called[k] for k in ("true_computation", "false_computation") if k in called]
                branches = [walk(b, seen) for b in names if b]
                if branches:
                    c.update(max(branches, key=lambda b: sum(b.values())))
            elif op == "copy":
                c["copy"] += 1
            elif op not in NO_LAUNCH:
                c[_kind(op, rest)] += 1
        return c

    total = walk(entry, ())
    copies = total.pop("copy", 0)
    top = sum(1 for op, _ in comps[entry] if op not in NO_LAUNCH and op != "copy")
    return {"total": sum(total.values()), "top_level": top, "by_kind": dict(sorted(total.items())), "loops": loops,
            "unknown_trip_counts": unknown[0], "copies": copies, "exact": unknown[0] == 0}


def count(fn: Callable, *args: Any) -> dict:
    """Kernel launches of one call of ``fn(*args)``, from the program XLA compiles for it.

    Args:
      fn: the function (jitted, a ``functools.partial`` of a jitted function, or plain: then jitted here).
      *args: its arguments.

    Returns:
      :func:`count_text`'s dict for :func:`hlo_text` ``(fn, *args)``.
    """
    return count_text(hlo_text(fn, *args))
