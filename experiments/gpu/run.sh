#!/usr/bin/env bash
# BPPSA on a GPU: the paper's RNN sweeps (T at B = 16, B at T = 1000) and the timing part of the
# IRMAS GRU grid (synthetic inputs of the right shapes), JSON + markdown under OUTDIR/{rnn-sweep,irmas-timing}/.
#
#   experiments/gpu/run.sh OUTDIR            # needs a visible GPU; < 8 min on an H200
#   BPPSA_ALLOW_CPU=1 experiments/gpu/run.sh OUTDIR   # dry run on a CPU (tiny sizes)
#
# Installs nothing: uses $PYTHON (default python3) with jax, optax, flax, matplotlib present.
set -euo pipefail
OUT="${1:?usage: experiments/gpu/run.sh OUTDIR}"
PY="${PYTHON:-python3}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
cd "$ROOT"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export BPPSA_CACHE_DIR="${BPPSA_CACHE_DIR:-$OUT/cache}"

BACKEND="$("$PY" -c 'import jax; print(jax.default_backend())')"
if [[ "$BACKEND" != "gpu" && "$BACKEND" != "cuda" ]]; then
  if [[ "${BPPSA_ALLOW_CPU:-0}" != "1" ]]; then
    echo "error: no GPU visible to JAX (backend: $BACKEND). Check nvidia-smi and the jax[cuda] install," >&2
    echo "       or set BPPSA_ALLOW_CPU=1 for a dry run on the CPU." >&2
    exit 1
  fi
  echo "BPPSA_ALLOW_CPU=1: dry run on $BACKEND with tiny sizes"
  RNN_ARGS=(--config.T_values=10,30 --config.B_values=2,4 --config.repeats=2)
  IRMAS_ARGS=(--config.settings=s --config.batches=16 --config.repeats=2)
else
  "$PY" -c 'import jax; print("devices:", jax.devices())'
  RNN_ARGS=(--config.repeats=5 --config.time_budget_s=300)
  IRMAS_ARGS=(--config.repeats=5 --config.time_budget_s=90)
fi

"$PY" -m bppsa.cli reproduce rnn-sweep --workdir "$OUT/rnn-sweep" "${RNN_ARGS[@]}"
"$PY" -m bppsa.cli reproduce irmas-timing --workdir "$OUT/irmas-timing" "${IRMAS_ARGS[@]}"

"$PY" - "$OUT" <<'PYEOF'
import json, sys, pathlib
out = pathlib.Path(sys.argv[1])
print(f"\nsummary ({out}): speedup of BPPSA over BPTT (median times)")
print(f"{'sweep':<34} {'T':>6} {'B':>4} {'backward x':>11} {'step x':>7}")
for name in ("rnn-sweep", "irmas-timing"):
    rec = json.loads((out / name / f"{name}.json").read_text())
    for sweep, pts in rec["sweeps"].items():
        for p in pts:
            print(f"{sweep[:34]:<34} {p['T']:>6} {p['B']:>4} {p['speedup_backward']:>11.2f} {p['speedup_step']:>7.2f}")
PYEOF
