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

from bppsa.cells.base import Cell, Generic
from bppsa.errors import UsageError

__all__ = ["lift", "reads_arrays", "Lifted"]


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
        statics = tuple((i, a.dtype.str, a.shape, a.tobytes()) for i, a in self.statics)
        return (self.text, statics, self.n_consts, str(self.out_tree))

    def __call__(self, operands: tuple[Array, ...], *args: Any) -> Any:
        consts: list[Any] = [None] * self.n_consts
        for i, value in self.statics:
            consts[i] = value
        free = iter(operands)
        consts = [next(free) if c is None else c for c in consts]
        out = eval_jaxpr(self.jaxpr, consts, *jax.tree.leaves(args))
        return jax.tree.unflatten(self.out_tree, out)


def _trace(fn: Callable, name: str, cell: Cell, params: Any, h: Array, x: Array) -> tuple[_Traced, list[Array]]:
    """``fn(params, h, x)`` traced at one example's shapes -> (the traced function, the values of
    its floating-point constants, which become operands)."""
    # a new function object each call: jax.make_jaxpr keeps traces per function, and a kept trace
    # would hold the constants of the first call
    closed, out_shape = jax.make_jaxpr(lambda p, h, x: fn(p, h, x), return_shape=True)(params, h, x)
    statics, lifted = [], []
    for i, const in enumerate(closed.consts):
        if jnp.issubdtype(jnp.result_type(const), jnp.inexact):
            lifted.append(const)
        elif isinstance(const, Tracer):
            raise UsageError(f"{type(cell).__name__}'s {name} reads a traced {jnp.result_type(const)} array "
                             f"of shape {jnp.shape(const)} from its closure; pass it through params instead")
        else:
            statics.append((i, np.array(const)))
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


def reads_arrays(cell: Cell, params: Any, xs: Array, s0: Array) -> bool:
    """Whether ``cell.step`` reads arrays that are not its arguments (a global, a field holding an
    array): compiled programs of such a cell are not kept across calls. A traced value among them
    is a UsageError naming what to do.

    Args:
      cell: any cell (a :class:`Lifted` or closure-free cell reads none).
      params: its parameters.
      xs: (T, B, I) inputs (step 0's is traced).
      s0: (B, S) the flat initial state.

    Returns:
      True where the step's jaxpr has constants (arrays it reads besides its arguments).

    Raises:
      bppsa.errors.UsageError: one of those arrays is a traced value.
    """
    if isinstance(cell, Lifted):
        return False
    h = cell.unflatten_state(s0)
    closed = jax.make_jaxpr(lambda p, h, x: cell.step(p, h, x))(params, h, xs[0])
    for const in closed.consts:
        if isinstance(const, Tracer):
            raise UsageError(f"{type(cell).__name__}.step reads a traced {jnp.result_type(const)} array of shape "
                             f"{jnp.shape(const)} that is not in params (from its closure or a field); pass it "
                             f"through params instead")
    return bool(closed.consts)
