"""flax's recurrent cells as :class:`bppsa.cells.Cell`s, and the masked step of padded batches.

:func:`adapt` turns an ``nnx.RNNCellBase`` into a cell :func:`bppsa.rnn` can run, whose parameter
pytree is the flax cell's own ``nnx.Param`` arrays (``nnx.state(cell, nnx.Param)`` as a plain
dict, :func:`cell_params`), so gradients flow back to those same parameters:

- ``nnx.SimpleCell``, ``nnx.GRUCell``, ``nnx.LSTMCell``, ``nnx.OptimizedLSTMCell`` with
  activation functions bppsa knows (sigmoid, tanh, relu): :class:`Flax`, whose maths is one of
  :mod:`bppsa.cells` (written once there) with flax's conventions as fields; this module only
  maps parameters between flax's layout and the cell's;
- any other ``nnx.RNNCellBase`` (or one of those four with another activation): autodiff
  Jacobians of one example's step, vmapped over the batch and time (:class:`Autodiff`).

flax's conventions, row convention (``x @ kernel``), as in ``flax.nnx.nn.recurrent``:

- SimpleCell = ``cells.RNN(hidden_bias=False, residual=...)``: h' = act(x W_i + b_i + h W_h [+ h]).
- GRUCell = ``cells.GRU(hidden_bias=False)``: the hidden layer has no bias.
- LSTMCell / OptimizedLSTMCell = ``cells.LSTM(input_bias=False)``: the bias is on the hidden
  layer; the carry is (c, h) where bppsa's is (h, c); the flat state is s = [h, c] for both.

:class:`Masked` wraps any cell for padded batches: the mask rides in the last input channel and a
masked step is the identity map (state unchanged, Jacobian I, no parameter gradient).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from . import cells
from .cells import Cell
from .errors import UsageError

__all__ = ["adapt", "cell_params", "params_of", "Flax", "Autodiff", "Masked", "ACTIVATION_NAMES"]

#: flax's activation functions that have a name in :data:`bppsa.cells.ACTIVATIONS`.
ACTIVATION_NAMES: dict[Any, str] = {jnp.tanh: "tanh", jax.nn.sigmoid: "sigmoid", jax.nn.relu: "relu"}

_LSTM_IN, _LSTM_H = ("ii", "if_", "ig", "io"), ("hi", "hf", "hg", "ho")
_FUSED = {"W_x": (("dense_i", "kernel"),), "b_x": (("dense_i", "bias"),), "W_h": (("dense_h", "kernel"),)}
#: Where each of the bppsa cell's parameters lives in the flax cell: a list of (layer, leaf),
#: concatenated along the last axis (LSTMCell keeps one Linear per gate).
LAYOUTS: dict[str, dict[str, tuple[tuple[str, str], ...]]] = {
    "simple": _FUSED,
    "gru": _FUSED,
    "optimized_lstm": {"W_x": (("dense_i", "kernel"),), "W_h": (("dense_h", "kernel"),),
                       "b_h": (("dense_h", "bias"),)},
    "lstm": {"W_x": tuple((n, "kernel") for n in _LSTM_IN), "W_h": tuple((n, "kernel") for n in _LSTM_H),
             "b_h": tuple((n, "bias") for n in _LSTM_H)},
}
_FLAX_TYPES = {"simple": nnx.SimpleCell, "gru": nnx.GRUCell, "lstm": nnx.LSTMCell,
               "optimized_lstm": nnx.OptimizedLSTMCell}


def cell_params(cell: nnx.Module) -> dict:
    """The flax cell's ``nnx.Param`` arrays as a plain nested dict (``nnx.state(cell, nnx.Param)``)."""
    return nnx.to_pure_dict(nnx.state(cell, nnx.Param))


class _Wrapper(Cell):
    """A cell around another (:attr:`wrapped`): its sizes, gate count and state layout are the
    wrapped cell's."""

    @property
    def wrapped(self) -> Cell:
        raise NotImplementedError

    @property
    def input_size(self):  # pyright: ignore[reportIncompatibleVariableOverride]  (a wrapper: the wrapped cell's value)
        return self.wrapped.input_size

    @property
    def hidden_size(self):  # pyright: ignore[reportIncompatibleVariableOverride]  (a wrapper: the wrapped cell's value)
        return self.wrapped.hidden_size

    @property
    def gates(self):  # pyright: ignore[reportIncompatibleVariableOverride]  (a wrapper: the wrapped cell's value)
        return self.wrapped.gates

    @property
    def pair_state(self):  # pyright: ignore[reportIncompatibleVariableOverride]  (a wrapper: the wrapped cell's value)
        return self.wrapped.pair_state

    @property
    def state_size(self):
        return self.wrapped.state_size


