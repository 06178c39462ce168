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
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir

from bppsa.errors import UsageError

__all__ = ["TRITON_CALL", "ABSTRACT_GPU", "cuda_export", "cuda_module", "gpu_only"]

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


def cuda_export(fn: Callable[..., Any], *args: Any) -> export.Exported:
    """``jax.jit(fn)(*args)`` exported for CUDA (``jax.export``), Triton kernels included.

    Args:
      fn: the function to export (its ``pallas_call`` must not be in interpret mode).
      *args: example arguments (arrays or ``jax.ShapeDtypeStruct``).

    Returns:
      The ``jax.export.Exported`` (``mlir_module_serialized`` its serialised module).

    Raises:
      Whatever the lowering raises (:func:`cuda_module`).
    """
    checks = [export.DisabledSafetyCheck.custom_call(TRITON_CALL)]
    with _abstract_gpu():
        return export.export(jax.jit(fn), platforms=("cuda",), disabled_checks=checks)(*args)


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
    return cuda_export(fn, *args).mlir_module()


def _refuse_off_gpu(ctx: Any, x: Any) -> Any:
    platforms = ", ".join(getattr(ctx.module_context, "platforms", ()) or ("this backend",))
    raise UsageError(f"kernels='pallas' compiles Pallas's Triton kernels for a GPU; this program is being "
                     f"compiled for {platforms}: kernels='interpret' runs the same kernels here (slowly), "
                     f"kernels='xla' none; exporting for a GPU from this host (jax.export with "
                     f"platforms=('cuda',)) works as it is")


_gpu_only_p = Primitive("bppsa_gpu_only")
_gpu_only_p.def_abstract_eval(lambda x: x)
_gpu_only_p.def_impl(lambda x: x)
ad.deflinear(_gpu_only_p, lambda ct: [ct])  # vmap, jvp and transpose see x itself
batching.primitive_batchers[_gpu_only_p] = lambda args, dims: (_gpu_only_p.bind(*args), dims[0])
mlir.register_lowering(_gpu_only_p, _refuse_off_gpu)  # every platform but the GPUs below
for _platform in ("cuda", "rocm"):
    mlir.register_lowering(_gpu_only_p, lambda ctx, x: [x], platform=_platform)


def gpu_only(x: Any) -> Any:
    """``x`` itself, marked so that a program lowered for anything but a GPU stops with bppsa's
    one-line UsageError before Pallas's compiled (not interpreted) kernels beside it are lowered:
    a plan with ``kernels="pallas"`` is made on any host (exporting a training step for a GPU from
    a CPU machine needs one) and refused only where its kernels would run off a GPU.

    Args:
      x: an array a kernel reads.

    Returns:
      ``x``; on a GPU the mark lowers to nothing.

    Raises:
      bppsa.errors.UsageError: when lowered for a CPU (or any backend but CUDA and ROCm).
    """
    return _gpu_only_p.bind(x)
