"""flax's recurrent cells as :class:`bppsa.cells.Cell`s, and the masked step of padded batches.

:func:`adapt` turns an ``nnx.RNNCellBase`` into a cell :func:`bppsa.rnn` can run, whose parameter
pytree is the flax cell's own ``nnx.Param`` arrays (``nnx.state(cell, nnx.Param)`` as a plain
dict, :func:`cell_params`), so gradients flow back to those same parameters:

- ``nnx.SimpleCell``, ``nnx.GRUCell``, ``nnx.LSTMCell``, ``nnx.OptimizedLSTMCell`` with their
  activation functions in :data:`DERIVATIVES` (sigmoid, tanh, relu): analytic transposed
  Jacobians and parameter gradients (:class:`Simple`, :class:`GRU`, :class:`LSTM`);
- any other ``nnx.RNNCellBase`` (or one of those four with another activation): autodiff
  Jacobians of one example's step, vmapped over the batch and time (:class:`Autodiff`).

flax's math, row convention (``x @ kernel``), as in ``flax.nnx.nn.recurrent``:

- SimpleCell: h' = act(x W_i + b_i + h W_h [+ h if residual]); carry h.
- GRUCell: r = gate(x W_ir + b_ir + h W_hr), z = gate(x W_iz + b_iz + h W_hz),
  n = act(x W_in + b_in + r ⊙ (h W_hn)) (no hidden bias), h' = (1 − z) ⊙ n + z ⊙ h; carry h.
- LSTMCell / OptimizedLSTMCell: gates (i, f, g, o) from x W_i + h W_h + b_h (the bias is on the
  hidden layer), c' = f ⊙ c + i ⊙ g, h' = o ⊙ act(c'); carry (c, h), flat state s = [h, c].

:class:`Masked` wraps any cell for padded batches: the mask rides in the last input channel and a
masked step is the identity map (state unchanged, Jacobian I, no parameter gradient).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, ClassVar

import jax
import jax.numpy as jnp
from flax import nnx

from .cells import Cell
from .errors import UsageError

__all__ = ["adapt", "cell_params", "Simple", "GRU", "LSTM", "Autodiff", "Masked", "DERIVATIVES"]

#: Activation functions with analytic derivatives, written in terms of the activation's output y.
DERIVATIVES: dict[Callable, Callable] = {
    jax.nn.sigmoid: lambda y: y * (1.0 - y),
    jnp.tanh: lambda y: 1.0 - y * y,
    jax.nn.relu: lambda y: (y > 0).astype(y.dtype),
}


def cell_params(cell: nnx.Module) -> dict:
    """The flax cell's ``nnx.Param`` arrays as a plain nested dict (``nnx.state(cell, nnx.Param)``)."""
    return nnx.to_pure_dict(nnx.state(cell, nnx.Param))


def _init_like(flax_type, adapter, key, dtype, **kw):
    return cell_params(flax_type(adapter.input_size, adapter.hidden_size, param_dtype=dtype, rngs=nnx.Rngs(key), **kw))


def _sum_tb(x, d):
    """Σ_{t,b} x[t, b, :]ᵀ d[t, b, :]: a kernel's gradient."""
    return jnp.einsum("tbi,tbg->ig", x, d)


