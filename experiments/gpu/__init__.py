"""The device machine's run and the kernels' machine-code check (experiments/gpu/README.md)."""
