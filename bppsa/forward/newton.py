r"""The parallel forward: Newton's method over the whole sequence (DEER, ParaRNN), quasi-Newton
(quasi-DEER), optional damping, and a fallback that never returns an unconverged result.

A chain h_t = f(h_{t-1}, x_t), t = 1..T, is the root of the residual r_t(H) = h_t − f(h_{t-1}, x_t)
in the unknowns H = (h_1 … h_T). One Newton iteration evaluates, in parallel over t, the steps
f_t = f(h_{t-1}, x_t) and their Jacobians J_t = ∂f/∂h at the current guess H, and solves the
linear recurrence

.. math::

    h'_t = J_t h'_{t-1} + (f_t - J_t h_{t-1}), \qquad h'_0 = h_0,

an affine scan of (J_t, c_t) pairs, the same operator the BPPSA backward solves, run forwards:
the project's scans (:mod:`bppsa.scan`: "blelloch", "associative", "sequential") in Θ(log T)
levels, over chunks of ``chunk_size`` steps (one chunk's Jacobians in memory at a time: exact, as
chunking only orders the solve). Iteration k makes at least the first k states exact, so Newton
converges in at most T iterations, and quadratically near the solution; contractive cells need a
handful. Cells with block-diagonal Jacobians (:class:`bppsa.cells.Blocks`, heads
of size k; k = 1 diagonal) scan (k, k) blocks, never S×S matrices.

- ``kind="quasi"``: the iterations use diag(J_t) only (elementwise scans, O(T·B·S) memory);
  slower to converge, the same fixed point.
- ``damping=λ0``: the trust-region (Levenberg–Marquardt) step of ELK (Gonzalez et al., 2024):
  the states minimising :math:`\|\text{linearised residual}\|^2 + \lambda \|H' - H\|^2`, solved
  exactly by a parallel Kalman smoother (:func:`bppsa.forward.elk.trust_region_solve`; λ = 0 Newton,
  λ → ∞ no step), with the full
  Jacobians (ELK) or their diagonals (``kind="quasi"``: quasi-ELK, elementwise). λ adapts as
  Levenberg–Marquardt's: a step that does not lower the sum of squared residuals (the quantity the
  step minimises to first order) is rejected and λ grows tenfold (at least to 1), an accepted one
  divides it by ten. A damped step stays within its trust region, but loses Newton's guarantee (k
  steps: k exact states), can stall on an expanding recurrence, and runs unchunked on one device.
- An expanding recurrence (spectral radius well above 1) is ill-conditioned: a converged iterate
  meets ``tol`` at every step yet may differ from the sequential forward's states (themselves
  rounding-dominated there) by O(1); its gradients are exact at the states returned.
- Convergence (:func:`iterate`): every step's residual
  :math:`|h_t - f_t| \le \mathrm{atol} + \mathrm{rtol}\,|f_t|` and every state's estimated error
  (the last step; for quasi and damped steps times :math:`q/(1 - q)`)
  :math:`\le \mathrm{atol} + \mathrm{rtol}\,|h_t|` (defaults: ``tol`` per dtype,
  :data:`bppsa.plan.options.DEFAULT_TOL`). The gradient is exact whatever forward ran: the
  backward linearises at the final states
  (:func:`bppsa.backward.rule.solved_states`), with the full Jacobians (quasi included).
- Safeguards (:func:`repair`): NaN/inf entries of an iterate take the fixed-point step's value,
  everything is clipped to ±sqrt(the dtype's max), and the iteration goes on (Newton's guarantee
  holds). It stops early, not converged, on NaN/inf xs or h0, or after :data:`PATIENCE` idle steps.
- Predictability: :attr:`NewtonInfo.lle` is the largest Lyapunov exponent along the returned
  states (:func:`lle_at`), :attr:`NewtonInfo.predicted` the iterations it foresees
  (:func:`predicted_iterations`); ``forward="auto"`` off the CPU tests them on
  :data:`PROBE_WINDOWS` windows of :data:`PROBE_STEPS` steps at the start, the middle and the end of
  the sequence (:func:`probe_windows`, :attr:`bppsa.plan.options.Plan.gate`).
- Not converged (``max_iter`` spent, stalled, or NaN/inf inputs): ``on_fail="sequential"`` runs the
  sequential forward instead (a :class:`NewtonFallbackWarning` the first time, every time counted:
  :func:`fallback_count`), ``on_fail="raise"`` raises :class:`NewtonDidNotConverge` (under
  ``jax.jit`` JAX re-raises it from its host callback as a ``jax.errors.JaxRuntimeError``, a
  RuntimeError whose message names it). Unconverged states are never returned. A non-finite
  iterate's message names the first step whose state became NaN/inf and the inputs (xs, s0,
  params) that hold NaN/inf, if any (computed only when the iteration failed).
  :class:`NewtonInfo` says what happened (``bppsa.rnn(..., return_info=True)``). A program
  exported by ``jax.export`` (which cannot carry a host callback: e.g. a training step exported
  for CUDA on a CPU host) leaves the report out: ``on_fail="sequential"`` falls back unannounced,
  ``on_fail="raise"`` returns NaN states.

Every setting comes from one :class:`bppsa.plan.options.Plan` (``forward`` is the kind, ``scan``,
``solve_chunk``, ``tol``, ``atol``, ``rtol``, ``max_iter``, ``damping``, ``on_fail``, ``unroll`` the
fallback's, ``gate``), made before the solver runs: nothing is decided here.
"""

