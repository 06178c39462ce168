"""flax's recurrent cells as :class:`bppsa.cells.Cell` objects, and the masked step of padded batches.

:func:`plan` decides how :class:`bppsa.nn.RNN` runs a cell that ``nnx.RNN`` can drive (an ``nnx.RNNCellBase``
or any module with ``__call__``, ``initialize_carry`` and ``num_feature_axes``); :func:`adapt` is its
cell. Gradients flow back to the cell's own ``nnx.Param`` arrays:

- ``nnx.SimpleCell``, ``nnx.GRUCell``, ``nnx.LSTMCell``, ``nnx.OptimizedLSTMCell`` with activation
  functions bppsa knows (sigmoid, tanh, relu), computing in one dtype: :class:`Flax`, whose maths is
  one of :mod:`bppsa.cells` with flax's conventions as fields (parameters mapped: :func:`cell_params`);
- a cell with a ``bppsa_cell()`` method (:mod:`bppsa.nn.block_cells`'s, in one dtype): the
  :mod:`bppsa.cells.block` cell it returns, its ``nnx.Param`` arrays in that cell's layout;
- any other cell (or one of those four with another activation or in mixed precision): autodiff
  Jacobians of one example's step, vmapped over the batch and time (:class:`Autodiff`), with the
  non-Param state a step reads but never changes as constants;
- a cell whose step changes its own state (draws from an RNG stream, updates batch statistics), reads
  non-float state or has state scanned over time: no BPPSA backward (:func:`plan` says why;
  :class:`bppsa.nn.RNN` then runs ``nnx.RNN``'s scan).

flax's conventions, row convention (``x @ kernel``), as in ``flax.nnx.nn.recurrent``:

- SimpleCell = ``cells.RNN(hidden_bias=False, residual=...)``: h' = act(x W_i + b_i + h W_h [+ h]).
- GRUCell = ``cells.GRU(hidden_bias=False)``: the hidden layer has no bias.
- LSTMCell / OptimizedLSTMCell = ``cells.LSTM(input_bias=False)``: the bias is on the hidden layer;
  the carry is (c, h) where bppsa's is (h, c); the flat state is s = [h, c] for both.

:class:`Masked` wraps any cell for padded batches: a masked step (mask in the last input channel) is
the identity map (state unchanged, Jacobian I, no parameter gradient)."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from bppsa import cells
from bppsa.cells import Cell
from bppsa.cells.base import analytic_adjoint
from bppsa.cells.structure import Blocks, Dense, Structure, jacobian_blocks, on_params, structure_of
from bppsa.errors import UsageError, as_int
from bppsa.nn import _state as _flax_state

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
    """The flax cell's ``nnx.Param`` arrays as a plain nested dict (``nnx.state(cell, nnx.Param)``).

    Args:
      cell: an ``nnx.Module``.

    Returns:
      A nested dict of arrays, keyed by layer and leaf (``{"dense_i": {"kernel": ...}, ...}``).
    """
    return nnx.to_pure_dict(nnx.state(cell, nnx.Param))


class _Wrapper(Cell):
    """A cell around another (:attr:`wrapped`): its sizes, gate count and state layout are the
    wrapped cell's; a subclass defines ``project`` and ``step_projected``, its step is theirs."""

    def step(self, params, h, x):
        return self.step_projected(params, h, self.project(params, x))

    @property
    def wrapped(self) -> Cell:
        raise NotImplementedError

    # the wrapped cell's values (properties, where Cell has fields)
    input_size = property(lambda self: self.wrapped.input_size)  # pyright: ignore[reportAssignmentType]
    hidden_size = property(lambda self: self.wrapped.hidden_size)  # pyright: ignore[reportAssignmentType]
    gates = property(lambda self: getattr(self.wrapped, "gates", 1))  # the plan's cost input (Affine cells)
    pair_state = property(lambda self: self.wrapped.pair_state)  # pyright: ignore[reportAssignmentType]

    @property
    def state_size(self):
        return self.wrapped.state_size

    @property
    def display_name(self) -> str:
        return self.wrapped.display_name


_LOOP = "core, loop form"  # the key of Flax.loop_params' dict


