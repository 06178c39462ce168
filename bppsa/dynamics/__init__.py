"""The recurrence as a dynamical system: how predictable it is on its inputs.

- :func:`lyapunov`: the largest Lyapunov exponent of a cell along its trajectory, per sequence
  (negative: contracting, the parallel forward pays; positive: chaotic, use the sequential
  forward), from the step Jacobians in Θ(√T) dependent steps.
- :func:`lyapunov_from_jacobians`: the same from given Jacobians (T, R, k, k).
"""

from bppsa.dynamics.lyapunov import lyapunov, lyapunov_from_jacobians

__all__ = ["lyapunov", "lyapunov_from_jacobians"]
