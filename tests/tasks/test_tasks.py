"""bppsa.tasks: the one registry of the tasks hetero and sync train, and the synthetic sequences of experiments.data."""

import jax
import numpy as np
import pytest

from bppsa.tasks.sequences import make_sequences
from bppsa.tasks import TASKS, make_task, task_from_spec


def test_tasks_by_name_and_spec_are_one_cached_task():
    t = make_task("digits_cnn", channels=(4, 8))
    assert task_from_spec({"name": "digits_cnn", "channels": [4, 8]}) is t  # JSON turns the tuple into a list
    assert t.spec == {"name": "digits_cnn", "channels": [4, 8]} and t.x_train.shape[1:] == (8, 8, 1)
    assert len(t.x_train) + len(t.x_test) == 1797 and len(t.x_test) == round(0.25 * 1797)
    params = t.init(jax.random.key(0))
    assert t.logits(params, t.x_test[:5]).shape == (5, 10)
    assert make_task("digits_cnn", channels=(4, 16)) is not t


@pytest.mark.parametrize("data, shape", [("bitstream", (8, 1)), ("sequences", (8, 3))])
def test_gru_task_on_each_data_set(data, shape):
    kw = {"num_features": 3, "noise": 0.5} if data == "sequences" else {}
    t = make_task("gru", data=data, num_samples=40, length=8, hidden_size=4, num_classes=4, **kw)
    assert t.x_train.shape[1:] == shape and len(t.x_test) == 8
    assert np.bincount(t.y_test).tolist() == [2, 2, 2, 2]  # the test set is drawn per class
    logits = t.logits(t.init(jax.random.key(0)), t.x_test)
    assert logits.shape == (8, 4) and np.isfinite(logits).all()


def test_unknown_names_and_options_are_refused_with_the_known_ones():
    with pytest.raises(ValueError, match=r"one of \['digits_cnn', 'gru'\]; got 'mnist'$"):
        make_task("mnist")
    with pytest.raises(ValueError, match=r"got 'digits-cnn' \(it is now called 'digits_cnn'\)"):
        make_task("digits-cnn")
    with pytest.raises(ValueError, match=r"'gru' with data='sequences'"):
        task_from_spec({"name": "seq_gru"})
    with pytest.raises(ValueError, match=r"takes the options \[.*'hidden_size'.*\]; got unknown option\(s\) \['hidden'\]"):
        make_task("gru", hidden=3)
    with pytest.raises(ValueError, match="noise do not apply to data='bitstream'"):
        make_task("gru", noise=0.5)
    with pytest.raises(ValueError, match="data must be one of"):
        make_task("gru", data="irmas")
    with pytest.raises(ValueError, match="channels must be two positive integers"):
        make_task("digits_cnn", channels=(4,))
    with pytest.raises(ValueError, match="channels must be a positive integer; got 0"):
        make_task("digits_cnn", channels=(4, 0))
    with pytest.raises(ValueError, match="a task spec must be a mapping with a 'name'"):
        task_from_spec("gru")
    assert sorted(TASKS) == ["digits_cnn", "gru"]


def test_sequences_are_deterministic_balanced_and_checked():
    x, y = make_sequences(50, 16, num_features=6, num_classes=5, seed=1)
    assert x.shape == (50, 16, 6) and x.dtype == np.float32 and y.dtype == np.int32
    assert np.bincount(y).tolist() == [10] * 5
    np.testing.assert_array_equal(x, make_sequences(50, 16, num_features=6, num_classes=5, seed=1)[0])
    assert not np.array_equal(x, make_sequences(50, 16, num_features=6, num_classes=5, seed=2)[0])
    # without noise, a class's samples share one template: their time means are parallel
    xc, yc = make_sequences(20, 64, num_features=4, num_classes=2, noise=0.0, seed=0)
    m = xc.mean(1)
    a, b = m[yc == 0][:2]
    assert abs(a @ b) / (np.linalg.norm(a) * np.linalg.norm(b)) > 0.999
    for kw, match in [({"length": 0}, "length"), ({"num_classes": 1}, "num_classes"), ({"noise": -1.0}, "noise")]:
        with pytest.raises(ValueError, match=match):
            make_sequences(**{"num_samples": 10, "length": 4, **kw})


def test_the_hetero_dp_config_check_starts_no_jax_backend():
    """A task that sets up its own CPU devices (hetero_dp) must run before anything starts JAX: its
    config check refuses bad task names and options without building a task."""
    import subprocess
    import sys
    code = ("import importlib.util\n"
            "from jax._src import xla_bridge as xb\n"
            "spec = importlib.util.spec_from_file_location('c', 'experiments/paper_hetero/configs/hetero_dp.py')\n"
            "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n"
            "import experiments.paper_hetero.hetero_dp as h\n"
            "h.check(m.get_config())\n"
            "print(bool(xb._backends))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False"]


def test_numpy_and_jax_integer_options_are_ints():
    """Sizes given as numpy or JAX integers were refused as 'must be a positive integer': they are
    the ints they equal, the same cached task and spec."""
    import jax.numpy as jnp
    t = make_task("digits_cnn", channels=(4, 8))
    assert make_task("digits_cnn", channels=(np.int64(4), jnp.int32(8))) is t
    kw = dict(data="bitstream", num_samples=40, length=8, num_classes=4)
    g = make_task("gru", hidden_size=np.int64(4), **kw)
    assert g is make_task("gru", hidden_size=4, **kw) and g.spec["hidden_size"] == 4
    with pytest.raises(ValueError, match=r"hidden_size must be a positive integer; got np.float64\(4.0\)"):
        make_task("gru", hidden_size=np.float64(4), **kw)
