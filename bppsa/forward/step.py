"""One step of the parallel forward: the linearised recurrence at a guess, solved by a scan.

At the guess's previous states the step's Jacobians make affine maps h'_t = h'_{t-1} @ E_t + c_t
(:func:`step_elements`: elementwise where the Jacobian is diagonal or ``kind="quasi"``,
:func:`step_diagonal`; (k, k) blocks for a block-diagonal cell; dense otherwise), and
:func:`newton_step` solves them with the plan's scan over equal chunks, or with damping by the
trust-region smoother (:mod:`bppsa.forward.elk`). The same operator as the BPPSA backward, run
forwards: :mod:`bppsa.forward.newton` iterates it.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
from jax import Array, lax

from bppsa.cells import Cell
from bppsa.cells.structure import Scaled, block_size, jacobian_blocks, jacobian_diagonal, structure_of
from bppsa.forward.elk import trust_region_solve
from bppsa.forward.sequential import prev_states
from bppsa.plan.options import Forward, Plan
from bppsa.scan import dense as scan_lib
from bppsa.scan.blocks import block_scan
from bppsa.scan.layout import block_rows, equal_chunks, to_blocks

__all__ = ["step_diagonal", "step_elements", "newton_step"]


def step_diagonal(cell: Cell, kind: Forward, params: Any, sp: Array, xs: Array, f: Array) -> Array | None:
    """diag(J_t) (n, B, S) where the Newton-family step is elementwise (``kind="quasi"``, or a cell
    whose Jacobian blocks are 1×1), at the previous states sp with f = f(sp, xs); else None.

    Args:
      cell: the cell.
      kind: the parallel forward, "newton" or "quasi".
      params: the cell's parameters.
      sp: (n, B, S) the flat state before each step.
      xs: (n, B, I) the steps' inputs.
      f: (n, B, S) the steps at sp, f(sp, xs).

    Returns:
      (n, B, S) the Jacobians' diagonals, or None where the step is not elementwise.
    """
    st = structure_of(cell)
    if kind == "quasi" and isinstance(st, Scaled):  # M = diag(A) Wt: diag(M) = A ⊙ diag(Wt), no S×S
        A, Wt = st.factors(params, sp, xs, f)
        return A * jnp.diagonal(Wt)
    if kind == "quasi" or block_size(cell) == 1:
        return jacobian_diagonal(cell, params, sp, xs, f)
    return None


def step_elements(cell: Cell, kind: Forward, params: Any, sp: Array, xs: Array, f: Array,
                  diagonal: Array | None = None) -> tuple[Array, Array, int]:
    """One iteration's affine maps, h'_t = h'_{t-1} @ E_t + c_t, at the guess's previous states sp
    (n, B, S) with f = f(sp, xs), as block rows (:func:`bppsa.scan.layout.to_blocks`): E (n, B·S/k,
    k, k) = J_tᵀ's diagonal blocks (elementwise, k = 1: :func:`step_diagonal`, or ``diagonal`` where
    the caller has it; a block-diagonal cell's (k, k) blocks; else dense, k = S) and c (n, B·S/k,
    k) = f_t − sp_t @ E_t. Returns (E, c, k).

    Args:
      cell: the cell.
      kind: the parallel forward, "newton" or "quasi".
      params: the cell's parameters.
      sp: (n, B, S) the flat state before each step.
      xs: (n, B, I) the steps' inputs.
      f: (n, B, S) the steps at sp, f(sp, xs).
      diagonal: (n, B, S) the Jacobians' diagonals where the caller has them (elementwise steps), or None.

    Returns:
      (E, c, k), E (n, B·S/k, k, k) the maps' matrices, c (n, B·S/k, k) their offsets and k the block size.
    """
    d = step_diagonal(cell, kind, params, sp, xs, f) if diagonal is None else diagonal
    if d is not None:  # elementwise maps: no 1×1 matrix products
        return to_blocks(d, 1)[..., None], to_blocks(f - sp * d, 1), 1
    blocks = jacobian_blocks(cell, params, sp, xs, f)  # dense: one (S, S) block
    k = blocks.shape[-1]
    E = block_rows(jnp.swapaxes(blocks, -1, -2))
    return E, to_blocks(f, k) - scan_lib.vecmat(to_blocks(sp, k), E), k


def newton_step(cell: Cell, plan: Plan, params: Any, xs: Array, s0: Array, H: Array, F: Array,
                lam: Array | None = None, D: Array | None = None) -> Array:
    """One Newton (or quasi) step of :mod:`bppsa.forward.newton`: the states solving the linearised
    recurrence at the guess H (T, B, S) (with F = f at H and, for an elementwise step, D its
    Jacobians' diagonals, :func:`step_diagonal`), by ``plan.scan`` over equal chunks of at most
    ``plan.solve_chunk`` steps, earliest first. ``plan.kernels`` "pallas" or "interpret": a
    diagonal cell's whole step by :func:`bppsa.kernels.newton.fused_newton_step` (the steps and
    their Jacobians evaluated inside the scan's kernels; F and D unused), any other cell's solve by
    the fused chunked scan (:func:`bppsa.kernels.scan.chunked_scan`). With ``lam`` (damping) the
    trust-region step around H, over the whole sequence (XLA's kernels).

    Args:
      cell: the cell.
      plan: the :class:`bppsa.plan.options.Plan` (``forward``, ``scan``, ``solve_chunk``).
      params: the cell's parameters.
      xs: (T, B, I) inputs.
      s0: (B, S) the flat initial state.
      H: (T, B, S) the guess.
      F: (T, B, S) the steps at H, f(h_{t-1}, x_t).
      lam: the damping λ (a scalar), or None (the undamped step).
      D: (T, B, S) the Jacobians' diagonals at H for an elementwise step, or None.

    Returns:
      (T, B, S) the next iterate.
    """
    T, B, S = H.shape
    chunk, method = plan.solve_chunk, plan.scan
    fused = plan.fused
    if fused is not None and lam is None:
        whole = fused.newton_step(cell, params, xs, s0, H)  # a diagonal cell: the steps, Jacobians and scan fused
        if whole is not None:
            return whole
    if D is not None and lam is None and method == "sequential" and (chunk is None or chunk >= T) and fused is None:
        # elementwise, one piece: h'_t = D_t (h'_{t-1} − h_{t-1}) + f_t, the guess's states read in
        # the loop (no offsets c_t or previous states written out first)
        def step(carry, e):
            h_new, h_old = carry
            h = e[0] * (h_new - h_old) + e[1]
            return (h, e[2]), h

        return lax.scan(step, (s0, s0), (D, F, H))[1]
    sp = prev_states(s0, H)
    k = 1 if plan.forward == "quasi" else (block_size(cell) or S)
    if lam is not None:
        E, c, _ = step_elements(cell, plan.forward, params, sp, xs, F, D)
        return trust_region_solve(to_blocks(s0, k), E, c, to_blocks(H, k), lam).reshape(H.shape)

    def piece(h_in, sp_c, x_c, f_c, d_c):
        if fused is not None:  # the fused chunked scan (bppsa.kernels.scan): three launches whatever the length
            E, c, _ = step_elements(cell, plan.forward, params, sp_c, x_c, f_c, d_c)
            prefixes, total = fused.scan(to_blocks(h_in, k), E, c)
        elif method == "blelloch" and k > 1:  # the elements made in the scan's storage order, as
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
