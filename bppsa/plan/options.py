"""The one options object of the backward pass, validated once and accepted by every entry point.

.. code-block:: python

    opts = bppsa.Options(backward="auto", chunk_size=256, precision="high")
    hs = bppsa.rnn(cell, params, xs, h0, options=opts)        # or the same fields as keywords:
    hs = bppsa.rnn(cell, params, xs, h0, backward="auto", chunk_size=256, precision="high")

:func:`bppsa.rnn`, :func:`bppsa.parallel.rnn`, :func:`bppsa.parallel.pmap_rnn` and
:class:`bppsa.nn.RNN` take ``options=`` and/or the fields of :class:`Options` as keywords
(keywords override the fields of ``options``); :func:`make` builds and checks it, and
:meth:`Options.plan` is the one place where every open choice (``"auto"``, None) is made, once
per call and before anything is computed: the :class:`Plan` it returns is what the layers below
execute.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal, get_args, overload

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array, lax
from jax.typing import DTypeLike

from bppsa.cells import Cell
from bppsa.errors import UsageError, as_int, as_number
from bppsa.plan import calibration, rules
from bppsa.plan import cost as cost_lib
from bppsa.plan.backends import Fused
from bppsa.scan.dense import SCANS

__all__ = ["Options", "Plan", "make", "tolerance", "unroll_for", "Backward", "Forward", "ParallelForward", "Scan",
           "Combine", "OnFail", "Precision", "Adjoint", "BACKWARDS", "FORWARDS", "KINDS", "PRECISIONS", "COMBINES",
           "ON_FAIL", "DEFAULT_TOL", "DEFAULT_MAX_ITER"]

# The method names, each written once: the runtime tuples are read from the Literal types.
Backward = Literal["bppsa", "bptt", "auto"]
ParallelForward = Literal["newton", "quasi"]
Forward = Literal["sequential", ParallelForward, "auto"]
Scan = Literal["blelloch", "associative", "sequential"]
Combine = Literal["logstep", "allgather", "chain", "auto"]
OnFail = Literal["sequential", "raise"]
Precision = Literal["highest", "high", "default"]  # jax.lax.Precision's members, by name
Kernels = Literal["auto", "xla", "pallas", "interpret"]  # bppsa.kernels
#: How a plan's backward runs (:attr:`Plan.adjoint`): JAX's autodiff through the forward's scan, the
#: cell's analytic adjoint loop, the fused adjoint-loop kernel, or the adjoint solve by a scan.
Adjoint = Literal["autodiff", "analytic", "fused", "scan"]

#: The values of ``backward=``: ``("bppsa", "bptt", "auto")``.
BACKWARDS: tuple[str, ...] = get_args(Backward)
#: The values of ``forward=``: ``("sequential", "newton", "quasi", "auto")``.
FORWARDS: tuple[str, ...] = get_args(Forward)
KINDS: tuple[str, ...] = get_args(ParallelForward)  # the parallel forwards (bppsa.forward.newton)
COMBINES: tuple[str, ...] = get_args(Combine)
ON_FAIL: tuple[str, ...] = get_args(OnFail)
PRECISIONS: tuple[str, ...] = get_args(Precision)
KERNELS: tuple[str, ...] = get_args(Kernels)
assert set(get_args(Scan)) == set(SCANS), "options.Scan must name bppsa.scan.SCANS"

#: The parallel forward's relative residual tolerance by dtype name (about 100 ulps; float32's is
#: the one DEER uses).
DEFAULT_TOL = {"float64": 1e-12, "float32": 1e-5, "float16": 1e-3, "bfloat16": 1e-2}
DEFAULT_MAX_ITER = 100  # DEER's

@dataclasses.dataclass(frozen=True)
class Options:
    r"""How :func:`bppsa.rnn` computes the states and their gradients. Checked on construction (a
    :class:`bppsa.errors.UsageError` names the field, the value and what is allowed).

    Attributes:
      backward: "bppsa" (parallel-scan backward), "bptt" (the sequential backward: the cell's
        analytic adjoint where it has one, :mod:`bppsa.backward.adjoint`, else autodiff through
        ``lax.scan``; its unroll tuned per shape and backend: :func:`bppsa.plan.rules.bptt_unroll`) or
        "auto" (the cost model picks tuned BPTT, BPPSA-blelloch or BPPSA-sequential per cell, T, B, state size,
        dtype and backend: :meth:`resolve`; on CPU, one device, a cell with 1×1 Jacobian blocks and ``scan``
        left at None: BPPSA by the elementwise plan, measured faster: :func:`bppsa.plan.calibration.choose_backward`).
      scan: the BPPSA scan, "blelloch", "associative" or "sequential" (:mod:`bppsa.scan`); None
        (default): "blelloch", or with ``backward="auto"`` the scan the model chose; on CPU, for a
        cell with 1×1 Jacobian blocks, "sequential" over cache-sized chunks where ``chunk_size`` is
        "auto" (:func:`bppsa.plan.rules.elementwise_plan`). An explicit scan is kept: ``auto`` then
        decides BPTT or BPPSA, and BPPSA runs that scan.
      chunk_size: BPPSA on one device: run the backward over equal chunks of at most this many steps
        (an int; numpy and JAX integer scalars are taken as ints), so Jacobian memory is chunk_size·B·S²
        instead of T·B·S² (exact; None: one chunk). "auto" (default): on CPU, cache-sized chunks
        (:func:`bppsa.plan.rules.auto_chunk_size`); on accelerators, one chunk. With a mesh each device
        scans its stretch in one piece: only None and "auto" are accepted there.
      precision: BPPSA: the precision of every matrix product of the backward (Jacobians, scan,
        parameter gradients): "highest" (default, full float32), "high" or "default" (TF32 on
        recent NVIDIA GPUs), or a ``jax.lax.Precision``; stored as its lower-case name.
      cost_model: ``backward="auto"``: the :class:`bppsa.plan.cost.CostModel` that decides (None: the
        calibration cached for this device, else the model shipped for this backend).
      combine: with a mesh, the cross-device step of the sharded backward: "logstep",
        "allgather", "chain" or "auto" (:func:`bppsa.plan.rules.choose_combine`).
      unroll: the unroll factor of the sequential forward's ``lax.scan`` (and so of BPTT's): a
        positive int, True (every step) or False (1), as ``lax.scan`` takes it; None (default):
        tuned per shape and backend (:func:`bppsa.plan.rules.bptt_unroll`). One device: with a mesh
        each device's stretch is a plain ``lax.scan`` (unroll 1).
      forward: how the states are computed: "sequential" (a ``lax.scan``, T dependent steps),
        "newton" (Newton's method over the whole sequence, each iteration one parallel scan of
        the exact Jacobians: :mod:`bppsa.forward.newton`), "quasi" (the Jacobians' diagonal in the
        iterations) or "auto" (the cost model: :func:`bppsa.plan.cost.choose_forward`). Gradients are
        exact for every forward (the backward linearises at the converged states). With a
        parallel forward, ``backward="bptt"`` means the sequential scan of the same backward.
      tol: the parallel forward's tolerance, in (0, 1); None: per dtype (:data:`DEFAULT_TOL`,
        float32 1e-5, float64 1e-12). The default of both ``atol`` and ``rtol``.
      atol, rtol: the parallel forward's absolute and relative tolerances (finite, >= 0, rtol < 1,
        not both 0; None: ``tol``). Converged when every step's residual
        :math:`|h_t - f(h_{t-1}, x_t)| \le \mathrm{atol} + \mathrm{rtol}\,|f(h_{t-1}, x_t)|` and the estimated
        error of every state :math:`\le \mathrm{atol} + \mathrm{rtol}\,|h_t|`
        (:mod:`bppsa.forward.newton`).
      max_iter: the parallel forward's iteration limit (default 100, DEER's).
      damping: None (plain Newton) or the initial λ of the damped step (:mod:`bppsa.forward.newton`).
      on_fail: not converged within ``max_iter``: "sequential" (default: the sequential forward
        runs instead, a warning once, counted) or "raise" (:class:`bppsa.forward.newton.NewtonDidNotConverge`).
      kernels: the fused Pallas kernels (:mod:`bppsa.kernels`): "xla" none; "pallas" the kernels,
        compiled for a GPU (a UsageError elsewhere, or where they do not run the problem);
        "interpret" the same kernels in Pallas's interpret mode on any backend (tests, debugging);
        "auto" (default) a kernel only where a GPU measurement shows it fastest
        (:func:`bppsa.plan.rules.choose_kernels`: none yet, so "xla").

    Every choice left open here ("auto", None) is made once per call, before anything is
    computed: :meth:`plan` returns the :class:`Plan` the layers below execute.

    Examples:
      >>> import jax, jax.numpy as jnp, bppsa
      >>> opts = bppsa.Options(backward="bptt", precision="high")
      >>> opts.backward, opts.precision, opts.forward
      ('bptt', 'high', 'sequential')
      >>> opts.replace(scan="associative").scan
      'associative'

      Passed whole (``options=``) or as keywords, which override its fields:

      >>> cell = bppsa.cells.RNN(input_size=3, hidden_size=4)
      >>> params = cell.init(jax.random.key(0))
      >>> xs, h0 = jnp.ones((8, 2, 3)), jnp.zeros((2, 4))
      >>> a = bppsa.rnn(cell, params, xs, h0, options=opts)
      >>> b = bppsa.rnn(cell, params, xs, h0, options=opts, backward="bppsa")
      >>> bool(jnp.allclose(a, b))
      True

      A bad value is refused on construction, naming the field:

      >>> bppsa.Options(backward="fast")
      Traceback (most recent call last):
      ...
      bppsa.errors.UsageError: backward must be one of ['bppsa', 'bptt', 'auto']; got 'fast'

      ``backward="auto"`` with a :class:`bppsa.CostModel` of your own (seconds per unit of each
      method's features; here BPPSA predicted free, so it is chosen):

      >>> model = bppsa.CostModel({"bptt": [1.0, 0.0, 0.0], "bppsa": [0.0, 0.0, 0.0, 0.0]})
      >>> gru = bppsa.cells.GRU(input_size=3, hidden_size=4)
      >>> model.choose(gru, T=1000, B=16)
      'bppsa'
      >>> xs, s0 = jax.ShapeDtypeStruct((1000, 16, 3), jnp.float32), jax.ShapeDtypeStruct((16, 4), jnp.float32)
      >>> bppsa.Options(backward="auto", cost_model=model).plan(gru, xs, s0).backward
      'bppsa'
    """

    backward: Backward = "bppsa"
    scan: Scan | None = None
    chunk_size: int | Literal["auto"] | None = "auto"
    precision: Precision | lax.Precision = "highest"
    cost_model: cost_lib.CostModel | None = None
    combine: Combine = "auto"
    unroll: int | bool | None = None
    forward: Forward = "sequential"
    tol: float | None = None
    atol: float | None = None
    rtol: float | None = None
    max_iter: int = DEFAULT_MAX_ITER
    damping: float | None = None
    on_fail: OnFail = "sequential"
    kernels: Kernels = "auto"

    def __post_init__(self):
        _choice("backward", self.backward, BACKWARDS)
        _choice("kernels", self.kernels, KERNELS)
        _choice("forward", self.forward, FORWARDS)
        for name, value in zip(("tol", "atol", "rtol", "max_iter", "damping"),
                               _check_solver_fields(self.tol, self.atol, self.rtol, self.max_iter, self.damping,
                                                    self.on_fail)):
            object.__setattr__(self, name, value)
        if self.scan is not None and not (isinstance(self.scan, str) and self.scan in SCANS):
            raise UsageError(f"scan must be one of {sorted(SCANS)} or None; got {self.scan!r}")
        _choice("combine", self.combine, COMBINES)
        object.__setattr__(self, "chunk_size", _chunk_size(self.chunk_size))
        object.__setattr__(self, "precision", _precision(self.precision))
        object.__setattr__(self, "unroll", _unroll(self.unroll))
        if self.cost_model is not None and not isinstance(self.cost_model, cost_lib.CostModel):
            raise UsageError(f"cost_model must be a bppsa.CostModel or None; got {type(self.cost_model).__name__}")

    def replace(self, **fields: Any) -> Options:
        """A copy with ``fields`` changed (checked again).

        Args:
          **fields: fields of :class:`Options` and their new values.

        Returns:
          The new :class:`Options`.

        Raises:
          bppsa.errors.UsageError: an unknown field name or a bad value.
        """
        return make(self, **fields)

    def resolve(self, cell: Cell, T: int, B: int, dtype: DTypeLike | None = None, devices: int | None = None
                ) -> Options:
        """The options with ``backward`` in ("bppsa", "bptt"), ``forward`` not "auto" and ``scan``
        set: ``"auto"`` asks the cost model (:func:`bppsa.plan.calibration.choose_backward`,
        :func:`bppsa.plan.cost.choose_forward`) for this cell, T, B, dtype and ``devices`` (the mesh axis
        the time is split over; None: one device); the model's scan is used only where ``scan`` was
        left at None. The other open choices are :meth:`plan`'s.

        Args:
          cell: the cell to be run.
          T: the number of steps.
          B: the batch size.
          dtype: the inputs' dtype (None: float32's costs).
          devices: the size of the mesh axis the time is split over; None: one device.

        Returns:
          The :class:`Options` with ``backward``, ``forward`` and ``scan`` chosen.
        """
        backward, scan, forward = self.backward, self.scan, self.forward
        if backward == "auto":
            backward, auto_scan = calibration.choose_backward(cell, T, B, dtype, cost_model=self.cost_model, scan=scan,
                                                           devices=devices)
            scan = scan or auto_scan
        if forward == "auto":
            forward = cost_lib.choose_forward(cell, T, B, dtype)[0]
        return dataclasses.replace(self, backward=backward, scan=scan or "blelloch", forward=forward)

    def plan(self, cell: Cell, xs: Array | jax.ShapeDtypeStruct, s0: Array | jax.ShapeDtypeStruct, *,
             states_dtype: DTypeLike | None = None, devices: int | None = None) -> Plan:
        """Every choice made for one problem: the :class:`Plan` that runs ``cell`` over xs
        (T, B, I) from the flat state s0 (B, S) (arrays or ``jax.ShapeDtypeStruct``s: only shapes
        and dtypes are read). ``states_dtype``: the dtype of the states the forward produces
        (default s0's; they differ only for a weakly typed s0). ``devices``: the size of the
        mesh axis the time is split over (None: one device, no mesh).

        This is where the cost model (:mod:`bppsa.plan.cost`) is consulted: ``backward``, ``scan`` and
        ``forward`` (:meth:`resolve`), the backward's and the parallel forward's chunk lengths
        (:func:`bppsa.plan.rules.auto_chunk_size`), the forward scan's unroll (:func:`unroll_for`), the
        tolerance (:func:`tolerance`) and the mesh's combine (:func:`bppsa.plan.rules.choose_combine`),
        all at ``jax.default_backend()``.

        Args:
          cell: the cell to be run.
          xs: (T, B, I) the inputs, or their ``jax.ShapeDtypeStruct``.
          s0: (B, S) the flat initial state, or its ``jax.ShapeDtypeStruct``.
          states_dtype: the dtype of the states the forward produces (None: s0's).
          devices: the size of the mesh axis the time is split over; None: one device.

        Returns:
          The :class:`Plan`, every field concrete.

        Raises:
          bppsa.errors.UsageError: an int ``chunk_size`` with a mesh, or a stage's kernels asked for where none runs it.
        """
        if devices is not None and self.chunk_size is not None and self.chunk_size != "auto":
            raise UsageError(f"chunk_size={self.chunk_size!r} cannot be combined with mesh (the sharded scan "
                             "already splits the sequence); pass one of them")
        T, B, S = int(xs.shape[0]), int(xs.shape[1]), int(s0.shape[-1])
        backend = jax.default_backend()
        r = self.resolve(cell, T, B, xs.dtype, devices)
        s_dtype = jnp.dtype(s0.dtype)
        ss_dtype = jnp.dtype(states_dtype if states_dtype is not None else s_dtype)
        parallel = r.forward != "sequential"
        chunk = solve_chunk = None
        loop = "bptt" if r.backward == "bptt" and not parallel else "forward"  # autodiff through the loop or not
        if devices is None:
            unroll = unroll_for(cell, T, B, xs.dtype, S, r.unroll, backend, loop)
            scan, chunk, solve_chunk = rules.chunk_lengths(
                cell, T, B, S, backward=r.backward, forward=r.forward, scan=r.scan or "blelloch",
                scan_given=self.scan is not None, chunk_size=r.chunk_size, states_itemsize=ss_dtype.itemsize,
                solve_itemsize=s_dtype.itemsize, backend=backend)
            r = dataclasses.replace(r, scan=scan)
        else:
            unroll = 1  # each device's stretch is a plain lax.scan, scanned in one piece
        combine = r.combine if r.combine != "auto" else rules.choose_combine(devices or 1)
        gate = None  # forward="auto" chose the parallel forward: it runs on only if the LLE predicts it pays
        if self.forward == "auto" and parallel and devices is None:
            gate = cost_lib.choose_forward(cell, T, B, xs.dtype, backend)[1]
        tol = tolerance(s_dtype, r.tol)
        kernels = _kernels(self.kernels, cell, r.backward, r.forward, S, devices, backend)
        made = {"chunk_size": chunk, "unroll": unroll, "tol": tol, "atol": tol if r.atol is None else r.atol,
                "rtol": tol if r.rtol is None else r.rtol, "combine": combine, "kernels": kernels}
        hoist = parallel or rules.hoist_inputs(cell, T, B, xs.dtype, loop, backend, S)
        in_loop = loop == "bptt" and rules.adjoint_in_loop(cell, B, backend, S)
        return Plan(**{f: made.get(f, getattr(r, f)) for f in _FIELDS}, solve_chunk=solve_chunk, devices=devices,
                    hoist=hoist, gate=gate, weights_in_loop=in_loop, cell_adjoint=bool(cell.has_adjoint),
                    newton_kernel=_newton_kernel(kernels, cell, r.forward, s_dtype))


@dataclasses.dataclass(frozen=True)
class Plan:
    """Every choice made for one problem (:meth:`Options.plan`): what the layers below
    (:mod:`bppsa.backward`, :mod:`bppsa.forward`, :mod:`bppsa.parallel.sequence`) execute; they decide
    nothing. Its own frozen type, not an :class:`Options`: the fields of :class:`Options`, in their
    order, each with a concrete type (no "auto", no None where a choice is due), then the plan's own.
    Hashable: the static argument of the programs it runs and their caches' key. :func:`bppsa.rnn`
    and the other entries take a Plan where they take an :class:`Options` (it runs as it is).

    Attributes:
      backward: "bppsa" (the parallel-scan backward) or "bptt" (the sequential backward).
      scan: the BPPSA backward's scan, a name of :data:`bppsa.SCANS` (with a parallel forward also
        the scan of its linear solves).
      chunk_size: the BPPSA backward's chunk length, an int, or None: one chunk (None for BPTT).
      precision: the backward's matrix products' precision, a name of :data:`PRECISIONS`.
      cost_model: the :class:`bppsa.plan.cost.CostModel` that decided, or None (the default one).
      combine: with a mesh, the sharded backward's cross-device step ("logstep", "allgather" or "chain").
      unroll: the forward scan's unroll factor (an int).
      forward: how the states are computed: "sequential", "newton" or "quasi".
      tol: the parallel forward's tolerance (a float).
      atol: its absolute tolerance (a float).
      rtol: its relative tolerance (a float).
      max_iter: its iteration limit.
      damping: None (plain Newton) or the initial λ of the damped step.
      on_fail: "sequential" or "raise": what a parallel forward that did not converge does.
      kernels: each stage's backend: "xla" (XLA's programs), "pallas" (the fused kernels, compiled
        for a GPU) or "interpret" (the same kernels in Pallas's interpret mode); :attr:`fused` names
        the kernels themselves.
      solve_chunk: the parallel forward's chunk length for its linear solves (an int, or None:
        one chunk; None for the sequential forward and with a mesh).
      devices: the size of the mesh axis the time is split over; None: one device, no mesh.
      hoist: the sequential forward computes the inputs' part of all steps before its loop
        (:func:`bppsa.plan.rules.hoist_inputs`); the parallel forwards always do (True).
      gate: ``forward="auto"`` chose the parallel forward on this backend: the most iterations at
        which it is predicted to pay (:func:`bppsa.plan.cost.break_even_iterations`). The solver
        estimates the Lyapunov exponent at its first iterate and runs the sequential forward
        instead when it is >= 0 or the predicted iterations exceed this; None: no such test.
      weights_in_loop: BPTT by the cell's analytic adjoint sums the parameter gradients in its
        loop (:func:`bppsa.plan.rules.adjoint_in_loop`); False: one product each after it.
      cell_adjoint: the planned cell has an analytic adjoint (:class:`bppsa.cells.AnalyticAdjoint`,
        ``cell.has_adjoint``), which BPTT after the sequential forward runs (:attr:`adjoint`).
      newton_kernel: with the fused kernels and a parallel forward, how its Newton step runs:
        "none" (the fused scan on steps and Jacobians XLA evaluates), "step" (a diagonal cell's
        whole step fused, :func:`bppsa.kernels.newton.supports`; the convergence test XLA's, as for
        16-bit states) or "measured" (the whole step fused with its convergence test,
        :func:`bppsa.kernels.newton.measures_fuse`); "none" with XLA's.

    The stages that run and how are properties of these fields, decided here and nowhere below:
    :attr:`differentiation` (autodiff through the forward's scan, or the library's rule),
    :attr:`adjoint` and :attr:`adjoint_scan` (the backward), :attr:`fused` (the kernels each stage
    runs); :attr:`stages` names them all in words.

    Examples:
      >>> import jax, jax.numpy as jnp, bppsa
      >>> cell = bppsa.cells.GRU(input_size=3, hidden_size=4)
      >>> xs = jax.ShapeDtypeStruct((100, 8, 3), jnp.float32)  # only shapes and dtypes are read
      >>> s0 = jax.ShapeDtypeStruct((8, 4), jnp.float32)
      >>> plan = bppsa.Options(backward="bppsa").plan(cell, xs, s0)
      >>> isinstance(plan, bppsa.Plan), plan.backward, plan.scan, plan.forward
      (True, 'bppsa', 'blelloch', 'sequential')
      >>> isinstance(plan.unroll, int)
      True
    """

    backward: Literal["bppsa", "bptt"]
    scan: Scan
    chunk_size: int | None
    precision: Precision
    cost_model: cost_lib.CostModel | None
    combine: Literal["logstep", "allgather", "chain"]
    unroll: int
    forward: Literal["sequential", ParallelForward]
    tol: float
    atol: float
    rtol: float
    max_iter: int
    damping: float | None
    on_fail: OnFail
    kernels: Literal["xla", "pallas", "interpret"]
    solve_chunk: int | None = None
    devices: int | None = None
    hoist: bool = True
    gate: float | None = None
    weights_in_loop: bool = False
    cell_adjoint: bool = False
    newton_kernel: Literal["none", "step", "measured"] = "none"

    def __post_init__(self):
        # the checks of Options, then that each choice is made (a Plan built or replaced by hand)
        Options(**{f: getattr(self, f) for f in _FIELDS})
        object.__setattr__(self, "precision", _precision(self.precision))
        concrete = {"backward": self.backward != "auto", "forward": self.forward != "auto",
                    "scan": self.scan is not None,
                    "chunk_size": self.chunk_size is None or type(self.chunk_size) is int,
                    "unroll": type(self.unroll) is int, "tol": isinstance(self.tol, float),
                    "atol": isinstance(self.atol, float), "rtol": isinstance(self.rtol, float),
                    "combine": self.combine != "auto", "kernels": self.kernels != "auto",
                    "solve_chunk": self.solve_chunk is None or type(self.solve_chunk) is int,
                    "devices": self.devices is None or (type(self.devices) is int and self.devices >= 1),
                    "hoist": isinstance(self.hoist, bool),
                    "gate": self.gate is None or isinstance(self.gate, float),
                    "weights_in_loop": isinstance(self.weights_in_loop, bool),
                    "cell_adjoint": isinstance(self.cell_adjoint, bool),
                    "newton_kernel": self.newton_kernel in ("none", "step", "measured")}
        open_ = [f"{k}={getattr(self, k)!r}" for k, ok in concrete.items() if not ok]
        if open_:
            raise UsageError(f"a Plan has every choice made; open: {', '.join(open_)} (Options.plan makes them)")

    @property
    def fused(self) -> Fused | None:
        """The fused kernels this plan's stages run (:class:`bppsa.plan.backends.Fused`), or None: XLA's."""
        if self.kernels == "xla":
            return None
        return Fused(interpret=self.kernels == "interpret", newton=self.newton_kernel)

    @property
    def adjoint(self) -> Adjoint:
        """How the backward runs: "scan" (the adjoint recurrence solved by :attr:`adjoint_scan`:
        BPPSA's scan, or BPTT after a parallel forward or over a mesh), "fused" (BPTT's adjoint loop
        as one fused kernel), "analytic" (BPTT by the cell's analytic adjoint loop, the sequential
        forward keeping the steps' factors) or "autodiff" (BPTT as JAX's reverse mode through the
        forward's ``lax.scan``: a cell without an analytic adjoint, or a mesh's sequential forward)."""
        if self.backward == "bppsa":
            return "scan"
        if self.devices is not None:  # the sharded forward is differentiated as it is; a parallel one by the rule
            return "autodiff" if self.forward == "sequential" else "scan"
        if self.kernels != "xla":
            return "fused"
        if self.forward != "sequential":
            return "scan"
        return "analytic" if self.cell_adjoint else "autodiff"

    @property
    def adjoint_scan(self) -> Scan:
        """The scan of the backward's adjoint solve where :attr:`adjoint` is "scan": ``scan`` for
        BPPSA, "sequential" for BPTT (the same recurrence solved step by step)."""
        return self.scan if self.backward == "bppsa" else "sequential"

    @property
    def differentiation(self) -> Literal["autodiff", "rule"]:
        """How the states are differentiated: "rule", the library's one rule
        (:mod:`bppsa.backward.rule`: reverse mode is :attr:`adjoint`), or "autodiff", JAX's own
        through the forward's ``lax.scan`` (:attr:`adjoint` "autodiff")."""
        return "autodiff" if self.adjoint == "autodiff" else "rule"

    @property
    def stages(self) -> dict[str, str]:
        """Every stage that runs and how, in words: the forward, the states' differentiation, the
        backward and the devices.

        Examples:
          >>> import jax, jax.numpy as jnp, bppsa
          >>> cell = bppsa.cells.GRU(input_size=3, hidden_size=4)
          >>> xs = jax.ShapeDtypeStruct((100, 8, 3), jnp.float32)
          >>> s0 = jax.ShapeDtypeStruct((8, 4), jnp.float32)
          >>> for stage, how in bppsa.Options(backward="bppsa").plan(cell, xs, s0).stages.items():
          ...     print(f"{stage}: {how}")
          forward: sequential (XLA)
          differentiation: rule
          backward: blelloch scan in one chunk (XLA)
          devices: one
        """
        backend = {"xla": "XLA", "pallas": "fused kernels", "interpret": "fused kernels, interpreted"}[self.kernels]
        forward = self.forward if self.forward == "sequential" else \
            f"{self.forward}, tol {self.tol:g}, at most {self.max_iter} iterations"
        if self.kernels != "xla" and self.newton_kernel != "none":
            forward += ", the whole step fused" + (" and measured" if self.newton_kernel == "measured" else "")
        if self.adjoint == "scan":
            pieces = ("" if self.adjoint_scan == "sequential" else " in one chunk" if self.chunk_size is None
                      else f" over chunks of {self.chunk_size}")
            backward = f"{self.adjoint_scan} scan{pieces} ({backend})"
        else:
            backward = {"autodiff": "JAX's reverse mode through the forward's scan (XLA)",
                        "analytic": "the cell's analytic adjoint loop (XLA)",
                        "fused": f"the adjoint loop ({backend})"}[self.adjoint]
        devices = "one" if self.devices is None else f"time split over {self.devices}, {self.combine} combine"
        return {"forward": f"{forward} ({backend})", "differentiation": self.differentiation,
                "backward": backward, "devices": devices}

    def plan(self, cell: Cell, xs: Array | jax.ShapeDtypeStruct, s0: Array | jax.ShapeDtypeStruct, *,
             states_dtype: DTypeLike | None = None, devices: int | None = None) -> Plan:
        """The plan itself, made already (an entry given a Plan runs it as it is), after checking it
        was made for this mesh: the arguments are those of :meth:`Options.plan`.

        Args:
          cell: the cell to be run.
          xs: (T, B, I) the inputs, or their ``jax.ShapeDtypeStruct``.
          s0: (B, S) the flat initial state, or its ``jax.ShapeDtypeStruct``.
          states_dtype: the dtype of the states the forward produces (not read: the plan is made).
          devices: the size of the mesh axis the time is split over; None: one device.

        Returns:
          This :class:`Plan`.

        Raises:
          bppsa.errors.UsageError: the plan was made for another ``devices``.
        """
        del cell, xs, s0, states_dtype
        if self.devices != devices:
            raise UsageError(f"this Plan was made for devices={self.devices}; the run has devices={devices}: "
                             "pass the Options it was planned from")
        return self

    def replace(self, **fields: Any) -> Plan:
        """A copy with ``fields`` (of :class:`Options` or the plan's own) changed, checked again:
        every choice stays made.

        Args:
          **fields: fields of the plan and their new values.

        Returns:
          The new :class:`Plan`.

        Raises:
          bppsa.errors.UsageError: an unknown field name, a bad value or a choice left open.
        """
        unknown = sorted(set(fields) - {f.name for f in dataclasses.fields(self)})
        if unknown:
            raise UsageError(f"unknown plan field{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}; "
                             f"the fields are {', '.join(f.name for f in dataclasses.fields(self))}")
        return dataclasses.replace(self, **fields)


