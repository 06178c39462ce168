"""bppsa.host: the glibc allocator settings applied on import, and the opt-out."""

import ctypes.util
import os
import subprocess
import sys

import pytest

import bppsa
from bppsa import host, provenance

glibc = pytest.mark.skipif(not sys.platform.startswith("linux") or "libc.so.6" not in (ctypes.util.find_library("c") or ""),
                           reason="the settings are glibc's")


@glibc
def test_import_tunes_the_allocator_and_provenance_records_it():
    assert bppsa.host.allocator_tuned()
    assert host.tune_allocator()  # idempotent
    assert provenance.provenance("x")["malloc_tuned"] is True


@pytest.mark.parametrize("value,expected", [("0", "False"), ("off", "False"), ("1", "True")])
@glibc
def test_environment_opt_out(value, expected):
    env = dict(os.environ, BPPSA_MALLOC_TUNING=value)
    out = subprocess.run([sys.executable, "-c", "import bppsa; print(bppsa.host.allocator_tuned())"],
                         env=env, capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == expected
