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
task's ``<name>.{json,md,png}`` into ``experiments/results/<device>/``.

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
import ast
import difflib
import importlib
import importlib.util
import json
import os
import shlex
import shutil
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import ml_collections

from bppsa.errors import UsageError
from experiments.provenance import current_command, device_label, provenance, running_command, save_json
from experiments.workdir import MARKER, WorkDir, check_name, read_marker

__all__ = ["ConfigError", "MARKER", "load_config", "apply_overrides", "resolve_task", "read_marker", "run",
           "current_command", "main"]

class ConfigError(UsageError):
    """A config file, config argument or override that cannot be used."""


def split_spec(spec: str) -> tuple[Path, str | None]:
    """"path/to/cfg.py:arg" -> (Path("path/to/cfg.py"), "arg"); "path/to/cfg.py" -> (path, None)."""
    path, sep, arg = spec.rpartition(":")
    if sep and path.endswith(".py"):
        return Path(path), (arg or None)
    return Path(spec), None


def load_config(path: str | os.PathLike, arg: str | None = None) -> ml_collections.ConfigDict:
    """Import the config file at ``path`` (by path, not by module name) and call ``get_config(arg)``.

    Returns the config locked: existing keys may change (with their types checked), new keys may not.
    """
    path = Path(path)
    if path.suffix != ".py" or not path.is_file():
        raise ConfigError(f"CONFIG must be an existing .py file (e.g. experiments/paper_bppsa/configs/rnn_train.py); "
                          f"got {str(path)!r}")
    spec = importlib.util.spec_from_file_location(f"bppsa_config_{path.stem}", path)
    if spec is None or spec.loader is None:
        raise ConfigError(f"config file {str(path)!r} cannot be imported as a Python module")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except SyntaxError as e:
        raise ConfigError(f"config file {str(path)!r} line {e.lineno}: syntax error: {e.msg}; "
                          f"expected a Python file defining get_config(arg=None)") from e
    except Exception as e:  # NameError, ImportError, ...: the file's own code failed
        raise ConfigError(f"config file {str(path)!r} failed to load{_line_in(e, path)}: "
                          f"{type(e).__name__}: {e}") from e
    get_config = getattr(module, "get_config", None)
    if not callable(get_config):
        raise ConfigError(f"config file {str(path)!r} must define get_config(arg=None); it does not")
    try:
        config = get_config(arg) if arg is not None else get_config()
    except (ValueError, KeyError, TypeError) as e:
        raise ConfigError(f"get_config({arg!r}) in {str(path)!r} failed: {e}") from e
    except Exception as e:
        raise ConfigError(f"get_config({arg!r}) in {str(path)!r} failed{_line_in(e, path)}: "
                          f"{type(e).__name__}: {e}") from e
    if not isinstance(config, ml_collections.ConfigDict):
        raise ConfigError(f"get_config({arg!r}) in {str(path)!r} must return an ml_collections.ConfigDict; "
                          f"got {type(config).__name__}")
    if not isinstance(config.get("task"), str):
        raise ConfigError(f"the config from {str(path)!r} must set task = \"package.module:function\"; "
                          f"got task = {config.get('task')!r}")
    config.lock()
    return config


def _line_in(error: BaseException, path: Path) -> str:
    """" at line N" of the last traceback frame inside ``path`` ("" when none is)."""
    line, tb = None, error.__traceback__
    while tb is not None:
        if Path(tb.tb_frame.f_code.co_filename).resolve() == path.resolve():
            line = tb.tb_lineno
        tb = tb.tb_next
    return f" at line {line}" if line is not None else ""


def _flat_keys(config, prefix="") -> list[str]:
    keys = []
    for k, v in config.items():
        keys.append(prefix + k)
        if isinstance(v, ml_collections.ConfigDict):
            keys.extend(_flat_keys(v, prefix + k + "."))
    return keys


def _short(text: str, limit: int = 80) -> str:
    """``text``, cut to ``limit`` characters with the full length said (an error line stays one short line)."""
    return text if len(text) <= limit else f"{text[:limit - 20]}... ({len(text)} characters)"


_BOOLS = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}