from __future__ import annotations

import functools
import threading
import warnings
from typing import Any, Callable, NamedTuple, cast

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array, lax
from jax.core import Tracer
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir

from bppsa.cells import Cell
from bppsa.cells.structure import block_size, jacobian_blocks
from bppsa.forward.info import NewtonDidNotConverge, NewtonFallbackWarning, NewtonInfo
from bppsa.forward.lyapunov import lyapunov_from_jacobians
from bppsa.forward.sequential import forward_states, prev_states, steps
from bppsa.forward.step import newton_step, step_diagonal, step_elements
from bppsa.plan.options import Plan

# NewtonInfo and its outcomes are bppsa.forward.info's: named here too (the plan's names are bppsa.plan.options')
__all__ = ["NewtonInfo", "NewtonDidNotConverge",
           "NewtonFallbackWarning", "solve", "fallback_count", "step_elements", "residual", "iterate",
           "finish", "repair", "bound", "finite_inputs", "PATIENCE", "PROBE_STEPS", "PROBE_WINDOWS", "probe_windows",
           "probe", "lle_at", "predicted_iterations"]
#: The iteration stops (not converged) after this many steps in a row that improved neither the largest
#: residual, nor the first step whose residual misses the tolerance, nor the step size (:func:`iterate`).
PATIENCE = 10
#: forward="auto" (:attr:`bppsa.plan.options.Plan.gate`): the exponent is estimated along windows of this many
#: steps, at most PROBE_WINDOWS of them spread over the sequence (:func:`probe_windows`)
PROBE_STEPS = 64
PROBE_WINDOWS = 3


_lock = threading.Lock()
_fallbacks = [0]


def fallback_count() -> int:
    """How many parallel forwards in this process fell back to the sequential forward.

    Returns:
      The count, an int (each sequence of a vmapped batch counted).
    """
    return _fallbacks[0]


def _report(converged, iterations, residual, error, bad_step, bad_xs, bad_s0, bad_params, *, on_fail: str,
            atol: float, rtol: float, max_iter: int, cell: str, param_names: tuple[str, ...]):
    """Host side of the convergence check (a ``jax.debug.callback``; batched under vmap). The bad_*
    arrays (:func:`_diagnose`; -1 / False where finite) name where NaN/inf came in."""
    failed = int(np.size(converged) - np.count_nonzero(converged))
    if not failed:
        return
    tols = f"tol {atol:.3g}" if atol == rtol else f"atol {atol:.3g}, rtol {rtol:.3g}"
    what = (f"the parallel forward of {cell} did not converge after {int(np.max(iterations))} iterations "
            f"({tols}; residual {np.max(residual):.3g}, estimated state error {np.max(error):.3g})")
    steps_bad, xs_bad = np.asarray(bad_step)[np.asarray(bad_step) >= 0], np.asarray(bad_xs)[np.asarray(bad_xs) >= 0]
    if steps_bad.size or not np.all(np.isfinite(residual)):  # NaN/inf: more iterations cannot help
        inputs = ([f"xs[{int(xs_bad.min())}]"] if xs_bad.size else []) + (["h0"] if np.any(bad_s0) else []) + [
            name for i, name in enumerate(param_names) if np.any(np.asarray(bad_params)[..., i])]
        at = f"the states became NaN/inf at step {int(steps_bad.min())}" if steps_bad.size else \
            "the residual became NaN/inf"
        found = f"the inputs contain NaN/inf: {', '.join(inputs)}" if inputs else \
            "the inputs are finite: the iterate (or the recurrence itself) overflowed"
        what = f"{what}: {at} ({found}); raising max_iter will not help"
        advice = "remove the NaN/inf from the inputs" if inputs else \
            "pass damping= (a damped step cannot overflow) or use forward='sequential'"
    elif int(np.max(iterations)) < max_iter:
        what = f"{what}: it stopped improving ({PATIENCE} iterations in a row without progress)"
        advice = "pass damping=, or use forward='sequential' (the recurrence may be chaotic on these inputs)"
    else:
        advice = "raise max_iter, pass damping=, or use on_fail='sequential' (or forward='sequential')"
    if on_fail == "raise":
        raise NewtonDidNotConverge(f"{what}; {advice}")
    with _lock:
        first = _fallbacks[0] == 0
        _fallbacks[0] += failed
    if first:
        warnings.warn(f"{what}; the sequential forward ran instead (counted by bppsa.forward.newton.fallback_count(); "
                      "this warning is shown once)", NewtonFallbackWarning, stacklevel=1)


class _DropOwnFailure:
    """A logging filter: JAX logs an exception a host callback raises ("jax.debug.callback failed",
    with its traceback) before it re-raises it; the caller gets :class:`NewtonDidNotConverge`
    itself (wrapped by JAX under ``jax.jit``), so its logged copy is dropped. Other failures stay."""

    def filter(self, record) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not isinstance(exc, NewtonDidNotConverge)


_quiet = _DropOwnFailure()


def _quiet_callback_log() -> None:
    """Install :class:`_DropOwnFailure` on JAX's callback logger, once (at the first traced
    ``on_fail="raise"``; importing bppsa changes nothing in the process)."""
    import logging

    logger = logging.getLogger("jax._src.debugging")
    if _quiet not in logger.filters:
        logger.addFilter(_quiet)


