"""The sequential forward and the per-step pieces every other pass is made of.

- :func:`forward_states`: the chain h_t = f(h_{t-1}, x_t) as one ``lax.scan`` on the flat state
  (BPTT's forward, the fallback of the parallel forward, the reference of every test);
- :func:`steps`: every step at once, parallel over T, at given previous states (the Newton
  iteration's f_t, the tangent rule's JVPs);
- :func:`flat_step`, :func:`prev_states`: one step on the flat state; the state before each step.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
from jax import Array, lax

from bppsa.cells import Cell
from bppsa.plan.options import Plan, unroll_for

__all__ = ["forward_states", "planned_states", "flat_step", "steps", "prev_states"]


def forward_states(cell: Cell, params: Any, xs: Array, s0: Array, unroll: int | bool | None = None,
                   hoist: bool = True) -> Array:
    """Flat-state forward: s0 (B, S), xs (T, B, I) -> ss (T, B, S), one ``lax.scan``; BPTT of a cell
    without an analytic adjoint is its autodiff. ``hoist``: the input's part of every step
    (:meth:`bppsa.cells.Cell.project`) is computed for all steps before the loop (one large
    product); False: inside each step, as a
    plain ``lax.scan`` of ``cell.step`` does (BPTT's plan decides: :attr:`bppsa.plan.options.Plan.hoist`).
    ``unroll``: the scan's unroll factor (the entry points pass their plan's int); None (default,
    for direct callers) the tuned one for this shape and backend (:func:`bppsa.plan.options.unroll_for`);
    1 is the plain ``lax.scan``.

    Args:
      cell: the cell.
      params: the cell's parameters.
      xs: (T, B, I) inputs, time-major.
      s0: (B, S) the flat initial state.
      unroll: the scan's unroll: an int, a bool as ``lax.scan`` takes it, or None (tuned).
      hoist: compute the inputs' part of all steps before the loop.

    Returns:
      ss (T, B, S), the flat states after each step (ss[t] = s_{t+1}).
    """
    if unroll is None:
        unroll = unroll_for(cell, xs.shape[0], xs.shape[1], xs.dtype, state_size=s0.shape[-1])
    step, lp = cell.step_projected if hoist else cell.step, cell.loop_params(params)

    def body(s, u):
        s_new = cell.flatten_state(step(lp, cell.unflatten_state(s), u))
        return s_new, s_new

    _, ss = lax.scan(body, s0, cell.project(params, xs) if hoist else xs, unroll=unroll)
    return ss



def planned_states(cell: Cell, plan: Plan, params: Any, xs: Array, s0: Array) -> Array:
    """The sequential forward as ``plan`` runs it: :func:`forward_states` with ``plan.unroll`` and
    ``plan.hoist``, or the plan's fused kernel (:attr:`bppsa.plan.Plan.fused`: :func:`bppsa.kernels.fused_states`,
    compiled or interpreted).

    Args:
      cell: the cell.
      plan: the resolved :class:`bppsa.plan.Plan`.
      params: the cell's parameters.
      xs: (T, B, I) inputs.
      s0: (B, S) the flat initial state.

    Returns:
      ss (T, B, S), the flat states after each step.
    """
    fused = plan.fused
    if fused is None:
        return forward_states(cell, params, xs, s0, plan.unroll, plan.hoist)
    return fused.states(cell, params, xs, s0)


def flat_step(cell: Cell, params: Any, s: Array, x: Array) -> Array:
    """One step on the flat state: s (B, S), x (B, I) -> (B, S).

    Args:
      cell: the cell.
      params: the cell's parameters.
      s: (B, S) the flat state before the step.
      x: (B, I) the step's input.

    Returns:
      (B, S) the flat state after the step.
    """
    return cell.flatten_state(cell.step(params, cell.unflatten_state(s), x))


def steps(cell: Cell, params: Any, spr: Array, xs: Array) -> Array:
    """Every step at once (parallel over T): spr, xs (T, B, ·) -> (T, B, S).

    Args:
      cell: the cell.
      params: the cell's parameters.
      spr: (T, B, S) the flat state before each step (:func:`prev_states`).
      xs: (T, B, I) the steps' inputs.

    Returns:
      (T, B, S) each step's flat state, f(spr[t], xs[t]).
    """
    return jax.vmap(functools.partial(flat_step, cell), in_axes=(None, 0, 0))(params, spr, xs)


def prev_states(s0: Array, ss: Array) -> Array:
    """The state before each step: s0 (B, S), ss (T, B, S) -> (T, B, S).

    Args:
      s0: (B, S) the initial state.
      ss: (T, B, S) the states after each step.

    Returns:
      (T, B, S), s0 followed by ``ss[:-1]``.
    """
    return jnp.concatenate([s0[None], ss[:-1]], axis=0)


