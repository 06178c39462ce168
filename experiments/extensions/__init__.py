"""This project's extensions: the parallel (Newton) forward (``parallel_step``, ``newton_memory``), the
flax drop-in against ``nnx.RNN`` (``flax_rnn``), the pararnn-torch peer (``pararnn_peer``),
sequence-parallel scaling over devices (``scaling``), the GPU roofline (``roofline``), BPTT's unroll
(``bptt_unroll``), the timing protocol's order effect (``order_effect``) and what a plain user script
gets from ``backward="auto"`` (``user_script``). Configs in ``configs/``.
"""
