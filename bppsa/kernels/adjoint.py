"""BPTT's adjoint loop as one fused Pallas kernel: the gradient recurrence of an RNN, GRU or LSTM
run backwards over all T steps in one launch, W_h resident, as :mod:`bppsa.kernels.recurrence`
runs the forward.

The loop is g_t = ct_t + (g_{t+1} through step t + 1), from the last step: per step the kernel
recomputes the step's gates from the saved state before it (s_{t-1}) and the projected input
(x_t W_x + b_x, one product before the kernel), and pulls g_t back through them to s_{t-1}, one
product with W_hᵀ per gate. That pull-back is JAX's own vector–Jacobian product of the kernel's
step function (:func:`bppsa.kernels.recurrence.step`: the cell's ``gate_step``), traced inside the kernel: the kernel's
backward is the derivative of exactly the step its forward runs. The kernel writes out every g_t;
the parameter and input gradients are then one batched contraction over all steps, outside it
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

from bppsa.cells import GRU, Cell, gate_count
from bppsa.kernels.lowering import gpu_only
from bppsa.kernels.recurrence import (
    BATCH_TILE,
    HIDDEN_LIMITS,
    MAX_HIDDEN,
    compute_dtype,
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

    def body(i, g):
        t = T - 1 - i  # the loop runs forward; the steps backward (Triton has no reverse loop)
        g = tuple(a + r[t] for a, r in zip(g, ct_refs, strict=True))
        for ref, part in zip(gs_refs, g, strict=True):
            ref[t] = part
        us = tuple(r[t] for r in u_refs)
        _, pull = jax.vjp(lambda *state: step(cell, ws, bs, us, state), *(r[t] for r in sp_refs))
        return pull(g)

    g = lax.fori_loop(0, T, body, tuple(jnp.zeros(r.shape[1:], r.dtype) for r in ct_refs))
    for ref, part in zip(g0_refs, g, strict=True):
        ref[...] = part


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
        padded hidden size).

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

    sp = parts(jnp.concatenate([s0[None], ss[:-1]], axis=0).astype(dtype))
    cts = parts(ct.astype(dtype))
    P = len(sp)
    seq = pl.BlockSpec((T, BATCH_TILE, Hp), lambda i: (0, i, 0))
    specs = ([seq] * G + [pl.BlockSpec((Hp, Hp), lambda i: (0, 0))] * G + [pl.BlockSpec((Hp,), lambda i: (0,))] * G
             + [seq] * (2 * P))
    out = pl.pallas_call(
        functools.partial(_kernel, cell=cell, T=T, gates=G, parts=P),
        out_shape=[jax.ShapeDtypeStruct((T, Bp, Hp), dtype)] * P + [jax.ShapeDtypeStruct((Bp, Hp), dtype)] * P,
        grid=(Bp // BATCH_TILE,),
        in_specs=specs,
        out_specs=[seq] * P + [pl.BlockSpec((BATCH_TILE, Hp), lambda i: (i, 0))] * P,
        interpret=interpret,
        compiler_params=pl_triton.CompilerParams(num_warps=num_warps or warps_for(Hp), num_stages=1),
    )(*us, *ws, *bs, *sp, *cts)
    gs, g0 = [o[:, :B, :H] for o in out[:P]], [o[:B, :H] for o in out[P:]]
    flat = lambda p: cell.flatten_state(tuple(p) if cell.pair_state else p[0]).astype(ss.dtype)  # noqa: E731
    return flat(gs), flat(g0)
