#!/usr/bin/env bash
# The image's install step (Dockerfile), also run by tests/test_install.py in an environment that
# has torch already: benchlab and what it needs go in beside the torch and Triton the base image
# ships, which are pinned so pip can neither replace nor upgrade them. Usage: install-image.sh PYTHON EXTRAS
set -euo pipefail
PYTHON=${1:-python}
EXTRAS=${2:-postgres}
pins=$(mktemp)
"$PYTHON" - "$pins" <<'PY'
import sys
import torch
lines = [f"torch=={torch.__version__}"]
try:
    import triton
    lines.append(f"triton=={triton.__version__}")
except ImportError:
    pass
open(sys.argv[1], "w").write("\n".join(lines) + "\n")
print("image install: keeping " + ", ".join(lines))
PY
"$PYTHON" -m pip install --no-cache-dir -q -c "$pins" ".[${EXTRAS}]"
"$PYTHON" -c 'import torch, backend.cli, worker.tasks; print(f"image install: benchlab with torch {torch.__version__}")'
rm -f "$pins"
