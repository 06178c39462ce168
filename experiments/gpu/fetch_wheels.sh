#!/usr/bin/env bash
# Download the wheels the device machine cannot (it has no internet) into experiments/gpu/wheels
# (git-ignored: the device run's `carry` must name experiments/gpu/wheels for them to travel).
#
#   experiments/gpu/fetch_wheels.sh            # here, with internet; then run.sh on the device machine
#
# pararnn-torch 0.17.4 (pure Python, ~240 KB; its deps torch and triton are on the device machine):
# the peer of the `parallel` part's structured points (experiments/paper_bppsa/pararnn_gpu.py),
# installed there with `pip install --no-deps --no-index --target TMP` at run time.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
DEST="$ROOT/experiments/gpu/wheels"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
[ -x "$PY" ] || PY=python3
mkdir -p "$DEST"
"$PY" -m pip download --quiet --no-deps --disable-pip-version-check "pararnn-torch==0.17.4" -d "$DEST"
# the wheels travel in the device call's 64 MiB carry: refuse anything big
size=$(du -sk "$DEST" | cut -f1)
if [ "$size" -gt 10240 ]; then
    echo "error: $DEST is ${size} KB (> 10 MB): too big to carry" >&2
    exit 1
fi
ls -l "$DEST"
