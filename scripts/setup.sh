#!/usr/bin/env bash
# Set up this machine for sm12x's main job and tests (idempotent; a fresh machine needs network
# access to PyPI and Debian's archive):
#   - Python packages: torch (CPU wheel 2.13.0 here; a GPU machine keeps its own torch), triton,
#     importlib-metadata, pytest, docker, numpy, pyyaml; sm12x itself in editable mode (console
#     script `sm12x`);
#   - a Docker engine for tests/docker (scripts/ci_docker.sh; never fails the setup).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"

have() { "$PY" -c "import $1" >/dev/null 2>&1; }

if ! have torch; then
    "$PY" -m pip install -q "torch==2.13.0"
fi
if ! have triton; then
    "$PY" -m pip install -q "triton==3.9.0"
fi
"$PY" -m pip install -q importlib-metadata pytest docker numpy pyyaml
"$PY" -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 \
    || "$PY" -m pip install -q --no-deps -e .
bash scripts/ci_docker.sh || true
