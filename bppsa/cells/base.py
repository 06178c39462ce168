"""The cell contract (:class:`Cell`), the affine family's shared maths (:class:`Affine`), the
autodiff cell (:class:`Generic`) and their helpers: the base of :mod:`bppsa.cells` (whose docstring
states the contract); the published cells are in :mod:`bppsa.cells.recurrent`."""

from __future__ import annotations

import abc
import dataclasses
from typing import Any, Callable, ClassVar, Protocol, runtime_checkable

import jax
import jax.numpy as jnp
from jax import Array

from bppsa.cells.structure import Structure, legacy_structure
from bppsa.errors import UsageError, as_int

__all__ = ["Cell", "AnalyticAdjoint", "analytic_adjoint", "Affine", "AffineAdjoint", "Generic", "ACTIVATIONS",
           "autodiff_jacobian", "autodiff_param_grads", "flat_outer", "split_gates", "gate_count"]

#: Activation functions by name: (function, its derivative written in terms of its output y).
ACTIVATIONS: dict[str, tuple[Callable, Callable]] = {"tanh": (jnp.tanh, lambda y: 1.0 - y * y),
                                                     "sigmoid": (jax.nn.sigmoid, lambda y: y * (1.0 - y)),
                                                     "relu": (jax.nn.relu, lambda y: (y > 0).astype(y.dtype))}


def split_gates(a: Any, n: int) -> list[Array]:
    """``a``'s last axis in ``n`` parts; not slices, whose transposes (pads) XLA's CPU fuses into slow loops.

    Args:
      a: (..., n·D) an array; a list or tuple (already the parts) is returned as a list.
      n: the number of parts (G for the gates' pre-activations, 2 for the LSTM's flat state [h, c]).

    Returns:
      A list of ``n`` arrays (..., D).
    """
    return list(a) if isinstance(a, (list, tuple)) else jnp.split(a, n, axis=-1)


def gate_count(cell: Cell) -> int:
    """G, the cell's gate count (pre-activations per step are G·H wide): the per-step work scales with
    it. An input of the plan's cost rules and of the fused kernels (which run affine cells only), not of
    the contract: :attr:`Affine.gates`, else 1.

    Args:
      cell: any cell.

    Returns:
      G, an int.
    """
    return getattr(cell, "gates", 1)


def _uniform(key, shape, bound, dtype):
    return jax.random.uniform(key, shape, dtype, -bound, bound)


