"""Bounded memory of the parallel forward: dense Newton at H = 64, T = 100 000, B = 16 (the task of
experiments/extensions/configs/newton_memory.py).

One training step (``jax.value_and_grad`` of the mean of all hidden states w.r.t. the
parameters; ``forward="newton"``, ``backward="bppsa"``, ``chunk_size="auto"``) of a dense GRU,
float32, on this machine. Unchunked, the Jacobians alone would be T·B·S² floats (26 GB here: what
DEER's reports run out of); the chunked iteration and backward hold one chunk's at a time.

Recorded: the process's peak resident memory (``ru_maxrss``, the high-water mark of the whole
process: compile included, and whatever ran in the process before the task, e.g. the runner or a
test session; so run it in a process of its own, as ``bppsa run`` does), XLA's own plan for the
compiled step (arguments, outputs, temporaries: ``memory_analysis``), the Newton iterations, the
wall time of the one step, and the states' largest deviation from the sequential forward's (run
after, in float32). Writes ``<name>``.json (with provenance) and ``<name>``.md.
"""

from __future__ import annotations

import resource
import time
from os import PathLike

import jax
import jax.numpy as jnp

from bppsa import backprop, cells
from bppsa.errors import checked_by, require_choices, require_int
from bppsa.plan.options import KINDS, Options
from bppsa.scan import SCANS
from experiments import entry
from experiments.provenance import provenance, save_json
from experiments.tables import markdown_table

__all__ = ["check", "run"]

#: The Markdown's description of the measurement (the second paragraph of the module docstring).
DESCRIPTION = (__doc__ or "").split("\n\n")[1]
PEAK_RSS_NOTE = ("ru_maxrss: the high-water mark of the whole process (compile included, and whatever ran "
                 "in the process before this task), not of the step alone")


def check(config) -> None:
    """The ranges of :func:`run`'s config (UsageError naming the key)."""
    for key in ("T", "B", "H", "I"):
        require_int(config, key)
    require_choices(config, "scan", tuple(SCANS))
    require_choices(config, "forward", KINDS)


@checked_by(check)
def run(config, workdir: PathLike) -> dict:
    """Task of ``experiments/extensions/configs/newton_memory.py``: one training step of a dense GRU."""
    check(config)
    T, B, H, I = (int(config[k]) for k in ("T", "B", "H", "I"))
    cell = cells.GRU(I, H)
    params = cell.init(jax.random.key(0))
    xs = jax.random.normal(jax.random.key(1), (T, B, I), jnp.float32)
    h0 = jnp.zeros((B, H), jnp.float32)
    opts = Options(forward=config.forward, backward="bppsa", scan=config.scan)

    def loss(p):
        hs, info = backprop.rnn(cell, p, xs, h0, opts, return_info=True)
        return jnp.mean(hs), (hs, info)

    step = jax.jit(jax.value_and_grad(loss, has_aux=True))
    compiled = step.lower(params).compile()
    mem = compiled.memory_analysis()
    t0 = time.perf_counter()
    (_, (hs, info)), grads = compiled(params)
    jax.block_until_ready(grads)
    seconds = time.perf_counter() - t0
    peak_gib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB -> GiB (Linux)
    seq = jax.jit(lambda p: backprop.rnn(cell, p, xs, h0, backward="bptt"))(params)
    deviation = float(jnp.max(jnp.abs(seq - hs)))
    gib = lambda n: round(n / 2**30, 3)
    plan = lambda attr: None if mem is None else gib(getattr(mem, attr))  # None: XLA gave no memory plan
    rec = {
        "cell": f"GRU(I={I}, H={H})", "T": T, "B": B, "dtype": "float32", "forward": config.forward,
        "scan": config.scan, "peak_rss_gib": round(peak_gib, 3),
        "xla_argument_gib": plan("argument_size_in_bytes"), "xla_output_gib": plan("output_size_in_bytes"),
        "xla_temp_gib": plan("temp_size_in_bytes"),
        "dense_jacobians_gib": gib(T * B * H * H * 4),
        "iterations": int(info.iterations), "converged": bool(info.converged), "fell_back": bool(info.fell_back),
        "residual": float(info.residual), "max_abs_vs_sequential": deviation, "step_seconds": round(seconds, 2),
        "finite_grads": bool(all(jnp.all(jnp.isfinite(g)) for g in jax.tree.leaves(grads))),
        "peak_rss_note": PEAK_RSS_NOTE,
        "provenance": provenance(),
    }
    keys = [k for k in rec if k not in ("provenance", "peak_rss_note")]
    table = markdown_table(["quantity", "value"], [[k, rec[k]] for k in keys])
    save_json(entry(workdir, f"{config.name}.json"), rec)
    entry(workdir, f"{config.name}.md").write_text(
        "# Dense Newton step, bounded memory\n\n" + DESCRIPTION + "\n\n" + table + "\n\n"
        + f"peak_rss_gib: {PEAK_RSS_NOTE}.\n")
    print(table)
    return {k: rec[k] for k in keys}
