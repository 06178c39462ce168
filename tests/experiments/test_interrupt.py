"""Ctrl-C during `bppsa run`, in a real process: one line with the resume hint and exit code 130,
not a traceback (`--debug` adds the traceback)."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

SLEEPY = """
import time

def task(config, workdir):
    print("ready", flush=True)
    time.sleep(120)
    return {}
"""


@pytest.mark.parametrize("debug", [False, True])
def test_ctrl_c_is_one_line_with_the_resume_hint(tmp_path, debug):
    (tmp_path / "sleepy_task.py").write_text(SLEEPY)
    config = tmp_path / "sleepy.py"
    config.write_text("import ml_collections\n"
                      "def get_config(arg=None):\n    return ml_collections.ConfigDict({'task': 'sleepy_task:task'})\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(tmp_path)]), JAX_PLATFORMS="cpu")
    cmd = [sys.executable, "-m", "experiments.cli", *(["--debug"] if debug else []), "run", str(config),
           "--workdir", str(tmp_path / "w")]
    # a shell's background job (`cmd &`, no job control) ignores SIGINT, and so would the child: Python
    # installs its Ctrl-C handler only where SIGINT is at its default, so restore it there
    proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
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
        assert "Traceback" in err and "KeyboardInterrupt" in err
    else:
        assert lines == lines[-1:], err
