#!/usr/bin/env bash
# The device-machine run: BPPSA against every baseline on one GPU and on its host's 16 CPU cores.
# A thin shell around `python -m experiments.paper_bppsa.gpu_run` (see experiments/gpu/README.md).
#
#   experiments/gpu/run.sh OUTDIR              # needs a visible GPU; < 8 min on an H200
#   experiments/gpu/run.sh OUTDIR --dry-run    # tiny sizes on the CPU (also: BPPSA_ALLOW_CPU=1)
#
# Installs nothing (but the pararnn-torch wheel of experiments/gpu/fetch_wheels.sh, when carried, into a
# temporary folder) and imports none of ml_collections, librosa, soundfile, ray: uses $PYTHON
# (default python3) with jax, numpy (and torch, optional, for the cuDNN baseline and the pararnn peer).
set -euo pipefail
OUT="${1:?usage: experiments/gpu/run.sh OUTDIR [--dry-run]}"
shift
PY="${PYTHON:-python3}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
mkdir -p "$OUT"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export BPPSA_CACHE_DIR="${BPPSA_CACHE_DIR:-$OUT/cache}"
# Grow GPU memory on demand: torch (cuDNN baseline) shares the device, and the peak is JAX's own.
export XLA_PYTHON_CLIENT_PREALLOCATE="${XLA_PYTHON_CLIENT_PREALLOCATE:-false}"
exec "$PY" -m experiments.paper_bppsa.gpu_run "$OUT" "$@"
