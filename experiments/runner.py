"""``bppsa run CONFIG[:arg] [--config.key=value ...] [--workdir DIR]``: run one experiment config.

A config is a Python file exposing ``get_config(arg=None)`` that returns an
``ml_collections.ConfigDict`` with ``task = "package.module:function"``; the task has the
signature ``function(config, workdir: experiments.workdir.RunDir) -> dict``: ``workdir`` reads as the
work directory's path, and the task obtains each top-level path it creates there from
``workdir.entry(name)`` (or ``experiments.entry(workdir, name)``), which lists it as bppsa's
first. The runner loads the file by path, locks the config (no new keys), applies the
``--config.key=value`` overrides with type checks, writes the resolved config to
``workdir/config.json``, calls the task and writes ``workdir/summary.json`` (the task's summary
plus provenance). Re-running the same command on the same work directory resumes: training
tasks use :func:`experiments.train.fit`, which restores the latest checkpoint. ``--publish`` copies the
task's result (``<name>.json``, ``.md``, ``.png``, ``<name>_<part>.png``) into ``experiments/results/<device>/``:
only from a run that ended complete, all of its files or none (:func:`publish_result`), under a name no
preset shares with the full run (:func:`publish_name`: ``rnn_train.py:smoke`` publishes ``rnn_train-smoke``).
The same command on a work directory whose run ended complete runs nothing again: it keeps the results
(``--publish`` then publishes them, rewriting no file that already holds the same bytes).

A run tells the truth: it fails (:class:`experiments.RunFailed`, one line, exit status 1, the marker
"failed") when a part of its task fails (:func:`experiments.part_failed`; ``keep_partial = True`` in
a config keeps the rest, marked partial, never published), when its work directory is removed or
altered under it (:meth:`experiments.workdir.WorkDir.finish`), or when a write fails for lack of room
(:func:`write_error`: one line naming the path, with the resume hint; the error reports of the
library's background writer threads are held back meanwhile and shown only when the run ends
otherwise). A config missing a key its task reads, or a task that does not take
``(config, workdir)``, is one line too.

Checks before anything is written: a task declares the checks of its config with
``@bppsa.errors.checked_by(check)`` next to its definition; after the overrides the runner calls
``check(config)``, which raises :class:`bppsa.errors.UsageError` on a value of the right type but
out of range (an unknown method, ``steps = -5``). Nothing is written for a config that fails.

The work directory (:mod:`experiments.workdir`): bppsa deletes or overwrites only files that this run
(or the run it resumes) created, inside its work directory, and never two runs at once in one
directory. The marker ``.bppsa-run.json`` lists what bppsa created there, each entry before it is
created (through :meth:`experiments.workdir.WorkDir.entry`, the run's writer); a folder without it that
holds anything is refused; ``--restart`` deletes the listed entries only; ``.bppsa-lock`` keeps a
second run out. A run that never started (its task refused the input with a UsageError before any
run there made progress, or wrote nothing but config.json) may be re-run with a corrected config; a
run that made progress is only resumed with the same config.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import inspect
import json
import os
import shlex
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import ml_collections

from bppsa.errors import UsageError
from experiments import RunFailed
from experiments.configfile import ConfigError, apply_overrides, load_config, short, split_overrides, split_spec
from experiments.failures import Background, failed_parts, missing_key, quiet_background, write_error
from experiments.provenance import current_command, device_label, provenance, running_command, save_json
from experiments.publish import publish_result
from experiments.workdir import MARKER, WorkDir, check_name, read_marker

__all__ = ["ConfigError", "MARKER", "load_config", "apply_overrides", "resolve_task", "read_marker", "run",
           "publish_name", "current_command", "main"]

def resolve_task(target: str) -> Callable:
    """"package.module:function" -> the function."""
    module, sep, func = target.partition(":")
    if not sep or not module or not func:
        raise ConfigError(f"config.task must be \"package.module:function\"; got {target!r}")
    try:
        fn = getattr(importlib.import_module(module), func)
    except (ImportError, AttributeError) as e:
        raise ConfigError(f"config.task = {target!r} cannot be loaded: {e}") from None
    except Exception as e:  # the task's module itself failed at import
        raise ConfigError(f"config.task = {target!r}: importing {module} failed: {type(e).__name__}: "
                          f"{short(str(e), 200)}") from e
    if not callable(fn):
        raise ConfigError(f"config.task = {target!r} is not a function")
    try:
        inspect.signature(fn).bind(None, None)
    except TypeError:
        raise ConfigError(f"config.task = {target!r} must take (config, workdir); its signature is "
                          f"{func}{inspect.signature(fn)}") from None
    except ValueError:  # no signature to read (a builtin): let the call tell
        pass
    return fn


def _to_plain(obj) -> Any:
    """A config as JSON reads it back: dicts (ConfigDicts and dicts inside tuples) and lists only."""
    if isinstance(obj, (ml_collections.ConfigDict, dict)):
        return {k: _to_plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_to_plain(v) for v in obj]
    return obj


def _diff(old: dict, new: dict, prefix="") -> list[str]:
    out = []
    for k in sorted(set(old) | set(new)):
        a, b = old.get(k, "<absent>"), new.get(k, "<absent>")
        if isinstance(a, dict) and isinstance(b, dict):
            out += _diff(a, b, prefix + k + ".")
        elif a != b:
            out.append(f"{prefix}{k}: {short(repr(a))} -> {short(repr(b))}")
    return out


def default_workdir(path: Path, arg: str | None) -> Path:
    return Path("runs") / (path.stem + (f"-{arg}" if arg else ""))


def publish_name(path: Path, arg: str | None, config: ml_collections.ConfigDict) -> str:
    """The name ``--publish`` gives a run's result: ``config.name`` (else the config file's stem), with
    ``-<preset>`` added when a preset's run would carry the full run's name (``rnn_train.py:smoke``
    publishes ``rnn_train-smoke``): a smoke or quick run never replaces the full result."""
    name = str(config.get("name", path.stem))
    if arg is None:
        return name
    full = str(load_config(path).get("name", path.stem))
    return f"{name}-{arg}" if name == full else name


def _finished(wd: WorkDir) -> dict | None:
    """The summary of the complete run the work directory holds ("done"), else None: the same command
    again then runs nothing (nothing is measured again); ``--restart`` runs it again."""
    m = wd.marker or {}
    if m.get("status") != "done" or "summary.json" not in m.get("written", []):
        return None
    try:
        summary = json.loads((wd.path / "summary.json").read_text())["summary"]
    except (OSError, ValueError, KeyError, TypeError):
        return None  # unreadable: the run runs again, as a resume
    if not isinstance(summary, dict):
        return None
    print(f"bppsa run: the run in {str(wd.path)!r} finished already; nothing is run again "
          f"(--restart runs it again)", file=sys.stderr)
    return summary


def _prepare(wd: WorkDir, resolved: dict, restart: bool) -> None:
    """Apply --restart and the resume rules to a locked work directory (see the module docstring)."""
    if restart:
        wd.remove_written()
        return
    wd.check_intact()
    config_file = wd.path / "config.json"
    if wd.marker is None or "config.json" not in wd.marker["written"] or not config_file.exists():
        return
    try:
        old = json.loads(config_file.read_text())
    except ValueError:
        raise ConfigError(f"{str(config_file)!r} is not valid JSON; pass another --workdir, or --restart") from None
    changes = _diff(old, resolved) if isinstance(old, dict) else ["<not a config>"]
    if changes and wd.never_started():
        print(f"bppsa run: the run in {str(wd.path)!r} never started; replacing its config "
              f"({'; '.join(changes)})", file=sys.stderr)
        wd.remove_written()
    elif changes:
        raise ConfigError(
            f"work directory {str(wd.path)!r} holds a run of a different config ({'; '.join(changes)}); re-run the "
            f"same command to resume it, pass --workdir for a new run, or --restart to delete what bppsa wrote there "
            f"and start over")


def _check_common(config: ml_collections.ConfigDict) -> None:
    """Checks every task shares: ``name`` is a plain file name, every ``seed`` an int every RNG accepts."""
    if "name" in config:
        check_name(config.name)
    groups: list[tuple[str, Any]] = [("", config)]
    while groups:
        prefix, group = groups.pop()
        for key, value in group.items():
            if isinstance(value, ml_collections.ConfigDict):
                groups.append((f"{prefix}{key}.", value))
            elif key == "seed" and isinstance(value, int) and not 0 <= value < 2 ** 32:
                raise ConfigError(f"config.{prefix}{key} must be an int in 0..{2 ** 32 - 1} (what numpy's and JAX's "
                                  f"random generators accept); got {short(str(value))}")


def run(config_path: str | os.PathLike, arg: str | None = None,
        overrides: dict[str, str] | Sequence[tuple[str, str]] = (), workdir: str | os.PathLike | None = None, *,
        restart: bool = False, publish: bool = False, results_root: str | os.PathLike = "experiments/results",
        command: str | None = None) -> dict:
    """Load, override, check and run one config; return the task's summary (see the module docstring)."""
    path = Path(config_path)
    config = load_config(path, arg)
    apply_overrides(config, overrides)
    task = resolve_task(str(config.task))
    check = getattr(task, "check", None)
    if check is not None:
        check(config)  # UsageError before anything is written
    _check_common(config)
    workdir = Path(workdir) if workdir is not None else default_workdir(path, arg)
    resolved = _to_plain(config)
    command = command or "bppsa run " + shlex.join([str(path) + (f":{arg}" if arg else "")] +
                                                   [f"--config.{k}={v}" for k, v in (
                                                       overrides.items() if isinstance(overrides, dict)
                                                       else overrides)])
    keep_partial = bool(config.get("keep_partial", False))
    name = str(config.get("name", path.stem))
    published_as = publish_name(path, arg, config) if publish else name  # a bad full config: before the run
    background = Background()
    with WorkDir(workdir) as wd, quiet_background(background):
        _prepare(wd, resolved, restart)
        done = _finished(wd)
        if done is not None:
            if publish:  # device_label() starts JAX's backend: only now (a task may set XLA's flags first)
                done = {**done, "published": publish_result(wd, name, Path(results_root) / device_label(),
                                                            published_as)}
            return done
        wd.start(progress=bool(wd.marker and wd.marker.get("progress")))
        status = "failed"
        try:
            wd.entry("config.json").write_text(json.dumps(resolved, indent=2) + "\n")
            t0 = time.perf_counter()
            with running_command(command):
                try:
                    summary = task(config, wd.run_dir())
                except (KeyError, AttributeError) as e:
                    missing = missing_key(e, config)
                    if missing is None:
                        raise
                    raise ConfigError(missing) from e
                except Exception as e:
                    problem = write_error(e, wd.path)
                    if problem is None:
                        raise
                    background.replaced = True
                    raise RunFailed(f"{problem}; what was written before is kept: free some space and re-run "
                                    f"the same command to resume{background.hint()}", abandon_threads=True) from e
            run_time = time.perf_counter() - t0
            if not isinstance(summary, dict):
                raise TypeError(f"task {config.task!r} must return a dict (a JSON-able summary); "
                                f"got {type(summary).__name__}")
            failed = failed_parts(summary)
            if failed and not keep_partial:
                raise RunFailed(f"part of the task failed ({'; '.join(failed)}); the run is marked failed"
                                + (" (set --config.keep_partial=True to keep the partial results)"
                                   if "keep_partial" in config else ""))
            if failed:
                summary = {**summary, "partial": True}
            save_json(wd.entry("summary.json"), {"config": resolved, "summary": summary, "run_time_s": run_time,
                                                 "provenance": provenance(command)})
            status = "partial" if failed else "done"
        except UsageError:
            status = "refused"
            raise
        except RunFailed as e:
            if not background.replaced:  # a part failed: the summary says what (a full disk takes nothing more)
                with contextlib.suppress(OSError):
                    save_json(wd.entry("summary.json"), {"config": resolved, "failed": str(e),
                                                         "provenance": provenance(command)})
            raise
        except OSError as e:
            problem = write_error(e, wd.path)
            if problem is None:
                raise
            raise RunFailed(f"{problem}; what was written before is kept: free some space and re-run the same "
                            f"command to resume") from e
        finally:
            problem = wd.finish(status)
            in_flight = sys.exc_info()[1]
            # the work directory's own failure is the news unless the run already failed for a reason
            # of its own (then a marker that could not be written is a consequence, e.g. disk full)
            if problem and (in_flight is None or (wd.damaged and not isinstance(
                    in_flight, (RunFailed, UsageError, KeyboardInterrupt)))):
                raise RunFailed(problem + ("; the run is marked failed" if wd.damaged else ""))
        if publish and status == "partial":
            raise RunFailed(f"--publish: the run kept partial results ({'; '.join(failed)}); a committed result is "
                            f"only replaced by a complete one: nothing was published")
        if publish:
            summary = {**summary, "published": publish_result(wd, name, Path(results_root) / device_label(),
                                                              published_as)}
    return summary


