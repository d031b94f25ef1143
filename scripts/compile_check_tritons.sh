#!/usr/bin/env bash
# The full sm_120/sm_121 compile sweeps (every op's compile test, which asserts the limits and the
# ISA report's full-rate verdict) and the ISA report's summary under other Triton versions: framework images carry older Tritons than the newest on PyPI, and ptxas' register
# use differs between them (Triton 3.6 spills where 3.8 does not). One virtual environment per
# version under ${VENVS:-/tmp/sm12x-tritons}, sharing this interpreter's packages except triton.
# No GPU needed. Usage: bash scripts/compile_check_tritons.sh [VERSION ...]   (default 3.6.0 3.8.0)
set -uo pipefail
cd "$(dirname "$0")/.."
VENVS="${VENVS:-/tmp/sm12x-tritons}"
[ $# -gt 0 ] || set -- 3.6.0 3.8.0
rc=0
# Triton 3.6 / 3.7 bundle CUDA 12.8's cuobjdump, which cannot print sm_121 SASS: the ISA report
# reads it with this Python's (newer) one where there is one
export SM12X_CUOBJDUMP="${SM12X_CUOBJDUMP:-$(python3 -c 'from triton import knobs; print(knobs.nvidia.cuobjdump.path)' 2>/dev/null)}"
for v in "$@"; do
    env_dir="$VENVS/triton-$v"
    if [ ! -x "$env_dir/bin/python" ]; then
        python3 -m venv --system-site-packages "$env_dir" && "$env_dir/bin/pip" install -q "triton==$v" || { rc=1; continue; }
    fi
    echo "== triton $v"
    SM12X_SLOW_TESTS=1 PYTHONPATH=. "$env_dir/bin/python" -m pytest -q -p no:cacheprovider \
        tests/kernels/*/test_*_compile.py 2>&1 | tail -15 || rc=1
    PYTHONPATH=. "$env_dir/bin/python" scripts/isa_report.py --summary-only || rc=1
done
exit $rc