def _parse_scalar(text: str, typ: type, what: str):
    if typ is bool:
        try:
            return _BOOLS[text.strip().lower()]
        except KeyError:
            raise ConfigError(f"{what}: expected a bool (true/false); got {_short(repr(text))}") from None
    if typ is int:
        try:
            return int(text)
        except ValueError:
            raise ConfigError(f"{what}: expected an int; got {_short(repr(text))}") from None
    if typ is float:
        try:
            return float(text)
        except ValueError:
            raise ConfigError(f"{what}: expected a float; got {_short(repr(text))}") from None
    if typ is str:
        return text
    raise ConfigError(f"{what}: cannot set a field of type {typ.__name__} from the command line")


def _parse_sequence(text: str, current, typ: type, what: str):
    stripped = text.strip()
    try:
        items = ast.literal_eval(stripped)  # literals only, never code
        if not isinstance(items, (list, tuple)):
            items = (items,)
        items = [i if isinstance(i, str) else repr(i) for i in items]
    except (ValueError, SyntaxError):  # bare words: "a,b" or "[a, b]"
        if stripped[:1] + stripped[-1:] in ("()", "[]"):
            stripped = stripped[1:-1]
        items = [s.strip().strip("'\"") for s in stripped.split(",") if s.strip()]
    if not current:  # an empty default says nothing of its elements: numbers as numbers, the rest as text
        return typ(_number_or_text(i) for i in items)
    elem_types = {type(e) for e in current}
    if len(elem_types) > 1 and elem_types <= {int, float}:
        elem_types = {float}
    elem = elem_types.pop() if len(elem_types) == 1 else str
    return typ(_parse_scalar(i, elem, f"{what} (elements of type {elem.__name__})") for i in items)


def _number_or_text(item: str):
    for kind in (int, float):
        try:
            return kind(item)
        except ValueError:
            pass
    return item


def apply_overrides(config: ml_collections.ConfigDict,
                    overrides: dict[str, str] | Sequence[tuple[str, str]]) -> ml_collections.ConfigDict:
    """Apply ``{"a.b": "text", ...}`` (or pairs) to a locked config, parsing each text by the field's type.

    Unknown keys and values that do not parse as the field's type raise :class:`ConfigError`
    naming the key, the value and the expected type.
    """
    items: Iterable[tuple[str, str]] = overrides.items() if isinstance(overrides, dict) else overrides
    for key, text in items:
        what = _short(f"--config.{key}={text}")
        node: Any = config  # a ConfigDict at every step: checked at the top of the loop
        parts = key.split(".")
        for i, part in enumerate(parts):
            if not isinstance(node, ml_collections.ConfigDict) or part not in node:
                known = _flat_keys(config)
                close = difflib.get_close_matches(key, known, n=3)
                hint = f"; did you mean {', '.join(close)}?" if close else ""
                raise ConfigError(f"{what}: unknown config key {_short(repr(key))}{hint} "
                                  f"(known keys: {', '.join(known)})")
            if i < len(parts) - 1:
                node = node[part]
        leaf = parts[-1]
        current = node[leaf]
        typ = node.get_type(leaf)
        if isinstance(current, ml_collections.ConfigDict):
            raise ConfigError(f"{what}: {key!r} is a group of keys ({', '.join(current.keys())}); "
                              f"set them one by one, e.g. --config.{key}.{next(iter(current.keys()), 'x')}=...")
        if isinstance(current, (list, tuple)):
            value = _parse_sequence(text, current, type(current), what)
        elif current is None and typ in (type(None), None):
            try:
                value = ast.literal_eval(text)
            except (ValueError, SyntaxError):
                value = text
        else:
            value = _parse_scalar(text, typ, what)
        try:
            node[leaf] = value
        except TypeError as e:
            raise ConfigError(f"{what}: expected {getattr(typ, '__name__', typ)}; {_short(str(e), 200)}") from None
    return config


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
                          f"{_short(str(e), 200)}") from e
    if not callable(fn):
        raise ConfigError(f"config.task = {target!r} is not a function")
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
            out.append(f"{prefix}{k}: {_short(repr(a))} -> {_short(repr(b))}")
    return out


def default_workdir(path: Path, arg: str | None) -> Path:
    return Path("runs") / (path.stem + (f"-{arg}" if arg else ""))


