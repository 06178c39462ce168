"""The one exception type for bad input from a user (a config, a flag, a data folder), and config checks.

:class:`UsageError` is a ``ValueError`` (callers that catch ``ValueError`` keep working). The
``bppsa`` command prints its message as one line and exits with code 2; ``--debug`` shows the
traceback. Raise it with a message that names what was wrong and what was expected.

A task (``function(config, workdir)``, run by the ``bppsa run`` command) declares the checks of its config
with ``@checked_by(check)``: ``check(config)`` raises :class:`UsageError` on a value of the right
type but out of range, and the runner calls it before it writes anything. :func:`require_int`,
:func:`require_ints`, :func:`require_number` and :func:`require_choices` are the usual checks,
each naming the key.

:func:`as_int` and :func:`as_number` are the one test of "an int" and "a number" across the
library: a Python int or float, a numpy scalar, or a 0-d numpy or JAX array of an integer (float)
dtype, as a Python int (float); never a bool.
"""

from __future__ import annotations

import numbers
import operator
from collections.abc import Callable, Collection
from typing import Any, TypeVar

import jax.numpy as jnp
import numpy as np

__all__ = ["UsageError", "checked_by", "require_int", "require_ints", "require_number", "require_choices", "as_int",
           "as_number"]

T = TypeVar("T")


class UsageError(ValueError):
    """Bad input from the user: one clear line (what was wrong, what was expected), exit code 2."""


def as_int(value: Any) -> int | None:
    """``value`` as a Python int if it is an integer scalar (an int, a numpy integer, a 0-d numpy or
    JAX array of an integer dtype), else None: bools, floats, strings, arrays of other shapes and
    traced values (not concrete) are not ints.

    Args:
      value: anything.

    Returns:
      The Python int, or None.
    """
    if isinstance(value, (bool, np.bool_)):
        return None
    if isinstance(value, numbers.Integral):
        return int(value)
    if _scalar_of(value, jnp.integer):
        try:
            return operator.index(value)
        except TypeError:  # a traced value
            return None
    return None


def as_number(value: Any) -> int | float | None:
    """``value`` as a Python int or float if it is a real scalar (an int or float, a numpy integer
    or floating scalar, a 0-d numpy or JAX array of an integer or float dtype; ints stay ints),
    else None: bools, complex numbers, strings, arrays of other shapes and traced values are not
    numbers. NaN and inf are numbers: range checks are the caller's.

    Args:
      value: anything.

    Returns:
      The Python int or float, or None.
    """
    n = as_int(value)
    if n is not None or isinstance(value, (bool, np.bool_)):
        return n
    if isinstance(value, numbers.Real) or _scalar_of(value, jnp.floating):
        try:
            return float(value)
        except TypeError:  # a traced value
            return None
    return None


def _scalar_of(value: Any, kind: type) -> bool:
    """Whether ``value`` is a 0-d array (numpy or JAX) whose dtype is a ``kind`` (jnp.integer, jnp.floating)."""
    dtype, ndim = getattr(value, "dtype", None), getattr(value, "ndim", None)
    if dtype is None or ndim != 0:
        return False
    try:
        return bool(jnp.issubdtype(dtype, kind))
    except TypeError:
        return False


def checked_by(check: Callable[[Any], None]) -> Callable[[T], T]:
    """Decorator for a task: ``check(config)`` validates its config (the runner calls ``task.check``).

    Args:
      check: ``check(config)``, raising :class:`UsageError` on a bad value.

    Returns:
      The decorator, which sets ``task.check = check`` and returns the task itself.
    """
    def attach(task: T) -> T:
        setattr(task, "check", check)  # a function attribute: the runner reads task.check
        return task
    return attach


def _get(config: Any, key: str) -> Any:
    """``config.<key>`` (dotted); a missing key is a UsageError naming it."""
    node = config
    for i, part in enumerate(parts := key.split(".")):
        try:
            node = node[part]
        except (KeyError, TypeError, IndexError):
            raise UsageError(f"config.{key}: the config has no {'.'.join(parts[:i + 1])!r}") from None
    return node


def require_int(config: Any, key: str, minimum: int = 1, maximum: int | None = None) -> int:
    """``config.<key>`` (dotted) must be an int in [minimum, maximum]; returns it.

    Args:
      config: the task's config (an ``ml_collections.ConfigDict`` or nested dicts).
      key: the dotted key ("a.b" reads ``config["a"]["b"]``).
      minimum: the smallest value allowed.
      maximum: the largest value allowed (None: no bound).

    Returns:
      The value as a Python int.

    Raises:
      UsageError: the value is not an int in range.
    """
    value = _get(config, key)
    n = as_int(value)
    if n is None or n < minimum or (maximum is not None and n > maximum):
        expected = f"an int >= {minimum}" if maximum is None else f"an int in {minimum}..{maximum}"
        raise UsageError(f"config.{key} must be {expected}; got {value!r}")
    return n


def require_ints(config: Any, key: str, minimum: int = 1, *, allow_empty: bool = True) -> tuple:
    """``config.<key>`` must be a sequence of ints >= minimum (non-empty unless ``allow_empty``); returns it.

    Args:
      config: the task's config (an ``ml_collections.ConfigDict`` or nested dicts).
      key: the dotted key.
      minimum: the smallest value allowed.
      allow_empty: whether an empty sequence passes.

    Returns:
      The values as a tuple of Python ints.

    Raises:
      UsageError: the value is not a list or tuple of such ints, or empty when that is not allowed.
    """
    value = _get(config, key)
    values = tuple(as_int(v) for v in value) if isinstance(value, (list, tuple)) else None
    if values is None or (not values and not allow_empty) or any(v is None or v < minimum for v in values):
        what = "a list of ints" if allow_empty else "a non-empty list of ints"
        raise UsageError(f"config.{key} must be {what} >= {minimum}; got {value!r}")
    return values


def require_number(config: Any, key: str, minimum: float = 0.0, *, strict: bool = True) -> float:
    """``config.<key>`` must be a number > minimum (>= minimum when not ``strict``); returns it.

    Args:
      config: the task's config (an ``ml_collections.ConfigDict`` or nested dicts).
      key: the dotted key.
      minimum: the bound.
      strict: the value must exceed ``minimum`` (False: may equal it).

    Returns:
      The value as a Python int or float.

    Raises:
      UsageError: the value is not a number beyond the bound.
    """
    value = _get(config, key)
    x = as_number(value)
    if x is None or not (x > minimum if strict else x >= minimum):
        raise UsageError(f"config.{key} must be a number {'>' if strict else '>='} {minimum:g}; got {value!r}")
    return x


def require_choices(config: Any, key: str, allowed: Collection[Any], *, many: bool = False) -> Any:
    """``config.<key>`` must be one of ``allowed`` (``many``: a non-empty sequence of them); returns it.

    Args:
      config: the task's config (an ``ml_collections.ConfigDict`` or nested dicts).
      key: the dotted key.
      allowed: the values allowed.
      many: the value is a non-empty list or tuple of allowed values.

    Returns:
      The value as given.

    Raises:
      UsageError: a value not in ``allowed``, or (``many``) an empty sequence.
    """
    value = _get(config, key)
    values = tuple(value) if many and isinstance(value, (list, tuple)) else (value,)
    bad = [v for v in values if v not in allowed]
    if bad or not values:
        what = "a non-empty list of" if many else "one of"
        raise UsageError(f"config.{key} must be {what} {', '.join(map(repr, allowed))}; got {value!r}")
    return value
