"""The largest Lyapunov exponent (LLE) of a recurrence along its trajectory, from the step Jacobians.

    λ_max = lim (1/T) log ‖J_T ⋯ J_1 v‖,   J_t = ∂h_t/∂h_{t-1} at (h_{t-1}, x_t).

λ_max < 0: the recurrence forgets its initial state (predictable; Newton's error contracts, and the
parallel forward converges in few iterations); λ_max > 0: perturbations grow like e^{λ T}, the
problem is ill-conditioned exponentially in T, and the sequential forward is the right choice.

Computed in two levels so that no loop runs T dependent steps: the sequence is cut into chunks of
about √T steps; each chunk's product J_b ⋯ J_a is formed with a normalisation after every step
(its log scale kept apart), all chunks at once (vmapped); then one vector runs through the chunks'
products, normalised after each. The log scales and norms sum to log ‖J_T ⋯ J_1 v‖ exactly (up to
rounding), whatever the magnitudes. Cells with block-diagonal Jacobians (heads of size k;
k = 1: diagonal) give one exponent per block, and the largest is returned: the Jacobians are never
formed as S×S arrays there.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
from jax import Array, lax

from bppsa._backward import forward_states, prev_states
from bppsa.backprop import flat_guess, validate_inputs
from bppsa.cells import Cell
from bppsa.errors import UsageError, as_int
from bppsa.scan import lyapunov_from_jacobians

__all__ = ["lyapunov"]


def lyapunov(cell: Cell, params: Any, xs: Any, h0: Any, states: Any = None, *, chunk: int | None = None) -> Array:
    """The largest Lyapunov exponent of ``cell`` along its trajectory from h0 over xs (T, B, I),
    per sequence: (B,), in nats per step. ``states``: the trajectory (the states
    :func:`bppsa.rnn` returns, (T, B, H) or the cell's state structure), None: the sequential
    forward's. ``chunk``: steps per chunk (None: ⌈√T⌉).

    Negative: the recurrence contracts along this trajectory (predictable; the parallel forward
    pays); positive: it is chaotic there (the sequential forward is the right choice)."""
    xs = jnp.asarray(xs)
    s0 = validate_inputs(cell, params, xs, h0)
    if chunk is not None and ((c := as_int(chunk)) is None or c < 1):
        raise UsageError(f"chunk must be a positive int or None; got {chunk!r}")
    T, B, S = xs.shape[0], s0.shape[0], s0.shape[-1]  # T >= 1: validate_inputs
    if states is None:
        ss = forward_states(cell, params, xs, s0)
    else:
        ss = flat_guess(cell, states, T, s0, name="states")
    ss = lax.stop_gradient(ss.astype(s0.dtype))
    blocks = cell.jacobian_blocks(params, prev_states(s0, ss), xs, ss)  # (T, B, S/k, k, k)
    k = blocks.shape[-1]
    per_block = lyapunov_from_jacobians(blocks.reshape((T, B * (S // k), k, k)), chunk)
    return jnp.max(per_block.reshape((B, S // k)), axis=1)
