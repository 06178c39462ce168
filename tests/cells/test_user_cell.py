"""A user's own cell (docs/guides/cells.md): the contract is ``init``, ``step`` and the sizes; the
guide's blocks run as written; such a cell, with and without its structure, gives autodiff's
gradients through a plain ``lax.scan`` in float64 for every backward and forward, at T = 1, odd
lengths and B = 1; the capabilities a cell lacks are defaults, not errors."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

import bppsa
from bppsa import cells
from tests.reference import scan_grads
from tests.test_readme import _run, python_blocks

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "guides" / "cells.md"


@dataclasses.dataclass(frozen=True)
class MinGRU(cells.Cell):
    """The guide's cell: z = σ(x W_z), h' = (1 − z) ⊙ h + z ⊙ (x W_h); only init and step."""

    input_size: int
    hidden_size: int

    def init(self, key, dtype=jnp.float32):
        kz, kh = jax.random.split(key)
        return {"W_z": jax.random.normal(kz, (self.input_size, self.hidden_size), dtype),
                "W_h": jax.random.normal(kh, (self.input_size, self.hidden_size), dtype)}

    def step(self, params, h, x):
        z = jax.nn.sigmoid(x @ params["W_z"])
        return (1 - z) * h + z * (x @ params["W_h"])


@dataclasses.dataclass(frozen=True)
class DiagonalMinGRU(MinGRU):
    """The same cell, saying its Jacobian is diagonal (1 x 1 blocks)."""

    @property
    def jacobian_structure(self):
        return cells.Blocks(1, self.blocks)

    def blocks(self, params, s_prev, xs, s):
        return (1 - jax.nn.sigmoid(xs @ params["W_z"]))[..., None, None]


@dataclasses.dataclass(frozen=True)
class LegacyDiagonalMinGRU(MinGRU):
    """The same, by the members ``jacobian_structure`` replaced: translated, with a DeprecationWarning."""

    @property
    def jacobian_block_size(self):
        return 1

    def jacobian_blocks(self, params, s_prev, xs, s):
        return (1 - jax.nn.sigmoid(xs @ params["W_z"]))[..., None, None]


# make test-all, as tests/test_guides.py's pages whose examples are the unit tests' features: the default
# run keeps the README's, getting started's and the runner guide's examples, and the guide's cell (MinGRU)
# with its gradients below
@pytest.mark.slow
def test_the_guides_blocks_run_as_written():
    blocks = python_blocks(GUIDE.read_text())
    assert len(blocks) == 3  # the opening example, the contract alone, the capabilities
    r = _run(blocks)
    assert r.returncode == 0, f"an example of docs/guides/cells.md does not run as written:\n{r.stderr[-3000:]}"


def test_the_contract_is_init_step_and_the_sizes():
    abstract = sorted(cells.Cell.__abstractmethods__)
    assert abstract == ["init", "step"]
    cell = MinGRU(2, 3)
    assert not cell.has_adjoint and cell.jacobian_structure == cells.Dense()
    assert not isinstance(cell, cells.AnalyticAdjoint)


@pytest.mark.filterwarnings("ignore:LegacyDiagonalMinGRU describes its Jacobian:DeprecationWarning")
@pytest.mark.parametrize("cls, T, B", [
    (c, T, B) if (T, B) != (12, 3) and (c, T) not in ((LegacyDiagonalMinGRU, 1), (MinGRU, 1))
    else pytest.param(c, T, B, marks=pytest.mark.slow)
    for T, B in [(1, 1), (7, 1), (12, 3)] for c in (MinGRU, DiagonalMinGRU, LegacyDiagonalMinGRU)])
# B > 1, the legacy members and the dense MinGRU at T = 1 (a user cell's T = 1 is DiagonalMinGRU's,
# the dense path's T = 1 tests/core/test_backprop.py's): test-all
def test_a_user_cell_has_autodiffs_gradients_every_backward_and_forward(cls, T, B):
    cell = cls(2, 3)
    k = jax.random.split(jax.random.key(T * 10 + B), 3)
    params = cell.init(k[0], jnp.float64)
    xs = jax.random.normal(k[1], (T, B, 2), jnp.float64)
    h0 = jax.random.normal(k[2], (B, 3), jnp.float64)
    w = jnp.cos(jnp.arange(T * B * 3, dtype=jnp.float64)).reshape(T, B, 3)
    loss = lambda hs: jnp.sum(jnp.sin(hs) * w)  # noqa: E731
    want = scan_grads(cell, params, xs, h0, loss)
    for backward, forward in [("bppsa", "sequential"), ("bptt", "sequential"), ("bppsa", "newton"),
                              ("bppsa", "quasi")]:
        got = jax.grad(lambda p, x, h: loss(bppsa.rnn(cell, p, x, h, backward=backward, forward=forward)),
                       argnums=(0, 1, 2))(params, xs, h0)
        for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
            assert jnp.allclose(a, b, rtol=1e-10, atol=1e-10), (cls.__name__, T, B, backward, forward)


def test_the_default_jacobian_is_the_steps():
    """The default transposed Jacobian (autodiff of step) equals the closed form the diagonal
    subclass gives, as dense matrices."""
    cell, diag = MinGRU(2, 3), DiagonalMinGRU(2, 3)
    params = cell.init(jax.random.key(0), jnp.float64)
    xs = jax.random.normal(jax.random.key(1), (5, 2, 2), jnp.float64)
    sp = jax.random.normal(jax.random.key(2), (5, 2, 3), jnp.float64)
    dense = cell.transposed_jacobian(params, sp, xs, sp)
    blocks = diag.jacobian_structure.blocks(params, sp, xs, sp)[..., 0, 0]
    assert jnp.allclose(dense, jax.vmap(jax.vmap(jnp.diag))(blocks), atol=1e-14)
