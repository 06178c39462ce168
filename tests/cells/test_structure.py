"""The Jacobian's structure, one typed description (bppsa.cells.structure): each kind of the built-in
cells, what it carries against the dense transposed Jacobians (float64), the translation of a cell
written against the members it replaced, and a malformed description named in one line."""

import dataclasses
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import bppsa
from bppsa import cells
from bppsa.cells import structure
from bppsa.errors import UsageError
from bppsa.nn import cells as flax_cells


def _arrays(cell, T=4, B=2, seed=0):
    """params, s_prev, xs, s of T steps at random states, float64."""
    k = jax.random.split(jax.random.key(seed), 3)
    params = cell.init(k[0], jnp.float64)
    s_prev = 0.5 * jax.random.normal(k[1], (T, B, cell.state_size), jnp.float64)
    xs = jax.random.normal(k[2], (T, B, cell.input_size), jnp.float64)
    s = jax.vmap(lambda sp, x: cell.flatten_state(cell.step(params, cell.unflatten_state(sp), x)))(s_prev, xs)
    return params, s_prev, xs, s


def test_each_builtin_cell_says_its_kind():
    kinds = {cells.RNN(2, 3): cells.Scaled, cells.RNN(2, 3, diagonal=False): cells.Dense,
             cells.GRU(2, 3): cells.Factored, cells.LSTM(2, 3): cells.Factored,
             cells.BlockRNN(2, 4, 2): cells.Blocks, cells.BlockGRU(2, 4): cells.Blocks,
             cells.BlockLSTM(2, 4, 2): cells.Blocks, cells.Generic(lambda p, h, x: h): cells.Dense,
             flax_cells.Masked(cells.GRU(2, 3)): cells.Dense, flax_cells.Masked(cells.BlockGRU(2, 4, 2)): cells.Blocks}
    for cell, kind in kinds.items():
        assert type(cells.structure_of(cell)) is kind, cell
    assert [structure.block_size(c) for c in (cells.BlockRNN(2, 4, 2), cells.BlockLSTM(2, 4, 2), cells.GRU(2, 3))] \
        == [2, 4, None]
    assert [structure.elementwise(c) for c in (cells.BlockGRU(2, 4), cells.BlockLSTM(2, 4), cells.BlockGRU(2, 4, 2),
                                               cells.RNN(2, 3))] == [True, True, False, False]
    assert cells.Dense() == cells.Dense() and hash(cells.Dense()) == hash(cells.Dense())  # frozen values


@pytest.mark.parametrize("make", [lambda: cells.RNN(3, 4), lambda: cells.GRU(3, 4), lambda: cells.LSTM(3, 3),
                                  lambda: cells.BlockGRU(3, 6, 2), lambda: cells.BlockLSTM(3, 4, 1),
                                  lambda: cells.Generic(lambda p, h, x: jnp.tanh(p["W"] @ h + x.sum()), hidden_size=3,
                                                        input_size=2, init_fn=lambda k, d: {"W": jnp.eye(3, dtype=d)})],
                         ids=["rnn", "gru", "lstm", "block-gru-k2", "block-lstm-k1", "generic"])
def test_what_each_kind_carries_is_the_dense_jacobian(make):
    """Scaled: diag(A) Wt; Factored: Σ_q diag(A_q) Wt_q; Blocks: the diagonal blocks and the diagonal; for
    every kind jacobian_blocks / jacobian_diagonal agree with the dense M_t."""
    cell = make()
    params, s_prev, xs, s = _arrays(cell)
    M = np.asarray(cell.transposed_jacobian(params, s_prev, xs, s))
    match cells.structure_of(cell):
        case cells.Scaled(factors):
            A, Wt = factors(params, s_prev, xs, s)
            np.testing.assert_allclose(A[..., None] * Wt, M, atol=1e-14)
        case cells.Factored(factors):
            A, Wt = factors(params, s_prev, xs, s)
            np.testing.assert_allclose(jnp.einsum("qtbi,qij->tbij", A, Wt), M, atol=1e-14)
        case cells.Blocks(k, blocks):
            np.testing.assert_allclose(cells.block_diagonal(blocks(params, s_prev, xs, s)), M, atol=1e-14)
            assert structure.jacobian_blocks(cell, params, s_prev, xs, s).shape[-1] == k
        case cells.Dense():
            assert structure.jacobian_blocks(cell, params, s_prev, xs, s).shape[-3:] == (1,) + M.shape[-2:]
    np.testing.assert_allclose(structure.jacobian_diagonal(cell, params, s_prev, xs, s),
                               np.diagonal(M, axis1=-2, axis2=-1), atol=1e-14)


