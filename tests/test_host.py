"""bppsa.host: the glibc allocator settings applied on import, and the opt-outs."""

import os
import subprocess
import sys

import pytest

import bppsa
from bppsa import host, provenance

glibc = pytest.mark.skipif(not sys.platform.startswith("linux") or not os.confstr("CS_GNU_LIBC_VERSION"),
                           reason="the settings are glibc's")
user_env = (os.environ.get("BPPSA_MALLOC_TUNING", "1").lower() in ("0", "false", "no", "off")
            or bool(host.user_malloc_settings()))


@glibc
@pytest.mark.skipif(user_env, reason="this environment opts out of the tuning")
def test_import_tunes_the_allocator_and_provenance_records_it():
    assert bppsa.host.allocator_tuned()
    assert host.tune_allocator()  # idempotent
    assert provenance.provenance("x")["malloc_tuned"] is True


def _tuned_in_subprocess(**env):
    base = {k: v for k, v in os.environ.items()
            if k != "BPPSA_MALLOC_TUNING" and not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    out = subprocess.run([sys.executable, "-c", "import bppsa; print(bppsa.host.allocator_tuned())"],
                         env=base | env, capture_output=True, text=True, timeout=120, check=True)
    return out.stdout.strip()


@pytest.mark.parametrize("env,expected", [
    ({"BPPSA_MALLOC_TUNING": "0"}, "False"),
    ({"BPPSA_MALLOC_TUNING": "off"}, "False"),
    ({"BPPSA_MALLOC_TUNING": "1"}, "True"),
    ({"MALLOC_TRIM_THRESHOLD_": "1000000"}, "False"),            # the user's own malloc settings win
    ({"GLIBC_TUNABLES": "glibc.malloc.mmap_max=0"}, "False"),
    ({"GLIBC_TUNABLES": "glibc.rtld.optional_static_tls=512"}, "True"),  # not a malloc setting
])
@glibc
def test_environment_opt_outs(env, expected):
    assert _tuned_in_subprocess(**env) == expected
