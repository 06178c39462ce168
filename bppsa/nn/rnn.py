"""flax.nnx modules on top of :func:`bppsa.rnn`: a drop-in for ``nnx.RNN`` (the same arguments,
outputs, carry and state updates, for any cell ``nnx.RNN`` drives, with ``backward`` choosing
how gradients are computed) and the paper's sequence classifier."""

from __future__ import annotations

import math
import warnings
from typing import Any, cast

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from flax.nnx.nn.recurrent import flip_sequences

from bppsa.backprop import rnn
from bppsa.cells import Cell
from bppsa.errors import UsageError
from bppsa.nn import cells as flax_cells
from bppsa.nn.block_cells import BlockGRUCell, BlockLSTMCell, BlockSimpleCell
from bppsa.plan import options as options_lib
from bppsa.plan.options import Options, Plan

__all__ = ["RNN", "SequenceClassifier", "BPTTFallbackWarning", "BlockSimpleCell", "BlockGRUCell", "BlockLSTMCell"]
PADDINGS = ("flax", "identity")


class BPTTFallbackWarning(UserWarning):
    """:class:`RNN` runs a cell with ``nnx.RNN``'s scan (gradients by BPTT) because no exact BPPSA
    backward exists for it; the message names the cell and the reason (once per cell and reason)."""


_WARNED: set[tuple[str, str]] = set()


def _is_var(x):
    return isinstance(x, nnx.Variable)


class SequenceClassifier(nnx.Module):
    """The paper's classifier: :class:`RNN` -> linear head on the last (valid) hidden state.

    ``__call__(x, seq_lengths=None)``: x (B, T, I) batch-major (as datasets store it), seq_lengths
    (B,) the valid steps of a padded batch -> logits (B, num_classes); a ValueError where x is not
    of rank 3.

    Args:
      cell: a cell from :mod:`bppsa.cells` (its parameters come from ``rngs``) or a flax
        ``nnx.RNNCellBase`` (its own parameters).
      num_classes: the width of the linear head's output.
      options: a :class:`bppsa.Options`, as for :class:`RNN`.
      rngs: the ``nnx.Rngs`` of the head's parameters (and of a :mod:`bppsa.cells` cell's), as for :class:`RNN`.
      dtype: the dtype of the head's parameters and of a :mod:`bppsa.cells` cell's.
      **fields: :class:`bppsa.Options` fields as keywords, as for :class:`RNN`.

    Examples:
      >>> import jax.numpy as jnp, bppsa
      >>> from flax import nnx
      >>> model = bppsa.nn.SequenceClassifier(bppsa.cells.GRU(3, 4), num_classes=5, rngs=nnx.Rngs(0))
      >>> x = jnp.ones((2, 7, 3))                                # (B, T, I), batch-major
      >>> model(x).shape                                         # logits (B, num_classes)
      (2, 5)
      >>> model(x, seq_lengths=jnp.array([7, 3])).shape          # a padded batch
      (2, 5)
    """

    def __init__(self, cell: Cell | nnx.Module, num_classes: int, *, options: Options | Plan | None = None,
                 rngs: nnx.Rngs, dtype: Any = jnp.float32, **fields: Any):
        self.rnn = RNN(cell, options=options, rngs=rngs, param_dtype=dtype, **fields)
        hidden = cell.hidden_size if isinstance(cell, Cell) else cast(Any, cell).hidden_features
        self.head = nnx.Linear(hidden, num_classes, rngs=rngs, param_dtype=dtype)

    def __call__(self, x, seq_lengths=None):
        if x.ndim != 3:
            raise ValueError(f"x must have shape (B, T, I); got shape {x.shape}")
        carry, _ = self.rnn(x, seq_lengths=seq_lengths, return_carry=True)
        return self.head(self.rnn.hidden(carry))


def _check_choice(name, value, choices):
    if not isinstance(value, str) or value not in choices:
        raise UsageError(f"{name} must be one of {list(choices)}; got {value!r}")


