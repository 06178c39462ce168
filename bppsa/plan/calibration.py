"""The cost model's calibration and ``backward="auto"``'s choice.

A calibrated :class:`bppsa.plan.cost.CostModel` is cached per device (:func:`device_key`,
:func:`cache_path`, :func:`load`, :func:`save`); bppsa ships one model per backend
(:func:`shipped_cost_model`, package data ``bppsa/plan/cost_models/{cpu,gpu}.json``).

:func:`choose_backward` is the whole policy, among tuned BPTT and BPPSA with the Blelloch or the
sequential scan: on CPU the elementwise BPPSA for cells with 1×1 Jacobian blocks (measured), else
the model passed in (``bppsa.rnn(..., backward="auto", cost_model=model)``), else the calibration
cached for this device (:func:`default_cost_model`), else the model shipped with bppsa for this
backend, else tuned BPTT. Nothing is installed globally.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.resources
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jax

from bppsa.cells.structure import block_size
from bppsa.errors import UsageError
from bppsa.host import cpu_model
from bppsa.plan.cost import METHODS, CostModel

if TYPE_CHECKING:
    from bppsa.cells import Cell

__all__ = ["COST_MODEL_VERSION", "device_key", "cache_path", "load", "save", "shipped_cost_model",
           "default_cost_model", "choose_backward"]

COST_MODEL_VERSION = 6  # 2: storage-order Blelloch scan, chunk_size="auto"; 3: BPTT's B > 1 term;
# 4: the RNN's diagonal-structure scan, dense and diagonal S^3 terms; 5: tuned BPTT unroll, the
# sequential scan as a third method; 6: GRU and LSTM in the probe


def device_key() -> str:
    """Backend, device kind (the CPU model on CPU), jax version and :data:`COST_MODEL_VERSION`:
    a model calibrated under another key (older backward implementation) is not used.

    Returns:
      The key, ``"backend|device kind|jax version|model version"``.
    """
    kind = jax.devices()[0].device_kind if jax.default_backend() != "cpu" else cpu_model()
    return f"{jax.default_backend()}|{kind}|jax {jax.__version__}|model {COST_MODEL_VERSION}"


def cache_path() -> Path:
    """Where the calibrated model is cached: $BPPSA_CACHE_DIR or ~/.cache/bppsa, one file per device.

    Returns:
      The path of this device's file, ``cost_model-<hash of device_key()>.json`` in that folder.
    """
    root = Path(os.environ.get("BPPSA_CACHE_DIR") or Path.home() / ".cache" / "bppsa")
    digest = hashlib.sha1(device_key().encode()).hexdigest()[:12]
    return root / f"cost_model-{digest}.json"


def load(path: str | os.PathLike | None = None) -> CostModel | None:
    """The cached :class:`~bppsa.plan.cost.CostModel` for this device (default: :func:`cache_path`), or None when
    there is none, it is unreadable or it was calibrated under another :func:`device_key`.

    Args:
      path: the JSON file to read (None: :func:`cache_path`).

    Returns:
      The :class:`~bppsa.plan.cost.CostModel`, or None.
    """
    try:
        rec = json.loads(Path(path or cache_path()).read_text())
        if rec.get("meta", {}).get("device") == device_key():
            return CostModel.from_json(rec)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass
    return None


def save(model: CostModel, path: str | os.PathLike | None = None) -> Path:
    """Write ``model`` to ``path`` (default: :func:`cache_path`); returns the path.

    Args:
      model: the :class:`~bppsa.plan.cost.CostModel` (its ``meta["device"]`` should be :func:`device_key` for
        :func:`load` to take it).
      path: the JSON file to write (None: :func:`cache_path`); its folder is created.

    Returns:
      The path written. :func:`default_cost_model` looks again at its next call.
    """
    path = Path(path or cache_path())
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(model.to_json(), indent=1) + "\n")
    default_cost_model.cache_clear()
    return path


def shipped_cost_model(backend: str | None = None) -> CostModel | None:
    """The model shipped with bppsa for ``backend`` (default: ``jax.default_backend()``): package
    data ``bppsa/plan/cost_models/cpu.json`` (fitted from a calibration on a 2-core x86 CPU) or
    ``gpu.json`` (a prior from published H200 figures, not measured: its ``meta["measured"]`` is
    false); None for other backends or a file written for another :data:`COST_MODEL_VERSION`.

    Args:
      backend: "cpu", or "gpu", "cuda" or "rocm" (None: ``jax.default_backend()``).

    Returns:
      The shipped :class:`~bppsa.plan.cost.CostModel`, or None.
    """
    backend = backend or jax.default_backend()
    name = "cpu" if backend == "cpu" else "gpu" if backend in ("gpu", "cuda", "rocm") else None
    if name is None:
        return None
    try:
        rec = json.loads(importlib.resources.files("bppsa.plan").joinpath("cost_models", f"{name}.json")
                         .read_text())
        if rec.get("meta", {}).get("model_version") == COST_MODEL_VERSION:
            return CostModel.from_json(rec)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass
    return None


@functools.lru_cache(maxsize=None)
def default_cost_model() -> CostModel | None:
    """The calibration cached for this device (:func:`load`), else :func:`shipped_cost_model`;
    looked up once per process (``default_cost_model.cache_clear()`` looks again).

    Returns:
      The :class:`~bppsa.plan.cost.CostModel`, or None when there is neither.
    """
    return load() or shipped_cost_model()


def choose_backward(cell: Cell, T: int, B: int, dtype: Any = None, *, cost_model: CostModel | None = None,
                    scan: str | None = None, devices: int | None = None, backend: str | None = None) -> tuple:
    """What ``backward="auto"`` runs: ``(backward, scan)``, a value of :data:`bppsa.plan.cost.METHODS`. On CPU, one
    device (``devices`` None), 1×1 Jacobian blocks (the Block cells at head size 1), ``scan`` open:
    :func:`bppsa.plan.rules.elementwise_plan`'s BPPSA, measured not modelled (T·B·S Jacobians and scan work where the
    model's features count S×S matrices: it picks BPTT, 1.03-3.18x slower there, measured in
    measurements: diagonal-auto). Else ``cost_model``, else :func:`default_cost_model`, else BPTT.

    Args:
      cell: the cell.
      T: the number of steps.
      B: the batch size.
      dtype: the states' dtype (None: float32).
      cost_model: the :class:`~bppsa.plan.cost.CostModel` that decides (None: :func:`default_cost_model`).
      scan: the scan the user named (None: open).
      devices: the size of the mesh axis the time is split over; None: one device.
      backend: the backend (None: ``jax.default_backend()``).

    Returns:
      (backward, scan), ("bptt", None), ("bppsa", "blelloch") or ("bppsa", "sequential").

    Raises:
      bppsa.errors.UsageError: ``cost_model`` neither a :class:`~bppsa.plan.cost.CostModel` nor None.
    """
    if cost_model is not None and not isinstance(cost_model, CostModel):
        raise UsageError(f"cost_model must be a bppsa.CostModel (e.g. bppsa.plan.calibration.default_cost_model()) or "
                         f"None; got {cost_model!r} of type {type(cost_model).__name__}")
    cpu = (backend or jax.default_backend()) == "cpu"
    if cpu and devices is None and scan is None and block_size(cell) == 1:
        return METHODS["bppsa_sequential"]
    model = default_cost_model() if cost_model is None else cost_model
    return METHODS["bptt" if model is None else model.choose(cell, T, B, dtype)]
