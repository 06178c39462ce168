"""Datasets: the synthetic bitstream task (and, with their issues, IRMAS and its stand-in)."""
