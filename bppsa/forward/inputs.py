"""A call's inputs, checked before anything is traced: the cell's parameters against its spec, xs
and h0's shapes and dtypes, one step's output, and a guess of states (the parallel forward's
``guess``, :func:`bppsa.lyapunov`'s ``states``). Each failure is a :class:`bppsa.errors.UsageError`
naming what was given and what was expected."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax import Array

from bppsa.cells import Cell
from bppsa.errors import UsageError
from bppsa.forward.info import NewtonInfo

__all__ = ["validate_inputs", "validate_params", "flat_guess"]


def flat_guess(cell: Cell, guess: Any, T: int, s0: Array, name: str = "guess") -> Array:
    """The parallel forward's ``guess`` (or another argument ``name`` that holds states), shaped
    like :func:`bppsa.rnn`'s result (an array, or for a pair state a pair of arrays; nested lists are
    converted), as flat states (T, B, S). A UsageError names what was given and what was expected.

    Args:
      cell: the cell.
      guess: the states, hs (T, B, H); for an LSTM the pair (hs, cs), each (T, B, H).
      T: the number of steps.
      s0: (B, S) the flat initial state (the batch, width and dtype expected).
      name: the argument's name in the messages.

    Returns:
      (T, B, S) the flat states.

    Raises:
      bppsa.errors.UsageError: ``guess`` not a float array (or pair) of those shapes, e.g. the
      ``(states, info)`` pair of ``return_info=True``.
    """
    B, S = s0.shape
    want = jax.eval_shape(cell.unflatten_state, jax.ShapeDtypeStruct((T, B, S), s0.dtype))
    single = not isinstance(want, (tuple, list))
    wants = (want,) if single else tuple(want)
    shapes = ", ".join(str(tuple(w.shape)) for w in wants)
    expected = (f"{name} must be shaped like the states rnn returns: a float array of shape (T, B, H) = {shapes}"
                if single else f"{name} must be shaped like the states rnn returns: a pair of float arrays of "
                f"shapes {shapes}")
    # rnn(..., return_info=True) returns (states, info): a likely mix-up, named in the message
    info = isinstance(guess, tuple) and len(guess) == 2 and (guess[1] is None
                                                              or isinstance(guess[1], NewtonInfo))
    hint = " (rnn(..., return_info=True) returns (states, info): pass its first item)" if info else ""
    if (isinstance(guess, (tuple, dict)) if single else not isinstance(guess, (tuple, list))) or info:
        raise UsageError(f"{expected} ({cell.display_name}'s state is {'one array' if single else 'a pair'}); "
                         f"got {_describe(guess)}{hint}")
    parts = (guess,) if single else tuple(guess)
    try:
        arrays = [jnp.asarray(part) for part in parts]
    except (TypeError, ValueError):
        raise UsageError(f"{expected}; got {_describe(guess)}, which is not an array of numbers") from None
    if len(arrays) != len(wants) or any(a.shape != w.shape or not _is_float(a) for a, w in zip(arrays, wants)):
        raise UsageError(f"{expected}; got {', '.join(f'{a.dtype}{list(a.shape)}' for a in arrays) or 'nothing'}"
                         + ("" if single else f" ({_describe(guess)})"))
    return cell.flatten_state(arrays[0] if single else tuple(arrays))


def _describe(value: Any) -> str:
    """A short description of a user's value: 'a list of 3 items', 'a float32 array of shape (5, 2)'."""
    if isinstance(value, (tuple, list, dict)):
        return f"a {type(value).__name__} of {len(value)} item{'s' if len(value) != 1 else ''}"
    shape, dtype = getattr(value, "shape", None), getattr(value, "dtype", None)
    if shape is not None and dtype is not None:
        return f"a {dtype} array of shape {tuple(shape)}"
    return f"a {type(value).__name__}"


def validate_params(cell: Cell, params: Any) -> None:
    """Check ``params`` against ``cell.param_spec`` (leaf paths and shapes, at trace time; nothing
    when the spec is None): a UsageError names the first leaf that is missing, extra or of another
    shape. Containers are compared by their leaves' paths only (a dict and a flax State with the
    same keys both pass).

    Args:
      cell: the cell.
      params: the cell's parameter pytree (``cell.init(key)``).

    Raises:
      bppsa.errors.UsageError: ``params`` None, of another structure, or a leaf missing, extra or
      misshapen.
    """
    name = type(cell).__name__
    if params is None:
        raise UsageError(f"params must be {name}'s parameter pytree (cell.init(key)); got None")
    leaves = jax.tree_util.tree_leaves_with_path(params)
    dtypes = [jnp.result_type(leaf) for _, leaf in leaves]
    dtype = jnp.result_type(*dtypes) if dtypes and all(_is_float(d) for d in dtypes) else jnp.float32
    spec = cell.param_spec(dtype)
    if spec is None:
        return
    keystr = jax.tree_util.keystr
    want = {keystr(path): tuple(leaf.shape) for path, leaf in jax.tree_util.tree_leaves_with_path(spec)}
    got = {keystr(path): tuple(jnp.shape(leaf)) for path, leaf in leaves}
    if got and not set(got) & set(want):
        raise UsageError(f"params must be like {name}.init's output, a {type(spec).__name__} with "
                         f"{', '.join('params' + k for k in want)}; got a {type(params).__name__} with "
                         f"{', '.join('params' + k for k in got)}")
    for key, shape in want.items():
        if key not in got:
            raise UsageError(f"params{key} is missing: {name} expects a leaf of shape {shape} there "
                             f"(its params: {', '.join('params' + k for k in want)})")
    for key, shape in got.items():
        if key not in want:
            raise UsageError(f"params{key} (shape {shape}) is not a parameter of {name}; expected exactly "
                             f"{', '.join('params' + k for k in want)}")
        if shape != want[key]:
            raise UsageError(f"params{key} has shape {shape}; {name} expects {want[key]}")


