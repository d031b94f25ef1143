#!/usr/bin/env bash
# Pack the sources scripts/build_native.sh compiles into one archive (default .native/src.tar.xz,
# git-ignored: third-party source is not part of this repository): FlashMLA and DeepGEMM at the
# commits below, and the CUTLASS and fmt trees their submodules pin at those commits, only the
# parts their builds read (CUTLASS's include/, plus tools/util/include for FlashMLA; fmt's
# include/). About 60 MB of source, 2.5 MB packed. Nothing is downloaded.
#
#   bash scripts/pack_native_src.sh FLASHMLA_GIT DEEPGEMM_GIT CUTLASS_GIT FMT_GIT [ARCHIVE]
#
# Each *_GIT is a clone or bare mirror of that project (github.com/deepseek-ai/FlashMLA,
# deepseek-ai/DeepGEMM, NVIDIA/cutlass, fmtlib/fmt) holding the commit it is asked for.
set -euo pipefail
FLASHMLA_COMMIT=9241ae3ef9bac614dd25e45e507e089f888280e0   # 2026-04-29
DEEPGEMM_COMMIT=54e22612409371d6364144b69086735beb54e98b   # 2026-06-23, DeepGEMM 2.6.1
[ $# -ge 4 ] || { echo "usage: bash scripts/pack_native_src.sh FLASHMLA_GIT DEEPGEMM_GIT CUTLASS_GIT FMT_GIT [ARCHIVE]" >&2; exit 2; }
FM=$1 DG=$2 CUTLASS=$3 FMT=$4
ARCHIVE=${5:-$(cd "$(dirname "$0")/.." && pwd)/.native/src.tar.xz}
for repo in "$FM" "$DG" "$CUTLASS" "$FMT"; do
    git -C "$repo" rev-parse --git-dir >/dev/null 2>&1 || { echo "pack_native_src: $repo is not a git repository" >&2; exit 2; }
done
pin() { git -C "$1" ls-tree "$2" "$3" | awk '$2 == "commit" {print $3}'; }
CUTLASS_FM=$(pin "$FM" "$FLASHMLA_COMMIT" csrc/cutlass)
CUTLASS_DG=$(pin "$DG" "$DEEPGEMM_COMMIT" third-party/cutlass)
FMT_DG=$(pin "$DG" "$DEEPGEMM_COMMIT" third-party/fmt)
[ -n "$CUTLASS_FM" ] && [ -n "$CUTLASS_DG" ] && [ -n "$FMT_DG" ] || { echo "pack_native_src: a submodule pin was not found" >&2; exit 1; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
S=$tmp/src
mkdir -p "$S/flashmla/csrc/cutlass" "$S/deepgemm/third-party/cutlass" "$S/deepgemm/third-party/fmt"
export_tree() { local repo=$1 commit=$2 dest=$3; shift 3; git -C "$repo" archive "$commit" "$@" | tar -x -C "$dest"; }
export_tree "$FM" "$FLASHMLA_COMMIT" "$S/flashmla" setup.py LICENSE README.md csrc flash_mla
export_tree "$DG" "$DEEPGEMM_COMMIT" "$S/deepgemm" setup.py LICENSE README.md csrc deep_gemm scripts/generate_pyi.py
export_tree "$CUTLASS" "$CUTLASS_FM" "$S/flashmla/csrc/cutlass" include tools/util/include LICENSE.txt
export_tree "$CUTLASS" "$CUTLASS_DG" "$S/deepgemm/third-party/cutlass" include LICENSE.txt
export_tree "$FMT" "$FMT_DG" "$S/deepgemm/third-party/fmt" include LICENSE
version=$(git -C "$DG" show "$DEEPGEMM_COMMIT:deep_gemm/__init__.py" | sed -n "s/^__version__ = '\(.*\)'/\1/p")
cat > "$S/VERSIONS" <<EOF
FlashMLA https://github.com/deepseek-ai/FlashMLA $FLASHMLA_COMMIT $(git -C "$FM" log -1 --format=%cs "$FLASHMLA_COMMIT")
  csrc/cutlass: NVIDIA/cutlass $CUTLASS_FM (include, tools/util/include)
DeepGEMM https://github.com/deepseek-ai/DeepGEMM $DEEPGEMM_COMMIT $(git -C "$DG" log -1 --format=%cs "$DEEPGEMM_COMMIT") version $version
  third-party/cutlass: NVIDIA/cutlass $CUTLASS_DG (include)
  third-party/fmt: fmtlib/fmt $FMT_DG (include)
EOF
mkdir -p "$(dirname "$ARCHIVE")"
tar -C "$tmp" -cf - src | xz -6 > "$ARCHIVE.tmp"
mv "$ARCHIVE.tmp" "$ARCHIVE"
cat "$S/VERSIONS"
echo "packed $(find "$S" -type f | wc -l) files into $ARCHIVE ($(du -h "$ARCHIVE" | cut -f1))"
