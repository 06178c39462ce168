"""This machine: its CPU's name, the allocator settings the BPPSA backward needs to run at speed,
and the one timing protocol by which every wall-clock number of bppsa is measured on it.

**The allocator.** XLA's CPU runtime allocates the temporaries of a compiled function on every
call. The BPPSA backward's temporaries are large (the Jacobians, T·B·S² floats, and every up-sweep
level), and with glibc's default settings a freed block of more than a few MB is handed back to
the kernel (``munmap`` or heap trimming), so the next call gets fresh pages and takes one page
fault per 4 KiB it touches; BPTT's backward barely faults either way (the measurements:
measurements: scan-optimisation).

:func:`tune_allocator` keeps freed memory in the process for reuse: glibc ``mallopt`` with
``M_MMAP_MAX = 0`` (large blocks come from the heap, not from fresh mappings),
``M_TRIM_THRESHOLD`` at its maximum (the heap is not shrunk on free) and ``M_TOP_PAD = 64 MiB``.
The price is that the process keeps its peak heap size after a large computation, as JAX's own
GPU allocator does by design. ``import bppsa`` changes nothing; the first :func:`bppsa.rnn` call
on a CPU backend applies the settings (the ``bppsa`` command and the benchmarks call
:func:`tune_allocator` at start-up too), so a library user gets the fast path without an extra
call. Set ``BPPSA_MALLOC_TUNING=0`` to keep glibc's defaults everywhere. Settings you made
yourself (``MALLOC_*_`` environment variables or ``GLIBC_TUNABLES`` with ``glibc.malloc``
entries) are respected: the tuning is then skipped. Other C libraries (musl, macOS) are left alone.

**The timing protocol** (:func:`time_interleaved`): steady-state blocks, rotated order, medians
with their spread.

1. each function is called ``warmup`` times first, untimed (the first call compiles; with
   ``warmup=0`` the compile is the dropped first call of the function's first block);
2. then, for ``repeats`` rounds, each function runs a *block* of ``block`` consecutive calls,
   each ended by ``jax.block_until_ready``; the first call of every block is dropped (it pays
   for whatever ran before it: caches evicted and allocator state left by the previous
   function), the others are the samples;
3. the order of the blocks rotates every round, so that no function always opens the round. In a
   rotation a function mostly follows the same other one: what protects the samples from the
   order effect is step 2's dropped first call, the only call that follows another program (a
   call right after another program's long loop can be much slower than the same call one
   later; measurements: scan-optimisation, round 4);
4. each function's samples are summarised by :func:`stats`: median, min and max.

Interleaving makes ratios fair on a noisy machine: every function sees the same load.
"""

from __future__ import annotations

import ctypes
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any, Callable

import jax
import numpy as np
import numpy.typing as npt

__all__ = ["cpu_model", "tune_allocator", "allocator_tuned", "user_malloc_settings", "stats", "time_interleaved",
           "time_fn"]

_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_MAX = -1, -2, -4
_STATE = {"tuned": False}


def tune_allocator() -> bool:
    """Apply the glibc settings described in the module docstring. Returns True if applied.

    A no-op (False) when ``BPPSA_MALLOC_TUNING=0``, when the user configured glibc's malloc
    through the environment, on a platform other than Linux, or when the C library has no
    ``mallopt`` (not glibc). Safe to call more than once.

    Returns:
      True when the settings are in force in this process, else False.
    """
    if _STATE["tuned"]:
        return True
    if os.environ.get("BPPSA_MALLOC_TUNING", "1").strip().lower() in ("0", "false", "no", "off"):
        return False
    if user_malloc_settings():
        return False
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the C library this process already runs on
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    results = [mallopt(_M_MMAP_MAX, 0), mallopt(_M_TRIM_THRESHOLD, 2 ** 31 - 1), mallopt(_M_TOP_PAD, 64 << 20)]
    _STATE["tuned"] = all(r == 1 for r in results)
    return _STATE["tuned"]


