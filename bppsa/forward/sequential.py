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
from bppsa.plan.options import unroll_for

__all__ = ["forward_states", "flat_step", "steps", "prev_states"]


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



def flat_step(cell: Cell, params: Any, s: Array, x: Array) -> Array:
    """One step on the flat state: s (B, S), x (B, I) -> (B, S)."""
    return cell.flatten_state(cell.step(params, cell.unflatten_state(s), x))


def steps(cell: Cell, params: Any, spr: Array, xs: Array) -> Array:
    """Every step at once (parallel over T): spr, xs (T, B, ·) -> (T, B, S)."""
    return jax.vmap(functools.partial(flat_step, cell), in_axes=(None, 0, 0))(params, spr, xs)


def prev_states(s0: Array, ss: Array) -> Array:
    """The state before each step: s0 (B, S), ss (T, B, S) -> (T, B, S)."""
    return jnp.concatenate([s0[None], ss[:-1]], axis=0)


