"""The BPPSA backward pipeline behind :func:`bppsa.rnn` (private: :mod:`bppsa.backprop` is the API).

Reverse mode: from the saved forward states, generate every step's transposed Jacobian at once
(parallel over T), solve the gradient recurrence g_{t-1} = g_t @ M_t + c_{t-1} with a scan from
:mod:`bppsa._scan` in Θ(log T) levels, then turn all g_t into parameter and input gradients with
one batched contraction (:meth:`bppsa.cells.Cell.param_grads`): :func:`adjoint`, chunked.

Forward mode too. :func:`bppsa_states` is a ``jax.custom_jvp`` (defined once, here; the cell and
the method options static) whose tangent rule is one linear solve, ``lax.custom_linear_solve``,
of the block system K (ṡ, w) = (0, u), u = (dparams, dxs, ds0) the input tangents:

    K = [[A, −R], [0, I]],   (A ṡ)_t = ṡ_t − J_t ṡ_{t-1},   R u = the steps' JVP w.r.t. params, x_t (and s0),

so ṡ = A⁻¹ R u is the states' tangent. ``solve`` (K⁻¹) is the forward tangent scan
(:func:`tangent_states`); ``transpose_solve`` (K⁻ᵀ: y1 = A⁻ᵀ c1, y2 = c2 + Rᵀ y1) is exactly the
BPPSA backward, the adjoint scan *and* the cell's analytic ``param_grads``, so ``jax.grad`` (JAX
transposing the rule) runs the same program as the former ``custom_vjp``: equal gradients bit
for bit, equal XLA temporaries, compiled programs differing by a few bitcasts, step times equal
within noise (experiments/history/forward-mode.md). Putting R inside K rather than in the
right-hand side keeps the analytic gradients: with b = R u, JAX transposes the step's JVP itself,
which measured slower and with more XLA temporaries (the same file).
Hessian-vector products and ``jacfwd`` differentiate K's ``matvec`` (a rematerialised JVP of the
step); JAX cannot ``jvp`` a ``custom_vjp``, hence the ``custom_jvp``. The sequence-parallel scan
(:mod:`bppsa.parallel.sequence`) runs the same rule (:func:`tangent_rule`) with its two solves
sharded; it and the benchmark's component breakdown reuse the pieces, and so does the parallel
forward (:mod:`bppsa.newton`): its Newton step is the same kind of linear recurrence, run
forwards, on :func:`step_elements` (:func:`newton_step`).

Every setting (the scan, the chunk length, the precision, the unroll) arrives concrete, from the
:class:`bppsa.options.Plan` the entry point made: nothing is decided here.
"""

from __future__ import annotations

import functools
import itertools
from typing import Any, cast

import jax
import jax.numpy as jnp
from jax import Array, lax

from bppsa import _scan as scan_lib
from bppsa.cells import Cell
from bppsa.cells.adjoint import factor_states, sequential_adjoint
from bppsa.options import Forward, Plan, unroll_for
from bppsa.scan import block_scan, trust_region_solve

__all__ = ["step_elements", "step_diagonal", "forward_states", "bppsa_states", "solved_states", "adjoint", "to_blocks",
           "block_rows", "steps", "prev_states", "tangent_states", "scan_order", "root_and_offsets",
           "storage_inputs", "stored_jacobians", "stored_scan", "chunked_backward", "equal_chunks", "newton_step",
           "tangent_rule"]


def forward_states(cell: Cell, params: Any, xs: Array, s0: Array, unroll: int | bool | None = None,
                   hoist: bool = True) -> Array:
    """Flat-state forward: s0 (B, S), xs (T, B, I) -> ss (T, B, S), one ``lax.scan``; BPTT of a cell
    without an analytic adjoint is its autodiff. ``hoist``: the input's part of every step
    (:meth:`bppsa.cells.Cell.project`) is computed for all steps before the loop (one large
    product); False: inside each step, as a
    plain ``lax.scan`` of ``cell.step`` does (BPTT's plan decides: :attr:`bppsa.options.Plan.hoist`).
    ``unroll``: the scan's unroll factor (the entry points pass their plan's int); None (default,
    for direct callers) the tuned one for this shape and backend (:func:`bppsa.options.unroll_for`);
    1 is the plain ``lax.scan``."""
    if unroll is None:
        unroll = unroll_for(cell, xs.shape[0], xs.shape[1], xs.dtype, state_size=s0.shape[-1])
    step, lp = cell.step_projected if hoist else cell.step, cell.loop_params(params)

    def body(s, u):
        s_new = cell.flatten_state(step(lp, cell.unflatten_state(s), u))
        return s_new, s_new

    _, ss = lax.scan(body, s0, cell.project(params, xs) if hoist else xs, unroll=unroll)
    return ss


