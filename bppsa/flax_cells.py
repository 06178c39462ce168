"""flax's recurrent cells as :class:`bppsa.cells.Cell`s, and the masked step of padded batches.

:func:`plan` decides how :class:`bppsa.nn.RNN` runs a cell that ``nnx.RNN`` can drive (an
``nnx.RNNCellBase`` or any module with ``__call__``, ``initialize_carry`` and
``num_feature_axes``); :func:`adapt` is its cell. Gradients flow back to the cell's own
``nnx.Param`` arrays:

- ``nnx.SimpleCell``, ``nnx.GRUCell``, ``nnx.LSTMCell``, ``nnx.OptimizedLSTMCell`` with
  activation functions bppsa knows (sigmoid, tanh, relu), computing in one dtype:
  :class:`Flax`, whose maths is one of :mod:`bppsa.cells` (written once there) with flax's
  conventions as fields; this module only maps parameters between flax's layout and the cell's
  (:func:`cell_params`);
- any other cell (or one of those four with another activation or in mixed precision):
  autodiff Jacobians of one example's step, vmapped over the batch and time
  (:class:`Autodiff`), with the non-Param state a step reads but never changes as constants;
- a cell whose step changes its own state (draws from an RNG stream, updates batch
  statistics), reads non-float state or has state scanned over time: no BPPSA backward
  (:func:`plan` says why; :class:`bppsa.nn.RNN` then runs ``nnx.RNN``'s scan).

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
from flax.nnx import filterlib

from . import cells
from .cells import Cell
from .errors import UsageError

__all__ = ["adapt", "plan", "cell_params", "Flax", "Autodiff", "Masked", "ACTIVATION_NAMES"]

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
    """Any cell ``nnx.RNN`` can drive, by autodiff: the flat state s (B, S) is the carry's leaves
    flattened per example (``hidden_size`` is S, in the carry's promoted dtype; each leaf goes back
    to its own dtype before the cell sees it, so the cell computes in its own dtypes, mixed
    precision included); the Jacobian of one example's step (``jax.jacrev``, the cell called on a
    batch of one) is vmapped over the batch and time, so rows are independent by construction.

    ``params`` is ``{"params": nnx.state(cell, nnx.Param), "consts": (...)}``: the Params, and the
    non-Param state a step reads but never changes (batch statistics in eval mode, a stored
    buffer), which is differentiable like the Params. Non-Param state a step neither reads nor
    changes (stored ``rngs``, a deterministic Dropout's) is rebuilt as placeholders
    (:func:`plan` decides which is which). xs (T, B, I) are the inputs' feature axes flattened
    (``feature_shape`` restores them).
    """

    graphdef: Any
    params_def: Any  # the treedef of {"params": ..., "consts": ...}
    param_shapes: tuple  # ((shape, dtype), ...) of its leaves
    carry_def: Any  # the treedef of the carry
    carry_shapes: tuple  # each carry leaf's shape without the batch axis
    carry_dtypes: tuple  # each carry leaf's dtype
    input_size: int
    hidden_size: int  # S
    feature_shape: tuple = ()  # the inputs' feature axes (default: (input_size,))
    rest_def: Any = None  # the treedef of the non-Param state
    rest_slots: tuple = ()  # per non-Param leaf: k (consts[k]) or (shape, dtype) (a placeholder)

    def init(self, key, dtype=jnp.float32):
        keys = jax.random.split(key, max(len(self.param_shapes), 1))
        leaves = [0.1 * jax.random.normal(k, s, dtype) for k, (s, _) in zip(keys, self.param_shapes)]
        return jax.tree.unflatten(self.params_def, leaves)

    def carry(self, s):
        """(..., S) -> the flax carry, each leaf (..., *shape) in its own dtype."""
        leaves, start = [], 0
        for shape, dtype in zip(self.carry_shapes, self.carry_dtypes):
            size = math.prod(shape)
            leaves.append(s[..., start:start + size].reshape(s.shape[:-1] + shape).astype(dtype))
            start += size
        return jax.tree.unflatten(self.carry_def, leaves)

    def flat(self, carry, batch_ndim=1):
        leaves = jax.tree.leaves(carry)
        dtype = jnp.result_type(*self.carry_dtypes)
        return jnp.concatenate([leaf.reshape(leaf.shape[:batch_ndim] + (-1,)).astype(dtype) for leaf in leaves],
                               axis=-1)

    def module(self, params):
        """The flax cell with these parameters (and constants) merged in."""
        consts = params["consts"]
        rest = [consts[slot] if isinstance(slot, int) else _placeholder(*slot) for slot in self.rest_slots]
        states = [params["params"]] + ([jax.tree.unflatten(self.rest_def, rest)] if self.rest_def is not None else [])
        return nnx.merge(self.graphdef, *states)

    def call(self, params, s, x):
        """The flax cell on flat state s (B, S), x (B, I) -> (flat new state, output)."""
        shape = self.feature_shape or (self.input_size,)
        carry, y = self.module(params)(self.carry(s), x.reshape(x.shape[:-1] + shape))
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


def _placeholder(shape, dtype):
    """A stand-in for state the step never reads (a key array for key dtypes)."""
    if jnp.issubdtype(dtype, jax.dtypes.prng_key):
        return jnp.broadcast_to(jax.random.key(0), shape)
    return jnp.zeros(shape, dtype)


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

def _analytic(flax_cell, carry=None, x_dtype=None):
    """The :class:`Flax` adapter for one of flax's four cells (that exact type) with activation
    functions named in :data:`ACTIVATION_NAMES` that computes in one dtype (carry, parameters,
    and the cell's ``dtype``; mixed precision goes to :class:`Autodiff`, which keeps flax's own
    promotion); None otherwise."""
    layout = next((k for k, t in _FLAX_TYPES.items() if type(flax_cell) is t), None)
    if layout is None:
        return None
    fns = [flax_cell.activation_fn] + ([] if layout == "simple" else [flax_cell.gate_fn])
    if not all(f in ACTIVATION_NAMES for f in fns):
        return None
    if carry is not None:
        leaves = jax.tree.leaves(carry) + jax.tree.leaves(cell_params(flax_cell))
        dtypes = {jnp.dtype(jnp.result_type(a)) for a in leaves}
        computes = flax_cell.dtype or (jnp.result_type(x_dtype, *dtypes) if x_dtype is not None else None)
        if len(dtypes) != 1 or (computes is not None and jnp.dtype(computes) not in dtypes):
            return None
    I, H, act = flax_cell.in_features, flax_cell.hidden_features, ACTIVATION_NAMES[fns[0]]
    if layout == "simple":
        core: Cell = cells.RNN(I, H, act, hidden_bias=False, residual=bool(flax_cell.residual))
    elif layout == "gru":
        core = cells.GRU(I, H, ACTIVATION_NAMES[fns[1]], act, hidden_bias=False)
    else:
        core = cells.LSTM(I, H, ACTIVATION_NAMES[fns[1]], act, input_bias=False)
    return Flax(core, layout)


def _variables(state):
    """[(path, Variable)] of an nnx State, in its leaves' order."""
    flat, _ = jax.tree_util.tree_flatten_with_path(state, is_leaf=lambda v: isinstance(v, nnx.Variable))
    return [(tuple(getattr(k, "key", getattr(k, "idx", k)) for k in path), v) for path, v in flat]


def _axis_of(broadcast_rngs, state_axes):
    """path, Variable -> the axis ``nnx.RNN`` scans it over: None (broadcast), nnx.Carry, or an int."""
    rules = [(nnx.All(nnx.RngState, broadcast_rngs), None)] + list((state_axes or {}).items())
    preds = [(filterlib.to_predicate(f), axis) for f, axis in rules]
    return lambda path, var: next((axis for pred, axis in preds if pred(path, var)), nnx.Carry)


def _uses(graphdef, params, rest, carry, x):
    """For each leaf of ``rest`` (the non-Param state): whether one step changes it and whether
    it reads it (from the step's jaxpr: an unchanged leaf is returned as the very input)."""
    def pure(params, rest, carry, x):
        module = nnx.merge(graphdef, params, rest)
        carry, y = module(carry, x)
        return nnx.split(module, nnx.Param, ...)[2], carry, y

    jaxpr = jax.make_jaxpr(pure)(params, rest, carry, x).jaxpr
    n_params, n_rest = len(jax.tree.leaves(params)), len(jax.tree.leaves(rest))
    ins = jaxpr.invars[n_params:n_params + n_rest]
    outs = jaxpr.outvars[:n_rest]
    used = {id(v) for eqn in jaxpr.eqns for v in eqn.invars} | {id(v) for v in jaxpr.outvars[n_rest:]}
    return [o is not i for i, o in zip(ins, outs)], [id(i) in used for i in ins]


def plan(flax_cell, carry, x, *, autodiff=False, broadcast_rngs=None, state_axes=None):
    """How :class:`bppsa.nn.RNN` runs ``flax_cell`` with a BPPSA backward: ``(cell, params)``
    (a :class:`Flax` or :class:`Autodiff` cell and its parameter pytree, read from the flax cell),
    or a string saying why no exact BPPSA backward exists for it (then ``nnx.RNN``'s scan runs).

    ``carry``: the initial carry (leaves (B, ...)); ``x``: one step's input (B, *features);
    ``broadcast_rngs``, ``state_axes``: as for ``nnx.RNN``. Non-Param state: broadcast state
    (``broadcast_rngs``, ``state_axes`` entries None) is the same at every step; other state a
    step reads but never changes is a constant; state a step changes (an RNG stream it draws
    from, batch statistics, a counter), state it scans over time (an int in ``state_axes``) and
    non-float state it reads (an RNG key) have no BPPSA backward here.
    """
    cell = None if autodiff else _analytic(flax_cell, carry, jnp.result_type(x))
    if cell is not None:
        return cell, cell_params(flax_cell)
    axis_of = _axis_of(broadcast_rngs, state_axes)
    graphdef, params, rest = nnx.split(flax_cell, nnx.Param, ...)
    for path, var in _variables(params) + _variables(rest):
        if isinstance(axis_of(path, var), int):
            return f"state_axes scans {'.'.join(map(str, path))} over the time axis"
    variables = _variables(rest)
    changed, read = _uses(graphdef, params, rest, carry, x)
    slots, consts = [], []
    for (path, var), change, reads in zip(variables, changed, read):
        where, value = f"{'.'.join(map(str, path))} ({type(var).__name__})", var.get_value()
        if change and axis_of(path, var) is not None:
            return f"each step updates {where}, so a step is not a function of the state alone"
        if not reads:
            slots.append((tuple(value.shape), value.dtype))
        elif not jnp.issubdtype(value.dtype, jnp.floating):
            return f"each step reads {where}, a {value.dtype} array (the same at every step)"
        else:
            slots.append(len(consts))
            consts.append(value)
    full = {"params": params, "consts": tuple(consts)}
    leaves, carry_def = jax.tree.flatten(carry)
    shapes = tuple(tuple(leaf.shape[1:]) for leaf in leaves)
    feature_shape = tuple(x.shape[1:])
    return Autodiff(graphdef, jax.tree.structure(full),
                    tuple((tuple(p.shape), jnp.result_type(p)) for p in jax.tree.leaves(full)),
                    carry_def, shapes, tuple(jnp.result_type(leaf) for leaf in leaves),
                    math.prod(feature_shape), sum(math.prod(s) for s in shapes), feature_shape,
                    jax.tree.structure(rest) if variables else None, tuple(slots)), full


def adapt(flax_cell, carry, x, *, autodiff: bool = False) -> Cell:
    """The :class:`bppsa.cells.Cell` that runs ``flax_cell`` (:func:`plan`'s; a UsageError with
    its reason where there is none). ``carry``: an example carry (leaves (B, ...); None is
    enough for flax's four cells), ``x``: an example step input (B, *features), or the input
    size (then x is zeros of shape (B, I))."""
    if carry is None and not autodiff:
        cell = _analytic(flax_cell)
        if cell is not None:
            return cell
    if isinstance(x, int):
        x = jnp.zeros((jax.tree.leaves(carry)[0].shape[0], x), jnp.result_type(*jax.tree.leaves(carry)))
    planned = plan(flax_cell, carry, x, autodiff=autodiff)
    if isinstance(planned, str):
        raise UsageError(f"no BPPSA backward for {type(flax_cell).__name__}: {planned}")
    return planned[0]