class Cell(abc.ABC):
    """The contract every cell meets. Shapes: B batch, I input, H hidden, S = flat state size
    (S = H; LSTM: S = 2H with s = [h, c]), T steps (in any order, as long as the arrays agree).

    Subclasses are frozen dataclasses (hashable: :func:`bppsa.rnn` passes them as a static
    argument of its ``jax.custom_jvp`` and keys compiled programs on them). :meth:`param_spec` is
    the structure ``params`` must have (:func:`bppsa.rnn` names any leaf that is missing, extra
    or of another shape); its default traces :meth:`init`, so a cell that implements ``init`` is
    checked.

    The contract is small: ``input_size``, ``hidden_size``, :meth:`init` and :meth:`step` (the
    only abstract methods). Everything else has a default: the transposed Jacobians and the
    parameter gradients the backward needs by autodiff of :meth:`step` (:meth:`transposed_jacobian`,
    :meth:`param_grads`), no structure (:attr:`jacobian_structure`, one typed description: dense),
    no loop form (:meth:`project`, :meth:`loop_params`). A cell overrides what it knows better, and
    the typed protocol :class:`AnalyticAdjoint` (flag: ``has_adjoint``) is the optional analytic
    adjoint BPTT loops over. The guide "Your own cell" (docs/guides/cells.md) works one example.

    Attributes:
      input_size: I, the width of one step's input x (an int; None where a cell does not fix it: Generic).
      hidden_size: H, the width of the hidden state h (an int; Generic: an int or None).
    """

    input_size: Any  # int, or None where a cell does not fix it (Generic)
    hidden_size: Any  # int (Generic: int or None)

    @abc.abstractmethod
    def init(self, key: Array, dtype: jax.typing.DTypeLike = jnp.float32) -> Any:
        """The parameter pytree for ``key``.

        Args:
          key: a ``jax.random`` key.
          dtype: the parameters' dtype.

        Returns:
          The parameter pytree; for the affine cells a dict of W_x (I, G·H), W_h (H, G·H) and the biases (G·H,).
        """

    def param_spec(self, dtype: jax.typing.DTypeLike = jnp.float32) -> Any:
        """The structure :func:`bppsa.rnn` checks ``params`` against: a pytree of
        ``jax.ShapeDtypeStruct`` (default: :meth:`init` traced, not computed), or None (unchecked).

        Args:
          dtype: the parameters' dtype.

        Returns:
          A pytree of ``jax.ShapeDtypeStruct`` with the structure and shapes of ``init(key, dtype)``, or None.
        """
        return jax.eval_shape(lambda key: self.init(key, dtype), jax.random.key(0))

    @abc.abstractmethod
    def step(self, params: Any, h: Any, x: Array, /) -> Any:
        """One step: h (B, H) [LSTM: (h, c)], x (B, I) -> the next state, same structure as h.

        Args:
          params: the parameter pytree, or :meth:`loop_params`' form of it.
          h: (B, H) the state before the step; for an LSTM the pair (h, c), each (B, H).
          x: (B, I) the step's input.

        Returns:
          The next state, with the structure and shapes of ``h``.
        """

    def project(self, params: Any, xs: Array, /) -> Any:
        """The part of a step that reads only its input, for any number of steps at once: xs
        (..., I) -> u, which :meth:`step_projected` finishes. The sequential forward computes it for
        all T steps before its loop (one large product, not T small ones). Default: xs itself.

        Args:
          params: the parameter pytree.
          xs: (..., I) inputs with any leading axes ((T, B, I) for all steps, (B, I) for one).

        Returns:
          u, with the leading axes of ``xs``; for the affine cells the input's pre-activations (..., G·H), or
          a tuple of the G gates' (..., H) parts.
        """
        return xs

    def step_projected(self, params: Any, h: Any, u: Any, /) -> Any:
        """:meth:`step` from ``u = project(params, x)`` (default: ``step(params, h, u)``).

        Args:
          params: the parameter pytree, or :meth:`loop_params`' form of it.
          h: (B, H) the state before the step [LSTM: (h, c)].
          u: one step's slice of :meth:`project`'s output, for x (B, I).

        Returns:
          The next state, with the structure and shapes of ``h``.
        """
        return self.step(params, h, u)

    def loop_params(self, params: Any, /) -> Any:
        """``params`` as a loop over the steps hands them to :meth:`step`, :meth:`step_projected`,
        :meth:`step_factors` and :meth:`adjoint_step` (which accept both forms; every other method
        takes ``params``): rearrangements the steps would otherwise repeat, done once before the
        loop (XLA fuses a loop-invariant slice into the step's fusion instead of hoisting it).
        Default: ``params``.

        Args:
          params: the parameter pytree.

        Returns:
          The parameters in the form the loop's steps read (by default ``params`` itself).
        """
        return params

    @property
    def kernel_cell(self) -> Cell:
        """The cell whose steps the fused kernels (:mod:`bppsa.kernels`) compute for this one, on the
        same flat states, with :meth:`kernel_params`: the cell itself; an adapter that runs a built-in
        cell's maths under another parameter layout (:mod:`bppsa.nn`'s flax cells) names that cell."""
        return self

    def kernel_params(self, params: Any, /) -> Any:
        """``params`` in :attr:`kernel_cell`'s structure (default: ``params`` itself).

        Args:
          params: the parameter pytree.

        Returns:
          The parameters :attr:`kernel_cell` reads.
        """
        return params

    def _step_one(self, params: Any, s: Array, x: Array) -> Array:
        """One example's step on the flat state: s (S,), x (I,) -> (S,) (:meth:`step` on a batch of one)."""
        return self.flatten_state(self.step(params, self.unflatten_state(s[None]), x[None]))[0]

    def transposed_jacobian(self, params: Any, s_prev: Array, xs: Array, s: Array, /) -> Array:
        """s_prev, s: (T, B, S), xs: (T, B, I) -> Ms (T, B, S, S) with g_{t-1} = g_t @ M_t,
        M_t[b, i, j] = ∂s_t[b, i] / ∂s_{t-1}[b, j]. Default: ``jax.jacrev`` of one example's
        :meth:`step`, vmapped over T and B (:func:`autodiff_jacobian`); a cell that knows its
        Jacobian in closed form overrides it (the published cells do).

        Args:
          params: the parameter pytree.
          s_prev: (T, B, S) the flat state before each step.
          xs: (T, B, I) each step's input.
          s: (T, B, S) the flat state after each step (s_t = step(s_prev_t, x_t)).

        Returns:
          Ms (T, B, S, S), M_t[b, i, j] = ∂s_t[b, i] / ∂s_{t-1}[b, j].
        """
        return autodiff_jacobian(self._step_one, params, s_prev, xs)

    def param_grads(self, params: Any, s_prev: Array, xs: Array, s: Array, gs: Array, /) -> tuple[Any, Array]:
        """gs (T, B, S) = ∂L/∂s_t -> (dparams, dxs (T, B, I)), summed over t and b. Default: one
        ``jax.vjp`` of one example's :meth:`step`, vmapped over T and B (:func:`autodiff_param_grads`).

        Args:
          params: the parameter pytree.
          s_prev: (T, B, S) the flat state before each step.
          xs: (T, B, I) each step's input.
          s: (T, B, S) the flat state after each step.
          gs: (T, B, S) the total gradient ∂L/∂s_t of each step's state.

        Returns:
          The pair (dparams, dxs): dparams with the structure of ``params``, summed over t and b; dxs
          (T, B, I) the gradient ∂L/∂x_t of each step's input.
        """
        return autodiff_param_grads(self._step_one, params, s_prev, xs, gs)

    @property
    def jacobian_structure(self) -> Structure:
        """The structure of the transposed Jacobians (:mod:`bppsa.cells.structure`): :class:`Dense`
        (default: :meth:`transposed_jacobian` alone), :class:`Scaled`, :class:`Factored` or
        :class:`Blocks`, each carrying the functions that structure needs. A cell written against the
        members this replaced (``jacobian_block_size``, ``diagonal_jacobian``, ...) gets them
        translated, with a ``DeprecationWarning`` (:func:`bppsa.cells.structure.legacy_structure`)."""
        return legacy_structure(self)

    #: Whether the cell has an analytic adjoint step, the methods of :class:`AnalyticAdjoint`
    #: (checked where the plan uses them): BPTT then loops over it alone and forms the parameter
    #: gradients after.
    has_adjoint: ClassVar[bool] = False

    #: Whether the state is a pair of (B, H) arrays (LSTM) rather than one array.
    pair_state: ClassVar[bool] = False

    @property
    def state_size(self) -> int:
        """S, the width of the flat state the scan works on."""
        return self.hidden_size

    def flatten_state(self, h: Any, /) -> Array:
        """state -> (..., S).

        Args:
          h: the state, (..., H) [LSTM: the pair (h, c), each (..., H)].

        Returns:
          (..., S), the flat state ([h, c] for an LSTM).
        """
        return h

    def unflatten_state(self, s: Array, /) -> Any:
        """(..., S) -> state.

        Args:
          s: (..., S) a flat state.

        Returns:
          The state (..., H); for an LSTM the pair (h, c), each (..., H).
        """
        return s

    @property
    def display_name(self) -> str:
        """The cell's name in messages: its class's (an adapter names the cell it adapts)."""
        return type(self).__name__

    def param_leaf_names(self, params: Any, /) -> tuple[str, ...]:
        """How messages name each leaf of ``params``, in ``jax.tree.leaves`` order: ``params['W_h']``.

        Args:
          params: the parameter pytree.

        Returns:
          One name (a str) per leaf of ``params``.
        """
        return tuple("params" + jax.tree_util.keystr(path) for path, _ in jax.tree_util.tree_leaves_with_path(params))

    def hidden(self, states: Any, /) -> Array:
        """The hidden states of what :func:`bppsa.rnn` returns: (T, B, H) for every cell
        (for an LSTM, hs of the pair (hs, cs)).

        Args:
          states: what :func:`bppsa.rnn` returns for this cell, (T, B, H) [LSTM: the pair (hs, cs)].

        Returns:
          hs (T, B, H).
        """
        return states[0] if self.pair_state else states