def user_malloc_settings() -> list[str]:
    """The environment variables through which the user already configured glibc's malloc.

    Returns:
      Their names (``MALLOC_*_``, ``GLIBC_TUNABLES`` with ``glibc.malloc`` entries); empty when none.
    """
    return [k for k, v in os.environ.items()
            if (k.startswith("MALLOC_") and k.endswith("_")) or (k == "GLIBC_TUNABLES" and "glibc.malloc" in v)]


def allocator_tuned() -> bool:
    """Whether :func:`tune_allocator` has been applied in this process (recorded in provenance).

    Returns:
      True once the settings were applied.
    """
    return _STATE["tuned"]


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo on Linux, else what the platform module knows).

    Returns:
      The name; where none is known, the processor or machine type (``platform``), possibly "".
    """
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def stats(samples: npt.ArrayLike) -> dict:
    """Seconds -> ``{"median", "min", "max", "repeats"}`` (``repeats`` = the number of samples).

    Args:
      samples: the measured seconds, a sequence or array.

    Returns:
      ``{"median": float, "min": float, "max": float, "repeats": int}``.

    Raises:
      ValueError: no samples.
    """
    s = np.asarray(samples, dtype=float)
    if s.size == 0:
        raise ValueError("stats needs at least one sample; got none")
    return {"median": float(np.median(s)), "min": float(s.min()), "max": float(s.max()),
            "repeats": int(s.size)}


def time_interleaved(fns: dict, *, repeats: int = 5, warmup: int = 1, block: int = 2) -> dict:
    """Time zero-argument callables by the protocol above: ``{name: fn} -> {name: stats}``.

    Each ``fn()`` must return JAX arrays (a pytree), which are waited for with
    ``jax.block_until_ready``. ``repeats`` rounds of one block per function; ``block`` calls per
    block, the first dropped, so every function gets ``repeats * (block - 1)`` samples.

    Args:
      fns: ``{name: fn}``, zero-argument callables returning JAX arrays.
      repeats: the rounds (>= 1).
      warmup: untimed calls of each function first (>= 0).
      block: consecutive calls per block (>= 2), the first not counted.

    Returns:
      ``{name: stats}``, each function's :func:`stats`.

    Raises:
      ValueError: ``repeats``, ``warmup`` or ``block`` out of range, or no function in ``fns``.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1; got {repeats}")
    if warmup < 0:
        raise ValueError(f"warmup must be >= 0; got {warmup}")
    if block < 2:
        raise ValueError(f"block must be >= 2 (its first call is dropped); got {block}")
    if not fns:
        raise ValueError("fns must name at least one function to time; got none")
    for fn in fns.values():  # the first call compiles
        for _ in range(warmup):
            jax.block_until_ready(fn())
    samples = {name: [] for name in fns}
    names = list(fns)
    for r in range(repeats):
        for name in names[r % len(names):] + names[:r % len(names)]:
            fn = fns[name]
            jax.block_until_ready(fn())  # the block's first call: not counted
            for _ in range(block - 1):
                t0 = time.perf_counter()
                jax.block_until_ready(fn())
                samples[name].append(time.perf_counter() - t0)
    return {name: stats(s) for name, s in samples.items()}


def time_fn(fn: Callable[[], Any], *, repeats: int = 5, warmup: int = 1, block: int = 2) -> dict:
    """:func:`time_interleaved` for one zero-argument function: its stats.

    Args:
      fn: a zero-argument callable returning JAX arrays.
      repeats: the rounds (>= 1).
      warmup: untimed calls first (>= 0).
      block: consecutive calls per block (>= 2), the first not counted.

    Returns:
      Its :func:`stats`, ``{"median", "min", "max", "repeats"}``.

    Raises:
      ValueError: ``repeats``, ``warmup`` or ``block`` out of range.
    """
    return time_interleaved({"fn": fn}, repeats=repeats, warmup=warmup, block=block)["fn"]
