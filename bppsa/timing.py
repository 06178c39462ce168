"""The one timing protocol: steady-state blocks, rotated order, medians with their spread.

Every wall-clock number in bppsa's benchmarks and experiments comes from :func:`time_interleaved`:

1. each function is called ``warmup`` times first, untimed (the first call compiles; with
   ``warmup=0`` the compile is the dropped first call of the function's first block);
2. then, for ``repeats`` rounds, each function runs a *block* of ``block`` consecutive calls,
   each ended by ``jax.block_until_ready``; the first call of every block is dropped (it pays
   for whatever ran before it: caches evicted and allocator state left by the previous
   function), the others are the samples;
3. the order of the blocks rotates every round, so that no function always opens the round. In a
   rotation a function mostly follows the same other one: what protects the samples from the
   order effect is step 2's dropped first call, the only call that follows another program (on a
   shared 2-core CPU a call right after BPTT's long single-threaded loop measured up to 1.5x
   slower than the same program a call later; by the second call of the block it is gone, and the
   same executable timed under two names agrees within 4 %: experiments/results/cpu/
   scan-optimisation.md, round 4);
4. each function's samples are summarised by :func:`stats`: median, min and max.

Interleaving makes ratios fair on a noisy machine: every function sees the same load.
"""

from __future__ import annotations

import time

import jax
import numpy as np

__all__ = ["stats", "time_interleaved", "time_fn"]


def stats(samples) -> dict:
    """Seconds -> ``{"median", "min", "max", "repeats"}`` (``repeats`` = the number of samples)."""
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
    """
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1; got {repeats}")
    if warmup < 0:
        raise ValueError(f"warmup must be >= 0; got {warmup}")
    if block < 2:
        raise ValueError(f"block must be >= 2 (its first call is dropped); got {block}")
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


def time_fn(fn, *, repeats: int = 5, warmup: int = 1, block: int = 2) -> dict:
    """:func:`time_interleaved` for one zero-argument function: its stats."""
    return time_interleaved({"fn": fn}, repeats=repeats, warmup=warmup, block=block)["fn"]