_FIELDS = tuple(f.name for f in dataclasses.fields(Options))


@overload
def make(options: Options | None = None, **fields: Any) -> Options: ...
@overload
def make(options: Plan, **fields: Any) -> Plan: ...
def make(options: Options | Plan | None = None, **fields: Any) -> Options | Plan:
    """``options`` (default: ``Options()``) with ``fields`` overriding it. Unknown field names and
    bad values raise a UsageError naming them (the keywords of every entry point come here).

    Args:
      options: an :class:`Options` or a :class:`Plan`, or None (``Options()``).
      **fields: fields of :class:`Options` and their values, overriding those of ``options``.

    Returns:
      The checked :class:`Options`, or the :class:`Plan` with ``fields`` changed (``options`` itself
      when no ``fields`` are given).

    Raises:
      bppsa.errors.UsageError: an unknown field name, a bad value, or ``options`` not an :class:`Options`.
    """
    unknown = sorted(set(fields) - set(_FIELDS))
    if unknown:
        raise UsageError(f"unknown option{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}; "
                         f"the options are {', '.join(_FIELDS)}")
    if options is None:
        return Options(**fields)
    if isinstance(options, Plan):  # a plan runs as it is, with the fields given changed (still made)
        return options.replace(**fields) if fields else options
    if not isinstance(options, Options):
        raise UsageError(f"options must be a bppsa.Options, a bppsa.Plan or None; got {type(options).__name__}")
    return dataclasses.replace(options, **fields) if fields else options