def _report_impl(H, *report, settings):
    _report(*(np.asarray(a) for a in report), **dict(settings))
    return H, report[0]


def _report_lowering(ctx, H, *report, settings):
    """The report as a host callback; exported (``jax.export``: the program may run where no Python
    host is, and a host callback cannot be serialised) none: there an iteration that did not
    converge with ``on_fail="raise"`` makes the states NaN (never an unconverged result),
    ``on_fail="sequential"`` falls back unannounced."""
    def exported(H, converged, *_):
        if dict(settings)["on_fail"] == "raise":
            ok = jnp.reshape(converged, converged.shape + (1,) * (H.ndim - converged.ndim))
            H = jnp.where(ok, H, jnp.asarray(jnp.nan, H.dtype))
        return [H, converged]

    def reported(H, *report):
        jax.debug.callback(functools.partial(_report, **dict(settings)), *report)
        return [H, report[0]]

    run = exported if ctx.module_context.lowering_parameters.for_export else reported
    return mlir.lower_fun(run, multiple_results=True)(ctx, H, *report)


def _report_batch(args, dims, *, settings):
    size = next(a.shape[d] for a, d in zip(args, dims, strict=True) if d is not None)
    front = [jnp.broadcast_to(a, (size, *a.shape)) if d is None else jnp.moveaxis(a, d, 0)
             for a, d in zip(args, dims, strict=True)]
    return _report_p.bind(*front, settings=settings), (0, 0)


def _report_jvp(primals, tangents, *, settings):
    H, converged = _report_p.bind(*primals, settings=settings)
    return (H, converged), (ad.instantiate_zeros(tangents[0]), ad.Zero(converged.aval.to_tangent_aval()))


# finish's report: (H, converged) passed through, the report (_report) a host callback on the way;
# as a primitive of its own so that an exported program leaves it out (_report_lowering)
_report_p = Primitive("bppsa_newton_report")
_report_p.multiple_results = True
_report_p.def_impl(_report_impl)
_report_p.def_abstract_eval(lambda H, converged, *_, settings: (H, converged))
batching.primitive_batchers[_report_p] = _report_batch
ad.primitive_jvps[_report_p] = _report_jvp
mlir.register_lowering(_report_p, _report_lowering)


def _diagnose(cell: Cell, H: Array, inputs: tuple[Any, Array, Array]) -> tuple[Array, Array, Array, Array]:
    """Where an unconverged iterate H (T, B, S) and the inputs (params, xs, s0) are not finite (run
    only when the iteration failed): (the first step t whose state H[t] or step f(h_{t-1}, x_t) at
    H is NaN/inf, xs' first such step, whether s0 is, whether each leaf of params is); -1 / False
    where all is finite. (A flax cell's non-float state rides in float bits: see bppsa.nn.)"""
    params, xs, s0 = inputs
    F = steps(cell, params, prev_states(s0, H), xs)
    first = lambda bad: jnp.where(jnp.any(bad), jnp.argmax(bad), -1).astype(jnp.int32)
    per_step = lambda a: ~jnp.all(jnp.isfinite(a).reshape(a.shape[0], -1), axis=1)
    leaves = jax.tree.leaves(params)
    bad_params = jnp.stack([~jnp.all(jnp.isfinite(leaf)) for leaf in leaves]) if leaves else jnp.zeros((0,), bool)
    return first(per_step(H) | per_step(F)), first(per_step(xs)), ~jnp.all(jnp.isfinite(s0)), bad_params


def residual(H: Array, F: Array) -> Array:
    r"""The relative residual :math:`\max |H - F| / (1 + |F|)` of the recurrence at the iterate H; +inf
    where anything is NaN (XLA's max on CPU can skip NaNs: an overflowed iterate must never look
    converged); 0 for no states (a batch of 0: nothing to solve).

    Args:
      H: (T, B, S) the iterate.
      F: (T, B, S) the steps at H, f(h_{t-1}, x_t).

    Returns:
      The residual, a scalar array.
    """
    r = jnp.abs(H - F) / (1 + jnp.abs(F))
    return jnp.max(jnp.where(jnp.isnan(r), jnp.inf, r), initial=0.0)


def bound(dtype: Any) -> float:
    """The magnitude an iterate is clipped to (:func:`repair`): sqrt of the dtype's largest finite
    value (float32 1.8e19, float64 1.3e154), so that a product of two clipped values stays finite.

    Args:
      dtype: a floating dtype.

    Returns:
      The bound, a Python float.
    """
    return float(np.sqrt(np.finfo(dtype).max))


def repair(H: Array, F: Array | None = None) -> Array:
    """The iterate H made usable for the next linearisation: each NaN/inf entry replaced by the same
    entry of F, the steps f(h_{t-1}, x_t) at the previous iterate (the fixed-point step there; 0
    where F is not finite either, or without F), and every entry clipped to ±:func:`bound`.

    Where the scan's products of Jacobians overflow (an expanding stretch) the solve gives inf/NaN
    although the states are finite; the fixed-point step at those entries keeps Newton's guarantee
    (a step from an iterate whose first j states are exact makes the first j + 1 exact), so the
    iteration goes on from the repaired iterate.

    Args:
      H: (T, B, S) the new iterate.
      F: (T, B, S) the steps at the previous iterate, or None.

    Returns:
      (T, B, S) the repaired iterate, finite.
    """
    b = bound(H.dtype)
    keep = jnp.zeros((), H.dtype) if F is None else jnp.where(jnp.isfinite(F), F, jnp.zeros((), H.dtype))
    return jnp.clip(jnp.where(jnp.isfinite(H), H, keep), -b, b)


