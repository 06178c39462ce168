"""VGG-style feed-forward chains with a BPPSA backward pass over sparse transposed Jacobians.

A network is a tuple of :class:`Layer` specs plus a list of parameters (one entry per layer,
``{}`` for parameter-free layers); activations are NCHW. ``bppsa_value_and_grad`` runs the
forward pass, generates every layer's transposed Jacobian analytically
(:mod:`bppsa.sparse`), solves the backward recurrence g_{i-1} = J_iᵀ g_i with the sparse
modified Blelloch scan (hybrid knob L_m) and contracts the per-layer output gradients into
weight gradients. It equals ``jax.value_and_grad`` of :func:`loss` (tests check float64).

Also here: VGG-11 for 32×32 inputs, per-layer magnitude pruning, and the BP-vs-BPPSA FLOP
analysis with sparse products (the paper's Fig. 10: total work and the critical path).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from bppsa import scan as scan_lib
from bppsa.sparse import jacobians as sparse

__all__ = ["Layer", "VGG11", "make_vgg", "forward", "loss", "transposed_jacobians",
           "bppsa_value_and_grad", "magnitude_prune", "apply_masks", "flop_analysis"]

# VGG-11 (configuration "A"): channel counts, "M" = 2×2 max-pooling.
VGG11 = (64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M")


@dataclasses.dataclass(frozen=True)
class Layer:
    """One layer of a chain: kind in {"conv", "relu", "maxpool", "flatten", "linear"}.

    Attributes:
      kind: "conv" (params {"w": (C_out, C_in, kh, kw), "b": (C_out,)}), "relu", "maxpool", "flatten" or
        "linear" (params {"w": (out, in), "b": (out,)}).
      stride: the convolution's stride.
      padding: the convolution's zero padding on each side.
      window: the max-pooling's window side and stride.

    Raises:
      ValueError: on construction, an unknown ``kind``.
    """
    kind: str
    stride: int = 1
    padding: int = 1
    window: int = 2

    def __post_init__(self):
        if self.kind not in ("conv", "relu", "maxpool", "flatten", "linear"):
            raise ValueError(f"Layer kind must be conv, relu, maxpool, flatten or linear; got {self.kind!r}")


def make_vgg(key: jax.Array, cfg: Sequence[Any] = VGG11, in_shape: Sequence[int] = (3, 32, 32),
             hidden: Sequence[int] = (), num_classes: int = 10, kernel: int = 3,
             dtype: Any = jnp.float32) -> tuple[tuple[Layer, ...], list[dict]]:
    """Layers and He-initialised parameters of a VGG-style network.

    Every conv is kernel×kernel, stride 1, padding kernel // 2, followed by a ReLU. Then flatten,
    ``hidden`` linear+ReLU layers and a linear classifier.

    Args:
      key: the ``jax.random`` key of the weights.
      cfg: channel counts and "M" (max-pool) as in :data:`VGG11`.
      in_shape: (C, H, W), one sample's input shape.
      hidden: the widths of the hidden linear layers.
      num_classes: the classifier's width.
      kernel: the convolutions' kernel side.
      dtype: the parameters' dtype.

    Returns:
      ``(layers, params)``: the tuple of :class:`Layer` and the list of their parameters ({} for a layer
      without).

    Raises:
      ValueError: an "M" at an odd spatial size.
    """
    C, H, W = in_shape
    layers, params = [], []
    for item in cfg:
        key, sub = jax.random.split(key)
        if item == "M":
            if H % 2 or W % 2:
                raise ValueError(f"max-pooling needs even spatial sizes; got {(H, W)} before an 'M' in cfg {cfg}")
            layers.append(Layer("maxpool"))
            params.append({})
            H, W = H // 2, W // 2
        else:
            fan_in = C * kernel * kernel
            w = jax.random.normal(sub, (item, C, kernel, kernel), dtype) * float(np.sqrt(2.0 / fan_in))
            layers += [Layer("conv", padding=kernel // 2), Layer("relu")]
            params += [{"w": w, "b": jnp.zeros(item, dtype)}, {}]
            C = item
    layers.append(Layer("flatten"))
    params.append({})
    n = C * H * W
    for i, out in enumerate(tuple(hidden) + (num_classes,)):
        key, sub = jax.random.split(key)
        w = jax.random.normal(sub, (out, n), dtype) * float(np.sqrt(2.0 / n))
        layers.append(Layer("linear"))
        params.append({"w": w, "b": jnp.zeros(out, dtype)})
        if i < len(hidden):
            layers.append(Layer("relu"))
            params.append({})
        n = out
    return tuple(layers), params


def _apply(layer, p, x):
    if layer.kind == "conv":
        y = lax.conv_general_dilated(x, p["w"], (layer.stride,) * 2, [(layer.padding,) * 2] * 2,
                                     dimension_numbers=("NCHW", "OIHW", "NCHW"), precision="highest")
        return y + p["b"][:, None, None]
    if layer.kind == "relu":
        return jax.nn.relu(x)
    if layer.kind == "maxpool":
        k = layer.window
        return lax.reduce_window(x, -jnp.inf, lax.max, (1, 1, k, k), (1, 1, k, k), "VALID")
    if layer.kind == "flatten":
        return x.reshape(x.shape[0], -1)
    return jnp.dot(x, p["w"].T, precision="highest") + p["b"]


def forward(layers: Sequence[Layer], params: Sequence[dict], x: jax.Array) -> list[jax.Array]:
    """All activations [h_0 = x, h_1, ..., h_n]; x: (B, C, H, W), h_n: (B, num_classes).

    Args:
      layers: the chain's :class:`Layer` specs.
      params: one dict per layer ({} for a parameter-free layer).
      x: (B, C, H, W) the inputs.

    Returns:
      The list [h_0, …, h_n] of n + 1 activations, h_n (B, num_classes) the logits.
    """
    hs = [x]
    for layer, p in zip(layers, params):
        hs.append(_apply(layer, p, hs[-1]))
    return hs


def loss(layers: Sequence[Layer], params: Sequence[dict], x: jax.Array, y: jax.Array) -> jax.Array:
    """Mean softmax cross-entropy of the logits h_n against integer labels y: (B,).

    Args:
      layers: the chain's :class:`Layer` specs.
      params: one dict per layer.
      x: (B, C, H, W) the inputs.
      y: (B,) integer labels.

    Returns:
      The scalar loss.
    """
    logits = forward(layers, params, x)[-1]
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), y[:, None], axis=1))


_conv_tj = jax.jit(sparse.conv2d_transposed_jacobian, static_argnums=(1, 2, 3))
_relu_tj = jax.jit(sparse.relu_transposed_jacobian)
_maxpool_tj = jax.jit(sparse.maxpool2d_transposed_jacobian, static_argnums=(1,))
_linear_tj = jax.jit(sparse.linear_transposed_jacobian, static_argnums=(1,))


def transposed_jacobians(layers: Sequence[Layer], params: Sequence[dict], hs: Sequence[jax.Array],
                         drop_zeros: bool = True) -> list:
    r"""[J_1ᵀ, …, J_nᵀ] of the whole batch (block-diagonal over samples), analytic and sparse.

    :math:`J_i^\top` has shape :math:`(|h_{i-1}|, |h_i|)` with activations flattened row-major over (B, C, H, W).

    Args:
      layers: the chain's :class:`Layer` specs.
      params: one dict per layer.
      hs: the activations [h_0, …, h_n] (:func:`forward`); h_n is not read.
      drop_zeros: remove stored zeros (pruned weights, inactive ReLUs).

    Returns:
      The list of n BCOO matrices, layer order.
    """
    Js = []
    for layer, p, h in zip(layers, params, hs[:-1]):
        if layer.kind == "conv":
            J = _conv_tj(p["w"], h.shape, layer.stride, layer.padding)
        elif layer.kind == "relu":
            J = _relu_tj(h)
        elif layer.kind == "maxpool":
            J = _maxpool_tj(h, layer.window)
        elif layer.kind == "flatten":
            J = sparse.flatten_transposed_jacobian(h.shape, h.dtype)
        else:
            J = _linear_tj(p["w"], h.shape)
        Js.append(sparse.prune_zeros(J) if drop_zeros else J)
    return Js


def bppsa_value_and_grad(layers: Sequence[Layer], params: Sequence[dict], x: jax.Array, y: jax.Array,
                         levels: int | None = None) -> tuple[jax.Array, list[dict], jax.Array]:
    """Loss and parameter gradients with the BPPSA backward pass (sparse chain scan).

    Args:
      layers: the chain's :class:`Layer` specs.
      params: one dict per layer.
      x: (B, C, H, W) the inputs.
      y: (B,) integer labels.
      levels: the hybrid knob L_m (None: full Blelloch scan, 0: sequential back-propagation).

    Returns:
      ``(loss, grads, dx)``: the scalar loss of :func:`loss`, grads mirroring params, dx = ∂L/∂x (B, C, H, W).
    """
    hs = forward(layers, params, x)
    logits = hs[-1]
    B = logits.shape[0]
    logp = jax.nn.log_softmax(logits)
    value = -jnp.mean(jnp.take_along_axis(logp, y[:, None], axis=1))
    g_n = (jnp.exp(logp) - jax.nn.one_hot(y, logits.shape[1], dtype=logits.dtype)) / B  # ∂L/∂h_n
    Js = transposed_jacobians(layers, params, hs)
    prefixes, total = sparse.chain_scan(g_n.reshape(-1), Js[::-1], levels)
    gs = [total] + prefixes[::-1]  # gs[i] = ∂L/∂h_i flattened, i = 0 .. n
    grads = []
    for i, (layer, p) in enumerate(zip(layers, params), start=1):
        g_out = gs[i].reshape(hs[i].shape)
        if layer.kind == "conv":
            dw, db = sparse.conv2d_weight_grad(hs[i - 1], g_out, p["w"].shape, layer.stride, layer.padding)
            grads.append({"w": dw, "b": db})
        elif layer.kind == "linear":
            dw, db = sparse.linear_weight_grad(hs[i - 1], g_out)
            grads.append({"w": dw, "b": db})
        else:
            grads.append({})
    return value, grads, total.reshape(x.shape)


def magnitude_prune(params: Sequence[dict], sparsity: float) -> tuple[list[dict], list[dict]]:
    """Zero the fraction ``sparsity`` of smallest-magnitude weights in each conv/linear layer.

    Biases are kept.

    Args:
      params: one dict per layer (:func:`make_vgg`'s).
      sparsity: the fraction of each weight's entries to zero, in [0, 1).

    Returns:
      ``(pruned_params, masks)``; masks mirror params (1 = kept; biases all 1).

    Raises:
      ValueError: ``sparsity`` is not in [0, 1).
    """
    if not 0.0 <= sparsity < 1.0:
        raise ValueError(f"sparsity must be in [0, 1); got {sparsity}")
    pruned, masks = [], []
    for p in params:
        if "w" not in p:
            pruned.append({})
            masks.append({})
            continue
        a = np.abs(np.asarray(p["w"])).reshape(-1)
        k = int(round(sparsity * a.size))
        keep = np.ones(a.size, bool)
        keep[np.argsort(a, kind="stable")[:k]] = False
        m = jnp.asarray(keep.reshape(p["w"].shape), p["w"].dtype)
        masks.append({"w": m, "b": jnp.ones_like(p["b"])})
        pruned.append({"w": p["w"] * m, "b": p["b"]})
    return pruned, masks


def apply_masks(tree: Any, masks: Any) -> Any:
    """Multiply every leaf of ``tree`` (params or grads) by its mask.

    Args:
      tree: params or grads, one dict per layer.
      masks: :func:`magnitude_prune`'s masks, the same structure.

    Returns:
      ``tree`` with every leaf multiplied by its mask.
    """
    return jax.tree.map(lambda a, m: a * m, tree, masks)


# --------------------------------------------------------------------------------------------
# FLOP analysis (the paper's Fig. 10): BP vs BPPSA with sparse products, total and critical path.
# --------------------------------------------------------------------------------------------

def _pattern(J):
    """A BCOO's sparsity pattern as a scipy CSR matrix of ones (float64 path counts)."""
    import scipy.sparse as sp
    idx = np.asarray(J.indices)
    return sp.csr_matrix((np.ones(idx.shape[0]), (idx[:, 0], idx[:, 1])), shape=J.shape)


def flop_analysis(Js: Sequence[Any], levels: int | None = None) -> dict:
    """FLOPs of the backward pass over [J_1ᵀ, …, J_nᵀ] (layer order, BCOO) for BP and BPPSA.

    BP: n dependent SpMVs, 2·nnz(J_iᵀ) FLOPs each (total = critical path). BPPSA with L_m =
    ``levels``: per up-sweep level one SpMV (block 0) and SpGEMMs (2 FLOPs per pair a_il·b_lj),
    then the sequential middle, then per down-sweep level SpMVs; levels run their products in
    parallel, so the critical path adds each level's largest product. Patterns only (scipy).

    Args:
      Js: [J_1ᵀ, …, J_nᵀ] in layer order, 2-D BCOO matrices (:func:`transposed_jacobians`).
      levels: L_m (None: the full Blelloch scan; capped at :func:`bppsa.sparse.jacobians.scan_depth`).

    Returns:
      A dict of FLOP counts and per-level records: "n", "levels" (the depth used), "bp_flops",
      "bp_critical", "bppsa_flops", "bppsa_critical", "jacobian_nnz" and "jacobian_shape" (per matrix,
      layer order), "records" (per phase and level: "phase", "level", "ops", "flops", "critical", "nnz").
    """
    As = [_pattern(J) for J in Js[::-1]]
    bp = [2 * A.nnz for A in As]
    cost = []

    def matmat(later, earlier):
        cost.append(2 * int(np.dot(np.diff(later.tocsc().indptr), np.diff(earlier.indptr))))
        return (later @ earlier).tocsr()

    def matvec(M, x):
        cost.append(2 * M.nnz)
        return None  # the vector's values do not matter for the count

    n = len(As)
    depth = sparse.scan_depth(n) if levels is None else min(levels, sparse.scan_depth(n))
    records = []
    products = sparse.products(matmat, matvec)
    tree = [(None, As, None)]
    for lvl in range(depth):
        cost.clear()
        tree.append(scan_lib.up_sweep(*tree[-1], products=products, levels=1)[-1])
        records.append({"phase": "up", "level": lvl + 1, "ops": len(cost), "flops": sum(cost),
                        "critical": max(cost), "nnz": int(sum(M.nnz for M in tree[-1][1]))})
    cost.clear()
    incoming, _ = sparse.sequential_middle(*tree[-1][:2], matvec=matvec)
    records.append({"phase": "middle", "level": depth, "ops": len(cost), "flops": sum(cost),
                    "critical": sum(cost), "nnz": 0})
    for lvl in range(depth, 0, -1):
        cost.clear()
        incoming = scan_lib.down_sweep(tree[lvl - 1:lvl + 1], incoming, products=products)
        records.append({"phase": "down", "level": lvl, "ops": len(cost), "flops": sum(cost),
                        "critical": max(cost, default=0), "nnz": 0})
    return {
        "n": n, "levels": depth,
        "bp_flops": int(sum(bp)), "bp_critical": int(sum(bp)),
        "bppsa_flops": int(sum(r["flops"] for r in records)),
        "bppsa_critical": int(sum(r["critical"] for r in records)),
        "jacobian_nnz": [int(A.nnz) for A in As[::-1]],
        "jacobian_shape": [list(J.shape) for J in Js],
        "records": records,
    }
