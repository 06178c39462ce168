"""The BPPSA backward pipeline: the gradient recurrence of a chain solved by a scan, chunked.

From the saved forward states, :func:`adjoint` generates every step's transposed Jacobian at once
(parallel over T), solves the gradient recurrence g_{t-1} = g_t @ M_t + c_{t-1} with a scan from
:mod:`bppsa.scan` in Θ(log T) levels (dense, or the Block cells' diagonal and (k, k) block
scans), then turns all g_t into parameter and input gradients with one batched contraction
(:meth:`bppsa.cells.Cell.param_grads`). Over chunks of ``chunk_size`` steps
(:func:`chunked_backward`) only one chunk's Jacobians are in memory at a time; the chunks run
latest first, each one's root the adjoint its successor left. With the Blelloch scan the elements
are made directly in the scan's storage order (:func:`storage_inputs`, :func:`stored_jacobians`,
:func:`stored_scan`). :func:`scan_order` and :func:`root_and_offsets` give a mesh's shards the same
pieces (:mod:`bppsa.parallel.sequence`).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax import Array

from bppsa.cells import Cell
from bppsa.cells.structure import Blocks, Factored, Scaled, structure_of
from bppsa.plan.backends import Fused
from bppsa.scan import dense as scan_lib
from bppsa.scan.blocks import block_scan
from bppsa.scan.layout import block_rows, equal_chunks, to_blocks

__all__ = ["adjoint", "cast_to_primals", "chunked_backward", "fused_scan_gradients",
           "scan_order", "root_and_offsets", "storage_inputs", "stored_jacobians",
           "stored_scan"]


def storage_inputs(spr: Array, xr: Array, sr: Array, ds: Array) -> tuple[Array, ...]:
    """The backward's scan-order (n, ...) inputs in the Blelloch scan's storage order: padding
    steps get copies of a real step (finite Jacobians; the scan replaces them by the identity)
    and zero offsets. Returns (spr, xr, sr, ds) with N rows (:func:`bppsa.scan.dense.bottom_layout`).

    Args:
      spr: (n, B, S) the state before each step, scan order.
      xr: (n, B, I) the steps' inputs, scan order.
      sr: (n, B, S) the state after each step, scan order.
      ds: (n, B, S) the scan's offsets.

    Returns:
      (spr, xr, sr, ds) in storage order, (N, B, S), (N, B, I), (N, B, S) and (N, B, S).
    """
    n = xr.shape[0]
    return (*(scan_lib.to_storage(a, n, pad="edge") for a in (spr, xr, sr)), scan_lib.to_storage(ds, n))


def stored_jacobians(cell: Cell, params: Any, spr: Array, xr: Array, sr: Array) -> Array | tuple[Array, Array]:
    """The Jacobians of storage-order steps for the Blelloch scan: the factors ``(A, Wt)`` of a
    :class:`bppsa.cells.Scaled` cell (M_t = diag(A_t) Wt), else the (N, B, S, S) matrices.

    Args:
      cell: the cell.
      params: the cell's parameters.
      spr: (N, B, S) the state before each step, storage order.
      xr: (N, B, I) the steps' inputs, storage order.
      sr: (N, B, S) the state after each step, storage order.

    Returns:
      (A (N, B, S), Wt (S, S)) for a :class:`bppsa.cells.Scaled` cell, else Ms (N, B, S, S).
    """
    match structure_of(cell):
        case Scaled(factors):
            return factors(params, spr, xr, sr)
        case _:
            return cell.transposed_jacobian(params, spr, xr, sr)


def stored_scan(v: Array, jacobians: Array | tuple[Array, Array], ds: Array, n: int) -> tuple[Array, Array]:
    """The storage-order Blelloch scan of :func:`stored_jacobians`' output (ds zero-padded, as
    :func:`storage_inputs` makes it). Returns (prefixes in scan order, total).

    Args:
      v: (B, S) the root vector.
      jacobians: what :func:`stored_jacobians` returns, (A, Wt) or (N, B, S, S).
      ds: (N, B, S) the offsets in storage order, zero on the padding rows.
      n: the number of real steps.

    Returns:
      (prefixes, total), prefixes (n, B, S) in scan order and total (B, S).
    """
    if isinstance(jacobians, tuple):
        A, Wt = jacobians
        return scan_lib.blelloch_scan_stored_diag(v, A, Wt, ds, n)
    return scan_lib.blelloch_scan_stored(v, jacobians, ds, n, zero_padded_offsets=True)


def _scan_gradients(cell, scan_method, params, xr, sr, spr, ds, v, fused=None):
    """Generate the Jacobians of one stretch of steps (scan order) and scan them from root v.

    Returns (gs, total): gs[k] the gradient w.r.t. the state of element k, total the gradient
    the stretch's first step sends to the state before it. For the Blelloch scan the Jacobians
    are generated directly in the scan's storage order (:func:`bppsa.scan.to_storage` of the
    (n, B, S) state vectors, never of the (n, B, S, S) matrices), and for a cell with diagonal
    structure (:class:`bppsa.cells.Scaled`, the RNN) not at all: only its (A, Wt) factors
    (:func:`stored_jacobians`). With
    ``fused`` (the plan's kernels, :attr:`bppsa.plan.Plan.fused`) the scan is the fused one
    (:func:`fused_scan_gradients`).
    """
    if fused is not None:
        return fused_scan_gradients(cell, params, xr, sr, spr, ds, v, fused)
    if isinstance(st := structure_of(cell), Blocks):
        return _scan_blocks(st, scan_method, params, xr, sr, spr, ds, v)
    if scan_method == "blelloch":
        n = xr.shape[0]
        spr_p, xr_p, sr_p, ds_p = storage_inputs(spr, xr, sr, ds)
        return stored_scan(v, stored_jacobians(cell, params, spr_p, xr_p, sr_p), ds_p, n)
    Ms = cell.transposed_jacobian(params, spr, xr, sr)
    return scan_lib.scan(v, Ms, ds, scan_method)



def fused_scan_gradients(cell: Cell, params: Any, xr: Array, sr: Array, spr: Array, ds: Array, v: Array,
                         fused: Fused) -> tuple[Array, Array]:
    """The backward's scan by the fused kernels (:mod:`bppsa.kernels.scan`), in scan order: a
    block-diagonal cell's (k, k) blocks as rows (:class:`bppsa.cells.Blocks`); a cell with factored
    Jacobians (:class:`bppsa.cells.Factored`: the GRU, LSTM; :class:`bppsa.cells.Scaled` as one factor: the
    RNN) their factors, the matrices formed inside the kernels; else the dense (n, B, S, S) Jacobians.

    Args:
      cell: the cell (its blocks, or its state, of at most :data:`bppsa.kernels.scan.MAX_BLOCK`).
      params: the cell's parameters.
      xr: (n, B, I) the steps' inputs, scan order.
      sr: (n, B, S) the state after each step, scan order.
      spr: (n, B, S) the state before each step, scan order.
      ds: (n, B, S) the scan's offsets.
      v: (B, S) the root vector.
      fused: the plan's kernels (:attr:`bppsa.plan.Plan.fused`).

    Returns:
      (gs, total), gs (n, B, S) the gradients w.r.t. each element's state and total (B, S).
    """
    n, B, S = sr.shape
    match structure_of(cell):
        case Blocks(k, blocks):
            Ms = block_rows(blocks(params, spr, xr, sr))
            gs, total = fused.scan(to_blocks(v, k), Ms, to_blocks(ds, k))
            return gs.reshape((n, B, S)), total.reshape((B, S))
        case Factored(factors):  # formed inside the kernels, never written out
            A, Wt = factors(params, spr, xr, sr)
            return fused.scan_factored(v, A, Wt, ds)
        case Scaled(factors):  # one factor
            A, Wt = factors(params, spr, xr, sr)
            return fused.scan_factored(v, A[None], Wt[None], ds)
        case _:
            return fused.scan(v, cell.transposed_jacobian(params, spr, xr, sr), ds)


def _scan_blocks(st, scan_method, params, xr, sr, spr, ds, v):
    """:func:`_scan_gradients` for a block-diagonal Jacobian (``st``, a :class:`bppsa.cells.Blocks` of k):
    each of the S/k blocks of each batch row is an independent (k, k) chain, so the scans run
    on B·S/k rows of k-vectors (k = 1: elementwise), never on S×S matrices."""
    k, (n, B, S) = st.size, sr.shape
    if scan_method == "blelloch" and k > 1:
        spr, xr, sr, ds = storage_inputs(spr, xr, sr, ds)
        Ms = block_rows(st.blocks(params, spr, xr, sr))
        gs, total = scan_lib.blelloch_scan_stored(to_blocks(v, k), Ms, to_blocks(ds, k), n, zero_padded_offsets=True)
    else:  # k = 1: elementwise (bppsa.scan.diagonal_scan)
        Ms = block_rows(st.blocks(params, spr, xr, sr))
        gs, total = block_scan(to_blocks(v, k), Ms, to_blocks(ds, k), scan_method)
    return gs.reshape((n, B, S)), total.reshape((B, S))


def chunked_backward(cell: Cell, scan_method: str, chunk_size: int, params: Any, xr: Array, sr: Array, spr: Array,
                     ctr: Array, fused: Fused | None = None) -> tuple[Any, Array, Array, Array]:
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

    Args:
      cell: the cell.
      scan_method: "blelloch", "associative" or "sequential".
      chunk_size: the most steps a chunk may have.
      params: the cell's parameters.
      xr: (T, B, I) the inputs, scan order.
      sr: (T, B, S) the state after each step, scan order.
      spr: (T, B, S) the state before each step, scan order.
      ctr: (T, B, S) the cotangents of the states, scan order.
      fused: the plan's kernels (:attr:`bppsa.plan.Plan.fused`): each chunk's scan by them; None: XLA's.

    Returns:
      (dparams, dxr, g0, gsr), as above.
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
        gs, total = _scan_gradients(cell, scan_method, params, xr_c, sr_c, spr_c, ds, v + u, fused)
        dp, dx = cell.param_grads(params, spr_c, xr_c, sr_c, gs)
        return (total, jax.tree.map(jnp.add, acc, dp)), (dx, gs)

    split = lambda a: a.reshape((n_chunks, C) + a.shape[1:])
    init = (jnp.zeros_like(ctr[0]), jax.tree.map(jnp.zeros_like, params))
    (u, acc), outs = jax.lax.scan(body, init, tuple(split(a) for a in (xr, sr, spr, ctr)))
    dxr, gsr = (a.reshape((n_chunks * C,) + a.shape[2:])[P:] for a in outs)
    return acc, dxr, u, gsr




def scan_order(xs: Array, ss: Array, s0: Array, ct: Array) -> tuple[Array, Array, Array, Array]:
    """Time order -> scan order (latest step first), as every BPPSA backward needs it.

    xs (T, B, I), ss (T, B, S) the states after each step, s0 (B, S) the state before the first,
    ct (T, B, S) the cotangents of ss. Returns (xr, sr, spr, ctr), each reversed along time:
    element k is step T - k, ``spr[k]`` the state before it (``sr[k + 1]``, and s0 last).

    Args:
      xs: (T, B, I) inputs.
      ss: (T, B, S) the states after each step.
      s0: (B, S) the state before the first step.
      ct: (T, B, S) the cotangents of ss.

    Returns:
      (xr, sr, spr, ctr), (T, B, I) and three (T, B, S), ctr in the states' dtype.
    """
    spr = jnp.concatenate([ss[-2::-1], s0[None]], axis=0) if ss.shape[0] > 1 else s0[None]
    return xs[::-1], ss[::-1], spr, ct[::-1].astype(ss.dtype)


def root_and_offsets(ctr: Array) -> tuple[Array, Array]:
    """The scan's root vector v = ctr[0] (B, S) and offsets ds (n, B, S): element k adds ctr[k + 1]
    (the last element, the first step, adds nothing: the loss on s0 is not the cell's).

    Args:
      ctr: (n, B, S) the cotangents of the states, scan order.

    Returns:
      (v, ds), v (B, S) and ds (n, B, S).
    """
    return ctr[0], jnp.concatenate([ctr[1:], jnp.zeros_like(ctr[:1])], axis=0)


def cast_to_primals(dparams: Any, dxs: Array, g0: Array, params: Any, xs: Array,
                    s0: Array) -> tuple[Any, Array, Array]:
    """A backward's gradients in their primals' dtypes (the one cast every backward ends with: its
    products may run wider, e.g. float32 parameters with float64 states).

    Args:
      dparams: the parameters' gradients, like ``params``.
      dxs: (T, B, I) the inputs' gradients.
      g0: (B, S) the initial state's gradient.
      params: the cell's parameters.
      xs: (T, B, I) the inputs.
      s0: (B, S) the flat initial state.

    Returns:
      (dparams, dxs, g0) in the dtypes of (params, xs, s0).
    """
    dparams = jax.tree.map(lambda d, p: d.astype(p.dtype), dparams, params)
    return dparams, dxs.astype(xs.dtype), g0.astype(s0.dtype)


def adjoint(cell: Cell, scan_method: str, chunk_size: int | None, params: Any, xs: Array, s0: Array, ss: Array,
            ct: Array, fused: Fused | None = None) -> tuple[Array, Any, Array, Array]:
    """The BPPSA backward: the adjoint states g_t = ∂L/∂s_t of the cotangent ct (T, B, S) of ss,
    by the gradient recurrence g_{t-1} = g_t @ M_t + ct_{t-1} with ``scan_method`` over chunks of
    ``chunk_size`` steps (an int; None: one chunk), and the cell's analytic parameter and input
    gradients.

    Args:
      cell: the cell.
      scan_method: "blelloch", "associative" or "sequential".
      chunk_size: the most steps a chunk may have, or None (one chunk).
      params: the cell's parameters.
      xs: (T, B, I) inputs.
      s0: (B, S) the flat initial state.
      ss: (T, B, S) the states after each step.
      ct: (T, B, S) the cotangents of ss.
      fused: None (``scan_method``, XLA's), or the plan's kernels (:attr:`bppsa.plan.Plan.fused`): the
        scan by them (:func:`fused_scan_gradients`; ``scan_method`` unused).

    Returns:
      (gs, dparams, dxs, g0), gs (T, B, S) the adjoint states in time order, dparams like ``params``,
      dxs (T, B, I) and g0 (B, S) = ∂L/∂s0, each in its primal's dtype.
    """
    xr, sr, spr, ctr = scan_order(xs, ss, s0, ct)
    if chunk_size is not None and chunk_size < ss.shape[0]:
        dparams, dxr, g0, gsr = chunked_backward(cell, scan_method, chunk_size, params, xr, sr, spr, ctr, fused)
    else:
        v, ds = root_and_offsets(ctr)
        gsr, g0 = _scan_gradients(cell, scan_method, params, xr, sr, spr, ds, v, fused)  # gsr[k] = g_{T-k}
        dparams, dxr = cell.param_grads(params, spr, xr, sr, gsr)
    return (gsr[::-1].astype(ss.dtype), *cast_to_primals(dparams, dxr[::-1], g0, params, xs, s0))