def tolerance(dtype: DTypeLike, tol: float | None = None) -> float:
    """``tol`` or the default for ``dtype`` (:data:`DEFAULT_TOL`; other dtypes: float32's).

    Args:
      dtype: the states' dtype.
      tol: the tolerance asked for, or None (the dtype's default).

    Returns:
      The tolerance as a Python float.
    """
    return float(tol) if tol is not None else DEFAULT_TOL.get(jnp.dtype(dtype).name, DEFAULT_TOL["float32"])


def unroll_for(cell: Cell, T: int, B: int, dtype: DTypeLike | None = None, state_size: int | None = None,
               unroll: int | bool | None = None, backend: str | None = None, backward: str = "bptt") -> int:
    """The forward ``lax.scan``'s unroll as an int: ``unroll`` None: tuned for this cell, shape,
    backend and ``backward`` ("bptt": autodiff differentiates the loop; else a forward alone)
    (:func:`bppsa.plan.rules.bptt_unroll`; ``state_size``: the flat state width S); True: every step
    (T); False: 1; an int: itself (what ``lax.scan`` makes of each).

    Args:
      cell: the cell the loop steps.
      T: the number of steps.
      B: the batch size.
      dtype: the inputs' dtype (None: float32).
      state_size: the flat state width S (read where the cell has no hidden size, ``Generic``).
      unroll: the unroll asked for: None (tuned), a bool or a positive int.
      backend: the backend the loop runs on (None: ``jax.default_backend()``).
      backward: "bptt" (autodiff through the loop), or "bppsa" / "forward" (a forward alone).

    Returns:
      The unroll factor, an int.

    Raises:
      bppsa.errors.UsageError: ``unroll`` None and ``backward`` none of "bptt", "bppsa", "forward".
    """
    if unroll is None:
        return rules.bptt_unroll(cell, T, B, dtype, backend, state_size=state_size, backward=backward)
    if isinstance(unroll, bool):
        return max(int(T), 1) if unroll else 1
    return int(unroll)