def _on_core(name, grads=False) -> Any:  # a Flax method: the core's, on its parameters; grads: it returns dparams
    def method(self, params, *args):  # (or a tuple that starts with them), mapped to flax's layout
        out, to_flax = getattr(self.core, name)(self.core_params(params), *args), self.flax_grads
        return out if not grads else to_flax(out) if isinstance(out, dict) else (to_flax(out[0]), *out[1:])
    return method


@dataclasses.dataclass(frozen=True)
class Flax(_Wrapper):
    """One of flax's four cells: the maths of ``core`` (a :mod:`bppsa.cells` cell with flax's
    conventions as its fields), the parameters in flax's layout ``layout`` (a key of
    :data:`LAYOUTS`). Gradients are the core's, mapped back to flax's leaves.

    Args:
      core: the :mod:`bppsa.cells` cell (RNN, GRU or LSTM) with flax's conventions as its fields.
      layout: "simple", "gru", "lstm" or "optimized_lstm", the flax cell's type and parameter layout.

    Raises:
      bppsa.errors.UsageError: ``layout`` is not a key of :data:`LAYOUTS`.
    """

    core: Cell
    layout: str

    def __post_init__(self):
        if self.layout not in LAYOUTS:
            raise UsageError(f"layout must be one of {list(LAYOUTS)}; got {self.layout!r}")

    @property
    def wrapped(self) -> Cell:
        return self.core

    @property
    def display_name(self) -> str:  # the flax cell's class, not this adapter's
        return _FLAX_TYPES[self.layout].__name__

    @property
    def jacobian_structure(self) -> Structure:  # the core's, on its parameters
        return on_params(structure_of(self.core), self.core_params)

    has_adjoint = property(lambda self: self.core.has_adjoint)  # pyright: ignore[reportAssignmentType]

    def core_params(self, params) -> dict:
        """flax's parameter dict -> the core cell's (:meth:`loop_params`' form: the core's already).

        Args:
          params: the flax cell's parameters (:func:`cell_params`), or :meth:`loop_params`' form.

        Returns:
          The core cell's parameter dict (W_x (I, G·H), W_h (H, G·H) and its bias), or its loop form.
        """
        if _LOOP in params:
            return params[_LOOP]
        out = {}
        for k, where in LAYOUTS[self.layout].items():
            parts = [params[layer][leaf] for layer, leaf in where]
            out[k] = jnp.concatenate(parts, axis=-1) if len(parts) > 1 else parts[0]
        return out

    def loop_params(self, params):
        """The core's loop parameters, mapped from flax's layout once (before the loop)."""
        return {_LOOP: self.core.loop_params(self.core_params(params))}

    @property
    def kernel_cell(self) -> Cell:  # the fused kernels run the core's steps on the same flat states
        return self.core.kernel_cell

    def kernel_params(self, params):
        return self.core.kernel_params(self.core_params(params))

    def flax_grads(self, grads) -> dict:
        """The core cell's parameter gradients -> flax's layout.

        Args:
          grads: gradients in the core cell's layout (a dict of W_x, W_h and the bias).

        Returns:
          The same gradients as a nested dict in flax's layout (per layer, per leaf), split per gate
          where flax keeps one layer per gate.
        """
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

    def unflatten_state(self, s):  # flax's LSTM carry is (c, h), the core's (h, c)
        return self.core.unflatten_state(s)[::-1] if self.pair_state else s

    def hidden(self, states):
        return states[1] if self.pair_state else states

    def project(self, params, xs):
        return self.core.project(self.core_params(params), xs)

    def step_projected(self, params, carry, u):
        new = self.core.step_projected(self.core_params(params), carry[::-1] if self.pair_state else carry, u)
        return new[::-1] if self.pair_state else new

    def step_factors(self, params, carry, u):
        carry = carry[::-1] if self.pair_state else carry
        new, factors = analytic_adjoint(self.core).step_factors(self.core_params(params), carry, u)
        return (new[::-1] if self.pair_state else new), factors

    transposed_jacobian = _on_core("transposed_jacobian")
    adjoint_step = _on_core("adjoint_step")
    adjoint_sum_inputs = _on_core("adjoint_sum_inputs")
    adjoint_sum_step = _on_core("adjoint_sum_step")
    param_grads = _on_core("param_grads", grads=True)
    adjoint_grads = _on_core("adjoint_grads", grads=True)
    adjoint_sum_result = _on_core("adjoint_sum_result", grads=True)