# --------------------------------------------------------------------------------------------
# SimpleCell
# --------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Simple(Cell):
    """``nnx.SimpleCell``: M_t = diag(act'(a_t)) (W_hᵀ [+ I]) — the diagonal structure of
    :class:`bppsa.cells.RNN` (the Blelloch scan never forms the matrices)."""

    input_size: int
    hidden_size: int
    activation: Callable = jnp.tanh
    residual: bool = False

    def init(self, key, dtype=jnp.float32):
        return _init_like(nnx.SimpleCell, self, key, dtype, residual=self.residual)

    def step(self, params, h, x):
        a = x @ params["dense_i"]["kernel"] + params["dense_i"]["bias"] + h @ params["dense_h"]["kernel"]
        return self.activation(a + h if self.residual else a)

    def _wt(self, params):
        W = params["dense_h"]["kernel"].T
        return W + jnp.eye(self.hidden_size, dtype=W.dtype) if self.residual else W

    @property
    def has_diagonal_jacobian(self) -> bool:
        return True

    def diagonal_jacobian(self, params, s_prev, xs, s):
        return DERIVATIVES[self.activation](s), self._wt(params)

    def transposed_jacobian(self, params, s_prev, xs, s):
        return DERIVATIVES[self.activation](s)[..., :, None] * self._wt(params)

    def param_grads(self, params, s_prev, xs, s, gs):
        da = gs * DERIVATIVES[self.activation](s)
        grads = {"dense_i": {"kernel": _sum_tb(xs, da), "bias": da.sum((0, 1))},
                 "dense_h": {"kernel": _sum_tb(s_prev, da)}}
        return grads, da @ params["dense_i"]["kernel"].T


# --------------------------------------------------------------------------------------------
# GRUCell
# --------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class GRU(Cell):
    """``nnx.GRUCell`` (gates r, z, n; bias on the input layer only). With u_n = (1 − z) act'(n),
    u_r = u_n m gate'(r) (m = h W_hn), u_z = (h − n) gate'(z), the transposed Jacobian is
    M = diag(u_r) W_hrᵀ + diag(u_z) W_hzᵀ + diag(u_n r) W_hnᵀ + diag(z)."""

    input_size: int
    hidden_size: int
    gate: Callable = jax.nn.sigmoid
    activation: Callable = jnp.tanh

    gates: ClassVar[int] = 3

    def init(self, key, dtype=jnp.float32):
        return _init_like(nnx.GRUCell, self, key, dtype)

    def _terms(self, params, h, x):
        H = self.hidden_size
        gx = x @ params["dense_i"]["kernel"] + params["dense_i"]["bias"]
        gh = h @ params["dense_h"]["kernel"]
        r = self.gate(gx[..., :H] + gh[..., :H])
        z = self.gate(gx[..., H:2 * H] + gh[..., H:2 * H])
        m = gh[..., 2 * H:]
        n = self.activation(gx[..., 2 * H:] + r * m)
        return r, z, m, n

    def step(self, params, h, x):
        r, z, m, n = self._terms(params, h, x)
        return (1.0 - z) * n + z * h

    def _u(self, params, h, x):
        r, z, m, n = self._terms(params, h, x)
        dg = DERIVATIVES[self.gate]
        u_n = (1.0 - z) * DERIVATIVES[self.activation](n)
        return r, z, u_n * m * dg(r), (h - n) * dg(z), u_n

    def transposed_jacobian(self, params, s_prev, xs, s):
        H = self.hidden_size
        r, z, u_r, u_z, u_n = self._u(params, s_prev, xs)
        W = params["dense_h"]["kernel"].reshape(H, 3, H)  # (in j, gate, out i)
        M = jnp.einsum("...gi,jgi->...ij", jnp.stack([u_r, u_z, u_n * r], axis=-2), W)
        return M + z[..., :, None] * jnp.eye(H, dtype=M.dtype)

    def param_grads(self, params, s_prev, xs, s, gs):
        r, z, u_r, u_z, u_n = self._u(params, s_prev, xs)
        da_r, da_z, da_n = gs * u_r, gs * u_z, gs * u_n
        dgx = jnp.concatenate([da_r, da_z, da_n], axis=-1)
        dgh = jnp.concatenate([da_r, da_z, da_n * r], axis=-1)
        grads = {"dense_i": {"kernel": _sum_tb(xs, dgx), "bias": dgx.sum((0, 1))},
                 "dense_h": {"kernel": _sum_tb(s_prev, dgh)}}
        return grads, dgx @ params["dense_i"]["kernel"].T


# --------------------------------------------------------------------------------------------
# LSTMCell and OptimizedLSTMCell
# --------------------------------------------------------------------------------------------

_LSTM_IN, _LSTM_H = ("ii", "if_", "ig", "io"), ("hi", "hf", "hg", "ho")


