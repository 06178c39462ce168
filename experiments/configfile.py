"""A config file and its overrides: ``CONFIG[:arg]`` split (:func:`split_spec`), the file loaded by
path and locked (:func:`load_config`; a file that is not Python text, a syntax error, a failing
``get_config`` are one-line :class:`ConfigError`), and ``--config.key=value`` overrides parsed and
type-checked against the config (:func:`split_overrides`, :func:`apply_overrides`)."""

from __future__ import annotations

import ast
import difflib
import importlib.util
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import ml_collections

from bppsa.errors import UsageError

__all__ = ["ConfigError", "split_spec", "load_config", "apply_overrides", "split_overrides", "short"]


class ConfigError(UsageError):
    """A config file, config argument or override that cannot be used."""


def split_spec(spec: str) -> tuple[Path, str | None]:
    """"path/to/cfg.py:arg" -> (Path("path/to/cfg.py"), "arg"); "path/to/cfg.py" -> (path, None).

    "path/to/cfg.py:" -> (path, ""): an empty preset, which :func:`load_config` refuses (never the full run).
    """
    path, sep, arg = spec.rpartition(":")
    if sep and path.endswith(".py"):
        return Path(path), arg
    return Path(spec), None


def load_config(path: str | os.PathLike, arg: str | None = None) -> ml_collections.ConfigDict:
    """Import the config file at ``path`` (by path, not by module name) and call ``get_config(arg)``.

    Returns the config locked: existing keys may change (with their types checked), new keys may not.
    """
    path = Path(path)
    if path.suffix != ".py" or not path.is_file():
        raise ConfigError(f"CONFIG must be an existing .py file (e.g. experiments/paper_bppsa/configs/rnn_train.py); "
                          f"got {str(path)!r}")
    _check_text(path)
    spec = importlib.util.spec_from_file_location(f"bppsa_config_{path.stem}", path)
    if spec is None or spec.loader is None:
        raise ConfigError(f"config file {str(path)!r} cannot be imported as a Python module")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except SyntaxError as e:
        raise ConfigError(f"config file {str(path)!r}{f' line {e.lineno}' if e.lineno else ''}: syntax error: {e.msg}; "
                          f"expected a Python file defining get_config(arg=None)") from e
    except Exception as e:  # NameError, ImportError, ...: the file's own code failed
        raise ConfigError(f"config file {str(path)!r} failed to load{_line_in(e, path)}: "
                          f"{type(e).__name__}: {e}") from e
    get_config = getattr(module, "get_config", None)
    if not callable(get_config):
        raise ConfigError(f"config file {str(path)!r} must define get_config(arg=None); it does not")
    _check_preset(path, arg, getattr(module, "PRESETS", None))
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


def _check_preset(path: Path, arg: str | None, presets) -> None:
    """``arg`` is None (the full run) or one of the config's ``PRESETS``; an empty one ("cfg.py:") is refused
    too when the config declares none (its ``get_config`` checks the others)."""
    if arg is None or (arg and (presets is None or arg in presets)):
        return
    what = "no preset after ':'" if not arg else f"{path.name} has no preset {arg!r}"
    known = f" with PRESET one of: {', '.join(presets)}" if presets else ""
    expected = f"{path.name} (the full run)" + (f" or {path.name}:PRESET{known}" if presets != () else "")
    raise ConfigError(f"CONFIG {str(path) + ':' + arg!r}: {what}; expected {expected}")


def _check_text(path: Path) -> None:
    """A config file is Python source: UTF-8 text without NUL bytes (else one line saying what it holds)."""
    try:
        data = path.read_bytes()
    except OSError as e:
        raise ConfigError(f"config file {str(path)!r} cannot be read ({e.strerror})") from None
    what = None
    nul = data.find(b"\0")
    if nul >= 0:
        what = f"a NUL byte at offset {nul}"
    else:
        try:
            data.decode("utf-8")
        except UnicodeDecodeError as e:
            what = f"bytes that are not UTF-8 at offset {e.start}"
    if what:
        raise ConfigError(f"config file {str(path)!r} is not Python source text (it holds {what}: a binary file?); "
                          f"expected a Python file defining get_config(arg=None)")


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


def short(text: str, limit: int = 80) -> str:
    """``text``, cut to ``limit`` characters with the full length said (an error line stays one short line)."""
    return text if len(text) <= limit else f"{text[:limit - 20]}... ({len(text)} characters)"


_BOOLS = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}


def _parse_scalar(text: str, typ: type, what: str):
    if typ is bool:
        try:
            return _BOOLS[text.strip().lower()]
        except KeyError:
            raise ConfigError(f"{what}: expected a bool (true/false); got {short(repr(text))}") from None
    if typ is int:
        try:
            return int(text)
        except ValueError:
            raise ConfigError(f"{what}: expected an int; got {short(repr(text))}") from None
    if typ is float:
        try:
            return float(text)
        except ValueError:
            raise ConfigError(f"{what}: expected a float; got {short(repr(text))}") from None
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
        what = short(f"--config.{key}={text}")
        node: Any = config  # a ConfigDict at every step: checked at the top of the loop
        parts = key.split(".")
        for i, part in enumerate(parts):
            if not isinstance(node, ml_collections.ConfigDict) or part not in node:
                known = _flat_keys(config)
                close = difflib.get_close_matches(key, known, n=3)
                hint = f"; did you mean {', '.join(close)}?" if close else ""
                raise ConfigError(f"{what}: unknown config key {short(repr(key))}{hint} "
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
            raise ConfigError(f"{what}: expected {getattr(typ, '__name__', typ)}; {short(str(e), 200)}") from None
    return config


def split_overrides(rest: list[str]) -> list[tuple[str, str]]:
    out, i = [], 0
    while i < len(rest):
        tok = rest[i]
        if not tok.startswith("--config."):
            key, sep, value = tok[2:].partition("=")
            meant = f"--config.{key.replace('-', '_')}={value if sep else '...'}"
            hint = f" (did you mean {meant}?)" if tok.startswith("--") else ""
            raise ConfigError(f"unexpected argument {short(repr(tok))}; overrides look like --config.key=value{hint}")
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
