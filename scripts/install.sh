#!/usr/bin/env bash
# Install benchlab for `make`: usage scripts/install.sh PYTHON VENV [EXTRAS]   (EXTRAS: dev by default;
# "" for the service alone, e.g. on a GPU host that only runs workers)
#
# - PYTHON already has torch (a GPU host: its CUDA build, in a system Python, a virtual environment
#   or a conda env): that torch and its Triton are kept. In a virtual environment or conda env,
#   benchlab is installed into it (VENV is that environment); for a system Python, VENV is created
#   with --system-site-packages. pip installs benchlab's other requirements, then benchlab with
#   --no-deps (scripts/requirements.py), so it never touches that torch and Triton.
# - PYTHON has no torch (a CPU machine: developers, CI): VENV is created and takes the CPU pins of
#   constraints-cpu.txt (torch's CPU build, Triton whose interpreter runs the kernels on CPU).
# Offline hosts: pip reads PIP_FIND_LINKS / PIP_NO_INDEX from the environment (see the README).
set -euo pipefail
PYTHON=${1:?PYTHON}
VENV=${2:?VENV}
EXTRAS=${3-dev}
spec=.
[ -n "$EXTRAS" ] && spec=".[$EXTRAS]"
say() { echo "benchlab install: $*"; }

host_torch=$("$PYTHON" -c 'import torch; print(torch.__version__)' 2>/dev/null || true)
if [ -n "$host_torch" ]; then
  host_cuda=$("$PYTHON" -c 'import torch; print(torch.version.cuda or "none")')
  host_triton=$("$PYTHON" -c 'import triton; print(triton.__version__)' 2>/dev/null || true)
  prefix=$("$PYTHON" -c 'import sys; print(sys.prefix if sys.prefix != sys.base_prefix or "conda" in sys.version.lower() else "")')
  if [ -n "$prefix" ] && [ "$(cd "$prefix" && pwd)" = "$(mkdir -p "$VENV" && cd "$VENV" && pwd)" ]; then
    say "keeping torch $host_torch (CUDA $host_cuda) and Triton ${host_triton:-none} of $prefix; installing benchlab into it"
  else
    test -x "$VENV/bin/python" || "$PYTHON" -m venv --system-site-packages "$VENV"
    if ! "$VENV/bin/python" -c 'import torch' 2>/dev/null; then
      say "torch of $PYTHON is not visible from $VENV (a venv sees only its base interpreter's packages);"
      say "run without VENV=... to install into $PYTHON's own environment"
      exit 2
    fi
    say "keeping torch $host_torch (CUDA $host_cuda) and Triton ${host_triton:-none} of $PYTHON (venv $VENV sees its packages)"
  fi
  # benchlab's requirements without torch and Triton, then benchlab itself without dependencies:
  # pip never re-resolves the host's torch (whose own pins, e.g. its CUDA libraries, may not be
  # installable here), so it can neither replace nor "repair" it
  reqs="$VENV/.benchlab-requirements.txt"
  "$VENV/bin/python" scripts/requirements.py "$EXTRAS" > "$reqs"
  "$VENV/bin/python" -m pip install -q -r "$reqs"
  "$VENV/bin/python" -m pip install -q --no-deps -e .
else
  test -x "$VENV/bin/python" || "$PYTHON" -m venv "$VENV"
  say "no torch in $PYTHON: CPU machine, installing the pins of constraints-cpu.txt into $VENV"
  "$VENV/bin/python" -m pip install -q --upgrade pip
  "$VENV/bin/python" -m pip install -q -c constraints-cpu.txt torch triton
  "$VENV/bin/python" -m pip install -q -c constraints-cpu.txt -e "$spec"
fi
"$VENV/bin/python" -c 'import torch, triton; print(f"benchlab install: torch {torch.__version__}, Triton {triton.__version__}")' \
  2>/dev/null || "$VENV/bin/python" -c 'import torch; print(f"benchlab install: torch {torch.__version__}, no Triton")'
