"""The forward passes: the states of a chain h_t = f(h_{t-1}, x_t) from h_0 over xs.

- :mod:`bppsa.forward.sequential`: one ``lax.scan`` (the reference, BPTT's forward, the fallback),
  and every step at once at given previous states;
- :mod:`bppsa.forward.newton`: the parallel forward, Newton's method over the whole sequence (DEER,
  ParaRNN), quasi-Newton, damping, its safeguards and fallback, and the predictability probe of
  ``forward="auto"``; :mod:`bppsa.forward.step` its step (the linearised recurrence solved by a
  scan) and :mod:`bppsa.forward.elk` the damped step's trust-region smoother;
- :mod:`bppsa.forward.lyapunov`: the largest Lyapunov exponent along a trajectory (:func:`lyapunov`);
- :mod:`bppsa.forward.info`: what a parallel forward reports (:class:`NewtonInfo`);
- :mod:`bppsa.forward.inputs`: a call's inputs checked, a guess of states flattened.

May import :mod:`bppsa.scan`, :mod:`bppsa.cells`, :mod:`bppsa.plan` and :mod:`bppsa.errors`;
never the backward (the backward differentiates what a forward computed, not the reverse).
"""

from __future__ import annotations

from bppsa.forward import elk, info, inputs, lyapunov, newton, sequential, step
from bppsa.forward.info import NewtonDidNotConverge, NewtonFallbackWarning, NewtonInfo
from bppsa.forward.lyapunov import lyapunov_from_jacobians
from bppsa.forward.sequential import forward_states

__all__ = ["sequential", "newton", "step", "elk", "lyapunov", "info", "inputs", "NewtonInfo", "NewtonDidNotConverge",
           "NewtonFallbackWarning", "forward_states", "lyapunov_from_jacobians"]
