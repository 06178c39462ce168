"""flax's own ``nnx.RNN`` tests, run against :class:`bppsa.nn.RNN`.

The test file (``tests/nnx/nn/recurrent_test.py``) is read from the source distribution of the
installed flax version, fetched from the package registry at test time (``pip download``) and
cached under ``$BPPSA_CACHE`` (default ``~/.cache/bppsa``); nothing of flax's is copied into this
repository. :func:`run` imports it with ``nnx.RNN`` replaced by ``bppsa.nn.RNN`` (with the given
options) and runs its unittest cases.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import subprocess
import sys
import tarfile
import unittest
from importlib import metadata
from pathlib import Path

import jax
from flax import nnx

import bppsa.nn

MEMBER = "tests/nnx/nn/recurrent_test.py"


class Unavailable(Exception):
    """The registry could not be reached, or the file is not in the source distribution."""


def cache_dir() -> Path:
    return Path(os.environ.get("BPPSA_CACHE", Path.home() / ".cache" / "bppsa"))


def test_file(version: str | None = None) -> Path:
    """flax's recurrent_test.py for ``version`` (default: the installed flax), fetched once."""
    version = version or metadata.version("flax")
    out = cache_dir() / f"flax-{version}" / "recurrent_test.py"
    if out.is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", f"flax=={version}", "--no-deps", "--no-binary", ":all:",
           "--disable-pip-version-check", "-q", "-d", str(out.parent)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise Unavailable(f"pip download flax=={version} failed: {e}") from None
    sdists = sorted(out.parent.glob(f"flax-{version}.tar.gz"))
    if proc.returncode or not sdists:
        raise Unavailable(f"could not fetch flax=={version}'s source distribution from the package registry: "
                          f"{(proc.stderr or proc.stdout).strip()[-300:]}")
    with tarfile.open(sdists[0]) as tar:
        name = f"flax-{version}/{MEMBER}"
        try:
            member = tar.getmember(name)
        except KeyError:
            raise Unavailable(f"{name} is not in {sdists[0].name}") from None
        data = tar.extractfile(member)
        if data is None:
            raise Unavailable(f"{name} in {sdists[0].name} is not a file")
        out.write_bytes(data.read())
    return out


class _NnxWithBppsa:
    """``flax.nnx`` with ``RNN`` replaced by ``bppsa.nn.RNN`` (counting its instances)."""

    def __init__(self, **options):
        self.made = 0

        def rnn(cell, **kw):
            self.made += 1
            return bppsa.nn.RNN(cell, **options, **kw)

        self.RNN = rnn

    def __getattr__(self, name):
        return getattr(nnx, name)


def run(substitute: bool = True, **options) -> tuple[unittest.TestResult, int, int]:
    """Run flax's recurrent tests with ``bppsa.nn.RNN(cell, **options, ...)`` for ``nnx.RNN``
    (``substitute=False``: flax's own), under flax's defaults (float32: x64 off). Returns
    (result, tests run, bppsa.nn.RNN made)."""
    path = test_file()
    spec = importlib.util.spec_from_file_location("flax_recurrent_test", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    proxy = _NnxWithBppsa(**options)
    if substitute:
        module.nnx = proxy
    suite = unittest.defaultTestLoader.loadTestsFromModule(module)
    result = unittest.TestResult()
    x64 = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", False)
    try:
        suite.run(result)
    finally:
        jax.config.update("jax_enable_x64", x64)
    return result, result.testsRun, proxy.made


@functools.cache
def rnn_tests() -> tuple[str, ...]:
    """The names of flax's tests that build an ``nnx.RNN``."""
    text = test_file().read_text()
    names, current = [], None
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("def test_"):
            current = stripped[4:stripped.index("(")]
        elif "nnx.RNN(" in stripped and current and current not in names:
            names.append(current)
    return tuple(names)