def _check_solver_fields(tol, atol, rtol, max_iter, damping, on_fail) -> tuple[Any, ...]:
    """The parallel forward's fields (the only place they are checked); returns (tol, atol, rtol,
    max_iter, damping) as Python floats (or None) and an int (numpy and JAX scalars are accepted)."""
    t, n, d = (None if tol is None else as_number(tol)), as_int(max_iter), (None if damping is None else
                                                                            as_number(damping))
    if tol is not None and not (t is not None and 0 < t < 1):
        raise UsageError(f"tol must be a number in (0, 1) or None (per dtype: {DEFAULT_TOL}); got {tol!r}")
    a, r = (None if v is None else as_number(v) for v in (atol, rtol))
    if atol is not None and not (a is not None and np.isfinite(a) and a >= 0):
        raise UsageError(f"atol must be a finite number >= 0 or None (= tol); got {atol!r}")
    if rtol is not None and not (r is not None and np.isfinite(r) and 0 <= r < 1):
        raise UsageError(f"rtol must be a number in [0, 1) or None (= tol); got {rtol!r}")
    if a == 0 and r == 0:
        raise UsageError("atol and rtol are both 0: no iterate can meet them; give one of them > 0")
    if n is None or n < 1:
        raise UsageError(f"max_iter must be a positive int; got {max_iter!r}")
    if damping is not None and not (d is not None and np.isfinite(d) and d >= 0):
        raise UsageError(f"damping must be None (plain Newton) or a finite number >= 0 (the initial λ); "
                         f"got {damping!r}")
    _choice("on_fail", on_fail, ON_FAIL)
    return (None if t is None else float(t), None if a is None else float(a), None if r is None else float(r), n,
            None if d is None else float(d))


