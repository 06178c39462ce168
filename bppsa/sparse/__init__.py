"""Sparse transposed Jacobians of feed-forward chains, and BPPSA over them (the paper's third use case).

- :mod:`bppsa.sparse.jacobians`: analytic sparse (BCOO) transposed Jacobians of convolution,
  ReLU, max-pooling, linear and flatten layers; SpGEMM; the sparse modified Blelloch scan over a
  chain with the hybrid knob L_m;
- :mod:`bppsa.sparse.vgg`: VGG-style chains with a BPPSA backward over those Jacobians, VGG-11,
  magnitude pruning and the BP-vs-BPPSA FLOP analysis.

The functions of :mod:`bppsa.sparse.jacobians` are re-exported here (``bppsa.sparse.relu_transposed_jacobian``).
"""

from __future__ import annotations

from bppsa.sparse import jacobians, vgg  # noqa: F401 -- the submodules, as attributes
from bppsa.sparse.jacobians import (
    block_diag,
    chain_scan,
    conv2d_output_shape,
    conv2d_transposed_jacobian,
    conv2d_weight_grad,
    flatten_transposed_jacobian,
    linear_transposed_jacobian,
    linear_weight_grad,
    maxpool2d_transposed_jacobian,
    products,
    prune_zeros,
    relu_transposed_jacobian,
    scan_depth,
    sequential_middle,
    spgemm,
    spgemm_flops,
    spmv,
)

__all__ = [
    "conv2d_transposed_jacobian", "conv2d_output_shape", "relu_transposed_jacobian",
    "maxpool2d_transposed_jacobian", "linear_transposed_jacobian", "flatten_transposed_jacobian",
    "block_diag", "prune_zeros", "spgemm", "spmv", "spgemm_flops", "products", "sequential_middle",
    "chain_scan", "scan_depth", "conv2d_weight_grad", "linear_weight_grad",
]
