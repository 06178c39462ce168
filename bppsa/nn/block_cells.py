"""flax.nnx front ends of :mod:`bppsa.cells.block`: recurrent cells with per-head recurrences.

:class:`BlockSimpleCell`, :class:`BlockGRUCell` and :class:`BlockLSTMCell` follow flax's
``nnx.RNNCellBase`` conventions (``__call__(carry, inputs) -> (new_carry, output)``,
``initialize_carry(input_shape, rngs)``, ``num_feature_axes``; constructor arguments
``in_features, hidden_features``, ``*_fn``, ``*_init``, ``dtype``, ``param_dtype``, ``rngs``),
so ``nnx.RNN`` drives them as it drives flax's own cells; ``head_size`` (k) is the size of
each head (k = 1: diagonal recurrence). Each holds its :mod:`bppsa.cells.block` cell's parameters
as ``nnx.Param`` arrays in that cell's layout (``W_x`` (I, G·H), ``W_h`` (H/k, k, G·k), ``b_x`` /
``b_h`` (G·H)), and its step *is* that cell's step, so :func:`bppsa.nn.cells.plan` runs it
with the cell's analytic Jacobian blocks and parameter gradients (:meth:`bppsa_cell`): ::

    rnn = bppsa.nn.RNN(BlockGRUCell(16, 64, head_size=4, rngs=nnx.Rngs(0)), backward="bppsa")

Biases as in flax's cells: SimpleCell and GRUCell on the input side only (``b_x``), the LSTM
cell on the hidden side only (``b_h``). The LSTM cell's carry is flax's (c, h).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from flax.nnx import initializers

from bppsa.cells import Cell, block, gate_count
from bppsa.errors import UsageError, as_int
from bppsa.nn.cells import ACTIVATION_NAMES

__all__ = ["BlockSimpleCell", "BlockGRUCell", "BlockLSTMCell", "head_uniform"]

_PARAMS = ("W_x", "W_h", "b_x", "b_h")


def head_uniform(key, shape, dtype=jnp.float32):
    """The default recurrent-kernel initializer: U(±1/√k) for ``W_h`` (N, k, G·k) (each unit's
    recurrent fan-in is its head's k units; :meth:`bppsa.cells.BlockRNN.init`'s).

    Args:
      key: a ``jax.random`` key.
      shape: (N, k, G·k), the shape of ``W_h``.
      dtype: the parameters' dtype.

    Returns:
      An array of ``shape`` drawn from U(±1/√k).
    """
    bound = float(shape[-2]) ** -0.5
    return jax.random.uniform(key, shape, dtype, -bound, bound)


def _name(fn, what: str) -> str:
    """An activation's name in :data:`bppsa.cells.ACTIVATIONS`, from a name or one of flax's functions."""
    if isinstance(fn, str) and fn in ACTIVATION_NAMES.values():
        return fn
    try:
        return ACTIVATION_NAMES[fn]
    except (KeyError, TypeError):
        raise UsageError(f"{what} must be one of {sorted(ACTIVATION_NAMES.values())} (a name or jax's "
                         f"function); got {fn!r}") from None


class _BlockCell(nnx.RNNCellBase):
    """The shared constructor, step and carry of the three cells."""

    _gates: int = 1
    _input_bias, _hidden_bias = True, False

    def _build(self, in_features, hidden_features, head_size, kernel_init, recurrent_kernel_init, bias_init,
               dtype, param_dtype, carry_init, rngs):
        # numpy and JAX integer scalars are stored as ints (anything else: bppsa_cell names it)
        self.in_features, self.hidden_features, self.head_size = (
            v if (n := as_int(v)) is None else n for v in (in_features, hidden_features, head_size))
        self.dtype, self.param_dtype, self.carry_init = dtype, param_dtype, carry_init
        cell = self.bppsa_cell()  # checks the sizes and activations
        G, H, head_size = gate_count(cell), self.hidden_features, self.head_size
        self.W_x = nnx.Param(kernel_init(rngs.params(), (self.in_features, G * H), param_dtype))
        self.W_h = nnx.Param(recurrent_kernel_init(rngs.params(), (H // head_size, head_size, G * head_size),
                                                   param_dtype))
        if self._input_bias:
            self.b_x = nnx.Param(bias_init(rngs.params(), (G * H,), param_dtype))
        if self._hidden_bias:
            self.b_h = nnx.Param(bias_init(rngs.params(), (G * H,), param_dtype))

    def bppsa_cell(self) -> Cell:
        """The :mod:`bppsa.cells.block` cell whose step this module computes, on parameters in the
        same layout (``nnx.state(self, nnx.Param)`` as a dict): what :func:`bppsa.nn.cells.plan`
        runs it with.

        Returns:
          The :mod:`bppsa.cells.block` cell (BlockRNN, BlockGRU or BlockLSTM) of this module's sizes and
          activations.

        Raises:
          bppsa.errors.UsageError: a size or activation the cell does not accept (the message names it).
        """
        raise NotImplementedError

    def _params(self) -> dict[str, Any]:
        return {k: getattr(self, k)[...] for k in _PARAMS if hasattr(self, k)}

    def __call__(self, carry, inputs):  # pyright: ignore[reportIncompatibleMethodOverride]  (flax's own cells do the same)
        """One step: carry ``(*batch, H)`` [the LSTM cell: (c, h)], inputs ``(*batch, I)`` -> (new carry, h').

        Args:
          carry: ``(*batch, H)`` the state [the LSTM cell: the pair (c, h), each ``(*batch, H)``].
          inputs: ``(*batch, I)`` the step's input.

        Returns:
          The pair (new carry, h'), the new carry with the structure of ``carry`` and h' ``(*batch, H)``.
        """
        params, leaves = self._params(), jax.tree.leaves(carry)
        dtype = self.dtype or jnp.result_type(inputs, *leaves, *params.values())
        cast = lambda a: jnp.asarray(a).astype(dtype)
        new = self.bppsa_cell().step(jax.tree.map(cast, params), jax.tree.map(cast, carry), cast(inputs))
        new = jax.tree.map(lambda n, c: n.astype(jnp.promote_types(c.dtype, dtype)), new, carry)
        return new, (new[1] if isinstance(new, tuple) else new)

    def initialize_carry(self, input_shape, rngs=None, carry_init=None):  # pyright: ignore[reportIncompatibleMethodOverride]
        """Zeros (or ``carry_init``'s draws) of shape ``(*batch, H)``, batch = input_shape[:-1]
        [the LSTM cell: the pair (c, h)], in ``param_dtype``; as flax's cells.

        Args:
          input_shape: ``(*batch, I)``, the shape of one step's input.
          rngs: an ``nnx.Rngs`` (its ``carry`` stream) or a stream, needed with a ``carry_init``.
          carry_init: an initializer ``init(key, shape, dtype)`` overriding the module's; None: the
            module's (zeros without one).

        Returns:
          The carry ``(*batch, H)``; for the LSTM cell the pair (c, h), each ``(*batch, H)``.

        Raises:
          ValueError: an initializer is set but ``rngs`` is None.
        """
        init = carry_init or self.carry_init
        if isinstance(rngs, nnx.Rngs):
            rngs = rngs.carry
        if init is not None and rngs is None:
            raise ValueError("RNGs must be provided to initialize the cell carry.")
        shape = tuple(input_shape[:-1]) + (self.hidden_features,)
        draw = (lambda: jnp.zeros(shape, self.param_dtype)) if init is None else (
            lambda: init(rngs(), shape, self.param_dtype))  # pyright: ignore[reportOptionalCall]
        return (draw(), draw()) if self._gates == 4 else draw()

    @property
    def num_feature_axes(self) -> int:
        return 1


class BlockSimpleCell(_BlockCell):
    """:class:`bppsa.cells.BlockRNN` (input bias only, as ``nnx.SimpleCell``):
    h' = activation_fn(x W_x + b_x + rec(h)), rec per head (``head_size``). Carry and output h ``(*batch, H)``.

    Args:
      in_features: I, the input width.
      hidden_features: H, the state width (a multiple of ``head_size``).
      head_size: k, the units of each head (default 1: a diagonal recurrence).
      activation_fn: the activation, ``jnp.tanh`` (default), ``jax.nn.sigmoid`` or ``jax.nn.relu``, or its
        name.
      kernel_init: the initializer of ``W_x`` (I, G·H) (default LeCun normal).
      recurrent_kernel_init: the initializer of ``W_h`` (H/k, k, G·k) (default :func:`head_uniform`).
      bias_init: the initializer of the bias (G·H,) (default zeros).
      dtype: the dtype the step computes in; None: from the inputs, carry and parameters.
      param_dtype: the parameters' dtype (and the initial carry's).
      carry_init: an initializer of the carry for ``initialize_carry``; None: zeros.
      rngs: the ``nnx.Rngs`` the parameters are drawn from.

    Raises:
      bppsa.errors.UsageError: a size that is not a positive int, an ``H`` that ``head_size`` does not
      divide, or an activation function bppsa does not know (the message names it).

    Examples:
      >>> import jax.numpy as jnp, bppsa
      >>> from flax import nnx
      >>> cell = bppsa.nn.BlockSimpleCell(3, 4, head_size=2, rngs=nnx.Rngs(0))
      >>> layer = bppsa.nn.RNN(cell)                           # BPPSA's scan over (k, k) blocks
      >>> layer(jnp.ones((2, 5, 3))).shape
      (2, 5, 4)
      >>> type(cell.bppsa_cell()).__name__
      'BlockRNN'
    """

    def __init__(self, in_features: int, hidden_features: int, *, head_size: int = 1, activation_fn=jnp.tanh,
                 kernel_init=initializers.lecun_normal(), recurrent_kernel_init=head_uniform,
                 bias_init=initializers.zeros_init(), dtype=None, param_dtype=jnp.float32, carry_init=None,
                 rngs: nnx.Rngs):
        self.activation_fn = activation_fn
        self._build(in_features, hidden_features, head_size, kernel_init, recurrent_kernel_init, bias_init, dtype,
                    param_dtype, carry_init, rngs)

    def bppsa_cell(self) -> Cell:
        return block.BlockRNN(self.in_features, self.hidden_features, self.head_size,
                              _name(self.activation_fn, "activation_fn"), hidden_bias=False)


class _GatedCell(_BlockCell):
    """The gated cells' constructor (``gate_fn`` and ``activation_fn``, as flax's)."""

    def __init__(self, in_features: int, hidden_features: int, *, head_size: int = 1, gate_fn=jax.nn.sigmoid,
                 activation_fn=jnp.tanh, kernel_init=initializers.lecun_normal(),
                 recurrent_kernel_init=head_uniform, bias_init=initializers.zeros_init(), dtype=None,
                 param_dtype=jnp.float32, carry_init=None, rngs: nnx.Rngs):
        self.gate_fn, self.activation_fn = gate_fn, activation_fn
        self._build(in_features, hidden_features, head_size, kernel_init, recurrent_kernel_init, bias_init, dtype,
                    param_dtype, carry_init, rngs)


class BlockGRUCell(_GatedCell):
    """:class:`bppsa.cells.BlockGRU` (input bias only, as ``nnx.GRUCell``; gates r, z, n):
    r, z = gate_fn(x W_x + b_x + rec(h)) per gate, n = activation_fn(x W_xn + b_xn + r ⊙ rec_n(h)),
    h' = (1 − z) ⊙ n + z ⊙ h. Carry and output h ``(*batch, H)``.

    Args:
      in_features: I, the input width.
      hidden_features: H, the state width (a multiple of ``head_size``).
      head_size: k, the units of each head (default 1: a diagonal recurrence).
      gate_fn: the gates' activation (default ``jax.nn.sigmoid``), one of the three bppsa knows or its name.
      activation_fn: the activation (default ``jnp.tanh``), likewise.
      kernel_init: the initializer of ``W_x`` (I, G·H) (default LeCun normal).
      recurrent_kernel_init: the initializer of ``W_h`` (H/k, k, G·k) (default :func:`head_uniform`).
      bias_init: the initializer of the bias (G·H,) (default zeros).
      dtype: the dtype the step computes in; None: from the inputs, carry and parameters.
      param_dtype: the parameters' dtype (and the initial carry's).
      carry_init: an initializer of the carry for ``initialize_carry``; None: zeros.
      rngs: the ``nnx.Rngs`` the parameters are drawn from.

    Raises:
      bppsa.errors.UsageError: a size that is not a positive int, an ``H`` that ``head_size`` does not
      divide, or an activation function bppsa does not know (the message names it).

    Examples:
      >>> import jax.numpy as jnp, bppsa
      >>> from flax import nnx
      >>> cell = bppsa.nn.BlockGRUCell(3, 4, head_size=1, rngs=nnx.Rngs(0))
      >>> layer = bppsa.nn.RNN(cell)                           # BPPSA's scan over (k, k) blocks
      >>> layer(jnp.ones((2, 5, 3))).shape
      (2, 5, 4)
      >>> type(cell.bppsa_cell()).__name__
      'BlockGRU'
    """

    _gates = 3

    def bppsa_cell(self) -> Cell:
        return block.BlockGRU(self.in_features, self.hidden_features, self.head_size,
                              _name(self.gate_fn, "gate_fn"), _name(self.activation_fn, "activation_fn"),
                              hidden_bias=False)


class BlockLSTMCell(_GatedCell):
    """:class:`bppsa.cells.BlockLSTM` (hidden bias only, as ``nnx.LSTMCell``; gates i, f, g, o):
    c' = f ⊙ c + i ⊙ g, h' = o ⊙ activation_fn(c'). Carry (c, h), output h ``(*batch, H)``, as flax's.

    Args:
      in_features: I, the input width.
      hidden_features: H, the state width (a multiple of ``head_size``).
      head_size: k, the units of each head (default 1: a diagonal recurrence).
      gate_fn: the gates' activation (default ``jax.nn.sigmoid``), one of the three bppsa knows or its name.
      activation_fn: the activation (default ``jnp.tanh``), likewise.
      kernel_init: the initializer of ``W_x`` (I, G·H) (default LeCun normal).
      recurrent_kernel_init: the initializer of ``W_h`` (H/k, k, G·k) (default :func:`head_uniform`).
      bias_init: the initializer of the bias (G·H,) (default zeros).
      dtype: the dtype the step computes in; None: from the inputs, carry and parameters.
      param_dtype: the parameters' dtype (and the initial carry's).
      carry_init: an initializer of the carry for ``initialize_carry``; None: zeros.
      rngs: the ``nnx.Rngs`` the parameters are drawn from.

    Raises:
      bppsa.errors.UsageError: a size that is not a positive int, an ``H`` that ``head_size`` does not
      divide, or an activation function bppsa does not know (the message names it).

    Examples:
      >>> import jax.numpy as jnp, bppsa
      >>> from flax import nnx
      >>> cell = bppsa.nn.BlockLSTMCell(3, 4, head_size=2, rngs=nnx.Rngs(0))
      >>> layer = bppsa.nn.RNN(cell)                           # BPPSA's scan over (k, k) blocks
      >>> layer(jnp.ones((2, 5, 3))).shape
      (2, 5, 4)
      >>> type(cell.bppsa_cell()).__name__
      'BlockLSTM'
    """

    _gates = 4
    _input_bias, _hidden_bias = False, True

    def bppsa_cell(self) -> Cell:
        return block.BlockLSTM(self.in_features, self.hidden_features, self.head_size,
                               _name(self.gate_fn, "gate_fn"), _name(self.activation_fn, "activation_fn"),
                               input_bias=False, flax_carry=True)
