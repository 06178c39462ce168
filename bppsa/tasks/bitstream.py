"""The paper's synthetic bitstream task (BPPSA §5.1).

Class k ∈ {0, …, 9} is a Bernoulli(0.05 + 0.1·k) bitstream of length T; the model must tell
the rate from the bits. Deterministic from a seed.
"""

from __future__ import annotations

import numpy as np

__all__ = ["NUM_CLASSES", "class_rates", "make_bitstream"]

NUM_CLASSES = 10


def class_rates(num_classes: int = NUM_CLASSES) -> np.ndarray:
    """p_k = 0.05 + 0.1·k, shape (num_classes,).

    Args:
      num_classes: K, the number of classes.

    Returns:
      (K,) float64, class k's Bernoulli rate.
    """
    return 0.05 + 0.1 * np.arange(num_classes)


def make_bitstream(num_samples: int, length: int, seed: int = 0, num_classes: int = NUM_CLASSES):
    """Return x (N, T, 1) float32 bits and y (N,) int32 labels, balanced over the classes.

    Args:
      num_samples: N (>= 1).
      length: T, the bits per sample (>= 1).
      seed: seeds the labels' order and the bits.
      num_classes: K, in 1..10.

    Returns:
      The pair (x (N, T, 1) float32 of 0s and 1s, y (N,) int32 in 0..K−1).

    Raises:
      ValueError: for num_samples or length below 1, or num_classes outside 1..10.
    """
    if num_samples < 1:
        raise ValueError(f"num_samples must be >= 1; got {num_samples}")
    if length < 1:
        raise ValueError(f"length must be >= 1; got {length}")
    if not 1 <= num_classes <= 10:
        raise ValueError(f"num_classes must be in 1..10 (rates 0.05 + 0.1 k stay below 1); got {num_classes}")
    rng = np.random.default_rng(seed)
    y = np.arange(num_samples) % num_classes
    rng.shuffle(y)
    p = class_rates(num_classes)[y]
    x = (rng.random((num_samples, length)) < p[:, None]).astype(np.float32)[..., None]
    return x, y.astype(np.int32)
