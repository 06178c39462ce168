"""The ``bppsa`` command as installed (issue 61): ``--version``; ``bppsa --help`` lists every
subcommand with one line; no ``--help`` shows reST markup; without the ``experiments`` extra a
harness command is one line naming the extra (exit code 2, no traceback); without a clone, one
line saying where the harness is, while ``--version`` and ``launch`` still work."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import bppsa
import bppsa_cli
from experiments import cli

ROOT = Path(__file__).resolve().parents[2]
RNN_TRAIN = cli.config_paths()["rnn_train"]

# reST/Sphinx markup that a terminal shows raw: a role (:func:`x`, :mod:`x`, ...) or inline literals (``x``)
REST = re.compile(r":[a-z]+(:[a-z]+)?:`|``")


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["JAX_PLATFORMS"] = "cpu"
    return env


def test_the_rest_pattern_finds_roles_and_literals():
    assert REST.search("see :func:`bppsa.rnn`") and REST.search(":py:class:`X`") and REST.search("``a``")
    assert not REST.search("bppsa run CONFIG[:arg] --config.key=value (e.g. :smoke)")


def test_version_is_the_library_version_without_importing_jax():
    code = ("import sys, bppsa_cli; code = bppsa_cli.main(['--version']); "
            "assert 'jax' not in sys.modules, 'jax imported'; sys.exit(code)")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=_env(), capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0 and r.stdout == f"bppsa {bppsa.__version__}\n", r
    assert re.fullmatch(r"\d+\.\d+\.\d+([.-]?\w+)?", bppsa.__version__)


def test_version_through_the_harness(capsys):
    assert cli.main(["--version"]) == 0
    assert capsys.readouterr().out == f"bppsa {bppsa.__version__}\n"


def test_help_lists_every_subcommand_with_one_line(capsys):
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    commands = ["reproduce", *cli.COMMANDS]
    assert set(cli.SUMMARIES) == set(commands)
    for name in commands:
        lines = [line for line in out.splitlines() if line.startswith("  ") and line.split()[:1] == [name]]
        assert len(lines) == 1, (name, out)
        assert lines[0].split(None, 1)[1].strip() == cli.SUMMARIES[name] and len(lines[0]) <= 100, lines[0]
    assert "--version" in out and not REST.search(out), out


@pytest.mark.parametrize("command", ["run", "results", "bench", "launch", "reproduce"])
def test_no_help_shows_rest_markup(capsys, command):
    try:
        code = cli.main([command, "--help"])
    except SystemExit as e:  # argparse's --help
        code = e.code
    assert code == 0
    captured = capsys.readouterr()
    out = captured.out
    assert out.startswith(f"usage: bppsa {command}") and not captured.err, captured
    assert not REST.search(out), REST.findall(out)
    assert len(out.splitlines()) <= 40, f"bppsa {command} --help is {len(out.splitlines())} lines"


# A meta-path finder ahead of all others that makes `ml_collections` (a package of the extra) unimportable,
# as in an install without the extra; then the command, as the console script runs it.
_WITHOUT_ML_COLLECTIONS = """
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] == 'ml_collections':
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, Block())
import bppsa_cli
if sys.argv[1] == 'on-import':  # skip the check before the run: the import in the runner fails
    bppsa_cli.missing_extra = lambda: []
sys.argv = ['bppsa', *sys.argv[2:]]
sys.exit(bppsa_cli.main())
"""


@pytest.mark.parametrize("when", ["checked", "on-import"])
def test_a_missing_extra_is_one_line_naming_it(tmp_path, when):
    work = tmp_path / "w"
    r = subprocess.run([sys.executable, "-c", _WITHOUT_ML_COLLECTIONS, when, "run", f"{RNN_TRAIN}:smoke",
                        "--workdir", str(work)], cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=300)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and "Traceback" not in r.stderr, r
    assert "'experiments' extra" in lines[0] and "pip install 'bppsa[experiments]'" in lines[0], lines[0]
    assert "ml_collections" in lines[0] and lines[0].startswith("bppsa run: error:"), lines[0]
    assert not work.exists()


def test_a_missing_extra_with_debug_shows_the_traceback(tmp_path):
    r = subprocess.run([sys.executable, "-c", _WITHOUT_ML_COLLECTIONS, "checked", "--debug", "run",
                        f"{RNN_TRAIN}:smoke", "--workdir", str(tmp_path / "w")], cwd=ROOT, env=_env(),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode != 0 and "Traceback" in r.stderr and "ModuleNotFoundError" in r.stderr, r


def test_the_clone_is_found_beside_the_library():
    assert bppsa_cli.clone_root() == ROOT
    assert bppsa_cli.missing_extra() == []  # this test environment has the extra


def test_without_a_clone_the_harness_commands_say_where_it_is(tmp_path):
    """bppsa installed without the repository (a wheel): the library's own command works, the harness's don't."""
    (tmp_path / "bppsa").symlink_to(ROOT / "bppsa", target_is_directory=True)
    shutil.copy(ROOT / "bppsa_cli.py", tmp_path / "bppsa_cli.py")

    def bppsa_command(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, str(tmp_path / "bppsa_cli.py"), *args], cwd=tmp_path, env=_env(),
                              capture_output=True, text=True, timeout=300)

    r = bppsa_command("run", "x.py")
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and "Traceback" not in r.stderr, r
    assert lines[0].startswith("bppsa run: error: the experiment harness runs from a clone"), lines[0]
    assert "pip install -e '.[experiments]'" in lines[0] and str(tmp_path / "bppsa") in lines[0], lines[0]
    assert bppsa_command("--version").stdout == f"bppsa {bppsa.__version__}\n"
    r = bppsa_command("--help")
    assert r.returncode == 0 and "launch" in r.stdout and "clone" in r.stdout, r
    r = bppsa_command("launch", "--help")
    assert r.returncode == 0 and r.stdout.startswith("usage: bppsa launch"), r
