"""Test-session set-up: 8 simulated CPU devices, quick compiles and float64, before JAX initialises.

- XLA_FLAGS gives the host platform 8 devices so the multi-device tests (sharded scan,
  heterogeneous data parallelism) run in-process; single-device code uses device 0 as usual.
- Compiling dominates the suite's time (many small programs, each run a few times), so XLA_FLAGS
  also skips LLVM's optimisation passes on the generated CPU code
  (``--xla_backend_optimization_level=0``) and selects XLA's older CPU fusion code generator
  (``--xla_cpu_use_fusion_emitters=false``, a supported setting, which compiles these small
  programs in about half the time of the MLIR fusion emitters). XLA's own HLO passes and buffer
  assignment still run: the programs and their memory are those of a normal run and the numbers
  agree to rounding (a float32 GRU gradient at T = 300, both flags: within 1.5e-7 of its largest
  entry); compiles take about a quarter as long, and the tests compare times only with times
  measured in the same run.
  The emitter flag is added only where this XLA knows it (a one-off probe in a child process:
  XLA aborts on a flag it does not know). ``BPPSA_TEST_XLA_OPT=1`` keeps XLA's defaults. A
  caller's XLA_FLAGS are kept (e.g. ``--xla_cpu_max_isa=AVX`` to run the suite with another
  CPU's kernels); these flags are added unless the caller set them. Subprocesses that the tests
  start, and the pytest-xdist workers, inherit the setting.
- One persistent XLA compilation cache for the session (``JAX_COMPILATION_CACHE_DIR``, a fresh
  temporary folder shared by the test processes and the subprocesses they start, removed at the
  end): many tests compile the same program (the same cell, shapes and method behind a new
  ``jax.jit`` wrapper), and a program compiled once is loaded, not compiled again. A cache hit
  returns the executable the compiler made for the same program and options, so no result
  changes. ``BPPSA_TEST_XLA_CACHE=0`` turns it off; a caller's ``JAX_COMPILATION_CACHE_DIR`` is kept.
- float64 is on for the whole session: gradient comparisons are made in float64, and tests
  that check float32 behaviour pass float32 arrays explicitly.
"""

import os
import subprocess
import sys


def _xla_knows(flag: str) -> bool:
    """Whether this jaxlib's XLA accepts ``flag`` (it aborts the process on one it does not know)."""
    env = dict(os.environ, XLA_FLAGS=flag, JAX_PLATFORMS="cpu")
    probe = [sys.executable, "-c", "import jax.numpy as jnp; jnp.zeros(1).block_until_ready()"]
    return subprocess.run(probe, env=env, capture_output=True, timeout=120).returncode == 0


_FLAGS = ["--xla_force_host_platform_device_count=8"]
_CALLER = os.environ.get("XLA_FLAGS", "").split()
_SET = {flag.split("=")[0] for flag in _CALLER}
if os.environ.get("BPPSA_TEST_XLA_OPT", "0") != "1":
    _FLAGS.append("--xla_backend_optimization_level=0")
    _EMITTERS = "--xla_cpu_use_fusion_emitters=false"
    if _EMITTERS.split("=")[0] not in _SET and _xla_knows(_EMITTERS):
        _FLAGS.append(_EMITTERS)
os.environ["XLA_FLAGS"] = " ".join(_CALLER + [f for f in _FLAGS if f.split("=")[0] not in _SET])
os.environ.setdefault("MPLBACKEND", "Agg")
if os.environ.get("BPPSA_TEST_XLA_CACHE", "1") != "0" and "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    import atexit
    import shutil
    import tempfile

    _CACHE = tempfile.mkdtemp(prefix="bppsa-test-xla-cache-")
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _CACHE  # the pytest-xdist workers inherit it
    atexit.register(shutil.rmtree, _CACHE, ignore_errors=True)  # by the process that made it
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "-1")

import jax  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_enable_x64", True)


@pytest.fixture
def float32_as_in_bppsa_run():
    """float64 off for one test, as `bppsa run` runs (use: ``pytestmark =
    pytest.mark.usefixtures("float32_as_in_bppsa_run")``)."""
    previous = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", False)
    yield
    jax.config.update("jax_enable_x64", previous)


# The shared fixtures: one problem, one loss, one pytree comparison, the runner's config files and
# its one-line errors. Session-scoped where they hand out pure functions (so that hypothesis tests
# may use them too).


@pytest.fixture(scope="session")
def problem():
    """``problem(cell, T=7, B=2, *, seed=0, dtype=float64, h0_scale=0.5)`` -> (cell, params, xs, h0):
    :func:`tests.helpers.make_problem`, numpy-drawn data for ``cell`` (float64 unless told)."""
    from tests.helpers import make_problem
    return make_problem


@pytest.fixture(scope="session")
def loss():
    """``loss(states, every_step=True)``: the tests' nonlinear scalar of the states
    (:func:`tests.helpers.states_loss`)."""
    from tests.helpers import states_loss
    return states_loss


@pytest.fixture(scope="session")
def close():
    """``close(got, want, rtol=1e-10, atol=1e-12, what="")``: two pytrees agree leaf by leaf
    (:func:`tests.tolerance.assert_trees_close`), the float64 comparison against the reference."""
    from tests.tolerance import assert_trees_close
    return assert_trees_close


@pytest.fixture
def task_config(tmp_path):
    """``task_config(task, module="tests.runner_tasks", header="", **fields) -> Path``: a config file in
    tmp_path whose ``get_config`` returns ``ConfigDict({"task": "module:task", **fields})`` (``header``:
    lines before it, e.g. ``"PRESETS = ('smoke',)\\n"``)."""
    def make(task, module="tests.runner_tasks", header="", **fields):
        path = tmp_path / f"{task}.py"
        fields = {"task": f"{module}:{task}", **fields}
        path.write_text(f"import ml_collections\n{header}"
                        f"def get_config(arg=None):\n    return ml_collections.ConfigDict({fields!r})\n")
        return path
    return make


@pytest.fixture
def one_error_line(capsys):
    """``one_error_line(prefix="", no_output=False)``: what a command printed: exactly one line on
    stderr, no traceback, starting with ``prefix`` (and nothing on stdout with ``no_output``); returned."""
    def read(prefix="", no_output=False):
        captured = capsys.readouterr()
        lines = captured.err.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in captured.err and not (no_output and captured.out), captured
        assert lines[0].startswith(prefix), (lines[0], prefix)
        return lines[0]
    return read
