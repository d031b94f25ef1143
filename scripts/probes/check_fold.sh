#!/usr/bin/env bash
# One device call that checks the fold of topk_fold (H200, SM12X_FORCE=1): memcheck the fused top-k at a
# small row count (the same window shape as production: 16,384 columns; PyTorch's caching
# allocator off so an access past a tensor is past its allocation), then the GPU tests of the
# top-k modules, the fused top-k at bench shapes three times, and the top-k benchmark.
# Usage: bash scripts/probes/check_fold.sh
export SM12X_FORCE=1 PYTHONUNBUFFERED=1
echo "== $(uname -r); triton $(python3 -c 'import triton; print(triton.__version__)');" \
     "bundled $(python3 -c 'import triton.backends.nvidia as n, os; print(os.path.dirname(n.__file__))')/bin/ptxas:" \
     "$($(python3 -c 'import triton.backends.nvidia as n, os; print(os.path.dirname(n.__file__))')/bin/ptxas --version | tail -1)"
SAN=$(ls /usr/local/cuda*/bin/compute-sanitizer /opt/nvidia/*/compute-sanitizer 2>/dev/null | head -1)
echo "== memcheck (${SAN:-no compute-sanitizer found})"
[ -n "$SAN" ] && S=512 WS=$((512 * 16384 * 4)) PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 170 "$SAN" \
    --tool memcheck --print-limit 4 python3 scripts/probes/repro.py 2>&1 | grep -v -i warn | tail -14
echo "== GPU tests"
SM12X_TEST_DEVICE=cuda timeout 170 python3 -m pytest -q -m "gpu or not cpu_only" -p no:cacheprovider \
    tests/kernels/test_topk_fold.py tests/kernels/test_topk_select.py tests/kernels/test_topk_merge.py \
    tests/kernels/test_indexer_topk.py 2>&1 | tail -3
echo "== fused top-k at bench shapes (top-512, top-2048), three processes"
for i in 1 2 3; do timeout 40 python3 scripts/probes/repro.py 2>&1 | tail -2; done
echo "== bench_indexer --topk-only"
timeout 80 python3 scripts/bench_indexer.py --topk-only 2>&1 | tail -5
