"""The published recurrent cells, each one's maths written once: :class:`RNN` (Elman), :class:`GRU`
and :class:`LSTM`, with analytic transposed Jacobians, parameter gradients and adjoint steps
(conventions as fields: :mod:`bppsa.cells`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, ClassVar

import jax.numpy as jnp
from jax import Array

from bppsa.cells.base import ACTIVATIONS, AffineAdjoint, split_gates
from bppsa.cells.structure import Dense, Factored, Scaled, Structure
from bppsa.errors import UsageError

__all__ = ["RNN", "GRU", "LSTM"]


@dataclasses.dataclass(frozen=True)
class RNN(AffineAdjoint):
    r"""Elman RNN: :math:`h' = \sigma(x W_x + b_x + h W_h + b_h\,[+\,h])` (the last term with
    ``residual``), σ = ``nonlinearity`` ("tanh", "relu" or "sigmoid").

    Transposed Jacobian (row convention): :math:`M_t = \mathrm{diag}(\sigma'(a_t))\,(W_h^\top\,[+\,I])`, so
    :math:`g_{t-1} = (g_t \odot \sigma'(a_t))\,W_h^\top`; for tanh :math:`\sigma'(a_t) = 1 - h_t^2`. The Blelloch
    backward uses
    that structure (:class:`~bppsa.cells.Scaled`); ``diagonal=False`` switches it off (the dense path of GRU and LSTM,
    same gradients: the cost-model calibration measures the dense products with it).

    Args:
      input_size: I, the input width.
      hidden_size: H, the state width (S = H).
      nonlinearity: σ, "tanh" (default), "relu" or "sigmoid".
      diagonal: whether the Blelloch backward uses the diagonal structure (default True).
      input_bias: whether b_x (H,) exists (flax's SimpleCell: yes).
      hidden_bias: whether b_h (H,) exists (flax's SimpleCell: no).
      residual: whether h is added to the pre-activation (flax's SimpleCell ``residual``).

    Raises:
      bppsa.errors.UsageError: on construction, a size that is not a positive int, an activation that is not
      a name in :data:`bppsa.cells.ACTIVATIONS`, or a flag that is not a bool (the message names the field).

    Examples:
      >>> import jax, jax.numpy as jnp
      >>> from bppsa import cells
      >>> cell = cells.RNN(input_size=3, hidden_size=4)
      >>> params = cell.init(jax.random.key(0))
      >>> sorted(params)
      ['W_h', 'W_x', 'b_h', 'b_x']
      >>> h0, x0 = jnp.zeros((2, 4)), jnp.ones((2, 3))
      >>> cell.step(params, h0, x0).shape
      (2, 4)
      >>> cells.RNN(3, 4, nonlinearity="relu", hidden_bias=False).nonlinearity
      'relu'
    """

    input_size: int
    hidden_size: int
    nonlinearity: str = "tanh"
    diagonal: bool = True  # False: ignore the structure and form the matrices (as for GRU/LSTM)
    input_bias: bool = True
    hidden_bias: bool = True
    residual: bool = False

    _activations: ClassVar[tuple[str, ...]] = ("nonlinearity",)

    def __post_init__(self):
        for name in ("diagonal", "residual"):
            if not isinstance(getattr(self, name), bool):
                raise UsageError(f"RNN: {name} must be True or False; got {getattr(self, name)!r}")
        super().__post_init__()

    def gate_step(self, h: Array, gx: Sequence[Array], gh: Sequence[Array]) -> Array:
        """The step given its two products: the cell's maths, written once, for the XLA paths
        (:meth:`step_projected`) and the fused kernels (:mod:`bppsa.kernels`, each given its own products).

        Args:
          h: (..., H) the state.
          gx: (x W_x + b_x,), the projected input.
          gh: (h W_h + b_h,), the recurrent product.

        Returns:
          h' (..., H).
        """
        a = gx[0] + gh[0]
        return ACTIVATIONS[self.nonlinearity][0](a + h if self.residual else a)

    def step_projected(self, params: Any, h: Array, gx: Array) -> Array:
        return self.gate_step(h, (gx,), (self._recurrent(params, h),))

    def step_factors(self, params: Any, h: Array, gx: Array) -> tuple[Array, Any]:
        y = self.step_projected(params, h, gx)
        return y, (self._dact(y),)

    def _factors(self, params, s_prev, xs, s):
        return (self._dact(s),)

    def _cotangents(self, factors, g):
        da = g * factors[0]
        return da, da, da if self.residual else None

    def output_derivative(self, h: Array) -> Array:
        """σ'(a) at the step's pre-activation a, written in terms of its output h = σ(a) (tanh: 1 − h²;
        sigmoid: h (1 − h); relu: [h > 0]): all an adjoint step needs from a saved state, nothing
        recomputed (the fused adjoint, :mod:`bppsa.kernels.adjoint`).

        Args:
          h: (..., H) the step's output.

        Returns:
          σ'(a), (..., H).
        """
        return ACTIVATIONS[self.nonlinearity][1](h)

    def _dact(self, s):
        return self.output_derivative(s)

    def _wt(self, params):
        W = params["W_h"].T
        return W + jnp.eye(self.hidden_size, dtype=W.dtype) if self.residual else W

    def transposed_jacobian(self, params: Any, s_prev: Array, xs: Array, s: Array) -> Array:
        return self._dact(s)[..., :, None] * self._wt(params)

    @property
    def jacobian_structure(self) -> Structure:
        """:class:`~bppsa.cells.Scaled`, M_t = diag(σ'(a_t)) (W_hᵀ [+ I]); ``diagonal=False``:
        :class:`~bppsa.cells.Dense`."""
        return Scaled(self._scaled) if self.diagonal else Dense()

    def _scaled(self, params, s_prev, xs, s):  # (A (T, B, H), Wt (H, H))
        return self._dact(s), self._wt(params)



@dataclasses.dataclass(frozen=True)
class GRU(AffineAdjoint):
    r"""GRU with PyTorch's gate convention (r, z, n), gate σ and activation φ (default sigmoid, tanh):

    .. math::

        r = \sigma(x W_{xr} + b_{xr} + h W_{hr} + b_{hr}), \quad
        z = \sigma(x W_{xz} + b_{xz} + h W_{hz} + b_{hz}),

        m = h W_{hn} + b_{hn}, \quad n = \varphi(x W_{xn} + b_{xn} + r \odot m), \quad
        h' = (1 - z) \odot n + z \odot h.

    Transposed Jacobian (the paper's fused formula, row convention):

    .. math::

        M = \mathrm{diag}(u_r) W_{hr}^\top + \mathrm{diag}(u_z) W_{hz}^\top
            + \mathrm{diag}(u_n r) W_{hn}^\top + \mathrm{diag}(z),

        u_n = (1 - z)\,\varphi'(n), \quad u_r = u_n\, m\, \sigma'(r), \quad u_z = (h - n)\,\sigma'(z).

    Args:
      input_size: I, the input width.
      hidden_size: H, the state width (S = H).
      gate: σ, the gates' activation (default "sigmoid").
      activation: φ, the candidate's activation (default "tanh").
      input_bias: whether b_x (3H,) exists (flax's GRUCell: yes).
      hidden_bias: whether b_h (3H,) exists (flax's GRUCell: no).

    Raises:
      bppsa.errors.UsageError: on construction, a size that is not a positive int, an activation that is not
      a name in :data:`bppsa.cells.ACTIVATIONS`, or a flag that is not a bool (the message names the field).

    Examples:
      >>> import jax, jax.numpy as jnp, bppsa
      >>> from bppsa import cells
      >>> cell = cells.GRU(input_size=3, hidden_size=4)
      >>> params = cell.init(jax.random.key(0))
      >>> params["W_h"].shape  # (H, 3H): the gates r, z, n side by side
      (4, 12)
      >>> xs, h0 = jnp.ones((5, 2, 3)), jnp.zeros((2, 4))
      >>> hs = bppsa.rnn(cell, params, xs, h0)
      >>> hs.shape, hs.dtype
      ((5, 2, 4), dtype('float32'))
    """

    input_size: int
    hidden_size: int
    gate: str = "sigmoid"
    activation: str = "tanh"
    input_bias: bool = True
    hidden_bias: bool = True

    gates: ClassVar[int] = 3

    def _gates(self, params, h, gx):  # gx: the projected input, the gates' parts (r, z, n)
        return self._gate_values(gx, split_gates(self._recurrent(params, h), 3))

    def _gate_values(self, gx, gh):  # the gates (r, z), the recurrent candidate m and n, from both products
        sigma, phi = ACTIVATIONS[self.gate][0], ACTIVATIONS[self.activation][0]
        (x_r, x_z, x_n), (h_r, h_z, m) = gx, gh
        return (r := sigma(x_r + h_r)), sigma(x_z + h_z), m, phi(x_n + r * m)

    def gate_step(self, h: Array, gx: Sequence[Array], gh: Sequence[Array]) -> Array:
        """The step given its two products: the cell's maths, written once, for the XLA paths
        (:meth:`step_projected`) and the fused kernels (:mod:`bppsa.kernels`, each given its own products).

        Args:
          h: (..., H) the state.
          gx: the projected input's gates' parts (x W_xr + b_xr, x W_xz + b_xz, x W_xn + b_xn).
          gh: the recurrent product's (h W_hr + b_hr, h W_hz + b_hz, h W_hn + b_hn).

        Returns:
          h' (..., H).
        """
        r, z, m, n = self._gate_values(gx, gh)
        return (1.0 - z) * n + z * h

    def step_projected(self, params: Any, h: Array, gx: Any) -> Array:
        return self.gate_step(h, gx, split_gates(self._recurrent(params, h), 3))

    def _gate_factors(self, h, r, z, m, n):  # (r, z, u_r, u_z, u_n), per unit
        dsigma = ACTIVATIONS[self.gate][1]
        u_n = (1.0 - z) * ACTIVATIONS[self.activation][1](n)  # ∂h'/∂(pre-activation of n)
        return r, z, u_n * m * dsigma(r), (h - n) * dsigma(z), u_n

    def gate_terms(self, params: Any, s_prev: Array, xs: Array) -> tuple[Array, ...]:  # all steps' factors
        """The gates and the Jacobian's per-unit factors of every step at once.

        Args:
          params: the parameter pytree.
          s_prev: (T, B, H) the state before each step.
          xs: (T, B, I) each step's input.

        Returns:
          (r, z, u_r, u_z, u_n), each (T, B, H), as in the class docstring.
        """
        return self._gate_factors(s_prev, *self._gates(params, s_prev, self.project(params, xs)))

    def step_factors(self, params: Any, h: Array, gx: Any) -> tuple[Array, Any]:
        """The step and (z, u_r, u_z, u_n r, u_n): the loop reads the first four, the input's gradient the last."""
        r, z, m, n = self._gates(params, h, gx)
        _, _, u_r, u_z, u_n = self._gate_factors(h, r, z, m, n)
        return (1.0 - z) * n + z * h, (z, u_r, u_z, u_n * r, u_n)

    def _cotangents(self, factors, g):
        z, u_r, u_z, u_nr, u_n = factors
        da_r, da_z = g * u_r, g * u_z
        return jnp.concatenate([da_r, da_z, g * u_n], -1), jnp.concatenate([da_r, da_z, g * u_nr], -1), g * z

    def adjoint_step(self, params: Any, factors: Any, g: Array) -> tuple[Array, Any]:  # emits h W_h's cotangent only
        _, dgh, direct = self._cotangents(factors, g)
        return dgh @ self._transposed(params) + direct, (dgh,)

    def _dgs(self, factors, gs, cotangents):  # the input's cotangent differs from h W_h's in the n gate only
        dgh = cotangents[0]
        return jnp.concatenate([dgh[..., :2 * self.hidden_size], gs * factors[4]], -1), dgh

    @property
    def jacobian_structure(self) -> Structure:
        """:class:`~bppsa.cells.Factored`, Q = 4 (:meth:`_factored`)."""
        return Factored(self._factored)

    def _factored(self, params, s_prev, xs, s):
        """M = Σ_q diag(U_q) W_hqᵀ + diag(z) (the class docstring) as Q = 4 factors: the three
        gates' (U_r, U_z, U_n r) with W_hrᵀ, W_hzᵀ, W_hnᵀ, and z with the identity."""
        H = self.hidden_size
        r, z, u_r, u_z, u_n = self.gate_terms(params, s_prev, xs)
        W = params["W_h"].reshape(H, 3, H)  # (in j, gate, out i)
        Wt = jnp.concatenate([jnp.transpose(W, (1, 2, 0)), jnp.eye(H, dtype=W.dtype)[None]], axis=0)
        return jnp.stack([u_r, u_z, u_n * r, z]), Wt

    def transposed_jacobian(self, params: Any, s_prev: Array, xs: Array, s: Array) -> Array:
        H = self.hidden_size
        r, z, u_r, u_z, u_n = self.gate_terms(params, s_prev, xs)
        W = params["W_h"].reshape(H, 3, H)  # (in j, gate, out i)
        M = jnp.einsum("...gi,jgi->...ij", jnp.stack([u_r, u_z, u_n * r], axis=-2), W)
        return M + z[..., :, None] * jnp.eye(H, dtype=M.dtype)



@dataclasses.dataclass(frozen=True)
class LSTM(AffineAdjoint):
    r"""LSTM with PyTorch's gate order (i, f, g, o), gate σ and activation φ (default sigmoid,
    tanh); the state is (h, c), flat s = [h, c] (2H):

    .. math::

        a = x W_x + b_x + h W_h + b_h, \quad i, f, o = \sigma(a_i), \sigma(a_f), \sigma(a_o), \quad
        g = \varphi(a_g),

        c' = f \odot c + i \odot g, \quad h' = o \odot \varphi(c').

    With :math:`k = o\,\varphi'(c')`, :math:`P = \sum_{q \in i,f,g} \mathrm{diag}(p_q) W_{hq}^\top`
    (:math:`p_i = g\,\sigma'(i)`, :math:`p_f = c\,\sigma'(f)`, :math:`p_g = i\,\varphi'(g)`) and
    :math:`Q = \mathrm{diag}(\varphi(c')\,\sigma'(o)) W_{ho}^\top`, the 2H × 2H transposed Jacobian
    (rows :math:`\partial L/\partial h', \partial L/\partial c'`; columns
    :math:`\partial L/\partial h, \partial L/\partial c`) is

    .. math::

        M = \begin{bmatrix} \mathrm{diag}(k) P + Q & \mathrm{diag}(k f) \\
                            P & \mathrm{diag}(f) \end{bmatrix}.

    Args:
      input_size: I, the input width.
      hidden_size: H, the width of h and of c (S = 2H).
      gate: σ, the gates' activation (default "sigmoid").
      activation: φ, the activation of g and of c' (default "tanh").
      input_bias: whether b_x (4H,) exists (flax's LSTM cells: no).
      hidden_bias: whether b_h (4H,) exists (flax's LSTM cells: yes).

    Raises:
      bppsa.errors.UsageError: on construction, a size that is not a positive int, an activation that is not
      a name in :data:`bppsa.cells.ACTIVATIONS`, or a flag that is not a bool (the message names the field).

    Examples:
      The state is the pair (h, c), and so is the state sequence :func:`bppsa.rnn` returns:

      >>> import jax, jax.numpy as jnp, bppsa
      >>> from bppsa import cells
      >>> cell = cells.LSTM(input_size=3, hidden_size=4)
      >>> params = cell.init(jax.random.key(0))
      >>> h0 = (jnp.zeros((2, 4)), jnp.zeros((2, 4)))
      >>> hs, cs = bppsa.rnn(cell, params, jnp.ones((5, 2, 3)), h0)
      >>> hs.shape, cs.shape
      ((5, 2, 4), (5, 2, 4))
      >>> cell.hidden((hs, cs)).shape  # hs, whatever the cell
      (5, 2, 4)
    """

    input_size: int
    hidden_size: int
    gate: str = "sigmoid"
    activation: str = "tanh"
    input_bias: bool = True
    hidden_bias: bool = True

    gates: ClassVar[int] = 4
    pair_state: ClassVar[bool] = True

    @property
    def state_size(self) -> int:
        return 2 * self.hidden_size

    def flatten_state(self, h: tuple[Array, Array]) -> Array:
        return jnp.concatenate(h, axis=-1)

    def unflatten_state(self, s: Array) -> tuple[Array, Array]:
        return tuple(split_gates(s, 2))  # pyright: ignore[reportReturnType]

    def _gates(self, params, h, gx):  # gx: the projected input, the gates' parts (i, f, g, o)
        return self._gate_values(gx, split_gates(self._recurrent(params, h), 4))

    def _gate_values(self, gx, gh):  # the gates (i, f, g, o), activated, from both products
        sigma, phi = ACTIVATIONS[self.gate][0], ACTIVATIONS[self.activation][0]
        i, f, g, o = (x + r for x, r in zip(gx, gh, strict=True))
        return sigma(i), sigma(f), phi(g), sigma(o)

    def gate_step(self, state: tuple[Array, Array], gx: Sequence[Array], gh: Sequence[Array]
                  ) -> tuple[Array, Array]:
        """The step given its two products: the cell's maths, written once, for the XLA paths
        (:meth:`step_projected`) and the fused kernels (:mod:`bppsa.kernels`, each given its own products).

        Args:
          state: (h, c), each (..., H).
          gx: the projected input's gates' parts (i, f, g, o), each x W_x· + b_x·.
          gh: the recurrent product's, each h W_h· + b_h·.

        Returns:
          (h', c'), each (..., H).
        """
        c = state[1]
        i, f, g, o = self._gate_values(gx, gh)
        c_new = f * c + i * g
        return o * ACTIVATIONS[self.activation][0](c_new), c_new

    def step_projected(self, params: Any, state: tuple[Array, Array], gx: Any) -> tuple[Array, Array]:
        return self.gate_step(state, gx, split_gates(self._recurrent(params, state[0]), 4))

    def step_factors(self, params: Any, state: tuple[Array, Array], gx: Any) -> tuple[Any, Any]:
        """The step and (f, k, p_i, p_f, p_g, q): k = ∂h'/∂c', p = ∂c'/∂a_{i,f,g}, q = ∂h'/∂a_o."""
        h, c = state
        i, f, g, o = self._gates(params, h, gx)
        phi, dphi = ACTIVATIONS[self.activation]
        dsigma = ACTIVATIONS[self.gate][1]
        tc = phi(c_new := f * c + i * g)
        return (o * tc, c_new), (f, o * dphi(tc), g * dsigma(i), c * dsigma(f), i * dphi(g), tc * dsigma(o))

    @property
    def jacobian_structure(self) -> Structure:
        """:class:`~bppsa.cells.Factored`, Q = 5 (:meth:`_factored`)."""
        return Factored(self._factored)

    def _factored(self, params, s_prev, xs, s):
        """M (the class docstring) as Q = 5 factors over the 2H flat state: for each gate q of i,
        f, g the rows' factors [k p_q; p_q] with [[W_hqᵀ, 0], [W_hqᵀ, 0]], for o [q; 0] with W_hoᵀ
        the same way, and [k f; f] with [[0, I], [0, I]] (the cell state's own path)."""
        H = self.hidden_size
        f, k, *p, q = self._factors(params, s_prev, xs, s)
        W = params["W_h"].reshape(H, 4, H)  # (in j, gate, out m)
        zero = jnp.zeros_like(q)
        A = jnp.stack([jnp.concatenate([k * pq, pq], axis=-1) for pq in p]
                      + [jnp.concatenate([q, zero], axis=-1), jnp.concatenate([k * f, f], axis=-1)])
        Wq = jnp.transpose(W, (1, 2, 0))  # (gate, out m, in j): W_hqᵀ
        left = jnp.concatenate([Wq, Wq], axis=1)  # (4, 2H, H): both row halves read h's columns
        gates = jnp.concatenate([left, jnp.zeros_like(left)], axis=2)  # (4, 2H, 2H)
        eye = jnp.eye(H, dtype=W.dtype)
        own = jnp.concatenate([jnp.zeros((2 * H, H), W.dtype), jnp.concatenate([eye, eye], axis=0)], axis=1)
        return A, jnp.concatenate([gates, own[None]], axis=0)

    def transposed_jacobian(self, params: Any, s_prev: Array, xs: Array, s: Array) -> Array:
        H = self.hidden_size
        f, k, *p, q = self._factors(params, s_prev, xs, s)
        W = params["W_h"].reshape(H, 4, H)  # (in j, gate, out m)
        Uc = jnp.stack(p + [jnp.zeros_like(q)], axis=-2)  # dc'_tot -> dh
        Uh = jnp.stack([k * pq for pq in p] + [q], axis=-2)  # g_h' -> dh
        eye = jnp.eye(H, dtype=q.dtype)
        top = jnp.concatenate([jnp.einsum("...gm,jgm->...mj", Uh, W), (k * f)[..., :, None] * eye], axis=-1)
        bottom = jnp.concatenate([jnp.einsum("...gm,jgm->...mj", Uc, W), f[..., :, None] * eye], axis=-1)
        return jnp.concatenate([top, bottom], axis=-2)

    def _cotangents(self, factors, g):
        f, k, p_i, p_f, p_g, q = factors
        g_h, g_c = split_gates(g, 2)
        dc = g_c + g_h * k
        da = jnp.concatenate([dc * p_i, dc * p_f, dc * p_g, g_h * q], axis=-1)
        return da, da, dc * f
