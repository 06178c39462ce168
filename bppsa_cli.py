"""The ``bppsa`` command's entry point: light (nothing but the standard library at import, so the
command handles stop signals before JAX loads), and honest about what is installed.

The wheel holds the library, ``bppsa``. The experiment harness (``experiments/``: the runner, the
papers' configs and committed results, ``bppsa run``, ``reproduce``, ``bench``, ``results``) lives
in the repository beside it and is never installed as a package of its own: this entry finds it in
the clone that ``bppsa`` itself is imported from (an editable install, ``make``'s
``pip install -e '.[dev]'``, or ``PYTHONPATH`` set to a clone), puts that clone on the path of this
process and of the processes it starts, and hands over to ``experiments.cli.main``.

Without a clone: ``bppsa --version`` and ``bppsa launch`` (the library's own command) work; any
other command is one line saying where the harness is, exit code 2. With a clone but without the
``experiments`` extra's packages: one line naming the extra, exit code 2 (``--debug`` shows the
traceback instead).
"""

from __future__ import annotations

import ast
import importlib.util
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

__all__ = ["main", "version", "clone_root", "missing_extra"]

EXTRA = "experiments"
# the top-level import names of the `experiments` extra's packages (pyproject.toml), its own and
# those of the `distributed` and `tasks` extras it includes
EXTRA_MODULES = ("ml_collections", "matplotlib", "librosa", "soundfile", "tqdm", "orbax", "ray", "sklearn")
HARNESS_COMMANDS = ("run", "reproduce", "bench", "results")
CLONE_INSTALL = f"pip install -e '.[{EXTRA}]'"  # in a clone; `make` runs it (with [dev], which includes it)


def _bppsa_init() -> Path | None:
    """The ``bppsa/__init__.py`` an ``import bppsa`` would load, found without importing it."""
    spec = importlib.util.find_spec("bppsa")
    return Path(spec.origin) if spec is not None and spec.origin else None


def version() -> str:
    """The library's version, ``bppsa.__version__``, read from the source without importing JAX."""
    init = _bppsa_init()
    if init is not None:
        for node in ast.parse(init.read_text(encoding="utf-8")).body:
            if (isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__version__"
                                                     for t in node.targets)
                    and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)):
                return node.value.value
    from importlib import metadata
    return metadata.version("bppsa")


def clone_root() -> Path | None:
    """The repository ``bppsa`` is imported from, if it holds the harness (``experiments/cli.py``); else None."""
    init = _bppsa_init()
    if init is None:
        return None
    root = init.absolute().parent.parent
    return root if (root / "experiments" / "cli.py").is_file() and (root / "pyproject.toml").is_file() else None


def _absent(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is None
    except (ImportError, ValueError):
        return True


def missing_extra() -> list[str]:
    """The modules of the ``experiments`` extra that cannot be imported (found without importing them)."""
    return [m for m in EXTRA_MODULES if _absent(m)]


def _extra_error(command: str, modules: Sequence[str]) -> int:
    print(f"bppsa{' ' + command if command else ''}: error: the experiment harness needs bppsa's '{EXTRA}' "
          f"extra (missing: {', '.join(modules)}); install it: pip install 'bppsa[{EXTRA}]' (in the clone: "
          f"{CLONE_INSTALL})", file=sys.stderr)
    return 2


def _without_harness(argv: list[str]) -> int:
    """The command where no clone holds the harness: the library's own subcommand, the version, one line."""
    if argv and argv[0] == "launch":
        from bppsa.parallel.launch import main as launch
        return int(launch(argv[1:]) or 0)
    usage = ("usage: bppsa [--version] COMMAND [args...]\n\n"
             "commands of this install (the library):\n"
             "  launch      run a command as N local processes of one JAX job\n\n"
             "The experiment harness (run, reproduce, bench, results) runs from a clone of the repository:\n"
             f"  {CLONE_INSTALL}   (in the clone; `make` does it)")
    if argv and argv[0] in ("-h", "--help"):
        print(usage)
        return 0
    what = f"bppsa {argv[0]}" if argv and argv[0] in HARNESS_COMMANDS else "bppsa"
    print(f"{what}: error: the experiment harness runs from a clone of the repository, and this bppsa "
          f"({(_bppsa_init() or Path('?')).parent}) is not in one: in a clone, {CLONE_INSTALL} (`make` does); "
          "`bppsa launch` and `bppsa --version` work here", file=sys.stderr)
    return 2


def _stop_before_start(signum: int, frame: object) -> None:
    """A stop signal before the harness handles signals (its imports): nothing has run, so the command
    ends at once, with its one line and 128 + the signal, not a traceback."""
    name = "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name
    os.write(2, f"bppsa: interrupted ({name})\n".encode())
    os._exit(128 + signum)


def main(argv: Sequence[str] | None = None) -> int:
    """The ``bppsa`` command; ``argv`` None: the process's arguments (and the command's own signal handling)."""
    if argv is None:  # the command: stop signals end it with one line from here on (the harness takes over)
        for signum in (signal.SIGINT, signal.SIGTERM):
            if signal.getsignal(signum) is not signal.SIG_IGN:
                signal.signal(signum, _stop_before_start)
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in ("--version", "-V"):
        print(f"bppsa {version()}")
        return 0
    root = clone_root()
    if root is None:
        return _without_harness(args)
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    paths = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    if str(root) not in paths:  # the processes a run starts (python -c, Ray's workers) import the harness too
        os.environ["PYTHONPATH"] = os.pathsep.join([str(root), *[p for p in paths if p]])
    end = args.index("--") if "--" in args else len(args)
    debug = "--debug" in args[:end]
    command = next((a for a in args[:end] if a != "--debug"), "")
    if command in HARNESS_COMMANDS and not debug and (missing := missing_extra()):
        return _extra_error(command, missing)
    from experiments import cli
    try:
        return cli.main(argv)
    except ModuleNotFoundError as e:  # a module of the extra that the check above could not see
        if debug or (e.name or "").split(".")[0] not in EXTRA_MODULES:
            raise
        return _extra_error(command, [e.name or "?"])


if __name__ == "__main__":
    sys.exit(main())
