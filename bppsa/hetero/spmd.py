"""The SPMD form of weighted gradient averaging.

Every replica holds a padded batch of the largest size b_max with a mask, computes the gradient
of its masked *sum* of per-sample losses, and one ``psum`` of (gradient sum, sample count) over
the data axis gives the exact global mean: g = psum(Σ_{samples on i} ∇ℓ) / psum(b_i). Replicas
with zero samples contribute zeros. The same function runs on a mesh of local devices
(``shard_map``) and on a mesh spanning processes (``jax.distributed``), where each process feeds
its own local batch through :func:`global_batch`.

A per-sample loss has the signature ``loss_fn(params, x, y) -> (b,)`` for x: (b, ...), y: (b,).
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

# replication checks off: gradients taken inside are per-replica (no implicit psum of the cotangent
# of a replicated input); the explicit psums make the outputs replicated
from bppsa.parallel.mesh import shard_map

__all__ = ["AVERAGES", "data_mesh", "replica_batches", "pad_local_batch",
           "local_grad_sum", "make_spmd_grad", "global_batch", "make_allreduce"]

AVERAGES = ("weighted", "mean")


def data_mesh(num_replicas: int | None = None, axis: str = "data", devices=None) -> Mesh:
    """A 1-D mesh over the first ``num_replicas`` devices (all of ``jax.devices()`` by default).

    Args:
      num_replicas: how many devices, 1 to the number available; None: all of them.
      axis: the mesh axis's name.
      devices: the devices to take them from, in order (None: ``jax.devices()``).

    Returns:
      A ``jax.sharding.Mesh`` of shape (num_replicas,) with the one axis ``axis``.

    Raises:
      ValueError: when num_replicas is not in 1 to the number of devices.
    """
    devs = list(jax.devices() if devices is None else devices)
    n = len(devs) if num_replicas is None else num_replicas
    if not 1 <= n <= len(devs):
        raise ValueError(f"num_replicas must be in 1..{len(devs)} (the available devices); got {n}")
    return Mesh(np.array(devs[:n]), (axis,))


def _check_counts(counts) -> np.ndarray:
    c = np.asarray(counts)
    if c.ndim != 1 or c.size == 0 or not np.issubdtype(c.dtype, np.integer) or (c < 0).any():
        raise ValueError(f"counts must be a non-empty 1-D sequence of ints >= 0; got {counts!r}")
    return c.astype(np.int64)


def pad_local_batch(x, y, size: int):
    """Pad one replica's batch to ``size`` rows (zeros after its b rows).

    Args:
      x: (b, ...) the replica's inputs.
      y: (b,) its labels.
      size: the padded number of rows (>= b).

    Returns:
      numpy arrays (x (size, ...), y (size,), mask (size,) bool), mask True on the first b rows.

    Raises:
      ValueError: when x and y differ in length, or b > size.
    """
    x, y = np.asarray(x), np.asarray(y)
    b = len(x)
    if len(y) != b:
        raise ValueError(f"x and y must have the same length; got {b} and {len(y)}")
    if b > size:
        raise ValueError(f"size must be >= the local batch size {b}; got {size}")
    xp = np.zeros((size,) + x.shape[1:], x.dtype)
    yp = np.zeros((size,) + y.shape[1:], y.dtype)
    xp[:b], yp[:b] = x, y
    mask = np.zeros(size, bool)
    mask[:b] = True
    return xp, yp, mask


def replica_batches(x, y, counts, b_max: int | None = None):
    """Cut a global batch into consecutive replica batches of sizes ``counts``, each padded.

    Args:
      x: (B, ...) the global batch's inputs (numpy).
      y: (B,) its labels.
      counts: (P,) ints >= 0, the replica batch sizes b_i, with Σ counts = B.
      b_max: the rows per replica (>= max(counts)); None: max(max(counts), 1). A fixed b_max keeps
        shapes, and so compiled code, constant across partitions.

    Returns:
      numpy arrays (x (P·b_max, ...), y (P·b_max,), mask (P·b_max,) bool); rows
      [i·b_max, i·b_max + b_i) belong to replica i, and mask is True on those.

    Raises:
      ValueError: for counts that are not a non-empty 1-D sequence of ints >= 0 or do not sum to B,
      and for a b_max below the largest count.
    """
    c = _check_counts(counts)
    if c.sum() != len(x):
        raise ValueError(f"counts must sum to the batch size {len(x)}; got {c.tolist()} (sum {c.sum()})")
    if b_max is None:
        b_max = max(int(c.max()), 1)
    elif b_max < max(int(c.max()), 1):
        raise ValueError(f"b_max must be >= the largest replica batch {int(c.max())}; got {b_max}")
    edges = np.concatenate([[0], np.cumsum(c)])
    parts = [pad_local_batch(x[edges[i]:edges[i + 1]], y[edges[i]:edges[i + 1]], b_max) for i in range(c.size)]
    return tuple(np.concatenate(p) for p in zip(*parts))


def local_grad_sum(loss_fn: Callable, params, x, y, mask):
    """(∇ Σ_j mask_j·ℓ_j, Σ_j mask_j·ℓ_j, Σ_j mask_j) for one replica's padded batch.

    Args:
      loss_fn: the per-sample loss, ``loss_fn(params, x, y) -> (b,)``.
      params: the parameter pytree.
      x: (b, ...) the padded inputs.
      y: (b,) the padded labels.
      mask: (b,) bool, True on the real rows.

    Returns:
      The triple (grads, loss_sum, count), grads the gradient of the masked loss sum (a pytree like
      params), loss_sum that sum (a scalar) and count the number of real rows (a scalar in the
      dtype of params' first leaf).
    """
    dtype = jax.tree.leaves(params)[0].dtype

    def masked_sum(p):
        return jnp.sum(jnp.where(mask, loss_fn(p, x, y), 0.0))

    loss_sum, g = jax.value_and_grad(masked_sum)(params)
    return g, loss_sum, jnp.sum(mask).astype(dtype)


def _safe_div(a, n):
    return jax.tree.map(lambda t: t / jnp.maximum(n, 1).astype(t.dtype), a)


def make_spmd_grad(loss_fn: Callable, mesh: Mesh, *, average: str = "weighted", axis: str | None = None):
    """A jitted ``grad_fn(params, x, y, mask) -> (grads, mean_loss, count)`` over ``mesh``.

    x, y, mask: the padded global batch (P·b_max leading rows, see :func:`replica_batches` or
    :func:`global_batch`), split over the mesh axis; params replicated.
    ``average="weighted"``: grads = psum(Σ∇ℓ)/psum(b_i), the full-batch mean gradient.
    ``average="mean"``: grads = (1/P')·Σ_i g_i, the plain average of the per-replica mean
    gradients over the P' replicas that hold samples (biased when the b_i differ).
    mean_loss is always the true mean over all samples; count = Σ b_i.

    Args:
      loss_fn: the per-sample loss, ``loss_fn(params, x, y) -> (b,)``.
      mesh: the data mesh (:func:`data_mesh`), one replica per device along ``axis``.
      average: "weighted" or "mean" (:data:`AVERAGES`; above).
      axis: the mesh axis the batch is split over (None: the mesh's first).

    Returns:
      The jitted ``grad_fn(params, x, y, mask) -> (grads, mean_loss, count)``, its outputs replicated
      (grads a pytree like params, mean_loss and count scalars).

    Raises:
      ValueError: for an unknown ``average``.
    """
    if average not in AVERAGES:
        raise ValueError(f"average must be one of {AVERAGES}; got {average!r}")
    axis = axis or mesh.axis_names[0]

    def per_replica(params, x, y, mask):
        g, loss_sum, n = local_grad_sum(loss_fn, params, x, y, mask)
        if average == "weighted":
            g, loss_sum, n = jax.lax.psum((g, loss_sum, n), axis)
            return _safe_div(g, n), loss_sum / jnp.maximum(n, 1), n
        g_i = _safe_div(g, n)
        g, k, loss_sum, n = jax.lax.psum((g_i, (n > 0).astype(n.dtype), loss_sum, n), axis)
        return jax.tree.map(lambda t: t / k, g), loss_sum / jnp.maximum(n, 1), n

    spec = P(axis)
    return jax.jit(shard_map(per_replica, mesh, in_specs=(P(), spec, spec, spec), out_specs=(P(), P(), P())))


def global_batch(mesh: Mesh, *local_arrays, axis: str | None = None):
    """Assemble global arrays split over the mesh axis from each process's local rows.

    Each process passes its own padded arrays (same shapes on every process, e.g. from
    :func:`pad_local_batch`); single-process, this is a plain sharded ``device_put``.

    Args:
      mesh: the data mesh.
      *local_arrays: this process's arrays, each (n, ...) with n the same on every process.
      axis: the mesh axis the rows are split over (None: the mesh's first).

    Returns:
      One global ``jax.Array`` per local array, (processes·n, ...) with the processes' rows in
      process order; a tuple, or the array itself when one was passed.
    """
    axis = axis or mesh.axis_names[0]
    sharding = NamedSharding(mesh, P(axis))
    out = tuple(jax.make_array_from_process_local_data(sharding, np.asarray(a)) for a in local_arrays)
    return out if len(out) != 1 else out[0]


def make_allreduce(mesh: Mesh, axis: str | None = None):
    """``allreduce(tree) -> tree``: sum a pytree over the processes of ``mesh`` (one device each).

    Each process passes its local values; every process gets the global sum as numpy arrays.
    This is the collective alone, for callers that time local compute separately.

    Args:
      mesh: the mesh over the processes (:func:`data_mesh` under ``jax.distributed``).
      axis: its axis (None: the mesh's first).

    Returns:
      The function ``allreduce(tree) -> tree``, which returns the sum over the processes of every
      leaf as a numpy array of the leaf's shape (float leaves keep their dtype; other leaves come
      back in the dtype all the leaves and float32 promote to). Every process must call it with a
      tree of the same structure and shapes.
    """
    axis = axis or mesh.axis_names[0]
    n_local = len(mesh.local_devices)

    @jax.jit
    def _sum(rows):
        return shard_map(lambda r: jax.lax.psum(r[0], axis), mesh, in_specs=(P(axis),), out_specs=P())(rows)

    def allreduce(tree):
        # one collective for the whole tree: flatten to one vector (the widest float dtype present)
        leaves, treedef = jax.tree.flatten(tree)
        leaves = [np.asarray(a) for a in leaves]
        dtype = np.result_type(*[a.dtype for a in leaves], np.float32)
        flat = np.concatenate([a.astype(dtype).ravel() for a in leaves])
        rows = np.zeros((n_local, flat.size), dtype)
        rows[0] = flat  # this process's values on its first device, zeros on any others
        out = np.asarray(_sum(jax.make_array_from_process_local_data(NamedSharding(mesh, P(axis)), rows))
                         .addressable_data(0))
        parts, at = [], 0
        for a in leaves:
            parts.append(out[at:at + a.size].reshape(a.shape).astype(a.dtype if a.dtype.kind == "f" else dtype))
            at += a.size
        return jax.tree.unflatten(treedef, parts)

    return allreduce
