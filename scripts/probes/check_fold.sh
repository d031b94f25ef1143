#!/usr/bin/env bash
# One device call for the topk-fold branch (H200, SM12X_FORCE=1): memcheck the fused top-k at a
# small row count (the same window shape as production: 16,384 columns), then the GPU tests of
# the top-k modules, then the top-k benchmark. Usage: bash scripts/probes/check_fold.sh
export SM12X_FORCE=1
SAN=$(ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
echo "== memcheck (${SAN:-no compute-sanitizer found})"
[ -n "$SAN" ] && S=512 WS=$((512 * 16384 * 4)) timeout 150 "$SAN" --tool memcheck --print-limit 4 \
    python scripts/probes/repro.py 2>&1 | grep -v -i warn | tail -14
echo "== GPU tests"
SM12X_TEST_DEVICE=cuda timeout 200 python -m pytest -q -m "gpu or not cpu_only" -p no:cacheprovider \
    tests/kernels/test_topk_fold.py tests/kernels/test_topk_select.py tests/kernels/test_topk_merge.py \
    tests/kernels/test_indexer_topk.py 2>&1 | tail -3
echo "== repeat at bench shapes (top-512, top-2048)"
timeout 60 python scripts/probes/repro.py 2>&1 | tail -3
echo "== bench_indexer --topk-only"
timeout 90 python scripts/bench_indexer.py --topk-only 2>&1 | tail -5