def _prepare(wd: WorkDir, resolved: dict, restart: bool) -> None:
    """Apply --restart and the resume rules to a locked work directory (see the module docstring)."""
    if restart:
        wd.remove_written()
        return
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
                                  f"random generators accept); got {_short(str(value))}")


def run(config_path: str | os.PathLike, arg: str | None = None,
        overrides: dict[str, str] | Sequence[tuple[str, str]] = (), workdir: str | os.PathLike | None = None, *,
        restart: bool = False, publish: bool = False, results_root: str | os.PathLike = "experiments/results",
        command: str | None = None) -> dict:
    """Load, override, check and run one config; return the task's summary (see the module docstring)."""
    path = Path(config_path)
    config = load_config(path, arg)
    apply_overrides(config, overrides)
    task = resolve_task(config.task)
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
    with WorkDir(workdir) as wd:
        _prepare(wd, resolved, restart)
        wd.start(progress=bool(wd.marker and wd.marker.get("progress")))
        status = "failed"
        try:
            wd.entry("config.json").write_text(json.dumps(resolved, indent=2) + "\n")
            t0 = time.perf_counter()
            with running_command(command):
                summary = task(config, wd.run_dir())
            run_time = time.perf_counter() - t0
            if not isinstance(summary, dict):
                raise TypeError(f"task {config.task!r} must return a dict (a JSON-able summary); "
                                f"got {type(summary).__name__}")
            save_json(wd.entry("summary.json"), {"config": resolved, "summary": summary, "run_time_s": run_time,
                                                 "provenance": provenance(command)})
            status = "done"
        except UsageError:
            status = "refused"
            raise
        finally:
            wd.finish(status)
    if publish:
        name = config.get("name", path.stem)
        dest = Path(results_root) / device_label()
        copied = []
        for ext in ("json", "md", "png"):
            src = workdir / f"{name}.{ext}"
            if src.exists():
                dest.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, dest / src.name)
                copied.append(str(dest / src.name))
        if not copied:
            raise FileNotFoundError(f"--publish: the task wrote no {name}.json/.md/.png into {str(workdir)!r}")
        summary = {**summary, "published": copied}
    return summary


def _split_overrides(rest: list[str]) -> list[tuple[str, str]]:
    out, i = [], 0
    while i < len(rest):
        tok = rest[i]
        if not tok.startswith("--config."):
            hint = f" (did you mean --config.{tok[2:].replace('-', '_')}=...?)" if tok.startswith("--") else ""
            raise ConfigError(f"unexpected argument {_short(repr(tok))}; overrides look like --config.key=value{hint}")
        body = tok[len("--config."):]
        if "=" in body:
            key, value = body.split("=", 1)
        elif i + 1 < len(rest):
            key, value = body, rest[i + 1]
            i += 1
        else:
            raise ConfigError(f"{tok}: missing a value (use --config.key=value)")
        out.append((key, value))
        i += 1
    return out


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(
        prog="bppsa run", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
        usage="bppsa run CONFIG[:arg] [--config.key=value ...] [--workdir DIR] [--restart] [--publish]")
    p.add_argument("config", help="path to a config file, optionally with :arg (e.g. :smoke)")
    p.add_argument("--workdir", default=None, help="work directory (default: runs/<config>[-<arg>])")
    p.add_argument("--restart", action="store_true",
                   help="delete what bppsa wrote in the work directory and start over")
    p.add_argument("--publish", action="store_true",
                   help="copy <name>.{json,md,png} from the work directory to experiments/results/<device>/")
    args, rest = p.parse_known_args(argv)
    path, arg = split_spec(args.config)  # a UsageError goes to experiments.cli: one line, exit code 2
    overrides = _split_overrides(rest)
    command = "bppsa run " + shlex.join(argv)
    summary = run(path, arg, overrides, args.workdir, restart=args.restart, publish=args.publish,
                  command=command)
    workdir = Path(args.workdir) if args.workdir else default_workdir(path, arg)
    scalars = {k: v for k, v in summary.items() if isinstance(v, (int, float, str, bool)) or v is None}
    print(json.dumps(scalars, indent=2, default=str))
    run_time = json.loads((workdir / "summary.json").read_text())["run_time_s"]
    print(f"wrote {workdir / 'summary.json'} (the task ran {run_time:.1f} s)")
    return 0
