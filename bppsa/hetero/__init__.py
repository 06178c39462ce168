"""Heterogeneity-aware data parallelism (Moreno-Álvarez et al., 2022).

Replica i at measured speed s_i gets b_i ≈ B·s_i/Σs samples (:func:`partition`), and its mean
gradient is weighted by its share of the data, g = Σ_i (b_i/B)·g_i (:func:`weighted_mean`; in
SPMD form :func:`make_spmd_grad`: one psum of (gradient sum, count)).
"""

from bppsa.hetero.partition import partition, plain_mean, sample_weights, weighted_mean
from bppsa.hetero.spmd import (
    AVERAGES,
    data_mesh,
    global_batch,
    local_grad_sum,
    make_allreduce,
    make_spmd_grad,
    pad_local_batch,
    replica_batches,
)

__all__ = ["partition", "weighted_mean", "plain_mean", "sample_weights", "AVERAGES", "data_mesh",
           "global_batch", "local_grad_sum", "make_allreduce", "make_spmd_grad", "pad_local_batch",
           "replica_batches"]
