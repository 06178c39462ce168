"""Recurrent cells with analytic transposed Jacobians (BPPSA, Wang et al., MLSys 2020, §3–4).

A cell is a small frozen dataclass (hashable, so it can key compiled functions) with ::

    init(key, dtype=float32) -> params                  a pytree of arrays
    param_spec(dtype=float32) -> spec                   its shapes (jax.ShapeDtypeStruct), or None
    step(params, h, x) -> h'                            h: (B, H) [LSTM: (h, c)], x: (B, I)

and the two batched pieces BPPSA needs, both over all T steps at once, on the *flat* state
s (B, S) (S = H; LSTM: S = 2H with s = [h, c])::

    transposed_jacobian(params, s_prev, xs, s) -> Ms    s_prev, s: (T, B, S), xs: (T, B, I)
        Ms: (T, B, S, S), the matrix M_t with g_{t-1} = g_t @ M_t (row vectors): the paper's
        Jᵀ acting on column vectors, i.e. M_t[b, i, j] = ∂s_t[b, i] / ∂s_{t-1}[b, j].
    param_grads(params, s_prev, xs, s, gs) -> (dparams, dxs)
        gs: (T, B, S) the total gradient ∂L/∂s_t; one contraction over (t, b).

Optional structure (``jacobian_structure``: one typed description, :class:`Dense`, :class:`Scaled`,
:class:`Factored` or :class:`Blocks`, :mod:`bppsa.cells.structure`) lets the scans avoid S×S
matrices; ``project`` lets the sequential forward hoist the input's product out of its loop; an
analytic adjoint step (``has_adjoint``; the methods of the protocol :class:`AnalyticAdjoint`)
lets BPTT run one product with W_hᵀ a step on factors its forward kept, no autodiff.

The contract and the shared maths are in :mod:`bppsa.cells.base`, the Jacobian's structure in
:mod:`bppsa.cells.structure`, the published cells (RNN, GRU, LSTM) in :mod:`bppsa.cells.recurrent`, the
cells with per-head (block-diagonal) recurrences (BlockRNN, BlockGRU, BlockLSTM) in
:mod:`bppsa.cells.block` (every public name of these is importable from ``bppsa.cells``), BPTT by the
analytic adjoint in :mod:`bppsa.backward.adjoint`.

Each cell's maths is written once, here; conventions in which published cells differ are
fields (activations by name, :data:`ACTIVATIONS`; input/hidden biases: PyTorch both, flax's GRU
input only, its LSTM hidden only; the SimpleCell's residual; :mod:`bppsa.nn.cells` maps
flax's layout). Row convention: a step computes ``x @ W_x + h @ W_h``, W_x: (I, G), W_h: (H, G);
gate orders are PyTorch's, (r, z, n) and (i, f, g, o). The batched methods' arrays may be in
any time order (BPPSA passes them latest step first); they only have to agree."""

from __future__ import annotations

from bppsa.cells.base import (
                              ACTIVATIONS,
                              Affine,
                              AffineAdjoint,
                              AnalyticAdjoint,
                              Cell,
                              Generic,
                              autodiff_jacobian,
                              autodiff_param_grads,
                              flat_outer,
                              gate_count,
                              split_gates,
)
from bppsa.cells.block import BlockGRU, BlockLSTM, BlockRNN, block_diagonal, recurrent_matrix
from bppsa.cells.recurrent import GRU, LSTM, RNN
from bppsa.cells.structure import Blocks, Dense, Factored, Scaled, Structure, structure_of

__all__ = ["Cell", "AnalyticAdjoint", "Affine", "AffineAdjoint", "RNN", "GRU", "LSTM", "Generic", "ACTIVATIONS",
           "BUILTIN", "autodiff_jacobian", "flat_outer", "autodiff_param_grads", "split_gates", "gate_count",
           "BlockRNN", "BlockGRU", "BlockLSTM", "block_diagonal", "recurrent_matrix",
           "Structure", "Dense", "Scaled", "Factored", "Blocks", "structure_of"]

#: The built-in recurrent cells by the name configs and commands give them (the one name → class map:
#: the self-check, the benchmarks and the harness's extensions read it).
BUILTIN: dict[str, type[RNN] | type[GRU] | type[LSTM]] = {"rnn": RNN, "gru": GRU, "lstm": LSTM}
