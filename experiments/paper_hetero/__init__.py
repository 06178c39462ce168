"""Heterogeneity-aware data parallelism (Moreno-Álvarez et al. 2022): uniform / proportional-mean /
proportional-weighted on simulated and real replica processes. Configs in ``configs/``.
"""
