r"""The one differentiation rule of the BPPSA forward: reverse mode, forward mode and Hessian-vector
products from one ``jax.custom_jvp``, for one device and for a mesh.

:func:`bppsa_states` is a ``jax.custom_jvp`` (the cell and the method options static) whose tangent
rule is one linear solve, ``lax.custom_linear_solve``, of the block system K (ṡ, w) = (0, u),
u = (dparams, dxs, ds0) the input tangents:

.. math::

    K = \begin{bmatrix} A & -R \\ 0 & I \end{bmatrix}, \qquad
    (A \dot s)_t = \dot s_t - J_t \dot s_{t-1}, \qquad
    R u = \text{the steps' JVP w.r.t. params, } x_t \text{ (and } s_0\text{)},

so ṡ = A⁻¹ R u is the states' tangent. ``solve`` (K⁻¹) is the forward tangent scan
(:func:`tangent_states`); ``transpose_solve`` (K⁻ᵀ: y1 = A⁻ᵀ c1, y2 = c2 + Rᵀ y1) is exactly the
BPPSA backward (:func:`bppsa.backward.pipeline.adjoint`: the adjoint scan *and* the cell's analytic
``param_grads``), so ``jax.grad`` (JAX transposing the rule) runs the same program as a
``custom_vjp`` would: equal gradients bit for bit, equal XLA temporaries, step times equal within
noise (docs/architecture.md links the measurement). Putting R inside K rather than in the
right-hand side keeps the analytic gradients: with b = R u, JAX transposes the step's JVP itself,
which measured slower and with more XLA temporaries. Hessian-vector products and ``jacfwd``
differentiate K's ``matvec`` (a rematerialised JVP of the step); JAX cannot ``jvp`` a
``custom_vjp``, hence the ``custom_jvp``.

:func:`tangent_rule` is the rule with its two solves as arguments: one device passes
:func:`tangent_states` and the BPPSA backward; a mesh (:mod:`bppsa.parallel.sequence`) passes the
same two, sharded, with a cross-device combine, through :func:`rule_functions` (the same rule's
``custom_jvp`` over a forward and scans given as functions: every ``custom_jvp`` of the library
lives in this module). :func:`solved_states` differentiates states a
parallel forward solved (:mod:`bppsa.forward.newton`) by the same rule.

Every setting (the scan, the chunk length, the precision, the unroll) arrives concrete, from the
:class:`bppsa.plan.Plan` the entry point made: nothing is decided here.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax import Array, lax

from bppsa.backward.adjoint import factor_states, fused_sequential_adjoint, sequential_adjoint
from bppsa.backward.pipeline import adjoint
from bppsa.cells import Cell
from bppsa.forward.sequential import flat_step, planned_states, prev_states, steps
from bppsa.plan.options import Plan

__all__ = ["tangent_states", "bppsa_states", "solved_states", "tangent_rule", "rule_functions"]


def tangent_states(cell: Cell, params: Any, xs: Array, s0: Array, ss: Array, rhs: Array, d0: Array) -> Array:
    """The forward tangent scan: ṡ_t = J_t ṡ_{t-1} + rhs_t from ṡ_0 = d0 (B, S), one
    ``lax.scan`` of Jacobian-vector products of the step at the saved states; rhs (T, B, S).

    Args:
      cell: the cell.
      params: the cell's parameters.
      xs: (T, B, I) inputs.
      s0: (B, S) the flat initial state.
      ss: (T, B, S) the states after each step (the Jacobians J_t are taken at s_{t-1}).
      rhs: (T, B, S) the right-hand sides rhs_t.
      d0: (B, S) the initial tangent ṡ_0.

    Returns:
      (T, B, S) the tangents ṡ_1 … ṡ_T.
    """

    def body(d, inp):
        sp, x, r = inp
        d = jax.jvp(lambda s: flat_step(cell, params, s, x), (sp,), (d,))[1] + r
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


@functools.partial(jax.custom_jvp, nondiff_argnums=(0, 1))
def bppsa_states(cell: Cell, plan: Plan, params: Any, xs: Array, s0: Array) -> Array:
    """The flat states ss (T, B, S) of the sequential forward (:func:`forward_states`) from s0 (B, S)
    over xs (T, B, I), differentiated by the backward ``plan`` names, every matrix product of it at
    ``plan.precision``.

    Args:
      cell: the cell (static).
      plan: the resolved :class:`bppsa.plan.Plan` (static). Reverse mode is ``plan.adjoint``: "scan",
        the BPPSA backward (:func:`bppsa.backward.pipeline.adjoint`) with ``plan.adjoint_scan`` over
        chunks of ``plan.chunk_size`` steps; "fused", BPTT's fused adjoint loop; "analytic" (a cell
        with an analytic adjoint, :class:`bppsa.cells.AnalyticAdjoint`), the adjoint loop
        (:func:`sequential_adjoint`, the parameter gradients summed in the loop where
        ``plan.weights_in_loop``), the forward keeping the steps' factors. The forward scan runs with
        ``plan.unroll`` and ``plan.hoist``.
      params: the cell's parameters.
      xs: (T, B, I) inputs.
      s0: (B, S) the flat initial state.

    Returns:
      ss (T, B, S). Forward mode is the tangent scan (:func:`tangent_states`), reverse mode its
      transpose, the backward above. Inputs are not validated (see :func:`bppsa.rnn`).
    """
    return planned_states(cell, plan, params, xs, s0)


@bppsa_states.defjvp
def _bppsa_jvp(cell, plan, primals, tangents):
    params, xs, s0 = primals
    if plan.adjoint != "analytic":
        # a fused kernel's states through this rule again: differentiated once more (HVPs), JAX
        # differentiates the rule, not the kernel (a pallas_call has no JVP of its own); the fused
        # BPTT recomputes its steps from the states (no factors kept)
        fused = plan.fused is not None
        ss = bppsa_states(cell, plan, params, xs, s0) if fused else planned_states(cell, plan, params, xs, s0)
        return ss, _tangent(cell, plan, params, xs, s0, ss, tangents)
    ss, factors = factor_states(cell, params, xs, s0, plan.unroll, plan.hoist)  # the adjoint reads the steps' factors
    return ss, _tangent(cell, plan, params, xs, s0, ss, tangents, factors)


@functools.partial(jax.custom_jvp, nondiff_argnums=(0, 1))
def solved_states(cell: Cell, plan: Plan, params: Any, xs: Array, s0: Array, ss: Array) -> Array:
    """:func:`bppsa_states` for states ``ss`` (T, B, S) already solved by another forward (the
    parallel Newton forward, :mod:`bppsa.forward.newton`): returns ``ss`` itself, differentiated as
    the solution of the recurrence at those states, the same linear solve at the same Jacobians.
    Reverse mode is ``plan.adjoint``: the BPPSA backward with ``plan.adjoint_scan`` (for BPTT the
    sequential scan, the same recurrence solved step by step), or BPTT's fused adjoint loop. ``ss``
    must carry no gradient of its own (computed from ``lax.stop_gradient``-ed inputs): its tangent
    is not used.

    Args:
      cell: the cell (static).
      plan: the resolved :class:`bppsa.plan.options.Plan` (static).
      params: the cell's parameters.
      xs: (T, B, I) inputs.
      s0: (B, S) the flat initial state.
      ss: (T, B, S) the solved states.

    Returns:
      ss (T, B, S) itself, differentiable w.r.t. (params, xs, s0).
    """
    return ss


@solved_states.defjvp
def _solved_jvp(cell, plan, primals, tangents):
    params, xs, s0, ss = primals
    # ss again through solved_states: differentiated once more (HVPs, grad of grad), the states'
    # dependence on (params, xs, s0) is the implicit function's, not the stop_gradient's zero
    ss = solved_states(cell, plan, params, xs, s0, ss)
    return ss, _tangent(cell, plan, params, xs, s0, ss, tangents[:3])


def _tangent(cell, plan, params, xs, s0, ss, tangents, factors=None):
    """The states' tangent at the solved states ss, one ``lax.custom_linear_solve`` (see the module
    docstring): solve = the forward tangent scan, transpose_solve = the backward ``plan`` names
    (the analytic adjoint where the forward kept the steps' ``factors``)."""
    def tangent_scan(rhs, d0):
        return tangent_states(cell, params, xs, s0, ss, rhs, d0)

    def adjoint_scan(c1):
        if plan.adjoint == "analytic":  # the forward kept the steps' factors
            return sequential_adjoint(cell, params, xs, s0, ss, c1, factors, plan.unroll,
                                      in_loop=plan.weights_in_loop)
        if plan.adjoint == "fused":  # BPTT's adjoint loop, one fused kernel
            assert plan.fused is not None
            return fused_sequential_adjoint(cell, params, xs, s0, ss, c1, plan.fused)
        return adjoint(cell, plan.adjoint_scan, plan.chunk_size, params, xs, s0, ss, c1, plan.fused)

    return tangent_rule(cell, plan.precision, params, xs, s0, ss, tangents, tangent_scan, adjoint_scan)


def tangent_rule(cell: Cell, precision: str, params: Any, xs: Array, s0: Array, ss: Array, tangents: Any,
                 tangent_scan: Any, adjoint_scan: Any) -> Array:
    """The tangent of the states ss (T, B, S) solved from (params, xs (T, B, I), s0 (B, S)), for the
    input ``tangents`` (dparams, dxs, ds0): one ``lax.custom_linear_solve`` of the block system of
    the module docstring, whose two solves are given: ``tangent_scan(rhs (T, B, S), d0 (B, S))`` the
    forward tangent recurrence ṡ_t = J_t ṡ_{t-1} + rhs_t from ṡ_0 = d0, and ``adjoint_scan(c1 (T,
    B, S))`` the backward, returning (gs, dparams, dxs, g0). One device passes its scans
    (:func:`tangent_states`, :func:`adjoint`); a mesh its sharded ones (:mod:`bppsa.parallel.sequence`),
    so both have reverse mode, forward mode and Hessian-vector products from the same rule.

    Args:
      cell: the cell.
      precision: the matrix products' precision, a name of :data:`bppsa.plan.options.PRECISIONS`.
      params: the cell's parameters.
      xs: (T, B, I) inputs.
      s0: (B, S) the flat initial state.
      ss: (T, B, S) the solved states.
      tangents: (dparams, dxs (T, B, I), ds0 (B, S)), the input tangents.
      tangent_scan: ``tangent_scan(rhs, d0) -> (T, B, S)``, the forward tangent recurrence.
      adjoint_scan: ``adjoint_scan(c1) -> (gs, dparams, dxs, g0)``, the backward.

    Returns:
      (T, B, S) the states' tangent ṡ.
    """
    # a Python scalar differentiated (``jax.grad(loss)(0.7)``) reaches the rule as a scalar, not an array
    params, tangents = jax.tree.map(jnp.asarray, (params, tangents))
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



def rule_functions(cell: Cell, precision: str, forward: Callable[[Any, Array, Array], Array],
                   scans: Callable[[Any, Array, Array, Array], tuple[Callable, Callable]]
                   ) -> tuple[Callable[[Any, Array, Array], Array], Callable[[Any, Array, Array, Array], Array]]:
    """The rule (:func:`tangent_rule`) as two ``jax.custom_jvp`` functions over a forward and scans
    given as functions: a mesh's sharded ones (:func:`bppsa.parallel.sequence.sharded_functions`),
    so the mesh has reverse mode, forward mode and Hessian-vector products from this one rule.

    Args:
      cell: the cell.
      precision: the matrix products' precision, a name of :data:`bppsa.plan.options.PRECISIONS`.
      forward: ``forward(params, xs (T, B, I), s0 (B, S)) -> ss (T, B, S)``, the states.
      scans: ``scans(params, xs, s0, ss) -> (tangent_scan, adjoint_scan)``, the two solves of
        :func:`tangent_rule` at the states ss.

    Returns:
      ``(run, solved)``: ``run(params, xs, s0) -> ss``, the forward differentiated by the rule, and
      ``solved(params, xs, s0, ss) -> ss``, states another forward solved returned as they are and
      differentiated by the rule at them (as :func:`solved_states`).
    """
    @jax.custom_jvp
    def run(params, xs, s0):
        return forward(params, xs, s0)

    @run.defjvp
    def _run_jvp(primals, tangents):
        params, xs, s0 = primals
        ss = forward(params, xs, s0)
        return ss, tangent_rule(cell, precision, params, xs, s0, ss, tangents, *scans(params, xs, s0, ss))

    @jax.custom_jvp
    def solved(params, xs, s0, ss):  # states solved by the parallel forward, differentiated at them
        return ss

    @solved.defjvp
    def _solved_jvp(primals, tangents):
        params, xs, s0, ss = primals
        ss = solved(params, xs, s0, ss)  # differentiated once more (HVPs), as on one device
        return ss, tangent_rule(cell, precision, params, xs, s0, ss, tangents[:3], *scans(params, xs, s0, ss))

    return run, solved