def _over(d: Array, ref: Array, atol: float, rtol: float) -> Array:
    """|d| / (atol + rtol·|ref|) elementwise (<= 1: within the tolerances); 0 where d is 0, +inf
    where NaN."""
    r = jnp.where(d == 0, jnp.zeros((), d.dtype), jnp.abs(d) / (atol + rtol * jnp.abs(ref)))
    return jnp.where(jnp.isnan(r), jnp.inf, r)


def _per_step_max(*xs: Array) -> tuple[Array, ...]:
    """Each (T, ...) array's maximum over all but its first axis, all in one pass: one variadic
    reduction, into which XLA's CPU fuses the arrays' producers (separate max reductions each
    write their input out first: 2.3-2.5x slower at T·B·S = 2M-4M, measurements: diagonal-newton)."""
    init = tuple(jnp.asarray(-jnp.inf, x.dtype) for x in xs)
    return lax.reduce(xs, init, lambda a, b: tuple(jnp.maximum(u, v) for u, v in zip(a, b, strict=True)),
                      tuple(range(1, xs[0].ndim)))


class _Measures(NamedTuple):
    """An iterate's tests (scalars, equal on every device): the largest residual in units of the
    tolerance, the first step whose residual does not meet it (the length if none: the converged
    front, which Newton's guarantee moves on), and (damped steps) the sum of squared residuals."""

    over: Array
    front: Array
    merit: Array


class _Carry(NamedTuple):
    """The iteration's state between two steps (:func:`iterate`)."""

    k: Array  # steps taken (rejected damped steps included)
    H: Array  # the iterate
    F: Any  # evaluate(H): the steps at H (or (F, D)); fused (iterate's measured): the reduce kernel's aggregates at H
    m: _Measures  # H's measures
    err: Array  # the estimated state error, in units of the tolerance
    err_rel: Array  # the same, in the reported units (max |h − h*| / (1 + |h|))
    step: Array  # the last step's size, max |H' − H| / (1 + |H'|) in the tolerance's units
    best_over: Array  # the best largest residual so far
    best_front: Array  # the furthest converged front so far
    best_step: Array  # the smallest step so far
    stall: Array  # steps in a row that improved none of the three bests
    lam: Array  # the damping λ (0 undamped)
    exact: Array  # accepted undamped steps: the first that many states are exact


