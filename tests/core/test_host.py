"""bppsa.host: the glibc allocator settings (opt-in, never on import), and the opt-outs.

Each check needs a fresh process (the tuning is process-wide and happens once), so the checks run
in two subprocesses: one imports bppsa and opts in; the other decides each environment case in turn
(``tune_allocator`` reads the environment when it is called; reloading the module between cases
gives each case a process that has not been tuned yet).
"""

import json
import os
import subprocess
import sys

import pytest


GLIBC = sys.platform.startswith("linux") and bool(os.confstr("CS_GNU_LIBC_VERSION"))
glibc = pytest.mark.skipif(not GLIBC, reason="the settings are glibc's")


def _in_subprocess(code, **env):
    base = {k: v for k, v in os.environ.items()
            if k != "BPPSA_MALLOC_TUNING" and not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    out = subprocess.run([sys.executable, "-c", code], env=base | env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().splitlines()


def test_import_does_not_tune_opting_in_tunes_once_and_provenance_records_it():
    code = ("import bppsa; from bppsa import host; from experiments import provenance\n"
            "print(host.allocator_tuned(), provenance.provenance('x')['malloc_tuned'])\n"
            "print(host.tune_allocator(), host.tune_allocator(), host.allocator_tuned(), "
            "provenance.provenance('x')['malloc_tuned'])\n")
    tuned = str(GLIBC)  # elsewhere opting in is a no-op
    assert _in_subprocess(code) == ["False False", " ".join([tuned] * 4)]


ENV_CASES = [
    ({}, True),
    ({"BPPSA_MALLOC_TUNING": "0"}, False),
    ({"BPPSA_MALLOC_TUNING": "off"}, False),
    ({"BPPSA_MALLOC_TUNING": "1"}, True),
    ({"MALLOC_TRIM_THRESHOLD_": "1000000"}, False),            # the user's own malloc settings win
    ({"GLIBC_TUNABLES": "glibc.malloc.mmap_max=0"}, False),
    ({"GLIBC_TUNABLES": "glibc.rtld.optional_static_tls=512"}, True),  # not a malloc setting
]


@glibc
def test_environment_opt_outs():
    """Each case in a clean environment (the keys of the case before it removed), in one process."""
    code = f"""
import importlib, json, os
from bppsa import host
results = []
for env, _ in {ENV_CASES!r}:
    for k in ("BPPSA_MALLOC_TUNING", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES"):
        os.environ.pop(k, None)
    os.environ.update(env)
    host = importlib.reload(host)
    results.append([host.tune_allocator(), host.allocator_tuned()])
print(json.dumps(results))
"""
    got = json.loads(_in_subprocess(code)[-1])
    assert got == [[want, want] for _, want in ENV_CASES], list(zip([env for env, _ in ENV_CASES], got))


def test_timing_nothing_is_a_clear_error():
    """time_interleaved({}) was ZeroDivisionError (the rotation over no names)."""
    from bppsa import host
    with pytest.raises(ValueError, match="fns must name at least one function to time"):
        host.time_interleaved({})
