"""What a cell's step reads besides its arguments: arrays it closes over, lifted into operands.

A :class:`bppsa.cells.Generic` step is any Python function, and it may read arrays that are not
in ``params``: a global ``W``, a numpy array updated in place between calls, or a traced value
of an enclosing ``jax.grad``/``jax.jit`` (``W`` the differentiated argument of a loss that builds
the cell). Two things go wrong when such a step reaches bppsa's compiled pieces as it is:

- a program compiled once per (cell, plan) and kept across calls (the parallel forward's solver,
  the sequence-parallel functions) would keep the values it saw at its first call, and a later
  call would silently compute with the old array;
- the BPPSA backward is a ``jax.custom_jvp`` whose rule differentiates its explicit operands
  only, so a closed-over traced value would escape it.

:func:`lift` makes both impossible. It traces the step (and the cell's ``jacobian_fn``) once per
call into a jaxpr; the floating-point arrays that jaxpr reads become operands, passed beside the
user's params, so every call computes with the values of that call and gradients flow to them
as to any parameter. Integer and boolean arrays (masks, indices) are kept as constants of the
lifted cell, compared by value. The lifted cell is equal to another exactly when their jaxprs
print the same and their constants are equal, so a compiled program is reused only where it
computes the same function of its operands.

A cell of another kind whose ``step`` reads arrays that are not in ``params`` is checked by
:func:`reads_arrays`: its compiled programs are not kept across calls, and a traced value in its
closure is an error naming what to do (pass it through ``params``).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array
from jax.core import Tracer, eval_jaxpr
from jax.extend.core import ClosedJaxpr, Jaxpr, Literal

from bppsa.cells.base import Cell, Generic
from bppsa.cells.structure import Blocks, Scaled, structure_of
from bppsa.errors import UsageError

__all__ = ["lift", "program_key", "Lifted"]


@dataclasses.dataclass(frozen=True)
class _Traced:
    """One per-example function traced to a jaxpr: what :class:`Lifted` evaluates in its place.

    ``statics`` are the integer/boolean constants (numpy, compared by value), ``lifted`` the
    positions of the floating-point constants among the jaxpr's constants (their values arrive
    as operands). ``text`` is the jaxpr printed: with the statics, what identifies the function."""

    jaxpr: Any
    out_tree: Any
    statics: tuple[tuple[int, np.ndarray], ...]
    n_consts: int
    text: str

    def key(self) -> tuple:
        statics = tuple((i, _exact(a)) for i, a in self.statics)
        return (self.text, _literals(self.jaxpr), statics, self.n_consts, str(self.out_tree))

    def __call__(self, operands: tuple[Array, ...], *args: Any) -> Any:
        consts: list[Any] = [None] * self.n_consts
        for i, value in self.statics:
            consts[i] = _unwrap(value)
        free = iter(operands)
        consts = [next(free) if c is None else c for c in consts]
        out = eval_jaxpr(self.jaxpr, consts, *jax.tree.leaves(args))
        return jax.tree.unflatten(self.out_tree, out)


def _is_key(value: Any) -> bool:
    return jnp.issubdtype(jnp.result_type(value), jax.dtypes.prng_key)


@dataclasses.dataclass(frozen=True)
class _Key:
    """A PRNG key a step closes over, kept by value: its raw bits and its implementation."""

    data: np.ndarray
    impl: Any

    def wrap(self) -> Array:
        return jax.random.wrap_key_data(jnp.asarray(self.data), impl=self.impl)


def _static(value: Any) -> Any:
    """A concrete non-float constant kept by value: a numpy array, or a PRNG key's :class:`_Key`."""
    if _is_key(value):
        return _Key(np.asarray(jax.random.key_data(value)), jax.random.key_impl(value))
    return np.array(value)


def _unwrap(value: Any) -> Any:
    return value.wrap() if isinstance(value, _Key) else value


def _exact(value: Any) -> tuple:
    """A value as a hashable key that equal values share and different values never do (the dtype,
    the shape and the bytes; a key's bits and implementation)."""
    if isinstance(value, _Key):
        return ("key", str(value.impl), _exact(value.data))
    a = np.asarray(value)
    return (a.dtype.str, a.shape, a.tobytes())