# `bppsa run --help`: plain text for a terminal (the module's docstring is the developer's account)
HELP = """Run one experiment config.

CONFIG is a Python file whose get_config(arg=None) returns the run's settings (CONFIG:arg passes
arg, e.g. :quick or :smoke); --config.key=value overrides a setting, type-checked. The run writes
config.json, its results and summary.json into the work directory (default: runs/<config>[-<arg>]).

The same command again resumes a stopped run, and runs nothing again when the run ended complete.
--restart deletes what bppsa wrote there and starts over; bppsa never deletes a file it did not
create. A failure is one line and exit code 1 (bad input: exit code 2), and the run is marked
failed. --publish copies a complete result (all its files or none) to experiments/results/<device>/."""

def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(
        prog="bppsa run", description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter,
        usage="bppsa run CONFIG[:arg] [--config.key=value ...] [--workdir DIR] [--restart] [--publish]")
    p.add_argument("config", help="path to a config file, optionally with :arg (e.g. :smoke)")
    p.add_argument("--workdir", default=None, help="work directory (default: runs/<config>[-<arg>])")
    p.add_argument("--restart", action="store_true",
                   help="delete what bppsa wrote in the work directory and start over")
    p.add_argument("--publish", action="store_true",
                   help="copy the complete result (<name>.json, .md, .png, <name>_*.png) to "
                        "experiments/results/<device>/: all its files or none")
    args, rest = p.parse_known_args(argv)
    path, arg = split_spec(args.config)  # a UsageError goes to experiments.cli: one line, exit code 2
    overrides = split_overrides(rest)
    command = "bppsa run " + shlex.join(argv)
    summary = run(path, arg, overrides, args.workdir, restart=args.restart, publish=args.publish,
                  command=command)
    workdir = Path(args.workdir) if args.workdir else default_workdir(path, arg)
    scalars = {k: v for k, v in summary.items() if isinstance(v, (int, float, str, bool)) or v is None}
    print(json.dumps(scalars, indent=2, default=str))
    run_time = json.loads((workdir / "summary.json").read_text())["run_time_s"]
    print(f"wrote {workdir / 'summary.json'} (the task ran {run_time:.1f} s)")
    if summary.get("partial"):
        print(f"bppsa run: the results are partial (config.keep_partial): "
              f"{'; '.join(failed_parts(summary))}", file=sys.stderr)
    return 0
