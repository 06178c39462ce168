"""The ``bppsa`` command: ``bppsa reproduce NAME``, ``bppsa run``, ``bppsa bench``, ``bppsa launch``, ...

Each subcommand lives in the module that owns the feature; this file only dispatches. An entry
is "module:function", the function takes the remaining argv and returns an exit code.
``bppsa reproduce NAME [--quick] [args...]`` is exactly ``bppsa run
experiments/configs/NAME.py[:quick] [args...]`` (dashes in NAME read as underscores); the names
are the config files present. The command opts in to :func:`bppsa.host.tune_allocator` once at start.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

from . import host

CONFIGS = Path(__file__).resolve().parents[1] / "experiments" / "configs"

# bppsa COMMAND [args...]
COMMANDS = {
    "run": "bppsa.runner:main",
    "results": "bppsa.results:main",
    "launch": "bppsa.parallel.launch:main",
    "bench": "bppsa.bench:main",
}

USAGE = """usage: bppsa COMMAND [args...]

commands:
  reproduce NAME [--quick] ...   = run experiments/configs/NAME.py[:quick] ...; NAME is one of: {names}
{commands}
Run `bppsa COMMAND --help` for a command's options."""


def reproduce_names(configs=CONFIGS) -> list[str]:
    """The names ``bppsa reproduce`` accepts: one per config file, underscores written as dashes."""
    return sorted(p.stem.replace("_", "-") for p in Path(configs).glob("*.py") if not p.name.startswith("_"))


def reproduce_argv(argv, configs=CONFIGS) -> list[str]:
    """``[NAME, --quick?, args...]`` -> the argv of ``bppsa run`` it stands for.

    Raises ValueError naming the unknown NAME and the known ones.
    """
    name, rest = argv[0], list(argv[1:])
    path = Path(configs) / f"{name.replace('-', '_')}.py"
    if not path.is_file():
        raise ValueError(f"unknown NAME {name!r}; expected one of: {', '.join(reproduce_names(configs))}")
    quick = "--quick" in rest
    rest = [a for a in rest if a != "--quick"]
    return [str(path) + (":quick" if quick else "")] + rest


def _load(target: str):
    module, func = target.split(":")
    return getattr(importlib.import_module(module), func)


def _usage() -> str:
    cmds = "".join(f"  {name}\n" for name in sorted(COMMANDS))
    return USAGE.format(names=", ".join(reproduce_names()), commands=cmds)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0 if argv else 2
    host.tune_allocator()  # the entry point opts in (see bppsa.host); `import bppsa` does not
    cmd, rest = argv[0], argv[1:]
    if cmd == "reproduce":
        if not rest or rest[0] in ("-h", "--help"):
            print(f"usage: bppsa reproduce NAME [--quick] [--config.key=value ...] [--workdir DIR]; "
                  f"NAME is one of: {', '.join(reproduce_names())}")
            return 0 if rest else 2
        try:
            run_argv = reproduce_argv(rest)
        except ValueError as e:
            print(f"bppsa reproduce: {e}", file=sys.stderr)
            return 2
        return int(_load(COMMANDS["run"])(run_argv) or 0)
    if cmd in COMMANDS:
        return int(_load(COMMANDS[cmd])(rest) or 0)
    print(f"bppsa: unknown command {cmd!r}\n\n{_usage()}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