def storage_inputs(spr: Array, xr: Array, sr: Array, ds: Array) -> tuple[Array, ...]:
    """The backward's scan-order (n, ...) inputs in the Blelloch scan's storage order: padding
    steps get copies of a real step (finite Jacobians; the scan replaces them by the identity)
    and zero offsets. Returns (spr, xr, sr, ds) with N rows (:func:`bppsa.scan.bottom_layout`)."""
    n = xr.shape[0]
    return (*(scan_lib.to_storage(a, n, pad="edge") for a in (spr, xr, sr)), scan_lib.to_storage(ds, n))


def stored_jacobians(cell: Cell, params: Any, spr: Array, xr: Array, sr: Array) -> Array | tuple[Array, Array]:
    """The Jacobians of storage-order steps for the Blelloch scan: the cell's diagonal structure
    ``(A, Wt)`` where it has one (:meth:`bppsa.cells.Cell.diagonal_jacobian`), else the
    (N, B, S, S) matrices."""
    if cell.has_diagonal_jacobian:
        return cell.diagonal_jacobian(params, spr, xr, sr)
    return cell.transposed_jacobian(params, spr, xr, sr)


def stored_scan(v: Array, jacobians: Array | tuple[Array, Array], ds: Array, n: int) -> tuple[Array, Array]:
    """The storage-order Blelloch scan of :func:`stored_jacobians`' output (ds zero-padded, as
    :func:`storage_inputs` makes it). Returns (prefixes in scan order, total)."""
    if isinstance(jacobians, tuple):
        A, Wt = jacobians
        return scan_lib.blelloch_scan_stored_diag(v, A, Wt, ds, n)
    return scan_lib.blelloch_scan_stored(v, jacobians, ds, n, zero_padded_offsets=True)


def _scan_gradients(cell, scan_method, params, xr, sr, spr, ds, v):
    """Generate the Jacobians of one stretch of steps (scan order) and scan them from root v.

    Returns (gs, total): gs[k] the gradient w.r.t. the state of element k, total the gradient
    the stretch's first step sends to the state before it. For the Blelloch scan the Jacobians
    are generated directly in the scan's storage order (:func:`bppsa.scan.to_storage` of the
    (n, B, S) state vectors, never of the (n, B, S, S) matrices), and for a cell with diagonal
    structure (the RNN) not at all: only its (A, Wt) factors (:func:`stored_jacobians`).
    """
    if cell.jacobian_block_size is not None:
        return _scan_blocks(cell, scan_method, params, xr, sr, spr, ds, v)
    if scan_method == "blelloch":
        n = xr.shape[0]
        spr_p, xr_p, sr_p, ds_p = storage_inputs(spr, xr, sr, ds)
        return stored_scan(v, stored_jacobians(cell, params, spr_p, xr_p, sr_p), ds_p, n)
    Ms = cell.transposed_jacobian(params, spr, xr, sr)
    return scan_lib.scan(v, Ms, ds, scan_method)