@dataclasses.dataclass(frozen=True)
class LSTM(Cell):
    """``nnx.LSTMCell`` (``optimized=False``: eight Linear layers) or ``nnx.OptimizedLSTMCell``
    (two fused ones); the same math, gates (i, f, g, o). flax's carry is (c, h); the flat state
    is s = [h, c] (2H) with the transposed Jacobian of :class:`bppsa.cells.LSTM`."""

    input_size: int
    hidden_size: int
    gate: Callable = jax.nn.sigmoid
    activation: Callable = jnp.tanh
    optimized: bool = True

    gates: ClassVar[int] = 4
    pair_state: ClassVar[bool] = True

    @property
    def state_size(self) -> int:
        return 2 * self.hidden_size

    def flatten_state(self, carry):
        c, h = carry
        return jnp.concatenate([h, c], axis=-1)

    def unflatten_state(self, s):
        H = self.hidden_size
        return s[..., H:], s[..., :H]

    def hidden(self, states):
        return states[1]

    def init(self, key, dtype=jnp.float32):
        return _init_like(nnx.OptimizedLSTMCell if self.optimized else nnx.LSTMCell, self, key, dtype)

    def _fused(self, params):
        """(W_x (I, 4H), W_h (H, 4H), b (4H,)) in gate order (i, f, g, o)."""
        if self.optimized:
            return params["dense_i"]["kernel"], params["dense_h"]["kernel"], params["dense_h"]["bias"]
        cat = lambda names, leaf: jnp.concatenate([params[n][leaf] for n in names], axis=-1)
        return cat(_LSTM_IN, "kernel"), cat(_LSTM_H, "kernel"), cat(_LSTM_H, "bias")

    def _gates(self, params, h, x):
        H = self.hidden_size
        Wx, Wh, b = self._fused(params)
        a = x @ Wx + h @ Wh + b
        i, f, o = (self.gate(a[..., k * H:(k + 1) * H]) for k in (0, 1, 3))
        return i, f, self.activation(a[..., 2 * H:3 * H]), o

    def step(self, params, carry, x):
        c, h = carry
        i, f, g, o = self._gates(params, h, x)
        c_new = f * c + i * g
        return c_new, o * self.activation(c_new)

    def _terms(self, params, s_prev, xs, s):
        H = self.hidden_size
        h, c = s_prev[..., :H], s_prev[..., H:]
        i, f, g, o = self._gates(params, h, xs)
        dg, da = DERIVATIVES[self.gate], DERIVATIVES[self.activation]
        tc = self.activation(s[..., H:])
        k = o * da(tc)  # ∂h'/∂c'
        p = (g * dg(i), c * dg(f), i * da(g))  # ∂c'/∂a_i, ∂c'/∂a_f, ∂c'/∂a_g
        return f, k, p, tc * dg(o)  # the last: ∂h'/∂a_o

    def transposed_jacobian(self, params, s_prev, xs, s):
        H = self.hidden_size
        f, k, p, q = self._terms(params, s_prev, xs, s)
        W = self._fused(params)[1].reshape(H, 4, H)  # (in j, gate, out m)
        Uc = jnp.stack(p + (jnp.zeros_like(q),), axis=-2)
        Uh = jnp.stack(tuple(k * pq for pq in p) + (q,), axis=-2)
        eye = jnp.eye(H, dtype=q.dtype)
        top = jnp.concatenate([jnp.einsum("...gm,jgm->...mj", Uh, W), (k * f)[..., :, None] * eye], axis=-1)
        bottom = jnp.concatenate([jnp.einsum("...gm,jgm->...mj", Uc, W), f[..., :, None] * eye], axis=-1)
        return jnp.concatenate([top, bottom], axis=-2)

    def param_grads(self, params, s_prev, xs, s, gs):
        H = self.hidden_size
        f, k, p, q = self._terms(params, s_prev, xs, s)
        g_h, g_c = gs[..., :H], gs[..., H:]
        dc = g_c + g_h * k
        da = jnp.concatenate([dc * p[0], dc * p[1], dc * p[2], g_h * q], axis=-1)
        dWx, dWh, db = _sum_tb(xs, da), _sum_tb(s_prev[..., :H], da), da.sum((0, 1))
        dx = da @ self._fused(params)[0].T
        if self.optimized:
            return {"dense_i": {"kernel": dWx}, "dense_h": {"kernel": dWh, "bias": db}}, dx
        grads = {n: {"kernel": dWx[:, j * H:(j + 1) * H]} for j, n in enumerate(_LSTM_IN)}
        grads |= {n: {"kernel": dWh[:, j * H:(j + 1) * H], "bias": db[j * H:(j + 1) * H]}
                  for j, n in enumerate(_LSTM_H)}
        return grads, dx


