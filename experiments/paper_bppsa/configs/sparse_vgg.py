"""Sparse BPPSA over feed-forward chains: Jacobian generation, pruned VGG-11 FLOPs, digits retraining (BPPSA §5.3).

    bppsa reproduce sparse-vgg            # = bppsa run experiments/paper_bppsa/configs/sparse_vgg.py; ~10 min on 2 CPU cores (measured: 581 s, AMD EPYC)
    bppsa reproduce sparse-vgg --quick    # = ...sparse_vgg.py:quick, the same as :smoke; ~30 s of CPU (incl. compilation)
    bppsa reproduce sparse-vgg --workdir experiments/results/cpu   # written beside the committed results

Three parts (``config.parts``):
- generation: analytic sparse transposed Jacobians vs jax.jacrev for VGG-11's conv, ReLU and
  max-pool layers at 32×32 (one sample); jacrev only where the dense Jacobian has at most
  ``generation.max_dense_entries`` entries (the others are reported as not measured).
- flops: BP vs BPPSA FLOPs (total and critical path) with sparse products for magnitude-pruned
  VGG-11 (32×32, one sample, random input) against sparsity, and against L_m at one sparsity.
- retrain: a small VGG-style net on sklearn's bundled digits (8×8 upsampled to 16×16), trained
  dense with autodiff, pruned by magnitude, retrained with the BPPSA backward pass (gradients
  checked against autodiff), test accuracy compared with the unpruned net within ``margin``.
Result: experiments/results/<device>/sparse_vgg.{json,md,png}, one record with each part's rows under its
name (generation, flops, retrain), each part's table, and the FLOPs plot.
"""

import ml_collections

PRESETS = ("quick", "smoke")  # the arguments get_config takes: `bppsa run CONFIG:PRESET`


def get_config(arg=None):
    if arg not in (None, *PRESETS):
        raise ValueError(f"sparse_vgg takes no argument, 'quick' or 'smoke'; got {arg!r}")
    c = ml_collections.ConfigDict()
    c.task = "experiments.paper_bppsa.sparse_vgg:run"
    c.name = "sparse_vgg"
    c.parts = ("generation", "flops", "retrain")

    c.generation = ml_collections.ConfigDict()
    c.generation.in_hw = 32
    c.generation.repeats = 3
    c.generation.max_dense_entries = 2 ** 26    # 64 Mi entries = 256 MiB as float32
    c.generation.kinds = ("conv", "relu", "maxpool")

    c.flops = ml_collections.ConfigDict()
    c.flops.in_hw = 32
    c.flops.width = 0.5                          # channel multiplier of VGG-11 for the sparsity / L_m sweeps
    c.flops.sparsities = (0.8, 0.9, 0.95, 0.98)
    c.flops.level_sweep_sparsity = 0.9           # L_m sweep at this sparsity (must be one of sparsities)
    c.flops.widths = (0.125, 0.25, 0.5, 1.0)     # problem-size sweep at width_sweep_sparsity
    c.flops.width_sweep_sparsity = 0.9

    c.retrain = ml_collections.ConfigDict()
    c.retrain.cfg = (8, "M", 16, "M")
    c.retrain.hidden = (32,)
    c.retrain.sparsity = 0.7
    c.retrain.dense_steps = 400
    c.retrain.retrain_steps = 300
    c.retrain.batch_size = 32
    c.retrain.learning_rate = 3e-3
    c.retrain.levels = -1                        # L_m; -1 = the full Blelloch scan
    c.retrain.check_every = 30
    c.retrain.margin = 0.02                      # retrained accuracy >= unpruned - margin
    if arg in ("quick", "smoke"):
        c.generation.repeats = 1
        c.generation.max_dense_entries = 2 ** 20
        c.generation.kinds = ("maxpool",)
        c.flops.in_hw = 32
        c.flops.width = 0.0625
        c.flops.sparsities = (0.9,)
        c.flops.level_sweep_sparsity = 0.9
        c.flops.widths = (0.0625,)
        c.retrain.cfg = (4, "M")
        c.retrain.hidden = ()
        c.retrain.dense_steps = 20
        c.retrain.retrain_steps = 3
        c.retrain.batch_size = 8
        c.retrain.check_every = 2
        c.retrain.margin = 1.0
    return c
