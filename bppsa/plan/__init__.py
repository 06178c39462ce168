"""What runs: the method options a user gives, the one plan resolved from them, and the rules and
cost model that resolve it.

- :mod:`bppsa.plan.options`: :class:`Options` (``backward``, ``forward``, ``scan``, ``chunk_size``,
  the solver's tolerances, ...), checked where they are made, and :class:`Plan`, every choice they
  leave open resolved once at the entry (:meth:`Options.plan`) and passed down whole;
- :mod:`bppsa.plan.backends`: which implementation runs each stage (XLA's, or the fused kernels:
  :class:`bppsa.plan.backends.Fused`, the one place the kernels are reached from);
- :mod:`bppsa.plan.rules`: the measured rules (the chunk length, the unroll, hoisting, the adjoint's
  loop, the elementwise backward, ``kernels="auto"``, the mesh's combine);
- :mod:`bppsa.plan.cost`: the cost model of ``backward="auto"`` and ``forward="auto"`` (its features,
  its fit, :class:`CostModel`, :func:`choose_forward`);
- :mod:`bppsa.plan.calibration`: the model each device uses (its cache, the shipped models in
  ``cost_models/``) and ``backward="auto"``'s choice (:func:`choose_backward`).

May import :mod:`bppsa.scan`, :mod:`bppsa.cells`, :mod:`bppsa.host` and :mod:`bppsa.errors`.
"""

from __future__ import annotations

from bppsa.plan import backends, calibration, cost, options, rules
from bppsa.plan.calibration import choose_backward
from bppsa.plan.cost import CostModel, choose_forward
from bppsa.plan.options import BACKWARDS, FORWARDS, Options, Plan

__all__ = ["options", "backends", "rules", "cost", "calibration", "Options", "Plan", "BACKWARDS", "FORWARDS",
           "CostModel", "choose_backward", "choose_forward"]