# --------------------------------------------------------------------------------------------
# Any nnx.RNNCellBase
# --------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Autodiff(Cell):
    """Any ``nnx.RNNCellBase`` by autodiff: the flat state s (B, S) is the carry's leaves
    flattened per example (``hidden_size`` is S); the Jacobian of one example's step
    (``jax.jacrev``, the cell called on a batch of one) is vmapped over the batch and time, so
    rows are independent by construction. ``params`` is ``nnx.state(cell, nnx.Param)``.
    """

    graphdef: Any
    params_def: Any  # the treedef of nnx.state(cell, nnx.Param)
    param_shapes: tuple
    carry_def: Any  # the treedef of the carry
    carry_shapes: tuple  # each carry leaf's shape without the batch axis
    input_size: int
    hidden_size: int  # S

    def init(self, key, dtype=jnp.float32):
        keys = jax.random.split(key, max(len(self.param_shapes), 1))
        leaves = [0.1 * jax.random.normal(k, s, dtype) for k, s in zip(keys, self.param_shapes)]
        return jax.tree.unflatten(self.params_def, leaves)

    def carry(self, s):
        """(..., S) -> the flax carry, each leaf (..., *shape)."""
        leaves, start = [], 0
        for shape in self.carry_shapes:
            size = math.prod(shape)
            leaves.append(s[..., start:start + size].reshape(s.shape[:-1] + shape))
            start += size
        return jax.tree.unflatten(self.carry_def, leaves)

    def flat(self, carry, batch_ndim=1):
        return jnp.concatenate([leaf.reshape(leaf.shape[:batch_ndim] + (-1,)) for leaf in jax.tree.leaves(carry)],
                               axis=-1)

    def call(self, params, s, x):
        """The flax cell on flat state s (B, S), x (B, I) -> (flat new state, output)."""
        carry, y = nnx.merge(self.graphdef, params)(self.carry(s), x)
        return self.flat(carry), y

    def step(self, params, s, x):
        return self.call(params, s, x)[0]

    def outputs(self, params, s_prev, xs):
        """The cell's outputs y_t (T, B, ...) from the states before each step (one parallel pass)."""
        return jax.vmap(lambda s, x: self.call(params, s, x)[1])(s_prev, xs)

    def transposed_jacobian(self, params, s_prev, xs, s):
        def one(h, x):  # one example: (S,), (I,) -> (S, S)
            return jax.jacrev(lambda hh: self.step(params, hh[None], x[None])[0])(h)

        return jax.vmap(jax.vmap(one))(s_prev, xs)

    def param_grads(self, params, s_prev, xs, s, gs):
        def one(p, h, x):  # one example, so rows cannot mix
            return self.step(p, h[None], x[None])[0]

        steps = jax.vmap(jax.vmap(one, in_axes=(None, 0, 0)), in_axes=(None, 0, 0))
        _, vjp = jax.vjp(lambda p, x: steps(p, s_prev, x), params, xs)
        return vjp(gs)


