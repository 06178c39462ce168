"""flax.nnx modules on top of :func:`bppsa.rnn`: a drop-in for ``nnx.RNN`` (time-major with
``time_major=True``, over flax's cells or bppsa's) and the paper's sequence classifier."""

from __future__ import annotations

from typing import Unpack

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from flax.nnx.nn.recurrent import flip_sequences

from . import flax_cells
from . import options as options_lib
from .backprop import rnn
from .cells import Cell
from .errors import UsageError
from .options import OptionFields, Options

__all__ = ["RNN", "SequenceClassifier"]
PADDINGS = ("identity", "flax")


def _is_var(x):
    return isinstance(x, nnx.Variable)


class SequenceClassifier(nnx.Module):
    """The paper's classifier: :class:`RNN` -> linear head on the last (valid) hidden state.

    ``cell``: a cell from :mod:`bppsa.cells` (its parameters come from ``rngs``) or a flax
    ``nnx.RNNCellBase`` (its own parameters); ``options`` and option keywords as for :class:`RNN`.
    ``__call__(x, seq_lengths=None)``: x (B, T, I)
    batch-major (as datasets store it), seq_lengths (B,) the valid steps of a padded batch ->
    logits (B, num_classes).
    """

    def __init__(self, cell, num_classes, *, options: Options | None = None, rngs: nnx.Rngs, dtype=jnp.float32,
                 **fields: Unpack[OptionFields]):
        self.rnn = RNN(cell, options=options, rngs=rngs, param_dtype=dtype, **fields)
        hidden = cell.hidden_size if isinstance(cell, Cell) else cell.hidden_features
        self.head = nnx.Linear(hidden, num_classes, rngs=rngs, param_dtype=dtype)

    def __call__(self, x, seq_lengths=None):
        if x.ndim != 3:
            raise ValueError(f"x must have shape (B, T, I); got shape {x.shape}")
        carry, _ = self.rnn(x, seq_lengths=seq_lengths, return_carry=True)
        return self.head(self.rnn.hidden(carry))


def _check_choice(name, value, choices):
    if not isinstance(value, str) or value not in choices:
        raise UsageError(f"{name} must be one of {list(choices)}; got {value!r}")


def _seq_lengths(seq_lengths, T, B):
    """Validated seq_lengths (B,) integers in [1, T] (values checked where they are concrete), the
    number of steps the scan must run (the longest length where concrete, else T) and whether any
    row may be padded (False where concrete and every length is T)."""
    if seq_lengths is None:
        return None, T, False
    lengths = jnp.asarray(seq_lengths)
    if lengths.shape != (B,):
        raise UsageError(f"seq_lengths must have shape (B,) = ({B},) to match the inputs' batch size; "
                         f"got shape {lengths.shape}")
    if not jnp.issubdtype(lengths.dtype, jnp.integer):
        raise UsageError(f"seq_lengths must be integers; got dtype {lengths.dtype}")
    try:
        values = np.asarray(lengths)
    except (jax.errors.TracerArrayConversionError, jax.errors.ConcretizationTypeError):
        return lengths, T, True  # traced: the values cannot be checked here
    bad = values[(values < 1) | (values > T)]
    if bad.size:
        raise UsageError(f"seq_lengths must lie in [1, T] = [1, {T}] (T: the inputs' time steps); "
                         f"got {sorted(set(bad.tolist()))}")
    return lengths, int(values.max()), bool(values.min() < T)


