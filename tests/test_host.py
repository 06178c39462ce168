"""bppsa.host: the glibc allocator settings (opt-in, never on import), and the opt-outs."""

import os
import subprocess
import sys

import pytest


glibc = pytest.mark.skipif(not sys.platform.startswith("linux") or not os.confstr("CS_GNU_LIBC_VERSION"),
                           reason="the settings are glibc's")


def _tuned_in_subprocess(code, **env):
    base = {k: v for k, v in os.environ.items()
            if k != "BPPSA_MALLOC_TUNING" and not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    out = subprocess.run([sys.executable, "-c", code], env=base | env, capture_output=True, text=True,
                         timeout=120, check=True)
    return out.stdout.strip()


TUNE = "import bppsa; bppsa.host.tune_allocator(); print(bppsa.host.allocator_tuned())"


def test_import_does_not_tune_the_allocator():
    assert _tuned_in_subprocess("import bppsa; print(bppsa.host.allocator_tuned())") == "False"


@glibc
def test_opting_in_tunes_it_once_and_provenance_records_it():
    code = ("from bppsa import host, provenance; assert host.tune_allocator(); assert host.tune_allocator(); "
            "print(provenance.provenance('x')['malloc_tuned'])")
    assert _tuned_in_subprocess(code) == "True"


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
    assert _tuned_in_subprocess(TUNE, **env) == expected