def test_a_flax_cell_carries_its_cores_structure_on_flax_parameters():
    from flax import nnx
    cell = flax_cells.adapt(nnx.GRUCell(3, 4, rngs=nnx.Rngs(0)), None, 3)
    assert type(cells.structure_of(cell)) is cells.Factored
    params, s_prev, xs, s = _arrays(cell)
    A, Wt = cells.structure_of(cell).factors(params, s_prev, xs, s)
    np.testing.assert_allclose(jnp.einsum("qtbi,qij->tbij", A, Wt),
                               cell.transposed_jacobian(params, s_prev, xs, s), atol=1e-14)


# --------------------------------------------------------------------------------------------
# A cell written against the members jacobian_structure replaced: translated, with a warning.
# --------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class _Leaky(cells.Cell):
    """h' = tanh(h W + x U): M_t = diag(1 − h'²) Wᵀ."""

    input_size: int = 2
    hidden_size: int = 3

    def init(self, key, dtype=jnp.float32):
        k1, k2 = jax.random.split(key)
        return {"W": 0.5 * jax.random.normal(k1, (3, 3), dtype), "U": jax.random.normal(k2, (2, 3), dtype)}

    def step(self, params, h, x):
        return jnp.tanh(h @ params["W"] + x @ params["U"])


@dataclasses.dataclass(frozen=True)
class _OldScaled(_Leaky):
    has_diagonal_jacobian = True

    def diagonal_jacobian(self, params, s_prev, xs, s):
        return 1 - s * s, params["W"].T


@dataclasses.dataclass(frozen=True)
class _OldFactored(_Leaky):
    def factored_jacobian(self, params, s_prev, xs, s):
        return (1 - s * s)[None], params["W"].T[None]


@dataclasses.dataclass(frozen=True)
class _OldBlocks(_Leaky):  # W diagonal: 1×1 blocks
    jacobian_block_size = 1

    def init(self, key, dtype=jnp.float32):
        return {**super().init(key, dtype), "W": jnp.diag(jnp.array([0.5, -0.3, 0.9], dtype))}

    def jacobian_blocks(self, params, s_prev, xs, s):
        return ((1 - s * s) * jnp.diagonal(params["W"]))[..., None, None]


@pytest.mark.parametrize("cls, kind", [(_OldScaled, cells.Scaled),  # the other two: make test-all
                                       pytest.param(_OldFactored, cells.Factored, marks=pytest.mark.slow),
                                       pytest.param(_OldBlocks, cells.Blocks, marks=pytest.mark.slow)])
def test_a_cell_with_the_old_members_is_translated_with_a_warning(cls, kind):
    cell = cls()
    with pytest.warns(DeprecationWarning, match="replaced by one jacobian_structure"):
        st = cells.structure_of(cell)
    assert type(st) is kind
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert type(cells.structure_of(_Leaky())) is cells.Dense  # nothing old: no warning
    params = cell.init(jax.random.key(0), jnp.float64)
    xs, h0 = jnp.cos(jnp.arange(30.0)).reshape(5, 3, 2), jnp.zeros((3, 3))
    loss = lambda c, p, **kw: jnp.sum(jnp.sin(bppsa.rnn(c, p, xs, h0, **kw)))  # noqa: E731
    want = jax.grad(lambda p: loss(_Leaky(), p, backward="bptt"))(params)
    with pytest.warns(DeprecationWarning):
        for kw in ({}, {"scan": "sequential"}, {"forward": "quasi"}):
            got = jax.grad(lambda p, kw=kw: loss(cell, p, **kw))(params)
            for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
                np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)


