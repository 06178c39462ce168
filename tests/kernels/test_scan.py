"""The fused chunked scan (bppsa.kernels.scan): in Pallas's interpret mode it computes the XLA
scans' prefixes and totals (float64 and float32; n = 1, odd and non-power-of-two n, one row and
rows over two lane tiles, diagonal, small-block and dense maps with sizes not powers of two, the
diag(A)·Wt factored form, chunks that do not divide n); every form lowers for CUDA on this CPU; the
kernels refuse what they cannot take with a clear error."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from bppsa.kernels import chunked_scan, chunked_scan_factored, cuda_module, lowering
from bppsa.kernels import scan as kernel_scan
from bppsa.scan import dense
from bppsa.scan.blocks import block_scan

pytestmark = pytest.mark.filterwarnings("ignore:The Pallas Triton backend is deprecated:DeprecationWarning")


def _maps(n, R, k, dtype, seed=0):
    key = jax.random.split(jax.random.key(seed), 3)
    scale = 0.9 / k ** 0.5  # products neither blow up nor vanish over the chunks
    Ms = scale * jax.random.normal(key[0], (n, R, k, k), dtype)
    ds = jax.random.normal(key[1], (n, R, k), dtype)
    v = jax.random.normal(key[2], (R, k), dtype)
    return v, Ms, ds


def _close(got, want, dtype):
    tol = 1e-12 if dtype == jnp.float64 else 3e-5
    for a, b in zip(got, want, strict=True):
        assert a.shape == b.shape and a.dtype == b.dtype
        assert float(jnp.max(jnp.abs(a - b))) <= tol * (1 + float(jnp.max(jnp.abs(b))))


_SHAPES = [
    (1, 1, 1),      # one element, one row
    (7, 3, 1),      # the diagonal scan (the structured cells' k = 1, the quasi-Newton step)
    (13, 5, 2),     # 2×2 blocks (ParaRNN's LSTM heads)
    (33, 130, 3),   # 3×3 blocks, rows over two lane tiles
    (9, 2, 9),      # the smallest dense block (padded to 16)
    (12, 3, 20),    # a dense GRU state (padded to 32)
]


# the default run: every shape but the dense GRU state in float64, and that one in float32; the float32 of the
# small cases and the dense GRU state's float64: make test-all
@pytest.mark.parametrize("n, R, k, dtype", [
    (*s, d) if (d == jnp.float64) != (s[2] == 20) else pytest.param(*s, d, marks=pytest.mark.slow)
    for s in _SHAPES for d in (jnp.float64, jnp.float32)])
def test_interpret_mode_equals_the_xla_scan(n, R, k, dtype):
    v, Ms, ds = _maps(n, R, k, dtype, seed=n)
    _close(chunked_scan(v, Ms, ds, interpret=True), block_scan(v, Ms, ds, "sequential"), dtype)


FACTORED_SHAPES = [(1, 1, 5), (17, 2, 33), (11, 3, 20)]


# the default run: float64 at n = 1 and the odd n = 17 with S = 33 (padded to 64); (11, 3, 20) and float32:
# make test-all
@pytest.mark.parametrize("dtype, shapes", [
    pytest.param(jnp.float64, FACTORED_SHAPES[:2], id="float64"),
    pytest.param(jnp.float64, FACTORED_SHAPES[2:], id="float64-11-3-20", marks=pytest.mark.slow),
    pytest.param(jnp.float32, FACTORED_SHAPES, id="float32", marks=pytest.mark.slow)])
def test_the_factored_form_equals_the_scan_of_the_formed_matrices(dtype, shapes):
    for n, R, S in shapes:
        v, Ms, ds = _maps(n, R, S, dtype, seed=S)
        A, Wt = 1.5 * jnp.tanh(Ms[..., 0]), Ms[0, 0]
        want = dense.scan(v, A[..., None] * Wt, ds, "sequential")
        _close(chunked_scan_factored(v, A, Wt, ds, interpret=True), want, dtype)


@pytest.mark.parametrize("name", ["gru", "lstm"])
def test_the_cells_factored_jacobians_scan_as_their_matrices(name):
    """A GRU's four factors and an LSTM's five (bppsa.cells.Factored): the factored
    scan equals the scan of the dense transposed Jacobians, which the factors reproduce exactly."""
    from bppsa import cells
    from bppsa.forward.sequential import forward_states, prev_states

    cell = cells.GRU(3, 6) if name == "gru" else cells.LSTM(3, 5)
    k = jax.random.split(jax.random.key(1), 4)
    params = cell.init(k[0], jnp.float64)
    xs = jax.random.normal(k[1], (9, 2, 3), jnp.float64)
    s0 = jax.random.normal(k[2], (2, cell.state_size), jnp.float64)
    ss = forward_states(cell, params, xs, s0)
    Ms = cell.transposed_jacobian(params, prev_states(s0, ss), xs, ss)
    A, Wt = cell.jacobian_structure.factors(params, prev_states(s0, ss), xs, ss)
    assert A.shape[0] == Wt.shape[0] == (4 if name == "gru" else 5)
    assert float(jnp.max(jnp.abs(jnp.einsum("qnri,qij->nrij", A, Wt) - Ms))) <= 1e-14
    v, ds = jax.random.normal(k[3], (2, cell.state_size), jnp.float64), jnp.cos(ss)
    _close(chunked_scan_factored(v, A, Wt, ds, interpret=True), dense.scan(v, Ms, ds, "sequential"), jnp.float64)


def test_any_chunk_length_gives_the_same_scan():
    """Chunks that divide n, that do not (the last chunk's padding masked), of one element, of all n."""
    v, Ms, ds = _maps(10, 2, 2, jnp.float64)
    want = block_scan(v, Ms, ds, "sequential")
    for chunk in (1, 3, 10, 64):
        _close(chunked_scan(v, Ms, ds, chunk=chunk, interpret=True), want, jnp.float64)
    v, Ms, ds = _maps(10, 2, 17, jnp.float64)
    for chunk in (3,):
        _close(chunked_scan(v, Ms, ds, chunk=chunk, interpret=True), block_scan(v, Ms, ds, "sequential"),
               jnp.float64)


def test_no_offsets_means_zero_offsets():
    v, Ms, ds = _maps(6, 2, 2, jnp.float64)
    _close(chunked_scan(v, Ms, interpret=True), block_scan(v, Ms, jnp.zeros_like(ds), "sequential"), jnp.float64)


def test_chunk_length():
    assert [kernel_scan.chunk_length(n) for n in (1, 2, 4, 10, 30_000)] == [1, 2, 2, 4, 174]


@pytest.mark.parametrize("k", [1, 2, 20, 64])
def test_every_form_lowers_for_cuda_here(k):
    """Three Triton kernels for each form (lanes, dense rows); a kernel that cannot lower fails here."""
    n, R = 37, 5
    module = cuda_module(lambda v, M, d: chunked_scan(v, M, d), jnp.zeros((R, k)), jnp.zeros((n, R, k, k)),
                         jnp.zeros((n, R, k)))
    assert module.count(lowering.TRITON_CALL) == 3


@pytest.mark.parametrize("Q", [1, 4])
def test_the_factored_form_lowers_for_cuda_here(Q):
    module = cuda_module(lambda v, A, W, d: chunked_scan_factored(v, A, W, d), jnp.zeros((4, 20)),
                         jnp.zeros((Q, 37, 4, 20)), jnp.zeros((Q, 20, 20)), jnp.zeros((37, 4, 20)))
    assert module.count(lowering.TRITON_CALL) == 3


def test_bad_shapes_are_clear_errors():
    v, Ms, ds = _maps(4, 2, 3, jnp.float64)
    with pytest.raises(ValueError, match=r"v must have shape \(R, k\) = \(2, 3\)"):
        chunked_scan(v[:1], Ms, ds, interpret=True)
    with pytest.raises(ValueError, match=r"ds must have shape \(n, R, k\)"):
        chunked_scan(v, Ms, ds[:2], interpret=True)
    with pytest.raises(ValueError, match=r"n >= 1"):
        chunked_scan(v, Ms[:0], ds[:0], interpret=True)
    with pytest.raises(ValueError, match=r"blocks of at most 64"):
        chunked_scan(jnp.zeros((1, 65)), jnp.zeros((2, 1, 65, 65)), interpret=True)
    with pytest.raises(ValueError, match=r"Wt must have shape \(Q, S, S\) = \(1, 3, 3\)"):
        chunked_scan_factored(v, ds, jnp.zeros((3, 4)), ds, interpret=True)
