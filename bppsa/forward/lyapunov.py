r"""The largest Lyapunov exponent (LLE) of a recurrence along its trajectory, from the step Jacobians:

.. math::

    \lambda_{\max} = \lim_{T \to \infty} \frac{1}{T} \log \|J_T \cdots J_1 v\|, \qquad
    J_t = \frac{\partial h_t}{\partial h_{t-1}} \text{ at } (h_{t-1}, x_t).

λ_max < 0: the recurrence forgets its initial state (predictable; Newton's error contracts, and the
parallel forward converges in few iterations); λ_max > 0: perturbations grow like e^{λ T}, the
problem is ill-conditioned exponentially in T, and the sequential forward is the right choice.

Computed in two levels so that no loop runs T dependent steps: the sequence is cut into chunks of
about √T steps; each chunk's product J_b ⋯ J_a is formed with a normalisation after every step
(its log scale kept apart), all chunks at once (side by side in one batch axis); then one vector
runs through the chunks' products, normalised after each. The log scales and norms sum to
log ‖J_T ⋯ J_1 v‖ exactly (up to rounding), whatever the magnitudes. Cells with block-diagonal
Jacobians (heads of size k; k = 1: diagonal) give one exponent per block, and the largest is
returned: the Jacobians are never formed as S×S arrays there.
"""

from __future__ import annotations

import math
from typing import Any

import jax.numpy as jnp
from jax import Array, lax

from bppsa.cells import Cell
from bppsa.cells.structure import jacobian_blocks
from bppsa.errors import UsageError, as_int
from bppsa.forward.inputs import flat_guess, validate_inputs
from bppsa.forward.sequential import forward_states, prev_states

__all__ = ["lyapunov", "lyapunov_from_jacobians"]


def lyapunov_from_jacobians(blocks: Array, chunk: int | None = None) -> Array:
    """The largest Lyapunov exponent of each independent product in ``blocks`` (T, R, k, k), the
    Jacobians J_t of R systems (batch rows, or blocks of a block-diagonal Jacobian): (R,), the
    average log growth per step of J_T ⋯ J_1 v from v = (1, …, 1)/√k. ``chunk``: the steps per
    chunk (None: ⌈√T⌉).

    Args:
      blocks: (T, R, k, k) the Jacobians J_t, R independent systems of size k.
      chunk: the steps per chunk (None: ⌈√T⌉).

    Returns:
      (R,) the exponents, in nats per step (-inf where the product annihilates v).

    Raises:
      bppsa.errors.UsageError: T = 0.
    """
    T, R, k = blocks.shape[0], blocks.shape[1], blocks.shape[-1]
    if T == 0:
        raise UsageError("a Lyapunov exponent needs at least one step; got T = 0")
    if k == 1:  # scalar products: the mean log growth, log|J_t| summed (-inf where a J_t is 0)
        return jnp.sum(jnp.log(jnp.abs(blocks[:, :, 0, 0])), axis=0) / T
    L = max(1, math.isqrt(T - 1) + 1) if chunk is None else min(chunk, T)
    # n chunks; their products are formed side by side, in one batch axis of n·R (a dot with two
    # batch axes runs 1.4-2.4x slower on CPU)
    n = -(-T // L)
    eye = jnp.eye(k, dtype=blocks.dtype)
    pad = jnp.broadcast_to(eye, (n * L - T, R, k, k))  # identity steps change nothing
    J = jnp.concatenate([blocks, pad], axis=0).reshape((n, L, R, k, k)).swapaxes(0, 1).reshape((L, n * R, k, k))

    def step(carry, Jt):  # one step of every chunk: (n·R, k, k) normalised, (n·R,) their log scales
        P, logs = carry
        P = jnp.matmul(Jt, P)
        s = jnp.sqrt(jnp.sum(P * P, axis=(-2, -1)))
        s = jnp.where(s > 0, s, 1)
        return (P / s[:, None, None], logs + jnp.log(s)), None

    init = (jnp.broadcast_to(eye, (n * R, k, k)), jnp.zeros((n * R,), blocks.dtype))
    (Ps, logs), _ = lax.scan(step, init, J)
    Ps, logs = Ps.reshape((n, R, k, k)), logs.reshape((n, R))

    def through(carry, chunk_):
        v, total = carry
        P, log_scale = chunk_
        v = jnp.einsum("rij,rj->ri", P, v)
        nv = jnp.sqrt(jnp.sum(v * v, axis=-1))
        dead = nv == 0  # the product annihilated v: growth -inf
        nv = jnp.where(dead, 1, nv)
        return (v / nv[:, None], jnp.where(dead, -jnp.inf, total + jnp.log(nv) + log_scale)), None

    v0 = jnp.full((R, k), 1 / math.sqrt(k), blocks.dtype)
    (_, total), _ = lax.scan(through, (v0, jnp.zeros((R,), blocks.dtype)), (Ps, logs))
    return total / T


def lyapunov(cell: Cell, params: Any, xs: Any, h0: Any, states: Any = None, *, chunk: int | None = None) -> Array:
    """The largest Lyapunov exponent of ``cell`` along its trajectory from h0 over xs (T, B, I),
    per sequence: (B,), in nats per step. ``states``: the trajectory (the states
    :func:`bppsa.rnn` returns, (T, B, H) or the cell's state structure), None: the sequential
    forward's. ``chunk``: steps per chunk (None: ⌈√T⌉).

    Negative: the recurrence contracts along this trajectory (predictable; the parallel forward
    pays); positive: it is chaotic there (the sequential forward is the right choice).

    Args:
      cell: a cell from :mod:`bppsa.cells`.
      params: the cell's parameter pytree.
      xs: (T, B, I) inputs, time-major.
      h0: (B, H) initial state; for an LSTM the pair (h0, c0), each (B, H).
      states: the trajectory, shaped like :func:`bppsa.rnn`'s result (hs (T, B, H); for an LSTM the
        pair (hs, cs)), or None (the sequential forward's).
      chunk: the steps per chunk (None: ⌈√T⌉).

    Returns:
      (B,) the largest exponent of each sequence, in nats per step.

    Raises:
      bppsa.errors.UsageError: inputs :func:`bppsa.forward.inputs.validate_inputs` refuses, ``states`` of
      the wrong shape, or ``chunk`` not a positive int.

    Examples:
      Small recurrent weights contract (a negative exponent), large ones need not:

      >>> import jax, jax.numpy as jnp, bppsa
      >>> cell = bppsa.cells.RNN(input_size=3, hidden_size=8)
      >>> params = cell.init(jax.random.key(0))
      >>> xs, h0 = jax.random.normal(jax.random.key(1), (64, 2, 3)), jnp.zeros((2, 8))
      >>> small = dict(params, W_h=0.1 * params["W_h"])
      >>> lle = bppsa.lyapunov(cell, small, xs, h0)
      >>> lle.shape, bool(jnp.all(lle < 0))
      ((2,), True)
      >>> large = dict(params, W_h=jax.random.normal(jax.random.key(2), (8, 8)))
      >>> bool(jnp.all(bppsa.lyapunov(cell, large, xs, h0) > bppsa.lyapunov(cell, small, xs, h0)))
      True
    """
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
    blocks = jacobian_blocks(cell, params, prev_states(s0, ss), xs, ss)  # (T, B, S/k, k, k)
    k = blocks.shape[-1]
    per_block = lyapunov_from_jacobians(blocks.reshape((T, B * (S // k), k, k)), chunk)
    return jnp.max(per_block.reshape((B, S // k)), axis=1)