def iterate(plan: Plan, H: Array, evaluate: Callable[[Array], Any],
            update: Callable[[Array, Any, Array | None], Array], *, inputs_ok: Array | bool = True,
            axes: Any = None, offset: Array | int = 0, length: int | None = None,
            measured: tuple[Callable[[Array], tuple[Any, Any]], Callable[[Any, Array], tuple[Array, Any]]] | None = None
            ) -> tuple[Array, Array, Array, Array, Array, Any]:
    r"""The iteration, whatever computes its pieces: ``evaluate(H) -> F`` (the steps f(h_{t-1}, x_t)
    at H; or a tuple (F, D), D what ``update`` reuses, made in the same pass) and ``update(H, F,
    lam) -> H'`` (the solve of the linearised recurrence; with a λ, not None, the trust-region step
    around H); ``axes``: the mesh axes H is split over (the tests are
    reduced over them), None on one device, ``offset`` the time index of this device's first step and ``length`` the
    number of real steps (None: all; the states past it, a mesh's padding, are not tested). With
    ``plan.damping`` the damped step (module docstring). ``measured = (reduce, apply)`` (undamped,
    one device; :meth:`bppsa.plan.backends.Fused.newton_reduce` and ``newton_apply``, the fused
    kernels): ``reduce(H) -> (aggregates, residual)`` the first half of the step from H and, as its
    by-product, H's residual pieces (:class:`bppsa.kernels.newton.Residual`); ``apply(aggregates,
    exact) -> (H', steps)`` the rest of the step and its sizes (:class:`~bppsa.kernels.newton.StepSize`).
    They replace ``update`` and the pass of ``evaluate`` and the tests in each iteration: ``reduce``
    runs once before the loop, then each iteration is ``apply`` with the carried aggregates and
    ``reduce`` at H' (its aggregates are the next step's, its residual H''s test); ``evaluate``
    runs once, after the loop. An H' that needs a :func:`repair` is repaired and measured by XLA
    as without them (its aggregates still the reduce's, at the repaired H').

    Every new iterate is :func:`repair`-ed. Converged when every step's residual meets the
    tolerances (:math:`|h_t - f_t| \le \mathrm{atol} + \mathrm{rtol}\,|f_t|`) and so does the estimated error of every
    state: the
    last step H^(k) − H^(k−1), which solves the linearised residual equation and so is the error of
    H^(k−1) to first order (the residual amplified by the recurrence); Newton's error after it is
    second order. For the linearly converging steps (quasi, damped) the step times max(1, q/(1 − q)),
    q the ratio of the last two steps (the bound of a contraction with rate q; q >= 1: not
    converged). Whatever the Jacobians, an undamped step from an iterate whose first j states are
    exact makes the first j + 1 exact, so after n such steps the first n states are exact and only
    the later ones' steps are tested (at most T steps, as Newton's bound; a damped step moves every
    state). Stops when converged, after ``plan.max_iter`` steps, when ``inputs_ok`` is False, or
    after :data:`PATIENCE` steps in a row that improved neither the largest residual, nor the first
    step whose residual misses the tolerance (the converged front), nor the step size. Returns (iterations, H, residual
    (:math:`\max |h - f| / (1 + |f|)`), error (the estimate, in the units of ``residual``), converged, ``evaluate(H)``
    (None for no states)).

    Args:
      plan: the :class:`bppsa.plan.options.Plan` (``forward``, ``damping``, ``atol``, ``rtol``, ``max_iter``).
      H: (T, B, S) the first iterate (on a mesh this device's stretch).
      evaluate: ``evaluate(H)``, the steps F (T, B, S) at H, or a tuple (F, D).
      update: ``update(H, F, lam)``, the next iterate (T, B, S); lam None for the undamped step.
      inputs_ok: False stops before the first step (:func:`finite_inputs`).
      axes: the mesh axes H is split over, or None (one device).
      offset: the time index of H's first step.
      length: the number of real steps (None: all).
      measured: ``(reduce, apply)``, the undamped step in two halves and its measures, or None.

    Returns:
      (iterations, H, residual, error, converged, F), scalars but for the final iterate H (T, B, S)
      and F, ``evaluate(H)`` at it.
    """
    damped, atol, rtol = plan.damping is not None, cast(float, plan.atol), cast(float, plan.rtol)  # a Plan: floats
    linear = damped or plan.forward == "quasi"
    if H.size == 0:  # no states (a batch of 0): nothing to solve, and the body's shapes may not exist
        zero = jnp.zeros((), H.dtype)
        return jnp.int32(0), H, zero, zero, jnp.ones((), bool), None
    pmax = (lambda a: lax.pmax(a, axes)) if axes is not None else (lambda a: a)
    pmin = (lambda a: lax.pmin(a, axes)) if axes is not None else (lambda a: a)
    psum = (lambda a: lax.psum(a, axes)) if axes is not None else (lambda a: a)

    value = lambda F: F[0] if isinstance(F, tuple) else F  # noqa: E731
    fused = measured is not None and not damped and axes is None and length is None

    def measure(H, F, d=None) -> tuple[_Measures, tuple[Array, ...]]:
        """H's measures and the per-step maxima (one pass, :func:`_per_step_max`) of its residual
        and, with d (the last step), of d in the tolerance's units and (atol != rtol) |d| / (1 + |H|)."""
        F = value(F)
        terms = [_over(H - F, F, atol, rtol)]
        if d is not None:
            terms.append(_over(d, H, atol, rtol))
            if atol != rtol:  # else dn_rel is dn's units: dn·atol
                terms.append(jnp.abs(d) / (1 + jnp.abs(H)))
        maxima = _per_step_max(*terms)
        per_step = maxima[0]
        front = jnp.min(jnp.where(per_step > 1, t[:, 0, 0], jnp.iinfo(jnp.int32).max), initial=jnp.iinfo(jnp.int32).max)
        merit = psum(jnp.sum(jnp.where(tested, H - F, 0) ** 2)) if damped else jnp.zeros((), H.dtype)
        return _Measures(pmax(jnp.max(per_step)), pmin(front), jnp.where(jnp.isnan(merit), jnp.inf, merit)), maxima

    t = offset + jnp.arange(H.shape[0], dtype=jnp.int32)[:, None, None]  # each state's time index (0: h_1)
    tested = t < (H.shape[0] if length is None else length)
    H = repair(H)
    # the fused kernels' two halves of a step (unused without them)
    reduce_, apply_ = cast("tuple[Any, Any]", measured if fused else (None, None))
    if fused:  # the fused kernels' first half of the first step, and H's residual from it
        F, r = reduce_(H)  # F: the aggregates at the iterate, carried
        m = _Measures(r.over, r.front, jnp.zeros((), H.dtype))
    else:
        F = evaluate(H)
        m = measure(H, F)[0]
    inf = jnp.asarray(jnp.inf, m.over.dtype)
    lam0 = jnp.asarray(plan.damping if damped else 0.0, m.over.dtype)
    init = _Carry(k=jnp.int32(0), H=H, F=F, m=m, err=inf, err_rel=inf, step=inf, best_over=m.over,
                  best_front=m.front, best_step=inf, stall=jnp.int32(0), lam=lam0, exact=jnp.int32(0))

    def converged(c: _Carry) -> Array:
        return (c.m.over <= 1) & (c.err <= 1)

    def cond(c: _Carry) -> Array:
        return (c.k < plan.max_iter) & ~converged(c) & (c.stall < PATIENCE) & jnp.asarray(inputs_ok)

    def body(c: _Carry) -> _Carry:
        k, H, F, m, err, err_rel, step, best_over, best_front, best_step, stall, lam, exact = c

        def measured_here(Hn, F):
            Hn = repair(Hn, value(F))
            Fn = evaluate(Hn)
            d = jnp.where(tested & (t > exact), Hn - H, jnp.zeros((), H.dtype))  # states 0..exact are exact now
            mn, maxima = measure(Hn, Fn, d)
            dn = pmax(jnp.max(maxima[1], initial=0.0))  # max |H' − H| / (1 + |H'|): dn's units where atol = rtol
            dn_rel = dn * atol if atol == rtol else pmax(jnp.max(maxima[2], initial=0.0))
            return Hn, Fn, mn, dn, dn_rel

        if fused:  # the kernels' measures, unless H' needs a repair (then as XLA's, F at H made anew)
            Hk, q = apply_(F, exact)
            fits = q.size <= bound(H.dtype)

            def kernels():
                return Hk, jnp.zeros((), m.over.dtype), jnp.int32(0), q.step, \
                    q.step * atol if atol == rtol else q.step_rel

            def repaired():
                Hr, _, mr, dr, dr_rel = measured_here(Hk, evaluate(H))
                return Hr, mr.over, mr.front, dr, dr_rel

            Hn, over_r, front_r, dn, dn_rel = lax.cond(fits, kernels, repaired)
            Fn, r = reduce_(Hn)  # the next step's first half at H', and H''s residual
            mn = _Measures(jnp.where(fits, r.over, over_r), jnp.where(fits, r.front, front_r),
                           jnp.zeros((), H.dtype))
        else:
            Hn, Fn, mn, dn, dn_rel = measured_here(update(H, F, lam if damped else None), F)
        if linear:
            q = dn / step
            factor = jnp.where(q < 1, jnp.maximum(1, q / (1 - q)), jnp.inf)
        else:
            factor = jnp.ones((), dn.dtype)
        errn = jnp.where(dn == 0, 0, dn * factor)
        errn_rel = jnp.where(dn_rel == 0, 0, dn_rel * factor)
        # damped: a step is accepted when it lowers the merit, or when its iterate already meets
        # the residual's tolerance (from a converged guess no step can lower the merit, and its
        # iterate's error is then that step: a warm start converges in one iteration, as undamped)
        ok = (jnp.isfinite(mn.over) & ((mn.merit < m.merit) | (mn.over <= 1))) if damped else True
        pick = lambda new, old: jnp.where(ok, new, old)  # damped: a rejected step keeps the iterate
        improved = ok & ((mn.over < best_over) | (mn.front > best_front) | (dn < best_step))
        new_lam = jnp.where(ok, lam / 10, jnp.maximum(10 * lam, 1)) if damped else lam
        return _Carry(k=k + 1, H=pick(Hn, H), F=jax.tree.map(pick, Fn, F), m=jax.tree.map(pick, mn, m),
                      err=pick(errn, err), err_rel=pick(errn_rel, err_rel), step=pick(dn, step),
                      best_over=jnp.minimum(best_over, pick(mn.over, best_over)),
                      best_front=jnp.maximum(best_front, pick(mn.front, best_front)),
                      best_step=jnp.minimum(best_step, pick(dn, best_step)),
                      stall=jnp.where(improved, 0, stall + 1), lam=new_lam, exact=exact if damped else exact + 1)

    c = lax.while_loop(cond, body, init)
    F = evaluate(c.H) if fused else c.F
    # the residual: once, at the end
    return c.k, c.H, pmax(residual(c.H, value(F))), c.err_rel, converged(c), F


