"""Host (CPU) memory settings that the BPPSA backward needs to run at speed.

XLA's CPU runtime allocates the temporaries of a compiled function on every call. The BPPSA
backward's temporaries are large (the Jacobians, T·B·S² floats, and every up-sweep level), and
with glibc's default settings a freed block of more than a few MB is handed back to the kernel
(``munmap`` or heap trimming), so the next call gets fresh pages and takes one page fault per
4 KiB it touches. Measured on the 2-core CPU, RNN H = 20, B = 1, T = 10 000, BPPSA backward
(min of 20 calls): 8 795 minor page faults per call (34 MB of fresh pages) and 13.97 ms with glibc's
defaults, 0 faults and 5.02 ms with the settings below; BPTT's backward faults 0–1 times either way
(6.7 ms) (``experiments/results/cpu/scan-optimisation.md``).

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
"""

from __future__ import annotations

import ctypes
import os
import sys

__all__ = ["tune_allocator", "allocator_tuned", "user_malloc_settings"]

_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_MAX = -1, -2, -4
_STATE = {"tuned": False}


def tune_allocator() -> bool:
    """Apply the glibc settings described in the module docstring. Returns True if applied.

    A no-op (False) when ``BPPSA_MALLOC_TUNING=0``, when the user configured glibc's malloc
    through the environment, on a platform other than Linux, or when the C library has no
    ``mallopt`` (not glibc). Safe to call more than once.
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
    """The environment variables through which the user already configured glibc's malloc."""
    return [k for k, v in os.environ.items()
            if (k.startswith("MALLOC_") and k.endswith("_")) or (k == "GLIBC_TUNABLES" and "glibc.malloc" in v)]


def allocator_tuned() -> bool:
    """Whether :func:`tune_allocator` has been applied in this process (recorded in provenance)."""
    return _STATE["tuned"]