def _subjaxprs(params: dict) -> list:
    """The jaxprs an equation's params hold (a loop's body, a cond's branches, a pjit's call, ...)."""
    found = []
    for value in params.values():
        for item in value if isinstance(value, (tuple, list)) else (value,):
            if isinstance(item, (ClosedJaxpr, Jaxpr)):
                found.append(item)
    return found


def _literals(jaxpr: Any) -> tuple:
    """Every literal of ``jaxpr`` and of the jaxprs inside it, exactly (:func:`_exact`), in order, with
    the constants of the closed jaxprs inside it: what a jaxpr's printed text may round (a Python
    or numpy scalar a step reads is a literal of its trace)."""
    out: list = []
    if isinstance(jaxpr, ClosedJaxpr):
        out += [_exact(_static(c)) if not isinstance(c, Tracer) else ("traced",) for c in jaxpr.consts]
        jaxpr = jaxpr.jaxpr
    for eqn in jaxpr.eqns:
        out += [_exact(v.val) for v in eqn.invars if isinstance(v, Literal)]
        out += [_literals(sub) for sub in _subjaxprs(eqn.params)]
    return tuple(out)


def _traced_error(owner: str, const: Any, fix_float: str) -> UsageError:
    """The error for a traced value a step closes over that cannot become an operand, with advice
    that works: a float array goes through params; an integer, boolean or key array must be
    concrete where bppsa runs (not a traced argument of an enclosing jit or grad)."""
    dtype, shape = jnp.result_type(const), jnp.shape(const)
    if jnp.issubdtype(dtype, jnp.inexact):
        return UsageError(f"{owner} reads a traced {dtype} array of shape {shape} {fix_float}")
    return UsageError(f"{owner} reads a traced {dtype} array of shape {shape} from its closure; integer, boolean "
                      f"and key values a step reads must be concrete: make the enclosing function's argument "
                      f"static (jax.jit(..., static_argnums=...)) or compute it outside the jitted function "
                      f"(params take floating arrays only)")


def _trace(fn: Callable, name: str, cell: Cell, params: Any, h: Array, x: Array) -> tuple[_Traced, list[Array]]:
    """``fn(params, h, x)`` traced at one example's shapes -> (the traced function, the values of
    its floating-point constants, which become operands)."""
    # a new function object each call: jax.make_jaxpr keeps traces per function, and a kept trace
    # would hold the constants of the first call
    closed, out_shape = jax.make_jaxpr(lambda p, h, x: fn(p, h, x), return_shape=True)(params, h, x)
    statics, lifted = [], []
    for i, const in enumerate(closed.consts):
        if not _is_key(const) and jnp.issubdtype(jnp.result_type(const), jnp.inexact):
            lifted.append(const)
        elif isinstance(const, Tracer):
            raise _traced_error(f"{type(cell).__name__}'s {name}", const, "")
        else:
            statics.append((i, _static(const)))
    traced = _Traced(closed.jaxpr, jax.tree.structure(out_shape), tuple(statics), len(closed.consts),
                     str(closed.jaxpr))
    return traced, lifted


@dataclasses.dataclass(frozen=True, eq=False)
class Lifted(Generic):
    """A :class:`bppsa.cells.Generic` whose step (and Jacobian) read no closure: made by
    :func:`lift`. Its params are ``(params, step_operands, jacobian_operands)``: the user's
    params and the floating-point arrays the functions closed over, in their jaxprs' order.

    Attributes:
      step_traced: ``step_fn`` traced to a jaxpr (its integer and boolean constants kept by value).
      jacobian_traced: ``jacobian_fn`` traced likewise; None where the Generic had none.
    """

    step_traced: _Traced | None = None
    jacobian_traced: _Traced | None = None

    def __eq__(self, other: object) -> bool:
        return type(other) is Lifted and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    @property
    def display_name(self) -> str:
        return "Generic"

    def param_leaf_names(self, params: Any) -> tuple[str, ...]:
        """The user's params by their own paths; the lifted arrays as what they are."""
        user, step_ops, jac_ops = params
        names = list(super().param_leaf_names(user))
        names += [f"the array #{i} step_fn closes over" for i in range(len(step_ops))]
        names += [f"the array #{i} jacobian_fn closes over" for i in range(len(jac_ops))]
        return tuple(names)

    def _key(self) -> tuple:
        jacobian = None if self.jacobian_traced is None else self.jacobian_traced.key()
        return (self.step_traced.key() if self.step_traced else None, jacobian, self.hidden_size,
                self.input_size)