@dataclasses.dataclass(frozen=True)
class Flax(_Wrapper):
    """One of flax's four cells: the maths of ``core`` (a :mod:`bppsa.cells` cell with flax's
    conventions as its fields), the parameters in flax's layout ``layout`` (a key of
    :data:`LAYOUTS`). Gradients are the core's, mapped back to flax's leaves."""

    core: Cell
    layout: str

    def __post_init__(self):
        if self.layout not in LAYOUTS:
            raise UsageError(f"layout must be one of {list(LAYOUTS)}; got {self.layout!r}")

    @property
    def wrapped(self) -> Cell:
        return self.core

    @property
    def has_diagonal_jacobian(self) -> bool:
        return self.core.has_diagonal_jacobian

    def core_params(self, params) -> dict:
        """flax's parameter dict -> the core cell's."""
        out = {}
        for k, where in LAYOUTS[self.layout].items():
            parts = [params[layer][leaf] for layer, leaf in where]
            out[k] = jnp.concatenate(parts, axis=-1) if len(parts) > 1 else parts[0]
        return out

    def flax_grads(self, grads) -> dict:
        """The core cell's parameter gradients -> flax's layout."""
        out: dict = {}
        for k, where in LAYOUTS[self.layout].items():
            for (a, b), part in zip(where, jnp.split(grads[k], len(where), axis=-1)):
                out.setdefault(a, {})[b] = part
        return out

    def init(self, key, dtype=jnp.float32):
        kw = {"residual": getattr(self.core, "residual", False)} if self.layout == "simple" else {}
        return cell_params(_FLAX_TYPES[self.layout](self.input_size, self.hidden_size, param_dtype=dtype,
                                                    rngs=nnx.Rngs(key), **kw))

    def flatten_state(self, carry):
        return jnp.concatenate([carry[1], carry[0]], axis=-1) if self.pair_state else carry

    def unflatten_state(self, s):
        if not self.pair_state:
            return s
        h, c = self.core.unflatten_state(s)
        return c, h

    def hidden(self, states):
        return states[1] if self.pair_state else states

    def step(self, params, carry, x):
        state = (carry[1], carry[0]) if self.pair_state else carry
        new = self.core.step(self.core_params(params), state, x)
        return (new[1], new[0]) if self.pair_state else new

    def transposed_jacobian(self, params, s_prev, xs, s):
        return self.core.transposed_jacobian(self.core_params(params), s_prev, xs, s)

    def diagonal_jacobian(self, params, s_prev, xs, s):
        return self.core.diagonal_jacobian(self.core_params(params), s_prev, xs, s)

    def param_grads(self, params, s_prev, xs, s, gs):
        dp, dx = self.core.param_grads(self.core_params(params), s_prev, xs, s, gs)
        return self.flax_grads(dp), dx


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

    def _step_one(self, params, h, x):
        """One example: (S,), (I,) -> (S,) (the cell called on a batch of one)."""
        return self.step(params, h[None], x[None])[0]

    def transposed_jacobian(self, params, s_prev, xs, s):
        return cells.autodiff_jacobian(self._step_one, params, s_prev, xs)

    def param_grads(self, params, s_prev, xs, s, gs):
        return cells.autodiff_param_grads(self._step_one, params, s_prev, xs, gs)


# --------------------------------------------------------------------------------------------
# Padded batches
# --------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Masked(_Wrapper):
    """``inner`` with a step mask m in the last input channel (xs: (T, B, I + 1), m ∈ {0, 1}):
    s_t = f(s_{t-1}, x_t) where m_t = 1, s_{t-1} where m_t = 0, so a padded step's transposed
    Jacobian is the identity and it adds nothing to the parameter or input gradients."""

    inner: Cell

    @property
    def wrapped(self) -> Cell:
        return self.inner

    @property
    def input_size(self):  # pyright: ignore[reportIncompatibleVariableOverride]  (a wrapper: the wrapped cell's value)
        return None if self.inner.input_size is None else self.inner.input_size + 1

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
    """The :class:`Flax` adapter for one of flax's four cells, or None (another type, or an
    activation without a name in :data:`ACTIVATION_NAMES`)."""
    layout = next((k for k, t in _FLAX_TYPES.items() if type(flax_cell) is t), None)
    if layout is None:
        return None
    fns = [flax_cell.activation_fn] + ([] if layout == "simple" else [flax_cell.gate_fn])
    if not all(f in ACTIVATION_NAMES for f in fns):
        return None
    I, H, act = flax_cell.in_features, flax_cell.hidden_features, ACTIVATION_NAMES[fns[0]]
    if layout == "simple":
        core: Cell = cells.RNN(I, H, act, hidden_bias=False, residual=bool(flax_cell.residual))
    elif layout == "gru":
        core = cells.GRU(I, H, ACTIVATION_NAMES[fns[1]], act, hidden_bias=False)
    else:
        core = cells.LSTM(I, H, ACTIVATION_NAMES[fns[1]], act, input_bias=False)
    return Flax(core, layout)


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
