"""``bppsa.rnn`` on one device: the entry that resolves one plan and runs what it names.

:func:`rnn` checks the inputs (:mod:`bppsa.forward.inputs`), makes the arrays a step closes over
operands (:mod:`bppsa.cells.closure`), and resolves every choice the options leave open once
(:meth:`bppsa.plan.Options.plan`) into one frozen :class:`bppsa.plan.Plan`, which it passes whole
to what runs:

- the forward: the sequential ``lax.scan`` (:mod:`bppsa.forward.sequential`) or the parallel
  Newton-family forward (:mod:`bppsa.forward.newton`, one compiled program kept per (cell, plan));
- the backward, by ``plan.backward``: BPPSA (Wang, Bai, Pekhimenko, MLSys 2020; the scan of
  transposed Jacobians, :mod:`bppsa.backward.pipeline`), or BPTT, by the cell's analytic adjoint
  where it has one (:mod:`bppsa.backward.adjoint`), else JAX's autodiff through the forward's
  ``lax.scan``. BPPSA and the analytic adjoint are the one differentiation rule
  (:mod:`bppsa.backward.rule`, a ``jax.custom_jvp`` whose tangent rule JAX transposes into the
  backward), so ``jax.grad``/``value_and_grad``/``jit``/``vmap`` of any loss of the returned
  states are exact, and so are forward mode (``jax.jvp``, ``jax.jacfwd``) and Hessian-vector
  products, for every ``backward=``.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
from jax import Array
from jax.typing import ArrayLike

from bppsa import host
from bppsa.backward.rule import bppsa_states, solved_states
from bppsa.cells import Cell, closure
from bppsa.forward import newton
from bppsa.forward.inputs import flat_guess, validate_inputs
from bppsa.forward.sequential import forward_states
from bppsa.plan import options as options_lib
from bppsa.plan.options import Options, Plan

__all__ = ["rnn", "prologue", "Problem", "compiled_solver"]


def rnn(cell: Cell, params: Any, xs: ArrayLike, h0: Any, options: Options | Plan | None = None, *, guess: Any = None,
        return_info: bool = False, **fields: Any) -> Any:
    """Run ``cell`` over a sequence on one device; differentiable w.r.t. ``params``, ``xs``, ``h0``.

    ``bppsa.rnn`` is this function, or with ``mesh=`` :func:`bppsa.parallel.rnn` (the time axis
    split over a device mesh).

    Args:
      cell: a cell from :mod:`bppsa.cells`.
      params: the cell's parameter pytree (``cell.init(key)``).
      xs: (T, B, I) inputs, time-major.
      h0: (B, H) initial state; for an LSTM the pair (h0, c0), each (B, H).
      options: a :class:`bppsa.Options` (default ``Options()``: BPPSA with the Blelloch scan,
        cache-sized chunks on CPU, full float32 products).
      guess: the parallel forward's first iterate, shaped like the result (e.g. the previous
        training step's states; None: zeros). Not differentiated; ignored by ``forward="sequential"``.
      return_info: also return a :class:`bppsa.forward.newton.NewtonInfo` (iterations, converged,
        fell_back, residual; None for the sequential forward).
      **fields: the fields of :class:`bppsa.Options` as keywords (``backward``, ``forward``,
        ``scan``, ``chunk_size``, ``precision``, ``tol``, ``max_iter``, ``damping``, ``on_fail``,
        ``cost_model``, ``combine``, ``unroll``, ``kernels``), overriding ``options``'s.

    Returns:
      The cell's state sequence: hs (T, B, H), hs[t] = h_{t+1}; for an LSTM the pair (hs, cs).
      ``cell.hidden(out)`` is hs (T, B, H) for every cell: use it where only hs is needed.
      With ``return_info``: (states, info).

    Raises:
      bppsa.errors.UsageError (a ValueError), one line naming the argument and what was expected:
      unknown option names or values, params that are not ``cell.param_spec``'s structure (a
      missing, extra or misshapen leaf), xs or h0 of the wrong shape or a non-float dtype, an h0
      whose dtype one step would change (h0 float32 with float64 params). See :func:`validate_inputs`.

    On CPU the first call applies :func:`bppsa.host.tune_allocator` (glibc keeps the backward's
    large temporaries for reuse; ``BPPSA_MALLOC_TUNING=0`` switches it off).
    """
    cell, params, xs, s0, plan, guess = prologue(cell, params, xs, h0, options, fields, guess=guess)
    info = None
    if plan.forward != "sequential":
        ss, info = _parallel_forward(cell, params, xs, s0, plan, guess)
    elif plan.differentiation == "autodiff":  # BPTT: JAX's autodiff through the lax.scan
        ss = forward_states(cell, params, xs, s0, unroll=plan.unroll, hoist=plan.hoist)
    else:  # the one differentiation rule: reverse mode is plan.adjoint
        ss = bppsa_states(cell, plan, params, xs, s0)
    out = cell.unflatten_state(ss)
    return (out, info) if return_info else out


class Problem(NamedTuple):
    """What every entry runs, made by :func:`prologue`: the cell and params to run (a step's closure
    lifted), the inputs as arrays, the flat initial state, the plan and the flat guess.

    Attributes:
      cell: the cell to run (a step's closed-over arrays lifted into its operands).
      params: its parameters (with the lifted arrays).
      xs: (T, B, I) inputs as an array.
      s0: (B, S) the flat initial state, as given (the states' dtype is the plan's).
      plan: the :class:`bppsa.Plan` every stage runs by.
      guess: (T, B, S) the parallel forward's flat first iterate, or None.
    """

    cell: Cell
    params: Any
    xs: Array
    s0: Array
    plan: Plan
    guess: Array | None


def prologue(cell: Cell, params: Any, xs: ArrayLike, h0: Any, options: Options | Plan | None, fields: dict[str, Any], *,
             devices: int | None = None, guess: Any = None) -> Problem:
    """The entries' one prologue (:func:`rnn` on one device, :func:`bppsa.parallel.rnn` over a mesh,
    and through them :class:`bppsa.nn.RNN`): the options with their keyword fields, the inputs
    checked (:func:`bppsa.forward.inputs.validate_inputs`), the states' dtype, the arrays a step closes
    over made operands (:func:`bppsa.cells.closure.lift`: no compiled program keeps an old value, and
    gradients reach a closed-over traced value), every choice made once (:meth:`bppsa.Options.plan`),
    the allocator tuned on CPU (:func:`bppsa.host.tune_allocator`) and the guess flattened.

    Args:
      cell: the cell the entry was given.
      params: its parameters.
      xs: (T, B, I) inputs.
      h0: the initial state in the cell's form.
      options: a :class:`bppsa.Options` (or a Plan), or None.
      fields: the entry's option keywords, overriding ``options``'s.
      devices: the size of the mesh axis the time is split over; None: one device.
      guess: the parallel forward's first iterate in the cell's form, or None.

    Returns:
      The :class:`Problem` to run.

    Raises:
      bppsa.errors.UsageError: bad options or inputs (one line naming them).
    """
    opts = options_lib.make(options, **fields)
    xs = jnp.asarray(xs)
    s0 = validate_inputs(cell, params, xs, h0)
    states_dtype = _states_dtype(cell, params, xs, s0)
    cell, params = closure.lift(cell, params, xs, s0.astype(states_dtype))
    plan = opts.plan(cell, xs, s0, states_dtype=states_dtype, devices=devices)
    if jax.default_backend() == "cpu":
        host.tune_allocator()
    flat = None if guess is None else flat_guess(cell, guess, xs.shape[0], s0)
    return Problem(cell, params, xs, s0, plan, flat)


def _parallel_forward(cell, params, xs, s0, plan: Plan, guess=None):
    """The states by the parallel forward (:func:`bppsa.forward.newton.solve`, on inputs it does not
    differentiate), differentiated at those states by the backward ``plan`` names (BPPSA's scan;
    ``backward="bptt"``: its sequential scan), from the flat ``guess`` (T, B, S) or None. Returns
    (ss (T, B, S), info)."""
    stop = jax.lax.stop_gradient
    with jax.default_matmul_precision(plan.precision):
        solver = _solver(cell, plan, closure.program_key(cell, params, xs, s0))
        ss, info = solver(stop(params), stop(xs), stop(s0), None if guess is None else stop(guess))
    return solved_states(cell, plan, params, xs, s0, ss), info


def _solver(cell: Cell, plan: Plan, key: tuple | None) -> Callable[..., tuple[Array, newton.NewtonInfo]]:
    """:func:`bppsa.forward.newton.solve` for (cell, plan) under one ``jax.jit`` kept across calls: called
    eagerly the iteration is one compiled program, not hundreds of dispatched operations, and a
    later call with the same cell, options and step neither retraces nor recompiles; inside a trace
    it is inlined. ``key`` (:func:`bppsa.cells.closure.program_key`) is what the cell's functions
    read besides their operands, by value (a Python scalar a step reads: a new value, a new program).
    Run directly: a mesh's plan, ``on_fail="raise"`` (called eagerly it raises
    :class:`bppsa.forward.newton.NewtonDidNotConverge` itself, not JAX's wrapping of it), a cell or
    plan that cannot key a cache, and a cell whose functions read arrays that are not their operands
    (``key`` None: a kept program would keep their values)."""
    if plan.devices is None and plan.on_fail != "raise" and key is not None:
        try:
            return compiled_solver(cell, plan, key)
        except TypeError:  # unhashable: a cell holding arrays, a custom cost model
            pass
    return functools.partial(newton.solve, cell, plan)


@functools.lru_cache(maxsize=64)
def compiled_solver(cell: Cell, plan: Plan, key: tuple = ()) -> Callable[..., tuple[Array, newton.NewtonInfo]]:
    """The jitted :func:`bppsa.forward.newton.solve` for (cell, plan), made once per (cell, plan, key).

    Args:
      cell: the cell (hashable).
      plan: the :class:`bppsa.plan.options.Plan` of a parallel forward (hashable).
      key: what the cell's functions read besides their operands (:func:`bppsa.cells.closure.program_key`):
        only part of the cache's key, so a program is never reused for another value of it.

    Returns:
      ``solver(params, xs, s0, guess) -> (ss, info)``, xs (T, B, I), s0 (B, S), guess (T, B, S) or None,
      ss (T, B, S) and info a :class:`bppsa.forward.newton.NewtonInfo`.

    Raises:
      TypeError: the cell or the plan cannot be hashed (e.g. a cell holding arrays).
    """
    return jax.jit(functools.partial(newton.solve, cell, plan))


def _states_dtype(cell, params, xs, s0):
    """The dtype of the flat states (T, B, S) the forward computes from s0 (B, S) over xs (T, B, I):
    s0's, unless s0 is weakly typed (then one step's, as ``lax.scan`` promotes its carry)."""
    if not jax.typeof(s0).weak_type:
        return s0.dtype
    step = lambda p, s, x: cell.flatten_state(cell.step(p, cell.unflatten_state(s), x))
    return jax.eval_shape(step, params, s0, xs[0]).dtype
