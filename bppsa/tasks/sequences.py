"""A synthetic sequence-classification data set with IRMAS's layout (K classes, F features per frame, T frames). ::

    x, y = make_sequences(num_samples=2000, length=32, num_features=12, num_classes=8, noise=1.0, seed=0)

Class k has a random spectral template m_k (F,) and a modulation frequency ω_k; a sample is
x_t = a·m_k·(1 + 0.5·sin(ω_k t + φ)) + σ·ε_t with random phase φ, gain a and Gaussian noise
(σ = ``noise``), so the class must be inferred by integrating the noisy frames over time.
"""

from __future__ import annotations

import numpy as np

__all__ = ["make_sequences"]


def make_sequences(num_samples: int, length: int, num_features: int = 12, num_classes: int = 8,
                   noise: float = 1.0, seed: int = 0):
    """x (N, T, F) float32, y (N,) int32 (balanced over the classes): the data set of the module docstring.

    Args:
      num_samples: N (>= 1).
      length: T, the frames per sample (>= 1).
      num_features: F, the features per frame (>= 1).
      num_classes: K (>= 2).
      noise: σ, the Gaussian noise's standard deviation (>= 0).
      seed: seeds the templates, the labels' order and every sample.

    Returns:
      The pair (x (N, T, F) float32, y (N,) int32 in 0..K−1).

    Raises:
      ValueError: for a size below its minimum or a negative (or NaN) noise.
    """
    for name, v, lo in (("num_samples", num_samples, 1), ("length", length, 1),
                        ("num_features", num_features, 1), ("num_classes", num_classes, 2)):
        if int(v) < lo:
            raise ValueError(f"{name} must be >= {lo}; got {v}")
    if not noise >= 0:
        raise ValueError(f"noise must be >= 0; got {noise!r}")
    rng = np.random.default_rng(seed)
    templates = rng.normal(size=(num_classes, num_features))
    templates /= np.linalg.norm(templates, axis=1, keepdims=True) / np.sqrt(num_features)
    omega = rng.uniform(0.2, 1.2, size=num_classes)
    y = np.arange(num_samples) % num_classes
    rng.shuffle(y)
    t = np.arange(length)
    phase = rng.uniform(0, 2 * np.pi, size=(num_samples, 1))
    gain = rng.uniform(0.3, 0.7, size=(num_samples, 1, 1))
    mod = 1.0 + 0.5 * np.sin(omega[y][:, None] * t[None, :] + phase)  # (N, T)
    x = gain * templates[y][:, None, :] * mod[..., None] + noise * rng.normal(size=(num_samples, length, num_features))
    return x.astype(np.float32), y.astype(np.int32)
