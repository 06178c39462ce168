"""The non-Param state of a flax cell, as :func:`bppsa.nn.cells.plan` needs it (private).

One step of a cell is traced once (:func:`uses`): for each leaf of its non-Param state, whether
the step changes it, whether it reads it, and whether its new value depends on the carry, the
input or the Params (then it cannot be computed ahead of the scan). Non-float state (an RNG key, a
counter) rides through the scan's parameter pytree as float arrays of the same bits
(:func:`to_carrier`; only moved, never computed on, and cut off from differentiation), so the
BPPSA pipeline sees floats only.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx
from flax.nnx import filterlib
from jax import lax

__all__ = ["variables", "axis_of", "uses", "read", "write_back", "to_carrier", "from_carrier", "placeholder", "is_key"]

_WIDTH = {4: (jnp.uint32, jnp.float32), 8: (jnp.uint64, jnp.float64), 2: (jnp.uint16, jnp.float16)}


def variables(state):
    """[(path, Variable)] of an nnx State, in its leaves' order.

    Args:
      state: an ``nnx.State`` (or any pytree with ``nnx.Variable`` leaves).

    Returns:
      A list of pairs (path, Variable), path a tuple of the keys and indices that lead to the leaf.
    """
    flat, _ = jax.tree_util.tree_flatten_with_path(state, is_leaf=lambda v: isinstance(v, nnx.Variable))
    return [(tuple(getattr(k, "key", getattr(k, "idx", k)) for k in path), v) for path, v in flat]


def axis_of(broadcast_rngs, state_axes):
    """path, Variable -> the axis ``nnx.RNN`` scans it over: None (broadcast), nnx.Carry, or an int.

    Args:
      broadcast_rngs: the filter of the RNG streams ``nnx.RNN`` broadcasts (its ``broadcast_rngs``).
      state_axes: ``nnx.RNN``'s ``state_axes``, a mapping of filters to axes (None: none).

    Returns:
      The function ``(path, Variable) -> axis``, the axis of the first rule that matches, in order
      broadcast RNG state (None) then ``state_axes``; nnx.Carry where none does.
    """
    rules = [(nnx.All(nnx.RngState, broadcast_rngs), None)] + list((state_axes or {}).items())
    preds = [(filterlib.to_predicate(f), axis) for f, axis in rules]
    return lambda path, var: next((axis for pred, axis in preds if pred(path, var)), nnx.Carry)


def uses(graphdef, params, rest, carry, x):
    """For each leaf of ``rest`` (the non-Param state) of one step of the cell: (changed, read,
    driven): whether the step changes it (an unchanged leaf is returned as the very input), reads
    it, and whether its new value depends on the Params, the carry or the input.

    Args:
      graphdef: the cell's graph definition (``nnx.split``'s).
      params: its ``nnx.Param`` state.
      rest: its other state.
      carry: a carry, leaves (B, ...).
      x: one step's input, ``(B, *features)``.

    Returns:
      Three lists of bools (changed, read, driven), one entry per leaf of ``rest`` in its leaves' order.
    """
    def pure(params, rest, carry, x):
        module = nnx.merge(graphdef, params, rest)
        carry, y = module(carry, x)
        return nnx.split(module, nnx.Param, ...)[2], carry, y

    jaxpr = jax.make_jaxpr(pure)(params, rest, carry, x).jaxpr
    n_params, n_rest = len(jax.tree.leaves(params)), len(jax.tree.leaves(rest))
    ins, outs = jaxpr.invars[n_params:n_params + n_rest], jaxpr.outvars[:n_rest]
    used = {id(v) for eqn in jaxpr.eqns for v in eqn.invars} | {id(v) for v in jaxpr.outvars[n_rest:]}
    sources = {id(v) for v in jaxpr.invars[:n_params] + jaxpr.invars[n_params + n_rest:]}
    for eqn in jaxpr.eqns:  # forward dependence, every output of an equation on every input
        if any(id(v) in sources for v in eqn.invars):
            sources |= {id(v) for v in eqn.outvars}
    return ([o is not i for i, o in zip(ins, outs)], [id(i) in used for i in ins],
            [id(o) in sources for o in outs])


def read(cell, flax_cell, carry, x, steps: int):
    """(params, the side state after ``steps`` steps) of an Autodiff ``cell``: its parameter
    pytree from the flax cell's current state, with the side state's values before each of
    ``steps`` steps (carry (B, ...) and x ``(B, *features)`` are any step's: the side state does not
    depend on them).

    Args:
      cell: the :class:`~bppsa.nn.cells.Autodiff` cell (its ``graphdef``, ``rest_def`` and
        ``rest_slots`` are read).
      flax_cell: the flax cell it adapts, in its current state.
      carry: a carry, leaves (B, ...).
      x: one step's input, ``(B, *features)``.
      steps: T, the number of steps the side state is advanced.

    Returns:
      The pair (params, final). params is the dict "params" (the ``nnx.Param`` state), "consts",
      "fixed" and "side" (tuples of leaves, non-float ones as :func:`to_carrier` floats; each side
      leaf (T, ...), its value before each step);
      final maps each side leaf's index in the non-Param leaves to its value after the T steps,
      or is None when there is no side state.
    """
    _, params, rest = nnx.split(flax_cell, nnx.Param, ...)
    leaves = jax.tree.leaves(rest)
    pick = lambda kind: [i for i, slot in enumerate(cell.rest_slots) if slot[0] == kind]
    out = {"params": params, "consts": tuple(leaves[i] for i in pick("const")),
           "fixed": tuple(_carrier(leaves[i], cell.rest_slots[i][1]) for i in pick("fixed")), "side": ()}
    sides = pick("side")
    if not sides:
        return out, None

    def advance(values, _):
        new = list(leaves)
        for i, v in zip(sides, values):
            new[i] = v
        module = nnx.merge(cell.graphdef, params, jax.tree.unflatten(cell.rest_def, new))
        module(carry, x)
        after = jax.tree.leaves(nnx.split(module, nnx.Param, ...)[2])
        return [after[i] for i in sides], values

    final, seq = lax.scan(advance, [leaves[i] for i in sides], None, length=steps)
    out["side"] = tuple(_carrier(a, cell.rest_slots[i][1]) for i, a in zip(sides, seq))
    return out, dict(zip(sides, final))

def write_back(cell, flax_cell, final):
    """Set the side state of ``flax_cell`` to its values after the scan (as ``nnx.RNN`` does).

    Args:
      cell: the :class:`~bppsa.nn.cells.Autodiff` cell (its ``rest_def`` is read).
      flax_cell: the flax cell, updated in place.
      final: {leaf index: value}, the side state after the scan (:func:`read`'s second result);
        the other non-Param leaves keep their values.

    Returns:
      None: ``flax_cell`` is updated in place.
    """
    _, _, rest = nnx.split(flax_cell, nnx.Param, ...)
    leaves = jax.tree.leaves(rest)
    nnx.update(flax_cell, jax.tree.unflatten(cell.rest_def, [final.get(i, a) for i, a in enumerate(leaves)]))


def _carrier(a, how):
    return a if how is None else to_carrier(a)[0]


def is_key(dtype) -> bool:
    """Whether ``dtype`` is a typed JAX PRNG key dtype.

    Args:
      dtype: a dtype.

    Returns:
      True for a key dtype (``jax.random.key``'s), else False.
    """
    return jnp.issubdtype(dtype, jax.dtypes.prng_key)


def to_carrier(a):
    """A non-float array (or key array) -> (float array with its bits, how to read it back).

    Args:
      a: an integer, bool or key array (a float array comes back with its own bits).

    Returns:
      The pair (f, how). f has a's shape (for a key array, plus the key data's trailing axis) in the
      float dtype of its width (bool and widths without one via int32); how is ("key", the key's
      implementation) or ("int", a's dtype), for :func:`from_carrier`.
    """
    if is_key(a.dtype):
        return to_carrier(jax.random.key_data(a))[0], ("key", jax.random.key_impl(a))
    if a.dtype == jnp.bool_ or a.dtype.itemsize not in _WIDTH:
        return to_carrier(a.astype(jnp.int32))[0], ("int", a.dtype)
    unsigned, floating = _WIDTH[a.dtype.itemsize]
    return lax.bitcast_convert_type(lax.bitcast_convert_type(a, unsigned), floating), ("int", a.dtype)


def from_carrier(f, how):
    """The inverse of :func:`to_carrier` (no gradient flows through it).

    Args:
      f: the float array :func:`to_carrier` made.
      how: its second result.

    Returns:
      The original array, of its shape and dtype (a key array for a key).
    """
    kind, what = how
    f = lax.stop_gradient(f)
    bits = lax.bitcast_convert_type(f, _WIDTH[f.dtype.itemsize][0])
    if kind == "key":
        return jax.random.wrap_key_data(bits, impl=what)
    if what == jnp.bool_ or what.itemsize not in _WIDTH:
        return lax.bitcast_convert_type(bits, jnp.int32).astype(what)
    return lax.bitcast_convert_type(bits, what)


def placeholder(shape, dtype):
    """A stand-in for state the step never reads (a key array for key dtypes).

    Args:
      shape: the state's shape.
      dtype: its dtype.

    Returns:
      Zeros of that shape and dtype, or for a key dtype ``jax.random.key(0)`` broadcast to the shape.
    """
    if is_key(dtype):
        return jnp.broadcast_to(jax.random.key(0), shape)
    return jnp.zeros(shape, dtype)
