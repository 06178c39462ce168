"""Datasets: the synthetic bitstream task, scikit-learn's digits, the modulated-template sequences
(sequences), IRMAS (irmas; its folder layout in irmas_files) and its synthetic stand-in, and the Task
container."""
