"""The flax front end: a drop-in for :class:`flax.nnx.RNN` whose gradients come from bppsa's backward.

.. code-block:: python

    import bppsa
    from flax import nnx
    rnn = bppsa.nn.RNN(nnx.GRUCell(16, 32, rngs=nnx.Rngs(0)), backward="auto")

- :mod:`bppsa.nn.rnn`: :class:`RNN` (the same arguments, outputs, carry and state updates as
  ``nnx.RNN`` for any cell ``nnx.RNN`` drives) and the paper's :class:`SequenceClassifier`;
- :mod:`bppsa.nn.cells`: flax's cells as :class:`bppsa.cells.Cell` objects (their maths written once in
  :mod:`bppsa.cells`; this module maps flax's parameter layouts), autodiff Jacobians for any
  other cell, the masked step of padded batches;
- :mod:`bppsa.nn.block_cells`: flax cells with per-head (block-diagonal or diagonal) recurrences,
  :class:`BlockSimpleCell`, :class:`BlockGRUCell`, :class:`BlockLSTMCell`.

Importing it imports flax; ``import bppsa`` alone does not (``bppsa.nn`` is imported on first access).
"""

from __future__ import annotations

from bppsa.nn import block_cells, cells  # noqa: F401 -- the submodules, as attributes
from bppsa.nn.block_cells import BlockGRUCell, BlockLSTMCell, BlockSimpleCell
from bppsa.nn.rnn import RNN, BPTTFallbackWarning, SequenceClassifier

__all__ = ["RNN", "SequenceClassifier", "BPTTFallbackWarning", "BlockSimpleCell", "BlockGRUCell", "BlockLSTMCell"]
