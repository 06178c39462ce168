"""The backward passes: the gradients of a loss of the states, by BPPSA's parallel scan or by BPTT.

- :mod:`bppsa.backward.rule`: the one differentiation rule (a ``jax.custom_jvp`` whose tangent
  rule JAX transposes into the backward): reverse mode, forward mode and Hessian-vector products,
  for one device and, with its two solves sharded, for a mesh;
- :mod:`bppsa.backward.pipeline`: the BPPSA backward, every step's transposed Jacobian at once, the
  gradient recurrence by a scan, chunked, and the cell's batched parameter gradients;
- :mod:`bppsa.backward.adjoint`: BPTT by a cell's analytic adjoint, one loop of its own
  (:class:`bppsa.cells.AnalyticAdjoint`), instead of autodiff through the forward's ``lax.scan``.

May import :mod:`bppsa.scan`, :mod:`bppsa.cells`, :mod:`bppsa.plan`, :mod:`bppsa.forward` and
:mod:`bppsa.errors`.
"""

from __future__ import annotations

from bppsa.backward import adjoint, pipeline, rule
from bppsa.backward.rule import bppsa_states, solved_states, tangent_rule

__all__ = ["rule", "pipeline", "adjoint", "bppsa_states", "solved_states", "tangent_rule"]
