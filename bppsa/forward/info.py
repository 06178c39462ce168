"""What a parallel forward reports: :class:`NewtonInfo`, and its two outcomes besides success,
:class:`NewtonDidNotConverge` (``on_fail="raise"``) and :class:`NewtonFallbackWarning`
(``on_fail="sequential"``)."""

from __future__ import annotations

from typing import NamedTuple

from jax.typing import ArrayLike

__all__ = ["NewtonInfo", "NewtonDidNotConverge", "NewtonFallbackWarning"]


class NewtonDidNotConverge(RuntimeError):
    """The parallel forward did not reach its tolerance and ``on_fail="raise"`` was asked for."""


class NewtonFallbackWarning(UserWarning):
    """The parallel forward did not converge; the sequential forward ran instead (once a process)."""


class NewtonInfo(NamedTuple):
    r"""What one parallel forward did (arrays: traced under jit, batched under vmap).

    Attributes:
      iterations: Newton steps taken (scans run; rejected damped steps included), int32.
      converged: whether the residual and the estimated state error met the tolerances (bool).
      fell_back: whether the sequential forward's states were returned instead (bool).
      residual: the final iterate's max relative residual,
        :math:`\max |h_t - f(h_{t-1}, x_t)| / (1 + |f|)`.
      error: the final iterate's estimated max relative state error,
        :math:`\max |h_t - h^*_t| / (1 + |h_t|)`
        (from the last step: :func:`bppsa.forward.newton.iterate`); +inf before a step was taken.
      lle: the largest Lyapunov exponent along the returned states (max over the batch;
        :func:`bppsa.lyapunov`): < 0 the recurrence contracts there; NaN on a mesh (not estimated).
      predicted: the iterations :func:`bppsa.forward.newton.predicted_iterations` foresees from ``lle``
        (from the probe windows' exponent where ``forward="auto"`` decided on it:
        :func:`bppsa.forward.newton.probe_windows`), int32; -1 where lle is NaN.
      chose_sequential: ``forward="auto"`` ran the sequential forward (the exponent along the probe
        windows >= 0, or the predicted iterations do not pay here: :attr:`bppsa.plan.options.Plan.gate`).

    Examples:
      >>> import jax, jax.numpy as jnp, bppsa
      >>> cell = bppsa.cells.GRU(input_size=3, hidden_size=4)
      >>> params = cell.init(jax.random.key(0))
      >>> xs, h0 = jnp.ones((32, 2, 3)), jnp.zeros((2, 4))
      >>> hs, info = bppsa.rnn(cell, params, xs, h0, forward="quasi", return_info=True)
      >>> bool(info.converged), bool(info.fell_back), int(info.iterations) <= 32
      (True, False, True)
      >>> bool(info.lle < 0)                                   # the GRU contracts along these states
      True
    """

    iterations: ArrayLike
    converged: ArrayLike
    fell_back: ArrayLike
    residual: ArrayLike
    error: ArrayLike
    lle: ArrayLike = float("nan")
    predicted: ArrayLike = -1
    chose_sequential: ArrayLike = False