def _kernels(kernels: str, cell: Cell, backward: str, forward: str, S: int, devices: int | None, backend: str) -> str:
    """``kernels`` made concrete for this problem: "auto" by :func:`bppsa.plan.rules.choose_kernels`;
    "pallas" and "interpret" only where the fused kernels run this problem (:mod:`bppsa.kernels`): else a
    UsageError naming why (nothing runs another path silently). "pallas" is planned on any host (a
    training step exported for a GPU from a CPU machine needs it); compiling its kernels for anything
    but a GPU stops with bppsa's UsageError (:func:`bppsa.kernels.lowering.gpu_only`)."""
    if kernels == "auto":
        return rules.choose_kernels(cell, backend)
    if kernels == "xla":
        return kernels
    from bppsa import kernels as kernel_lib  # Pallas loads only where a kernel is asked for, not on import
    why = kernel_lib.unsupported(cell, backward, forward, S, mesh=devices is not None)
    if why:
        raise UsageError(f"kernels={kernels!r} needs a fused kernel for every stage of the problem; none for "
                         f"{'; '.join(why)}. kernels='xla' runs it")
    return kernels


def _newton_kernel(kernels: str, cell: Cell, forward: str, dtype: Any) -> Literal["none", "step", "measured"]:
    """How the fused kernels run a parallel forward's Newton step (:attr:`Plan.newton_kernel`):
    whole for a diagonal cell (:func:`bppsa.kernels.newton.supports`), with its convergence test
    where the kernels compute in the states' dtype (:func:`bppsa.kernels.newton.measures_fuse`)."""
    if kernels == "xla" or forward == "sequential":
        return "none"
    from bppsa.kernels import newton  # Pallas loads only where a kernel is asked for, not on import
    if not newton.supports(cell):
        return "none"
    return "measured" if newton.measures_fuse(dtype) else "step"


