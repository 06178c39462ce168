"""Sequence-parallel BPPSA on 4 and 8 simulated CPU devices (conftest): gradients equal autodiff
through ``lax.scan`` and single-device BPPSA in float64, for RNN/GRU/LSTM, T divisible by the
device count and not, a loss at every step and at the last only, every combine, a 2-D mesh, the
pmap-style entry point and the BPTT-through-the-mesh path."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import bppsa
from bppsa import parallel
from bppsa.parallel.selfcheck import problem
from tests.reference import grads_of, scan_states


_ref_states = scan_states  # the one plain lax.scan reference (tests/reference.py)


# Per cell, (devices, T, B, combine, scan, loss at every step): together they cover 4 and 8
# devices, T divisible and not (and T < devices), B = 1, every combine, both kinds of loss.
CASES = {
    "rnn": [(4, 10, 2, "logstep", "blelloch", True), (8, 16, 1, "allgather", "blelloch", False)],
    "gru": [(8, 5, 2, "chain", "blelloch", True), (4, 8, 2, "logstep", "blelloch", False)],
    "lstm": [(4, 7, 2, "allgather", "blelloch", False), (8, 8, 2, "logstep", "blelloch", True)],
}


@pytest.mark.parametrize("cell_name", ["lstm", pytest.param("rnn", marks=pytest.mark.slow),
                                       pytest.param("gru", marks=pytest.mark.slow)])  # lstm: a two-array state
def test_sharded_gradients_equal_lax_scan_and_single_device(loss, close, cell_name):
    for P, T, B, combine, scan, every in CASES[cell_name]:
        cell, params, xs, h0 = problem(cell_name, T=T, B=B)
        mesh = parallel.make_mesh(P, batch_axis=None)
        step_loss = functools.partial(loss, every_step=every)

        @jax.jit
        def all_grads(params, xs, h0):
            ref = grads_of(lambda p, x, h: _ref_states(cell, p, x, h), params, xs, h0, step_loss)
            one = grads_of(lambda p, x, h: bppsa.rnn(cell, p, x, h), params, xs, h0, step_loss) if P == 4 else ref
            sharded = grads_of(lambda p, x, h: parallel.rnn(cell, p, x, h, mesh=mesh, combine=combine,
                                                          scan=scan), params, xs, h0, step_loss)
            return ref, one, sharded

        ref, one, sharded = all_grads(params, xs, h0)
        assert np.abs(np.asarray(ref[0]["W_h"])).max() > 1e-3  # a real gradient, not all zeros
        close(sharded, ref)
        close(sharded, one)  # single-device BPPSA (once per cell, to save compiles)


def test_two_dimensional_mesh_data_by_seq_with_uneven_batch_and_time(loss, close):
    cell, params, xs, h0 = problem("gru", T=7, B=3)  # 7 steps over 4 devices, 3 rows over 2
    mesh = parallel.make_mesh(seq=4, data=2)
    assert dict(mesh.shape) == {"data": 2, "seq": 4}

    @jax.jit
    def both(params, xs, h0):
        ref = grads_of(lambda p, x, h: _ref_states(cell, p, x, h), params, xs, h0, loss)
        got = grads_of(lambda p, x, h: bppsa.rnn(cell, p, x, h, mesh=mesh, seq_axis="seq", batch_axis="data"),
                       params, xs, h0, loss)
        return ref, got

    ref, got = both(params, xs, h0)
    close(got, ref)


def test_two_dimensional_mesh_shards_time_and_batch():
    cell, params, xs, h0 = problem("rnn", T=8, B=4)
    mesh = parallel.make_mesh(seq=4, data=2)
    hs = jax.jit(lambda p, x, h: bppsa.rnn(cell, p, x, h, mesh=mesh, batch_axis="data"))(params, xs, h0)
    np.testing.assert_allclose(hs, _ref_states(cell, params, xs, h0), rtol=1e-12, atol=1e-13)
    shard_shapes = {s.data.shape for s in hs.addressable_shards}
    assert shard_shapes == {(2, 2, 4)}  # (T / 4, B / 2, H) on each of the 8 devices


def test_pmap_entry_point_matches_lax_scan(loss, close):
    cell, params, xs, h0 = problem("lstm", T=12, B=2)
    P = 4

    def pm_states(p, x, h):
        hs, cs = parallel.pmap_rnn(cell, p, x.reshape(P, 3, 2, 3), h)
        assert hs.shape == (P, 3, 2, 4)
        return hs.reshape(12, 2, 4), cs.reshape(12, 2, 4)

    @jax.jit
    def both(params, xs, h0):
        ref = grads_of(lambda p, x, h: _ref_states(cell, p, x, h), params, xs, h0, loss)
        return ref, grads_of(pm_states, params, xs, h0, loss), pm_states(params, xs, h0)[0]

    ref, got, hs = both(params, xs, h0)
    close(got, ref)
    np.testing.assert_allclose(hs, _ref_states(cell, params, xs, h0)[0], rtol=1e-12, atol=1e-13)


def test_bptt_through_the_mesh_and_other_local_scans(loss, close):
    cell, params, xs, h0 = problem("rnn", T=9, B=2)
    mesh = parallel.make_mesh(4, batch_axis=None)

    @jax.jit
    def run(params, xs, h0):
        ref = grads_of(lambda p, x, h: _ref_states(cell, p, x, h), params, xs, h0, loss)
        outs = [grads_of(lambda p, x, h: parallel.rnn(cell, p, x, h, mesh=mesh, backward="bptt"), params, xs, h0,
                         loss)]
        for scan in ("associative", "sequential"):
            outs.append(grads_of(lambda p, x, h, scan=scan: parallel.rnn(cell, p, x, h, mesh=mesh, scan=scan,
                                                                         combine="logstep"), params, xs, h0, loss))
        return ref, outs

    ref, outs = run(params, xs, h0)
    for got in outs:
        close(got, ref)


def test_communication_volume_counts():
    v = parallel.communication_volume(8, B=2, S=3, itemsize=8, combine="logstep")
    assert [b for _, b in v["levels"]] == [(18 + 6) * 8] * 2 + [6 * 8] * 2
    v = parallel.communication_volume(8, B=2, S=3, itemsize=8, combine="allgather")
    assert v["combine_bytes"] == 7 * (18 + 6) * 8
    assert parallel.communication_volume(1, 2, 3, 8, "chain")["combine_bytes"] == 0
    assert parallel.choose_combine(4) == "allgather" and parallel.choose_combine(16) == "logstep"


def test_bad_arguments_raise_clear_errors():
    cell, params, xs, h0 = problem("rnn", T=4, B=2)
    mesh = parallel.make_mesh(2, batch_axis=None)
    with pytest.raises(ValueError, match="seq_axis 'time' is not an axis of the mesh"):
        bppsa.rnn(cell, params, xs, h0, mesh=mesh, seq_axis="time")
    with pytest.raises(ValueError, match="batch_axis 'data' is not an axis"):
        bppsa.rnn(cell, params, xs, h0, mesh=mesh, batch_axis="data")
    with pytest.raises(ValueError, match="combine must be one of"):
        parallel.rnn(cell, params, xs, h0, mesh=mesh, combine="tree")
    with pytest.raises(ValueError, match="mesh must be a jax.sharding.Mesh"):
        bppsa.rnn(cell, params, xs, h0, mesh="seq")
    with pytest.raises(ValueError, match="needs that many; only 8 are available"):
        parallel.make_mesh(seq=8, data=2)
    with pytest.raises(ValueError, match=r"xs must have shape \(P, C, B, I\)"):
        parallel.pmap_rnn(cell, params, xs, h0)
    with pytest.raises(ValueError, match="xs must have shape"):  # the core's validation still runs
        bppsa.rnn(cell, params, xs[0], h0, mesh=mesh)


@pytest.mark.slow
@pytest.mark.parametrize("cell_name", ["rnn", "gru", "lstm"])
@pytest.mark.parametrize("P", [2, 3, 8])
def test_sweep_lengths_devices_combines(loss, close, cell_name, P):
    devices = jax.devices()[:P]
    mesh = parallel.make_mesh(P, devices=devices, batch_axis=None)
    for T in sorted({1, max(1, P - 1), 2 * P + 1, 13}):
        cell, params, xs, h0 = problem(cell_name, T=T, B=2, seed=T)

        @jax.jit
        def run(params, xs, h0):
            out = []
            for every in (True, False):
                step_loss = functools.partial(loss, every_step=every)
                ref = grads_of(lambda p, x, h: _ref_states(cell, p, x, h), params, xs, h0, step_loss)
                for combine in ("logstep", "allgather", "chain"):
                    got = grads_of(lambda p, x, h, c=combine: parallel.rnn(cell, p, x, h, mesh=mesh, combine=c),
                                   params, xs, h0, step_loss)
                    out.append((ref, got))
            return out

        for ref, got in run(params, xs, h0):
            close(got, ref)


def _check_chunk_phases(n, method, seed):
    """Phase 1 gives (Π, δ) with total(u) = u Π + δ; phase 3 with root u + c equals the scan."""
    from bppsa.parallel.sequence import chunk_aggregate, chunk_finish
    rng = np.random.default_rng(seed)
    B, S = 2, 3
    Ms = jnp.asarray(rng.normal(0, 0.6, (n, B, S, S)))
    ds = jnp.asarray(rng.normal(0, 1, (n, B, S)))
    c, u = jnp.asarray(rng.normal(0, 1, (B, S))), jnp.asarray(rng.normal(0, 1, (B, S)))

    @jax.jit
    def phases(c, u, Ms, ds):
        Pi, delta, state = chunk_aggregate(method, c, Ms, ds)
        return Pi, delta, chunk_finish(method, state, u + c, Ms, ds)

    Pi, delta, (prefixes, total) = phases(c, u, Ms, ds)
    ref_prefixes, ref_total = bppsa.sequential_scan(u + c, Ms, ds)
    prod = Ms[0]
    for k in range(1, n):
        prod = prod @ Ms[k]
    np.testing.assert_allclose(Pi, prod, rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(jnp.einsum("bi,bij->bj", u, Pi) + delta, ref_total, rtol=1e-11, atol=1e-12)
    np.testing.assert_allclose(prefixes, ref_prefixes, rtol=1e-11, atol=1e-12)
    np.testing.assert_allclose(total, ref_total, rtol=1e-11, atol=1e-12)


@pytest.mark.parametrize("n, method", [(1, "blelloch"), (7, "blelloch"), (5, "associative")])
def test_chunk_aggregate_and_finish_equal_the_plain_scan(n, method):
    _check_chunk_phases(n, method, seed=n)


@pytest.mark.slow
@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 17), method=st.sampled_from(["blelloch", "associative", "sequential"]),
       seed=st.integers(0, 2 ** 16))
def test_chunk_phases_property(n, method, seed):
    _check_chunk_phases(n, method, seed)


def test_cross_device_combines_equal_a_sequential_fold():
    """u_p = A_{p+1}(A_{p+2}(… A_{P-1}(0))) on P = 5 devices (not a power of two), every combine."""
    from jax.sharding import PartitionSpec as PS

    from bppsa.parallel.sequence import COMBINE_FNS
    P, B, S = 5, 2, 3
    rng = np.random.default_rng(0)
    Pi, dl = rng.normal(0, 0.6, (P, B, S, S)), rng.normal(0, 1, (P, B, S))
    mesh = parallel.make_mesh(P, devices=jax.devices()[:P], batch_axis=None)
    run = jax.jit(parallel.shard_map(
        lambda Pi, dl: tuple(COMBINE_FNS[c](Pi[0], dl[0], "seq", P)[None] for c in ("logstep", "allgather", "chain")),
        mesh, in_specs=(PS("seq"), PS("seq")), out_specs=(PS("seq"),) * 3))
    expected = np.zeros((P, B, S))
    for p in range(P - 2, -1, -1):
        expected[p] = np.einsum("bi,bij->bj", expected[p + 1], Pi[p + 1]) + dl[p + 1]
    for got in run(Pi, dl):
        np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-13)


def test_make_mesh_takes_numpy_and_jax_integers():
    """seq and data as numpy or JAX integers (e.g. from jax.device_count() arithmetic on arrays) are
    the ints they equal (they were refused as 'must be a positive int')."""
    mesh = parallel.make_mesh(np.int64(4), data=jnp.int32(2))
    assert dict(mesh.shape) == {"data": 2, "seq": 4}
    assert dict(parallel.make_mesh(jnp.array(4), batch_axis=None).shape) == {"seq": 4}
    with pytest.raises(ValueError, match=r"seq must be a positive int; got np.float64\(4.0\)"):
        parallel.make_mesh(np.float64(4))


@pytest.mark.parametrize("cell_name,forward", [("gru", "sequential"),  # block_gru: its newton case below
                                               pytest.param("block_gru", "sequential", marks=pytest.mark.slow),
                                               pytest.param("gru", "newton", marks=pytest.mark.slow),
                                               ("block_gru", "newton"),
                                               pytest.param("block_gru2", "sequential", marks=pytest.mark.slow),
                                               pytest.param("lstm", "newton", marks=pytest.mark.slow)])
def test_forward_mode_and_hvps_through_the_mesh_equal_one_device(close, cell_name, forward):
    """One pipeline for one device and a mesh: jax.jvp, the gradient and a Hessian-vector product
    through ``mesh=`` (4 simulated devices, T = 11 not divisible by 4, B = 3) equal the unsharded
    ones in float64, for a dense cell (GRU) and structured cells whose diagonal / 2x2-block
    Jacobians the sharded scans use (BlockGRU); the parallel forward too."""
    from bppsa import cells
    cell = {"gru": cells.GRU(3, 5), "block_gru": cells.BlockGRU(3, 6, head_size=1),
            "block_gru2": cells.BlockGRU(3, 6, head_size=2), "lstm": cells.LSTM(3, 4)}[cell_name]
    rng = np.random.default_rng(0)
    params = jax.tree.map(lambda a: jnp.asarray(rng.normal(size=a.shape) * 0.5), cell.init(jax.random.key(0)))
    xs = jnp.asarray(rng.normal(size=(11, 3, 3)))
    h = jnp.asarray(rng.normal(size=(3, cell.hidden_size)) * 0.1)
    h0 = (h, h) if cell.pair_state else h
    mesh = parallel.make_mesh(4, batch_axis=None)

    def loss(p, x, m):
        return jnp.sum(jnp.sin(cell.hidden(bppsa.rnn(cell, p, x, h0, mesh=m, forward=forward))))

    tp = jax.tree.map(lambda a: jnp.asarray(rng.normal(size=a.shape)), params)
    tx = jnp.asarray(rng.normal(size=xs.shape))
    sharded, single = (jax.jit(functools.partial(lambda m, p, x: (
        jax.jvp(lambda p, x: loss(p, x, m), (p, x), (tp, tx))[1],
        jax.grad(loss)(p, x, m),
        jax.jvp(lambda p: jax.grad(loss)(p, x, m), (p,), (tp,))[1]), m)) for m in (mesh, None))
    got, want = sharded(params, xs), single(params, xs)
    assert abs(float(got[0]) - float(want[0])) <= 1e-12 * max(1.0, abs(float(want[0])))
    close(got[1:], want[1:])