def finish(cell: Cell, plan: Plan, k: Array, H: Array, res: Any, err: Any, converged: Any,
           sequential: Callable[[], Array], inputs: tuple[Any, Array, Array]) -> tuple[Array, NewtonInfo]:
    """Report (:class:`NewtonFallbackWarning` / :class:`NewtonDidNotConverge`, naming the NaN/inf
    in H and in ``inputs`` = (params, xs, s0) when there is one) and apply ``plan.on_fail``:
    ``sequential()`` computes the sequential forward's states, run only when the iteration did
    not converge. Returns (states, :class:`NewtonInfo`).

    Args:
      cell: the cell (its name and parameter names in the messages).
      plan: the :class:`bppsa.plan.options.Plan` (``on_fail``, ``atol``, ``rtol``, ``max_iter``).
      k: the iterations taken.
      H: (T, B, S) the final iterate.
      res: its residual.
      err: its estimated error.
      converged: whether the iteration converged.
      sequential: a zero-argument function computing the sequential forward's states (T, B, S).
      inputs: (params, xs (T, B, I), s0 (B, S)).

    Returns:
      (states, info), states (T, B, S) the iterate or, not converged with ``on_fail="sequential"``,
      the sequential forward's; info the :class:`NewtonInfo` (``lle`` NaN and ``predicted`` -1, for the
      caller to fill in).

    Raises:
      NewtonDidNotConverge: not converged with ``on_fail="raise"`` (under ``jax.jit``
      JAX's ``jax.errors.JaxRuntimeError`` naming it).
    """
    converged = converged & jnp.all(jnp.isfinite(H))
    n = len(jax.tree.leaves(inputs[0]))
    finite = lambda: (jnp.int32(-1), jnp.int32(-1), jnp.zeros((), bool), jnp.zeros((n,), bool))
    diagnosis = lax.cond(converged, finite, lambda: _diagnose(cell, H, inputs))
    names = cell.param_leaf_names(inputs[0])
    report = (converged, k, res, err, *diagnosis)
    settings = dict(on_fail=plan.on_fail, atol=plan.atol, rtol=plan.rtol, max_iter=plan.max_iter,
                    cell=cell.display_name, param_names=names)
    if any(isinstance(a, Tracer) for a in report):
        if plan.on_fail == "raise":
            _quiet_callback_log()
        H, converged = _report_p.bind(H, *report, settings=tuple(settings.items()))
    else:
        # called eagerly: reported here, so NewtonDidNotConverge reaches the caller as it is (a host
        # callback would log it with a traceback first)
        _report(*(np.asarray(a) for a in report), **settings)
    if plan.on_fail == "sequential":
        H = lax.cond(converged, lambda: H, sequential)
    fell_back = ~converged if plan.on_fail == "sequential" else jnp.zeros((), bool)
    return H, NewtonInfo(k, converged, fell_back, res, err, jnp.asarray(jnp.nan, H.dtype), jnp.int32(-1),
                         jnp.zeros((), bool))


