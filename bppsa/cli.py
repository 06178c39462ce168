"""The ``bppsa`` command: ``bppsa reproduce NAME``, ``bppsa run``, ``bppsa bench``, ``bppsa launch``.

Each subcommand lives in the module that owns the feature; this file only dispatches. An entry
is "module:function", the function takes the remaining argv and returns an exit code.
"""

from __future__ import annotations

import importlib
import sys

# bppsa reproduce NAME [args...]
REPRODUCE = {
    "default": "bppsa.irmas_experiment:main",  # what `make reproduce` runs
    "rnn-train": "bppsa.tasks:main_rnn_train",
    "irmas": "bppsa.irmas_experiment:main",
    "hetero-dp": "bppsa.hetero.experiment:main",
    "sync": "bppsa.sync.experiments:main_sync",  # time to accuracy, BSP/ASP/SSP/DSSP/ElasticBSP
    "zipline": "bppsa.sync.experiments:main_zipline",  # ZipLine runtime table
    "sync-ray": "bppsa.sync.ray_runtime:main_ray",  # the same policies on a real (local) Ray
    "sparse-vgg": "bppsa.sparse_experiments:main",
    "rnn-sweep": "bppsa.bench:main_rnn_sweep",
}

# bppsa COMMAND [args...]
COMMANDS = {
    "run": "bppsa.runner:main",
    "results": "bppsa.results:main",
    "launch": "bppsa.parallel.launch:main",
    "bench": "bppsa.bench:main",
}

USAGE = """usage: bppsa COMMAND [args...]

commands:
  reproduce NAME [--quick] ...   reproduce a paper result; NAME is one of: {names}
{commands}
Run `bppsa COMMAND --help` for a command's options."""


def _load(target: str):
    module, func = target.split(":")
    return getattr(importlib.import_module(module), func)


def _usage() -> str:
    cmds = "".join(f"  {name}\n" for name in sorted(COMMANDS))
    return USAGE.format(names=", ".join(sorted(REPRODUCE)), commands=cmds)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0 if argv else 2
    cmd, rest = argv[0], argv[1:]
    if cmd == "reproduce":
        if not rest or rest[0] in ("-h", "--help"):
            print(f"usage: bppsa reproduce NAME [args...]; NAME is one of: {', '.join(sorted(REPRODUCE))}")
            return 0 if rest else 2
        if rest[0] not in REPRODUCE:
            print(f"bppsa reproduce: unknown NAME {rest[0]!r}; expected one of: {', '.join(sorted(REPRODUCE))}",
                  file=sys.stderr)
            return 2
        return int(_load(REPRODUCE[rest[0]])(rest[1:]) or 0)
    if cmd in COMMANDS:
        return int(_load(COMMANDS[cmd])(rest) or 0)
    print(f"bppsa: unknown command {cmd!r}\n\n{_usage()}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
