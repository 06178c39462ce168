"""Each policy's decisions on hand-built event traces, and configuration errors."""

import pytest

from bppsa import sync
from bppsa.sync import Decision


def test_asp_never_waits():
    p = sync.make_policy("asp", 3)
    for k in range(20):
        assert p.push(k % 2, float(k)) == Decision()
    assert p.clock == {0: 10, 1: 10, 2: 0}


@pytest.mark.parametrize("s", [0, 1, 3, 6])
def test_ssp_blocks_exactly_at_s_plus_one_ahead(s):
    p = sync.SSP(2, s=s)
    for k in range(1, s + 1):
        assert p.push(0, float(k)).kind == "proceed"  # k ahead, k <= s
    d = p.push(0, float(s + 1))  # s + 1 ahead
    assert d.kind == "wait" and d.until == 1 and 0 in p.waiting
    d = p.push(1, 100.0)  # the slowest catches up by one: worker 0 is s ahead again
    assert d.kind == "proceed" and d.release == (0,)
    assert not p.waiting


def test_ssp_release_waits_for_the_slowest_of_several():
    p = sync.SSP(3, s=1)
    assert p.push(0, 1.0).kind == "proceed"
    assert p.push(0, 2.0).kind == "wait"
    assert p.push(1, 3.0).release == ()  # worker 2 is still at 0
    assert p.push(2, 4.0).release == (0,)


def test_dssp_controller_formula():
    # P_i = 7 + 0.5 i, S_k = 6 + 2 (k + 1) = 8, 10, ...: P_2 = 8 hits S_0 exactly
    assert sync.dssp_controller(7.0, 6.5, 6.0, 4.0, r_max=12) == 2
    # P_3 = 10 = S_1
    assert sync.dssp_controller(8.5, 8.0, 6.0, 4.0, r_max=12) == 3
    # the slowest is predicted to push at 10, when the fastest pushes now: r* = 0
    assert sync.dssp_controller(10.0, 9.0, 8.0, 6.0, r_max=12) == 0
    # r_max caps the search
    assert sync.dssp_controller(0.0, -1.0, 0.0, -100.0, r_max=5) == 5


def test_dssp_trace_picks_documented_r_star():
    p = sync.DSSP(2, s_L=1, r_max=12)
    assert p.push(0, 1.0).kind == "proceed"          # 1 ahead
    d = p.push(0, 2.0)                                # 2 ahead, no push history for the slowest
    assert d.kind == "wait" and d.until == 1
    d = p.push(1, 4.0)
    assert d.kind == "proceed" and d.release == (0,)
    assert p.push(1, 6.0).kind == "proceed"
    assert p.push(0, 6.5).kind == "proceed"          # clocks 3 vs 2
    d = p.push(0, 7.0)                                # 4 vs 2: controller, A[0] = (6.5, 7), A[1] = (4, 6)
    assert d.kind == "proceed" and p.controller_calls == [(0, 2)] and p.r[0] == 2
    assert p.push(0, 7.5).kind == "proceed" and p.r[0] == 1
    assert p.push(0, 8.0).kind == "proceed" and p.r[0] == 0
    d = p.push(0, 8.5)                                # controller again: A[0] = (8, 8.5) -> r* = 3
    assert d.kind == "proceed" and p.controller_calls[-1] == (0, 3)


def test_dssp_waits_when_controller_says_zero():
    p = sync.DSSP(2, s_L=1, r_max=4)
    for w, t in [(1, 1.0), (0, 1.5), (1, 2.0), (0, 3.0), (1, 3.0)]:
        assert p.push(w, t).kind == "proceed"
    # clocks 3 vs 2 -> 4 vs 2: P_i = 4.5 + i, S_k = 3 + 1.5 (k + 1) = 4.5, 6, ...: r* = 0 -> wait
    d = p.push(1, 4.5)
    assert d.kind == "wait" and d.until == 3 and p.controller_calls == [(1, 0)]
    assert p.push(0, 4.5).release == (1,)


def test_dssp_non_fastest_waits_without_controller():
    p = sync.DSSP(3, s_L=1, r_max=4)
    p.clock = {0: 6, 1: 4, 2: 2}
    p.push_times = {0: [1.0, 2.0], 1: [1.0, 2.0], 2: [1.0, 2.0]}
    d = p.push(1, 3.0)  # 5 vs 2 ahead, but worker 0 is faster
    assert d.kind == "wait" and p.controller_calls == []


def test_bsp_barrier_each_push_and_dead_worker_dropped():
    p = sync.BSP(3)
    d = p.push(0, 1.0)
    assert d.kind == "barrier" and d.at == 1 and d.release == ()
    assert p.push(1, 2.0).release == ()
    assert p.push(2, 3.0).release == (0, 1, 2)
    p.push(0, 4.0)
    p.push(1, 5.0)
    d = p.remove(2, 6.0)  # worker 2 died: the barrier opens for the others
    assert d.release == (0, 1) and p.removed == [2]
    d = p.push(0, 7.0)
    assert d.kind == "barrier" and d.release == ()
    assert p.push(1, 8.0).release == (0, 1)


