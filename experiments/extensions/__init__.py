"""This project's extensions: the parallel (Newton) forward, the flax drop-in, sequence-parallel
scaling over devices, the GPU roofline. Configs in ``configs/``.
"""
