"""The one exception type for bad input from a user (a config, a flag, a data folder), and config checks.

:class:`UsageError` is a ``ValueError`` (callers that catch ``ValueError`` keep working). The
``bppsa`` command prints its message as one line and exits with code 2; ``--debug`` shows the
traceback. Raise it with a message that names what was wrong and what was expected.

A task (``function(config, workdir)``, see :mod:`experiments.runner`) declares the checks of its config
with ``@checked_by(check)``: ``check(config)`` raises :class:`UsageError` on a value of the right
type but out of range, and the runner calls it before it writes anything. :func:`require_int`,
:func:`require_ints`, :func:`require_number` and :func:`require_choices` are the usual checks,
each naming the key.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any, TypeVar

__all__ = ["UsageError", "checked_by", "require_int", "require_ints", "require_number", "require_choices"]

T = TypeVar("T")


class UsageError(ValueError):
    """Bad input from the user: one clear line (what was wrong, what was expected), exit code 2."""


def checked_by(check: Callable[[Any], None]) -> Callable[[T], T]:
    """Decorator for a task: ``check(config)`` validates its config (the runner calls ``task.check``)."""
    def attach(task: T) -> T:
        setattr(task, "check", check)  # a function attribute: the runner reads task.check
        return task
    return attach


def _get(config: Any, key: str) -> Any:
    node = config
    for part in key.split("."):
        node = node[part]
    return node


def require_int(config: Any, key: str, minimum: int = 1, maximum: int | None = None) -> int:
    """``config.<key>`` (dotted) must be an int in [minimum, maximum]; returns it."""
    value = _get(config, key)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum or \
            (maximum is not None and value > maximum):
        expected = f"an int >= {minimum}" if maximum is None else f"an int in {minimum}..{maximum}"
        raise UsageError(f"config.{key} must be {expected}; got {value!r}")
    return value


def require_ints(config: Any, key: str, minimum: int = 1, *, allow_empty: bool = True) -> tuple:
    """``config.<key>`` must be a sequence of ints >= minimum (non-empty unless ``allow_empty``); returns it."""
    value = _get(config, key)
    values = tuple(value) if isinstance(value, (list, tuple)) else None
    if values is None or (not values and not allow_empty) or \
            any(isinstance(v, bool) or not isinstance(v, int) or v < minimum for v in values):
        what = "a list of ints" if allow_empty else "a non-empty list of ints"
        raise UsageError(f"config.{key} must be {what} >= {minimum}; got {value!r}")
    return values


def require_number(config: Any, key: str, minimum: float = 0.0, *, strict: bool = True) -> float:
    """``config.<key>`` must be a number > minimum (>= minimum when not ``strict``); returns it."""
    value = _get(config, key)
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and \
        (value > minimum if strict else value >= minimum)
    if not ok:
        raise UsageError(f"config.{key} must be a number {'>' if strict else '>='} {minimum:g}; got {value!r}")
    return value


def require_choices(config: Any, key: str, allowed: Collection[Any], *, many: bool = False) -> Any:
    """``config.<key>`` must be one of ``allowed`` (``many``: a non-empty sequence of them); returns it."""
    value = _get(config, key)
    values = tuple(value) if many and isinstance(value, (list, tuple)) else (value,)
    bad = [v for v in values if v not in allowed]
    if bad or not values:
        what = "a non-empty list of" if many else "one of"
        raise UsageError(f"config.{key} must be {what} {', '.join(map(repr, allowed))}; got {value!r}")
    return value
