r"""Scans that solve the back-propagation recurrence of a chain (BPPSA, Wang et al., MLSys 2020).

The backward pass of a chain :math:`h_t = f(h_{t-1}, x_t)` is the linear recurrence (row vectors,
one per batch element) :math:`g_{t-1} = g_t M_t + c_{t-1}`, :math:`g_T = c_T`. In *scan order*
(latest step first) it is a prefix scan of :math:`[v, e_1, \dots, e_n]`, :math:`v = g_T`,
:math:`e_k = (M_k, d_k)` the affine map :math:`x \mapsto x M_k + d_k`. Every scan here takes ::

    v:  (B, S)        the root vector,
    Ms: (n, B, S, S)  the matrices of e_1 ... e_n, in scan order,
    ds: (n, B, S)     their offsets (None: all zero),

and returns ``(prefixes, total)``: prefixes (n, B, S) with prefixes[k] = v ∘ e_1 ∘ ... ∘ e_k
(prefixes[0] = v), total (B, S) = v ∘ e_1 ∘ ... ∘ e_n.

- :func:`blelloch_scan`: the paper's modified Blelloch scan (vector root, operands reversed in
  the down-sweep, no identity matrices), Θ(log n) levels;
- :func:`associative_scan`: ``jax.lax.associative_scan`` of the affine maps;
- :func:`sequential_scan`: the reference loop, n dependent steps;
- :func:`up_sweep`, :func:`down_sweep`: the two halves of the Blelloch scan, with the products
  as a parameter (:class:`Products`; :data:`DENSE` the reference ones), as the paper writes them;
- :func:`diagonal_scan`: the same scans for diagonal maps (:data:`DIAGONAL` products:
  elementwise), and :func:`block_scan`, which sends (n, R, 1, 1) blocks there and (k, k) blocks
  to :func:`scan` (the Block cells' and the quasi-Newton forward's scans).

Where it lives: :mod:`bppsa.scan.dense` the dense scans, the Blelloch sweeps with their products as
a parameter, and the tuned storage order the backward makes its elements in;
:mod:`bppsa.scan.blocks` the diagonal and block scans; :mod:`bppsa.scan.layout` blocks as batch
rows and equal chunks. The scans know nothing about cells, plans or devices. May import only JAX
and NumPy.
"""

from __future__ import annotations

from bppsa.scan import blocks, dense, layout
from bppsa.scan.blocks import DIAGONAL, block_scan, diagonal_scan
from bppsa.scan.dense import (
    DENSE,
    SCANS,
    Products,
    associative_scan,
    blelloch_scan,
    down_sweep,
    scan,
    sequential_scan,
    up_sweep,
    vecmat,
)

__all__ = ["SCANS", "scan", "blelloch_scan", "associative_scan", "sequential_scan", "up_sweep", "down_sweep",
           "vecmat", "Products", "DENSE", "DIAGONAL", "diagonal_scan", "block_scan", "dense", "blocks", "layout"]
