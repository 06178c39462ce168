"""Write the offline intersphinx inventories docs/conf.py reads (``python docs/_inventories/make_inventories.py``).

The build machines have no network, so Sphinx cannot fetch JAX's, flax's and optax's
``objects.inv``. These small hand-written inventories list the names the documentation refers to,
with their public URLs (relative to each project's base URL in ``intersphinx_mapping``). Add a name
here, rerun the script and commit the ``.inv`` files when a docstring refers to a new one.
"""

from __future__ import annotations

import zlib
from pathlib import Path

HERE = Path(__file__).resolve().parent

# project -> (display name, [(name, role, uri relative to the project's base URL)])
INVENTORIES = {
    "jax": ("JAX", [
        ("jax.Array", "py:class", "_autosummary/jax.Array.html#jax.Array"),
        ("jax.ShapeDtypeStruct", "py:class", "_autosummary/jax.ShapeDtypeStruct.html#jax.ShapeDtypeStruct"),
        ("jax.jit", "py:function", "_autosummary/jax.jit.html#jax.jit"),
        ("jax.grad", "py:function", "_autosummary/jax.grad.html#jax.grad"),
        ("jax.value_and_grad", "py:function", "_autosummary/jax.value_and_grad.html#jax.value_and_grad"),
        ("jax.vmap", "py:function", "_autosummary/jax.vmap.html#jax.vmap"),
        ("jax.jvp", "py:function", "_autosummary/jax.jvp.html#jax.jvp"),
        ("jax.vjp", "py:function", "_autosummary/jax.vjp.html#jax.vjp"),
        ("jax.custom_jvp", "py:class", "_autosummary/jax.custom_jvp.html#jax.custom_jvp"),
        ("jax.make_mesh", "py:function", "_autosummary/jax.make_mesh.html#jax.make_mesh"),
        ("jax.shard_map", "py:function", "_autosummary/jax.shard_map.html#jax.shard_map"),
        ("jax.lax.scan", "py:function", "_autosummary/jax.lax.scan.html#jax.lax.scan"),
        ("jax.lax.associative_scan", "py:function",
         "_autosummary/jax.lax.associative_scan.html#jax.lax.associative_scan"),
        ("jax.lax.Precision", "py:class", "jax.lax.html#jax.lax.Precision"),
        ("jax.sharding.Mesh", "py:class", "jax.sharding.html#jax.sharding.Mesh"),
        ("jax.typing.ArrayLike", "py:class", "jax.typing.html#jax.typing.ArrayLike"),
        ("jax.typing.DTypeLike", "py:class", "jax.typing.html#jax.typing.DTypeLike"),
        ("jax.distributed.initialize", "py:function",
         "_autosummary/jax.distributed.initialize.html#jax.distributed.initialize"),
    ]),
    "flax": ("Flax", [
        ("flax.nnx.Module", "py:class", "api_reference/flax.nnx/module.html#flax.nnx.Module"),
        ("flax.nnx.RNN", "py:class", "api_reference/flax.nnx/nn/recurrent.html#flax.nnx.RNN"),
        ("flax.nnx.RNNCellBase", "py:class", "api_reference/flax.nnx/nn/recurrent.html#flax.nnx.RNNCellBase"),
        ("flax.nnx.SimpleCell", "py:class", "api_reference/flax.nnx/nn/recurrent.html#flax.nnx.SimpleCell"),
        ("flax.nnx.GRUCell", "py:class", "api_reference/flax.nnx/nn/recurrent.html#flax.nnx.GRUCell"),
        ("flax.nnx.LSTMCell", "py:class", "api_reference/flax.nnx/nn/recurrent.html#flax.nnx.LSTMCell"),
        ("flax.nnx.OptimizedLSTMCell", "py:class",
         "api_reference/flax.nnx/nn/recurrent.html#flax.nnx.OptimizedLSTMCell"),
        ("flax.nnx.Rngs", "py:class", "api_reference/flax.nnx/rnglib.html#flax.nnx.Rngs"),
        # the paths signatures print (the classes' __module__)
        ("flax.nnx.rnglib.Rngs", "py:class", "api_reference/flax.nnx/rnglib.html#flax.nnx.Rngs"),
        ("flax.nnx.module.Module", "py:class", "api_reference/flax.nnx/module.html#flax.nnx.Module"),
        ("flax.nnx.Param", "py:class", "api_reference/flax.nnx/variables.html#flax.nnx.Param"),
        ("flax.nnx.Linear", "py:class", "api_reference/flax.nnx/nn/linear.html#flax.nnx.Linear"),
        ("flax.nnx.Optimizer", "py:class",
         "api_reference/flax.nnx/training/optimizer.html#flax.nnx.optimizer.Optimizer"),
    ]),
    "optax": ("Optax", [
        ("optax.GradientTransformation", "py:class", "api/transformations.html#optax.GradientTransformation"),
        ("optax.adam", "py:function", "api/optimizers.html#optax.adam"),
        ("optax.sgd", "py:function", "api/optimizers.html#optax.sgd"),
    ]),
}


def write(project: str, display: str, entries: list[tuple[str, str, str]]) -> Path:
    """``_inventories/<project>.inv`` in Sphinx's inventory format, version 2."""
    header = (f"# Sphinx inventory version 2\n# Project: {display}\n# Version: latest\n"
              "# The remainder of this file is compressed using zlib.\n")
    body = "".join(f"{name} {role} 1 {uri} -\n" for name, role, uri in sorted(entries))
    path = HERE / f"{project}.inv"
    path.write_bytes(header.encode() + zlib.compress(body.encode(), 9))
    return path


if __name__ == "__main__":
    for project, (display, entries) in INVENTORIES.items():
        print(write(project, display, entries))