@runtime_checkable
class AnalyticAdjoint(Protocol):
    """The optional capability behind ``has_adjoint``: a cell's analytic adjoint step, which BPTT
    (:mod:`bppsa.backward.adjoint`) loops over instead of autodiff's. A cell that sets ``has_adjoint``
    defines these methods (:func:`bppsa.rnn` checks it, naming what is missing); the others do
    not have them at all. Shapes as :class:`Cell`'s; ``u`` is :meth:`Cell.project`'s output."""

    def step_factors(self, params: Any, h: Any, u: Any, /) -> tuple[Any, Any]:
        """(:meth:`Cell.step_projected`'s h', the per-unit factors of its Jacobian that :meth:`adjoint_step` reads).

        Args:
          params: the parameter pytree, or :meth:`Cell.loop_params`' form of it.
          h: (B, H) the state before the step [LSTM: (h, c)].
          u: one step's slice of :meth:`Cell.project`'s output.

        Returns:
          The pair (h', factors): the next state, with the structure of ``h``, and a tuple of per-unit
          factors, each (B, H).
        """
        ...

    def adjoint_step(self, params: Any, factors: Any, g: Array, /) -> tuple[Array, Any]:
        """g (B, S) = ∂L/∂s_t -> (g M_t, the part of ∂L/∂s_{t-1} through this step; the step's
        cotangents, which :meth:`adjoint_grads` turns into parameter gradients).

        Args:
          params: the parameter pytree, or :meth:`Cell.loop_params`' form of it.
          factors: the step's factors from :meth:`step_factors`, each (B, H).
          g: (B, S) ∂L/∂s_t, the total gradient of the step's flat state.

        Returns:
          The pair (g_prev, cotangents): g_prev (B, S) = g M_t and the step's cotangents (a tuple of (B, ...)
          arrays).
        """
        ...

    def adjoint_grads(self, params: Any, s_prev: Array, xs: Array, factors: Any, gs: Array, cotangents: Any, /
                      ) -> tuple[Any, Array]:
        """All steps' factors, ∂L/∂s_t and :meth:`adjoint_step` cotangents (T, B, ...) -> (dparams, dxs).

        Args:
          params: the parameter pytree.
          s_prev: (T, B, S) the flat state before each step.
          xs: (T, B, I) each step's input.
          factors: every step's :meth:`step_factors` factors, stacked, each (T, B, H).
          gs: (T, B, S) ∂L/∂s_t.
          cotangents: every step's :meth:`adjoint_step` cotangents, stacked (T, B, ...).

        Returns:
          The pair (dparams, dxs): dparams with the structure of ``params``, summed over t and b; dxs
          (T, B, I).
        """
        ...

    def adjoint_sum_inputs(self, params: Any, s_prev: Array, xs: Array, /) -> Any:
        """What BPTT by the adjoint reads at each step to sum the parameter gradients inside its loop
        (a pytree, leading axis T), arranged once before it (:meth:`adjoint_sum_step` reads it).

        Args:
          params: the parameter pytree.
          s_prev: (T, B, S) the flat state before each step.
          xs: (T, B, I) each step's input.

        Returns:
          A pytree of arrays with leading axis T, step t's slice being what :meth:`adjoint_sum_step` reads.
        """
        ...

    def adjoint_sum_step(self, params: Any, inputs: Any, factors: Any, g: Array, cotangents: Any, /
                         ) -> tuple[Any, Array]:
        """One step's part of the parameter-gradient sums (summed over the batch) and its input's
        cotangent (B, I), from its :meth:`adjoint_sum_inputs`, factors, ∂L/∂s_t and cotangents.

        Args:
          params: the parameter pytree, or :meth:`Cell.loop_params`' form of it.
          inputs: the step's slice of :meth:`adjoint_sum_inputs` (without the T axis).
          factors: the step's :meth:`step_factors` factors, each (B, H).
          g: (B, S) ∂L/∂s_t.
          cotangents: the step's :meth:`adjoint_step` cotangents.

        Returns:
          The pair (sums, dx): the step's terms of the parameter-gradient sums (a pytree, the same at every
          step) and dx (B, I), the gradient of its input.
        """
        ...

    def adjoint_sum_result(self, params: Any, sums: Any, /) -> Any:
        """The sums of :meth:`adjoint_sum_step` over all steps -> dparams (``params``' structure).

        Args:
          params: the parameter pytree.
          sums: the step terms of :meth:`adjoint_sum_step` summed over all steps.

        Returns:
          dparams, with the structure of ``params``.
        """
        ...


