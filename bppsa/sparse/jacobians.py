r"""Sparse transposed Jacobians of feed-forward layers, and BPPSA over a chain of them.

BPPSA's third use case (Wang, Bai, Pekhimenko, MLSys 2020, §4.2 and §5.3): in a feed-forward
network the chain runs over *layers*, h_i = f_i(h_{i-1}), and the backward pass is

.. math::

    g_{i-1} = J_i^\top g_i, \qquad g_i = \partial L / \partial h_i, \qquad
    J_i^\top \in \mathbb{R}^{|h_{i-1}| \times |h_i|}.

For convolution, ReLU and max-pooling these transposed Jacobians are extremely sparse (and
sparser still after pruning), so the scan's up-sweep multiplies sparse matrices (SpGEMM) and its
down-sweep multiplies sparse matrices by vectors (SpMV).

Every generator here is *analytic*: index arithmetic on numpy/jnp arrays, no autodiff and no
Python loop over elements. It returns a :class:`jax.experimental.sparse.BCOO` matrix of shape
(input size, output size) for activations in NCHW layout flattened row-major, so that
``dL/dinput = Jᵀ @ dL/doutput``. A leading batch axis B in ``in_shape`` / ``x`` gives the
block-diagonal Jacobian of the whole batch (sample b's block at offset b·size): the batch's
backward pass is then one matrix chain. ::

    conv2d_transposed_jacobian(w, in_shape, stride=1, padding=1)   w: (C_out, C_in, kh, kw)
    relu_transposed_jacobian(x)                                      diag(x > 0)
    maxpool2d_transposed_jacobian(x, window=2)                       one 1 per output (argmax)
    linear_transposed_jacobian(W, in_shape=None)                     W: (out, in) -> Wᵀ
    flatten_transposed_jacobian(in_shape)                            the identity

The conv, linear and flatten patterns are static (they depend on shapes only), so those
generators are jittable; ``prune_zeros`` drops stored zeros (pruned weights, inactive ReLUs)
and, like ``spgemm`` and the chain scan, runs eagerly because its output size depends on data.

The scan follows :mod:`bppsa.scan` (modified Blelloch scan, vector at the root) with a list of
matrices of different shapes instead of a stacked array, plus the paper's hybrid knob L_m:
only the lowest L_m levels of up-sweep and down-sweep run as a tree, the blocks left at level
L_m are scanned sequentially. L_m = 0 is plain back-propagation; L_m ≥ ⌈log₂(n + 1)⌉ is the
full Blelloch scan.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import sparse as jsparse

from bppsa import scan as scan_lib
from bppsa.errors import as_int

__all__ = [
    "conv2d_transposed_jacobian", "conv2d_output_shape", "relu_transposed_jacobian",
    "maxpool2d_transposed_jacobian",
    "linear_transposed_jacobian", "flatten_transposed_jacobian", "block_diag", "prune_zeros",
    "spgemm", "spmv", "spgemm_flops", "products", "sequential_middle",
    "chain_scan", "scan_depth", "conv2d_weight_grad", "linear_weight_grad",
]


# --------------------------------------------------------------------------------------------
# Shape checks.
# --------------------------------------------------------------------------------------------

def _positive_int(name, value, minimum=1):
    n = as_int(value)
    if n is None or n < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}; got {value!r}")
    return n


def _image_shape(name, shape):
    """(C, H, W) or (B, C, H, W) -> (B, C, H, W) with B = 1 for rank 3."""
    shape = tuple(int(s) for s in shape)
    if len(shape) not in (3, 4) or min(shape) < 1:
        raise ValueError(f"{name} must be (C, H, W) or (B, C, H, W) with positive sizes; got shape {shape}")
    return shape if len(shape) == 4 else (1,) + shape


def _bcoo(data, rows, cols, shape, *, sorted_=False):
    indices = jnp.asarray(np.stack([rows, cols], axis=-1).astype(np.int32))
    return jsparse.BCOO((data, indices), shape=tuple(int(s) for s in shape),
                        indices_sorted=sorted_, unique_indices=True)


def _float_array(name, x):
    x = jnp.asarray(x)
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise ValueError(f"{name} must be a floating-point array; got dtype {x.dtype}")
    return x


# --------------------------------------------------------------------------------------------
# The generators.
# --------------------------------------------------------------------------------------------

def conv2d_output_shape(w_shape: Sequence[int], in_shape: Sequence[int], stride: int = 1,
                        padding: int = 1) -> tuple[int, int, int, int]:
    """(B, C_out, H_out, W_out) of a convolution; raises ValueError on unsupported shapes.

    Args:
      w_shape: (C_out, C_in, kh, kw), the kernel's shape.
      in_shape: (C_in, H, W) or (B, C_in, H, W), the input's shape.
      stride: the stride of both spatial axes.
      padding: the zero padding on each side of both spatial axes.

    Returns:
      (B, C_out, H_out, W_out) with B = 1 for a rank-3 ``in_shape``.

    Raises:
      ValueError: a ``w_shape`` not of rank 4, an ``in_shape`` not (C, H, W) or (B, C, H, W) of positive
      sizes, a non-positive stride or negative padding, channels that differ from C_in, or a kernel
      larger than the padded input.
    """
    if len(w_shape) != 4:
        raise ValueError(f"w must have shape (C_out, C_in, kh, kw); got shape {tuple(w_shape)}")
    B, C, H, W = _image_shape("in_shape", in_shape)
    C_out, C_in, kh, kw = (int(s) for s in w_shape)
    stride = _positive_int("stride", stride)
    padding = _positive_int("padding", padding, minimum=0)
    if C != C_in:
        raise ValueError(f"in_shape {tuple(in_shape)} has {C} channels but w (shape {tuple(w_shape)}) "
                         f"expects C_in = {C_in}")
    if kh > H + 2 * padding or kw > W + 2 * padding:
        raise ValueError(f"kernel {(kh, kw)} (w shape {tuple(w_shape)}) is larger than the padded input "
                         f"{(H + 2 * padding, W + 2 * padding)} of in_shape {tuple(in_shape)} "
                         f"with padding {padding}")
    return B, C_out, (H + 2 * padding - kh) // stride + 1, (W + 2 * padding - kw) // stride + 1


def conv2d_transposed_jacobian(w: jax.Array, in_shape: Sequence[int], stride: int = 1,
                               padding: int = 1) -> jsparse.BCOO:
    """Jᵀ of y = conv2d(x, w) (cross-correlation, zero padding, no bias; NCHW / OIHW).

    The result is BCOO (B·C_in·H·W, B·C_out·H_out·W_out) with
    Jᵀ[(b, ci, oh·s + a − p, ow·s + c − p), (b, co, oh, ow)] = w[co, ci, a, c] for every tap that
    lands inside the input (taps on the zero padding are not stored). Static pattern: jittable.

    Args:
      w: (C_out, C_in, kh, kw) the kernel, floating point.
      in_shape: (C_in, H, W) or (B, C_in, H, W), the input's shape.
      stride: the stride of both spatial axes.
      padding: the zero padding on each side of both spatial axes.

    Returns:
      The BCOO matrix Jᵀ (B·C_in·H·W, B·C_out·H_out·W_out) described above.

    Raises:
      ValueError: ``w`` is not floating point, or the shapes do not fit (:func:`conv2d_output_shape`).
    """
    w = _float_array("w", w)
    B, C_out, H_out, W_out = conv2d_output_shape(w.shape, in_shape, stride, padding)
    _, C_in, H, W = _image_shape("in_shape", in_shape)
    kh, kw = w.shape[2:]
    # Spatial taps (oh, ow, a, c) that land inside the input: a static numpy pattern.
    oh, ow, a, c = np.meshgrid(np.arange(H_out), np.arange(W_out), np.arange(kh), np.arange(kw),
                               indexing="ij")
    ih, iw = oh * stride + a - padding, ow * stride + c - padding
    keep = ((ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)).reshape(-1)
    sp_row = (ih * W + iw).reshape(-1)[keep]
    sp_col = (oh * W_out + ow).reshape(-1)[keep]
    tap = (a * kw + c).reshape(-1)[keep]
    # Entries laid out (b, ci, co, tap-position): rows/cols by broadcasting, data by one gather.
    b = np.arange(B)[:, None, None, None]
    ci = np.arange(C_in)[None, :, None, None]
    co = np.arange(C_out)[None, None, :, None]
    rows = (b * C_in + ci) * (H * W) + sp_row[None, None, None, :]
    cols = (b * C_out + co) * (H_out * W_out) + sp_col[None, None, None, :]
    shape4 = (B, C_in, C_out, sp_row.size)
    w_taps = w.transpose(1, 0, 2, 3).reshape(C_in, C_out, kh * kw)[:, :, tap]  # (C_in, C_out, P)
    data = jnp.broadcast_to(w_taps[None], shape4).reshape(-1)
    return _bcoo(data, np.broadcast_to(rows, shape4).reshape(-1), np.broadcast_to(cols, shape4).reshape(-1),
                 (B * C_in * H * W, B * C_out * H_out * W_out))


def relu_transposed_jacobian(x: jax.Array) -> jsparse.BCOO:
    """Jᵀ of y = relu(x), x of any shape (flattened row-major): diag(x > 0), shape (x.size, x.size).

    The derivative at 0 is 0, as for ``jax.nn.relu``. All x.size diagonal entries are stored
    (zeros included) so the pattern is static; ``prune_zeros`` keeps only the active ones.

    Args:
      x: the ReLU's input, floating point, of any shape with at least one axis.

    Returns:
      The diagonal BCOO matrix (x.size, x.size), entry i = 1 where x_i > 0, else 0.

    Raises:
      ValueError: ``x`` is not floating point or is a scalar.
    """
    x = _float_array("x", x)
    if x.ndim < 1:
        raise ValueError(f"x must have at least one axis; got shape {x.shape}")
    n = x.size
    i = np.arange(n)
    return _bcoo((x.reshape(-1) > 0).astype(x.dtype), i, i, (n, n), sorted_=True)


def maxpool2d_transposed_jacobian(x: jax.Array, window: int = 2) -> jsparse.BCOO:
    """Jᵀ of non-overlapping max-pooling (window × window, stride = window) of x.

    The result is BCOO (x.size, x.size / window²) with one 1 per output: at the window's maximum,
    the first one in row-major window order on ties (the element ``lax.reduce_window``'s gradient
    picks).

    Args:
      x: (C, H, W) or (B, C, H, W) the pooling's input, floating point, H and W multiples of ``window``.
      window: the window's side and stride.

    Returns:
      The BCOO matrix (x.size, x.size / window²), with one 1 per column.

    Raises:
      ValueError: ``x`` is not floating point or not of rank 3 or 4, ``window`` is not a positive int, or it
      does not divide H and W.
    """
    x = _float_array("x", x)
    window = _positive_int("window", window)
    B, C, H, W = _image_shape("x", x.shape)
    if H % window or W % window:
        raise ValueError(f"window {window} must divide the spatial size of x; got x shape {x.shape}")
    Ho, Wo = H // window, W // window
    N = B * C
    win = x.reshape(N, Ho, window, Wo, window).transpose(0, 1, 3, 2, 4).reshape(N, Ho, Wo, window * window)
    k = jnp.argmax(win, axis=-1)  # (N, Ho, Wo), first occurrence
    n, oh, ow = np.meshgrid(np.arange(N), np.arange(Ho), np.arange(Wo), indexing="ij")
    rows = n * (H * W) + (oh * window + k // window) * W + ow * window + k % window
    cols = (n * (Ho * Wo) + oh * Wo + ow).reshape(-1)
    indices = jnp.stack([rows.reshape(-1).astype(jnp.int32), jnp.asarray(cols, jnp.int32)], axis=-1)
    return jsparse.BCOO((jnp.ones(cols.size, x.dtype), indices), shape=(N * H * W, N * Ho * Wo),
                        unique_indices=True)


def linear_transposed_jacobian(W: jax.Array, in_shape: Sequence[int] | None = None) -> jsparse.BCOO:
    """Jᵀ of y = W x (+ b): Wᵀ, shape (in, out). W: (out, in).

    Every weight is stored (static pattern); ``prune_zeros`` drops pruned ones.

    Args:
      W: (out, in) the weight, floating point.
      in_shape: None or (in,) for one sample, (B, in) for the block-diagonal batch Jacobian.

    Returns:
      The BCOO matrix (B·in, B·out), B copies of Wᵀ on the diagonal (B = 1 for one sample).

    Raises:
      ValueError: ``W`` is not a floating-point matrix, or ``in_shape`` does not fit it.
    """
    W = _float_array("W", W)
    if W.ndim != 2:
        raise ValueError(f"W must have shape (out, in); got shape {W.shape}")
    O, I = W.shape
    in_shape = (I,) if in_shape is None else tuple(int(s) for s in in_shape)
    if len(in_shape) not in (1, 2) or in_shape[-1] != I:
        raise ValueError(f"in_shape must be ({I},) or (B, {I}) for W of shape {W.shape}; got {in_shape}")
    B = 1 if len(in_shape) == 1 else in_shape[0]
    b, i, o = np.meshgrid(np.arange(B), np.arange(I), np.arange(O), indexing="ij")
    data = jnp.broadcast_to(W.T[None], (B, I, O)).reshape(-1)
    return _bcoo(data, (b * I + i).reshape(-1), (b * O + o).reshape(-1), (B * I, B * O), sorted_=True)


def flatten_transposed_jacobian(in_shape: Sequence[int], dtype: Any = jnp.float32) -> jsparse.BCOO:
    """Jᵀ of flattening (C, H, W) -> C·H·W (row-major, so the identity), shape (size, size).

    Args:
      in_shape: the input's shape, e.g. (C, H, W) or (B, C, H, W).
      dtype: the entries' dtype.

    Returns:
      The identity as a BCOO matrix (size, size), size = prod(in_shape).

    Raises:
      ValueError: ``in_shape`` is empty or has a size < 1.
    """
    in_shape = tuple(int(s) for s in in_shape)
    if len(in_shape) < 1 or min(in_shape) < 1:
        raise ValueError(f"in_shape must be a non-empty shape of positive sizes; got {in_shape}")
    n = math.prod(in_shape)
    i = np.arange(n)
    return _bcoo(jnp.ones(n, dtype), i, i, (n, n), sorted_=True)


def block_diag(J: jsparse.BCOO, B: int) -> jsparse.BCOO:
    """The (B·m, B·n) block-diagonal matrix with B copies of the (m, n) BCOO ``J``.

    Args:
      J: (m, n) a 2-D BCOO matrix.
      B: the number of copies.

    Returns:
      The BCOO matrix (B·m, B·n), copy b at rows b·m … and columns b·n ….

    Raises:
      ValueError: ``B`` is not a positive int.
    """
    B = _positive_int("B", B)
    m, n = J.shape
    idx = np.asarray(J.indices)
    off = np.arange(B)[:, None]
    rows = (idx[None, :, 0] + off * m).reshape(-1)
    cols = (idx[None, :, 1] + off * n).reshape(-1)
    return _bcoo(jnp.tile(J.data, B), rows, cols, (B * m, B * n))


def prune_zeros(J: jsparse.BCOO) -> jsparse.BCOO:
    """Drop stored zeros of a 2-D BCOO (eager: the result's size depends on the values).

    Args:
      J: a 2-D BCOO matrix.

    Returns:
      The same matrix (same shape) storing only its non-zero entries.
    """
    data = np.asarray(J.data)
    keep = data != 0
    return jsparse.BCOO((jnp.asarray(data[keep]), jnp.asarray(np.asarray(J.indices)[keep])), shape=J.shape,
                        indices_sorted=J.indices_sorted, unique_indices=J.unique_indices)


# --------------------------------------------------------------------------------------------
# Sparse products (eager: output sizes depend on the sparsity patterns).
# --------------------------------------------------------------------------------------------
# Index and value arithmetic run in numpy on the host: every product has a new, data-dependent
# number of stored entries, and jnp ops would compile once per distinct size.

def _coo(J):
    if not isinstance(J, jsparse.BCOO) or J.n_batch or J.n_dense or J.ndim != 2:
        raise ValueError(f"expected a 2-D BCOO matrix without batch or dense axes; got {type(J).__name__} "
                         f"of shape {getattr(J, 'shape', None)}")
    idx = np.asarray(J.indices).astype(np.int64)
    return idx[:, 0], idx[:, 1]


def spgemm(A: jsparse.BCOO, B: jsparse.BCOO) -> jsparse.BCOO:
    """C = A @ B for 2-D BCOO A (m, k) and B (k, n), Gustavson style, summing duplicates.

    Every stored a_il meets the stored entries of row l of B (np.repeat over B's row
    pointers); np.unique merges equal (i, j) and a weighted bincount sums their products.
    Returns a BCOO with sorted unique indices; runs eagerly.

    Args:
      A: (m, k) a 2-D BCOO matrix.
      B: (k, n) a 2-D BCOO matrix.

    Returns:
      C (m, n) as a BCOO matrix with sorted unique indices.

    Raises:
      ValueError: an argument that is not a 2-D BCOO without batch or dense axes, or inner sizes that differ.
    """
    ia, la = _coo(A)
    lb, jb = _coo(B)
    m, k = A.shape
    k2, n = B.shape
    if k != k2:
        raise ValueError(f"spgemm: inner sizes differ: A shape {A.shape}, B shape {B.shape}")
    order = np.argsort(lb, kind="stable")
    row_ptr = np.concatenate([[0], np.cumsum(np.bincount(lb, minlength=k))])
    cnt = row_ptr[la + 1] - row_ptr[la]  # partners of each stored a_il
    total = int(cnt.sum())
    a_pos = np.repeat(np.arange(la.size), cnt)
    offs = np.arange(total) - np.repeat(np.cumsum(cnt) - cnt, cnt)
    b_pos = order[np.repeat(row_ptr[la], cnt) + offs]
    keys, inv = np.unique(ia[a_pos] * n + jb[b_pos], return_inverse=True)
    dtype = jnp.result_type(A.data.dtype, B.data.dtype)
    vals = np.bincount(inv.reshape(-1), weights=np.asarray(A.data)[a_pos] * np.asarray(B.data)[b_pos],
                       minlength=keys.size).astype(dtype)
    return _bcoo(jnp.asarray(vals), keys // n, keys % n, (m, n), sorted_=True)


def spmv(A: jsparse.BCOO, x: jax.Array) -> jax.Array:
    """A @ x for a 2-D BCOO A (m, n) and a dense vector x (n,); eager, like :func:`spgemm`.

    Args:
      A: (m, n) a 2-D BCOO matrix.
      x: (n,) a dense vector.

    Returns:
      (m,) the dense product, in the promoted dtype of A and x.

    Raises:
      ValueError: ``x`` is not of shape (n,), or ``A`` is not a 2-D BCOO without batch or dense axes.
    """
    if x.shape != (A.shape[1],):
        raise ValueError(f"spmv: x must have shape ({A.shape[1]},) for A of shape {A.shape}; got {x.shape}")
    rows, cols = _coo(A)
    dtype = jnp.result_type(A.data.dtype, x.dtype)
    y = np.bincount(rows, weights=np.asarray(A.data) * np.asarray(x)[cols], minlength=A.shape[0])
    return jnp.asarray(y.astype(dtype))


def spgemm_flops(A: jsparse.BCOO, B: jsparse.BCOO) -> int:
    """Floating-point operations of A @ B with sparse products: 2 per pair a_il·b_lj.

    Args:
      A: (m, k) a 2-D BCOO matrix.
      B: (k, n) a 2-D BCOO matrix.

    Returns:
      The FLOP count, an int (stored entries count, zeros included).
    """
    _, la = _coo(A)
    lb, _ = _coo(B)
    k = A.shape[1]
    return 2 * int(np.dot(np.bincount(la, minlength=k), np.bincount(lb, minlength=k)))


# --------------------------------------------------------------------------------------------
# BPPSA over a chain: the modified Blelloch scan with a vector root, sparse matrices, and L_m.
# --------------------------------------------------------------------------------------------
#
# Scan order (latest layer first): [v, A_1, ..., A_n] with v = g_n = ∂L/∂h_n and A_k = J_{n-k+1}ᵀ.
# A block's value is the map x -> A_b ⋯ A_a x, i.e. the matrix A_b ⋯ A_a ("later" on the left);
# block 0 holds a vector. ``matmat(later, earlier)`` and ``matvec(M, x)`` are the two products,
# sparse by default; the FLOP analysis passes pattern-only versions of the same two.

def scan_depth(n: int) -> int:
    """Levels of the full up-sweep for n matrices: ⌈log₂(n + 1)⌉.

    Args:
      n: the number of matrices in the chain.

    Returns:
      ⌈log₂(n + 1)⌉ (0 for n = 0).
    """
    return math.ceil(math.log2(n + 1)) if n > 0 else 0


def products(matmat: Callable = spgemm, matvec: Callable = spmv) -> scan_lib.Products:
    """The sweep's products over Python lists of matrices (:class:`bppsa.scan.Products`), from
    ``matmat(later, earlier)`` and ``matvec(M, x)`` (column convention: A_k acts on the left).

    Args:
      matmat: ``matmat(later, earlier)`` -> later @ earlier (default :func:`spgemm`).
      matvec: ``matvec(M, x)`` -> M @ x (default :func:`spmv`).

    Returns:
      The :class:`bppsa.scan.Products` the sweeps of :func:`chain_scan` use.
    """
    return scan_lib.Products(
        compose=lambda L, R: [matmat(r, l) for l, r in zip(L, R)],
        push=lambda x, M: matvec(M, x),
        push_all=lambda X, Ms: [matvec(M, x) for x, M in zip(X, Ms)],
        concat=lambda parts: [x for part in parts for x in part],
        interleave=lambda a, b: [x for pair in zip(a, b) for x in pair],
        one=lambda v: [v])


def sequential_middle(vec: Any, Ms: Sequence[Any], *, matvec: Callable = spmv) -> tuple[list, Any]:
    """Sequential exclusive scan of the blocks left at the top: prefix of block j ≥ 1, and the total.

    Block 1's prefix is ``vec`` (block 0's value); block j + 1's is M_j applied to block j's.

    Args:
      vec: block 0's value, a vector.
      Ms: the matrices of blocks 1, 2, …, in scan order.
      matvec: ``matvec(M, x)`` -> M @ x (default :func:`spmv`).

    Returns:
      The pair (incoming, total): the list of the prefixes of blocks 1 … len(Ms), and the product of
      every block applied to ``vec``.
    """
    incoming = []
    x = vec
    for M in Ms:
        incoming.append(x)
        x = matvec(M, x)
    return incoming, x


def chain_scan(v: Any, As: Sequence, levels: int | None = None, *, matmat: Callable = spgemm,
               matvec: Callable = spmv) -> tuple[list, Any]:
    """BPPSA over a chain: all exclusive prefixes of [v, A_1, …, A_n] and the total.

    Args:
      v: (S_n,) the root vector ∂L/∂h_n.
      As: n matrices in scan order, A_k of shape (S_{n-k}, S_{n-k+1}) — layer n − k + 1's transposed
        Jacobian.
      levels: the paper's L_m: L_m levels of up-sweep and down-sweep, the top blocks scanned
        sequentially (0: plain back-propagation; None or ≥ ⌈log₂(n + 1)⌉: the full modified Blelloch scan).
      matmat: ``matmat(later, earlier)`` -> later @ earlier (default :func:`spgemm`).
      matvec: ``matvec(M, x)`` -> M @ x (default :func:`spmv`).

    Returns:
      ``(prefixes, total)``: prefixes[k] = A_k ⋯ A_1 v = g_{n-k} (k = 0 … n − 1), each (S_{n-k},);
      total = g_0 (S_0,).

    Raises:
      ValueError: ``levels`` is not an int >= 0, ``As`` is empty, or a matrix's columns do not match the
      previous element's size.
    """
    if levels is not None:
        levels = _positive_int("levels (L_m)", levels, minimum=0)
    if not As:
        raise ValueError("chain_scan needs at least one matrix; got an empty As")
    for k, A in enumerate(As):
        want = v.shape[0] if k == 0 else As[k - 1].shape[0]
        if A.ndim != 2 or A.shape[1] != want:
            raise ValueError(f"As[{k}] must have shape (S, {want}) to follow the previous element; "
                             f"got shape {A.shape}")
    pr = products(matmat, matvec)
    tree = scan_lib.up_sweep(v, list(As), products=pr, levels=levels)  # :func:`bppsa.scan.up_sweep`
    incoming, total = sequential_middle(*tree[-1][:2], matvec=matvec)
    return scan_lib.down_sweep(tree, incoming, products=pr), total


# --------------------------------------------------------------------------------------------
# Parameter gradients from the per-layer output gradients.
# --------------------------------------------------------------------------------------------

def conv2d_weight_grad(x: jax.Array, g: jax.Array, w_shape: Sequence[int], stride: int = 1,
                       padding: int = 1) -> tuple[jax.Array, jax.Array]:
    """∂L/∂w and ∂L/∂b of y = conv2d(x, w) + b from g = ∂L/∂y.

    ∂L/∂w[co, ci, a, c] = Σ_{b, oh, ow} g[b, co, oh, ow] · x_pad[b, ci, oh·s + a, ow·s + c]: one
    patch extraction and one contraction. ∂L/∂b = Σ_{b, oh, ow} g.

    Args:
      x: (B, C_in, H, W) the convolution's input.
      g: (B, C_out, H_out, W_out) ∂L/∂y.
      w_shape: (C_out, C_in, kh, kw), the kernel's shape.
      stride: the stride of both spatial axes.
      padding: the zero padding on each side of both spatial axes.

    Returns:
      The pair (dw (C_out, C_in, kh, kw), db (C_out,)).
    """
    C_out, C_in, kh, kw = w_shape
    patches = jax.lax.conv_general_dilated_patches(
        x, (kh, kw), (stride, stride), [(padding, padding)] * 2)  # (B, C_in·kh·kw, Ho, Wo)
    dw = jnp.einsum("bkhw,bohw->ok", patches, g, precision="highest").reshape(C_out, C_in, kh, kw)
    return dw, g.sum(axis=(0, 2, 3))


def linear_weight_grad(x: jax.Array, g: jax.Array) -> tuple[jax.Array, jax.Array]:
    """∂L/∂W (out, in) and ∂L/∂b (out,) of y = x Wᵀ + b from x (B, in) and g = ∂L/∂y (B, out).

    Args:
      x: (B, in) the layer's input.
      g: (B, out) ∂L/∂y.

    Returns:
      The pair (dW (out, in), db (out,)).
    """
    return jnp.einsum("bo,bi->oi", g, x, precision="highest"), g.sum(axis=0)
