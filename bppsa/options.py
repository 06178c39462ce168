"""The one options object of the backward pass, validated once and accepted by every entry point.

    opts = bppsa.Options(backward="auto", chunk_size=256, precision="high")
    hs = bppsa.rnn(cell, params, xs, h0, options=opts)        # or the same fields as keywords:
    hs = bppsa.rnn(cell, params, xs, h0, backward="auto", chunk_size=256, precision="high")

:func:`bppsa.rnn`, :func:`bppsa.parallel.rnn`, :func:`bppsa.parallel.pmap_rnn` and
:class:`bppsa.nn.RNN` take ``options=`` and/or the fields of :class:`Options` as keywords
(keywords override the fields of ``options``); :func:`make` builds and checks it, and
:meth:`Options.resolve` is the one place where ``backward="auto"`` and ``forward="auto"`` are
decided.
"""

from __future__ import annotations

import dataclasses
import operator
from typing import Any, TypedDict

import jax.numpy as jnp
import numpy as np
from jax import lax

from . import cost as cost_lib
from . import newton as newton_lib
from ._scan import SCANS
from .errors import UsageError

__all__ = ["Options", "OptionFields", "make", "BACKWARDS", "FORWARDS", "PRECISIONS", "COMBINES"]

BACKWARDS = ("bppsa", "bptt", "auto")
FORWARDS = ("sequential", "newton", "quasi", "auto")
PRECISIONS = ("highest", "high", "default")  # jax.lax.Precision's members, by name
COMBINES = ("logstep", "allgather", "chain", "auto")


@dataclasses.dataclass(frozen=True)
class Options:
    """How :func:`bppsa.rnn` computes gradients. Checked on construction (a
    :class:`bppsa.errors.UsageError` names the field, the value and what is allowed).

    Attributes:
      backward: "bppsa" (parallel-scan backward), "bptt" (autodiff through ``lax.scan``, its
        unroll tuned per shape and backend: :func:`bppsa.cost.bptt_unroll`) or "auto" (the cost
        model picks tuned BPTT, BPPSA-blelloch or BPPSA-sequential per cell, T, B, state size,
        dtype and backend: :meth:`resolve`).
      scan: the BPPSA scan, "blelloch", "associative" or "sequential" (:mod:`bppsa.scan`); None
        (default): "blelloch", or with ``backward="auto"`` the scan the model chose. An explicit
        scan is kept: ``auto`` then decides BPTT or BPPSA, and BPPSA runs that scan.
      chunk_size: BPPSA on one device: run the backward over chunks of this many steps (an int;
        numpy and JAX integer scalars are taken as ints), so Jacobian memory is chunk_size·B·S²
        instead of T·B·S² (exact; None: one chunk). "auto" (default): on CPU, cache-sized chunks
        (:func:`bppsa.cost.auto_chunk_size`); on accelerators, one chunk. With a mesh each device
        scans its stretch in one piece: only None and "auto" are accepted there.
      precision: BPPSA: the precision of every matrix product of the backward (Jacobians, scan,
        parameter gradients): "highest" (default, full float32), "high" or "default" (TF32 on
        recent NVIDIA GPUs), or a ``jax.lax.Precision``; stored as its lower-case name.
      cost_model: ``backward="auto"``: the :class:`bppsa.cost.CostModel` that decides (None: the
        calibration cached for this device, else the model shipped for this backend).
      combine: with a mesh, the cross-device step of the sharded backward: "logstep",
        "allgather", "chain" or "auto" (:func:`bppsa.parallel.sequence.choose_combine`).
      unroll: the unroll factor of the sequential forward's ``lax.scan`` (and so of BPTT's): a
        positive int, True (every step) or False (1), as ``lax.scan`` takes it; None (default):
        tuned per shape and backend (:func:`bppsa.cost.bptt_unroll`). One device (with a mesh, each
        device's stretch keeps the tuned unroll).
      forward: how the states are computed: "sequential" (a ``lax.scan``, T dependent steps),
        "newton" (Newton's method over the whole sequence, each iteration one parallel scan of
        the exact Jacobians: :mod:`bppsa.newton`), "quasi" (the Jacobians' diagonal in the
        iterations) or "auto" (the cost model: :func:`bppsa.cost.choose_forward`). Gradients are
        exact for every forward (the backward linearises at the converged states). With a
        parallel forward, ``backward="bptt"`` means the sequential scan of the same backward.
      tol: the parallel forward's relative residual tolerance; None: per dtype
        (:data:`bppsa.newton.DEFAULT_TOL`: float32 1e-5, float64 1e-12).
      max_iter: the parallel forward's iteration limit (default 50).
      damping: None (plain Newton) or the initial λ of the damped step (:mod:`bppsa.newton`).
      on_fail: not converged within ``max_iter``: "sequential" (default: the sequential forward
        runs instead, a warning once, counted) or "raise" (:class:`bppsa.newton.NewtonDidNotConverge`).
    """

    backward: str = "bppsa"
    scan: str | None = None
    chunk_size: Any = "auto"
    precision: Any = "highest"
    cost_model: cost_lib.CostModel | None = None
    combine: str = "auto"
    unroll: int | bool | None = None
    forward: str = "sequential"
    tol: float | None = None
    max_iter: int = newton_lib.DEFAULT_MAX_ITER
    damping: float | None = None
    on_fail: str = "sequential"

    def __post_init__(self):
        _choice("backward", self.backward, BACKWARDS)
        _choice("forward", self.forward, FORWARDS)
        if isinstance(self.max_iter, (np.integer, jnp.integer)) and jnp.ndim(self.max_iter) == 0:
            object.__setattr__(self, "max_iter", int(self.max_iter))
        newton_lib.check_plan_fields(self.tol, self.max_iter, self.damping, self.on_fail)
        if self.scan is not None and not (isinstance(self.scan, str) and self.scan in SCANS):
            raise UsageError(f"scan must be one of {sorted(SCANS)} or None; got {self.scan!r}")
        _choice("combine", self.combine, COMBINES)
        object.__setattr__(self, "chunk_size", _chunk_size(self.chunk_size))
        object.__setattr__(self, "precision", _precision(self.precision))
        object.__setattr__(self, "unroll", _unroll(self.unroll))
        if self.cost_model is not None and not isinstance(self.cost_model, cost_lib.CostModel):
            raise UsageError(f"cost_model must be a bppsa.cost.CostModel or None; got {type(self.cost_model).__name__}")

    def replace(self, **fields) -> Options:
        """A copy with ``fields`` changed (checked again)."""
        return make(self, **fields)

    def resolve(self, cell, T: int, B: int, dtype=None) -> Options:
        """The options with ``backward`` in ("bppsa", "bptt") and ``scan`` set: ``"auto"`` asks the
        cost model (:func:`bppsa.cost.choose_backward`) for this cell, T, B and dtype; the model's
        scan is used only where ``scan`` was left at None."""
        backward, scan, forward = self.backward, self.scan, self.forward
        if backward == "auto":
            backward, auto_scan = cost_lib.choose_backward(cell, T, B, dtype, cost_model=self.cost_model)
            scan = scan or auto_scan
        if forward == "auto":
            forward = cost_lib.choose_forward(cell, T, B, dtype)
        return dataclasses.replace(self, backward=backward, scan=scan or "blelloch", forward=forward)

    def newton_plan(self) -> newton_lib.Plan:
        """The parallel forward's settings (``forward`` resolved to "newton" or "quasi"); its linear
        solves use the BPPSA scan (``scan``; "blelloch" when unset) and ``chunk_size``."""
        return newton_lib.Plan(kind=self.forward, scan=self.scan or "blelloch", chunk_size=self.chunk_size,
                               tol=None if self.tol is None else float(self.tol), max_iter=self.max_iter,
                               damping=None if self.damping is None else float(self.damping),
                               on_fail=self.on_fail)


