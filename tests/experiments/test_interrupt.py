"""Ctrl-C during `bppsa run`, in a real process: one line with the resume hint and exit code 130,
not a traceback (`--debug` adds the traceback); SIGTERM the same with exit code 143. At any moment
(the imports, a compile, a step, the end): never a crash at exit, and the run resumes."""

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _restore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _start(cmd: list[str], env: dict, **kwargs) -> subprocess.Popen:
    """Start ``cmd`` with SIGINT at its default, as a terminal's program has it, whatever the test process
    does with SIGINT: a shell script's background job (`make test &`, no job control) ignores it, and
    so would the child (Python installs its Ctrl-C handler only where SIGINT is at its default)."""
    return subprocess.Popen(cmd, env=env, cwd=ROOT, text=True, preexec_fn=_restore_sigint, **kwargs)


@pytest.fixture(params=["foreground", "background job"])
def started_as(request):
    """The test process as it starts the program: as usual, or ignoring SIGINT as a shell script's
    background job does (`make test &`): the programs the tests start are not to depend on it."""
    if request.param == "foreground":
        yield request.param
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield request.param
    finally:
        signal.signal(signal.SIGINT, previous)

SLEEPY = """
import time

def task(config, workdir):
    print("ready", flush=True)
    time.sleep(120)
    return {}
"""