def _seq_lengths(seq_lengths, T, batch):
    """Validated seq_lengths (``batch`` shape, integers in [0, T], values checked where they are
    concrete) flattened to (B,), the number of steps the identity-padded scan must run (the
    longest length where concrete, else T; at least 1) and whether any row may be padded."""
    if seq_lengths is None:
        return None, T, False
    lengths = jnp.asarray(seq_lengths)
    if lengths.shape != batch:
        raise UsageError(f"seq_lengths must have the inputs' batch shape {batch}; got shape {lengths.shape}")
    if not jnp.issubdtype(lengths.dtype, jnp.integer):
        raise UsageError(f"seq_lengths must be integers; got dtype {lengths.dtype}")
    lengths = lengths.reshape(-1)
    try:
        values = np.asarray(lengths)
    except (jax.errors.TracerArrayConversionError, jax.errors.ConcretizationTypeError):
        return lengths, T, True  # traced: the values cannot be checked here
    bad = values[(values < 0) | (values > T)]
    if bad.size:
        raise UsageError(f"seq_lengths must lie in [0, T] = [0, {T}] (T: the inputs' time steps); "
                         f"got {sorted(set(bad.tolist()))}")
    return lengths, max(int(values.max(initial=0)), 1), bool(values.min(initial=T) < T)


def _describe(tree) -> str:
    shapes = jax.tree.map(lambda a: tuple(jnp.shape(a)), tree)
    return f"{type(tree).__name__} {shapes}" if isinstance(tree, (tuple, list, dict)) else f"shape {shapes}"


