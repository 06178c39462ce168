"""BPTT's adjoint loop as one fused Pallas kernel: the gradient recurrence of an RNN, GRU or LSTM
run backwards over all T steps in one launch, W_h resident, as :mod:`bppsa.kernels.recurrence`
runs the forward.

The loop is g_t = ct_t + (g_{t+1} through step t + 1), from the last step. An Elman RNN's step
needs nothing but its saved output: g_{t-1} = (g_t ⊙ σ'(a_t)) W_hᵀ with σ' written in terms of h_t
(tanh: 1 − h_t²), one product a step and no recomputation. A GRU's and an LSTM's gates are not
functions of the saved states, so per step the kernel recomputes them from the state before the
step (s_{t-1}) and the projected input (x_t W_x + b_x, one product before the kernel), and pulls
g_t back through them to s_{t-1}, one product with W_hᵀ per gate. That pull-back is JAX's own
vector–Jacobian product of the kernel's step function (:func:`bppsa.kernels.recurrence.step`: the
cell's ``gate_step``), traced inside the kernel: the kernel's backward is the derivative of exactly
the step its forward runs. Either loop loads the next step's operands (cotangent, saved state,
projected input) a step ahead, in its carry. The kernel writes out every g_t; the parameter and
input gradients are then one batched contraction over all steps, outside it
(:meth:`bppsa.cells.Cell.param_grads`: cuDNN's split of the backward into data and weights).

Same backend, padding and precision as the forward kernel: padded units and batch rows carry zero
cotangents and stay zero (their weights are zero), so the real gradients are exact.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
from jax import Array, lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pl_triton

from bppsa.cells import GRU, RNN, Cell, gate_count
from bppsa.kernels.lowering import gpu_only
from bppsa.kernels.recurrence import (
    BATCH_TILE,
    HIDDEN_LIMITS,
    MAX_HIDDEN,
    compute_dtype,
    dot,
    operands,
    pad_to,
    step,
    supports,
    warps_for,
)

__all__ = ["fused_adjoint"]


def _kernel(*refs, cell: Cell, T: int, gates: int, parts: int):
    """One program: the refs are the G projected inputs (T, bt, Hp), the G blocks of W_h (Hp, Hp),
    their biases (Hp,), the states before each step (parts of (T, bt, Hp)), the cotangents of the
    states after each step (parts of (T, bt, Hp)); then the outputs, the adjoint states g_t (parts
    of (T, bt, Hp)) and ∂L/∂s_0 (parts of (bt, Hp))."""
    u_refs, w_refs, b_refs = refs[:gates], refs[gates:2 * gates], refs[2 * gates:3 * gates]
    k = 3 * gates
    sp_refs, ct_refs = refs[k:k + parts], refs[k + parts:k + 2 * parts]
    gs_refs, g0_refs = refs[k + 2 * parts:k + 3 * parts], refs[k + 3 * parts:]
    ws = tuple(r[...] for r in w_refs)  # resident for the whole loop
    bs = tuple(r[...] for r in b_refs)
    read = lambda t: tuple(tuple(r[t] for r in rs) for rs in (ct_refs, sp_refs, u_refs))  # noqa: E731

    def body(i, carry):
        g, (ct, sp, us) = carry
        t = T - 1 - i  # the loop runs forward; the steps backward (Triton has no reverse loop)
        ahead = read(jnp.maximum(t - 1, 0))  # the next step's operands, issued a step ahead
        g = tuple(a + c for a, c in zip(g, ct, strict=True))
        for ref, part in zip(gs_refs, g, strict=True):
            ref[t] = part
        _, pull = jax.vjp(lambda *state: step(cell, ws, bs, us, state), *sp)
        return pull(g), ahead

    zero = tuple(jnp.zeros(r.shape[1:], r.dtype) for r in ct_refs)
    g, _ = lax.fori_loop(0, T, body, (zero, read(T - 1)))
    for ref, part in zip(g0_refs, g, strict=True):
        ref[...] = part


def _rnn_kernel(*refs, cell: RNN, T: int):
    """An Elman RNN's adjoint from its saved states, nothing recomputed: g_{t-1} = (g_t ⊙ σ'(a_t)) W_hᵀ
    [+ g_t ⊙ σ'(a_t), residual], σ' written in terms of the step's output h_t (tanh: 1 − h_t²). The
    refs are W_hᵀ (Hp, Hp), the states after each step h_t (T, bt, Hp) and their cotangents (T, bt,
    Hp); then the outputs g_t (T, bt, Hp) and ∂L/∂h_0 (bt, Hp)."""
    wt_ref, h_ref, ct_ref, gs_ref, g0_ref = refs
    wt, residual = wt_ref[...], cell.residual

    def body(i, carry):
        g, ct, h = carry
        t = T - 1 - i
        prev = jnp.maximum(t - 1, 0)
        ct_ahead, h_ahead = ct_ref[prev], h_ref[prev]  # the next step's, issued a step ahead
        g = g + ct
        gs_ref[t] = g
        da = g * cell.output_derivative(h)
        return (dot(da, wt) + da if residual else dot(da, wt)), ct_ahead, h_ahead

    g, _, _ = lax.fori_loop(0, T, body, (jnp.zeros(ct_ref.shape[1:], ct_ref.dtype), ct_ref[T - 1], h_ref[T - 1]))
    g0_ref[...] = g


@functools.partial(jax.jit, static_argnames=("cell", "interpret", "num_warps"))
def fused_adjoint(cell: Cell, params: Any, xs: Array, s0: Array, ss: Array, ct: Array, *,
                  interpret: bool = False, num_warps: int | None = None) -> tuple[Array, Array]:
    """The adjoint states of BPTT, g_t = ∂L/∂s_t for the cotangent ct of the states ss, by one
    fused kernel (the module docstring).

    Args:
      cell: a cell :func:`bppsa.kernels.recurrence.supports` accepts (its
        :attr:`bppsa.cells.Cell.kernel_cell` runs).
      params: its parameters.
      xs: (T, B, I) inputs, time-major.
      s0: (B, S) the flat initial state.
      ss: (T, B, S) the flat states after each step (the forward's).
      ct: (T, B, S) the cotangents of ss.

      interpret: run the kernel in Pallas's interpret mode (any backend).
      num_warps: Triton warps per program (None: :func:`bppsa.kernels.recurrence.warps_for` the
        padded hidden size and gates).

    Returns:
      (gs, g0), gs (T, B, S) the adjoint states in time order (ct_t included) and g0 (B, S) =
      ∂L/∂s0, in ss's dtype.

    Raises:
      ValueError: a cell the kernel does not run.
    """
    if not supports(cell):
        raise ValueError(f"the fused adjoint runs bppsa.cells.RNN and LSTM with hidden_size <= {MAX_HIDDEN} "
                         f"and GRU with hidden_size <= {HIDDEN_LIMITS[GRU]}; got {cell.display_name} with "
                         f"hidden_size {cell.hidden_size}")
    cell, params = cell.kernel_cell, cell.kernel_params(params)  # the state gradients are the same
    T, B, _ = xs.shape
    if B == 0:  # no rows: no program to run
        return jnp.zeros(ss.shape, ss.dtype), jnp.zeros(s0.shape, ss.dtype)
    xs = xs if interpret else gpu_only(xs)
    H, G, dtype = cell.hidden_size, gate_count(cell), compute_dtype(ss.dtype)
    Hp, Bp, us, ws, bs = operands(cell, params, xs, dtype)

    def parts(flat):  # (..., S) flat states -> the padded (..., Bp, Hp) parts [h; LSTM: h, c]
        state = cell.unflatten_state(flat)
        return [pad_to(p, p.shape[:-2] + (Bp, Hp)) for p in (state if cell.pair_state else (state,))]

    cts = parts(ct.astype(dtype))
    seq = pl.BlockSpec((T, BATCH_TILE, Hp), lambda i: (0, i, 0))
    params_ = pl_triton.CompilerParams(num_warps=num_warps or warps_for(Hp, G), num_stages=1)
    if type(cell) is RNN:  # the saved states are all it needs: no step recomputed
        row = pl.BlockSpec((BATCH_TILE, Hp), lambda i: (i, 0))
        gs, g0 = pl.pallas_call(
            functools.partial(_rnn_kernel, cell=cell, T=T),
            out_shape=[jax.ShapeDtypeStruct((T, Bp, Hp), dtype), jax.ShapeDtypeStruct((Bp, Hp), dtype)],
            grid=(Bp // BATCH_TILE,), in_specs=[pl.BlockSpec((Hp, Hp), lambda i: (0, 0)), seq, seq],
            out_specs=[seq, row], interpret=interpret, compiler_params=params_,
        )(ws[0].T, *parts(ss.astype(dtype)), *cts)
        return gs[:, :B, :H].astype(ss.dtype), g0[:B, :H].astype(ss.dtype)
    sp = parts(jnp.concatenate([s0[None], ss[:-1]], axis=0).astype(dtype))
    P = len(sp)
    specs = ([seq] * G + [pl.BlockSpec((Hp, Hp), lambda i: (0, 0))] * G + [pl.BlockSpec((Hp,), lambda i: (0,))] * G
             + [seq] * (2 * P))
    out = pl.pallas_call(
        functools.partial(_kernel, cell=cell, T=T, gates=G, parts=P),
        out_shape=[jax.ShapeDtypeStruct((T, Bp, Hp), dtype)] * P + [jax.ShapeDtypeStruct((Bp, Hp), dtype)] * P,
        grid=(Bp // BATCH_TILE,),
        in_specs=specs,
        out_specs=[seq] * P + [pl.BlockSpec((BATCH_TILE, Hp), lambda i: (i, 0))] * P,
        interpret=interpret,
        compiler_params=params_,
    )(*us, *ws, *bs, *sp, *cts)
    gs, g0 = [o[:, :B, :H] for o in out[:P]], [o[:B, :H] for o in out[P:]]
    flat = lambda p: cell.flatten_state(tuple(p) if cell.pair_state else p[0]).astype(ss.dtype)  # noqa: E731
    return flat(gs), flat(g0)