# without --debug (exit 130, the one line): make test-all; the default run checks the same in the
# stop-signal run below (a Ctrl-C in its imports, a compile and at the end) and keeps --debug's traceback
@pytest.mark.parametrize("debug", [pytest.param(False, marks=pytest.mark.slow), True])
def test_ctrl_c_is_one_line_with_the_resume_hint(tmp_path, debug):
    (tmp_path / "sleepy_task.py").write_text(SLEEPY)
    config = tmp_path / "sleepy.py"
    config.write_text("import ml_collections\n"
                      "def get_config(arg=None):\n    return ml_collections.ConfigDict({'task': 'sleepy_task:task'})\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(tmp_path)]), JAX_PLATFORMS="cpu")
    cmd = [sys.executable, "-m", "experiments.cli", *(["--debug"] if debug else []), "run", str(config),
           "--workdir", str(tmp_path / "w")]
    proc = _start(cmd, env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n", proc.communicate(timeout=60)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    lines = err.strip().splitlines()
    assert proc.returncode == 130, err
    assert lines[-1] == "bppsa run: interrupted (Ctrl-C); run the same command again to resume", err
    if debug:
        assert "Traceback" in err and "Interrupted: SIGINT" in err  # experiments.interrupt's KeyboardInterrupt
    else:
        assert lines == lines[-1:], err


def _python(code: str, timeout: float = 60) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = _start([sys.executable, "-c", code], env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def test_the_command_handles_signals_before_it_imports_jax():
    """experiments.cli imports nothing heavy at its top: its main installs the handlers, then imports
    JAX (it imported JAX first, and Ctrl-C then was a 30-line traceback and exit code -2)."""
    proc = _python("import sys, experiments.cli; print(sorted({'jax', 'numpy', 'bppsa'} & set(sys.modules)))")
    assert proc.stdout.strip() == "[]", proc.stderr


def test_a_signal_the_process_was_started_ignoring_stays_ignored():
    """A shell script's background job (``bppsa run ... &``) ignores SIGINT, as Python leaves it."""
    proc = _python("import signal\n"
                   "signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
                   "from experiments import interrupt\n"
                   "interrupt.install()\n"
                   "interrupt.stop_at_once('{}')\n"
                   "print(signal.getsignal(signal.SIGINT) is signal.SIG_IGN,\n"
                   "      callable(signal.getsignal(signal.SIGTERM)))")
    assert proc.stdout.strip() == "True True", proc.stderr


# after the signals it sends itself, the program waits up to 30 s for an Interrupted sent again (10 ms)
WAIT = """
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        time.sleep(0.05)
    print("not interrupted")
except interrupt.Interrupted as e:
    print("interrupted", e.signum)
"""


def test_an_interrupt_python_ignored_in_a_gc_callback_is_raised_again(started_as):
    """JAX's garbage-collection callback took the KeyboardInterrupt of an early Ctrl-C, Python printed
    "Exception ignored in: <function _xla_gc_callback ...>", and the run went on to exit code 0.
    (Under `make test &` this test's program once ignored SIGINT itself and printed "not interrupted":
    the ``background job`` case.)"""
    proc = _python("""
import gc, os, signal, time
from experiments import interrupt
interrupt.install()

def callback(phase, info):
    if phase == "start":
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(100_000):  # the handler runs in here, and Python ignores what it raises
            pass

gc.callbacks.append(callback)
try:
    gc.collect()
    print("collected", flush=True)
""" + WAIT)
    assert proc.stdout.splitlines() == ["collected", "interrupted 2"] and proc.stderr == "", proc.stderr


def test_an_interrupt_dropped_with_the_import_error_it_became_is_raised_again():
    """An interrupt inside an extension module's import becomes an ImportError, and code that tries an
    optional import catches that: the signal is sent again until it unwinds the run."""
    proc = _python("""
import os, signal, time
from experiments import interrupt
interrupt.install()
try:
    try:
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(100_000):
                pass
        except KeyboardInterrupt as e:
            raise ImportError("the extension failed to import") from e
    except ImportError:
        pass  # an optional module, then
    print("dropped", flush=True)
""" + WAIT)
    assert proc.stdout.splitlines() == ["dropped", "interrupted 15"] and proc.stderr == "", proc.stderr


def test_a_second_signal_does_not_cut_the_clean_up_short():
    proc = _python("""
import os, signal
from experiments import interrupt
interrupt.install()
try:
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(100_000):
            pass
    finally:
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(100_000):
            pass
        print("cleaned up", flush=True)
except interrupt.Interrupted as e:
    print("interrupted", e.signum)
""")
    assert proc.stdout.splitlines() == ["cleaned up", "interrupted 15"], proc.stderr


def test_a_signal_during_interpreter_shutdown_is_the_line_and_130(started_as):
    """After the command's work (stop_at_once): at once, without the shutdown that can crash. (Under
    `make test &` this test's program once ignored SIGINT itself and ended with exit code 0: the
    ``background job`` case.)"""
    proc = _python("""
import atexit, os, signal, time
from experiments import interrupt
interrupt.install()
interrupt.stop_at_once("bppsa run: interrupted ({}); run the same command again to resume")
atexit.register(lambda: (os.kill(os.getpid(), signal.SIGINT), time.sleep(10)))
""")
    assert proc.returncode == 130, proc.stderr
    assert proc.stderr == "bppsa run: interrupted (Ctrl-C); run the same command again to resume\n"


# A resumable task that compiles a new XLA program at every step (about half a second each), so that
# a signal often finds a compile in flight: printed markers tell the test where it is.
STOPPABLE = """
import json
import os

def task(config, workdir):
    import jax
    import jax.numpy as jnp
    state, metrics = workdir.entry("state.json"), workdir.entry("metrics.jsonl")
    step, x = (json.loads(state.read_text())[k] for k in ("step", "x")) if state.exists() else (0, 1)
    lines = metrics.read_text().splitlines()[:step] if step else []
    metrics.write_text("".join(line + "\\n" for line in lines))
    for s in range(step + 1, config.steps + 1):
        def body(v, n=config.ops + s):
            for i in range(n):
                v = jnp.sin(v) * 0.5 + jnp.cos(v * i)
            return v

        lowered = jax.jit(body).lower(jnp.zeros(8))
        print("compiling", s, flush=True)
        lowered.compile()(jnp.zeros(8)).block_until_ready()
        x = (3 * x + s) % 1009
        with metrics.open("a") as f:
            f.write(json.dumps({"step": s, "x": x}) + "\\n")
        tmp = workdir.entry("state.tmp")
        tmp.write_text(json.dumps({"step": s, "x": x}))
        os.replace(tmp, state)
        print("step", s, flush=True)
    print("end", flush=True)
    workdir.entry("result.json").write_text(json.dumps({"x": x, "steps": config.steps}))
    return {"x": x}
"""
STEPS = 4


def _stoppable(tmp_path) -> tuple[list[str], dict]:
    """(the command of a run of STOPPABLE without its --workdir, its environment: no compilation cache)."""
    (tmp_path / "stoppable_task.py").write_text(STOPPABLE)
    config = tmp_path / "stoppable.py"
    config.write_text("import ml_collections\n"
                      "def get_config(arg=None):\n"
                      f"    return ml_collections.ConfigDict({{'task': 'stoppable_task:task', 'steps': {STEPS}, "
                      "'ops': 400})\n")
    env = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}
    env.update(PYTHONPATH=os.pathsep.join([str(ROOT), str(tmp_path)]), JAX_PLATFORMS="cpu")
    return [sys.executable, "-m", "experiments.cli", "run", str(config)], env


def _stop(cmd, env, signum, at=None, after=0.0) -> tuple[int | None, str]:
    """Run ``cmd``; send ``signum`` ``after`` seconds after it prints a line starting with ``at``
    ("imports": once it handles SIGTERM, i.e. the command began and imports JAX; None: after it
    starts); return (its exit code, its stderr), exit code None when it had ended before the signal."""
    def catches(pid: int, signum: int) -> bool:
        """Whether process ``pid`` has a handler for ``signum`` (Linux: /proc/PID/status, SigCgt)."""
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            return False
        mask = next(line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:"))
        return bool(int(mask, 16) >> (signum - 1) & 1)

    proc = _start(cmd, env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        if at == "imports":
            # Until the command handles stop signals (its first step; JAX's imports follow, seconds long).
            deadline = time.monotonic() + 60
            while not catches(proc.pid, signal.SIGTERM):
                assert proc.poll() is None and time.monotonic() < deadline, "the command never handled SIGTERM"
                time.sleep(0.002)
        elif at is not None:
            assert proc.stdout is not None
            for line in proc.stdout:
                if line.startswith(at):
                    break
        time.sleep(after)
        ended = proc.poll() is not None
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    return (None if ended else proc.returncode), err


def _check_stopped(code, err, signum) -> None:
    name = "Ctrl-C" if signum == signal.SIGINT else "SIGTERM"
    assert code == 128 + signum, err
    assert "Fatal Python error" not in err and "Segmentation fault" not in err, err
    assert err.strip().splitlines() == [f"bppsa run: interrupted ({name}); run the same command again to resume"], err


def _check_ended(code, err, signum) -> None:
    """A signal as the run ends: the line and 128 + signum while Python still runs; after, in the C++
    libraries' teardown, ignored (the command's own exit code, 0) or too late (None); never a kill."""
    if code == 128 + signum:
        _check_stopped(code, err, signum)
    else:
        assert code in (None, 0) and "Fatal Python error" not in err and "Traceback" not in err, (code, err)


def _check_resumes(cmd, env, workdir: Path) -> None:
    """The same command again ends the run, with the result and the metrics of an uninterrupted one."""
    proc = subprocess.run([*cmd, "--workdir", str(workdir)], env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    x, logged = 1, []
    for s in range(1, STEPS + 1):
        x = (3 * x + s) % 1009
        logged.append({"step": s, "x": x})
    assert json.loads((workdir / "result.json").read_text()) == {"x": x, "steps": STEPS}
    assert [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()] == logged


def test_a_stop_signal_at_any_moment_ends_the_run_cleanly_and_it_resumes(tmp_path):
    """One work directory, stopped during the imports, a compile, the steps (SIGTERM) and at the end,
    each run resuming the one before: exit codes 130/143, one line, no crash at exit (it was a
    segfault in about half of the signals during a compile; a traceback during the imports; a
    signal swallowed by JAX's garbage-collection callback let the run go on to exit code 0)."""
    cmd, env = _stoppable(tmp_path)
    workdir = tmp_path / "w"
    # a compile takes about half a second, after a few tenths in Python (jax's own checks)
    # (more moments of a compile: test_twenty_ctrl_cs_at_random_moments, in test-all)
    for at, after, signum in [("imports", 0.0, signal.SIGINT), ("compiling", 0.1, signal.SIGINT),
                              ("step", 0.0, signal.SIGTERM), ("end", 0.0, signal.SIGINT)]:
        code, err = _stop([*cmd, "--workdir", str(workdir)], env, signum, at=at, after=after)
        _check_stopped(code, err, signum)
    _check_resumes(cmd, env, workdir)
    # the finished run again (its task does nothing more), signalled as its process ends: it was killed (-2)
    code, err = _stop([*cmd, "--workdir", str(workdir)], env, signal.SIGINT, at="end", after=0.1)
    _check_ended(code, err, signal.SIGINT)


@pytest.mark.slow
def test_twenty_ctrl_cs_at_random_moments(tmp_path):
    """20 runs, each sent SIGINT at a random moment (a random phase, then a random delay within it), then
    resumed: every one exits 130. (Before the command's own code begins, the interpreter is still
    starting up, a few tens of milliseconds, and a signal ends it as it ends any program.)"""
    cmd, env = _stoppable(tmp_path)
    rng = random.Random(0)
    # the longest delay after each marker: within the run (its imports take a second or more; the whole
    # run, imports and four compiles, can end within 3 s on a quiet machine, and a signal after it tests nothing)
    phases = {"imports": 1.0, "compiling": 0.6, "step": 0.6, "end": 0.5}
    for i in range(20):
        workdir = tmp_path / f"w{i}"
        at = rng.choice(sorted(phases))
        code, err = _stop([*cmd, "--workdir", str(workdir)], env, signal.SIGINT, at=at,
                          after=rng.uniform(0.0, phases[at]))
        if at == "end":
            _check_ended(code, err, signal.SIGINT)
        else:
            _check_stopped(code, err, signal.SIGINT)
        _check_resumes(cmd, env, workdir)


# Put first on PYTHONPATH (as sitecustomize.py), it sends the process the signal named by BPPSA_TEST_AT_SIGNAL
# as the import of the module BPPSA_TEST_AT_MODULE begins, once the command handles stop signals, and
# writes the module's name to BPPSA_TEST_AT_REPORT first; with BPPSA_TEST_AT_MODULE empty, it writes the
# name of every module imported from then on.
AT_IMPORT = """
import os, signal, sys

class _At:
    def find_spec(self, name, path=None, target=None):
        if not callable(signal.getsignal(signal.SIGTERM)):  # the command does not handle it yet
            return None
        target = os.environ["BPPSA_TEST_AT_MODULE"]
        if not target or name == target:
            with open(os.environ["BPPSA_TEST_AT_REPORT"], "a") as f:
                f.write(name + "\\n")
        if name == target:
            sys.meta_path.remove(self)
            os.kill(os.getpid(), getattr(signal, os.environ["BPPSA_TEST_AT_SIGNAL"]))
        return None

if "BPPSA_TEST_AT_MODULE" in os.environ:
    sys.meta_path.insert(0, _At())
"""


def _at_import(tmp_path, module: str, signame: str = "SIGINT") -> tuple[list[str], dict, Path]:
    """The command of a run of STOPPABLE with AT_IMPORT in place, its environment, and AT_IMPORT's report."""
    cmd, env = _stoppable(tmp_path)
    (tmp_path / "site").mkdir(exist_ok=True)
    (tmp_path / "site" / "sitecustomize.py").write_text(AT_IMPORT)
    report = tmp_path / f"at-{module or 'all'}-{signame}.txt"
    env.update(PYTHONPATH=os.pathsep.join([str(tmp_path / "site"), env["PYTHONPATH"]]), BPPSA_TEST_AT_MODULE=module,
               BPPSA_TEST_AT_SIGNAL=signame, BPPSA_TEST_AT_REPORT=str(report))
    return cmd, env, report


def _signal_at_import(tmp_path, module: str, signum: int) -> None:
    cmd, env, report = _at_import(tmp_path, module, signal.Signals(signum).name)
    proc = subprocess.run([*cmd, "--workdir", str(tmp_path / f"w-{module}")], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=300, preexec_fn=_restore_sigint)
    assert report.read_text() == module + "\n", proc.stderr  # the signal came where it was meant to
    _check_stopped(proc.returncode, proc.stderr, signum)


def test_a_signal_while_logging_is_half_imported_still_ends_with_its_code():
    """The exit itself (`interrupt.leave`) with logging in sys.modules but not yet made (a signal that
    lands inside logging's own import): it was `AttributeError: partially initialized module 'logging'
    has no attribute 'shutdown'` and a traceback after the line (seen once in 20 Ctrl-Cs of a smoke run)."""
    code = ("import sys, types\n"
            "sys.modules['logging'] = types.ModuleType('logging')  # as while logging's import runs\n"
            "from experiments import interrupt\n"
            "print('flushed', end='')\n"
            "interrupt.leave(130)\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert (proc.returncode, proc.stdout, proc.stderr) == (130, "flushed", "")


@pytest.mark.parametrize("module, signum", [("numpy._core._exceptions", signal.SIGINT),
                                            ("numpy", signal.SIGTERM)])
def test_a_stop_signal_inside_numpys_import_is_the_line(tmp_path, module, signum):
    """A signal that lands inside numpy's import, from jaxlib's extension (numpy._core._exceptions: from
    inside numpy's own extension): it was numpy's traceback of the KeyboardInterrupt, `ImportError:
    numpy._core.multiarray failed to import`, `Encountered an error while initializing the extension`
    and exit code 1 (seen under load, with a Ctrl-C at a random moment)."""
    _signal_at_import(tmp_path, module, signum)


@pytest.mark.slow
def test_a_stop_signal_at_the_import_of_any_module_is_the_line(tmp_path):
    """Every 40th module the command imports once it handles stop signals (a few dozen), SIGINT and
    SIGTERM in turn, the signal sent as its import begins: the one line and 128 + the signal, each."""
    cmd, env, report = _at_import(tmp_path, "")
    proc = subprocess.run([*cmd, "--workdir", str(tmp_path / "w")], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=600, preexec_fn=_restore_sigint)
    assert proc.returncode == 0, proc.stderr
    modules = list(dict.fromkeys(report.read_text().split()))
    assert len(modules) > 200, modules  # JAX's, numpy's, bppsa's, the runner's
    for i, module in enumerate(modules[::40]):
        _signal_at_import(tmp_path, module, (signal.SIGINT, signal.SIGTERM)[i % 2])


@pytest.mark.slow
def test_twenty_ctrl_cs_in_the_first_three_seconds_of_a_smoke_run(tmp_path):
    """`bppsa run experiments/paper_bppsa/configs/rnn_train.py:smoke` (a minute or more), sent SIGINT at
    a random moment of its first three seconds from when it handles stop signals (the imports, the
    config, the first compile): the one line and 130 each time."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu")
    rng = random.Random(1)
    config = str(ROOT / "experiments/paper_bppsa/configs/rnn_train.py") + ":smoke"
    for i in range(20):
        cmd = [sys.executable, "-m", "experiments.cli", "run", config, "--workdir", str(tmp_path / f"w{i}")]
        code, err = _stop(cmd, env, signal.SIGINT, at="imports", after=rng.uniform(0.0, 3.0))
        _check_stopped(code, err, signal.SIGINT)
