"""flax's own nnx.RNN tests (from flax's source distribution for the installed version) pass with
bppsa.nn.RNN substituted, for each backward. Skipped, with the reason, when the package registry
cannot be reached."""

from tests import flax_suite
import pytest


@pytest.fixture(scope="module")
def available():
    try:
        flax_suite.test_file()
    except flax_suite.Unavailable as e:
        pytest.skip(f"flax's recurrent_test.py is unavailable: {e}")


@pytest.mark.parametrize("backward", ["bppsa", pytest.param("bptt", marks=pytest.mark.slow),
                                      pytest.param("auto", marks=pytest.mark.slow)])
def test_flax_rnn_tests_pass_with_bppsa(available, backward):
    result, ran, made = flax_suite.run(backward=backward)
    problems = [f"{test.id()}: {trace.strip().splitlines()[-1]}" for test, trace in result.failures + result.errors]
    assert not problems, f"{len(problems)} of flax's {ran} tests fail, backward={backward!r}:\n" + "\n".join(problems)
    assert len(flax_suite.rnn_tests()) >= 12 and ran >= len(flax_suite.rnn_tests())
    assert made >= len(flax_suite.rnn_tests())  # every RNN those tests built was bppsa's
    assert not result.skipped


@pytest.mark.slow
def test_the_harness_runs_flax_itself(available):
    """The same harness with flax's own nnx.RNN: every test passes (the file and its setup work)."""
    result, ran, made = flax_suite.run(substitute=False)
    assert ran >= len(flax_suite.rnn_tests()) >= 12 and made == 0
    assert not (result.failures or result.errors), result.failures + result.errors
