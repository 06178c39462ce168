"""The one exception type for bad input from a user (a config, a flag, a data folder).

:class:`UsageError` is a ``ValueError`` (callers that catch ``ValueError`` keep working). The
``bppsa`` command prints its message as one line and exits with code 2; ``--debug`` shows the
traceback. Raise it with a message that names what was wrong and what was expected.
"""

from __future__ import annotations

__all__ = ["UsageError"]


class UsageError(ValueError):
    """Bad input from the user: one clear line (what was wrong, what was expected), exit code 2."""