def finite_inputs(xs: Array, s0: Array) -> Array:
    """Whether xs and s0 are finite (NaN/inf there: no iteration can converge, so none is run). The
    params are not tested here (a flax cell's non-float state rides in them as float bits); NaN in
    them stops the iteration by the :data:`PATIENCE` rule, and the report names them.

    Args:
      xs: (T, B, I) inputs.
      s0: (B, S) the flat initial state.

    Returns:
      A boolean scalar array.
    """
    return jnp.all(jnp.isfinite(xs)) & jnp.all(jnp.isfinite(s0))


def lle_at(cell: Cell, params: Any, xs: Array, s0: Array, H: Array, diagonal: Array | None = None) -> Array:
    """The largest Lyapunov exponent (max over the batch) of the Jacobians at (h_{t-1}, x_t) along
    the iterate H (T, B, S) (:func:`bppsa.forward.lyapunov.lyapunov_from_jacobians`); -inf for no states.
    ``diagonal``: those Jacobians (T, B, S) where they are diagonal and already at hand.

    Args:
      cell: the cell.
      params: the cell's parameters.
      xs: (T, B, I) inputs.
      s0: (B, S) the flat initial state.
      H: (T, B, S) the states.
      diagonal: (T, B, S) the Jacobians' diagonals at H, or None (computed here).

    Returns:
      The exponent, a scalar array, in nats per step.
    """
    if H.size == 0:
        return jnp.asarray(-jnp.inf, H.dtype)
    sp = prev_states(s0, H)
    blocks = diagonal[..., None, None] if diagonal is not None else \
        jacobian_blocks(cell, params, sp, xs, steps(cell, params, sp, xs))
    k = blocks.shape[-1]
    return jnp.max(lyapunov_from_jacobians(blocks.reshape((H.shape[0], -1, k, k))))


