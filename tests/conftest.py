"""Test-session set-up: 8 simulated CPU devices and float64, both before JAX initialises.

- XLA_FLAGS gives the host platform 8 devices so the multi-device tests (sharded scan,
  heterogeneous data parallelism) run in-process; single-device code uses device 0 as usual.
- float64 is on for the whole session: gradient comparisons are made in float64, and tests
  that check float32 behaviour pass float32 arrays explicitly.
"""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("MPLBACKEND", "Agg")

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)
