"""Cells with block-diagonal recurrences (heads), whose state Jacobians are block-diagonal.

As in ParaRNN (Danieli et al., 2025) and diagonal/"multi-head" recurrent cells, each of the
N = H/k heads of k units sees only its own previous k units: the recurrent weight is
block-diagonal, so every transposed Jacobian M_t (:class:`bppsa.cells.Cell`: g_{t-1} = g_t @ M_t,
M_t[b, i, j] = ∂s_t[b, i]/∂s_{t-1}[b, j]) is block-diagonal with S/k' contiguous (k', k') blocks
(k' = k; the LSTM: k' = 2k), diagonal for k = 1 (the RNN and GRU). The scans can then combine
(k', k') blocks instead of S × S matrices (their :attr:`~bppsa.cells.Cell.jacobian_structure` is
:class:`~bppsa.cells.Blocks`, carrying :meth:`jacobian_blocks` and :meth:`jacobian_diagonal`);
:meth:`~bppsa.cells.Cell.transposed_jacobian` still gives the dense matrices, built from the blocks.

Parameters (N heads, k = ``head_size``, G gates, H = N k, unit m = n k + a of head n):

- ``W_x`` (I, G·H): dense input weights, gate-major columns (q H + m), as in :mod:`bppsa.cells`;
- ``W_h`` (N, k, G·k): per-head recurrent weights, W_h[n, j, q k + a] = the weight from unit j
  of head n to unit a of head n in gate q (k = 1: one vector per gate, a diagonal recurrence);
- ``b_x``, ``b_h`` (G·H): input and hidden biases, where ``input_bias``/``hidden_bias``.

The recurrent product is rec(h)[q H + n k + a] = Σ_j h[n k + j] W_h[n, j, q k + a]; every cell is
its dense counterpart in :mod:`bppsa.cells` with W_h replaced by the block-diagonal matrix this
defines. Gate orders are PyTorch's, (r, z, n) and (i, f, g, o). Jacobians, parameter and input
gradients are analytic (no autodiff); no S × S array is formed except by ``transposed_jacobian``.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
from jax import Array

from bppsa.cells.base import ACTIVATIONS, Affine, flat_outer
from bppsa.cells.recurrent import GRU, LSTM
from bppsa.cells.structure import Blocks, Structure
from bppsa.errors import UsageError, as_int

__all__ = ["BlockRNN", "BlockGRU", "BlockLSTM", "block_diagonal", "recurrent_matrix"]


def block_diagonal(blocks: Array) -> Array:
    """(..., N, k, k) blocks -> the (..., N k, N k) block-diagonal matrix.

    Args:
      blocks: (..., N, k, k) the diagonal blocks, e.g. (T, B, S/k, k, k) from a Block cell's ``jacobian_blocks``.

    Returns:
      (..., N k, N k), block n at rows and columns n k … n k + k − 1, zero elsewhere.
    """
    N, k = blocks.shape[-3], blocks.shape[-1]
    dense = jnp.einsum("...nab,nm->...namb", blocks, jnp.eye(N, dtype=blocks.dtype))
    return dense.reshape(blocks.shape[:-3] + (N * k, N * k))


def recurrent_matrix(W_h: Array, gates: int) -> Array:
    """The per-head ``W_h`` (N, k, G·k) as the dense (H, G·H) recurrent weight of :mod:`bppsa.cells`
    (zero outside the heads' blocks): rec(h) = h @ recurrent_matrix(W_h, G).

    Args:
      W_h: (N, k, G·k) the per-head recurrent weights.
      gates: G, the cell's gate count.

    Returns:
      (H, G·H) with H = N k, gate-major columns.
    """
    N, k = W_h.shape[:2]
    W = W_h.reshape(N, k, gates, k)
    dense = jnp.einsum("njqa,nm->njqma", W, jnp.eye(N, dtype=W.dtype))
    return dense.reshape(N * k, gates * N * k)


class _Block(Affine):
    """What the three cells share: sizes and their checks, parameters, the per-head products."""

    input_size: int
    hidden_size: int
    head_size: int
    input_bias: bool
    hidden_bias: bool
    _activations: ClassVar[tuple[str, ...]] = ()

    def __post_init__(self):
        name = type(self).__name__
        for field in ("input_size", "hidden_size", "head_size"):  # numpy and JAX integers are stored as ints
            if (n := as_int(value := getattr(self, field))) is None or n < 1:
                raise UsageError(f"{name}: {field} must be a positive int; got {value!r}")
            object.__setattr__(self, field, n)
        if self.hidden_size % self.head_size:
            raise UsageError(f"{name}: hidden_size ({self.hidden_size}) must be divisible by head_size "
                             f"({self.head_size}): the state is hidden_size / head_size heads of head_size units")
        for field in self._activations:
            value = getattr(self, field)
            if not (isinstance(value, str) and value in ACTIVATIONS):
                raise UsageError(f"{name}: {field} must be one of {list(ACTIVATIONS)}; got {value!r}")
        for field in ("input_bias", "hidden_bias"):
            if not isinstance(getattr(self, field), bool):
                raise UsageError(f"{name}: {field} must be True or False; got {getattr(self, field)!r}")

    @property
    def heads(self) -> int:
        """N = hidden_size / head_size."""
        return self.hidden_size // self.head_size

    def init(self, key: Array, dtype: jax.typing.DTypeLike = jnp.float32) -> dict[str, Array]:
        """W_x and the biases U(±1/√H) (PyTorch's), W_h U(±1/√k) (each unit's recurrent fan-in is k)."""
        keys = jax.random.split(key, 4)
        H, k, G = self.hidden_size, self.head_size, self.gates
        u = lambda key, shape, bound: jax.random.uniform(key, shape, dtype, -bound, bound)
        params = {"W_x": u(keys[0], (self.input_size, G * H), H ** -0.5),
                  "W_h": u(keys[1], (self.heads, k, G * k), k ** -0.5)}
        if self.input_bias:
            params["b_x"] = u(keys[2], (G * H,), H ** -0.5)
        if self.hidden_bias:
            params["b_h"] = u(keys[3], (G * H,), H ** -0.5)
        return params

    def _heads(self, a):
        """(..., H) -> (..., N, k)."""
        return a.reshape(a.shape[:-1] + (self.heads, self.head_size))

    def _w(self, params):
        """W_h as (N, k_in j, G, k_out a)."""
        return params["W_h"].reshape(self.heads, self.head_size, self.gates, self.head_size)

    def _recurrent(self, params, h) -> Any:
        """rec(h) + b_h, (..., G·H) gate-major (the input's part, x W_x + b_x, is :meth:`project`);
        at head_size 1 the G gates' parts h ⊙ w_q (+ b_hq) as a list (one array for G = 1), elementwise
        (a dot_general or one (G, H) broadcast with its reshape is slower there)."""
        if self.head_size == 1:
            w = params["W_h"] if params["W_h"].ndim == 2 else params["W_h"][:, 0, :].T  # (G, H)
            b = jnp.split(params["b_h"], self.gates) if self.hidden_bias else [0.0] * self.gates
            parts = [h * w[q] + b[q] for q in range(self.gates)]
            return parts if self.gates > 1 else parts[0]
        gh = jnp.einsum("...nj,njqa->...qna", self._heads(h), self._w(params))
        gh = gh.reshape(h.shape[:-1] + (self.gates * self.hidden_size,))
        return gh + params["b_h"] if self.hidden_bias else gh

    def loop_params(self, params: Any) -> Any:
        """At head_size 1, W_h as the G gates' rows (G, H), which :meth:`_recurrent` reads: each
        gate's weights are contiguous there, strided in the (H, 1, G) layout, and a step's fusion
        reading them strided is not vectorised on CPU (BlockGRU's forward, H = 64, B = 8: 1.3x a
        hand-written scan's time before)."""
        return {**params, "W_h": params["W_h"][:, 0, :].T} if self.head_size == 1 else params

    def _gate(self, a, q):
        """Gate q's slice (..., H) of a gate-major (..., G·H) array."""
        H = self.hidden_size
        return a[..., q * H:(q + 1) * H]

    def _rec_blocks(self, params, U):
        """Σ_q diag(U_q) W_hqᵀ on each head: U, the G gates' (..., H) (a sequence) -> (..., N, k, k),
        [n, a, j] = Σ_q U_q[n k + a] W_h[n, j, q k + a]. At head_size 1: :meth:`_rec_diagonal`."""
        if self.head_size == 1:
            return self._rec_diagonal(params, U)[..., None, None]
        W = jnp.transpose(self._w(params), (2, 0, 3, 1))  # (G, N, k_out a, k_in j)
        # G fused multiply-adds: an einsum (batch axes n, a) or a sum over the G axis compiles on
        # CPU to a transposing dot_general / a strided reduction, measured far slower at k = 1
        terms = [self._heads(U[q])[..., None] * W[q] for q in range(self.gates)]
        return functools.reduce(jnp.add, terms)

    def _rec_diagonal(self, params, U):
        """The diagonal of :meth:`_rec_blocks`: the G gates' (..., H) -> (..., H), Σ_q U_q ⊙ diag_q
        (the gates as separate arrays: stacking them first makes XLA's CPU fusion compute every
        gate's terms once per slot of the stack)."""
        Wd = jnp.diagonal(self._w(params), axis1=1, axis2=3)  # (N, G, k): W_h[n, a, q k + a]
        Wd = jnp.transpose(Wd, (1, 0, 2)).reshape(self.gates, self.hidden_size)  # (G, H)
        return functools.reduce(jnp.add, [U[q] * Wd[q] for q in range(self.gates)])

    def _contract(self, xs, h_prev, dgx, dgh):
        """Parameter gradients of (x W_x + b_x, rec(h) + b_h) from their cotangents: dgx (T, B, G·H),
        dgh the G gates' (T, B, H) (a sequence). At head_size 1 dW_h is G elementwise products
        summed over (T, B) (the einsum's batched dot_general with one row per head is ~10x slower
        on CPU)."""
        G, N, k = self.gates, self.heads, self.head_size
        if k == 1:
            dW_h = jnp.stack([jnp.sum(h_prev * d, axis=(0, 1)) for d in dgh], axis=-1)  # (H, G)
        else:
            dW_h = jnp.einsum("tbnj,tbqna->njqa", self._heads(h_prev), jnp.stack([self._heads(d) for d in dgh], 2))
        grads = {"W_x": flat_outer(xs, dgx), "W_h": dW_h.reshape(N, k, G * k)}
        if self.input_bias:
            grads["b_x"] = dgx.sum((0, 1))
        if self.hidden_bias:
            grads["b_h"] = jnp.concatenate([d.sum((0, 1)) for d in dgh])
        return grads

    @property
    def jacobian_structure(self) -> Structure:
        """:class:`~bppsa.cells.Blocks` of k = ``head_size`` (the LSTM: 2k), with :meth:`jacobian_blocks` and
        :meth:`jacobian_diagonal`."""
        return Blocks(self.head_size * (2 if self.pair_state else 1), self.jacobian_blocks, self.jacobian_diagonal)

    def jacobian_blocks(self, params: Any, s_prev: Array, xs: Array, s: Array, /) -> Array:
        """M_t's diagonal blocks (T, B, S/k, k, k).

        Args:
          params, s_prev, xs, s: as for :meth:`~bppsa.cells.Cell.transposed_jacobian`.

        Returns:
          (T, B, S/k, k, k), block n holding the rows and columns n·k … n·k + k − 1 of M_t[b].
        """
        raise NotImplementedError

    def jacobian_diagonal(self, params: Any, s_prev: Array, xs: Array, s: Array, /) -> Array:
        """diag(M_t) (T, B, S), the quasi-Newton forward's Jacobian.

        Args:
          params, s_prev, xs, s: as for :meth:`~bppsa.cells.Cell.transposed_jacobian`.

        Returns:
          (T, B, S), the diagonal of each M_t[b].
        """
        raise NotImplementedError

    def transposed_jacobian(self, params: Any, s_prev: Array, xs: Array, s: Array) -> Array:
        """The dense (T, B, S, S) M_t: :meth:`jacobian_blocks` on the diagonal, zero elsewhere."""
        return block_diagonal(self.jacobian_blocks(params, s_prev, xs, s))


@dataclasses.dataclass(frozen=True)
class BlockRNN(_Block):
    r"""Elman RNN with per-head recurrence: :math:`h' = \sigma(x W_x + b_x + \mathrm{rec}(h) + b_h)`,
    σ = ``nonlinearity``.

    Jacobian block of head n (a, j < k): :math:`M_n[a, j] = \sigma'(a_{nk+a})\, W_h[n, j, a]`, i.e.
    :math:`M = \mathrm{diag}(\sigma'(a))\, \mathrm{blockdiag}(W_h[n]^\top)`; its diagonal
    :math:`\sigma'(a_m)\, W_h[n, a, a]`. For tanh :math:`\sigma' = 1 - h'^2`.

    Args:
      input_size: I, the input width.
      hidden_size: H = N k, the state width (S = H).
      head_size: k, the units of each head (default 1: a diagonal recurrence).
      nonlinearity: σ, "tanh" (default), "relu" or "sigmoid".
      input_bias: whether b_x (H,) exists.
      hidden_bias: whether b_h (H,) exists.

    Raises:
      bppsa.errors.UsageError: on construction, a size that is not a positive int, a ``hidden_size`` that
      ``head_size`` does not divide, an activation that is not a name in :data:`bppsa.cells.ACTIVATIONS`, or
      a flag that is not a bool (the message names the field).

    Examples:
      >>> import jax, jax.numpy as jnp, bppsa
      >>> cell = bppsa.cells.BlockRNN(input_size=3, hidden_size=6, head_size=2)
      >>> params = cell.init(jax.random.key(0))
      >>> params["W_h"].shape                                  # (H/k, k, G·k): one block per head
      (3, 2, 2)
      >>> cell.jacobian_structure.size                         # the scans combine blocks, not S × S
      2
      >>> hs = bppsa.rnn(cell, params, jnp.ones((8, 2, 3)), jnp.zeros((2, 6)))
      >>> hs.shape
      (8, 2, 6)
    """

    input_size: int
    hidden_size: int
    head_size: int = 1
    nonlinearity: str = "tanh"
    input_bias: bool = True
    hidden_bias: bool = True

    gates: ClassVar[int] = 1
    _activations: ClassVar[tuple[str, ...]] = ("nonlinearity",)

    def gate_step(self, h: Array, gx: Sequence[Array], gh: Sequence[Array]) -> Array:
        """The step given its two products (as :meth:`bppsa.cells.RNN.gate_step`; the Newton
        kernel's, given an elementwise recurrent product).

        Args:
          h: (..., H) the state.
          gx: (x W_x + b_x,), the projected input.
          gh: (rec(h) + b_h,), the per-head recurrent product.

        Returns:
          h' (..., H).
        """
        return ACTIVATIONS[self.nonlinearity][0](gx[0] + gh[0])

    def step_projected(self, params: Any, h: Array, gx: Array) -> Array:
        return self.gate_step(h, (gx,), (self._recurrent(params, h),))

    def _dact(self, s):
        return ACTIVATIONS[self.nonlinearity][1](s)

    def jacobian_blocks(self, params: Any, s_prev: Array, xs: Array, s: Array) -> Array:
        return self._rec_blocks(params, [self._dact(s)])

    def jacobian_diagonal(self, params: Any, s_prev: Array, xs: Array, s: Array) -> Array:
        return self._rec_diagonal(params, [self._dact(s)])

    def param_grads(self, params: Any, s_prev: Array, xs: Array, s: Array, gs: Array) -> tuple[Any, Array]:
        da = gs * self._dact(s)
        return self._contract(xs, s_prev, da, [da]), da @ params["W_x"].T


@dataclasses.dataclass(frozen=True)
class BlockGRU(_Block):
    r"""GRU with per-head recurrence, PyTorch's gate convention (r, z, n), gate σ, activation φ:

    .. math::

        r = \sigma(x W_{xr} + b_{xr} + \mathrm{rec}_r(h) + b_{hr}), \quad
        z = \sigma(x W_{xz} + b_{xz} + \mathrm{rec}_z(h) + b_{hz}),

        m = \mathrm{rec}_n(h) + b_{hn}, \quad n = \varphi(x W_{xn} + b_{xn} + r \odot m), \quad
        h' = (1 - z) \odot n + z \odot h.

    With :math:`u_n = (1 - z)\,\varphi'(n)`, :math:`u_r = u_n\, m\, \sigma'(r)`,
    :math:`u_z = (h - n)\,\sigma'(z)` (per unit), the Jacobian block of head n is (a, j < k)

    .. math::

        M_n[a, j] = u_r[a]\, W_h[n, j, a] + u_z[a]\, W_h[n, j, k + a]
                    + u_n[a]\, r[a]\, W_h[n, j, 2k + a] + z[a]\, \delta_{aj}

    (units a of head n), cells.GRU's M with W_h block-diagonal; diagonal at j = a.

    Args:
      input_size: I, the input width.
      hidden_size: H = N k, the state width (S = H).
      head_size: k, the units of each head (default 1: a diagonal recurrence).
      gate: σ, the gates' activation (default "sigmoid").
      activation: φ, the candidate's activation (default "tanh").
      input_bias: whether b_x (3H,) exists (flax's GRUCell: yes).
      hidden_bias: whether b_h (3H,) exists (flax's GRUCell: no).

    Raises:
      bppsa.errors.UsageError: on construction, a size that is not a positive int, a ``hidden_size`` that
      ``head_size`` does not divide, an activation that is not a name in :data:`bppsa.cells.ACTIVATIONS`, or
      a flag that is not a bool (the message names the field).

    Examples:
      >>> import jax, jax.numpy as jnp, bppsa
      >>> cell = bppsa.cells.BlockGRU(input_size=3, hidden_size=6, head_size=1)
      >>> params = cell.init(jax.random.key(0))
      >>> params["W_h"].shape                                  # (H/k, k, G·k): one block per head
      (6, 1, 3)
      >>> cell.jacobian_structure.size                         # the scans combine blocks, not S × S
      1
    """

    input_size: int
    hidden_size: int
    head_size: int = 1
    gate: str = "sigmoid"
    activation: str = "tanh"
    input_bias: bool = True
    hidden_bias: bool = True

    gates: ClassVar[int] = 3
    _activations: ClassVar[tuple[str, ...]] = ("gate", "activation")

    # the GRU's gates, update and derivative terms, written once (cells.GRU), on this cell's recurrence
    _gates = GRU._gates
    _gate_values = GRU._gate_values
    gate_step = GRU.gate_step  # pyright: ignore[reportAssignmentType]
    step_projected = GRU.step_projected  # pyright: ignore[reportAssignmentType]
    gate_terms = GRU.gate_terms  # pyright: ignore[reportAssignmentType]
    _gate_factors = GRU._gate_factors  # pyright: ignore[reportAssignmentType]

    def jacobian_blocks(self, params: Any, s_prev: Array, xs: Array, s: Array) -> Array:
        if self.head_size == 1:
            return self.jacobian_diagonal(params, s_prev, xs, s)[..., None, None]
        r, z, u_r, u_z, u_n = self.gate_terms(params, s_prev, xs)
        blocks = self._rec_blocks(params, [u_r, u_z, u_n * r])
        return blocks + self._heads(z)[..., :, None] * jnp.eye(self.head_size, dtype=blocks.dtype)

    def jacobian_diagonal(self, params: Any, s_prev: Array, xs: Array, s: Array) -> Array:
        r, z, u_r, u_z, u_n = self.gate_terms(params, s_prev, xs)
        return self._rec_diagonal(params, [u_r, u_z, u_n * r]) + z

    def param_grads(self, params: Any, s_prev: Array, xs: Array, s: Array, gs: Array) -> tuple[Any, Array]:
        r, z, u_r, u_z, u_n = self.gate_terms(params, s_prev, xs)
        da_r, da_z, da_n = gs * u_r, gs * u_z, gs * u_n
        dgx = jnp.concatenate([da_r, da_z, da_n], axis=-1)
        return self._contract(xs, s_prev, dgx, [da_r, da_z, da_n * r]), dgx @ params["W_x"].T


@dataclasses.dataclass(frozen=True)
class BlockLSTM(_Block):
    r"""LSTM with per-head recurrence, PyTorch's gate order (i, f, g, o), gate σ, activation φ:

    .. math::

        a = x W_x + b_x + \mathrm{rec}(h) + b_h, \quad
        i, f, o = \sigma(a_i), \sigma(a_f), \sigma(a_o), \quad g = \varphi(a_g),

        c' = f \odot c + i \odot g, \quad h' = o \odot \varphi(c').

    The state is the pair (h, c) (``flax_carry=True``: flax's (c, h)); the flat state is laid
    out per head, s = [h_0, c_0, h_1, c_1, …] with h_n, c_n the k units of head n (k = 1:
    h and c interleaved), so M_t is block-diagonal with contiguous (2k, 2k) blocks. With
    κ = o φ'(c'), p_i = g σ'(i), p_f = c σ'(f), p_g = i φ'(g), p_o = φ(c') σ'(o) (per unit),
    P_n[a, j] = Σ_{q∈i,f,g} p_q[a] W_h[n, j, q k + a], Q_n[a, j] = p_o[a] W_h[n, j, 3k + a], the
    block of head n is (rows ∂h'_n, ∂c'_n; columns ∂h_n, ∂c_n)

    .. math::

        M_n = \begin{bmatrix} \mathrm{diag}(\kappa) P_n + Q_n & \mathrm{diag}(\kappa f) \\
                              P_n & \mathrm{diag}(f) \end{bmatrix}.

    Args:
      input_size: I, the input width.
      hidden_size: H = N k, the width of h and of c (S = 2H).
      head_size: k, the units of each head (default 1); the Jacobian blocks are (2k, 2k).
      gate: σ, the gates' activation (default "sigmoid").
      activation: φ, the activation of g and of c' (default "tanh").
      input_bias: whether b_x (4H,) exists (flax's LSTM cells: no).
      hidden_bias: whether b_h (4H,) exists (flax's LSTM cells: yes).
      flax_carry: whether the state is the pair (c, h), as flax's LSTM cells carry it (default False: (h, c)).

    Raises:
      bppsa.errors.UsageError: on construction, a size that is not a positive int, a ``hidden_size`` that
      ``head_size`` does not divide, an activation that is not a name in :data:`bppsa.cells.ACTIVATIONS`, or
      a flag that is not a bool (the message names the field).

    Examples:
      >>> import jax, jax.numpy as jnp, bppsa
      >>> cell = bppsa.cells.BlockLSTM(input_size=3, hidden_size=4, head_size=2)
      >>> params = cell.init(jax.random.key(0))
      >>> params["W_h"].shape                                  # (H/k, k, G·k): one block per head
      (2, 2, 8)
      >>> cell.jacobian_structure.size                         # the scans combine blocks, not S × S
      4
    """

    input_size: int
    hidden_size: int
    head_size: int = 1
    gate: str = "sigmoid"
    activation: str = "tanh"
    input_bias: bool = True
    hidden_bias: bool = True
    flax_carry: bool = False  # True: the state is the pair (c, h), as flax's LSTM cells carry it

    gates: ClassVar[int] = 4
    pair_state: ClassVar[bool] = True
    _activations: ClassVar[tuple[str, ...]] = ("gate", "activation")

    def __post_init__(self):
        super().__post_init__()
        if not isinstance(self.flax_carry, bool):
            raise UsageError(f"BlockLSTM: flax_carry must be True or False; got {self.flax_carry!r}")

    @property
    def state_size(self) -> int:
        return 2 * self.hidden_size

    def _hc(self, state):
        return (state[1], state[0]) if self.flax_carry else tuple(state)

    def flatten_state(self, h: Any) -> Array:
        """(h, c) [flax_carry: (c, h)], each (..., H) -> (..., 2H), per head [h_n, c_n]."""
        h, c = self._hc(h)
        s = jnp.stack([self._heads(h), self._heads(c)], axis=-2)  # (..., N, 2, k)
        return s.reshape(s.shape[:-3] + (2 * self.hidden_size,))

    def _split(self, s):
        """(..., 2H) -> (h, c), each (..., H)."""
        s = s.reshape(s.shape[:-1] + (self.heads, 2, self.head_size))
        shape = s.shape[:-3] + (self.hidden_size,)
        return s[..., 0, :].reshape(shape), s[..., 1, :].reshape(shape)

    def unflatten_state(self, s: Array) -> tuple[Array, ...]:
        return self._hc(self._split(s))

    def hidden(self, states: tuple[Array, Array]) -> Array:
        return states[1] if self.flax_carry else states[0]

    _gates = LSTM._gates  # the LSTM's gates (cells.LSTM), on this cell's recurrence
    _gate_values = LSTM._gate_values

    def step_projected(self, params: Any, state: tuple[Array, Array], gx: Any) -> tuple[Array, Array]:
        h, c = self._hc(state)
        i, f, g, o = self._gates(params, h, gx)
        c_new = f * c + i * g
        return self._hc((o * ACTIVATIONS[self.activation][0](c_new), c_new))

    def _terms(self, params, s_prev, xs, s):
        """(h_prev, f, κ, (p_i, p_f, p_g), p_o), each (..., H)."""
        h, c = self._split(s_prev)
        i, f, g, o = self._gates(params, h, self.project(params, xs))
        phi, dphi = ACTIVATIONS[self.activation]
        dsigma = ACTIVATIONS[self.gate][1]
        tc = phi(self._split(s)[1])
        kappa = o * dphi(tc)  # ∂h'/∂c'
        return h, f, kappa, (g * dsigma(i), c * dsigma(f), i * dphi(g)), tc * dsigma(o)

    def jacobian_blocks(self, params: Any, s_prev: Array, xs: Array, s: Array) -> Array:
        _, f, kappa, p, p_o = self._terms(params, s_prev, xs, s)
        Uh = [kappa * pq for pq in p] + [p_o]  # g_h' -> dh
        Uc = list(p) + [jnp.zeros_like(p_o)]  # g_c' -> dh
        eye = jnp.eye(self.head_size, dtype=f.dtype)
        top = jnp.concatenate([self._rec_blocks(params, Uh), self._heads(kappa * f)[..., None] * eye], axis=-1)
        bottom = jnp.concatenate([self._rec_blocks(params, Uc), self._heads(f)[..., None] * eye], axis=-1)
        return jnp.concatenate([top, bottom], axis=-2)  # (..., N, 2k, 2k)

    def jacobian_diagonal(self, params: Any, s_prev: Array, xs: Array, s: Array) -> Array:
        _, f, kappa, p, p_o = self._terms(params, s_prev, xs, s)
        dh = self._rec_diagonal(params, [kappa * pq for pq in p] + [p_o])
        d = jnp.stack([self._heads(dh), self._heads(f)], axis=-2)  # (..., N, 2, k): the flat layout
        return d.reshape(d.shape[:-3] + (2 * self.hidden_size,))

    def param_grads(self, params: Any, s_prev: Array, xs: Array, s: Array, gs: Array) -> tuple[Any, Array]:
        h, f, kappa, p, p_o = self._terms(params, s_prev, xs, s)
        g_h, g_c = self._split(gs)
        dc = g_c + g_h * kappa
        das = [dc * p[0], dc * p[1], dc * p[2], g_h * p_o]
        da = jnp.concatenate(das, axis=-1)
        return self._contract(xs, h, da, das), da @ params["W_x"].T