def analytic_adjoint(cell: Cell) -> AnalyticAdjoint:
    """``cell`` as its :class:`AnalyticAdjoint` (a cell with ``has_adjoint``); a UsageError names
    the methods a cell that sets ``has_adjoint`` lacks.

    Args:
      cell: a cell that sets ``has_adjoint``.

    Returns:
      ``cell`` itself, typed as an :class:`AnalyticAdjoint`.

    Raises:
      bppsa.errors.UsageError: ``cell`` lacks one of the :class:`AnalyticAdjoint` methods (named).
    """
    if not isinstance(cell, AnalyticAdjoint):
        missing = [m for m in ("step_factors", "adjoint_step", "adjoint_grads", "adjoint_sum_inputs",
                               "adjoint_sum_step", "adjoint_sum_result") if not callable(getattr(cell, m, None))]
        raise UsageError(f"{cell.display_name} sets has_adjoint but lacks {', '.join(missing)} "
                         f"(bppsa.cells.AnalyticAdjoint); define them or set has_adjoint = False")
    return cell


class Affine(Cell):
    """A cell whose input enters only through x W_x + b_x: that product is its :meth:`project`;
    ``_recurrent`` is h's, h W_h + b_h (each bias where the cell has it).

    Attributes:
      input_bias: whether the cell has the input bias b_x (G·H,).
      hidden_bias: whether the cell has the hidden bias b_h (G·H,).

    Raises:
      bppsa.errors.UsageError: on construction, a size that is not a positive int, an activation field not
      a name in :data:`ACTIVATIONS`, or a bias flag that is not a bool (the message names the field).
    """

    input_bias: bool
    hidden_bias: bool
    #: Gate count G (pre-activations per step are G·H wide): the per-step work scales with it.
    gates: ClassVar[int] = 1
    _activations: ClassVar[tuple[str, ...]] = ("gate", "activation")  # the fields naming ACTIVATIONS

    def __post_init__(self):
        name = type(self).__name__
        for field in ("input_size", "hidden_size"):  # numpy and JAX integer scalars are stored as ints
            if (n := as_int(value := getattr(self, field))) is None or n < 1:
                raise UsageError(f"{name}: {field} must be a positive int; got {value!r}")
            object.__setattr__(self, field, n)
        for field in self._activations:
            if not (isinstance(value := getattr(self, field), str) and value in ACTIVATIONS):
                raise UsageError(f"{name}: {field} must be one of {list(ACTIVATIONS)}; got {value!r}")
        for field in ("input_bias", "hidden_bias"):
            if not isinstance(value := getattr(self, field), bool):
                raise UsageError(f"{name}: {field} must be True or False; got {value!r}")

    def init(self, key: Array, dtype: jax.typing.DTypeLike = jnp.float32) -> dict[str, Array]:
        """PyTorch's initialisation, U(±1/√H), of W_x (I, G), W_h (H, G) and the biases the cell has."""
        k = jax.random.split(key, 4)
        bound = 1.0 / float(self.hidden_size) ** 0.5
        G = self.gates * self.hidden_size
        params = {"W_x": _uniform(k[0], (self.input_size, G), bound, dtype),
                  "W_h": _uniform(k[1], (self.hidden_size, G), bound, dtype)}
        if self.input_bias:
            params["b_x"] = _uniform(k[2], (G,), bound, dtype)
        if self.hidden_bias:
            params["b_h"] = _uniform(k[3], (G,), bound, dtype)
        return params

    def project(self, params: Any, xs: Array) -> Any:
        """x W_x + b_x: (..., G·H) for one gate, else a tuple of the G gates' (..., H) parts (a
        loop slicing gates out of one step input runs several times slower on XLA's CPU)."""
        gx = xs @ params["W_x"]
        gx = gx + params["b_x"] if self.input_bias else gx
        return gx if self.gates == 1 else tuple(split_gates(gx, self.gates))

    def loop_params(self, params: Any) -> Any:
        """``params`` with W_hᵀ and W_xᵀ, the adjoint step's products (transposed once, not in every step)."""
        return dict(params, W_hT=params["W_h"].T, W_xT=params["W_x"].T)

    def _transposed(self, params, name="W_h"):  # W_hᵀ (or W_xᵀ): loop_params' copy, else transposed here
        return params[name + "T"] if name + "T" in params else params[name].T

    def _recurrent(self, params, h):
        gh = h @ params["W_h"]
        return gh + params["b_h"] if self.hidden_bias else gh

    def step(self, params: Any, h: Any, x: Array) -> Any:
        return self.step_projected(params, h, self.project(params, x))

    def _contract(self, xs, h_prev, dgx, dgh):
        """Parameter gradients of ``(x W_x + b_x, h W_h + b_h)`` from their cotangents (T, B, G)."""
        grads = {"W_x": flat_outer(xs, dgx), "W_h": flat_outer(h_prev, dgh)}
        if self.input_bias:
            grads["b_x"] = dgx.sum((0, 1))
        if self.hidden_bias:
            grads["b_h"] = dgh.sum((0, 1))
        return grads


