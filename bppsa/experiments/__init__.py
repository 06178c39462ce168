"""One module per paper result: the task code that experiments/configs/*.py name."""
