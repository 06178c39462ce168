"""Scale out: sequence-parallel BPPSA over a device mesh (``shard_map``), a pmap-style entry
point, and multi-process runs with ``jax.distributed`` (``bppsa launch``).

.. code-block:: python

    mesh = bppsa.parallel.make_mesh(seq=4, data=2)           # (data, seq) grid of devices
    hs = bppsa.rnn(cell, params, xs, h0, mesh=mesh, seq_axis="seq", batch_axis="data")
"""

from bppsa.parallel.mesh import initialize, make_mesh, shard_map
from bppsa.parallel.sequence import COMBINES, communication_volume, pmap_rnn, rnn
from bppsa.plan.rules import choose_combine

__all__ = ["make_mesh", "shard_map", "initialize", "rnn", "pmap_rnn", "COMBINES", "choose_combine",
           "communication_volume"]
