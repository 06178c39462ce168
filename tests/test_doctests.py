"""The ``Examples:`` of the library's docstrings run as doctests (float32, as a user runs them).

Every module of ``bppsa`` is searched; a module whose optional dependency is missing (``ray``) is
skipped. At least :data:`MIN_EXAMPLES` examples must be found, so the test cannot pass with none.
"""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import bppsa

pytestmark = pytest.mark.usefixtures("float32_as_in_bppsa_run")

MIN_EXAMPLES = 20  # docstrings with >>> examples (issue 61: "≥ 20 doctests pass in make test")
OPTIONAL = ("ray",)  # a module needing one of these is skipped where it is not installed


def _modules():
    names = ["bppsa", *(m.name for m in pkgutil.walk_packages(bppsa.__path__, "bppsa."))]
    out = []
    for name in sorted(names):
        try:
            out.append(importlib.import_module(name))
        except ImportError as e:
            if e.name and e.name.split(".")[0] in OPTIONAL:
                continue
            raise
    return out


def _doctests():
    finder = doctest.DocTestFinder(exclude_empty=True)
    seen, tests = set(), []
    for module in _modules():
        for test in finder.find(module, module.__name__):
            if test.examples and test.name not in seen:  # a re-exported object is found once, by its first name
                seen.add(test.name)
                tests.append(test)
    return sorted(tests, key=lambda t: t.name)


TESTS = _doctests()
FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


def test_there_are_enough_examples():
    assert len(TESTS) >= MIN_EXAMPLES, f"{len(TESTS)} docstrings with examples; expected >= {MIN_EXAMPLES}"


@pytest.mark.parametrize("test", TESTS, ids=[t.name for t in TESTS])
def test_the_example_runs(test):
    runner = doctest.DocTestRunner(optionflags=FLAGS)
    failures = []
    runner.run(test, out=failures.append)
    assert runner.failures == 0, "".join(failures)