class RNN(nnx.Module):
    """A drop-in for ``flax.nnx.RNN`` whose backward pass can be BPPSA: the same call, outputs
    and final carry, with ``backward`` choosing how gradients are computed.

    Args:
      cell: a flax ``nnx.RNNCellBase`` (``SimpleCell``, ``GRUCell``, ``LSTMCell`` and
        ``OptimizedLSTMCell`` get analytic Jacobians, any other cell autodiff ones: see
        :mod:`bppsa.flax_cells`; the gradients go to the cell's own ``nnx.Param``s), or a cell
        from :mod:`bppsa.cells` (its parameters are made here from ``rngs``, which must then be
        an ``nnx.Rngs``, in ``param_dtype``; the carry is h, for an LSTM (h, c)).
      options: a :class:`bppsa.Options`, and/or its fields as keywords (``backward``, ``scan``,
        ``chunk_size``, ``precision``, ``cost_model``), as for :func:`bppsa.rnn`.
      time_major, return_carry, reverse, keep_order, rngs: as for ``nnx.RNN``.
      padding: with ``seq_lengths``, "identity" (default): a padded step is the identity map in
        the scan (state carried unchanged, Jacobian I, no gradient), so outputs at padded steps
        repeat the last valid one; "flax": padded steps run the cell on the padding, as
        ``nnx.RNN`` does (outputs there equal ``nnx.RNN``'s). Valid outputs, the final carry (at
        each row's last valid step) and the gradients of any loss of those agree either way.
        With concrete (untraced) seq_lengths, "identity" runs the scan only max(seq_lengths)
        steps: the later ones are identity maps for every row.
      autodiff: use autodiff Jacobians even for a cell with analytic ones.

    ``__call__(inputs, *, initial_carry=None, seq_lengths=None, return_carry=None,
    time_major=None, reverse=None, keep_order=None, rngs=None)``: inputs (B, T, I) (time_major:
    (T, B, I)), seq_lengths (B,) integers in [1, T] (0 is refused: ``nnx.RNN`` would return the
    carry of step T there); returns outputs (B, T, H) (time_major:
    (T, B, H)), or (final carry, outputs) with ``return_carry``.
    """

    def __init__(self, cell, *, options: Options | None = None, time_major=False, return_carry=False, reverse=False,
                 keep_order=False, padding="identity", autodiff=False, rngs: nnx.Rngs | bool = True,
                 param_dtype=jnp.float32, **fields: Unpack[OptionFields]):
        self.options = options_lib.make(options, **fields)
        _check_choice("padding", padding, PADDINGS)
        self.cell = cell
        self.time_major, self.return_carry = time_major, return_carry
        self.reverse, self.keep_order = reverse, keep_order
        self.padding, self.autodiff = padding, autodiff
        self.rngs = nnx.data(None)
        if isinstance(cell, Cell):
            if not isinstance(rngs, nnx.Rngs):
                raise UsageError(f"RNN over a bppsa cell needs rngs=nnx.Rngs(...) for its parameters; got {rngs!r}")
            self.params = nnx.data(jax.tree.map(nnx.Param, cell.init(rngs.params(), param_dtype)))
        elif not isinstance(cell, nnx.RNNCellBase):
            raise UsageError(f"cell must be a flax nnx.RNNCellBase or a bppsa.cells cell; got {type(cell).__name__}")
        elif rngs is True:
            self.rngs = nnx.RngStream(0, tag="carry")
        elif isinstance(rngs, nnx.Rngs):
            self.rngs = rngs.carry.fork()
        elif rngs is not False:
            raise UsageError(f"rngs must be an nnx.Rngs or a bool; got {type(rngs).__name__}")

    def hidden(self, carry):
        """The hidden state h (B, H) of a final carry."""
        if isinstance(self.cell, Cell):
            return carry[0] if self.cell.pair_state else carry
        return carry[1] if isinstance(self.cell, (nnx.LSTMCell, nnx.OptimizedLSTMCell)) else carry

    def _initial_carry(self, B, I, dtype, rngs):
        if isinstance(self.cell, Cell):
            return self.cell.unflatten_state(jnp.zeros((B, self.cell.state_size), dtype))
        if rngs is None:
            rngs = self.rngs
        if isinstance(rngs, nnx.Rngs):
            rngs = rngs.carry.fork()
        return self.cell.initialize_carry((B, I), rngs)

    def _cell_and_params(self, carry, I):
        if isinstance(self.cell, Cell):
            return self.cell, jax.tree.map(lambda v: v[...], self.params, is_leaf=_is_var)
        cell = flax_cells.adapt(self.cell, carry, I, autodiff=self.autodiff)
        return cell, flax_cells.params_of(cell, self.cell)

    def __call__(self, inputs, *, initial_carry=None, seq_lengths=None, return_carry=None, time_major=None,
                 reverse=None, keep_order=None, rngs=None):
        pick = lambda v, default: default if v is None else v
        return_carry, time_major = pick(return_carry, self.return_carry), pick(time_major, self.time_major)
        reverse, keep_order = pick(reverse, self.reverse), pick(keep_order, self.keep_order)
        x = jnp.asarray(inputs)
        if x.ndim != 3:
            layout = "(T, B, I)" if time_major else "(B, T, I)"
            raise UsageError(f"inputs must have shape {layout} (rank 3); got shape {x.shape}")
        xs = x if time_major else jnp.swapaxes(x, 0, 1)  # (T, B, I)
        T, B, I = xs.shape
        lengths, steps, padded = _seq_lengths(seq_lengths, T, B)
        if reverse:
            xs = flip_sequences(xs, lengths, num_batch_dims=1, time_major=True)
        carry = self._initial_carry(B, I, xs.dtype, rngs) if initial_carry is None else initial_carry
        cell, params = self._cell_and_params(carry, I)
        dtype = getattr(self.cell, "dtype", None) or jnp.result_type(xs, *jax.tree.leaves(params))
        xs, params, carry = jax.tree.map(lambda a: jnp.asarray(a).astype(dtype), (xs, params, carry))
        autodiff = isinstance(cell, flax_cells.Autodiff)
        s0 = cell.flat(carry) if autodiff else carry
        run, xs_run = cell, xs
        # identity padding: the lengths of the masked scan (None: the cell's own structure is kept)
        mask_lengths = lengths if padded and self.padding == "identity" else None
        masked = mask_lengths is not None
        if mask_lengths is not None:  # steps past every row's end are identity maps for all rows: not run at all
            mask = (jnp.arange(steps)[:, None] < mask_lengths[None, :]).astype(dtype)[..., None]
            run, xs_run = flax_cells.Masked(cell), jnp.concatenate([xs[:steps], mask], axis=-1)
        states = rnn(run, params, xs_run, s0, self.options)
        if lengths is None or masked:
            last = jax.tree.map(lambda a: a[-1], states)
        else:  # each row's last valid step
            last = jax.tree.map(lambda a: a[lengths - 1, jnp.arange(B)], states)
        if autodiff:
            outputs = cell.outputs(params, jnp.concatenate([s0[None], states[:-1]], axis=0), xs[:len(states)])
            if mask_lengths is not None:  # a padded step outputs what the last valid one did
                idx = jnp.minimum(jnp.arange(T)[:, None], mask_lengths[None, :] - 1)
                outputs = jax.tree.map(lambda y: y[idx, jnp.arange(B)], outputs)
            last = cell.carry(last)
        else:
            outputs = cell.hidden(states)
            if masked and steps < T:  # every row holds its last valid output
                outputs = jnp.concatenate([outputs, jnp.broadcast_to(outputs[-1:], (T - steps,) + outputs.shape[1:])])
        if reverse and keep_order:
            outputs = jax.tree.map(lambda y: flip_sequences(y, lengths, num_batch_dims=1, time_major=True), outputs)
        if not time_major:
            outputs = jax.tree.map(lambda y: jnp.swapaxes(y, 0, 1), outputs)
        return (last, outputs) if return_carry else outputs
