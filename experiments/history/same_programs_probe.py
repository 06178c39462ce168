"""Before/after a restructuring: the compiled training-step gradients of two checkouts compared.

    python experiments/history/same_programs_probe.py OLD_CHECKOUT NEW_CHECKOUT

Each checkout's ``bppsa`` is imported in a process of its own; for seven (cell, options) points the
jitted ``jax.grad`` of a training loss is compiled for this CPU and its HLO text compared, once
stripped of what names the source (file and function tables, stack-frame ids, op metadata). Equal
text: the restructuring changed no program, so no time. Prints a table and writes
``experiments/history/same-programs.json``. The two
``kernels="interpret"`` points run the fused Pallas kernels in interpret mode (their programs on the CPU).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

PROBE = r'''
import hashlib, json, re, sys
sys.path.insert(0, sys.argv[1])
import jax, jax.numpy as jnp
import bppsa
from bppsa import cells, structured
points = [("GRU(24, 20), bppsa", cells.GRU(24, 20), {}), ("GRU(24, 20), bptt", cells.GRU(24, 20), {"backward": "bptt"}),
          ("LSTM(8, 16), bppsa sequential", cells.LSTM(8, 16), {"scan": "sequential"}),
          ("RNN(1, 20), newton", cells.RNN(1, 20), {"forward": "newton"}),
          ("BlockGRU(8, 16, head 1), quasi", structured.BlockGRU(8, 16, head_size=1), {"forward": "quasi"}),
          ("GRU(24, 20), bppsa, kernels interpret", cells.GRU(24, 20), {"kernels": "interpret"}),
          ("GRU(24, 20), bptt, kernels interpret", cells.GRU(24, 20), {"backward": "bptt", "kernels": "interpret"})]
out = {}
for name, cell, kw in points:
    p = cell.init(jax.random.key(0))
    xs, h0 = jnp.ones((517, 16, cell.input_size)), jnp.zeros((16, cell.hidden_size))
    h0 = (h0, h0) if cell.pair_state else h0
    f = jax.jit(jax.grad(lambda p: jnp.sum(cell.hidden(bppsa.rnn(cell, p, xs, h0, **kw)))))
    txt = re.sub(r", metadata=\{[^}]*\}", "", f.lower(p).compile().as_text())
    txt = "\n".join(line for line in txt.splitlines() if not re.match(r'^\d+ ["{]', line))
    txt = re.sub(r"stack_frame_id=\d+", "", txt)
    out[name] = {"sha1": hashlib.sha1(txt.encode()).hexdigest(), "chars": len(txt)}
print(json.dumps(out))
'''


def programs(checkout: str) -> dict:
    """{point: {"sha1", "chars"}} of the stripped HLO of each point, compiled from ``checkout``."""
    proc = subprocess.run([sys.executable, "-c", PROBE, str(Path(checkout).resolve())], capture_output=True,
                          text=True, check=True, cwd="/")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    old, new = sys.argv[1], sys.argv[2]
    a, b = programs(old), programs(new)
    rows = {k: {"old": a[k]["sha1"][:12], "new": b[k]["sha1"][:12], "chars": b[k]["chars"],
                "same": a[k]["sha1"] == b[k]["sha1"]} for k in a}
    for k, r in rows.items():
        print(f"{k:36s} {r['old']} {r['new']} {r['chars']:8d} {'same' if r['same'] else 'DIFFERENT'}")
    out = Path(__file__).with_name("same-programs.json")
    out.write_text(json.dumps({"old": old, "new": new, "note": "paths of the two checkouts at the time of the run", "points": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
