"""The GPU lowering of a kernel, checked on any machine: ``jax.export`` for CUDA runs Pallas's
Triton lowering without a GPU, so a kernel that cannot lower fails here, on the CPU, not on the GPU.

On JAX 0.10 the export needs nothing more; from JAX 0.12 the Triton lowering asks for the GPU it
lowers for, given as an abstract device (:data:`ABSTRACT_GPU`) of an abstract mesh. What export does
not check is Triton's own compilation to PTX (registers, shared memory): that happens on the GPU.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable

import jax
from jax import export

__all__ = ["TRITON_CALL", "ABSTRACT_GPU", "cuda_module"]

#: The custom call a Triton-backend ``pallas_call`` lowers to.
TRITON_CALL = "__gpu$xla.gpu.triton"
#: The GPU the lowering targets where JAX asks for one (an H100: compute capability 9.0).
ABSTRACT_GPU = "NVIDIA H100 80GB HBM3"


def _abstract_gpu() -> Any:
    """A context naming :data:`ABSTRACT_GPU` as the device to lower for (JAX >= 0.11), or a null
    context where this JAX has no abstract devices (0.10 lowers without one)."""
    sharding = jax.sharding
    if not hasattr(sharding, "AbstractDevice") or not hasattr(sharding, "use_abstract_mesh"):
        return contextlib.nullcontext()
    device = sharding.AbstractDevice(device_kind=ABSTRACT_GPU, num_cores=None, platform="cuda")
    mesh = sharding.AbstractMesh((1,), ("gpu",), abstract_device=device)
    return sharding.use_abstract_mesh(mesh)


def cuda_module(fn: Callable[..., Any], *args: Any) -> str:
    """The StableHLO text of ``jax.jit(fn)(*args)`` exported for CUDA, Triton kernels included.

    Args:
      fn: the function to lower (its ``pallas_call`` must not be in interpret mode).
      *args: example arguments (arrays or ``jax.ShapeDtypeStruct``).

    Returns:
      The exported module's MLIR text; a Triton kernel appears in it as the custom call
      :data:`TRITON_CALL`.

    Raises:
      Whatever the lowering raises (an unimplemented primitive, an unsupported shape): the kernel
      would not compile for the GPU.
    """
    checks = [export.DisabledSafetyCheck.custom_call(TRITON_CALL)]
    with _abstract_gpu():
        exported = export.export(jax.jit(fn), platforms=("cuda",), disabled_checks=checks)(*args)
    return exported.mlir_module()