class AffineAdjoint(Affine):
    """An :class:`Affine` cell with an analytic adjoint (:class:`AnalyticAdjoint`, ``has_adjoint``):
    a subclass gives :meth:`step_factors` and ``_cotangents`` (the cotangents of the step's two
    products from its factors); the adjoint step, the parameter gradients of BPPSA and of BPTT
    (after the loop or summed in it) are written here once, for the RNN, GRU and LSTM."""

    has_adjoint: ClassVar[bool] = True

    @abc.abstractmethod
    def step_factors(self, params: Any, h: Any, u: Any, /) -> tuple[Any, Any]:
        """(:meth:`Cell.step_projected`'s h', the per-unit factors of its Jacobian that
        :meth:`adjoint_step` reads)."""

    @abc.abstractmethod
    def _cotangents(self, factors, g) -> tuple[Any, Any, Any]:
        """g (..., S) = ∂L/∂s' -> (dgx, dgh, direct): the cotangents of x W_x + b_x and of h W_h + b_h
        (one array where they are equal) and ∂L/∂s not through h W_h (None: nothing; LSTM: c's)."""

    def _factors(self, params, s_prev, xs, s):  # all steps' factors at once (default: the steps again)
        return self.step_factors(params, self.unflatten_state(s_prev), self.project(params, xs))[1]

    def adjoint_step(self, params: Any, factors: Any, g: Array) -> tuple[Array, Any]:
        dgx, dgh, direct = self._cotangents(factors, g)
        dh = dgh @ self._transposed(params)
        g_prev = jnp.concatenate([dh, direct], axis=-1) if self.pair_state else dh if direct is None else dh + direct
        return g_prev, (dgx,) if dgh is dgx else (dgx, dgh)

    def _dgs(self, factors, gs, cotangents):
        """:meth:`adjoint_step`'s cotangents -> (dgx, dgh), those of x W_x + b_x and of h W_h + b_h."""
        return cotangents if len(cotangents) == 2 else cotangents * 2

    def adjoint_grads(self, params: Any, s_prev: Array, xs: Array, factors: Any, gs: Array, cotangents: Any
                      ) -> tuple[Any, Array]:
        return self._grads(params, s_prev, xs, *self._dgs(factors, gs, cotangents))

    def _grads(self, params, s_prev, xs, dgx, dgh):
        return self._contract(xs, s_prev[..., :self.hidden_size], dgx, dgh), dgx @ params["W_x"].T

    def adjoint_sum_inputs(self, params: Any, s_prev: Array, xs: Array) -> tuple[Array, Array]:
        """x and h transposed, (T, I, B) and (T, H, B), each with a row of ones where its product has
        a bias: a step's x_tᵀ dgx and h_tᵀ dgh are then plain products (no transpose in the loop),
        the bias's gradient their last row."""
        def rows(a, bias):
            a = jnp.swapaxes(a, 1, 2)
            return jnp.concatenate([a, jnp.ones_like(a[:, :1])], axis=1) if bias else a

        return rows(xs, self.input_bias), rows(s_prev[..., :self.hidden_size], self.hidden_bias)

    def adjoint_sum_step(self, params: Any, inputs: Any, factors: Any, g: Array, cotangents: Any
                         ) -> tuple[tuple[Array, Array], Array]:
        dgx, dgh = self._dgs(factors, g, cotangents)
        return (inputs[0] @ dgx, inputs[1] @ dgh), dgx @ self._transposed(params, "W_x")

    def adjoint_sum_result(self, params: Any, sums: Any) -> dict[str, Array]:
        (sx, sh), I, H = sums, self.input_size, self.hidden_size
        grads = {"W_x": sx[:I], "W_h": sh[:H]}
        if self.input_bias:
            grads["b_x"] = sx[I]
        if self.hidden_bias:
            grads["b_h"] = sh[H]
        return grads

    def param_grads(self, params: Any, s_prev: Array, xs: Array, s: Array, gs: Array) -> tuple[Any, Array]:
        dgx, dgh, _ = self._cotangents(self._factors(params, s_prev, xs, s), gs)
        return self._grads(params, s_prev, xs, dgx, dgh)