def to_blocks(a: Array, k: int) -> Array:
    """(..., B, S) -> (..., B·S/k, k): a block-diagonal map's blocks become batch rows."""
    return a.reshape(a.shape[:-2] + (a.shape[-2] * (a.shape[-1] // k), k))


def block_rows(blocks: Array) -> Array:
    """(..., B, S/k, k, k) Jacobian blocks -> (..., B·S/k, k, k), the scans' batch of matrices."""
    return blocks.reshape(blocks.shape[:-4] + (-1,) + blocks.shape[-2:])


def _scan_blocks(cell, scan_method, params, xr, sr, spr, ds, v):
    """:func:`_scan_gradients` for a block-diagonal Jacobian (:attr:`bppsa.cells.Cell.jacobian_block_size`
    k): each of the S/k blocks of each batch row is an independent (k, k) chain, so the scans run
    on B·S/k rows of k-vectors (k = 1: elementwise), never on S×S matrices."""
    k, (n, B, S) = cell.jacobian_block_size, sr.shape
    if scan_method == "blelloch" and k > 1:
        spr, xr, sr, ds = storage_inputs(spr, xr, sr, ds)
        Ms = block_rows(cell.jacobian_blocks(params, spr, xr, sr))
        gs, total = scan_lib.blelloch_scan_stored(to_blocks(v, k), Ms, to_blocks(ds, k), n, zero_padded_offsets=True)
    else:  # k = 1: elementwise (bppsa.scan.diagonal_scan)
        Ms = block_rows(cell.jacobian_blocks(params, spr, xr, sr))
        gs, total = block_scan(to_blocks(v, k), Ms, to_blocks(ds, k), scan_method)
    return gs.reshape((n, B, S)), total.reshape((B, S))


def chunked_backward(cell: Cell, scan_method: str, chunk_size: int, params: Any, xr: Array, sr: Array, spr: Array,
                     ctr: Array) -> tuple[Any, Array, Array, Array]:
    """BPPSA backward over equal chunks of at most ``chunk_size`` steps, latest chunk first (scan order).

    Each chunk generates only its own Jacobians (C, B, S, S), scans them with the gradient
    flowing in from the later chunks added to its root vector, and passes the scan's total
    (the gradient its first step sends to the previous state) on as the next chunk's carry.
    Peak memory is O(C·B·S²) instead of O(T·B·S²); the result is exact.

    All chunks have one length, C = ⌈T / ⌈T / chunk_size⌉⌉, so one chunk program is compiled (a
    shorter tail chunk would be a second scan of another shape, compiled again). The P = n·C − T
    < n missing steps are put in front, after the last step in time: copies of the last step's
    inputs and states with zero cotangent. Their gradients are exactly zero (no loss depends on a
    step after the last; zero times the last step's own, finite, Jacobian), so the real steps'
    gradients, and the parameter gradients summed over steps, are those of the unpadded sequence.

    xr (T, B, I), sr, spr, ctr (T, B, S) are in scan order (:func:`scan_order`). Returns
    (dparams, dxr (T, B, I) in scan order, g0 (B, S) the gradient w.r.t. the initial state,
    gsr (T, B, S) the gradients w.r.t. the states, scan order).
    """
    T = xr.shape[0]
    n_chunks, C = equal_chunks(T, chunk_size)
    P = n_chunks * C - T
    if P:
        front = lambda a: jnp.concatenate([jnp.broadcast_to(a[:1], (P,) + a.shape[1:]), a], axis=0)
        xr, sr, spr = front(xr), front(sr), front(spr)
        ctr = jnp.concatenate([jnp.zeros((P,) + ctr.shape[1:], ctr.dtype), ctr], axis=0)

    def body(carry, c):
        u, acc = carry
        xr_c, sr_c, spr_c, ctr_c = c
        v, ds = root_and_offsets(ctr_c)
        gs, total = _scan_gradients(cell, scan_method, params, xr_c, sr_c, spr_c, ds, v + u)
        dp, dx = cell.param_grads(params, spr_c, xr_c, sr_c, gs)
        return (total, jax.tree.map(jnp.add, acc, dp)), (dx, gs)

    split = lambda a: a.reshape((n_chunks, C) + a.shape[1:])
    init = (jnp.zeros_like(ctr[0]), jax.tree.map(jnp.zeros_like, params))
    (u, acc), outs = jax.lax.scan(body, init, tuple(split(a) for a in (xr, sr, spr, ctr)))
    dxr, gsr = (a.reshape((n_chunks * C,) + a.shape[2:])[P:] for a in outs)
    return acc, dxr, u, gsr


def equal_chunks(T: int, chunk_size: int) -> tuple[int, int]:
    """(n, C): the fewest chunks of at most ``chunk_size`` steps covering T, n of one length C =
    ⌈T / n⌉ (n·C − T < n steps of padding), so a chunked loop compiles one chunk program."""
    n = -(-T // chunk_size)
    return n, -(-T // n)


def scan_order(xs: Array, ss: Array, s0: Array, ct: Array) -> tuple[Array, Array, Array, Array]:
    """Time order -> scan order (latest step first), as every BPPSA backward needs it.

    xs (T, B, I), ss (T, B, S) the states after each step, s0 (B, S) the state before the first,
    ct (T, B, S) the cotangents of ss. Returns (xr, sr, spr, ctr), each reversed along time:
    element k is step T - k, ``spr[k]`` the state before it (``sr[k + 1]``, and s0 last).
    """
    spr = jnp.concatenate([ss[-2::-1], s0[None]], axis=0) if ss.shape[0] > 1 else s0[None]
    return xs[::-1], ss[::-1], spr, ct[::-1].astype(ss.dtype)


def root_and_offsets(ctr: Array) -> tuple[Array, Array]:
    """The scan's root vector v = ctr[0] (B, S) and offsets ds (n, B, S): element k adds ctr[k + 1]
    (the last element, the first step, adds nothing: the loss on s0 is not the cell's)."""
    return ctr[0], jnp.concatenate([ctr[1:], jnp.zeros_like(ctr[:1])], axis=0)


def _cast_grads(dparams, dxr, g0, params, xs, s0):
    dparams = jax.tree.map(lambda d, p: d.astype(p.dtype), dparams, params)
    return dparams, dxr[::-1].astype(xs.dtype), g0.astype(s0.dtype)


def adjoint(cell: Cell, scan_method: str, chunk_size: int | None, params: Any, xs: Array, s0: Array, ss: Array,
            ct: Array) -> tuple[Array, Any, Array, Array]:
    """The BPPSA backward: the adjoint states g_t = ∂L/∂s_t of the cotangent ct (T, B, S) of ss,
    by the gradient recurrence g_{t-1} = g_t @ M_t + ct_{t-1} with ``scan_method`` over chunks of
    ``chunk_size`` steps (an int; None: one chunk), and the cell's analytic parameter and input
    gradients.

    Returns (gs (T, B, S) time order, dparams, dxs (T, B, I), g0 (B, S) = ∂L/∂s0)."""
    xr, sr, spr, ctr = scan_order(xs, ss, s0, ct)
    if chunk_size is not None and chunk_size < ss.shape[0]:
        dparams, dxr, g0, gsr = chunked_backward(cell, scan_method, chunk_size, params, xr, sr, spr, ctr)
    else:
        v, ds = root_and_offsets(ctr)
        gsr, g0 = _scan_gradients(cell, scan_method, params, xr, sr, spr, ds, v)  # gsr[k] = g_{T-k}
        dparams, dxr = cell.param_grads(params, spr, xr, sr, gsr)
    return (gsr[::-1].astype(ss.dtype), *_cast_grads(dparams, dxr, g0, params, xs, s0))


def _flat_step(cell, params, s, x):
    """One step on the flat state: s (B, S), x (B, I) -> (B, S)."""
    return cell.flatten_state(cell.step(params, cell.unflatten_state(s), x))


def steps(cell: Cell, params: Any, spr: Array, xs: Array) -> Array:
    """Every step at once (parallel over T): spr, xs (T, B, ·) -> (T, B, S)."""
    return jax.vmap(functools.partial(_flat_step, cell), in_axes=(None, 0, 0))(params, spr, xs)


def prev_states(s0: Array, ss: Array) -> Array:
    """The state before each step: s0 (B, S), ss (T, B, S) -> (T, B, S)."""
    return jnp.concatenate([s0[None], ss[:-1]], axis=0)


def tangent_states(cell: Cell, params: Any, xs: Array, s0: Array, ss: Array, rhs: Array, d0: Array) -> Array:
    """The forward tangent scan: ṡ_t = J_t ṡ_{t-1} + rhs_t from ṡ_0 = d0 (B, S), one
    ``lax.scan`` of Jacobian-vector products of the step at the saved states; rhs (T, B, S)."""

    def body(d, inp):
        sp, x, r = inp
        d = jax.jvp(lambda s: _flat_step(cell, params, s, x), (sp,), (d,))[1] + r
        return d, d

    return lax.scan(body, d0, (prev_states(s0, ss), xs, rhs))[1]


@functools.partial(jax.checkpoint, static_argnums=(0,))
def _block_matvec(cell, params, xs, s0, ss, z1, wp, wx, w0):
    """K (z1, w) = (A z1 − R w, w), see :func:`bppsa_states`. Rematerialised: the transpose that
    ``custom_linear_solve`` derives from it keeps (params, xs, s0, ss), not per-step values."""
    zprev = jnp.concatenate([w0[None], z1[:-1]], axis=0)
    jv = jax.jvp(functools.partial(steps, cell), (params, prev_states(s0, ss), xs), (wp, zprev, wx))[1]
    return z1 - jv, wp, wx, w0


def _packer(ss, params, xs, s0):
    """(pack, unpack) between (z1 like ss, w = (params-like, xs-like, s0-like)) and one flat vector:
    ``custom_linear_solve`` transposes only when every leaf of its right-hand side is linear in
    the tangents, and one vector is, whichever tangents are zeros."""
    p_leaves, treedef = jax.tree.flatten(params)
    like = [ss, *p_leaves, xs, s0]
    dtype = jnp.result_type(*like)
    sizes = [a.size for a in like]

    def pack(z1, wp, wx, w0):
        return jnp.concatenate([jnp.ravel(a).astype(dtype) for a in (z1, *jax.tree.leaves(wp), wx, w0)])

    def unpack(vec):
        parts = jnp.split(vec, list(itertools.accumulate(sizes))[:-1])
        z1, *wp, wx, w0 = (p.reshape(a.shape).astype(a.dtype) for p, a in zip(parts, like))
        return z1, jax.tree.unflatten(treedef, wp), wx, w0

    return pack, unpack


@functools.partial(jax.custom_jvp, nondiff_argnums=(0, 1, 2, 6, 7, 8))
def bppsa_states(cell: Cell, scan_method: str, chunk_size: int | None, params: Any, xs: Array, s0: Array,
                 precision: str = "highest", unroll: int | bool | None = None, hoist: bool = True) -> Array:
    """Flat-state forward (:func:`forward_states`: xs (T, B, I), s0 (B, S) -> ss (T, B, S)) whose
    reverse mode is the BPPSA backward (:func:`adjoint`) with ``scan_method`` over chunks of
    ``chunk_size`` steps (an int, or None: one chunk),
    every matrix product of it at ``precision`` (a name from :data:`PRECISIONS`), and whose
    forward mode is the tangent scan (:func:`tangent_states`). ``cell``, ``scan_method``,
    ``chunk_size``, ``precision`` and ``unroll`` (the forward scan's, :func:`forward_states`) are
    static (hashable); inputs are not validated (see :func:`rnn`). ``scan_method`` "adjoint" or
    "adjoint_in_loop": BPTT by the cell's analytic adjoint (:func:`sequential_adjoint`, the
    parameter gradients after its loop or in it), the forward keeping the steps' factors."""
    return forward_states(cell, params, xs, s0, unroll, hoist)


@bppsa_states.defjvp
def _bppsa_jvp(cell, scan_method, chunk_size, precision, unroll, hoist, primals, tangents):
    params, xs, s0 = primals
    if not scan_method.startswith("adjoint"):
        ss = forward_states(cell, params, xs, s0, unroll, hoist)
        return ss, _tangent(cell, scan_method, chunk_size, precision, params, xs, s0, ss, tangents)
    if unroll is None:
        unroll = unroll_for(cell, xs.shape[0], xs.shape[1], xs.dtype, state_size=s0.shape[-1])
    ss, factors = factor_states(cell, params, xs, s0, unroll, hoist)  # the adjoint reads the steps' factors
    return ss, _tangent(cell, scan_method, chunk_size, precision, params, xs, s0, ss, tangents, (factors, unroll))


@functools.partial(jax.custom_jvp, nondiff_argnums=(0, 1, 2, 7))
def solved_states(cell: Cell, scan_method: str, chunk_size: int | None, params: Any, xs: Array, s0: Array, ss: Array,
                  precision: str = "highest") -> Array:
    """:func:`bppsa_states` for states ``ss`` (T, B, S) already solved by another forward (the
    parallel Newton forward, :mod:`bppsa.newton`): returns ``ss`` itself, differentiated as the
    solution of the recurrence at those states, the same linear solve at the same Jacobians
    (reverse mode: the BPPSA backward). ``ss`` must carry no gradient of its own (computed from
    ``lax.stop_gradient``-ed inputs): its tangent is not used."""
    return ss


@solved_states.defjvp
def _solved_jvp(cell, scan_method, chunk_size, precision, primals, tangents):
    params, xs, s0, ss = primals
    # ss again through solved_states: differentiated once more (HVPs, grad of grad), the states'
    # dependence on (params, xs, s0) is the implicit function's, not the stop_gradient's zero
    ss = solved_states(cell, scan_method, chunk_size, params, xs, s0, ss, precision)
    return ss, _tangent(cell, scan_method, chunk_size, precision, params, xs, s0, ss, tangents[:3])


def _tangent(cell, scan_method, chunk_size, precision, params, xs, s0, ss, tangents, adjoint_inputs=(None, 1)):
    """The states' tangent at the solved states ss, one ``lax.custom_linear_solve`` (see the module
    docstring): solve = the forward tangent scan, transpose_solve = the BPPSA backward."""
    def tangent_scan(rhs, d0):
        return tangent_states(cell, params, xs, s0, ss, rhs, d0)

    def adjoint_scan(c1):
        if scan_method.startswith("adjoint"):
            return sequential_adjoint(cell, params, xs, s0, ss, c1, *adjoint_inputs,
                                      in_loop=scan_method == "adjoint_in_loop")
        return adjoint(cell, scan_method, chunk_size, params, xs, s0, ss, c1)

    return tangent_rule(cell, precision, params, xs, s0, ss, tangents, tangent_scan, adjoint_scan)


def tangent_rule(cell: Cell, precision: str, params: Any, xs: Array, s0: Array, ss: Array, tangents: Any,
                 tangent_scan: Any, adjoint_scan: Any) -> Array:
    """The tangent of the states ss (T, B, S) solved from (params, xs (T, B, I), s0 (B, S)), for the
    input ``tangents`` (dparams, dxs, ds0): one ``lax.custom_linear_solve`` of the block system of
    the module docstring, whose two solves are given: ``tangent_scan(rhs (T, B, S), d0 (B, S))`` the
    forward tangent recurrence ṡ_t = J_t ṡ_{t-1} + rhs_t from ṡ_0 = d0, and ``adjoint_scan(c1 (T,
    B, S))`` the backward, returning (gs, dparams, dxs, g0). One device passes its scans
    (:func:`tangent_states`, :func:`adjoint`); a mesh its sharded ones (:mod:`bppsa.parallel.sequence`),
    so both have reverse mode, forward mode and Hessian-vector products from the same rule."""
    pack, unpack = _packer(ss, params, xs, s0)

    def matvec(z):
        return pack(*_block_matvec(cell, params, xs, s0, ss, *unpack(z)))

    def solve(_, b):  # K⁻¹: the tangent scan; the right-hand sides of all steps at once
        b1, bp, bx, b0 = unpack(b)
        rhs = jax.jvp(lambda p, x: steps(cell, p, prev_states(s0, ss), x), (params, xs), (bp, bx))[1]
        return pack(tangent_scan(rhs + b1, b0), bp, bx, b0)

    def transpose_solve(_, c):  # K⁻ᵀ: the BPPSA scan and the cell's analytic gradients
        c1, cp, cx, c0 = unpack(c)
        gs, dp, dx, g0 = adjoint_scan(c1)
        return pack(gs, jax.tree.map(jnp.add, cp, dp), cx + dx, c0 + g0)

    dp, dxs, ds0 = tangents
    b = pack(jnp.zeros_like(ss), dp, dxs, ds0)
    with jax.default_matmul_precision(precision):  # every dot traced in the rule carries it
        z = lax.custom_linear_solve(matvec, b, solve, transpose_solve)
    return unpack(z)[0]


def step_diagonal(cell: Cell, kind: Forward, params: Any, sp: Array, xs: Array, f: Array) -> Array | None:
    """diag(J_t) (n, B, S) where the Newton-family step is elementwise (``kind="quasi"``, or a cell
    whose Jacobian blocks are 1×1), at the previous states sp with f = f(sp, xs); else None."""
    if kind == "quasi" and cell.has_diagonal_jacobian:  # M = diag(A) Wt: diag(M) = A ⊙ diag(Wt), no S×S
        A, Wt = cell.diagonal_jacobian(params, sp, xs, f)
        return A * jnp.diagonal(Wt)
    if kind == "quasi" or cell.jacobian_block_size == 1:
        return cell.jacobian_diagonal(params, sp, xs, f)
    return None


def step_elements(cell: Cell, kind: Forward, params: Any, sp: Array, xs: Array, f: Array,
                  diagonal: Array | None = None) -> tuple[Array, Array, int]:
    """One iteration's affine maps, h'_t = h'_{t-1} @ E_t + c_t, at the guess's previous states sp
    (n, B, S) with f = f(sp, xs), as block rows (:func:`bppsa._backward.to_blocks`): E (n, B·S/k,
    k, k) = J_tᵀ's diagonal blocks (elementwise, k = 1: :func:`step_diagonal`, or ``diagonal`` where
    the caller has it; a block-diagonal cell's (k, k) blocks; else dense, k = S) and c (n, B·S/k,
    k) = f_t − sp_t @ E_t. Returns (E, c, k)."""
    d = step_diagonal(cell, kind, params, sp, xs, f) if diagonal is None else diagonal
    if d is not None:  # elementwise maps: no 1×1 matrix products
        return to_blocks(d, 1)[..., None], to_blocks(f - sp * d, 1), 1
    if cell.jacobian_block_size is not None:
        blocks = cell.jacobian_blocks(params, sp, xs, f)
    else:
        blocks = cell.transposed_jacobian(params, sp, xs, f)[..., None, :, :]
    k = blocks.shape[-1]
    E = block_rows(jnp.swapaxes(blocks, -1, -2))
    return E, to_blocks(f, k) - scan_lib.vecmat(to_blocks(sp, k), E), k


def newton_step(cell: Cell, plan: Plan, params: Any, xs: Array, s0: Array, H: Array, F: Array,
                lam: Array | None = None, D: Array | None = None) -> Array:
    """One Newton (or quasi) step of :mod:`bppsa.newton`: the states solving the linearised
    recurrence at the guess H (T, B, S) (with F = f at H and, for an elementwise step, D its
    Jacobians' diagonals, :func:`step_diagonal`), by ``plan.scan`` over equal chunks of at most
    ``plan.solve_chunk`` steps, earliest first; with ``lam`` (damping) the trust-region step around
    H, over the whole sequence."""
    T, B, S = H.shape
    chunk, method = plan.solve_chunk, cast(str, plan.scan)  # a Plan's scan is always named
    if D is not None and lam is None and method == "sequential" and (chunk is None or chunk >= T):
        # elementwise, one piece: h'_t = D_t (h'_{t-1} − h_{t-1}) + f_t, the guess's states read in
        # the loop (no offsets c_t or previous states written out first)
        def step(carry, e):
            h_new, h_old = carry
            h = e[0] * (h_new - h_old) + e[1]
            return (h, e[2]), h

        return lax.scan(step, (s0, s0), (D, F, H))[1]
    sp = prev_states(s0, H)
    k = 1 if plan.forward == "quasi" else (cell.jacobian_block_size or S)
    if lam is not None:
        E, c, _ = step_elements(cell, plan.forward, params, sp, xs, F, D)
        return trust_region_solve(to_blocks(s0, k), E, c, to_blocks(H, k), lam).reshape(H.shape)

    def piece(h_in, sp_c, x_c, f_c, d_c):
        if method == "blelloch" and k > 1:  # the elements made in the scan's storage order, as
            n = sp_c.shape[0]  # the backward makes them: only the (n, B, S) vectors are permuted
            sp_s, x_s, f_s = (scan_lib.to_storage(a, n, pad="edge") for a in (sp_c, x_c, f_c))
            E, c, _ = step_elements(cell, plan.forward, params, sp_s, x_s, f_s)
            prefixes, total = scan_lib.blelloch_scan_stored(to_blocks(h_in, k), E, c, n)
        else:
            E, c, _ = step_elements(cell, plan.forward, params, sp_c, x_c, f_c, d_c)
            prefixes, total = block_scan(to_blocks(h_in, k), E, c, method)
        states = jnp.concatenate([prefixes[1:], total[None]], axis=0)
        return total.reshape((B, S)), states.reshape(sp_c.shape)

    if chunk is None or chunk >= T:
        return piece(s0, sp, xs, F, D)[1]
    # equal chunks (one program compiled, no shorter tail chunk): the P < n missing steps are
    # copies of the last step, after it; no real state depends on them and theirs are dropped
    n, C = equal_chunks(T, chunk)
    split = lambda a: jnp.concatenate([a, jnp.broadcast_to(a[-1:], (n * C - T,) + a.shape[1:])]).reshape(
        (n, C) + a.shape[1:])
    _, out = lax.scan(lambda h, c: piece(h, *c), s0, tuple(None if a is None else split(a) for a in (sp, xs, F, D)))
    return out.reshape((n * C, B, S))[:T]