def test_ssp_dead_slowest_releases_waiters():
    p = sync.SSP(2, s=0)
    assert p.push(0, 1.0).kind == "wait"
    assert p.remove(1, 5.0).release == (0,)


def test_elastic_bsp_plans_barrier_with_zipline():
    p = sync.ElasticBSP(2, R=4)
    d = p.push(0, 1.0)  # no intervals yet: barrier after one push (as BSP)
    assert d.kind == "barrier"
    d = p.push(1, 2.5)
    assert d.kind == "barrier" and d.release == (0, 1)
    # intervals: worker 0 took 1.0, worker 1 took 2.5 -> predictions from the barrier time 2.5:
    # row 0: 3.5, 4.5, 5.5, 6.5; row 1: 5.0, 7.5, 10, 12.5 -> (4.5, 5.0) and (5.5, 5.0) tie at 0.5;
    assert p.barrier_at in (5.0, 5.5)
    assert p.quota[1] == 1 and p.quota[0] in (2, 3)
    q0 = p.quota[0]
    for k in range(q0 - 1):
        assert p.push(0, 3.5 + k).kind == "proceed"
    d = p.push(0, 2.5 + q0)
    assert d.kind == "barrier" and d.at == p.barrier_at and d.release == ()
    d = p.push(1, 5.0)
    assert d.release == (0, 1) and len(p.barriers) == 2


def test_elastic_bsp_uses_compute_time_not_waiting_time():
    p = sync.ElasticBSP(2, R=10)
    p.push(0, 1.0)
    p.push(1, 2.0)            # barrier opens at 2.0
    assert p.quota == {0: 2, 1: 1} and p.barrier_at == 4.0
    p.push(0, 3.0)
    p.push(0, 4.0)           # worker 0 waits from 4.0
    assert p.push(1, 4.0).release == (0, 1)
    assert p.interval == {0: 1.0, 1: 2.0}


def test_late_joiner():
    p = sync.SSP(2, s=1)
    for k in range(4):
        p.push(0, float(k))
        p.push(1, float(k))
    d = p.join(2, 10.0)
    assert d.kind == "proceed" and p.clock[2] == 4  # starts at the slowest clock, blocks nobody
    b = sync.BSP(2)
    d = b.join(2, 1.0)
    assert d.kind == "barrier"
    b.push(0, 2.0)
    assert b.push(1, 3.0).release == (0, 1, 2)


@pytest.mark.parametrize("name, kwargs, match", [
    ("ssp", {"s": -1}, "s .*>= 0"),
    ("dssp", {"s_L": -2}, "s .*>= 0"),
    ("dssp", {"r_max": -1}, "r_max"),
    ("elasticbsp", {"R": 0}, "R .*>= 1"),
    ("ssp", {"s": 1.5}, "s "),
    ("bsp", {"bogus": 1}, "bad options"),
    ("nosuch", {}, "unknown policy 'nosuch'"),
])
def test_bad_configuration_is_a_clear_error(name, kwargs, match):
    with pytest.raises(ValueError, match=match):
        sync.make_policy(name, 4, **kwargs)


def test_bad_events():
    p = sync.SSP(2, s=0)
    with pytest.raises(ValueError, match="num_workers"):
        sync.BSP(0)
    with pytest.raises(ValueError, match="not an active worker"):
        p.push(5, 0.0)
    p.push(0, 0.0)
    with pytest.raises(ValueError, match="while waiting"):
        p.push(0, 1.0)


def test_numpy_and_jax_integers_are_ints():
    """num_workers, s, r_max and R as numpy or JAX integers are the ints they equal; bools are
    refused (BSP(True) used to make one worker)."""
    import jax.numpy as jnp
    import numpy as np
    p = sync.make_policy("dssp", jnp.int32(3), s_L=np.int64(2), r_max=jnp.array(5))
    assert sorted(p.clock) == [0, 1, 2] and (p.s, p.r_max) == (2, 5) and type(p.r_max) is int
    assert sync.make_policy("elasticbsp", np.int64(2), R=jnp.int32(4)).R == 4
    with pytest.raises(ValueError, match="num_workers must be an int >= 1; got True"):
        sync.BSP(True)


def test_elastic_bsp_refuses_an_unknown_solver_when_built():
    """An unknown ZipLine method was a ValueError at the first planned barrier, mid-run."""
    with pytest.raises(ValueError, match=r"method must be one of \[.*'window'.*\]; got 'nope'"):
        sync.ElasticBSP(2, method="nope")
