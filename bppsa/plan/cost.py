"""What each backward pass and each forward costs: the model behind ``backward="auto"`` and ``forward="auto"``.

A :class:`CostModel` predicts the backward-pass seconds of BPTT and of BPPSA (the Blelloch or the
sequential scan: :data:`METHODS`) from a handful of problem features (:func:`cost_features`), with
non-negative coefficients fitted per device (:meth:`CostModel.fit`, a non-negative least-squares fit
on relative error; the probe that times the real backward is the harness's, ``bppsa bench --calibrate``).
Which model decides, and ``backward="auto"``'s whole policy, is :mod:`bppsa.plan.calibration`
(:func:`bppsa.plan.calibration.choose_backward`).

The forward's model (:func:`forward_seconds`, :func:`break_even_iterations`) and ``forward="auto"``'s
choice (:func:`choose_forward`) live here too. Both are consulted from one place,
:meth:`bppsa.plan.options.Options.plan`, before anything runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np
import scipy.optimize

from bppsa.cells.base import gate_count
from bppsa.cells.structure import Scaled, block_size, structure_of
from bppsa.plan.rules import auto_chunk_size

if TYPE_CHECKING:
    from bppsa.cells import Cell

__all__ = ["METHODS", "backward_levels", "cost_features", "CostModel", "NEWTON_ITERATIONS", "FORWARD_CONSTANTS",
           "forward_seconds", "break_even_iterations", "choose_forward"]

# The methods a CostModel predicts and backward="auto" chooses among: name -> (backward, scan).
METHODS = {"bptt": ("bptt", None), "bppsa": ("bppsa", "blelloch"), "bppsa_sequential": ("bppsa", "sequential")}
_NFEAT = {"bptt": 3, "bppsa": 4, "bppsa_sequential": 3}


def backward_levels(T: int, B: int = 1, S: int = 1, itemsize: int = 4, structured: bool = False) -> int:
    """Dependent levels of the BPPSA backward: 2⌈log₂(C + 1)⌉ per chunk of C steps (up-sweep +
    down-sweep), times the number of chunks ``chunk_size="auto"`` makes on this backend.

    Args:
      T: the number of steps.
      B: the batch size.
      S: the flat state size.
      itemsize: the bytes of one state entry.
      structured: the cell has diagonal structure (:func:`bppsa.plan.rules.auto_chunk_size`).

    Returns:
      The number of dependent levels, an int.
    """
    C = auto_chunk_size(T, B, S, itemsize, structured=structured) or T
    return -(-T // C) * 2 * max(1, int(C).bit_length())


def cost_features(cell: Cell, T: int, B: int, itemsize: int = 4) -> dict:
    """The model's features for one problem (S = ``cell.state_size``, G = :func:`bppsa.cells.gate_count`).

    BPTT:  t = a_step · T + a_batch · T·[B > 1] + a_flop · T·B·G·S²   (T dependent steps)
    BPPSA: t = b_level · levels + b_dense · T·B·S³·[dense] + b_diag · T·B·S³·[diagonal] + b_mem · T·B·G·S²
    levels = 2⌈log₂(C + 1)⌉ dependent levels per chunk of C steps (:func:`backward_levels`);
    T·B·S³ is the up-sweep's matrix–matrix work, counted in one of two features: cells whose
    Jacobians are formed (dense) and cells with diagonal structure
    (:class:`bppsa.cells.Scaled`, the RNN), whose first level is one large
    GEMM from vectors; T·B·G·S² the Jacobian generation, vector products and contraction (memory
    bound). a_batch: XLA's per-step cost jumps from B = 1 to B = 2 on the CPU, more than the flops
    explain (what the probe measured is kept in ``cost_models/cpu.json``).
    BPPSA, sequential scan: t = c_step · T + c_jac · T·B·S² + c_mem · T·B·G·S²  (T dependent
    vector–matrix products over the (T, B, S, S) Jacobians, which are always formed).

    Args:
      cell: the cell (S, G and its Jacobian structure).
      T: the number of steps.
      B: the batch size.
      itemsize: the bytes of one state entry (the chunking of the levels).

    Returns:
      The features by method, ``{"bptt": [3 floats], "bppsa": [4 floats], "bppsa_sequential": [3 floats]}``,
      each list in the order of its formula's terms above.
    """
    S, G = cell.state_size, gate_count(cell)
    diag = isinstance(structure_of(cell), Scaled)
    work = float(T) * B * S ** 3
    return {"bptt": [float(T), float(T) * (B > 1), float(T) * B * G * S * S],
            "bppsa": [float(backward_levels(T, B, S, itemsize, diag)), 0.0 if diag else work,
                      work if diag else 0.0, float(T) * B * G * S * S],
            "bppsa_sequential": [float(T), float(T) * B * S * S, float(T) * B * G * S * S]}


def _nnls(A: Any, y: Any) -> np.ndarray:
    """Non-negative least squares on relative error: min ‖A x / y − 1‖ over x >= 0
    (``scipy.optimize.nnls``, Lawson–Hanson).

    Where the probe cannot tell features apart (a feature's column lies in the span of the
    chosen ones: with only G = 1 cells probed, the G·S² terms are collinear with the S² and S³
    ones), nnls hands all the weight to one of them. The minimum-norm least-squares solution over
    the chosen and such collinear features is taken instead when it is non-negative and fits as
    well (the same residual), so that a refit does not move the choices for cells the probe did
    not cover (GRU, LSTM: G = 3, 4) on a numerical tie-break.
    """
    A = np.asarray(A, float) / np.asarray(y, float)[:, None]
    b = np.ones(len(y))
    x, rnorm = scipy.optimize.nnls(A, b)
    chosen = x > 0
    if chosen.any():
        basis = A[:, chosen]
        proj = basis @ np.linalg.lstsq(basis, A, rcond=None)[0]  # every column projected on the chosen ones
        tied = chosen | (np.linalg.norm(proj - A, axis=0) <= 1e-9 * np.linalg.norm(A, axis=0))
        if tied.sum() > chosen.sum():
            x_tied = np.zeros_like(x)
            x_tied[tied] = np.linalg.lstsq(A[:, tied], b, rcond=None)[0]
            if x_tied.min() >= 0 and np.linalg.norm(A @ x_tied - b) <= rnorm * (1 + 1e-9) + 1e-12:
                return x_tied
    return x


class CostModel:
    """Predicted backward-pass seconds of each method of :data:`METHODS` from :func:`cost_features`.

    ``coef = {"bptt": [a_step, a_batch, a_flop], "bppsa": [b_level, b_dense, b_diag, b_mem],
    "bppsa_sequential": [c_step, c_jac, c_mem]}`` (seconds per unit; "bppsa_sequential" is optional:
    a model without it never picks the sequential scan), fitted by :meth:`fit`. ``choose`` picks the
    method (a :data:`METHODS` key) with the smallest prediction (``backward="auto", cost_model=model``).

    Args:
      coef: the coefficients by method, as above: 3 numbers for "bptt", 4 for "bppsa", optionally 3 for
        "bppsa_sequential" (other keys are dropped).
      meta: what the model was fitted on (``meta["device"]``: the :func:`bppsa.plan.calibration.device_key` it is
        valid for).

    Raises:
      ValueError: a method's coefficients missing or of the wrong count.
    """

    def __init__(self, coef: dict, meta: dict | None = None):
        for k, n in _NFEAT.items():
            if (k in coef or k != "bppsa_sequential") and len(coef.get(k) or ()) != n:
                raise ValueError(f"coef[{k!r}] must be a list of {n} numbers; got {coef.get(k)!r}")
        self.coef = {k: [float(c) for c in v] for k, v in coef.items() if k in _NFEAT}
        self.meta = dict(meta or {})

    @classmethod
    def fit(cls, features: dict, seconds: dict, meta: dict | None = None) -> "CostModel":
        """Fit non-negative coefficients, minimising the relative error: ``features[k]``, a list of
        :func:`cost_features` rows, ``seconds[k]`` the measured backward seconds of method k ("bptt",
        "bppsa", optionally "bppsa_sequential") at each.

        Args:
          features: ``{method: [feature rows]}``, rows of :func:`cost_features` for "bptt" and "bppsa"
            (and "bppsa_sequential" to fit it).
          seconds: ``{method: [seconds]}``, one measurement per row of ``features[method]``.
          meta: the new model's ``meta``.

        Returns:
          The fitted :class:`CostModel`.

        Raises:
          ValueError: a method's features and seconds empty or of different lengths.
        """
        keys = [k for k in _NFEAT if k != "bppsa_sequential" or k in features]
        for k in keys:
            if len(features.get(k, ())) != len(seconds.get(k, ())) or not features.get(k):
                raise ValueError(f"features[{k!r}] and seconds[{k!r}] must be non-empty lists of the same "
                                 f"length; got {len(features.get(k, ()))} and {len(seconds.get(k, ()))}")
        return cls({k: _nnls(features[k], seconds[k]).tolist() for k in keys}, meta)

    def predict(self, cell: Cell, T: int, B: int, dtype: Any = None) -> dict:
        """The predicted backward seconds of each method the model has, for one problem.

        Args:
          cell: the cell.
          T: the number of steps.
          B: the batch size.
          dtype: the states' dtype (None: float32).

        Returns:
          ``{method: seconds}`` for the keys of ``coef``.
        """
        f = cost_features(cell, T, B, 4 if dtype is None else jnp.dtype(dtype).itemsize)
        return {k: float(np.dot(c, f[k])) for k, c in self.coef.items()}

    def choose(self, cell: Cell, T: int, B: int, dtype: Any = None) -> str:
        """The :data:`METHODS` key predicted fastest (ties: the earlier key).

        Args:
          cell: the cell.
          T: the number of steps.
          B: the batch size.
          dtype: the states' dtype (None: float32).

        Returns:
          "bptt", "bppsa" or "bppsa_sequential".
        """
        p = self.predict(cell, T, B, dtype)
        return min(p, key=lambda k: (p[k], list(METHODS).index(k)))

    __call__ = choose

    def to_json(self) -> dict:
        """The model as a JSON-serialisable dict ``{"coef": ..., "meta": ...}`` (:meth:`from_json` reads it)."""
        return {"coef": self.coef, "meta": self.meta}

    @classmethod
    def from_json(cls, rec: dict) -> "CostModel":
        """The model a :meth:`to_json` dict ``rec`` describes (``meta`` optional).

        Raises:
          ValueError: coefficients missing or of the wrong count (:class:`CostModel`).
        """
        return cls(rec["coef"], rec.get("meta"))


#: The forward model's expected Newton iterations (measurements: parallel-step: newton 3-4 at random
#: weights, 11-27 for the trained IRMAS GRU, mean 5.4; quasi mean 11) and per-backend constants: a ``lax.scan``
#: step's and a scan level's latency (s; GPU's fitted to measurements: h200), products' flop/s.
NEWTON_ITERATIONS = {"newton": 5, "quasi": 11}
FORWARD_CONSTANTS = {"cpu": {"step": 2e-6, "level": 2e-5, "flops": 2e10},
                     "gpu": {"step": 2.2e-6, "level": 3e-5, "flops": 2e13}}


def forward_seconds(cell: Cell, T: int, B: int, forward: str, backend: str | None = None,
                    iterations: float | None = None) -> float:
    """Predicted seconds of one forward: "sequential" = T dependent steps, each its latency plus
    its work (B·G·S·(I + S) multiply-adds) at the backend's throughput; "newton"/"quasi" =
    ``iterations`` (None: :data:`NEWTON_ITERATIONS`) × (2⌈log₂ T⌉ scan levels' latency + the
    iteration's work: the steps, their Jacobians (B·S²·G) and the scan's block products (about
    2·B·S·k² per step for k×k blocks: k = S dense, the cell's block size, 1 for quasi)).

    Args:
      cell: the cell (S, G, I and its Jacobian block size).
      T: the number of steps.
      B: the batch size.
      forward: "sequential", "newton" or "quasi".
      backend: the backend whose :data:`FORWARD_CONSTANTS` apply (None: ``jax.default_backend()``;
        unknown ones: the GPU's).
      iterations: the Newton iterations (None: :data:`NEWTON_ITERATIONS`).

    Returns:
      The predicted seconds, a float.
    """
    c = FORWARD_CONSTANTS.get(backend or jax.default_backend(), FORWARD_CONSTANTS["gpu"])
    S, G, I = cell.state_size, gate_count(cell), cell.input_size or cell.state_size
    step_work = 2.0 * B * G * S * (I + S)
    if forward == "sequential":
        return T * (c["step"] + step_work / c["flops"])
    k = 1 if forward == "quasi" else (block_size(cell) or S)
    iteration = T * (2 * step_work + 2.0 * B * G * S * S + 4.0 * B * S * k * k) / c["flops"]
    n = NEWTON_ITERATIONS["newton" if block_size(cell) == 1 else forward] if iterations is None else iterations
    return n * (2 * max(1, int(np.ceil(np.log2(max(T, 2))))) * c["level"] + iteration)


def break_even_iterations(cell: Cell, T: int, B: int, backend: str | None = None) -> float:
    """The most Newton iterations at which the parallel forward is predicted faster than the
    sequential one (:func:`forward_seconds`) on ``backend``: ``forward="auto"``'s limit for the
    iterations :func:`bppsa.forward.newton.predicted_iterations` foresees.

    Args:
      cell: the cell.
      T: the number of steps.
      B: the batch size.
      backend: the backend (None: ``jax.default_backend()``).

    Returns:
      The break-even iteration count, a float (the sequential forward's seconds over one iteration's).
    """
    return forward_seconds(cell, T, B, "sequential", backend) / forward_seconds(cell, T, B, "newton", backend, 1)


def choose_forward(cell: Cell, T: int, B: int, dtype: Any = None,
                   backend: str | None = None) -> tuple[str, float | None]:
    """What ``forward="auto"`` runs: ("sequential", None) where the parallel forward cannot pay
    here (on CPU always: the sequential loop wins at every point of measurements: parallel-step;
    elsewhere where even two iterations are predicted slower: :func:`break_even_iterations`),
    else ("newton", the break-even iteration count): the solver then estimates the Lyapunov
    exponent at its first iterate and runs on only if it is negative and the iterations it
    predicts (:func:`bppsa.forward.newton.predicted_iterations`) are within the break-even count.

    Args:
      cell: the cell.
      T: the number of steps.
      B: the batch size.
      dtype: the states' dtype (not used: the constants are float32's).
      backend: the backend (None: ``jax.default_backend()``).

    Returns:
      (forward, gate), ("sequential", None) or ("newton", the break-even iteration count).
    """
    del dtype  # the constants are float32's; the choice does not hinge on it
    backend = backend or jax.default_backend()
    if backend == "cpu":  # measured, not modelled: the sequential forward at every CPU point
        return "sequential", None
    gate = float(break_even_iterations(cell, T, B, backend))
    return ("newton", gate) if gate >= 2 else ("sequential", None)