def flat_outer(a: Array, b: Array) -> Array:
    """Σ over the leading axes of a[..., :, None] b[..., None, :] -> (m, n): one product of the flattened
    arrays (the einsum "tbi,tbg->ig" runs 1.4-4.4x slower on XLA's CPU: measurements: diagonal-newton).

    Args:
      a: (..., m), e.g. (T, B, I) inputs.
      b: (..., n) with the leading axes of ``a``, e.g. (T, B, G·H) cotangents.

    Returns:
      (m, n), the outer products summed over the leading axes.
    """
    return a.reshape(-1, a.shape[-1]).T @ b.reshape(-1, b.shape[-1])


def autodiff_jacobian(step_one: Callable[[Any, Array, Array], Array], params: Any, s_prev: Array, xs: Array) -> Array:
    """Transposed Jacobians by autodiff: ``step_one(params, s (S,), x (I,)) -> (S,)`` is one
    example's step; ``jax.jacrev`` of it, vmapped over T and B -> (T, B, S, S). Batch rows cannot
    mix: the step never sees the batch axis.

    Args:
      step_one: one example's step on the flat state, ``step_one(params, s (S,), x (I,)) -> (S,)``.
      params: the parameter pytree.
      s_prev: (T, B, S) the flat state before each step.
      xs: (T, B, I) each step's input.

    Returns:
      Ms (T, B, S, S), M_t[b, i, j] = ∂s_t[b, i] / ∂s_{t-1}[b, j].
    """
    one = jax.jacrev(step_one, argnums=1)
    return jax.vmap(jax.vmap(one, in_axes=(None, 0, 0)), in_axes=(None, 0, 0))(params, s_prev, xs)


