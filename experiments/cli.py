"""The ``bppsa`` command: ``bppsa reproduce NAME``, ``bppsa run``, ``bppsa bench``, ``bppsa launch``, ...

Each subcommand lives in the module that owns the feature; this file only dispatches. An entry
is "module:function", the function takes the remaining argv and returns an exit code.
``bppsa reproduce NAME [--quick|--smoke] [args...]`` is exactly ``bppsa run
experiments/<paper>/configs/NAME.py[:quick|:smoke] [args...]`` (dashes in NAME read as underscores);
the names are the config files present (unique across the papers' folders). The command opts in to
:func:`bppsa.host.tune_allocator` once at start.

Errors: a :class:`bppsa.errors.UsageError` (bad input: a config, a flag, a data folder) from any
subcommand is printed as one line, ``bppsa COMMAND: error: ...``, with exit code 2; the global
flag ``--debug`` (``bppsa --debug COMMAND ...``, or anywhere before a ``--``) prints the
traceback instead (exit code 2 as well). Ctrl-C and SIGTERM are one line too (with ``run`` and
``reproduce``: run the same command again to resume), exit code 130 and 143, at any moment, the
imports included (:mod:`experiments.interrupt`); ``--debug`` adds the traceback. This module imports
nothing heavy at its top: the command handles stop signals before it imports JAX.
"""

from __future__ import annotations

import importlib
import json
import os
import signal
import sys
import textwrap
import traceback
from collections.abc import Sequence
from pathlib import Path

from experiments import RunFailed, interrupt

__all__ = ["main", "config_paths", "config_path", "reproduce_names", "reproduce_argv", "split_debug"]

EXPERIMENTS = Path(__file__).resolve().parent  # one folder per paper, each with its configs/

# bppsa COMMAND [args...]
COMMANDS = {
    "run": "experiments.runner:main",
    "results": "experiments.index:main",
    "launch": "bppsa.parallel.launch:main",
    "bench": "experiments.cli:bench",
}

# one line each, for `bppsa --help`
SUMMARIES = {
    "reproduce": "run a paper's result by name: NAME [--quick|--smoke] (= bppsa run its config)",
    "run": "run one experiment config: CONFIG[:preset] [--config.key=value ...] [--workdir DIR]",
    "results": "regenerate (or --check) the index of the committed results, experiments/results/",
    "bench": "time BPPSA against BPTT and the baselines for one cell over a T x B grid",
    "launch": "run a command as N local processes of one JAX job (jax.distributed on 127.0.0.1)",
}

USAGE = """usage: bppsa [--debug] [--version] COMMAND [args...]

commands:
{commands}

{names}

--debug: show the traceback of an error (without it, bad input is one line and exit code 2).
--version: print bppsa's version.
Run `bppsa COMMAND --help` for a command's options."""


def config_paths(root: str | os.PathLike = EXPERIMENTS) -> dict[str, Path]:
    """Every config of the harness, ``{stem: root/<paper>/configs/<stem>.py}`` (stems are unique)."""
    from bppsa.errors import UsageError
    paths: dict[str, Path] = {}
    for p in sorted(Path(root).glob("*/configs/*.py")):
        if p.name.startswith("_"):
            continue
        if p.stem in paths:
            raise UsageError(f"two configs named {p.stem!r}: {paths[p.stem]} and {p}; config names must be unique")
        paths[p.stem] = p
    return paths


def config_path(name: str, root: str | os.PathLike = EXPERIMENTS) -> Path:
    """The config ``bppsa reproduce NAME`` runs (dashes in NAME read as underscores).

    Raises UsageError naming the unknown NAME and the known ones.
    """
    from bppsa.errors import UsageError
    path = config_paths(root).get(name.replace("-", "_"))
    if path is None:
        raise UsageError(f"unknown NAME {name!r}; expected one of: {', '.join(reproduce_names(root))}")
    return path


def reproduce_names(root: str | os.PathLike = EXPERIMENTS) -> list[str]:
    """The names ``bppsa reproduce`` accepts: one per config file, underscores written as dashes."""
    return sorted(stem.replace("_", "-") for stem in config_paths(root))


def reproduce_argv(argv: Sequence[str], root: str | os.PathLike = EXPERIMENTS) -> list[str]:
    """``[NAME, --quick|--smoke?, args...]`` -> the argv of ``bppsa run`` it stands for.

    Raises UsageError naming the unknown NAME and the known ones.
    """
    from bppsa.errors import UsageError
    name, rest = argv[0], list(argv[1:])
    path = config_path(name, root)
    presets = [a[2:] for a in rest if a in ("--quick", "--smoke")]
    if len(set(presets)) > 1:
        raise UsageError(f"pass one of --quick and --smoke, not both; got {' '.join(f'--{p}' for p in presets)}")
    rest = [a for a in rest if a not in ("--quick", "--smoke")]
    return [str(path) + (f":{presets[0]}" if presets else "")] + rest


