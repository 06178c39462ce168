"""A library user gets the fast path: the first ``bppsa.rnn`` call on CPU tunes glibc's allocator
(``import bppsa`` does not), and ``BPPSA_MALLOC_TUNING=0`` keeps glibc's defaults (fresh processes:
the tuning is process-wide)."""

import os
import subprocess
import sys

import pytest

GLIBC = sys.platform.startswith("linux") and bool(os.confstr("CS_GNU_LIBC_VERSION"))

CODE = """
import jax, jax.numpy as jnp, bppsa
from bppsa import cells, host
cell = cells.RNN(1, 4)
before = host.allocator_tuned()
bppsa.rnn(cell, cell.init(jax.random.key(0)), jnp.ones((3, 1, 1)), jnp.zeros((1, 4)), {kw})
print(before, host.allocator_tuned())
"""


def _run(kw="", **env):
    base = {k: v for k, v in os.environ.items()
            if k != "BPPSA_MALLOC_TUNING" and not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    out = subprocess.run([sys.executable, "-c", CODE.format(kw=kw)], env=base | {"JAX_PLATFORMS": "cpu"} | env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


@pytest.mark.skipif(not GLIBC, reason="the settings are glibc's")
@pytest.mark.parametrize("kw", ["", pytest.param("backward='bptt'", marks=pytest.mark.slow),
                                pytest.param("mesh=bppsa.parallel.make_mesh(1, batch_axis=None)", marks=pytest.mark.slow)])
def test_the_first_rnn_call_on_cpu_tunes_the_allocator(kw):
    assert _run(kw) == ["False", "True"]


def test_the_off_switch_keeps_glibcs_defaults():  # every other opt-out: tests/core/test_host.py
    assert _run(BPPSA_MALLOC_TUNING="0") == ["False", "False"]