# --------------------------------------------------------------------------------------------
# Padded batches
# --------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Masked(Cell):
    """``inner`` with a step mask m in the last input channel (xs: (T, B, I + 1), m ∈ {0, 1}):
    s_t = f(s_{t-1}, x_t) where m_t = 1, s_{t-1} where m_t = 0, so a padded step's transposed
    Jacobian is the identity and it adds nothing to the parameter or input gradients."""

    inner: Cell

    @property
    def input_size(self):
        return None if self.inner.input_size is None else self.inner.input_size + 1

    @property
    def hidden_size(self):
        return self.inner.hidden_size

    @property
    def gates(self):
        return self.inner.gates

    @property
    def pair_state(self):
        return self.inner.pair_state

    @property
    def state_size(self):
        return self.inner.state_size

    def flatten_state(self, h):
        return self.inner.flatten_state(h)

    def unflatten_state(self, s):
        return self.inner.unflatten_state(s)

    def hidden(self, states):
        return self.inner.hidden(states)

    def init(self, key, dtype=jnp.float32):
        return self.inner.init(key, dtype)

    def step(self, params, h, x):
        keep = x[..., -1:] > 0
        new = self.inner.step(params, h, x[..., :-1])
        return jax.tree.map(lambda a, b: jnp.where(keep, a, b), new, h)

    def transposed_jacobian(self, params, s_prev, xs, s):
        M = self.inner.transposed_jacobian(params, s_prev, xs[..., :-1], s)
        return jnp.where(xs[..., -1:, None] > 0, M, jnp.eye(M.shape[-1], dtype=M.dtype))

    def param_grads(self, params, s_prev, xs, s, gs):
        m = xs[..., -1:] > 0
        dp, dx = self.inner.param_grads(params, s_prev, xs[..., :-1], s, jnp.where(m, gs, 0))
        return dp, jnp.concatenate([jnp.where(m, dx, 0), jnp.zeros_like(dx[..., :1])], axis=-1)


# --------------------------------------------------------------------------------------------
# Choosing an adapter
# --------------------------------------------------------------------------------------------

def _analytic(flax_cell):
    """The analytic adapter for a flax cell, or None (another type, or an activation whose
    derivative is not in :data:`DERIVATIVES`)."""
    t, c = type(flax_cell), flax_cell
    if t is nnx.SimpleCell and c.activation_fn in DERIVATIVES:
        return Simple(c.in_features, c.hidden_features, c.activation_fn, bool(c.residual))
    if {getattr(c, "gate_fn", None), getattr(c, "activation_fn", None)} <= DERIVATIVES.keys():
        if t is nnx.GRUCell:
            return GRU(c.in_features, c.hidden_features, c.gate_fn, c.activation_fn)
        if t in (nnx.LSTMCell, nnx.OptimizedLSTMCell):
            return LSTM(c.in_features, c.hidden_features, c.gate_fn, c.activation_fn, t is nnx.OptimizedLSTMCell)
    return None


def adapt(flax_cell, carry, input_size: int, *, autodiff: bool = False) -> Cell:
    """The :class:`bppsa.cells.Cell` that runs ``flax_cell`` (an ``nnx.RNNCellBase``) with
    parameters :func:`cell_params` (analytic cells) or ``nnx.state(cell, nnx.Param)``
    (:class:`Autodiff`). ``carry``: an example carry (leaves (B, ...)), for the generic cell's
    state layout; ``autodiff=True`` forces the generic cell."""
    cell = None if autodiff else _analytic(flax_cell)
    if cell is not None:
        return cell
    graphdef, params, rest = nnx.split(flax_cell, nnx.Param, ...)
    if jax.tree.leaves(rest):
        raise UsageError(f"bppsa.nn.RNN runs a {type(flax_cell).__name__} only when all its state is nnx.Param; "
                         f"it also holds {sorted(str(p) for p, _ in rest.flat_state())}")
    leaves, carry_def = jax.tree.flatten(carry)
    shapes = tuple(tuple(leaf.shape[1:]) for leaf in leaves)
    return Autodiff(graphdef, jax.tree.structure(params), tuple(tuple(p.shape) for p in jax.tree.leaves(params)),
                    carry_def, shapes, input_size, sum(math.prod(s) for s in shapes))


def params_of(cell: Cell, flax_cell):
    """The parameter pytree ``cell`` (from :func:`adapt`) takes, read from ``flax_cell``."""
    return nnx.state(flax_cell, nnx.Param) if isinstance(cell, Autodiff) else cell_params(flax_cell)
