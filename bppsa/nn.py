"""flax.nnx modules on top of :func:`bppsa.rnn`: a recurrent layer and a sequence classifier."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from .backprop import rnn

__all__ = ["Recurrent", "SequenceClassifier"]


def _is_var(x):
    return isinstance(x, nnx.Variable)


class Recurrent(nnx.Module):
    """A recurrent layer around any cell, with a choice of backward pass.

    Args:
      cell: a cell from :mod:`bppsa.cells` (static: it holds no arrays).
      backward: "bppsa" | "bptt" | "auto"; scan: "blelloch" | "associative" | "sequential".
      cost_model: a :class:`bppsa.cost.CostModel` for ``backward="auto"`` (None: the calibration
        cached for this device, else BPTT; see :func:`bppsa.cost.choose_backward`).
      rngs: ``nnx.Rngs``; the parameters come from ``cell.init(rngs.params(), dtype)``.

    ``__call__(xs, h0=None)``: xs (T, B, I) time-major, h0 (B, H) [LSTM: (h0, c0)] or zeros;
    returns hs (T, B, H) [LSTM: (hs, cs)].
    """

    def __init__(self, cell, *, backward="bppsa", scan="blelloch", cost_model=None, rngs: nnx.Rngs,
                 dtype=jnp.float32):
        self.cell = cell
        self.backward = backward
        self.scan = scan
        self.cost_model = cost_model
        self.params = nnx.data(jax.tree.map(nnx.Param, cell.init(rngs.params(), dtype)))

    def cell_params(self):
        """The cell's parameter pytree as plain arrays."""
        return jax.tree.map(lambda v: v[...], self.params, is_leaf=_is_var)

    def initial_state(self, batch_size, dtype):
        return self.cell.unflatten_state(jnp.zeros((batch_size, self.cell.state_size), dtype))

    def __call__(self, xs, h0=None):
        if h0 is None:
            h0 = self.initial_state(xs.shape[1], xs.dtype)
        return rnn(self.cell, self.cell_params(), xs, h0, backward=self.backward, scan=self.scan,
                   cost_model=self.cost_model)


class SequenceClassifier(nnx.Module):
    """The paper's classifier: recurrent layer -> linear head on the last hidden state.

    ``__call__(x)``: x (B, T, I) batch-major (as datasets store it) -> logits (B, num_classes).
    """

    def __init__(self, cell, num_classes, *, backward="bppsa", scan="blelloch", cost_model=None,
                 rngs: nnx.Rngs, dtype=jnp.float32):
        self.rnn = Recurrent(cell, backward=backward, scan=scan, cost_model=cost_model, rngs=rngs, dtype=dtype)
        self.head = nnx.Linear(cell.hidden_size, num_classes, rngs=rngs, param_dtype=dtype)

    def __call__(self, x):
        if x.ndim != 3:
            raise ValueError(f"x must have shape (B, T, I); got shape {x.shape}")
        hs = self.rnn.cell.hidden(self.rnn(jnp.swapaxes(x, 0, 1)))
        return self.head(hs[-1])