def bench(argv: Sequence[str]) -> int:
    """``bppsa bench``: BPPSA vs BPTT (and every baseline, and ``auto``'s choice) for a cell at every
    T × B, through the one runner: exactly ``bppsa run experiments/paper_bppsa/configs/rnn_sweep.py``
    with those points as its grid (``--out`` is the work directory, ``--publish`` copies the result)."""
    import argparse
    import shlex

    from bppsa.errors import UsageError
    from bppsa.plan import calibration
    from bppsa.scan import SCANS
    from experiments import bench as bench_lib
    from experiments import runner
    from experiments.calibrate import load_cost_model
    p = argparse.ArgumentParser(prog="bppsa bench", description=(
        "BPPSA against BPTT (and every baseline, and auto's choice) for one cell at every T x B: "
        "bppsa run experiments/paper_bppsa/configs/rnn_sweep.py with those points as its grid "
        "(--out is the work directory, --publish copies the result)."))
    p.add_argument("--cell", default="rnn", choices=sorted(bench_lib.CELLS))
    p.add_argument("--hidden", type=int, default=20)
    p.add_argument("--input", type=int, default=1)
    p.add_argument("--T", default="1000", help="comma-separated sequence lengths (default: %(default)s)")
    p.add_argument("--B", default="16", help="comma-separated batch sizes (default: %(default)s)")
    p.add_argument("--scan", default="blelloch", choices=sorted(SCANS))
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--no-auto", action="store_true", help="skip the baselines and the auto choice")
    p.add_argument("--calibrate", action="store_true", help="probe this machine first and cache its cost model "
                   "(refines the model shipped with bppsa; about a minute)")
    p.add_argument("--gemm", action="store_true", help="also record bare batched-GEMM rates")
    p.add_argument("--out", default="runs/bench", help="the run's work directory (default: %(default)s)")
    p.add_argument("--name", default="bench")
    p.add_argument("--note", default="", help="a line written into the result file (e.g. how loaded the machine was)")
    p.add_argument("--restart", action="store_true", help="replace what an earlier run wrote in --out")
    p.add_argument("--publish", action="store_true", help="also copy the result to experiments/results/<device>/")
    a = p.parse_args(list(argv))
    Ts, Bs = bench_lib.check_flags(a)
    if a.calibrate:
        load_cost_model(recalibrate=True)  # cached for this device: the run's `auto` reads it
        calibration.default_cost_model.cache_clear()
    overrides = {"T_values": "()", "B_values": "()", "grid_T": ",".join(map(str, Ts)) + ",",
                 "grid_B": ",".join(map(str, Bs)) + ",", "cell": a.cell, "input_size": str(a.input),
                 "hidden_size": str(a.hidden), "scan": a.scan, "repeats": str(a.repeats),
                 "auto": str(not a.no_auto).lower(), "gemm": str(a.gemm).lower(), "name": a.name, "note": a.note}
    try:
        summary = runner.run(config_path("rnn_sweep"), None, overrides, workdir=a.out, restart=a.restart,
                             publish=a.publish, command="bppsa bench " + shlex.join(argv))
    except UsageError as e:  # the runner's words for the work directory: here it is --out
        raise UsageError(str(e).replace("--workdir", "--out")) from e
    print(json.dumps(summary, indent=1))
    return 0


def _load(target: str):
    module, func = target.split(":")
    return getattr(importlib.import_module(module), func)


def _usage() -> str:
    names = ["reproduce", *sorted(COMMANDS)]
    cmds = "\n".join(f"  {name:<10}  {SUMMARIES[name]}" for name in names)
    names_line = textwrap.fill("reproduce NAME is one of: " + ", ".join(reproduce_names()), width=100,
                               subsequent_indent="  ", break_on_hyphens=False)
    return USAGE.format(names=names_line, commands=cmds)


def split_debug(argv: Sequence[str]) -> tuple[bool, list[str]]:
    """Take the global ``--debug`` out of ``argv``: before the command, or after it but before a ``--``
    (what follows ``--`` belongs to another program, e.g. the one ``bppsa launch`` starts)."""
    end = argv.index("--") if "--" in argv else len(argv)
    debug = "--debug" in argv[:end]
    return debug, [a for i, a in enumerate(argv) if i >= end or a != "--debug"]


