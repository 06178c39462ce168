"""Which implementation runs each stage of a plan: XLA's, or the fused Pallas kernels
(:mod:`bppsa.kernels`), compiled for a GPU or interpreted. The one place the stages' kernels are
reached from, and so the one place Pallas is loaded (on the first kernel a plan runs, never on
``import bppsa``).

A :class:`bppsa.plan.Plan` names its backend (``plan.kernels``); :attr:`bppsa.plan.Plan.fused` is the
:class:`Fused` stages it runs, or None for XLA's. The forward and the backward call a stage on it and
compare no option to a string.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

from jax import Array

from bppsa.cells import Cell

__all__ = ["Fused"]


@dataclasses.dataclass(frozen=True)
class Fused:
    """The fused kernels as the plan's stages call them; equal (and hashed) by value, so a plan that
    holds one stays a cache key.

    Attributes:
      interpret: run the kernels in Pallas's interpret mode (any backend) instead of compiling them
        for the GPU.
      newton: how a parallel forward's Newton step runs, decided while planning
        (:attr:`bppsa.plan.Plan.newton_kernel`): "none" (its solve by :meth:`scan` on steps and
        Jacobians XLA evaluates), "step" (a diagonal cell's whole step fused, :meth:`newton_step`;
        the convergence test XLA's) or "measured" (the whole step fused with its convergence test,
        :meth:`newton_operands`, :meth:`newton_reduce` and :meth:`newton_apply`).
    """

    interpret: bool = False
    newton: Literal["none", "step", "measured"] = "none"

    def states(self, cell: Cell, params: Any, xs: Array, s0: Array) -> Array:
        """The sequential forward's flat states ss (T, B, S) (:func:`bppsa.kernels.fused_states`)."""
        from bppsa.kernels.recurrence import fused_states
        return fused_states(cell, params, xs, s0, interpret=self.interpret)

    def adjoint(self, cell: Cell, params: Any, xs: Array, s0: Array, ss: Array, ct: Array) -> tuple[Array, Array]:
        """BPTT's adjoint states (gs (T, B, S), g0 (B, S)) (:func:`bppsa.kernels.fused_adjoint`)."""
        from bppsa.kernels.adjoint import fused_adjoint
        return fused_adjoint(cell, params, xs, s0, ss, ct, interpret=self.interpret)

    def scan(self, v: Array, Ms: Array, ds: Array | None = None) -> tuple[Array, Array]:
        """The scan of affine maps (prefixes, total) (:func:`bppsa.kernels.chunked_scan`)."""
        from bppsa.kernels.scan import chunked_scan
        return chunked_scan(v, Ms, ds, interpret=self.interpret)

    def scan_factored(self, v: Array, A: Array, Wt: Array, ds: Array | None = None) -> tuple[Array, Array]:
        """The scan with M_t = Σ_q diag(A_q,t) Wt_q formed inside (:func:`bppsa.kernels.chunked_scan_factored`)."""
        from bppsa.kernels.scan import chunked_scan_factored
        return chunked_scan_factored(v, A, Wt, ds, interpret=self.interpret)

    def newton_step(self, cell: Cell, params: Any, xs: Array, s0: Array, H: Array) -> Array | None:
        """A diagonal cell's whole undamped Newton step from the guess H (T, B, S)
        (:func:`bppsa.kernels.fused_newton_step`); None where the plan fuses no whole step
        (``newton`` "none": its solve then runs :meth:`scan` on steps and Jacobians evaluated by XLA)."""
        if self.newton == "none":
            return None
        from bppsa.kernels import newton
        return newton.fused_newton_step(cell, params, xs, s0, H, interpret=self.interpret)

    def newton_operands(self, cell: Cell, params: Any, xs: Array, dtype: Any) -> Any:
        """What a diagonal cell's fused Newton iterations read besides the guess, made once before
        the loop (:func:`bppsa.kernels.newton.newton_operands`: the input projection); None where the
        plan does not measure the iterations in the kernels (``newton`` other than "measured")."""
        if self.newton != "measured":
            return None
        from bppsa.kernels import newton
        return newton.newton_operands(cell, params, xs, dtype, interpret=self.interpret)

    def newton_reduce(self, cell: Cell, ops: Any, s0: Array, H: Array, atol: float, rtol: float) -> tuple[Any, Any]:
        """Phase 1 of a diagonal cell's undamped Newton step from the guess H (T, B, S), from
        :meth:`newton_operands`' operands (:func:`bppsa.kernels.newton.fused_newton_reduce`):
        (aggregates, H's residual pieces)."""
        from bppsa.kernels import newton
        return newton.fused_newton_reduce(cell, ops, s0, H, atol=atol, rtol=rtol, interpret=self.interpret)

    def newton_apply(self, cell: Cell, ops: Any, s0: Array, agg: Any, exact: Array, atol: float,
                     rtol: float) -> tuple[Array, Any]:
        """Phases 2 and 3 of that step from :meth:`newton_reduce`'s aggregates
        (:func:`bppsa.kernels.newton.fused_newton_apply`): (H' in s0's dtype, the step's sizes)."""
        from bppsa.kernels import newton
        new, steps = newton.fused_newton_apply(cell, ops, s0, agg, exact, atol=atol, rtol=rtol,
                                               interpret=self.interpret)
        return new.astype(s0.dtype), steps