# --------------------------------------------------------------------------------------------
# A malformed description: one line naming what was wrong.
# --------------------------------------------------------------------------------------------

def test_a_malformed_description_is_a_usage_error():
    f = lambda params, s_prev, xs, s: s  # noqa: E731
    with pytest.raises(UsageError, match=r"Blocks: size must be a positive int .*got 0"):
        cells.Blocks(0, f)
    with pytest.raises(UsageError, match=r"Blocks: size must be a positive int .*got 'two'"):
        cells.Blocks("two", f)
    assert cells.Blocks(np.int64(2), f).size == 2 and type(cells.Blocks(np.int64(2), f).size) is int
    with pytest.raises(UsageError, match=r"Blocks: blocks must be a function fn\(params, s_prev, xs, s\); got 'b'"):
        cells.Blocks(2, "b")
    with pytest.raises(UsageError, match=r"Blocks: diagonal must be a function .* or None; got 3"):
        cells.Blocks(2, f, 3)
    with pytest.raises(UsageError, match=r"Scaled: factors must be a function .*; got None"):
        cells.Scaled(None)  # pyright: ignore[reportArgumentType]
    with pytest.raises(UsageError, match=r"Factored: factors must be a function"):
        cells.Factored((1, 2))  # pyright: ignore[reportArgumentType]


@dataclasses.dataclass(frozen=True)
class _Tuple(_Leaky):
    jacobian_structure = ("blocks", 1)  # pyright: ignore[reportAssignmentType]


@dataclasses.dataclass(frozen=True)
class _SizeOnly(_Leaky):
    jacobian_block_size = 1


def test_a_cell_whose_description_is_not_one_is_named():
    with pytest.raises(UsageError, match=r"_Tuple.jacobian_structure must be one of bppsa.cells.Dense\(\), .*"
                                         r"got \('blocks', 1\)"):
        cells.structure_of(_Tuple())
    cell = _Tuple()
    params = cell.init(jax.random.key(0))
    with pytest.raises(UsageError, match="jacobian_structure must be one of"):
        jax.grad(lambda p: jnp.sum(bppsa.rnn(cell, p, jnp.ones((3, 1, 2)), jnp.zeros((1, 3)))))(params)
    with pytest.warns(DeprecationWarning), \
            pytest.raises(UsageError, match="sets jacobian_block_size = 1 but has no jacobian_blocks"):
        cells.structure_of(_SizeOnly())


# --------------------------------------------------------------------------------------------
# The Block cells live in bppsa.cells; the gate count is no member of the contract.
# --------------------------------------------------------------------------------------------

def test_the_block_cells_former_module_is_an_alias_with_a_warning():
    with pytest.warns(DeprecationWarning, match="bppsa.structured moved"):
        old = bppsa.structured  # pyright: ignore[reportAttributeAccessIssue]
    assert old.BlockGRU is cells.BlockGRU and old.recurrent_matrix is cells.recurrent_matrix
    assert "structured" not in bppsa.__all__


def test_the_gate_count_is_the_affine_cells_not_the_contracts():
    assert "gates" not in vars(cells.Cell) and cells.Affine.gates == 1
    assert [cells.gate_count(c) for c in (cells.RNN(2, 3), cells.GRU(2, 3), cells.LSTM(2, 3), cells.BlockGRU(2, 4),
                                          _Leaky(), flax_cells.Masked(_Leaky()))] == [1, 3, 4, 3, 1, 1]
