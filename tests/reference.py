"""The one reference every gradient test compares against: a plain ``lax.scan`` over
``cell.step`` (no unroll, no custom VJP), differentiated by JAX's autodiff."""

from __future__ import annotations

import jax
from jax import lax


def scan_states(cell, params, xs, h0):
    """xs (T, B, I), h0 (B, H) [LSTM: a pair] -> the states after each step, hs[t] = h_{t+1}
    (the structure of h0 with a leading T axis): what :func:`bppsa.rnn` must return."""

    def body(h, x):
        h = cell.step(params, h, x)
        return h, h

    return lax.scan(body, h0, xs)[1]


def scan_grads(cell, params, xs, h0, loss):
    """Autodiff's gradients of ``loss(states)`` through :func:`scan_states`, w.r.t. (params, xs, h0)."""
    return jax.grad(lambda p, x, h: loss(scan_states(cell, p, x, h)), argnums=(0, 1, 2))(params, xs, h0)


def grads_of(run, params, xs, h0, loss):
    """Autodiff's gradients of ``loss(run(params, xs, h0))`` w.r.t. (params, xs, h0): the same loss
    through the method under test that :func:`scan_grads` takes through the reference."""
    return jax.grad(lambda p, x, h: loss(run(p, x, h)), argnums=(0, 1, 2))(params, xs, h0)


def rnn_grads(cell, params, xs, h0, loss, **options):
    """:func:`grads_of` through ``bppsa.rnn(cell, ..., **options)``, the method under test."""
    import bppsa
    return grads_of(lambda p, x, h: bppsa.rnn(cell, p, x, h, **options), params, xs, h0, loss)


def loss_of(run, loss=None):
    """``(params, xs, h0) -> loss(run(params, xs, h0))`` (default: :func:`tests.helpers.states_loss`), to
    differentiate by any rule (grad, jvp, Hessians)."""
    if loss is None:
        from tests.helpers import states_loss as loss
    return lambda p, x, h: loss(run(p, x, h))