class OptionFields(TypedDict, total=False):
    """The fields of :class:`Options` as keyword arguments (for ``**kwargs`` type checking)."""

    backward: str
    scan: str | None
    chunk_size: Any
    precision: Any
    cost_model: cost_lib.CostModel | None
    combine: str
    unroll: int | bool | None
    forward: str
    tol: float | None
    max_iter: int
    damping: float | None
    on_fail: str


_FIELDS = tuple(f.name for f in dataclasses.fields(Options))


def make(options: Options | None = None, **fields) -> Options:
    """``options`` (default: ``Options()``) with ``fields`` overriding it. Unknown field names and
    bad values raise a UsageError naming them."""
    unknown = sorted(set(fields) - set(_FIELDS))
    if unknown:
        raise UsageError(f"unknown option{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}; "
                         f"the options are {', '.join(_FIELDS)}")
    if options is None:
        return Options(**fields)
    if not isinstance(options, Options):
        raise UsageError(f"options must be a bppsa.Options or None; got {type(options).__name__}")
    return dataclasses.replace(options, **fields) if fields else options


def _choice(name, value, choices):
    if not (isinstance(value, str) and value in choices):
        raise UsageError(f"{name} must be one of {list(choices)}; got {value!r}")


def _chunk_size(chunk_size):
    """An int, None or "auto" (a numpy or JAX integer scalar becomes an int; bools, floats and
    traced values are refused)."""
    if chunk_size is None or (isinstance(chunk_size, str) and chunk_size == "auto"):
        return chunk_size
    dtype = getattr(chunk_size, "dtype", None)
    if isinstance(chunk_size, bool) or isinstance(chunk_size, str):
        raise UsageError(f"chunk_size must be a positive int, None or 'auto'; got {chunk_size!r}")
    if isinstance(chunk_size, int) or (
            dtype is not None and jnp.ndim(chunk_size) == 0 and jnp.issubdtype(dtype, jnp.integer)):
        try:
            n = operator.index(chunk_size)
        except TypeError:  # a traced value: the chunking is decided at trace time
            raise UsageError(f"chunk_size must be a concrete positive int (static under jit); "
                             f"got a traced {dtype} value") from None
        if n >= 1:
            return n
    raise UsageError(f"chunk_size must be a positive int, None or 'auto'; got {chunk_size!r}")


def _unroll(unroll):
    """None, a bool, or a positive int (numpy and JAX integer scalars become ints)."""
    if unroll is None or isinstance(unroll, bool):
        return unroll
    try:
        n = operator.index(unroll)
    except TypeError:
        n = 0
    if n >= 1:
        return n
    raise UsageError(f"unroll must be a positive int, True, False or None (tuned); got {unroll!r}")


def _precision(precision) -> str:
    """A name from :data:`PRECISIONS` (any case) or a ``jax.lax.Precision`` -> its lower-case name."""
    if isinstance(precision, lax.Precision):
        return precision.name.lower()
    if isinstance(precision, str) and precision.lower() in PRECISIONS:
        return precision.lower()
    raise UsageError(f"precision must be one of {list(PRECISIONS)} or a jax.lax.Precision; got {precision!r}")
