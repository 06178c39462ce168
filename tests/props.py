"""Property tests in two sizes: a few examples in the default run, the full budget in the slow run.

    @property_pair(5, 15, n=st.integers(1, 40))
    def test_x(n): ...

gives ``test_x[small]`` (``small`` examples, default run) and ``test_x[full]`` (``large`` examples,
marked slow). Both draw from the same strategies and run the same body.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings


def property_pair(small: int, large: int, **strategies):
    def make(body):
        def test(examples):
            settings(max_examples=examples, deadline=None)(given(**strategies)(body))()

        test.__name__, test.__qualname__, test.__doc__ = body.__name__, body.__qualname__, body.__doc__
        test.__module__ = body.__module__
        sizes = [pytest.param(small, id="small"), pytest.param(large, id="full", marks=pytest.mark.slow)]
        return pytest.mark.parametrize("examples", sizes)(test)
    return make
