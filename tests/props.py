"""Property tests in two sizes: a few examples in the default run, the full budget in the slow run.

    test_x, test_x_full = property_pair(5, 15, n=st.integers(1, 40))(body)

gives ``test_x`` (``small`` examples, default run) and ``test_x_full`` (``large`` examples, marked
slow). Both draw from the same strategies and run the same body.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings


def property_pair(small: int, large: int, **strategies):
    def make(body):
        fast = settings(max_examples=small, deadline=None)(given(**strategies)(body))
        full = pytest.mark.slow(settings(max_examples=large, deadline=None)(given(**strategies)(body)))
        return fast, full
    return make