# --------------------------------------------------------------------------------------------
# Any nnx.RNNCellBase
# --------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Autodiff(Cell):
    """Any cell ``nnx.RNN`` can drive, by autodiff: the flat state s (B, S) is the carry's leaves
    flattened per example (in the carry's promoted dtype; each leaf goes back to its own dtype
    before the cell sees it, so the cell computes in its own dtypes, mixed precision included);
    Jacobians and parameter gradients by autodiff of the step on whole batches (so a cell that
    draws random numbers draws them as in the forward; rows must be independent, as for any cell
    ``nnx.RNN`` runs on a batch of sequences). xs (T, B, I): the inputs' feature axes flattened.

    ``params`` (:meth:`read` makes it from the flax cell) is a dict: "params", the cell's
    ``nnx.Param`` state; "consts", float non-Param state a step reads but never changes (eval-mode
    batch statistics), differentiable like the Params; "fixed", non-float state it reads and
    never changes (an RNG key), and "side", the per-step values (T, ...) of state it changes
    independently of the carry, inputs and Params (an RNG stream's count, a counter), both as
    float arrays of the same bits (:mod:`bppsa.nn._state`). With side state (``indexed``) the
    flat state's last channel counts the steps (its Jacobian is the identity there), so step t
    reads the side state's t-th value: exactly the state ``nnx.RNN``'s scan would hand it.
    State a step neither reads nor changes (stored ``rngs``) is rebuilt as placeholders.

    Made by :func:`plan`, not by hand.

    Attributes:
      graphdef: the flax cell's ``nnx.GraphDef``.
      carry_def: the treedef of the carry.
      carry_shapes: each carry leaf's shape without the batch axis.
      carry_dtypes: each carry leaf's dtype.
      input_size: I, the inputs' feature axes flattened.
      hidden_size: S, the carry's size per example, plus the step channel when ``indexed``.
      feature_shape: the inputs' feature axes (default: (input_size,)).
      rest_def: the treedef of the non-Param state (None: no non-Param state).
      rest_slots: per non-Param leaf, how it is rebuilt: ("zero", shape, dtype), ("const",), ("fixed",
        how) or ("side", how).
      indexed: whether the flat state's last channel counts the steps (side state present).
    """

    graphdef: Any
    carry_def: Any  # the treedef of the carry
    carry_shapes: tuple  # each carry leaf's shape without the batch axis
    carry_dtypes: tuple  # each carry leaf's dtype
    input_size: int
    hidden_size: int  # S: the carry's size per example, plus the step channel when indexed
    feature_shape: tuple = ()  # the inputs' feature axes (default: (input_size,))
    rest_def: Any = None  # the treedef of the non-Param state
    # per non-Param leaf: ("zero", shape, dtype) | ("const",) | ("fixed", how) | ("side", how) (how: None
    # for a float, else _flax_state.to_carrier's)
    rest_slots: tuple = ()
    indexed: bool = False

    def init(self, key, dtype=jnp.float32):
        raise UsageError("an Autodiff cell's parameters are the flax cell's own (Autodiff.read)")

    @property
    def display_name(self) -> str:  # the flax cell's class, not this adapter's
        nodes = getattr(self.graphdef, "nodes", None)
        kind = getattr(nodes[0], "type", None) if nodes else None
        return kind.__name__ if isinstance(kind, type) else "the flax cell"

    def param_spec(self, dtype=jnp.float32):
        return None

    #: (params, the side state after ``steps`` steps) from the flax cell's current state: see
    #: :func:`bppsa.nn._state.read`.
    read = _flax_state.read
    #: Set the flax cell's side state to its values after the scan (as ``nnx.RNN`` does).
    write_back = _flax_state.write_back

    def initial(self, carry):
        """The flat initial state of a carry (with the step channel at 0 when indexed).

        Args:
          carry: the flax carry, leaves (B, ...).

        Returns:
          s0 (B, S).
        """
        s = self.flat(carry)
        return jnp.concatenate([s, jnp.zeros_like(s[..., :1])], axis=-1) if self.indexed else s

    def carry(self, s):
        """(..., S) -> the flax carry, each leaf ``(..., *shape)`` in its own dtype.

        Args:
          s: (..., S) flat states (a step channel at the end, when indexed, is ignored).

        Returns:
          The carry, with the structure ``carry_def``.
        """
        leaves, start = [], 0
        for shape, dtype in zip(self.carry_shapes, self.carry_dtypes):
            size = math.prod(shape)
            leaves.append(s[..., start:start + size].reshape(s.shape[:-1] + shape).astype(dtype))
            start += size
        return jax.tree.unflatten(self.carry_def, leaves)

    def flat(self, carry, batch_ndim=1):
        """The carry's leaves flattened per example and concatenated, in their promoted dtype.

        Args:
          carry: the flax carry, leaves ``(*batch, ...)``.
          batch_ndim: the number of leading batch axes kept.

        Returns:
          ``(*batch, S')`` with S' the carry's size per example (no step channel).
        """
        dtype = jnp.result_type(*self.carry_dtypes)
        return jnp.concatenate([leaf.reshape(leaf.shape[:batch_ndim] + (-1,)).astype(dtype)
                                for leaf in jax.tree.leaves(carry)], axis=-1)

    def module(self, params, t=None):
        """The flax cell with these parameters (and the state step ``t`` reads) merged in.

        Args:
          params: the dict :meth:`read` makes ("params", and "consts", "fixed", "side" with non-Param state).
          t: the step whose side state the module reads (an int scalar; None without side state).

        Returns:
          The ``nnx.Module``.
        """
        if self.rest_def is None:
            return nnx.merge(self.graphdef, params["params"])
        it = {k: iter(params[k]) for k in ("consts", "fixed", "side")}
        rest = []
        for slot in self.rest_slots:
            if slot[0] == "zero":
                rest.append(_flax_state.placeholder(*slot[1:]))
            elif slot[0] == "const":
                rest.append(next(it["consts"]))
            else:
                value = next(it[slot[0]])
                value = value[t] if slot[0] == "side" else value
                rest.append(value if slot[1] is None else _flax_state.from_carrier(value, slot[1]))
        return nnx.merge(self.graphdef, params["params"], jax.tree.unflatten(self.rest_def, rest))

    def call(self, params, s, x):
        """The flax cell on flat state s (B, S), x (B, I) -> (flat new state, output).

        Args:
          params: the dict :meth:`read` makes.
          s: (B, S) the flat state.
          x: (B, I) the step's input, its feature axes flattened.

        Returns:
          The pair (s' (B, S), y), the flat new state and the cell's output (B, ...).
        """
        shape = self.feature_shape or (self.input_size,)
        # the step count: every row still running is at the same step (rows of a padded batch stop counting)
        t = jnp.max(s[..., -1]).astype(jnp.int32) if self.indexed else None
        carry, y = self.module(params, t)(self.carry(s), x.reshape(x.shape[:-1] + shape))
        new = self.flat(carry)
        return (jnp.concatenate([new, s[..., -1:] + 1], axis=-1) if self.indexed else new), y

    def step(self, params, s, x):
        return self.call(params, s, x)[0]

    def outputs(self, params, s_prev, xs):
        """The cell's outputs y_t (T, B, ...) from the states before each step (one parallel pass).

        Args:
          params: the dict :meth:`read` makes.
          s_prev: (T, B, S) the flat state before each step.
          xs: (T, B, I) each step's input.

        Returns:
          The outputs y_t (T, B, ...), a pytree where the cell's output is one.
        """
        return jax.vmap(lambda s, x: self.call(params, s, x)[1])(s_prev, xs)

    def transposed_jacobian(self, params, s_prev, xs, s):
        """Column j of every row's Jacobian at once: the step on the whole batch (the cell draws
        its random numbers for the batch, as in the forward), pushed forward along e_j in every
        row; rows are independent (the cell may not couple them), vmapped over j and time."""
        eye = jnp.eye(s_prev.shape[-1], dtype=s_prev.dtype)

        def at(sp, x):
            column = lambda e: jax.jvp(lambda h: self.step(params, h, x), (sp,), (jnp.broadcast_to(e, sp.shape),))[1]
            return jax.vmap(column, out_axes=-1)(eye)

        return jax.vmap(at)(s_prev, xs)

    def param_grads(self, params, s_prev, xs, s, gs):
        """One ``jax.vjp`` of the step on whole batches, vmapped over time."""
        steps = jax.vmap(lambda p, sp, x: self.step(p, sp, x), in_axes=(None, 0, 0))
        _, vjp = jax.vjp(lambda p, x: steps(p, s_prev, x), params, xs)
        return vjp(gs)