def _dispatch(cmd: str, rest: list[str]) -> int:
    if cmd == "reproduce":
        if not rest or rest[0] in ("-h", "--help"):
            usage = (f"usage: bppsa reproduce NAME [--quick|--smoke] [--config.key=value ...] [--workdir DIR]; "
                     f"NAME is one of: {', '.join(reproduce_names())}")
            # argparse's convention: asked for, the usage on stdout; missing, usage and error on stderr, exit 2
            if rest:
                print(usage)
                return 0
            print(f"{usage}\nbppsa reproduce: error: missing NAME", file=sys.stderr)
            return 2
        run = _load(COMMANDS["run"])
        interrupt.raise_from_now()  # its modules loaded: the command's work begins
        return int(run(reproduce_argv(rest)) or 0)
    command = _load(COMMANDS[cmd])
    interrupt.raise_from_now()
    return int(command(rest) or 0)


def _report(error: BaseException, debug: bool, template: str) -> None:
    """The traceback with --debug, else ``template`` filled with the error's message as one line."""
    if debug:
        traceback.print_exc()
    else:
        message = " ".join(line.strip() for line in str(error).splitlines() if line.strip())
        print(template.format(message), file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    console = argv is None  # the `bppsa` command itself (not a call from Python)
    debug, line = False, "bppsa: interrupted ({})"  # {}: the signal
    try:
        if console:
            # first, before JAX is imported: a stop signal at any moment ends the command the same way
            interrupt.install()
        debug, argv = split_debug(list(sys.argv[1:] if argv is None else argv))
        cmd = argv[0] if argv and (argv[0] == "reproduce" or argv[0] in COMMANDS) else ""
        hint = "; run the same command again to resume" if cmd in ("run", "reproduce") else ""
        line = f"bppsa{' ' + cmd if cmd else ''}: interrupted ({{}}){hint}"
        if console:  # the imports: a stop signal ends the command at once (interrupt.raise_from_now: its work)
            interrupt.stop_at_once(line)
        code = _main(argv, debug, console)
        if console:
            # all done and saved: a stop signal during interpreter shutdown ends the process at once
            interrupt.stop_at_once(line)
            signum = interrupt.received()
            if signum is not None:  # its interrupt went astray (dropped, and sent again too late)
                interrupt.end(line, signum)
        return code
    except BaseException as e:
        # a recorded stop signal is the truth, whatever exception followed it (an interrupt inside an
        # extension module's import is an ImportError): experiments.interrupt
        signum = interrupt.received() if console else None
        if signum is None:
            if not isinstance(e, KeyboardInterrupt):
                raise
            signum = e.signum if isinstance(e, interrupt.Interrupted) else signal.SIGINT
        if debug:
            traceback.print_exc()
        if console:
            # not a return: interpreter shutdown can crash on a compile the signal left running
            interrupt.end(line, signum)
        print(line.format(interrupt.describe(signum)), file=sys.stderr)
        return 128 + signum  # as a shell reports it: 130 for SIGINT, 143 for SIGTERM


def _main(argv: list[str], debug: bool, console: bool) -> int:
    if argv and argv[0] in ("--version", "-V"):
        from bppsa_cli import version  # read from bppsa/__init__.py without importing JAX
        print(f"bppsa {version()}")
        return 0
    from bppsa import host
    from bppsa.errors import UsageError
    if not argv or argv[0] in ("-h", "--help"):
        if argv:
            print(_usage())
            return 0
        print(f"{_usage()}\n\nbppsa: error: missing COMMAND", file=sys.stderr)
        return 2
    cmd, rest = argv[0], argv[1:]
    if cmd != "reproduce" and cmd not in COMMANDS:
        print(f"bppsa: unknown command {cmd!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    host.tune_allocator()  # the entry point opts in (see bppsa.host); `import bppsa` does not
    if debug:
        os.environ["BPPSA_DEBUG"] = "1"  # the runner then shows background threads' reports as they come
    try:
        return _dispatch(cmd, rest)
    except UsageError as e:
        _report(e, debug, f"bppsa {cmd}: error: {{}} (--debug shows the traceback)")
        return 2
    except RunFailed as e:
        _report(e, debug, f"bppsa {cmd}: failed: {{}}")
        if console and e.abandon_threads and not debug:
            # a write failed (disk full): the library's background writers (orbax, tensorstore) failed too
            # and would print their tracebacks as they wind down; everything bppsa wrote is on disk
            interrupt.leave(1)
        return 1


if __name__ == "__main__":
    sys.exit(main())
