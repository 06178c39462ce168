"""The measurements behind ``bppsa.plan.rules.bptt_unroll`` (the task of experiments/extensions/configs/bptt_unroll.py).

BPTT (the one timed gradient of :mod:`experiments.gradient`, through ``lax.scan``) for each unroll
in ``bppsa.plan.rules.UNROLLS``, interleaved (:func:`bppsa.host.time_interleaved`, blocks of 3 calls, the
first dropped), at every point of ``config.grid`` ((cell, I, H, T, B) rows); the unroll the rule
picks and its time over the best unroll's. Writes ``<name>``.json (with provenance) and
``<name>``.md (:func:`render`'s table, the rule re-evaluated on the rows).
"""

from __future__ import annotations

import json
import time
from os import PathLike

import jax.numpy as jnp

from bppsa import cells
from bppsa.errors import UsageError, checked_by, require_int
from bppsa.host import time_interleaved
from bppsa.plan import rules
from experiments import entry, gradient
from experiments.provenance import provenance, save_json
from experiments.tables import markdown_table

__all__ = ["CELLS", "rule_columns", "point", "render", "check", "run"]

CELLS = cells.BUILTIN


def rule_columns(r: dict) -> dict:
    """The rule's unroll for this row and its time over the best unroll's (a rule unroll >= T,
    capped at T, is the fully unrolled loop, as every u >= T in UNROLLS)."""
    cell = CELLS[r["cell"]](r["I"], r["H"])
    ms = {int(u): v for u, v in r["ms"].items()}
    rule = rules.bptt_unroll(cell, r["T"], r["B"], jnp.float32)
    rule_ms = ms[rule] if rule in ms else ms[min(u for u in ms if u >= rule)]
    return {"rule": rule, "rule_over_best": rule_ms / min(ms.values())}


def point(kind: str, I: int, H: int, T: int, B: int, repeats: int) -> dict:
    """One row: the median ms of BPTT at every unroll of ``bppsa.plan.rules.UNROLLS``, the best, the rule's."""
    cell = CELLS[kind](I, H)
    p, xs, h0, R = gradient.problem(cell, T, B)
    fns = gradient.gradient_functions(cell, p, xs, h0, R, gradient.method_names(unrolls=rules.UNROLLS, tuned=False,
                                                                                 scans=()))
    t = time_interleaved(fns, repeats=repeats, block=3)
    ms = {u: 1e3 * t[f"bptt_unroll{u}"]["median"] for u in rules.UNROLLS}
    best = min(ms, key=lambda u: ms[u])
    r = {"cell": kind, "I": I, "H": H, "T": T, "B": B, "ms": ms, "best": best, "plain_over_best": ms[1] / ms[best]}
    return {**r, **rule_columns(r)}


def render(rec: dict) -> str:
    """The Markdown of a record (its rows' rule columns re-evaluated with the committed rule)."""
    p = rec["provenance"]
    md = [f"`{p['command']}` — {p['date']}, {p['backend']} / {p['cpu']}, jax {p['jax']}", "",
          "BPTT (the timed training-step gradient of `experiments.gradient` through `lax.scan(..., unroll=u)`, "
          "forward included), "
          f"median ms of {rec.get('repeats', 7)} blocks of 2 timed calls, all unrolls interleaved; rule = "
          "`bppsa.plan.rules.bptt_unroll` as committed (re-evaluated on the rows); × = time / best unroll's time.", "",
          ""]
    rows = []
    for r in rec["rows"]:
        r.update(rule_columns(r))
        ms = {int(u): v for u, v in r["ms"].items()}
        rows.append([r["cell"], r["I"], r["T"], r["B"], *(f"{ms[u]:.2f}" for u in rules.UNROLLS), r["best"], r["rule"],
                     f"{r['rule_over_best']:.2f}", f"{r['plain_over_best']:.2f}"])
    md.append(markdown_table(["cell", "I", "T", "B", *(f"u={u}" for u in rules.UNROLLS), "best", "rule", "rule ×",
                              "plain ×"], rows, align="lrrr" + "r" * (len(rules.UNROLLS) + 4)))
    return "\n".join(md) + "\n"


def check(config) -> None:
    """The ranges of :func:`run`'s config (UsageError naming the key)."""
    require_int(config, "repeats")
    grid = config.grid
    if not isinstance(grid, (list, tuple)) or not grid:
        raise UsageError(f"config.grid must be a non-empty list of (cell, I, H, T, B) rows; got {grid!r}")
    for r in grid:
        if not isinstance(r, (list, tuple)) or len(r) != 5 or r[0] not in CELLS or \
                any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in r[1:]):
            raise UsageError(f"config.grid: each row must be (cell, I, H, T, B) with cell one of {sorted(CELLS)} "
                             f"and positive ints; got {r!r}")


@checked_by(check)
def run(config, workdir: PathLike) -> dict:
    """Task of ``experiments/extensions/configs/bptt_unroll.py``: every point of ``config.grid``."""
    check(config)
    rows, start = [], time.perf_counter()
    for kind, I, H, T, B in config.grid:
        rows.append(point(kind, int(I), int(H), int(T), int(B), repeats=int(config.repeats)))
        print(json.dumps(rows[-1]), flush=True)
    rec = {"rows": rows, "repeats": int(config.repeats), "wall_s": time.perf_counter() - start,
           "provenance": provenance()}
    md = render(rec)
    save_json(entry(workdir, f"{config.name}.json"), rec)
    entry(workdir, f"{config.name}.md").write_text(md)
    return {"rows": [{k: r[k] for k in ("cell", "I", "H", "T", "B", "best", "rule", "rule_over_best",
                                        "plain_over_best")} for r in rows],
            "rule_over_best_max": max(r["rule_over_best"] for r in rows),
            "files": [f"{config.name}.json", f"{config.name}.md"]}
