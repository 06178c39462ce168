"""Datasets: the synthetic bitstream task, scikit-learn's digits, IRMAS and its synthetic stand-in, and the Task container."""
