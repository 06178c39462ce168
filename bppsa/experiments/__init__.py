"""Experiments: one module per paper result, each holding the task functions of its configs.

A config in ``experiments/configs/NAME.py`` sets ``task = "bppsa.experiments.<module>:<function>"``;
``bppsa run experiments/configs/NAME.py`` (or ``bppsa reproduce NAME``) calls it as
``function(config, workdir) -> summary``. The library never imports this package.
"""
