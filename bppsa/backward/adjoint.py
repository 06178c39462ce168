"""BPTT by a cell's analytic adjoint (cells with ``has_adjoint``: the methods of
:class:`bppsa.cells.AnalyticAdjoint`), what ``backward="bptt"`` runs for them.

The forward keeps, beside the states, the per-unit factors of each step's Jacobian
(:func:`factor_states`); the backward is one loop from the last step, g_{t-1} = (g_t + ct_t) M_t,
where M_t is never formed: one product with W_hᵀ and a few elementwise ones a step
(:func:`sequential_adjoint`). Autodiff's BPTT through ``lax.scan`` runs the same recurrence, but its
loop also sums every parameter's gradient step by step and stores whatever its tracing kept; here
the parameter gradients are either one product each after the loop (cuDNN's split of the backward
into data and weights) or summed in it, whichever the plan chose (:func:`bppsa.plan.rules.adjoint_in_loop`).
:mod:`bppsa.backward.rule` wraps both into its ``custom_jvp`` (forward mode, Hessian-vector products)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax import Array, lax

from bppsa.backward.pipeline import cast_to_primals
from bppsa.cells.base import Cell, analytic_adjoint
from bppsa.forward.sequential import prev_states
from bppsa.plan.backends import Fused

__all__ = ["factor_states", "sequential_adjoint", "fused_sequential_adjoint"]


def factor_states(cell: Cell, params: Any, xs: Array, s0: Array, unroll: int | bool = 1, hoist: bool = True
                  ) -> tuple[Array, Any]:
    """The sequential forward (xs (T, B, I), s0 (B, S) -> ss (T, B, S)) and each step's
    :meth:`bppsa.cells.AnalyticAdjoint.step_factors` (T, B, ...): one ``lax.scan``. ``hoist``: the input's part
    of every step computed before the loop (one product), else inside each step.

    Args:
      cell: a cell with ``has_adjoint``.
      params: the cell's parameters.
      xs: (T, B, I) inputs.
      s0: (B, S) the flat initial state.
      unroll: the ``lax.scan`` unroll.
      hoist: compute the inputs' part of all steps before the loop.

    Returns:
      (ss, factors), ss (T, B, S) the flat states and factors each step's factors (leading axis T).

    Raises:
      bppsa.errors.UsageError: the cell lacks the methods of :class:`bppsa.cells.AnalyticAdjoint`.
    """
    lp, adj = cell.loop_params(params), analytic_adjoint(cell)

    def body(s, u):
        new, f = adj.step_factors(lp, cell.unflatten_state(s), u if hoist else cell.project(params, u))
        return cell.flatten_state(new), (cell.flatten_state(new), f)

    return lax.scan(body, s0, cell.project(params, xs) if hoist else xs, unroll=unroll)[1]


def sequential_adjoint(cell: Cell, params: Any, xs: Array, s0: Array, ss: Array, ct: Array, factors: Any,
                       unroll: int | bool = 1, in_loop: bool = False) -> tuple[Array, Any, Array, Array]:
    """BPTT by the cell's analytic adjoint (cells with ``has_adjoint``): one loop over the steps from
    the last, g_{t-1} = (g_t + ct_t) M_t by :meth:`bppsa.cells.AnalyticAdjoint.adjoint_step` on the forward's
    ``factors`` (no Jacobian formed; one product with W_hᵀ a step). The parameter gradients
    (:meth:`bppsa.cells.AnalyticAdjoint.adjoint_grads`): after the loop, one product each over all steps from
    the cotangents it wrote out; ``in_loop``: summed step by step in the loop, as autodiff's BPTT
    does (nothing (T, B, G·H) written and read back: :func:`bppsa.plan.rules.adjoint_in_loop` decides),
    from the inputs :meth:`bppsa.cells.AnalyticAdjoint.adjoint_sum_inputs` arranged before it.
    Returns what :func:`bppsa.backward.pipeline.adjoint` does.

    Args:
      cell: a cell with ``has_adjoint``.
      params: the cell's parameters.
      xs: (T, B, I) inputs.
      s0: (B, S) the flat initial state.
      ss: (T, B, S) the states after each step.
      ct: (T, B, S) the cotangents of ss.
      factors: the forward's step factors (:func:`factor_states`).
      unroll: the ``lax.scan`` unroll.
      in_loop: sum the parameter gradients in the loop.

    Returns:
      (gs, dparams, dxs, g0), gs (T, B, S) = ∂L/∂s_t, dparams like ``params``, dxs (T, B, I) and
      g0 (B, S) = ∂L/∂s0; dparams, dxs and g0 in their primals' dtypes.

    Raises:
      bppsa.errors.UsageError: the cell lacks the methods of :class:`bppsa.cells.AnalyticAdjoint`.
    """
    lp, adj = cell.loop_params(params), analytic_adjoint(cell)
    previous = prev_states(s0, ss)
    ct = ct.astype(ss.dtype)

    def step(inp, g):  # -> (∂L/∂s_t, its part of ∂L/∂s_{t-1}, the step's cotangents)
        g = g + inp[0]
        return (g, *adj.adjoint_step(lp, inp[1], g))

    if not in_loop:
        def written(g, inp):
            g, g_prev, cotangents = step(inp, g)
            return g_prev, (g, cotangents)

        g0, (gs, cotangents) = lax.scan(written, jnp.zeros_like(s0), (ct, factors), reverse=True, unroll=unroll)
        dparams, dxs = adj.adjoint_grads(params, previous, xs, factors, gs, cotangents)
    else:
        def part(inp, g):  # -> (g_t, g_{t-1}, (this step's part of the sums, its input's cotangent))
            g, g_prev, cotangents = step(inp, g)  # inp[2]: this step's adjoint_sum_inputs
            return g, g_prev, adj.adjoint_sum_step(lp, inp[2], inp[1], g, cotangents)

        def summed(carry, inp):
            g, g_prev, (sums, dx) = part(inp, carry[0])
            return (g_prev, jax.tree.map(jnp.add, carry[1], sums)), (g, dx)

        inputs = (ct, factors, adj.adjoint_sum_inputs(params, previous, xs))
        shapes = jax.eval_shape(part, jax.tree.map(lambda a: a[0], inputs), s0)[2][0]
        sums0 = jax.tree.map(lambda a: jnp.zeros(a.shape, a.dtype), shapes)
        (g0, sums), (gs, dxs) = lax.scan(summed, (jnp.zeros_like(s0), sums0), inputs, reverse=True, unroll=unroll)
        dparams = adj.adjoint_sum_result(params, sums)
    return gs, *cast_to_primals(dparams, dxs, g0, params, xs, s0)


def fused_sequential_adjoint(cell: Cell, params: Any, xs: Array, s0: Array, ss: Array, ct: Array,
                             fused: Fused) -> tuple[Array, Any, Array, Array]:
    """BPTT with the adjoint loop as one fused kernel (:func:`bppsa.kernels.adjoint.fused_adjoint`:
    the gates recomputed from the saved states, no step factors kept by the forward), then the
    parameter and input gradients as one batched contraction over all steps
    (:meth:`bppsa.cells.Cell.param_grads`). Returns what :func:`sequential_adjoint` does.

    Args:
      cell: a cell the fused kernels run (:func:`bppsa.kernels.supports`).
      params: the cell's parameters.
      xs: (T, B, I) inputs.
      s0: (B, S) the flat initial state.
      ss: (T, B, S) the states after each step.
      ct: (T, B, S) the cotangents of ss.
      fused: the plan's kernels (:attr:`bppsa.plan.Plan.fused`).

    Returns:
      (gs, dparams, dxs, g0), as :func:`sequential_adjoint`.
    """
    gs, g0 = fused.adjoint(cell, params, xs, s0, ss, ct)
    previous = prev_states(s0, ss)
    dparams, dxs = cell.param_grads(params, previous.astype(ss.dtype), xs, ss, gs)
    return gs, *cast_to_primals(dparams, dxs, g0, params, xs, s0)
