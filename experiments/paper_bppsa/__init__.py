"""BPPSA (Wang, Bai, Pekhimenko, MLSys 2020): the RNN bitstream training and sweeps, the IRMAS GRU
grid and training, sparse VGG-11 retraining, and the GPU script's timings. Configs in ``configs/``.
"""
