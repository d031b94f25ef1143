#!/usr/bin/env bash
# Extract, from the real framework wheels, only the modules scripts/prove_1m_indexer.py runs as the
# frameworks' own code (every other module they import is a stand-in in scripts/prove_1m/stand_ins.py), plus
# each release's dist-info METADATA (sm12x reads the release from it to pick its patch records).
#
#   scripts/extract_indexer_sources.sh WHEEL_DIR [OUT_DIR]      (OUT_DIR defaults to .proof-src)
#
# WHEEL_DIR holds vllm-0.34.0-*.whl, vllm-0.25.1-*.whl and sglang-0.5.23-*.whl (a missing one
# is reported and skipped). OUT_DIR/<dist>-<version>/ gets the files; about 500 KB in all, so
# it can be carried to a GPU machine. OUT_DIR is git-ignored: nothing of theirs is committed.
set -euo pipefail

wheels=${1:?usage: $0 WHEEL_DIR [OUT_DIR]}
out=${2:-.proof-src}

# release -> the modules the proof runs from it
declare -A MODULES=(
  [vllm-0.34.0]="vllm/model_executor/layers/sparse_attn_indexer.py
                 vllm/model_executor/layers/indexer_topk.py
                 vllm/model_executor/kernels/attention/dsa/fused_mqa_topk.py
                 vllm/model_executor/kernels/attention/dsa/candidate_blocks.py
                 vllm/models/glm5next/sparse_indexer.py
                 vllm/models/glm5next/nvidia/sparse_indexer.py
                 vllm/models/glm5next/common/sparse_indexer.py
                 vllm/models/glm5next/nvidia/ops/kpool_compress.py"
  [vllm-0.25.1]="vllm/model_executor/layers/sparse_attn_indexer.py"
  [sglang-0.5.23]="sglang/srt/layers/attention/dsv4/indexer.py
                   sglang/srt/layers/attention/dsv4/v41_indexer/__init__.py
                   sglang/srt/layers/attention/dsv4/v41_indexer/types.py
                   sglang/srt/layers/attention/dsv4/v41_indexer/sparse_table.py
                   sglang/srt/layers/attention/dsv4/v41_indexer/scoring.py
                   sglang/srt/layers/attention/dsv4/v41_indexer/full_topk.py
                   sglang/srt/layers/attention/dsv4/v41_indexer/dense_blocks.py
                   sglang/kernels/ops/attention/dsv4/index_logits.py
                   sglang/kernels/ops/attention/dsv4/candidate_blocks.py
                   sglang/kernels/ops/attention/dsv4/candidate_table.py
                   sglang/kernels/ops/attention/dsv4/topk.py
                   sglang/kernels/ops/attention/dsv4/utils.py
                   sglang/srt/layers/deep_gemm_wrapper/configurer.py"
)

status=0
for release in vllm-0.34.0 vllm-0.25.1 sglang-0.5.23; do
  dist=${release%%-*}
  version=${release#*-}
  wheel=$(ls "$wheels"/"$dist"-"$version"-*.whl 2>/dev/null | head -n1 || true)
  if [[ -z $wheel ]]; then
    echo "skip $release: no $dist-$version-*.whl in $wheels" >&2
    status=1
    continue
  fi
  dest=$out/$release
  rm -rf "$dest"
  mkdir -p "$dest"
  # shellcheck disable=SC2086
  unzip -q -o "$wheel" ${MODULES[$release]} "$dist-$version.dist-info/METADATA" -d "$dest"
  echo "$release: $(find "$dest" -type f | wc -l) files from $(basename "$wheel")"
done
du -sh "$out" | awk '{print "total: " $1}'
exit $status
