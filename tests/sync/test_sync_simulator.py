"""The discrete-event simulator: determinism, convergence, waiting/staleness/barrier logs, failures."""

import json

import numpy as np
import pytest

from bppsa import sync
from bppsa.tasks import make_task, task_from_spec

SPEC = {"name": "digits_cnn", "channels": (4, 8)}


@pytest.fixture(scope="module")
def task():
    return task_from_spec(SPEC)


def _run(task, policy, opts=None, **kw):
    kw = {"max_time": 12.0, "eval_every": 2.0, "learning_rate": 0.1, "batch_size": 16, **kw}
    return sync.simulate(task, policy, kw.pop("compute", sync.heterogeneous(4, 2.5, sigma=0.2)),
                         policy_options=opts, **kw)


def test_same_seed_same_result_and_seed_matters(task):
    a = _run(task, "dssp", {"s_L": 1, "r_max": 4}, seed=3)
    b = _run(task, "dssp", {"s_L": 1, "r_max": 4}, seed=3)
    c = _run(task, "dssp", {"s_L": 1, "r_max": 4}, seed=4)
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)
    assert json.dumps(a, sort_keys=True) != json.dumps(c, sort_keys=True)


def test_short_simulated_training_converges(task):
    r = _run(task, "elasticbsp", {"R": 15}, max_time=40.0, eval_every=5.0, target=0.8)
    acc = [c["accuracy"] for c in r["curve"]]
    assert acc[0] < 0.3  # chance level at the start
    assert r["final_accuracy"] > 0.8
    assert r["time_to_target"] is not None and r["time_to_target"] <= 40.0
    assert r["time_to_target"] == sync.time_to_accuracy(r["curve"], 0.8)


def test_logs_reflect_the_policy(task):
    bsp = _run(task, "bsp")
    asp = _run(task, "asp")
    ebsp = _run(task, "elasticbsp", {"R": 30})
    ssp = _run(task, "ssp", {"s": 2})
    # BSP: lock-step, staleness < number of workers, one barrier per round, fast workers wait
    assert max(bsp["pushes"]) - min(bsp["pushes"]) <= 1
    assert max(bsp["staleness_hist"]) <= 3
    assert bsp["barriers"] == min(bsp["pushes"])
    assert min(bsp["wait"][:2]) > max(bsp["wait"][2:])
    # ASP: nobody waits; the 2.5x faster workers push about 2.5x as often; staleness appears
    assert asp["wait"] == [0.0] * 4 and asp["barriers"] == 0
    assert 1.8 < sum(asp["pushes"][:2]) / sum(asp["pushes"][2:]) < 3.5
    assert max(asp["staleness_hist"]) >= 2
    # ElasticBSP: far fewer barriers and more updates than BSP in the same virtual time
    assert 0 < ebsp["barriers"] < bsp["barriers"]
    assert ebsp["total_pushes"] > bsp["total_pushes"]
    # SSP(2): fast workers at most 3 pushes ahead of the slowest at any moment, so within 3 overall
    assert max(ssp["pushes"]) - min(ssp["pushes"]) <= 3
    assert sum(ssp["wait"][:2]) > 0
    for r in (bsp, asp, ebsp, ssp):
        assert sum(r["staleness_hist"].values()) == r["total_pushes"] == sum(r["pushes"])


def test_stragglers_late_joiner_and_death(task):
    base = dict(means=(1.0, 1.0, 1.0, 1.0), sigma=0.0)
    slow = _run(task, "bsp", compute=sync.ComputeModel(**base, stragglers=((1, 0.0, 6.0, 3.0),)))
    fast = _run(task, "bsp", compute=sync.ComputeModel(**base))
    assert slow["total_pushes"] < fast["total_pushes"]
    late = _run(task, "ssp", {"s": 1}, compute=sync.ComputeModel(**base, join_times=(0, 0, 0, 6.0)))
    assert 0 < late["pushes"][3] < late["pushes"][0]
    # a worker dies at t = 3; BSP drops it after the detection timeout and goes on
    dead = _run(task, "bsp", compute=sync.ComputeModel(**base, deaths=((2, 3.0),), detect_timeout=1.0))
    assert dead["deaths_detected"] == [{"worker": 2, "time": 4.0}]
    assert dead["pushes"][2] <= 3 and dead["pushes"][0] >= 10
    for policy in ("asp", "dssp", "elasticbsp"):
        r = _run(task, policy, compute=sync.ComputeModel(**base, deaths=((0, 2.5),), detect_timeout=0.5))
        assert r["pushes"][0] <= 3 and min(r["pushes"][1:]) >= 9, policy


def test_bad_configuration(task):
    with pytest.raises(ValueError, match="means"):
        sync.ComputeModel(means=(1.0, -1.0))
    with pytest.raises(ValueError, match="late joiners last"):
        sync.ComputeModel(means=(1.0, 1.0), join_times=(5.0, 0.0))
    with pytest.raises(ValueError, match="straggler"):
        sync.ComputeModel(means=(1.0,), stragglers=((3, 0, 1, 2.0),))
    with pytest.raises(ValueError, match="unknown policy"):
        _run(task, "bulk")
    with pytest.raises(ValueError, match="s .*>= 0"):
        _run(task, "ssp", {"s": -1})
    with pytest.raises(ValueError, match="R .*>= 1"):
        _run(task, "elasticbsp", {"R": 0})
    with pytest.raises(ValueError, match="task name must be one of"):
        _run({"name": "imagenet"}, "bsp")


NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize("fields, needle", [
    ({"means": (1.0, NAN)}, "means must be finite numbers > 0; got means[1] = nan"),
    ({"means": (1.0, INF)}, "means must be finite numbers > 0; got means[1] = inf"),
    ({"means": ()}, "means must be a non-empty sequence"),
    ({"means": ("1",)}, "means must be a sequence of finite numbers"),
    ({"sigma": NAN}, "sigma must be a finite number >= 0; got nan"),
    ({"sigma": -1.0}, "sigma must be a finite number >= 0; got -1.0"),
    ({"comm": -5.0}, "comm must be a finite number >= 0; got -5.0"),
    ({"detect_timeout": -1.0}, "detect_timeout must be a finite number >= 0; got -1.0"),
    ({"detect_timeout": NAN}, "detect_timeout must be a finite number >= 0; got nan"),
    ({"stragglers": ((0, 0.0, 1.0, NAN),)}, "each straggler must be (worker in 0..1"),
    ({"stragglers": ((0, NAN, 1.0, 2.0),)}, "each straggler must be"),
    ({"stragglers": ((0, 2.0, 1.0, 2.0),)}, "end > start"),
    ({"stragglers": ((-1, 0.0, 1.0, 2.0),)}, "got (-1, 0.0, 1.0, 2.0)"),
    ({"stragglers": ((0, 0.0, 1.0),)}, "stragglers must be a sequence of (worker, start, end, factor) tuples"),
    ({"join_times": (0.0, NAN)}, "join_times must be finite numbers >= 0; got join_times[1] = nan"),
    ({"join_times": (0.0,)}, "join_times must be 2 finite times"),
    ({"deaths": ((-1, 2.0),)}, "each death must be (worker in 0..1, finite time >= 0), one per worker; got (-1, 2.0)"),
    ({"deaths": ((2, 2.0),)}, "got (2, 2.0)"),
    ({"deaths": ((True, 2.0),)}, "each death must be"),
    ({"deaths": ((0, NAN),)}, "each death must be"),
    ({"deaths": ((0, 1.0), (0, 2.0))}, "one per worker"),
    ({"deaths": (0, 2.0)}, "deaths must be a sequence of (worker, time) tuples"),
])
def test_compute_model_refuses_every_bad_field(fields, needle):
    """NaN, negative and out-of-range values are refused naming the field (they used to give NaN
    waits, a nonsense order, or kill the last worker for worker -1)."""
    with pytest.raises(ValueError) as e:
        sync.ComputeModel(**{"means": (1.0, 1.0), **fields})
    assert needle in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("kw, needle", [
    ({"max_time": NAN}, "max_time must be a finite number of virtual seconds > 0; got nan"),
    ({"max_time": INF}, "max_time must be a finite number"),
    ({"eval_every": 1e-9}, "max_time / eval_every must be at most 100000 test evaluations"),
    ({"eval_every": NAN}, "eval_every must be a finite number"),
    ({"max_time": 1e9, "eval_every": 1e5}, "updates expected"),
    ({"batch_size": 0}, "batch_size must be an int >= 1"),
])
def test_runs_that_cannot_end_are_refused_before_they_start(kw, needle):
    """These used to loop forever (or for days); refused before the task is even built."""
    compute = sync.ComputeModel(means=(1.0, 2.5))
    with pytest.raises(ValueError) as e:
        sync.simulate({"name": "no-such-task"}, "bsp", compute, **{"max_time": 10.0, "eval_every": 1.0, **kw})
    assert needle in str(e.value)
    sync.check_simulation(compute, max_time=10.0, eval_every=1.0)  # in range: no error
    sync.check_simulation(compute, max_time=1e9, eval_every=1e5, max_pushes=100)  # bounded by max_pushes


def test_numpy_and_jax_scalars_are_numbers():
    """The compute model's times and a run's limits as numpy or JAX scalars are the numbers they
    equal (a JAX scalar was refused as 'must be a finite number'); stored as Python floats."""
    import jax.numpy as jnp
    c = sync.ComputeModel(means=(jnp.float32(1.0), np.float64(2.5)), sigma=jnp.float32(0.5), comm=np.float32(0.25),
                          stragglers=((jnp.int32(0), 1.0, jnp.float32(2.0), 3),), deaths=((np.int64(1), jnp.array(4.0)),),
                          join_times=(0, jnp.int32(0)))
    assert (c.sigma, c.comm) == (0.5, 0.25) and type(c.sigma) is float
    sync.check_simulation(c, max_time=jnp.float32(10.0), eval_every=np.float32(1.0), batch_size=jnp.int32(16),
                          max_pushes=np.int64(100))
    with pytest.raises(ValueError, match="sigma must be a finite number >= 0; got Array"):
        sync.ComputeModel(means=(1.0,), sigma=jnp.float32("inf"))
