"""Fused Pallas kernels behind the core's seams, chosen by the plan (``kernels=``).

- :mod:`bppsa.kernels.recurrence`: the sequential recurrence of an RNN, GRU or LSTM, the whole time
  loop in one kernel (:func:`fused_states`): the forward of the BPPSA training step;
- :mod:`bppsa.kernels.lowering`: a kernel's CUDA lowering, checked on any machine
  (:func:`cuda_module`).

``bppsa.Options(kernels=...)``: "xla" (no kernel), "pallas" (the kernels, on a GPU; elsewhere a
clear error), "interpret" (the same kernels in Pallas's interpret mode, any backend: tests and
debugging), "auto" (the default: a kernel only where a committed GPU measurement shows it fastest;
none yet, so "xla" everywhere until one does). May import :mod:`bppsa.cells` and
:mod:`bppsa.errors`; the forward and the backward import it, never the reverse.
"""

from __future__ import annotations

from bppsa.kernels import lowering, recurrence
from bppsa.kernels.lowering import cuda_module
from bppsa.kernels.recurrence import fused_states, supports

__all__ = ["KERNELS", "recurrence", "lowering", "fused_states", "supports", "cuda_module"]

#: The values of ``Options.kernels``.
KERNELS = ("auto", "xla", "pallas", "interpret")
