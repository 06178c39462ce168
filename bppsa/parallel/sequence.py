"""Sequence-parallel BPPSA: one sequence's forward and backward pass split over a mesh axis.

The time axis (T) is cut into P equal chunks of C = ⌈T / P⌉ steps, chunk p on device p of the
``seq`` mesh axis (the tail is padded, see below); the batch can be split over a second mesh axis.

Backward (three phases, everything in scan order, latest step first, as in :mod:`bppsa.scan`).
Device p owns steps t = pC+1 … (p+1)C. Let u_p be the gradient reaching its last state from the
*later* chunks (u_{P-1} = 0). The chunk is the affine map A_p(u) = u @ Π_p + δ_p that takes u_p
to the gradient reaching the previous chunk's last state; Π_p is the product of its C transposed
Jacobians and δ_p its result for u = 0.

1. Aggregate (local, no communication): the up-sweep of the modified Blelloch scan with root
   c_last (the chunk's own last-step loss gradient) gives δ_p at its root; Π_p is the product of
   the blocks block 0 absorbs at each level (⌈log₂ C⌉ more matrix products).
2. Combine (across devices): u_p = A_{p+1}(A_{p+2}(… A_{P-1}(0))) — an exclusive suffix scan of
   the P affine maps. ``combine="logstep"``: ⌈log₂ P⌉ ``ppermute`` rounds (Hillis–Steele: each
   round but the last sends one (Π, δ) pair, B·S² + B·S numbers, and composes with one matrix
   product; the last sends δ only), then one vector shift. ``"allgather"``: one ``all_gather``
   of every (Π, δ) ((P − 1)·(B·S² + B·S) numbers received), then P vector–matrix products.
   ``"chain"``: P − 1 sequential vector hops (B·S numbers each), the latency-bound baseline.
3. Finish (local): re-run the up-sweep's block-0 path with the true root u_p + c_last (⌈log₂ C⌉
   vector products) and the down-sweep (vector products only), giving every g_t of the chunk;
   parameter gradients are the local contraction, summed over the mesh with ``psum``.

Per device the backward costs about C matrix products (the single-device scan costs T) plus
O(log C + log P) levels: the Θ(log T) depth of BPPSA is kept and the work is split P ways.

Forward: sequential across devices by nature. Device p runs its chunk once the state h_{pC}
arrives from device p − 1 (P rounds, one ``ppermute`` of a (B, S) state between them), so its
wall time is that of T sequential steps plus P − 1 transfers — no faster than one device, but
each device stores only its chunk's states (memory / P).

Padding (T not divisible by P): the tail steps are masked in the forward (the state is carried
unchanged), their loss gradients are zero and their transposed Jacobians are replaced by zero
matrices, so every gradient flowing through them is exactly zero and the real steps' gradients
are bit-for-bit those of the exact recurrence. A batch not divisible by the data axis is padded
with zero rows the same way.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array, lax
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as PS
from jax.typing import ArrayLike

from bppsa import backprop
from bppsa.backward import pipeline, rule
from bppsa.cells import Cell, closure
from bppsa.cells.structure import block_size, jacobian_blocks
from bppsa.errors import UsageError
from bppsa.forward import newton as newton_lib
from bppsa.forward.elk import trust_region_solve
from bppsa.forward.sequential import steps
from bppsa.parallel.mesh import check_axes, make_mesh, shard_map
from bppsa.plan import options as options_lib
from bppsa.plan.options import COMBINES, Options, Plan
from bppsa.scan import dense as scan_lib
from bppsa.scan.layout import block_rows, to_blocks

__all__ = ["rnn", "pmap_rnn", "COMBINES", "COMBINE_FNS", "communication_volume",
           "sharded_functions", "sequence_parallel_states"]


def communication_volume(P: int, B: int, S: int, itemsize: int, combine: str) -> dict:
    """Bytes each device sends in the backward's combine, per level and in total.

    ``levels`` is a list of (what, bytes sent per device); the boundary-state shift that rebuilds
    s_{pC} (B·S numbers) and the final ``psum`` of parameter gradients are listed separately.

    Args:
      P: devices along the time axis.
      B: the batch size (each device's share where the batch is split too).
      S: the flat state size.
      itemsize: bytes per number (4 for float32).
      combine: "logstep", "allgather" or "chain".

    Returns:
      A dict: "levels", the list of (what, bytes sent per device); "combine_bytes", their sum;
      "boundary_bytes", the B·S numbers of the boundary-state shift (0 for P = 1).

    Raises:
      bppsa.errors.UsageError: ``combine`` is not one of the three (checked for P > 1).
    """
    mat, vec = B * S * S * itemsize, B * S * itemsize
    if P == 1:
        levels = []
    elif combine == "logstep":
        rounds = (P - 1).bit_length()
        levels = [(f"ppermute d={2 ** k} (Π, δ)", mat + vec) for k in range(rounds - 1)]
        levels.append((f"ppermute d={2 ** (rounds - 1)} δ", vec))  # the last round needs no Π
        levels.append(("ppermute d=1 u", vec))
    elif combine == "allgather":
        levels = [("all_gather (Π, δ)", (P - 1) * (mat + vec))]  # received per device
    elif combine == "chain":
        levels = [(f"ppermute hop {k} u (vector)", vec) for k in range(P - 1)]
    else:
        raise UsageError(f"combine must be one of {COMBINES[:-1]}; got {combine!r}")
    return {"levels": levels, "combine_bytes": sum(b for _, b in levels),
            "boundary_bytes": vec if P > 1 else 0}


# --------------------------------------------------------------------------------------------
# Per-device pieces (run inside shard_map; axis names are mesh axes).
# --------------------------------------------------------------------------------------------

def _tree_product(Ms: Array):
    """M_1 @ M_2 @ … @ M_n by pairwise levels: (n, B, S, S) -> (B, S, S)."""
    while Ms.shape[0] > 1:
        h = Ms.shape[0] // 2
        prod = jnp.matmul(Ms[0:2 * h:2], Ms[1:2 * h:2])
        Ms = jnp.concatenate([prod, Ms[2 * h:]], axis=0)
    return Ms[0]


def chunk_aggregate(method: str, c_last: Array, Ms: Array, ds: Array):
    """Phase 1: (Π, δ, state) of one chunk; ``state`` is what :func:`chunk_finish` reuses."""
    if method == "blelloch":
        levels = scan_lib.up_sweep(c_last, Ms, ds)
        Pi = functools.reduce(jnp.matmul, [lvl[1][0] for lvl in levels[:-1]])
        return Pi, levels[-1][0], levels
    _, delta = scan_lib.scan(c_last, Ms, ds, method)
    return _tree_product(Ms), delta, None


def chunk_finish(method: str, state: Any, v: Array, Ms: Array, ds: Array):
    """Phase 3: the chunk's exclusive prefixes (C, B, S) and total (B, S) for the root ``v``."""
    if method != "blelloch":
        return scan_lib.scan(v, Ms, ds, method)
    levels = []
    for _, M, d in state[:-1]:  # the up-sweep's block-0 path with the new root; blocks >= 1 reused
        levels.append((v, M, d))
        v = scan_lib.vecmat(v, M[0]) + d[0]
    levels.append((v,) + tuple(state[-1][1:]))
    return scan_lib.down_sweep(levels), v


def _shift(x: Array, axis: str, P: int, d: int):
    """Device i receives device i + d's x (zeros where i + d >= P)."""
    return lax.ppermute(x, axis, perm=[(i + d, i) for i in range(P - d)])


def combine_logstep(Pi: Array, delta: Array, axis: str, P: int):
    """Exclusive suffix scan of the affine maps in ⌈log₂ P⌉ ppermute rounds; returns u (B, S)."""
    idx = lax.axis_index(axis)
    d = 1
    while d < P:
        has = idx + d < P
        Pr = _shift(Pi, axis, P, d) if 2 * d < P else None  # the last round needs only the right vector
        dr = _shift(delta, axis, P, d)
        delta = jnp.where(has, scan_lib.vecmat(dr, Pi) + delta, delta)  # A_self ∘ A_right (right applied first)
        if Pr is not None:
            Pi = jnp.where(has, jnp.matmul(Pr, Pi), Pi)
        d *= 2
    return _shift(delta, axis, P, 1)


def _fold_gathered(Pi: Array, delta: Array, u: Array, axis: str, P: int, later: bool):
    """``u`` (B, S) through the other devices' affine maps A_q(u) = u @ Π_q + δ_q, from one
    ``all_gather`` of every (Π, δ): ``later`` (the backward's scan order) the later devices',
    u ← A_{p+1}(… A_{P-1}(u)); else (the forward's order) the earlier devices', u ←
    A_{p-1}(… A_0(u)). Block rows (n, k) throughout."""
    idx = lax.axis_index(axis)
    Pis, dls = lax.all_gather(Pi, axis), lax.all_gather(delta, axis)

    def fold(u, q):
        return jnp.where(q > idx if later else q < idx, scan_lib.vecmat(u, Pis[q]) + dls[q], u), None

    return lax.scan(fold, u, jnp.arange(P - 1, 0, -1) if later else jnp.arange(P - 1))[0]


def combine_allgather(Pi: Array, delta: Array, axis: str, P: int):
    """Gather every chunk's (Π, δ); each device folds the later ones into its u (B, S)."""
    return _fold_gathered(Pi, delta, jnp.zeros_like(delta), axis, P, later=True)


def combine_chain(Pi: Array, delta: Array, axis: str, P: int):
    """P − 1 sequential hops: device q sends A_q(u_q) to q − 1."""
    idx = lax.axis_index(axis)
    u = jnp.zeros_like(delta)
    for q in range(P - 1, 0, -1):
        sent = lax.ppermute(scan_lib.vecmat(u, Pi) + delta, axis, perm=[(q, q - 1)])
        u = jnp.where(idx == q - 1, sent, u)
    return u


COMBINE_FNS = {"logstep": combine_logstep, "allgather": combine_allgather, "chain": combine_chain}


def _forward_body(cell: Cell, T: int, P: int, seq_axis: str, params: Any, xs: Array, s0: Array):
    """xs (C, B, I), s0 (B, S) -> ss (C, B, S): the chunk, once its boundary state has arrived."""
    C = xs.shape[0]
    idx = lax.axis_index(seq_axis)
    valid = idx * C + jnp.arange(C) < T

    lp = cell.loop_params(params)

    def chunk(s):
        def body(s, inp):
            u, ok = inp
            s_new = cell.flatten_state(cell.step_projected(lp, cell.unflatten_state(s), u))
            s_new = jnp.where(ok, s_new, s)  # padded steps carry the state unchanged
            return s_new, s_new
        return lax.scan(body, s, (cell.project(params, xs), valid))[1]

    if P == 1:
        return chunk(s0)
    out = jax.eval_shape(chunk, s0)
    ss = jnp.zeros(out.shape, out.dtype)
    boundary = s0.astype(out.dtype)
    for k in range(P):  # round k: device k runs its chunk and hands its last state to k + 1
        ss = lax.cond(idx == k, chunk, lambda s, ss=ss: ss, boundary)
        if k + 1 < P:
            sent = lax.ppermute(ss[-1], seq_axis, perm=[(k, k + 1)])
            boundary = jnp.where(idx == k + 1, sent, boundary)
    return ss


def _boundary_states(ss: Array, s0: Array, idx: Array, P: int, seq_axis: str):
    """The state before this device's first step (B, S): the previous device's last state, s0 on
    device 0 (one ``ppermute``)."""
    boundary = s0.astype(ss.dtype)
    if P > 1:  # s_{pC}: the previous chunk's last state
        prev_last = lax.ppermute(ss[-1], seq_axis, perm=[(i, i + 1) for i in range(P - 1)])
        boundary = jnp.where(idx == 0, boundary, prev_last)
    return boundary


def _states_before(ss: Array, s0: Array, idx: Array, P: int, seq_axis: str):
    """The state before each of this device's steps (C, B, S): its boundary state
    (:func:`_boundary_states`), then its own states but the last."""
    return jnp.concatenate([_boundary_states(ss, s0, idx, P, seq_axis)[None], ss[:-1]], axis=0)


def _sharded_solve(method: str, E: Array, c: Array, s_in: Array, valid: Array, seq_axis: str, P: int):
    """One device's share of the linear recurrence s_t = s_{t-1} E_t + c_t over the mesh, from s_in
    entering device 0 (block rows (n, k)): padded steps made identity maps with no input, the
    stretch's maps aggregated (:func:`chunk_aggregate`), the earlier devices' maps folded into the
    entering state (:func:`_fold_gathered`), the stretch finished (:func:`chunk_finish`). Returns
    the C states of the stretch (C, n, k)."""
    k = E.shape[-1]
    E = jnp.where(valid[..., None], E, jnp.eye(k, dtype=E.dtype))  # padded steps: identity maps, no input
    c = jnp.where(valid, c, jnp.zeros((), c.dtype))
    Pi, delta, state = chunk_aggregate(method, jnp.zeros_like(c[0]), E, c)
    u = _fold_gathered(Pi, delta, s_in, seq_axis, P, later=False) if P > 1 else s_in  # the state entering it
    prefixes, total = chunk_finish(method, state, u, E, c)
    return jnp.concatenate([prefixes[1:], total[None]], axis=0)


def _backward_body(cell: Cell, method: str, combine: str, T: int, P: int, seq_axis: str, batch_axis: str | None,
                   params: Any, xs: Array, s0: Array, ss: Array, ct: Array):
    """One device's share of the BPPSA backward: (dparams (psum'd), dxs (C, B, I), ds0 (B, S), gs
    (C, B, S) the adjoint states). A cell with block-diagonal Jacobians (k = its
    :class:`bppsa.cells.Blocks`' size; 1: diagonal) scans (k, k) blocks on B·S/k rows, as on one device,
    never S×S matrices; the combine sends the blocks' (Π, δ)."""
    C, B, S = ss.shape
    idx = lax.axis_index(seq_axis)
    valid = idx * C + jnp.arange(C) < T
    boundary = _boundary_states(ss, s0, idx, P, seq_axis)
    xr, sr, spr, ctr = pipeline.scan_order(xs, ss, boundary, ct)
    k = block_size(cell) or S
    Ms = block_rows(jacobian_blocks(cell, params, spr, xr, sr))  # (C, B·S/k, k, k)
    Ms = jnp.where(valid[::-1, None, None, None], Ms, jnp.zeros((), Ms.dtype))  # padded steps: zero maps
    c_last, ds = pipeline.root_and_offsets(ctr)
    c_last, ds = to_blocks(c_last[None], k)[0], to_blocks(ds, k)
    Pi, delta, state = chunk_aggregate(method, c_last, Ms, ds)
    u = COMBINE_FNS[combine](Pi, delta, seq_axis, P) if P > 1 else jnp.zeros_like(delta)
    gs, total = chunk_finish(method, state, u + c_last, Ms, ds)          # gs[k] = g at step (p+1)C - k
    gs, total = gs.reshape((C, B, S)), total.reshape((B, S))
    dparams, dxr = cell.param_grads(params, spr, xr, sr, gs)
    axes = (seq_axis,) if batch_axis is None else (seq_axis, batch_axis)
    dparams = jax.tree.map(lambda d: lax.psum(d, axes), dparams)
    ds0 = lax.psum(jnp.where(idx == 0, total, jnp.zeros_like(total)), seq_axis) if P > 1 else total
    return dparams, dxr[::-1], ds0, gs[::-1]


def _tangent_body(cell: Cell, method: str, T: int, P: int, seq_axis: str, params: Any, xs: Array, s0: Array,
                  ss: Array, rhs: Array, d0: Array):
    """One device's share of the forward tangent recurrence ṡ_t = J_t ṡ_{t-1} + rhs_t from ṡ_0 =
    d0 (B, S), at the solved states ss (C, B, S): the Newton step's sharded linear solve
    (:func:`chunk_aggregate`, :func:`_fold_gathered`, :func:`chunk_finish`) on the Jacobians
    at ss, block-diagonal where the cell's are. Returns ṡ (C, B, S)."""
    C, B, S = ss.shape
    idx = lax.axis_index(seq_axis)
    valid = (idx * C + jnp.arange(C) < T)[:, None, None]
    sp = _states_before(ss, s0, idx, P, seq_axis)
    E, _, k = newton_lib.step_elements(cell, "newton", params, sp, xs, ss)  # at solved states f(s_{t-1}) = s_t
    c = to_blocks(rhs.astype(E.dtype), k)
    d0 = to_blocks(d0.astype(c.dtype)[None], k)[0]
    return _sharded_solve(method, E, c, d0, valid, seq_axis, P).reshape((C, B, S))


@functools.lru_cache(maxsize=None)
def sharded_functions(cell: Cell, method: str, combine: str, mesh: Mesh, seq_axis: str, batch_axis: str | None, T: int,
                      precision: str = "highest", key: tuple = ()):
    """(forward, backward, run, solved) for one configuration (cached). ``forward`` and
    ``backward`` are the shard_map'ed bodies on padded arrays (T to a multiple of the ``seq_axis``
    size, B of the ``batch_axis`` size): forward (params, xs, s0) -> ss; backward (params, xs, s0,
    ss, ct) -> (dparams, dxs, ds0, gs). ``run(params, xs (T, B, I), s0 (B, S)) -> ss (T, B, S)``
    and ``solved(params, xs, s0, ss) -> ss`` (states a parallel forward solved, differentiated at
    them) take and return unpadded arrays; both are the single-device rule's ``jax.custom_jvp``
    (:func:`bppsa.backward.rule.rule_functions`) on the sharded forward and scans: reverse mode is the sharded
    BPPSA backward, forward mode the sharded tangent recurrence, and Hessian-vector products
    differentiate the rule, all with the backward's matrix products at ``precision``.

    Args:
      cell: the cell (hashable: the cache's key).
      method: the backward's scan, "blelloch", "associative" or "sequential" (BPTT).
      combine: the backward's cross-device step, "logstep", "allgather" or "chain".
      mesh: a ``jax.sharding.Mesh`` with the axis ``seq_axis`` (and ``batch_axis``).
      seq_axis: the mesh axis the time axis is split over.
      batch_axis: the mesh axis the batch is split over, or None (the batch replicated).
      T: the number of steps (unpadded).
      precision: the backward's matrix-product precision ("highest", "high" or "default").
      key: what the cell's functions read besides their operands, by value
        (:func:`bppsa.cells.closure.program_key`): only part of the cache's key.

    Returns:
      The tuple (forward, backward, run, solved) described above.

    Raises:
      ValueError: ``mesh`` is not a ``jax.sharding.Mesh`` or the axis names are not two of its axes.
    """
    P, Pb = check_axes(mesh, seq_axis, batch_axis)
    x_spec = PS(seq_axis, batch_axis, None)
    s_spec = PS(batch_axis, None)
    fwd_sm = shard_map(functools.partial(_forward_body, cell, T, P, seq_axis), mesh,
                       in_specs=(PS(), x_spec, s_spec), out_specs=x_spec)
    bwd_sm = shard_map(functools.partial(_backward_body, cell, method, combine, T, P, seq_axis, batch_axis),
                       mesh, in_specs=(PS(), x_spec, s_spec, x_spec, x_spec),
                       out_specs=(PS(), x_spec, s_spec, x_spec))
    tan_sm = shard_map(functools.partial(_tangent_body, cell, method, T, P, seq_axis), mesh,
                       in_specs=(PS(), x_spec, s_spec, x_spec, x_spec, s_spec), out_specs=x_spec)
    C = -(-T // P)

    def pad(a, batch_axis_of_a, mode="constant"):
        """a's time axis (0, where it has one) to P·C steps and its batch axis to a multiple of Pb
        (:func:`_padded`)."""
        B = a.shape[batch_axis_of_a]
        return _padded(a, {0: P * C, 1: -(-B // Pb) * Pb} if batch_axis_of_a == 1 else {0: -(-B // Pb) * Pb}, mode)

    def forward(params, xs, s0):
        return fwd_sm(params, pad(xs, 1), pad(s0, 0))[:T, :xs.shape[1]]

    def scans(params, xs, s0, ss):
        """The sharded (tangent_scan, adjoint_scan) of :func:`bppsa.backward.rule.tangent_rule` at ss."""
        B = xs.shape[1]
        xs_e, s0_e, ss_e = pad(xs, 1, "edge"), pad(s0, 0, "edge"), pad(ss, 1, "edge")

        def tangent_scan(rhs, d0):
            return tan_sm(params, xs_e, s0_e, ss_e, pad(rhs, 1), pad(d0, 0))[:T, :B]

        def adjoint_scan(c1):
            dparams, dxs, ds0, gs = bwd_sm(params, xs_e, s0_e, ss_e, pad(c1, 1))
            return gs[:T, :B].astype(ss.dtype), *pipeline.cast_to_primals(dparams, dxs[:T, :B], ds0[:B], params, xs, s0)

        return tangent_scan, adjoint_scan

    run, solved = rule.rule_functions(cell, precision, forward, scans)
    return fwd_sm, bwd_sm, run, solved


def _padded(a: Array, sizes: dict[int, int], mode: str = "constant"):
    """``a`` with each axis of ``sizes`` ({axis: length}) padded at its end to that length: zeros
    (inputs, cotangents, tangents), or ``mode="edge"`` repeating the last step and row (the states
    and inputs the Jacobians are taken at: finite, as a real step's). The one padding of the mesh:
    T to P·C steps, the batch to a multiple of the batch axis's size."""
    widths = [(0, sizes.get(axis, n) - n) for axis, n in enumerate(a.shape)]
    return jnp.pad(a, widths, mode=mode) if any(w for _, w in widths) else a


def _newton_body(cell: Cell, plan: Plan, T: int, P: int, seq_axis: str, batch_axis: str | None, params: Any, xs: Array,
                 s0: Array, H: Array):
    """The parallel (Newton-family) forward of one device's stretch: each iteration evaluates its
    C steps, aggregates its linearised maps (:func:`chunk_aggregate`), combines the devices'
    maps (:func:`_fold_gathered`) and finishes its scan (:func:`chunk_finish`); the residual
    is the mesh's maximum, so every device iterates alike. Padded steps are identity maps."""
    C, B, S = H.shape
    idx = lax.axis_index(seq_axis)
    valid = (idx * C + jnp.arange(C) < T)[:, None, None]
    axes = (seq_axis,) if batch_axis is None else (seq_axis, batch_axis)

    def evaluate(H):
        return jnp.where(valid, steps(cell, params, _states_before(H, s0, idx, P, seq_axis), xs), H)

    def update(H, F, lam):
        sp = _states_before(H, s0, idx, P, seq_axis)
        E, c, k = newton_lib.step_elements(cell, plan.forward, params, sp, xs, F)
        s0b = to_blocks(s0.astype(c.dtype), k)
        if lam is not None:  # the trust-region step: one device holds the whole sequence (P = 1)
            return trust_region_solve(s0b, E, c, to_blocks(H, k), lam).reshape((C, B, S))
        return _sharded_solve(plan.scan, E, c, s0b, valid, seq_axis, P).reshape((C, B, S))

    ok = lax.pmin(newton_lib.finite_inputs(xs, s0).astype(jnp.int32), axes) > 0
    k, H, res, err, converged, _ = newton_lib.iterate(plan, H, evaluate, update, inputs_ok=ok, axes=axes,
                                                   offset=idx * C, length=T)
    return H, k, res, err, converged


def sequence_parallel_states(cell: Cell, params: Any, xs: Array, s0: Array, mesh: Mesh, plan: Plan, *,
                             seq_axis: str = "seq", batch_axis: str | None = None, guess: Array | None = None):
    """Flat-state core: xs (T, B, I), s0 (B, S) -> (ss (T, B, S), info), time sharded over
    ``seq_axis``; info is the parallel forward's :class:`bppsa.forward.newton.NewtonInfo` (None for the
    sequential one). Inputs are already validated and ``plan`` made for this mesh
    (:meth:`bppsa.Options.plan` with ``devices`` = the ``seq_axis`` size): it is executed as given.

    Args:
      cell: the cell (after :func:`bppsa.cells.closure.lift`).
      params: its parameter pytree.
      xs: (T, B, I) inputs, time-major.
      s0: (B, S) the flat initial state.
      mesh: a ``jax.sharding.Mesh`` with the axis ``seq_axis`` (and ``batch_axis``).
      plan: the :class:`bppsa.plan.options.Plan` to execute.
      seq_axis: the mesh axis the time axis is split over.
      batch_axis: the mesh axis the batch is split over, or None.
      guess: (T, B, S) the parallel forward's first iterate as flat states, or None (zeros).

    Returns:
      The pair (ss, info): ss (T, B, S) the flat states, ss[t] = s_{t+1}; info the parallel forward's
      :class:`bppsa.forward.newton.NewtonInfo`, or None for the sequential forward.

    Raises:
      bppsa.errors.UsageError: a parallel forward with ``damping`` on more than one device.

      ValueError: ``mesh`` is not a ``jax.sharding.Mesh`` or the axis names are not two of its axes.
    """
    P, Pb = check_axes(mesh, seq_axis, batch_axis)
    if plan.forward != "sequential" and plan.damping is not None and P > 1:
        raise UsageError(f"damping= (the trust-region step) solves the whole sequence on one device; the mesh "
                         f"splits time over {P} devices ({seq_axis!r}): pass damping=None here")
    T, B, S = xs.shape[0], s0.shape[0], s0.shape[-1]
    C = -(-T // P)
    Bp = -(-B // Pb) * Pb
    xs_p, s0_p = _padded(xs, {0: P * C, 1: Bp}), _padded(s0, {0: Bp})
    # the functions are kept per (cell, what its step reads by value: bppsa.cells.closure.program_key);
    # a cell whose step reads arrays that are not its operands gets them made anew (kept, they would
    # keep those arrays' first values)
    key = closure.program_key(cell, params, xs, s0)
    make = sharded_functions.__wrapped__ if key is None else functools.partial(sharded_functions, key=key)
    fwd_sm, _, run, solved = make(cell, plan.adjoint_scan, plan.combine, mesh, seq_axis, batch_axis, T,
                                  plan.precision)
    if plan.differentiation == "autodiff":  # BPTT after the sequential forward: JAX's reverse mode through it
        return fwd_sm(params, xs_p, s0_p)[:T, :B], None
    if plan.forward == "sequential":
        return run(params, xs, s0), None
    x_spec, s_spec = PS(seq_axis, batch_axis, None), PS(batch_axis, None)
    solve_sm = shard_map(functools.partial(_newton_body, cell, plan, T, P, seq_axis, batch_axis), mesh,
                         in_specs=(PS(), x_spec, s_spec, x_spec), out_specs=(x_spec, PS(), PS(), PS(), PS()))
    # a guess's padded steps repeat its last state, as the solve's identity maps make them
    H0 = jnp.zeros((P * C, Bp, S), s0.dtype) if guess is None else \
        _padded(_padded(guess.astype(s0.dtype), {0: P * C}, "edge"), {1: Bp})
    stop = lax.stop_gradient
    with jax.default_matmul_precision(plan.precision):
        H, k, res, err, converged = solve_sm(stop(params), stop(xs_p), stop(s0_p), stop(H0))
    inputs = (stop(params), stop(xs_p), stop(s0_p))
    H, info = newton_lib.finish(cell, plan, k, H, res, err, converged, lambda: fwd_sm(*inputs), inputs)
    return solved(params, xs, s0, H[:T, :B]), info


def rnn(cell: Cell, params: Any, xs: ArrayLike, h0: Any, options: Options | Plan | None = None, *,
        mesh: Mesh | None = None, seq_axis: str = "seq", batch_axis: str | None = None, guess: Any = None,
        return_info: bool = False, **fields: Any) -> Any:
    """:func:`bppsa.rnn` with the time axis split over ``mesh[seq_axis]`` (and the batch over
    ``mesh[batch_axis]``). ``mesh=None`` uses a 1-D mesh over all devices. The backward is chosen
    by ``options`` (a :class:`bppsa.Options`) and/or its fields as keywords, as for
    :func:`bppsa.rnn`; ``combine`` picks the cross-device step ("logstep", "allgather", "chain" or
    "auto"). Each device scans its stretch in one piece, so ``chunk_size`` must be None or "auto".

    Gradients are exact (equal to single-device BPPSA and to autodiff through ``lax.scan``) for
    any T and B.

    ``forward="newton"``/``"quasi"``: the parallel forward (:mod:`bppsa.forward.newton`) sharded the same
    way, each iteration's linear solve split over the devices (aggregate, one ``all_gather`` of
    the devices' maps, finish); ``guess`` and ``return_info`` as for :func:`bppsa.rnn`.

    Args:
      cell: a cell from :mod:`bppsa.cells`.
      params: the cell's parameter pytree (``cell.init(key)``).
      xs: (T, B, I) inputs, time-major.
      h0: (B, H) initial state; for an LSTM the pair (h0, c0), each (B, H).
      options: a :class:`bppsa.Options` (default ``Options()``).
      mesh: a ``jax.sharding.Mesh`` (:func:`bppsa.parallel.make_mesh`); None: a 1-D mesh over all devices.
      seq_axis: the mesh axis the time axis is split over (default "seq").
      batch_axis: the mesh axis the batch is split over; None (default): the batch is not split.
      guess: the parallel forward's first iterate, shaped like the result (None: zeros).
      return_info: also return the parallel forward's :class:`bppsa.forward.newton.NewtonInfo` (None
        for the sequential forward).
      **fields: the fields of :class:`bppsa.Options` as keywords (``combine`` among them), overriding
        ``options``'s.

    Returns:
      hs (T, B, H), hs[t] = h_{t+1}; for an LSTM the pair (hs, cs).
      With ``return_info``: (states, info).

    Raises:
      bppsa.errors.UsageError: as for :func:`bppsa.rnn`; also a ``chunk_size`` other than None or "auto",
      and ``damping`` with the time axis split over more than one device.

      ValueError: ``mesh`` is not a ``jax.sharding.Mesh`` or the axis names are not two of its axes.

    Examples:
      The time axis split over two devices where there are two (on CPU
      ``XLA_FLAGS=--xla_force_host_platform_device_count=2`` makes them), else one:

      >>> import jax, jax.numpy as jnp, bppsa
      >>> cell = bppsa.cells.RNN(input_size=3, hidden_size=4)
      >>> params = cell.init(jax.random.key(0))
      >>> xs, h0 = jnp.ones((10, 2, 3)), jnp.zeros((2, 4))
      >>> mesh = bppsa.parallel.make_mesh(seq=min(2, jax.device_count()), batch_axis=None)
      >>> hs = bppsa.parallel.rnn(cell, params, xs, h0, mesh=mesh)
      >>> hs.shape
      (10, 2, 4)
      >>> bool(jnp.allclose(hs, bppsa.rnn(cell, params, xs, h0), atol=1e-6))
      True
    """
    if mesh is None:
        mesh = make_mesh(batch_axis=None, seq_axis=seq_axis)
    P, _ = check_axes(mesh, seq_axis, batch_axis)
    cell, params, xs, s0, plan, guess = backprop.prologue(cell, params, xs, h0, options, fields, devices=P,
                                                          guess=guess)
    ss, info = sequence_parallel_states(cell, params, xs, s0, mesh, plan, seq_axis=seq_axis, batch_axis=batch_axis,
                                        guess=guess)
    out = cell.unflatten_state(ss)
    return (out, info) if return_info else out


def pmap_rnn(cell: Cell, params: Any, xs: ArrayLike, h0: Any, options: Options | Plan | None = None, *,
             devices: Sequence[Any] | None = None, **fields: Any):
    """pmap-style entry point: the leading axis of ``xs`` is mapped over devices, as with ``jax.pmap``.

    The same code as :func:`rnn` (a 1-D ``shard_map`` mesh over those devices), with the same
    ``options`` and option keywords; differentiable.

    Args:
      cell: a cell from :mod:`bppsa.cells`.
      params: the cell's parameter pytree.
      xs: (P, C, B, I) inputs, chunk p (steps pC+1 … (p+1)C) on ``devices[p]``.
      h0: (B, H) initial state, broadcast to every device; for an LSTM the pair (h0, c0).
      options: a :class:`bppsa.Options` (default ``Options()``).
      devices: the P devices, in chunk order (default: the first P of ``jax.local_devices()``).
      **fields: the fields of :class:`bppsa.Options` as keywords, overriding ``options``'s.

    Returns:
      hs (P, C, B, H); for an LSTM the pair (hs, cs), each (P, C, B, H).

    Raises:
      bppsa.errors.UsageError: ``xs`` is not of rank 4, or the number of devices is not P; otherwise as
      for :func:`rnn`.
    """
    opts = options_lib.make(options, **fields)
    xs = jnp.asarray(xs)
    if xs.ndim != 4:
        raise UsageError(f"xs must have shape (P, C, B, I) (rank 4: devices, chunk, batch, input); "
                         f"got shape {xs.shape}")
    P, C = xs.shape[:2]
    devices = list(jax.local_devices()[:P] if devices is None else devices)
    if len(devices) != P:
        raise UsageError(f"xs has a leading (device) axis of {P}; got {len(devices)} devices "
                         f"(jax.local_device_count() = {jax.local_device_count()})")
    mesh = Mesh(np.array(devices, dtype=object), ("seq",))  # chunk p on devices[p], in the order given
    hs = rnn(cell, params, xs.reshape((P * C,) + xs.shape[2:]), h0, opts, mesh=mesh)
    return jax.tree.map(lambda h: h.reshape((P, C) + h.shape[1:]), hs)