def _is_float(x) -> bool:
    return jnp.issubdtype(jnp.result_type(x), jnp.floating)


def validate_inputs(cell: Cell, params: Any, xs: Array, h0: Any) -> Array:
    """Check params (:func:`validate_params`), shapes and dtypes; return the flat initial state
    s0 (B, S). Shape checks only: everything here runs at trace time.

    Args:
      cell: the cell.
      params: the cell's parameter pytree (``cell.init(key)``).
      xs: (T, B, I) inputs, time-major.
      h0: (B, H) initial state; for an LSTM the pair (h0, c0), each (B, H).

    Returns:
      s0 (B, S), the flat initial state.

    Raises:
      bppsa.errors.UsageError: params :func:`validate_params` refuses, xs or h0 of the wrong shape or
      a non-float dtype, T = 0, or a step that changes the state's shape or dtype.
    """
    name = type(cell).__name__
    validate_params(cell, params)
    if xs.ndim != 3:
        raise UsageError(f"xs must have shape (T, B, I) (rank 3); got rank {xs.ndim} with shape {xs.shape}")
    T, B, I = xs.shape
    if T == 0:
        raise UsageError(f"xs must have at least one time step (T >= 1); got shape {xs.shape}")
    if not _is_float(xs):
        raise UsageError(f"xs must have a floating dtype; got {xs.dtype}")
    if cell.input_size is not None and I != cell.input_size:
        raise UsageError(f"xs must have shape (T, B, I) with I = {name}.input_size = {cell.input_size}; "
                         f"got shape {xs.shape}")
    for path, leaf in jax.tree_util.tree_leaves_with_path(params):
        if not _is_float(leaf):
            raise UsageError(f"params{jax.tree_util.keystr(path)} must have a floating dtype; "
                             f"got {jnp.result_type(leaf)}")
    H = cell.hidden_size
    expected = (B, H) if H is not None else (B, "H")
    if cell.pair_state and not (isinstance(h0, (tuple, list)) and len(h0) == 2):
        raise UsageError(f"h0 for {name} must be a pair (h0, c0) of (B, H) = {expected} arrays; "
                         f"got {type(h0).__name__}")
    h0 = tuple(h0) if cell.pair_state else h0
    parts = h0 if cell.pair_state else (h0,)
    for label, part in zip(("h0", "c0"), parts):
        if part is None:
            raise UsageError(f"{label} must be the initial state, a (B, H) = {expected} array "
                             f"(e.g. jnp.zeros); got None")
        part = jnp.asarray(part)
        if part.ndim != 2 or part.shape[0] != B or (H is not None and part.shape[1] != H):
            raise UsageError(f"{label} must have shape (B, H) = {expected} to match xs {xs.shape} and "
                             f"{name}.hidden_size; got {part.shape}")
        if not _is_float(part):
            raise UsageError(f"{label} must have a floating dtype; got {part.dtype}")
    h0 = jax.tree.map(jnp.asarray, h0)
    _check_step(cell, params, xs, h0)
    return cell.flatten_state(h0)


def _check_step(cell, params, xs, h0):
    """One step, traced only: it must return the state's shapes and dtypes (lax.scan needs it)."""
    name = type(cell).__name__
    out = jax.eval_shape(cell.step, params, h0, xs[0])
    parts, outs = jax.tree.leaves(jax.eval_shape(lambda h: h, h0)), jax.tree.leaves(out)
    if jax.tree.structure(out) != jax.tree.structure(h0) or any(o.shape != h.shape for o, h in zip(outs, parts)):
        raise UsageError(f"{name}.step must return the state's shape {[h.shape for h in parts]}; "
                         f"it returns {[o.shape for o in outs]} for h0 {[h.shape for h in parts]}")
    for label, o, h in zip(("h0", "c0"), outs, parts):
        if o.dtype != h.dtype and not h.weak_type:  # lax.scan promotes a weakly typed h0
            dtypes = [jnp.result_type(leaf) for leaf in jax.tree.leaves(params)]
            pdtype = jnp.result_type(*dtypes) if dtypes else None
            cause = (f"params' dtype {pdtype}" if pdtype is not None and pdtype != h.dtype
                     else f"xs' dtype {xs.dtype}")
            raise UsageError(f"{label} has dtype {h.dtype} but {name}.step turns it into {o.dtype} "
                             f"(from {cause}); pass {label} as {o.dtype}, or params and xs as {h.dtype}")
