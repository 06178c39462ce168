"""Property tests in two sizes: a few examples in the default run, the full budget in the slow run.

    @property_pair(5, 15, n=st.integers(1, 40))
    def test_x(n): ...

gives ``test_x[small]`` (``small`` examples, default run) and ``test_x[full]`` (``large`` examples,
marked slow). Both draw from the same strategies and run the same body; the body's other arguments
are pytest fixtures (session-scoped ones: hypothesis reuses them across examples).
"""

from __future__ import annotations

import inspect

import pytest
from hypothesis import given, settings


def property_pair(small: int, large: int, **strategies):
    def make(body):
        fixtures = [n for n in inspect.signature(body).parameters if n not in strategies]

        # the body's assertions run for each drawn example; this wrapper only draws them
        def case(examples, **given_fixtures):
            def run(**drawn):
                body(**drawn, **given_fixtures)
            settings(max_examples=examples, deadline=None)(given(**strategies)(run))()

        case.__name__, case.__qualname__, case.__doc__ = body.__name__, body.__qualname__, body.__doc__
        case.__module__ = body.__module__
        case.__signature__ = inspect.Signature(  # pyright: ignore[reportAttributeAccessIssue]
            [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in ("examples", *fixtures)])
        sizes = [pytest.param(small, id="small"), pytest.param(large, id="full", marks=pytest.mark.slow)]
        return pytest.mark.parametrize("examples", sizes)(case)
    return make
