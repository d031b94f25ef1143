#!/usr/bin/env bash
# Set up this machine for sm12x's self-test and tests. Idempotent; a fresh machine needs network
# access to PyPI, download.pytorch.org and Debian's archive. What it installs, into the Python
# named by $PYTHON (default python3; use a virtual environment where the OS manages the system Python):
#
#   torch 2.13.0, CPU build (torch==2.13.0+cpu from https://download.pytorch.org/whl/cpu, ~200 MB),
#       only when no torch is importable: a torch already there (a GPU machine's CUDA build) is kept.
#       Another build: SM12X_TORCH=cu130 (or cu128, ...: torch==2.13.0+cu130 from PyTorch's cu130
#       index, which brings the Triton that build pins), SM12X_TORCH=pypi (PyPI's torch==2.13.0,
#       a CUDA build on Linux x86_64, several GB), SM12X_TORCH=skip (install no torch);
#       SM12X_TORCH_VERSION changes 2.13.0.
#   triton 3.9.0, only when no triton is importable (the CPU build of torch brings none); a Triton
#       that came with a CUDA torch is kept, because that torch pins it.
#   pytest, docker (the Docker SDK), numpy, pyyaml, importlib-metadata; then sm12x itself in editable
#       mode (console script `sm12x`).
#   nothing else unless asked: SM12X_SETUP_DOCKER=1 also makes a Docker engine reachable for
#       tests/docker (scripts/ci_docker.sh: as root it apt-installs Debian's docker.io when no dockerd
#       is installed and starts dockerd in the background; it never fails the setup). Without it the
#       docker tests skip and say why. CI (.ci/run) sets it.
# The last lines printed name the torch and triton the tests will use.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
TORCH_BUILD="${SM12X_TORCH:-cpu}"
TORCH_VERSION="${SM12X_TORCH_VERSION:-2.13.0}"
TRITON_VERSION="3.9.0"

say() { echo "setup: $*" >&2; }
have() { "$PY" -c "import $1" >/dev/null 2>&1; }
pip_install() {
    if ! "$PY" -m pip install -q "$@"; then
        if "$PY" -c 'import sys, sysconfig, os; sys.exit(sys.prefix == sys.base_prefix and os.path.exists(os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED")))' 2>/dev/null; then
            say "pip install $* failed (see above)"
        else
            say "pip install failed: $PY is managed by the OS; make a virtual environment first:" \
                "python3 -m venv .venv && . .venv/bin/activate && bash scripts/setup.sh"
        fi
        exit 1
    fi
}

if have torch; then
    say "keeping the installed torch"
else
    case "$TORCH_BUILD" in
        skip) say "SM12X_TORCH=skip: no torch installed (the kernels, self-test and most tests need one)" ;;
        pypi) say "installing torch==$TORCH_VERSION from PyPI"
              pip_install "torch==$TORCH_VERSION" ;;
        cpu|cu[0-9]*|rocm*|xpu)
              say "installing torch==$TORCH_VERSION+$TORCH_BUILD from https://download.pytorch.org/whl/$TORCH_BUILD"
              pip_install "torch==$TORCH_VERSION+$TORCH_BUILD" --extra-index-url "https://download.pytorch.org/whl/$TORCH_BUILD" ;;
        *) say "SM12X_TORCH=$TORCH_BUILD: use cpu (default), a CUDA tag such as cu130, pypi or skip"
           exit 2 ;;
    esac
fi
if have triton; then
    say "keeping the installed triton"
else
    say "installing triton==$TRITON_VERSION"
    pip_install "triton==$TRITON_VERSION"
fi
pip_install importlib-metadata pytest docker numpy pyyaml
"$PY" -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 \
    || pip_install --no-deps -e .
if [ "${SM12X_SETUP_DOCKER:-0}" = 1 ]; then
    bash scripts/ci_docker.sh || true
else
    say "Docker left alone (SM12X_SETUP_DOCKER=1 sets up an engine for tests/docker, which skip without one)"
fi
"$PY" - "$TRITON_VERSION" <<'EOF' >&2 || true
import sys
try:
    import torch
    build = "CUDA " + torch.version.cuda if torch.version.cuda else "CPU"
    print(f"setup: torch {torch.__version__} ({build} build)")
except Exception as e:
    print(f"setup: no usable torch ({type(e).__name__}: {e})")
try:
    import triton
    note = "" if triton.__version__ == sys.argv[1] else f" (sm12x's CI tests with {sys.argv[1]})"
    print(f"setup: triton {triton.__version__}{note}")
except Exception as e:
    print(f"setup: no usable triton ({type(e).__name__}: {e})")
EOF
