"""scikit-learn's bundled 8×8 handwritten digits (1797 images, 10 classes, no download). ::

    x_train, y_train, x_test, y_test = load_digits(size=8, test_fraction=0.2, seed=0)

Images are scaled to [0, 1] (float32, shape (N, size, size), no channel axis: callers add the
one their model's layout wants); labels are int32. ``size=16`` upsamples each pixel to a 2×2
block (nearest), as the sparse VGG retraining uses. The file is read directly, without importing
scikit-learn (whose import takes seconds, which matters in every worker process).
"""

from __future__ import annotations

import gzip
import importlib.util
from pathlib import Path

import numpy as np

__all__ = ["load_digits", "load_digits_arrays", "train_test_split"]


def load_digits_arrays():
    """The raw digits: (images (1797, 8, 8) float64 in [0, 16], target (1797,) int64).

    Reads ``digits.csv.gz``, the file ``sklearn.datasets.load_digits`` reads; falls back to
    ``load_digits`` itself where that file is not found.

    Returns:
      The pair (images (1797, 8, 8) float64 in [0, 16], target (1797,) int64).
    """
    spec = importlib.util.find_spec("sklearn")
    path = Path(spec.origin).parent / "datasets" / "data" / "digits.csv.gz" if spec and spec.origin else None
    if path is not None and path.exists():
        with gzip.open(path, "rt") as f:
            data = np.loadtxt(f, delimiter=",")
        return data[:, :-1].reshape(-1, 8, 8), data[:, -1].astype(np.int64)
    from sklearn.datasets import load_digits as sklearn_load_digits
    flat, target = sklearn_load_digits(return_X_y=True)  # flat is images.reshape(N, 64)
    return np.asarray(flat).reshape(-1, 8, 8), np.asarray(target)


def train_test_split(x, y, test_fraction: float = 0.2, seed: int = 0, *, stratify: bool = False):
    """Split x (N, ...), y (N,) into (x_train, y_train, x_test, y_test).

    ``stratify=False``: the first round(test_fraction·N) entries of a seeded permutation are the
    test set (train and test keep the permutation's order). ``stratify=True``: round(test_fraction·n_c)
    test samples drawn per class c; both sets keep the original order.

    Args:
      x: (N, ...) inputs (numpy).
      y: (N,) labels.
      test_fraction: the test set's share, in [0, 1).
      seed: seeds the permutation or the per-class draws.
      stratify: draw the test set per class.

    Returns:
      (x_train (N − M, ...), y_train (N − M,), x_test (M, ...), y_test (M,)), rows of x and y.

    Raises:
      ValueError: for a test_fraction outside [0, 1), or x and y of different lengths.
    """
    if not 0.0 <= test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in [0, 1); got {test_fraction!r}")
    if len(x) != len(y):
        raise ValueError(f"x and y must have the same length; got {len(x)} and {len(y)}")
    rng = np.random.default_rng(seed)
    if stratify:
        test = np.zeros(len(y), bool)
        for c in np.unique(y):
            idx = np.flatnonzero(y == c)
            test[rng.choice(idx, size=int(round(test_fraction * len(idx))), replace=False)] = True
        return x[~test], y[~test], x[test], y[test]
    perm = rng.permutation(len(x))
    n_test = int(round(test_fraction * len(x)))
    te, tr = perm[:n_test], perm[n_test:]
    return x[tr], y[tr], x[te], y[te]


def load_digits(*, size: int = 8, test_fraction: float = 0.2, seed: int = 0, stratify: bool = False):
    """The digits split into (x_train (N, size, size) float32 in [0, 1], y_train (N,) int32, x_test, y_test).

    Args:
      size: 8 (native) or 16 (each pixel repeated 2×2).
      test_fraction: the test set's share, in [0, 1) (:func:`train_test_split`).
      seed: seeds the split (:func:`train_test_split`).
      stratify: draw the test set per class (:func:`train_test_split`).

    Returns:
      (x_train (N, size, size) float32 in [0, 1], y_train (N,) int32, x_test (M, size, size),
      y_test (M,)), N + M = 1797.

    Raises:
      ValueError: for a size other than 8 or 16, or a test_fraction outside [0, 1).
    """
    if size not in (8, 16):
        raise ValueError(f"size must be 8 or 16; got {size!r}")
    images, target = load_digits_arrays()
    x = (images / 16.0).astype(np.float32)
    if size == 16:
        x = x.repeat(2, axis=1).repeat(2, axis=2)
    return train_test_split(x, target.astype(np.int32), test_fraction, seed, stratify=stratify)
