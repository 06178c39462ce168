import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import bppsa
from bppsa import cells

jax.config.update("jax_enable_x64", True)


def test_gru_bppsa_matches_lax_scan_autodiff():
    cell = cells.GRU(3, 5)
    params = cell.init(jax.random.key(0), jnp.float64)
    xs = jax.random.normal(jax.random.key(1), (9, 2, 3), jnp.float64)
    h0 = jnp.zeros((2, 5))

    def ref(p):
        return lax.scan(lambda h, x: (cell.step(p, h, x),) * 2, h0, xs)[1]

    g_ref = jax.grad(lambda p: jnp.sum(ref(p)[-1] ** 2))(params)
    g = jax.grad(lambda p: jnp.sum(bppsa.rnn(cell, p, xs, h0)[-1] ** 2))(params)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12), g, g_ref)