@dataclasses.dataclass(frozen=True)
class Masked(_Wrapper):
    """``inner`` with a step mask m in the last input channel (xs: (T, B, I + 1), m ∈ {0, 1}):
    s_t = f(s_{t-1}, x_t) where m_t = 1, s_{t-1} where m_t = 0, so a padded step's transposed
    Jacobian is the identity and it adds nothing to the parameter or input gradients.

    Args:
      inner: the cell run at the unmasked steps (its input size I; this cell's is I + 1).
    """

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

    def loop_params(self, params):
        """The inner cell's loop parameters: the inner steps get them as they are."""
        return self.inner.loop_params(params)

    def project(self, params, xs):  # (the inner cell's projection, the mask)
        return self.inner.project(params, xs[..., :-1]), xs[..., -1:] > 0

    def step_projected(self, params, h, u):
        new = self.inner.step_projected(params, h, u[0])
        return jax.tree.map(lambda a, b: jnp.where(u[1], a, b), new, h)

    def transposed_jacobian(self, params, s_prev, xs, s):
        M = self.inner.transposed_jacobian(params, s_prev, xs[..., :-1], s)
        return jnp.where(xs[..., -1:, None] > 0, M, jnp.eye(M.shape[-1], dtype=M.dtype))

    @property
    def jacobian_structure(self) -> Structure:  # a padded step's identity has the inner cell's blocks too
        inner = structure_of(self.inner)
        return Blocks(inner.size, self._blocks) if isinstance(inner, Blocks) else Dense()

    def _blocks(self, params, s_prev, xs, s):
        M = jacobian_blocks(self.inner, params, s_prev, xs[..., :-1], s)
        return jnp.where(xs[..., -1:, None, None] > 0, M, jnp.eye(M.shape[-1], dtype=M.dtype))

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
    structured = getattr(flax_cell, "bppsa_cell", None)  # bppsa.nn.block_cells' cells: their own cell
    fns = [] if layout is None else [flax_cell.activation_fn] + ([] if layout == "simple" else [flax_cell.gate_fn])
    if (layout is None and not callable(structured)) or not all(f in ACTIVATION_NAMES for f in fns):
        return None
    if carry is not None:
        leaves = jax.tree.leaves(carry) + jax.tree.leaves(cell_params(flax_cell))
        dtypes = {jnp.dtype(jnp.result_type(a)) for a in leaves}
        computes = flax_cell.dtype or (jnp.result_type(x_dtype, *dtypes) if x_dtype is not None else None)
        if len(dtypes) != 1 or (computes is not None and jnp.dtype(computes) not in dtypes):
            return None
    if layout is None:
        made = structured() if callable(structured) else None
        return made if isinstance(made, Cell) else None
    I, H, act = flax_cell.in_features, flax_cell.hidden_features, ACTIVATION_NAMES[fns[0]]
    if layout == "simple":
        core: Cell = cells.RNN(I, H, act, hidden_bias=False, residual=bool(flax_cell.residual))
    elif layout == "gru":
        core = cells.GRU(I, H, ACTIVATION_NAMES[fns[1]], act, hidden_bias=False)
    else:
        core = cells.LSTM(I, H, ACTIVATION_NAMES[fns[1]], act, input_bias=False)
    return Flax(core, layout)


