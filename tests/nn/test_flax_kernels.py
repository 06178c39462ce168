"""bppsa.nn.RNN with kernels="interpret" around flax's own cells: the drop-in runs SimpleCell, GRUCell
and LSTMCell on bppsa's RNN, GRU and LSTM, so the fused kernels run them too (they were refused, with
a message saying the kernels run RNN, GRU and LSTM); equal to nnx.RNN in float64, states and
gradients. A flax cell that runs by autodiff (mixed dtypes) is refused with the true reason."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import bppsa
from bppsa.errors import UsageError

pytestmark = pytest.mark.filterwarnings("ignore:The Pallas Triton backend is deprecated:DeprecationWarning")


# every cell under bptt and the LSTM under bppsa in the default run; the other two under bppsa: make test-all
@pytest.mark.parametrize("flax_cell, backward", [
    (c, b) if b == "bptt" or c is nnx.LSTMCell else pytest.param(c, b, marks=pytest.mark.slow)
    for b in ("bppsa", "bptt") for c in (nnx.SimpleCell, nnx.GRUCell, nnx.LSTMCell)])
def test_flax_cells_run_on_the_kernels(flax_cell, backward):
    x = jax.random.normal(jax.random.key(0), (3, 9, 4), dtype=jnp.float64)
    cell = flax_cell(4, 5, rngs=nnx.Rngs(0), param_dtype=jnp.float64, dtype=jnp.float64)
    ours, ref = bppsa.nn.RNN(cell, kernels="interpret", backward=backward), nnx.RNN(cell)
    np.testing.assert_allclose(ours(x), ref(x), rtol=0, atol=1e-13)
    loss = lambda m: jnp.sum(m(x) ** 2)  # noqa: E731
    got, want = nnx.state(nnx.grad(loss)(ours)), nnx.state(nnx.grad(loss)(ref))
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-11, atol=1e-13)


def test_a_flax_cell_run_by_autodiff_is_refused_with_the_reason():
    x = jax.random.normal(jax.random.key(0), (3, 9, 4), dtype=jnp.float64)
    cell = nnx.SimpleCell(4, 5, rngs=nnx.Rngs(0), param_dtype=jnp.float64)  # computes in float32
    with pytest.raises(UsageError, match=r"of SimpleCell, run as bppsa\.nn\.cells\.Autodiff \(the fused recurrence "
                                         r"runs .* where parameters, carry and computation share one dtype"):
        bppsa.nn.RNN(cell, kernels="interpret")(x)
