"""What each backward pass costs, and ``backward="auto"``'s choice between them.

A :class:`CostModel` predicts the backward-pass seconds of BPTT and of BPPSA from a handful of
problem features (:func:`cost_features`), with non-negative coefficients fitted per device
(:meth:`CostModel.fit`; the probe that times the real backward is :func:`bppsa.calibrate.calibrate`).
A calibrated model is cached per device (:func:`cache_path`, :func:`load`, :func:`save`).

:func:`choose_backward` is the whole policy: the model passed in, else the cached calibration
for this device (:func:`default_cost_model`), else BPTT. Nothing is installed globally;
``bppsa.rnn(..., backward="auto", cost_model=model)`` passes a model explicitly.

The chunk sizing of the BPPSA backward (:func:`auto_chunk_size`) lives here too: the number of
dependent levels, a cost feature, depends on it.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from . import scan as scan_lib
from .provenance import cpu_model

__all__ = ["CHUNK_BYTES", "auto_chunk_size", "backward_levels", "cost_features", "CostModel",
           "COST_MODEL_VERSION", "device_key", "cache_path", "load", "save", "default_cost_model",
           "choose_backward"]

# chunk_size="auto" on CPU: chunks whose Jacobians take at most this many bytes, so that each
# chunk's scan works in cache. Measured (RNN H = 20, 2-core CPU, BPPSA backward, min of 7):
# T = 30 000, B = 1: one chunk 48.8 ms, chunks of 2048 / 4096 / 8192 steps 15.3 / 14.9 / 16.7 ms
# (BPTT 20.5 ms); T = 3000, B = 16: 70.2 ms -> 22.8 ms with chunks of 256
# (experiments/results/cpu/scan-optimisation.md). 8 MiB is 5120 steps at B = 1, 320 at B = 16.
# The RNN (diagonal structure, no Jacobians formed) is far less sensitive: T = 30 000, B = 1, median
# of 11: one chunk 13.1 ms, chunks of 4096 / 8192 / 16384 steps 12.8 / 13.4 / 13.0 ms; its chunks are
# sized by its largest array, the first level's products (half the Jacobians' bytes).
CHUNK_BYTES = 8 << 20


def auto_chunk_size(T: int, B: int, S: int, itemsize: int, backend: str | None = None,
                    structured: bool = False) -> int | None:
    """The chunk length ``chunk_size="auto"`` uses: None (one chunk) off CPU or when everything
    fits in :data:`CHUNK_BYTES`; else the largest length of the form m·2^k (32 <= m < 64, so the
    Blelloch scan pads nothing) whose largest array fits in it, at least 64: the (B, S, S)
    Jacobians per step, or for a cell with diagonal structure (``structured``, see
    :attr:`bppsa.cells.Cell.has_diagonal_jacobian`) half of that, the first level's products (its
    Jacobians are never formed).

    Decided when the backward is traced, from ``jax.default_backend()`` (not the placement of the
    arrays) and the shapes the backward sees (per example under ``vmap``).
    """
    if (backend or jax.default_backend()) != "cpu":
        return None
    per_step = B * S * S * itemsize
    if structured:
        per_step = max(1, per_step // 2)
    if T * per_step <= CHUNK_BYTES:
        return None
    c = max(64, CHUNK_BYTES // per_step)
    k, m, _ = scan_lib.bottom_layout(c)
    c = max(64, (c >> k) << k)  # m·2^k steps: the Blelloch scan needs no padding in a full chunk
    return None if c >= T else int(c)


def backward_levels(T: int, B: int = 1, S: int = 1, itemsize: int = 4, structured: bool = False) -> int:
    """Dependent levels of the BPPSA backward: 2⌈log₂(C + 1)⌉ per chunk of C steps (up-sweep +
    down-sweep), times the number of chunks ``chunk_size="auto"`` makes on this backend."""
    C = auto_chunk_size(T, B, S, itemsize, structured=structured) or T
    return -(-T // C) * 2 * max(1, int(C).bit_length())


def cost_features(cell, T: int, B: int, itemsize: int = 4) -> dict:
    """The model's features for one problem (S = ``cell.state_size``, G = ``cell.gates``).

    BPTT:  t = a_step · T + a_batch · T·[B > 1] + a_flop · T·B·G·S²   (T dependent steps)
    BPPSA: t = b_level · levels + b_dense · T·B·S³·[dense] + b_diag · T·B·S³·[diagonal] + b_mem · T·B·G·S²
    levels = 2⌈log₂(C + 1)⌉ dependent levels per chunk of C steps (:func:`backward_levels`);
    T·B·S³ is the up-sweep's matrix–matrix work, counted in one of two features: cells whose
    Jacobians are formed (dense) and cells with diagonal structure
    (:attr:`bppsa.cells.Cell.has_diagonal_jacobian`, the RNN), whose first level is one large
    GEMM from vectors; T·B·G·S² the Jacobian generation, vector products and contraction (memory
    bound). a_batch: XLA's per-step cost jumps from B = 1 to B = 2 (measured 0.7 -> 2.0 ms at
    T = 1000 on the 2-core CPU), more than the flops explain.
    """
    S, G = cell.state_size, cell.gates
    diag = cell.has_diagonal_jacobian
    work = float(T) * B * S ** 3
    return {"bptt": [float(T), float(T) * (B > 1), float(T) * B * G * S * S],
            "bppsa": [float(backward_levels(T, B, S, itemsize, diag)), 0.0 if diag else work,
                      work if diag else 0.0, float(T) * B * G * S * S]}


def _nnls(A, y):
    """Non-negative least squares on relative error (tiny: a few unknowns), by active-set pruning."""
    A = np.asarray(A, float) / np.asarray(y, float)[:, None]
    b = np.ones(len(y))
    active = list(range(A.shape[1]))
    while True:
        x = np.zeros(A.shape[1])
        x[active] = np.linalg.lstsq(A[:, active], b, rcond=None)[0]
        neg = [i for i in active if x[i] < 0]
        if not neg:
            return x
        active.remove(min(neg, key=lambda i: x[i]))


class CostModel:
    """Predicted backward-pass seconds of BPTT and BPPSA from :func:`cost_features`.

    ``coef = {"bptt": [a_step, a_batch, a_flop], "bppsa": [b_level, b_dense, b_diag, b_mem]}``
    (seconds per unit), fitted by :meth:`fit`. ``choose`` picks the method with the smaller
    prediction; ``bppsa.rnn(..., backward="auto", cost_model=model)`` uses it.
    """

    def __init__(self, coef: dict, meta: dict | None = None):
        for k, n in (("bptt", 3), ("bppsa", 4)):
            if k not in coef or len(coef[k]) != n:
                raise ValueError(f"coef[{k!r}] must be a list of {n} numbers; got {coef.get(k)!r}")
        self.coef = {k: [float(c) for c in v] for k, v in coef.items()}
        self.meta = dict(meta or {})

    @classmethod
    def fit(cls, features: dict, seconds: dict, meta: dict | None = None) -> "CostModel":
        """Fit non-negative coefficients, minimising the relative error.

        ``features[k]`` is a list of :func:`cost_features` rows (``cost_features(...)[k]``) and
        ``seconds[k]`` the measured backward seconds of method k ("bptt", "bppsa") at each.
        """
        for k in ("bptt", "bppsa"):
            if len(features.get(k, ())) != len(seconds.get(k, ())) or not features.get(k):
                raise ValueError(f"features[{k!r}] and seconds[{k!r}] must be non-empty lists of the same "
                                 f"length; got {len(features.get(k, ()))} and {len(seconds.get(k, ()))}")
        return cls({k: _nnls(features[k], seconds[k]).tolist() for k in ("bptt", "bppsa")}, meta)

    def predict(self, cell, T: int, B: int, dtype=None) -> dict:
        f = cost_features(cell, T, B, 4 if dtype is None else jnp.dtype(dtype).itemsize)
        return {k: float(np.dot(self.coef[k], f[k])) for k in ("bptt", "bppsa")}

    def choose(self, cell, T: int, B: int, dtype=None) -> str:
        p = self.predict(cell, T, B, dtype)
        return "bppsa" if p["bppsa"] < p["bptt"] else "bptt"

    __call__ = choose

    def to_json(self) -> dict:
        return {"coef": self.coef, "meta": self.meta}

    @classmethod
    def from_json(cls, rec: dict) -> "CostModel":
        return cls(rec["coef"], rec.get("meta"))


COST_MODEL_VERSION = 4  # 2: storage-order Blelloch scan, chunk_size="auto"; 3: BPTT's B > 1 term;
# 4: the RNN's diagonal-structure scan, dense and diagonal S^3 terms


def device_key() -> str:
    """Backend, device kind (the CPU model on CPU), jax version and :data:`COST_MODEL_VERSION`:
    a model calibrated under another key (older backward implementation) is not used."""
    kind = jax.devices()[0].device_kind if jax.default_backend() != "cpu" else cpu_model()
    return f"{jax.default_backend()}|{kind}|jax {jax.__version__}|model {COST_MODEL_VERSION}"


def cache_path() -> Path:
    """Where the calibrated model is cached: $BPPSA_CACHE_DIR or ~/.cache/bppsa, one file per device."""
    root = Path(os.environ.get("BPPSA_CACHE_DIR") or Path.home() / ".cache" / "bppsa")
    digest = hashlib.sha1(device_key().encode()).hexdigest()[:12]
    return root / f"cost_model-{digest}.json"


def load(path=None) -> CostModel | None:
    """The cached :class:`CostModel` for this device (default: :func:`cache_path`), or None when
    there is none, it is unreadable or it was calibrated under another :func:`device_key`."""
    try:
        rec = json.loads(Path(path or cache_path()).read_text())
        if rec.get("meta", {}).get("device") == device_key():
            return CostModel.from_json(rec)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass
    return None


def save(model: CostModel, path=None) -> Path:
    """Write ``model`` to ``path`` (default: :func:`cache_path`); returns the path."""
    path = Path(path or cache_path())
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(model.to_json(), indent=1) + "\n")
    default_cost_model.cache_clear()
    return path


@functools.lru_cache(maxsize=None)
def default_cost_model() -> CostModel | None:
    """:func:`load`, once per process (``default_cost_model.cache_clear()`` looks again)."""
    return load()


def choose_backward(cell, T: int, B: int, dtype=None, *, cost_model: CostModel | None = None) -> str:
    """The method ``backward="auto"`` uses for this problem: "bppsa" or "bptt".

    ``cost_model`` decides when given; else the calibrated model cached for this device
    (:func:`default_cost_model`; ``bppsa bench`` or :func:`bppsa.calibrate.load_cost_model` probes
    and caches one); with neither, BPTT. Never probes.
    """
    model = default_cost_model() if cost_model is None else cost_model
    return "bptt" if model is None else model.choose(cell, T, B, dtype)
