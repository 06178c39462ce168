"""Meshes, ``shard_map`` with bppsa's setting, and multi-process start-up (``jax.distributed``).

A sequence-parallel mesh has a ``seq`` axis (the time axis is split over it) and optionally a
``data`` axis (the batch is split over it): ``make_mesh(seq=4, data=2)`` is a (data, seq) = (2, 4)
grid of devices, built by ``jax.make_mesh``. On many hosts the mesh spans every process's devices
(``jax.devices()``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

import jax
from jax.sharding import AxisType, Mesh

from bppsa.errors import as_int

__all__ = ["shard_map", "make_mesh", "axis_size", "check_axes", "initialize", "ENV"]

# Environment variables set by `bppsa launch` for each worker (read by `initialize`).
ENV = {
    "coordinator": "JAX_COORDINATOR_ADDRESS",   # host:port of process 0 (JAX reads this itself too)
    "num_processes": "BPPSA_NUM_PROCESSES",
    "process_id": "BPPSA_PROCESS_ID",
    "timeout": "BPPSA_INIT_TIMEOUT",            # seconds to wait for every peer to join
}


def shard_map(f: Callable, mesh: Mesh, in_specs: Any, out_specs: Any) -> Callable:
    """``jax.shard_map`` over ``mesh`` with replication (varying-manual-axes) checking off: the
    bodies here mix device-varying control flow (a ``cond`` on the axis index) with replicated
    values, and every replicated output is made so by a ``psum``.

    Args:
      f: the per-device body.
      mesh: the ``jax.sharding.Mesh`` to map over.
      in_specs: a ``PartitionSpec`` per argument of ``f`` (a pytree of them), as ``jax.shard_map`` takes.
      out_specs: a ``PartitionSpec`` per output of ``f`` (a pytree of them).

    Returns:
      The mapped function, taking and returning global arrays.
    """
    return jax.shard_map(f, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_vma=False)


def make_mesh(seq: int | None = None, data: int = 1, *, devices: Sequence[Any] | None = None,
              seq_axis: str = "seq", batch_axis: str | None = "data") -> Mesh:
    """``jax.make_mesh`` for sequence parallelism: a (data, seq) mesh over ``devices`` (default:
    all of ``jax.devices()``, every process's), with bppsa's axis names and argument checks.

    The axes are ``AxisType.Auto`` (as ``jax.sharding.Mesh`` makes them), not ``jax.make_mesh``'s
    default ``Explicit``: the sharded backward places its arrays itself, inside ``shard_map``.

    Args:
      seq: devices along the time axis (default: all devices // data).
      data: devices along the batch axis; with ``data == 1`` and ``batch_axis=None`` the mesh is
        1-D with the single axis ``seq_axis``.
      devices: the first data × seq of them are used, in ``jax.make_mesh``'s order (as given on
        CPU; by device id on GPU; topology-aware on TPU).
      seq_axis: the name of the time axis (default "seq").
      batch_axis: the name of the batch axis (default "data"); None: a 1-D mesh (``data`` must be 1).

    Returns:
      A ``jax.sharding.Mesh`` of shape (data, seq) with axes (``batch_axis``, ``seq_axis``), or (seq,) with
      the one axis ``seq_axis``.

    Raises:
      ValueError: ``seq`` or ``data`` is not a positive int, data × seq exceeds the devices, ``data`` > 1
      without a ``batch_axis``, or ``batch_axis`` equals ``seq_axis``.

    Examples:
      >>> import bppsa
      >>> mesh = bppsa.parallel.make_mesh(seq=1)
      >>> mesh.axis_names, mesh.devices.shape
      (('data', 'seq'), (1, 1))
      >>> bppsa.parallel.make_mesh(seq=1, batch_axis=None).axis_names
      ('seq',)
    """
    devices = list(jax.devices() if devices is None else devices)
    if (n := as_int(data)) is None or n < 1:
        raise ValueError(f"data must be a positive int; got {data!r}")
    data = n
    if seq is None:
        seq = len(devices) // data
    if (n := as_int(seq)) is None or n < 1:
        raise ValueError(f"seq must be a positive int; got {seq!r}")
    seq = n
    if seq * data > len(devices):
        raise ValueError(f"a mesh of data × seq = {data} × {seq} = {seq * data} devices needs that many; "
                         f"only {len(devices)} are available")
    if batch_axis is None:
        if data != 1:
            raise ValueError(f"data = {data} > 1 needs a batch_axis name; got batch_axis=None")
        shape, names = (seq,), (seq_axis,)
    elif batch_axis == seq_axis:
        raise ValueError(f"batch_axis and seq_axis must differ; both are {seq_axis!r}")
    else:
        shape, names = (data, seq), (batch_axis, seq_axis)
    return jax.make_mesh(shape, names, axis_types=(AxisType.Auto,) * len(shape), devices=devices[:seq * data])


def axis_size(mesh: Mesh, name: str) -> int:
    """The number of devices along one axis of a mesh.

    Args:
      mesh: a ``jax.sharding.Mesh``.
      name: one of its axis names.

    Returns:
      The axis's size.

    Raises:
      KeyError: ``name`` is not an axis of ``mesh``.
    """
    return int(dict(zip(mesh.axis_names, mesh.devices.shape))[name])


def check_axes(mesh: Mesh, seq_axis: str, batch_axis: str | None) -> tuple[int, int]:
    """Validate a mesh and its axis names; return (P_seq, P_batch).

    Args:
      mesh: a ``jax.sharding.Mesh``.
      seq_axis: the axis the time axis is split over.
      batch_axis: the axis the batch is split over, or None.

    Returns:
      The pair (P_seq, P_batch) of the two axes' sizes (P_batch = 1 without a ``batch_axis``).

    Raises:
      ValueError: ``mesh`` is not a ``jax.sharding.Mesh``, an axis name is not one of its axes, or
      ``batch_axis`` equals ``seq_axis``.
    """
    if not isinstance(mesh, Mesh):
        raise ValueError(f"mesh must be a jax.sharding.Mesh; got {type(mesh).__name__}")
    names = tuple(mesh.axis_names)
    if seq_axis not in names:
        raise ValueError(f"seq_axis {seq_axis!r} is not an axis of the mesh; its axes are {names}")
    if batch_axis is not None:
        if batch_axis not in names:
            raise ValueError(f"batch_axis {batch_axis!r} is not an axis of the mesh; its axes are {names}")
        if batch_axis == seq_axis:
            raise ValueError(f"batch_axis and seq_axis must differ; both are {seq_axis!r}")
    return axis_size(mesh, seq_axis), (axis_size(mesh, batch_axis) if batch_axis is not None else 1)


def initialize(*, timeout: int | None = None, heartbeat_timeout: int | None = None) -> bool:
    """Join a multi-process JAX job; return True if one was joined, False for a single process.

    Under ``bppsa launch`` the coordinator address, process count and id come from :data:`ENV`
    (loopback only: the coordinator binds 127.0.0.1). On a cluster, ``jax.distributed.initialize()``
    detects SLURM (``SLURM_NTASKS``, ``SLURM_PROCID``, ``SLURM_STEP_NODELIST``), Open MPI and
    Kubernetes by itself; it also honours ``JAX_COORDINATOR_ADDRESS``. Cross-process collectives
    on CPU use gloo. A peer that never joins makes this raise (or JAX abort) after ``timeout`` s.

    Args:
      timeout: seconds to wait for every peer to join (default: ``BPPSA_INIT_TIMEOUT``, else 300).
      heartbeat_timeout: seconds without a peer's heartbeat before the job fails (default: ``timeout``
        clipped to [10, 100]).

    Returns:
      True where a multi-process job was joined, False for a single process.

    Raises:
      ValueError: ``BPPSA_NUM_PROCESSES`` is set but ``JAX_COORDINATOR_ADDRESS`` is not.
    """
    timeout = int(timeout if timeout is not None else os.environ.get(ENV["timeout"], 300))
    heartbeat = int(heartbeat_timeout if heartbeat_timeout is not None else min(100, max(10, timeout)))
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    n = os.environ.get(ENV["num_processes"])
    if n is not None:
        address = os.environ.get(ENV["coordinator"])
        if not address:
            raise ValueError(f"{ENV['num_processes']} is set but {ENV['coordinator']} (host:port) is not")
        pid = int(os.environ[ENV["process_id"]])
        jax.distributed.initialize(coordinator_address=address, num_processes=int(n), process_id=pid,
                                   initialization_timeout=timeout, heartbeat_timeout_seconds=heartbeat,
                                   coordinator_bind_address=address)  # bind to loopback, not all interfaces
        return True
    if any(k in os.environ for k in ("SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", ENV["coordinator"])):
        jax.distributed.initialize(initialization_timeout=timeout, heartbeat_timeout_seconds=heartbeat)
        return True
    return False