def lift(cell: Cell, params: Any, xs: Array, s0: Array) -> tuple[Cell, Any]:
    """``(cell, params)`` with every array a :class:`bppsa.cells.Generic` step or ``jacobian_fn``
    closes over made an operand: (a :class:`Lifted` cell, ``(params, step_operands,
    jacobian_operands)``); unchanged for a Generic that reads nothing besides its arguments and
    for every other cell (see the module docstring; :func:`reads_arrays` checks those).

    Args:
      cell: the cell :func:`bppsa.rnn` was given.
      params: its parameters.
      xs: (T, B, I) inputs. Only its shape and dtype are read (one example's step is traced).
      s0: (B, S) the flat initial state in the states' dtype; only its shape and dtype are read.

    Returns:
      The pair (cell, params) to run: a :class:`Lifted` cell and ``(params, step_operands,
      jacobian_operands)``, or the arguments unchanged.

    Raises:
      bppsa.errors.UsageError: the step closes over a traced integer or boolean array.
    """
    if type(cell) is not Generic:
        return cell, params
    h, x = s0[0], xs[0, 0]
    step, step_ops = _trace(cell.step_fn, "step_fn", cell, params, h, x)
    jacobian, jac_ops = (None, []) if cell.jacobian_fn is None else _trace(cell.jacobian_fn, "jacobian_fn", cell,
                                                                           params, h, x)
    if not step_ops and not jac_ops and not step.statics and (jacobian is None or not jacobian.statics):
        return cell, params
    lifted_step = lambda lp, h, x: step(lp[1], lp[0], h, x)  # noqa: E731
    lifted_jacobian = None if jacobian is None else (lambda lp, h, x: jacobian(lp[2], lp[0], h, x))
    new = Lifted(step_fn=lifted_step, jacobian_fn=lifted_jacobian, hidden_size=cell.hidden_size,
                 input_size=cell.input_size, step_traced=step, jacobian_traced=jacobian)
    return new, (params, tuple(step_ops), tuple(jac_ops))


def program_key(cell: Cell, params: Any, xs: Array, s0: Array) -> tuple | None:
    """What a program kept across calls for ``cell`` must be keyed on besides the cell and the plan:
    the functions of the cell that bppsa's kept programs evaluate (the step, its Jacobian in the form
    the scans take, the parameter gradients), traced at one step's shapes, as exactly as they compute.
    A Python or numpy scalar the step reads (a global temperature, a switch, a float in a dict or an
    object's attribute) is a literal of that trace, an integer, boolean or key array a constant: both
    are in the key by value, so a later call after one of them changed makes a new program.

    Args:
      cell: any cell (a :class:`Lifted` cell too).
      params: its parameters.
      xs: (T, B, I) inputs (step 0's shape is traced).
      s0: (B, S) the flat initial state.

    Returns:
      A hashable key, equal for two calls exactly when those functions' traces are equal (the
      printed jaxpr, every literal and non-float constant by value); None where they read
      floating-point arrays that are not their operands (a global array, a field holding one): a
      program for such a cell must not be kept.

    Raises:
      bppsa.errors.UsageError: one of the values they read is traced (an enclosing ``jax.jit`` or
        ``jax.grad``'s argument) and is not an operand.
    """
    def probe(p, s, x):
        out = cell.step(p, cell.unflatten_state(s), x)
        sp, x1, s1 = s[None], x[None], cell.flatten_state(out)[None]
        match structure_of(cell):
            case Scaled(fn) | Blocks(_, fn):
                jac = fn(p, sp, x1, s1)
            case _:
                jac = cell.transposed_jacobian(p, sp, x1, s1)
        return out, jac, cell.param_grads(p, sp, x1, s1, jnp.ones_like(s1))

    closed = jax.make_jaxpr(probe)(params, s0, xs[0])
    for const in closed.consts:
        if isinstance(const, Tracer):
            raise _traced_error(f"{type(cell).__name__}.step", const, "that is not in params (from its closure "
                                "or a field); pass it through params instead")
    if any(not _is_key(c) and jnp.issubdtype(jnp.result_type(c), jnp.inexact) for c in closed.consts):
        return None
    return (str(closed.jaxpr), _literals(closed))
