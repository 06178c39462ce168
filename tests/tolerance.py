"""The one tolerance of the tests: comparisons that hold on any CPU.

Two runs of one program on the same inputs on the same machine give the same bits, and tests that
check that (a resumed run, a cache read back) say so and compare exactly. Everything else — two
different programs (a traced scan and an eager loop, a batch and a subset of it, a worker process
and the parent, a chunked and an unchunked solve) or one program on different CPUs (OpenBLAS and
XLA pick kernels by the instruction set: a sum's order, fused multiply-adds) — agrees only to
rounding, and is compared with :func:`assert_close`: per-dtype defaults, scaled to the size of
the expected values, so that it passes under ``OPENBLAS_CORETYPE=Haswell/Sandybridge/SkylakeX``
and ``XLA_FLAGS=--xla_cpu_max_isa=AVX`` alike.
"""

from __future__ import annotations

import numpy as np

# Relative tolerance per dtype: a few hundred ulps (eps: float16 9.8e-4, bfloat16 7.8e-3,
# float32 1.2e-7, float64 2.2e-16), room for reductions of a few thousand terms in another order.
RTOL = {np.dtype(np.float16): 1e-2, np.dtype(np.float32): 2e-5, np.dtype(np.float64): 1e-12}
_BFLOAT16_RTOL = 5e-2


def rtol_for(*arrays) -> float:
    """The default relative tolerance for comparing ``arrays``: that of the least precise float
    dtype among them (integers and bools: 0, compared exactly)."""
    tols = []
    for a in arrays:
        dtype = np.asarray(a).dtype
        if dtype.name == "bfloat16":
            tols.append(_BFLOAT16_RTOL)
        elif np.issubdtype(dtype, np.floating) or np.issubdtype(dtype, np.complexfloating):
            tols.append(RTOL.get(np.dtype(np.finfo(dtype).dtype), 1e-12))
        else:
            tols.append(0.0)
    return max(tols, default=0.0)


def assert_close(actual, desired, *, rtol: float | None = None, atol: float | None = None, err_msg: str = ""):
    """``|actual - desired| <= atol + rtol·|desired|`` elementwise (pytrees of arrays leaf by leaf).

    ``rtol`` (None): :func:`rtol_for` the two. ``atol`` (None): ``rtol`` times the largest
    ``|desired|`` of the leaf, so that entries near zero of an O(1) result are held to the
    result's scale, not to their own."""
    import jax
    leaves_a, tree_a = jax.tree.flatten(actual)
    leaves_d, tree_d = jax.tree.flatten(desired)
    if tree_a != tree_d:
        raise AssertionError(f"{err_msg}: structures differ: {tree_a} vs {tree_d}")
    for a, d in zip(leaves_a, leaves_d):
        a, d = np.asarray(a), np.asarray(d)
        r = rtol_for(a, d) if rtol is None else rtol
        scale = float(np.max(np.abs(d.astype(np.float64)))) if d.size and np.issubdtype(d.dtype, np.number) else 0.0
        t = r * scale if atol is None else atol
        np.testing.assert_allclose(a.astype(np.float64) if a.dtype.name == "bfloat16" else a,
                                   d.astype(np.float64) if d.dtype.name == "bfloat16" else d,
                                   rtol=r, atol=t, err_msg=err_msg)


def assert_trees_close(got, want, rtol: float = 1e-10, atol: float = 1e-12, what: str = ""):
    """Two pytrees of the same structure whose leaves agree to ``rtol``/``atol`` (fixed tolerances: for
    float64 results against the float64 reference), each leaf named by its path when it fails."""
    import jax
    assert jax.tree.structure(got) == jax.tree.structure(want), (what, jax.tree.structure(got),
                                                                 jax.tree.structure(want))
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(got), jax.tree.leaves(want)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=rtol, atol=atol,
                                   err_msg=f"{what}{jax.tree_util.keystr(path)}")


def max_tree_diff(a, b, *, relative: bool = False) -> float:
    """The largest |a - b| over the leaves of two pytrees; ``relative``: divided by the largest |b|
    (at least 1). For tests that bound one number (an adjoint to the last digits, a weighted mean)."""
    import jax
    import jax.numpy as jnp
    diff = max(float(jnp.max(jnp.abs(u - v))) for u, v in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True))
    if not relative:
        return diff
    return diff / max(1.0, *(float(jnp.max(jnp.abs(v))) for v in jax.tree.leaves(b)))