def plan(flax_cell, carry, x, *, steps: int, autodiff=False, broadcast_rngs=None, state_axes=None):
    """How :class:`bppsa.nn.RNN` runs ``flax_cell`` with a BPPSA backward: ``(cell, params)``
    (a :class:`Flax` cell and its parameter pytree, or an :class:`Autodiff` cell and None: its
    parameters come from :meth:`Autodiff.read`), or a string saying why no exact BPPSA backward
    exists for it (then ``nnx.RNN``'s scan runs).

    Non-Param state: broadcast state (``broadcast_rngs``, ``state_axes`` entries None) is the same
    at every step; other state a step reads but never changes is a constant; state a step changes
    independently of the carry, inputs and Params (an RNG stream's count, a counter) is computed
    ahead of the scan. No BPPSA backward: state a step updates from the carry, inputs or Params
    (batch statistics in training), state scanned over time (an int in ``state_axes``).

    Args:
      flax_cell: the cell ``nnx.RNN`` would drive.
      carry: the initial carry, leaves (B, ...).
      x: one step's input ``(B, *features)``.
      steps: T, the number of steps.
      autodiff: use the :class:`Autodiff` cell even for one of flax's four cells.
      broadcast_rngs: as for ``nnx.RNN``.
      state_axes: as for ``nnx.RNN``.

    Returns:
      ``(cell, params)``, or a str saying why there is no BPPSA backward.
    """
    cell = None if autodiff else _analytic(flax_cell, carry, jnp.result_type(x))
    if cell is not None:
        return cell, cell_params(flax_cell)
    axis_of = _flax_state.axis_of(broadcast_rngs, state_axes)
    graphdef, params, rest = nnx.split(flax_cell, nnx.Param, ...)
    for path, var in _flax_state.variables(params) + _flax_state.variables(rest):
        if isinstance(axis_of(path, var), int):
            return f"state_axes scans {'.'.join(map(str, path))} over the time axis"
    variables = _flax_state.variables(rest)
    slots = []
    for (path, var), (change, reads, driven) in zip(variables, zip(*_flax_state.uses(graphdef, params, rest,
                                                                                      carry, x))):
        where, value = f"{'.'.join(map(str, path))} ({type(var).__name__})", var.get_value()
        floating = jnp.issubdtype(value.dtype, jnp.floating)
        how = None if floating else _flax_state.to_carrier(value)[1]
        if change and axis_of(path, var) is not None:
            if driven:
                return f"each step updates {where} from the carry, the inputs or the Params"
            slots.append(("side", how))
        elif not reads:
            slots.append(("zero", tuple(value.shape), value.dtype))
        else:
            slots.append(("const",) if floating else ("fixed", how))
    leaves, carry_def = jax.tree.flatten(carry)
    dtypes = tuple(jnp.result_type(leaf) for leaf in leaves)
    indexed = any(slot[0] == "side" for slot in slots)
    exact = 2 ** (jnp.finfo(jnp.result_type(*dtypes)).nmant + 1)
    if indexed and steps > exact:
        return (f"its side state is indexed by a step count kept in the carry's dtype {jnp.result_type(*dtypes)}, "
                f"exact to {exact} steps; T = {steps}")
    shapes = tuple(tuple(leaf.shape[1:]) for leaf in leaves)
    feature_shape = tuple(x.shape[1:])
    return Autodiff(graphdef, carry_def, shapes, dtypes, math.prod(feature_shape),
                    sum(math.prod(s) for s in shapes) + indexed, feature_shape,
                    jax.tree.structure(rest) if variables else None, tuple(slots), indexed), None