def _choice(name, value, choices):
    if not (isinstance(value, str) and value in choices):
        raise UsageError(f"{name} must be one of {list(choices)}; got {value!r}")


def _chunk_size(chunk_size):
    """An int, None or "auto" (a numpy or JAX integer scalar becomes an int; bools, floats and
    traced values are refused)."""
    if chunk_size is None or (isinstance(chunk_size, str) and chunk_size == "auto"):
        return chunk_size
    n = as_int(chunk_size)
    if n is not None and n >= 1:
        return n
    if n is None and isinstance(chunk_size, jax.Array) and chunk_size.ndim == 0 and \
            jnp.issubdtype(chunk_size.dtype, jnp.integer):  # not concrete: the chunking is decided at trace time
        raise UsageError(f"chunk_size must be a concrete positive int (static under jit); "
                         f"got a traced {chunk_size.dtype} value")
    raise UsageError(f"chunk_size must be a positive int, None or 'auto'; got {chunk_size!r}")


def _unroll(unroll):
    """None, a bool, or a positive int (numpy and JAX integer scalars become ints)."""
    if unroll is None or isinstance(unroll, bool):
        return unroll
    n = as_int(unroll)
    if n is not None and n >= 1:
        return n
    raise UsageError(f"unroll must be a positive int, True, False or None (tuned); got {unroll!r}")


def _precision(precision) -> str:
    """A name from :data:`PRECISIONS` (any case) or a ``jax.lax.Precision`` -> its lower-case name."""
    if isinstance(precision, lax.Precision):
        return precision.name.lower()
    if isinstance(precision, str) and precision.lower() in PRECISIONS:
        return precision.lower()
    raise UsageError(f"precision must be one of {list(PRECISIONS)} or a jax.lax.Precision; got {precision!r}")
