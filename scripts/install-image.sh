#!/usr/bin/env bash
# The image's install step (Dockerfile), also run by tests/test_install.py in an environment that
# has torch already: benchlab's requirements without torch and Triton (scripts/requirements.py),
# then benchlab with --no-deps, so pip never touches the torch and Triton the base image ships.
# Usage: install-image.sh PYTHON EXTRAS
set -euo pipefail
PYTHON=${1:-python}
EXTRAS=${2:-postgres}
"$PYTHON" -c 'import torch; print(f"image install: keeping torch=={torch.__version__}")'
reqs=$(mktemp)
"$PYTHON" scripts/requirements.py "$EXTRAS" > "$reqs"
"$PYTHON" -m pip install --no-cache-dir -q -r "$reqs"
"$PYTHON" -m pip install --no-cache-dir -q --no-deps .
rm -f "$reqs"
"$PYTHON" -c 'import torch, backend.cli, worker.tasks; print(f"image install: benchlab with torch {torch.__version__}")'