def probe_windows(T: int) -> tuple[int, ...]:
    """The first steps of :func:`probe`'s windows of L = min(T, :data:`PROBE_STEPS`) steps:
    min(:data:`PROBE_WINDOWS`, ⌈T/L⌉) of them, evenly from 0 to T − L (the start, middle and end).

    Args:
      T: the number of steps.

    Returns:
      The windows' first steps, distinct ints in increasing order.
    """
    L = min(T, PROBE_STEPS)
    n = min(PROBE_WINDOWS, -(-T // max(L, 1)))
    return tuple(sorted({round(i * (T - L) / max(1, n - 1)) for i in range(n)}))


def probe(cell: Cell, params: Any, xs: Array, s0: Array, unroll: int | None = None) -> tuple[Array, Array]:
    """``forward="auto"``'s probe of xs (T, B, I) from s0 (B, S): (the largest Lyapunov exponent over
    the batch along the windows of :func:`probe_windows`, the first window's (exact) states (L, B, S)).
    The windows run side by side in one sequential forward of L steps (``unroll``; None: tuned), each
    from s0: the states inside the sequence are not known before it, but a contracting cell forgets
    its start within its memory, and an expanding stretch shows a positive exponent from any start.

    Args:
      cell: the cell.
      params: the cell's parameters.
      xs: (T, B, I) inputs.
      s0: (B, S) the flat initial state.
      unroll: the windows' forward's unroll (None: tuned).

    Returns:
      (lle, states), lle a scalar array and states (L, B, S) the first window's states.
    """
    L, starts = min(xs.shape[0], PROBE_STEPS), probe_windows(xs.shape[0])
    xw = jnp.concatenate([xs[a:a + L] for a in starts], axis=1)
    sw = jnp.concatenate([s0] * len(starts), axis=0)
    states = forward_states(cell, params, xw, sw, unroll).astype(s0.dtype)
    return lle_at(cell, params, xw, sw, states), states[:, :s0.shape[0]]


def predicted_iterations(lle: Any, T: int, forward: str = "newton") -> Any:
    r"""The Newton iterations foreseen from the largest Lyapunov exponent ``lle`` of the recurrence
    along its trajectory (:func:`bppsa.lyapunov`; traceable, elementwise):

    .. math::

        \min\left(T, \left\lfloor 3 + \frac{1}{1 - e^{\lambda}} \right\rfloor\right) \text{ for } \lambda < 0,
        \qquad T \text{ otherwise.}

    On a contracting recurrence (λ < 0) an error at one step fades within its memory
    1/(1 − e^λ) steps; each Newton iteration makes at least one more state exact, so after about
    that many iterations every stretch is in the quadratic basin, then two quadratic steps and the
    one that confirms them (:func:`iterate`). For λ >= 0 the conditioning grows like e^{λT}: the
    forecast is Newton's bound, T. ``forward="quasi"`` (linear convergence) doubles the count. The
    constant 3 is fitted to an Elman RNN's counts over spectral radii 0.5 … 1.3 (4 … 11 iterations,
    λ from −0.95 to −0.15, T = 100 and 1000); the parallel-step experiment records it against every
    cell's. It ignores how nonlinear the cell is: it over-predicts nearly linear, slow cells.

    Args:
      lle: the exponent(s), an array of any shape.
      T: the number of steps.
      forward: "newton" or "quasi".

    Returns:
      The iteration counts, int32, shaped like ``lle``.
    """
    lle = jnp.asarray(lle)
    memory = jnp.minimum(T, 1 / -jnp.expm1(jnp.minimum(lle, -1e-12)))
    k = jnp.floor(3 + memory) * (2 if forward == "quasi" else 1)
    return jnp.minimum(jnp.where(lle < 0, k, T), T).astype(jnp.int32)


def _predicted(lle: Array, T: int, kind: str) -> Array:  # -1: no exponent (NaN)
    return jnp.where(jnp.isnan(lle), -1, predicted_iterations(lle, T, kind)).astype(jnp.int32)


def solve(cell: Cell, plan: Plan, params: Any, xs: Array, s0: Array,
          guess: Array | None = None) -> tuple[Array, NewtonInfo]:
    """The states ss (T, B, S) of the chain from s0 (B, S) over xs (T, B, I) by the parallel forward
    ``plan`` describes (flat states: :meth:`bppsa.cells.Cell.flatten_state`), and its
    :class:`NewtonInfo`. ``guess`` (T, B, S): the first iterate (None: zeros), e.g. the previous
    training step's states. Not differentiable itself: :func:`bppsa.rnn` differentiates the
    result at the solved states. With ``plan.gate`` the exponent along the probe windows
    (:func:`probe_windows`, run sequentially: :data:`PROBE_STEPS` steps' latency) decides: Newton if
    negative and :func:`predicted_iterations` <= the gate (from the first window's exact states),
    else the sequential forward (``chose_sequential``).

    Args:
      cell: the cell.
      plan: the :class:`bppsa.plan.options.Plan` with a parallel ``forward`` (``scan``, ``solve_chunk``, the
        tolerances, ``max_iter``, ``damping``, ``on_fail``, ``unroll``, ``gate``).
      params: the cell's parameters.
      xs: (T, B, I) inputs, time-major.
      s0: (B, S) the flat initial state.
      guess: (T, B, S) the first iterate, or None (zeros).

    Returns:
      (ss, info), ss (T, B, S) the flat states and info the :class:`NewtonInfo`.

    Raises:
      NewtonDidNotConverge: not converged with ``plan.on_fail == "raise"`` (under ``jax.jit`` JAX's
      ``jax.errors.JaxRuntimeError`` naming it).
    """
    T, B, S = xs.shape[0], s0.shape[0], s0.shape[-1]
    H = jnp.zeros((T, B, S), s0.dtype) if guess is None else guess.astype(s0.dtype)

    def evaluate(H):  # the steps and, for an elementwise step, their Jacobians' diagonals (else None), one pass
        sp = prev_states(s0, H)
        F = steps(cell, params, sp, xs)
        return F, step_diagonal(cell, plan.forward, params, sp, xs, F)

    def update(H, FD, lam):
        F, D = FD
        return newton_step(cell, plan, params, xs, s0, H, F, lam, D)

    # a diagonal cell's fused step: the input projection made once, here; the tests from the kernels
    fused = plan.fused if plan.damping is None else None
    ops = None if fused is None else fused.newton_operands(cell, params, xs, s0.dtype)
    tols = (cast(float, plan.atol), cast(float, plan.rtol))
    measured = None if fused is None or ops is None else (
        lambda H: fused.newton_reduce(cell, ops, s0, H, *tols),
        lambda agg, exact: fused.newton_apply(cell, ops, s0, agg, exact, *tols))

    inputs, ok = (params, xs, s0), finite_inputs(xs, s0)
    sequential = lambda: forward_states(cell, params, xs, s0, plan.unroll)
    if plan.gate is None:
        k, H, res, err, converged, F = iterate(plan, H, evaluate, update, inputs_ok=ok, measured=measured)
        H, info = finish(cell, plan, k, H, res, err, converged, sequential, inputs)
        D = F[1] if F is not None and block_size(cell) == 1 else None  # the Jacobians at H
        lle = lax.cond(info.fell_back, lambda: lle_at(cell, params, xs, s0, H),
                       lambda: lle_at(cell, params, xs, s0, H, D))
        return H, info._replace(lle=lle, predicted=_predicted(lle, T, plan.forward))
    lle, prefix = probe(cell, params, xs, s0, plan.unroll)
    predicted = _predicted(lle, T, plan.forward)
    go = ((lle < 0) & (predicted <= plan.gate)) | ~ok  # NaN/inf inputs: the iteration reports them

    def on():  # the exact prefix is the guess's start
        return iterate(plan, H.at[:prefix.shape[0]].set(prefix), evaluate, update, inputs_ok=ok,
                       measured=measured)[:5]

    def off():
        return jnp.int32(0), sequential().astype(H.dtype), *(jnp.zeros((), H.dtype),) * 2, jnp.ones((), bool)

    k, H, res, err, converged = lax.cond(go, on, off)
    H, info = finish(cell, plan, k, H, res, err, converged, sequential, inputs)
    lle = lle_at(cell, params, xs, s0, H)
    return H, info._replace(lle=lle, predicted=predicted, chose_sequential=~go)