class RNN(nnx.Module):
    """A drop-in for ``flax.nnx.RNN`` whose backward pass can be BPPSA: the same arguments with
    the same meaning, and the same outputs, final carry and state updates, for any cell
    ``nnx.RNN`` can drive; ``backward`` (and the other :class:`bppsa.Options` fields) choose how
    gradients are computed.

    Args:
      cell: anything ``nnx.RNN`` takes: an ``nnx.RNNCellBase`` or any module with ``__call__``,
        ``initialize_carry`` and ``num_feature_axes`` (flax's four cells in one dtype get
        analytic Jacobians, others autodiff ones: :mod:`bppsa.nn.cells`; gradients go to the
        cell's own ``nnx.Param`` arrays); or a cell from :mod:`bppsa.cells` (its parameters are made
        here from ``rngs``, which must then be an ``nnx.Rngs``, in ``param_dtype``; the carry is
        h, for an LSTM (h, c)). A cell whose step changes its own state (an RNG stream it draws
        from, as recurrent dropout does; batch statistics), reads non-float state, or has state
        that ``state_axes`` scans over time runs ``nnx.RNN``'s own scan: outputs, carry and state
        updates are ``nnx.RNN``'s, gradients BPTT's, and a :class:`BPTTFallbackWarning` says so.
      options: a :class:`bppsa.Options`, and/or its fields as keywords (``backward``, ``scan``,
        ``chunk_size``, ``precision``, ``cost_model``, ``unroll``), as for :func:`bppsa.rnn`.
      time_major, return_carry, reverse, keep_order, state_axes, broadcast_rngs, rngs: as for
        ``nnx.RNN``.
      unroll (an option field): as for ``nnx.RNN``, the unroll factor of the sequential forward's ``lax.scan``, and
        so of BPTT's (an int, or True for every step); None (default): tuned per shape
        (``nnx.RNN``'s default is 1).
      padding: with ``seq_lengths``, "flax" (default): padded steps run the cell on the padding,
        as ``nnx.RNN`` does (outputs equal ``nnx.RNN``'s at every step; the final carry is each
        row's at its last valid step, and for a length 0 the carry after step T, as
        ``nnx.RNN``'s). "identity": a padded step is the identity map in the scan (state carried
        unchanged, Jacobian I, no gradient), so outputs at padded steps repeat the last valid
        one, a row of length 0 keeps its initial carry, and with concrete seq_lengths the scan
        runs only max(seq_lengths) steps (faster for ragged batches). Valid outputs and the
        final carry of rows of length >= 1, and the gradients of any loss of those, agree.
      autodiff: use autodiff Jacobians even for a cell with analytic ones.
      param_dtype: the dtype of a :mod:`bppsa.cells` cell's parameters (flax cells keep their own).
      **fields: :class:`bppsa.Options` fields as keywords, overriding ``options``'s.

    ``__call__(inputs, *, initial_carry=None, seq_lengths=None, return_carry=None,
    time_major=None, reverse=None, keep_order=None, rngs=None)``: as ``nnx.RNN``'s. inputs
    ``(*batch, T, *features)`` (time_major: ``(T, *batch, *features)``), any number of batch axes (none
    included) and the cell's ``num_feature_axes`` feature axes; seq_lengths ``(*batch)`` integers in
    [0, T]; returns outputs ``(*batch, T, ...)`` (time_major: ``(T, *batch, ...)``), or (final carry,
    outputs) with ``return_carry``.

    Raises:
      bppsa.errors.UsageError: on construction, an unknown option or ``padding``, a ``cell`` that is
      neither a :mod:`bppsa.cells` cell nor a module ``nnx.RNN`` can drive, or ``rngs`` of the wrong kind;
      on a call, inputs without a time step or feature axes, ``seq_lengths`` or ``initial_carry`` that do
      not fit the inputs.

    Examples:
      Over one of flax's cells, with ``nnx.RNN``'s outputs and its cell's own parameters:

      >>> import jax, jax.numpy as jnp, bppsa
      >>> from flax import nnx
      >>> layer = bppsa.nn.RNN(nnx.GRUCell(3, 4, rngs=nnx.Rngs(0)), backward="bppsa")
      >>> x = jnp.ones((2, 5, 3))                                # (B, T, I)
      >>> y = layer(x)
      >>> y.shape
      (2, 5, 4)
      >>> bool(jnp.allclose(y, nnx.RNN(layer.cell)(x), atol=1e-6))
      True
      >>> grads = nnx.grad(lambda m: m(x).sum())(layer)          # through BPPSA's scan
      >>> grads["cell"]["dense_h"]["kernel"].shape          # (H, 3H), flax's layout
      (4, 12)

      Over a :mod:`bppsa.cells` cell (its parameters made here), with the final carry:

      >>> layer = bppsa.nn.RNN(bppsa.cells.LSTM(3, 4), rngs=nnx.Rngs(0), return_carry=True)
      >>> (h, c), y = layer(x)
      >>> h.shape, y.shape
      ((2, 4), (2, 5, 4))
    """

    def __init__(self, cell: Cell | nnx.Module, *, options: Options | Plan | None = None, time_major: bool = False,
                 return_carry: bool = False, reverse: bool = False, keep_order: bool = False,
                 state_axes: Any = None, broadcast_rngs: Any = None, padding: str = "flax", autodiff: bool = False,
                 rngs: nnx.Rngs | bool = True, param_dtype: Any = jnp.float32, **fields: Any):
        self.options = options_lib.make(options, **fields)
        _check_choice("padding", padding, PADDINGS)
        self.cell: Any = cell  # a bppsa cell, or any module nnx.RNN drives (read by duck typing)
        self.time_major, self.return_carry = time_major, return_carry
        self.reverse, self.keep_order = reverse, keep_order
        self.state_axes, self.broadcast_rngs = state_axes, broadcast_rngs
        self.padding, self.autodiff = padding, autodiff
        self.rngs = nnx.data(None)
        if isinstance(cell, Cell):
            if not isinstance(rngs, nnx.Rngs):
                raise UsageError(f"RNN over a bppsa cell needs rngs=nnx.Rngs(...) for its parameters; got {rngs!r}")
            self.params = nnx.data(jax.tree.map(nnx.Param, cell.init(rngs.params(), param_dtype)))
            return
        missing = [a for a in ("__call__", "initialize_carry", "num_feature_axes") if not hasattr(cell, a)]
        if not isinstance(cell, nnx.Module) or missing:
            raise UsageError(f"cell must be an nnx.Module with __call__, initialize_carry and num_feature_axes "
                             f"(as nnx.RNN needs; e.g. an nnx.RNNCellBase), or a bppsa.cells cell; got "
                             f"{type(cell).__name__}" + (f" without {', '.join(missing)}" if missing else ""))
        if rngs is True:
            self.rngs = nnx.RngStream(0, tag="carry")
        elif isinstance(rngs, nnx.Rngs):
            self.rngs = rngs.carry.fork()
        elif rngs is not False:
            raise UsageError(f"rngs must be an nnx.Rngs or a bool; got {type(rngs).__name__}")

    def hidden(self, carry):
        """The hidden state h (B, H) of a final carry.

        Args:
          carry: a final carry, as this RNN's ``__call__`` returns it with ``return_carry``.

        Returns:
          h (B, H) (for an LSTM carry, its h).
        """
        if isinstance(self.cell, Cell):
            return carry[0] if self.cell.pair_state else carry
        return carry[1] if isinstance(self.cell, (nnx.LSTMCell, nnx.OptimizedLSTMCell, BlockLSTMCell)) else carry

    def _layout(self, shape, time_major):
        """(time axis, batch shape, feature shape) of inputs of ``shape``, as ``nnx.RNN`` reads them."""
        n_feat = 1 if isinstance(self.cell, Cell) else self.cell.num_feature_axes
        form = "(T, *batch, *features)" if time_major else "(*batch, T, *features)"
        if len(shape) < n_feat + 1:
            raise UsageError(f"inputs must have shape {form} with {n_feat} feature axis(es) "
                             f"(the cell's num_feature_axes); got shape {shape}")
        time_axis = 0 if time_major else len(shape) - n_feat - 1
        batch = shape[1:len(shape) - n_feat] if time_major else shape[:time_axis]
        if shape[time_axis] == 0:
            raise UsageError(f"inputs must have at least one time step; got shape {shape} (layout {form})")
        return time_axis, tuple(batch), tuple(shape[len(shape) - n_feat:])

    def _initial_carry(self, batch, features, dtype, rngs):
        if isinstance(self.cell, Cell):
            zeros = jnp.zeros(batch + (self.cell.state_size,), dtype)
            return self.cell.unflatten_state(zeros)
        if rngs is None:
            rngs = self.rngs
        if isinstance(rngs, nnx.Rngs):
            rngs = rngs.carry.fork()
        return self.cell.initialize_carry(batch + features, rngs)

    def _check_carry(self, carry, batch, features):
        """initial_carry must have the structure and shapes ``initialize_carry`` gives."""
        name = type(self.cell).__name__
        try:
            want = jax.eval_shape(lambda: self._initial_carry(batch, features, jnp.float32, nnx.Rngs(0)))
        except Exception:  # noqa: BLE001  (a custom initialize_carry that cannot be traced: nothing to compare)
            return
        got_leaves, got_def = jax.tree.flatten(carry)
        want_leaves, want_def = jax.tree.flatten(want)
        same = got_def == want_def and all(tuple(jnp.shape(g)) == w.shape for g, w in zip(got_leaves, want_leaves))
        if not same:
            form = ("(c, h), each" if isinstance(self.cell, (nnx.LSTMCell, nnx.OptimizedLSTMCell))
                    else "(h, c), each" if isinstance(self.cell, Cell) and self.cell.pair_state else "")
            made = f"{name}.initialize_carry({batch + features})" if not isinstance(self.cell, Cell) else "zeros"
            shape = want_leaves[0].shape if form or len(want_leaves) == 1 else _describe(want)
            raise UsageError(f"initial_carry must be {name}'s carry {form} of shape {shape} for inputs of batch shape "
                             f"{batch} (as {made} makes it); got {_describe(carry)}".replace("  ", " "))

    def _cell_and_params(self, carry, x, steps):
        if isinstance(self.cell, Cell):
            return self.cell, jax.tree.map(lambda v: v[...], self.params, is_leaf=_is_var)
        return flax_cells.plan(self.cell, carry, x, steps=steps, autodiff=self.autodiff,
                               broadcast_rngs=self.broadcast_rngs, state_axes=self.state_axes)

    def _nnx_rnn(self, reason, inputs, carry, **kw):
        """``nnx.RNN`` itself over the same cell (no BPPSA backward: ``reason``), warned once."""
        key = (type(self.cell).__name__, reason)
        if key not in _WARNED:
            _WARNED.add(key)
            warnings.warn(f"bppsa.nn.RNN runs {key[0]} with nnx.RNN's scan (gradients by BPTT, not BPPSA): "
                          f"{reason}", BPTTFallbackWarning, stacklevel=3)
        unroll = self.options.unroll if self.options.unroll is not None else 1
        module = nnx.RNN(self.cell, unroll=unroll, state_axes=self.state_axes, broadcast_rngs=self.broadcast_rngs,
                         rngs=False)
        return module(inputs, initial_carry=carry, **kw)

    def __call__(self, inputs, *, initial_carry=None, seq_lengths=None, return_carry=None, time_major=None,
                 reverse=None, keep_order=None, rngs=None):
        pick = lambda v, default: default if v is None else v
        return_carry, time_major = pick(return_carry, self.return_carry), pick(time_major, self.time_major)
        reverse, keep_order = pick(reverse, self.reverse), pick(keep_order, self.keep_order)
        x = jnp.asarray(inputs)
        time_axis, batch, features = self._layout(x.shape, time_major)
        T = x.shape[time_axis]
        lengths, steps, padded = _seq_lengths(seq_lengths, T, batch)
        carry = self._initial_carry(batch, features, x.dtype, rngs) if initial_carry is None else initial_carry
        self._check_carry(carry, batch, features)
        B = math.prod(batch)
        xs = jnp.moveaxis(x, time_axis, 0).reshape((T, B) + features)  # (T, B, *features)
        carry_b = jax.tree.map(lambda a: jnp.reshape(a, (B,) + jnp.shape(a)[len(batch):]), carry)
        planned = self._cell_and_params(carry_b, xs[0], T)
        if isinstance(planned, str):
            return self._nnx_rnn(planned, inputs, carry, seq_lengths=seq_lengths, return_carry=return_carry,
                                 time_major=time_major, reverse=reverse, keep_order=keep_order)
        run = self._run
        if self.broadcast_rngs is not None:  # as nnx.RNN: the broadcast streams split once per call
            run = nnx.split_rngs(splits=1, only=self.broadcast_rngs, squeeze=True)(run)
        last, outputs = run(self.cell, planned, xs, carry_b, lengths, steps, padded, reverse, keep_order)
        unbatch = lambda a, n: jnp.reshape(a, a.shape[:n] + batch + a.shape[n + 1:])
        outputs = jax.tree.map(lambda y: jnp.moveaxis(unbatch(y, 1), 0, time_axis), outputs)
        return (jax.tree.map(lambda a: unbatch(a, 0), last), outputs) if return_carry else outputs

    def _run(self, flax_cell, planned, xs, carry, lengths, steps, padded, reverse, keep_order):
        """The scan on flattened batches: xs ``(T, B, *features)`` -> (final carry, outputs (T, B, ...))."""
        cell, params = planned
        T, B = xs.shape[:2]
        x0, xs = xs[0], xs.reshape(T, B, -1)
        if reverse:
            xs = flip_sequences(xs, lengths, num_batch_dims=1, time_major=True)
        autodiff, side = isinstance(cell, flax_cells.Autodiff), None
        if autodiff:  # the flax cell computes in its own dtypes (inputs as its Linear layers take them)
            if not jnp.issubdtype(xs.dtype, jnp.floating):
                dtype = jnp.result_type(*jax.tree.leaves(nnx.state(flax_cell, nnx.Param)))
                xs, x0 = xs.astype(dtype), x0.astype(dtype)
            params, side = cell.read(flax_cell, carry, x0, T)
            s0 = cell.initial(carry)
        else:
            dtype = getattr(self.cell, "dtype", None) or jnp.result_type(xs, *jax.tree.leaves(params))
            xs, params, s0 = jax.tree.map(lambda a: jnp.asarray(a).astype(dtype), (xs, params, carry))
        run, xs_run = cell, xs
        # identity padding: the lengths of the masked scan (None: the cell's own structure is kept)
        mask_lengths = lengths if padded and self.padding == "identity" else None
        if mask_lengths is not None:  # steps past every row's end are identity maps for all rows: not run at all
            mask = (jnp.arange(steps)[:, None] < mask_lengths[None, :]).astype(xs.dtype)[..., None]
            run, xs_run = flax_cells.Masked(cell), jnp.concatenate([xs[:steps], mask], axis=-1)
        states = rnn(run, params, xs_run, s0, self.options)
        if lengths is None or mask_lengths is not None:
            last = jax.tree.map(lambda a: a[-1], states)
        else:  # each row's last valid step (length 0: index -1, the carry after step T, as nnx.RNN's)
            last = jax.tree.map(lambda a: a[lengths - 1, jnp.arange(B)], states)
        if autodiff:
            outputs = cell.outputs(params, jnp.concatenate([s0[None], states[:-1]], axis=0), xs[:len(states)])
            if mask_lengths is not None:  # a padded step outputs what the last valid one did
                idx = jnp.maximum(jnp.minimum(jnp.arange(T)[:, None], mask_lengths[None, :] - 1), 0)
                outputs = jax.tree.map(lambda y: y[idx, jnp.arange(B)], outputs)
            last = cell.carry(last)
        else:
            outputs = cell.hidden(states)
            if mask_lengths is not None and steps < T:  # every row holds its last valid output
                outputs = jnp.concatenate([outputs, jnp.broadcast_to(outputs[-1:], (T - steps,) + outputs.shape[1:])])
        if reverse and keep_order:
            outputs = jax.tree.map(lambda y: flip_sequences(y, lengths, num_batch_dims=1, time_major=True), outputs)
        if side is not None:  # the state the steps changed, as nnx.RNN leaves it
            cell.write_back(flax_cell, side)
        return last, outputs