def autodiff_param_grads(step_one: Callable[[Any, Array, Array], Array], params: Any, s_prev: Array, xs: Array,
                         gs: Array) -> tuple[Any, Array]:
    """(dparams, dxs (T, B, I)) by one ``jax.vjp`` of ``step_one`` vmapped over T and B.

    Args:
      step_one: one example's step on the flat state, ``step_one(params, s (S,), x (I,)) -> (S,)``.
      params: the parameter pytree.
      s_prev: (T, B, S) the flat state before each step.
      xs: (T, B, I) each step's input.
      gs: (T, B, S) ∂L/∂s_t, the total gradient of each step's state.

    Returns:
      The pair (dparams, dxs): dparams with the structure of ``params``, summed over t and b; dxs
      (T, B, I).
    """
    steps = jax.vmap(jax.vmap(step_one, in_axes=(None, 0, 0)), in_axes=(None, 0, 0))
    _, vjp = jax.vjp(lambda p, x: steps(p, s_prev, x), params, xs)
    return vjp(gs)


@dataclasses.dataclass(frozen=True, eq=False)
class Generic(Cell):
    """Any per-example step ``step_fn(params, h, x) -> h'`` with h, h': (S,) and x: (I,).

    bppsa vmaps ``step_fn`` over the batch (``step`` takes h (B, S), x (B, I)) and, in the
    backward, over time too, so a step cannot couple batch rows (it never sees the batch axis);
    something like ``h.mean(0)`` inside it is a mean over the state's S entries.

    Parameter gradients come from one ``jax.vjp`` of ``step_fn`` vmapped over T and B
    (:func:`autodiff_param_grads`).

    Args:
      step_fn: ``step_fn(params, h, x) -> h'``, one example's step: h, h' (S,), x (I,).
      jacobian_fn: optional ``jacobian_fn(params, h, x) -> (S, S)``: M[i, j] = ∂h'[i]/∂h[j] for one
        example and step; without it, ``jax.jacrev`` of ``step_fn`` (:func:`autodiff_jacobian`).
      hidden_size: optional S, checked against h0 when given.
      input_size: optional I, checked against xs when given.
      init_fn: optional ``init_fn(key, dtype) -> params``: supplies ``init``, and ``param_spec`` (so
        :func:`bppsa.rnn` checks ``params`` against its structure); without it params are not checked.

    Examples:
      A leaky tanh unit, per example; its Jacobians come from ``jax.jacrev``:

      >>> import jax, jax.numpy as jnp, bppsa
      >>> from bppsa import cells
      >>> def step(p, h, x):  # h (S,), x (I,)
      ...     return 0.5 * h + jnp.tanh(p["W"] @ h + p["U"] @ x)
      >>> cell = cells.Generic(step, hidden_size=4, input_size=3)
      >>> params = {"W": 0.1 * jnp.eye(4), "U": jnp.ones((4, 3))}
      >>> xs, h0 = jnp.ones((6, 2, 3)), jnp.zeros((2, 4))
      >>> hs = bppsa.rnn(cell, params, xs, h0)
      >>> hs.shape
      (6, 2, 4)
      >>> ref = jax.lax.scan(lambda h, x: (cell.step(params, h, x),) * 2, h0, xs)[1]
      >>> bool(jnp.allclose(hs, ref, atol=1e-6))
      True
    """

    step_fn: Callable[[Any, jax.Array, jax.Array], jax.Array]
    jacobian_fn: Callable[[Any, jax.Array, jax.Array], jax.Array] | None = None
    hidden_size: int | None = None  # type: ignore[assignment]
    input_size: int | None = None
    init_fn: Callable | None = None

    def init(self, key: Array, dtype: jax.typing.DTypeLike = jnp.float32) -> Any:
        if self.init_fn is None:
            raise UsageError("Generic.init needs init_fn(key, dtype); none was given")
        return self.init_fn(key, dtype)

    def param_spec(self, dtype: jax.typing.DTypeLike = jnp.float32) -> Any:
        return None if self.init_fn is None else super().param_spec(dtype)

    def step(self, params: Any, h: Array, x: Array) -> Array:
        return jax.vmap(self.step_fn, in_axes=(None, 0, 0))(params, h, x)

    def transposed_jacobian(self, params: Any, s_prev: Array, xs: Array, s: Array) -> Array:
        if self.jacobian_fn is None:
            return autodiff_jacobian(self.step_fn, params, s_prev, xs)
        over_b = jax.vmap(self.jacobian_fn, in_axes=(None, 0, 0))
        return jax.vmap(over_b, in_axes=(None, 0, 0))(params, s_prev, xs)

    def param_grads(self, params: Any, s_prev: Array, xs: Array, s: Array, gs: Array) -> tuple[Any, Array]:
        return autodiff_param_grads(self.step_fn, params, s_prev, xs, gs)
