#!/usr/bin/env bash
# Everything that needs a CUDA GPU, in one go (on a GPU that is not SM12x, SM12X_FORCE=1 applies the
# SM12x replacements there):
# GPU tests (default configs and the sm_120 configs), the self-test, the benchmarks.
# Results go to ${OUT:-./out}. Usage: bash scripts/gpu_check.sh [--quick]
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-./out}"; mkdir -p "$OUT"
export SM12X_FORCE=1 PYTHONUNBUFFERED=1 TRITON_DEFAULT_FP_FUSION=1
QUICK="${1:-}"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT/gpu.txt"
python3 -c "import torch, triton, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/gpu.txt"
rc=0
echo "== GPU tests (default configs)"
SM12X_TEST_DEVICE=cuda python3 -m pytest -q -m gpu tests/kernels -p no:cacheprovider 2>&1 | tee "$OUT/gpu_tests.txt" | tail -25 || rc=1
echo "== GPU tests (sm_120 configs)"
SM12X_TEST_DEVICE=cuda SM12X_KERNEL_CONFIGS=sm_120 python3 -m pytest -q -m gpu tests/kernels -p no:cacheprovider 2>&1 | tee "$OUT/gpu_tests_sm120.txt" | tail -25 || rc=1
echo "== selftest --quick"
t0=$SECONDS; python3 -m sm12x selftest --quick --json "$OUT/selftest.json" 2>&1 | tee "$OUT/selftest.txt" || rc=1; echo "selftest wall $((SECONDS - t0)) s" | tee -a "$OUT/selftest.txt"
echo "== benchmarks"
# every benchmark the op registry names, once each
for bench in $(python3 -c "from sm12x.kernels.registry import all_ops; print(*sorted({o.benchmark for o in all_ops() if o.benchmark}))"); do
    python3 "$bench" $QUICK 2>&1 | tee "$OUT/$(basename "$bench" .py).md" || rc=1
done
exit $rc