def adapt(flax_cell, carry, x, *, autodiff: bool = False, steps: int = 1) -> Cell:
    """The :class:`bppsa.cells.Cell` that runs ``flax_cell`` (:func:`plan`'s; a UsageError with
    its reason where there is none).

    Args:
      flax_cell: the cell ``nnx.RNN`` would drive.
      carry: an example carry, leaves (B, ...); None is enough for flax's four cells.
      x: an example step input ``(B, *features)``, or the input size I (then x is zeros of shape (B, I)).
      autodiff: use the :class:`Autodiff` cell even for one of flax's four cells.
      steps: T, the number of steps the cell will run (it bounds a step count kept in the carry's dtype).

    Returns:
      The :class:`bppsa.cells.Cell`: a :class:`Flax` or :class:`Autodiff` cell, or for a module with a
      ``bppsa_cell()`` method the :mod:`bppsa.cells.block` cell it returns.

    Raises:
      bppsa.errors.UsageError: no exact BPPSA backward exists for ``flax_cell`` (the message says why).
    """
    if carry is None and not autodiff:
        cell = _analytic(flax_cell)
        if cell is not None:
            return cell
    if (size := as_int(x)) is not None:
        x = jnp.zeros((jax.tree.leaves(carry)[0].shape[0], size), jnp.result_type(*jax.tree.leaves(carry)))
    planned = plan(flax_cell, carry, x, autodiff=autodiff, steps=steps)
    if isinstance(planned, str):
        raise UsageError(f"no BPPSA backward for {type(flax_cell).__name__}: {planned}")
    return planned[0]
