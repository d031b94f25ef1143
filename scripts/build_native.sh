#!/usr/bin/env bash
# Build FlashMLA (its SM90 kernels only) and DeepGEMM from source, offline, for the "native" row
# of scripts/bench_layer.py on a Hopper GPU (the same V4-Flash layer on their own kernels).
#
#   bash scripts/build_native.sh [--src ARCHIVE] [--target DIR] [--work DIR] [--out DIR]
#                                [--prebuilt DIR] [--warm] [--jobs N]
#
# --src       the sources (default .native/src.tar.xz): FlashMLA and DeepGEMM with the CUTLASS /
#             fmt trees their submodules pin, at the commits its src/VERSIONS file lists
# --target    where flash_mla/ and deep_gemm/ are installed (default /tmp/sm12x-native/site); put
#             it on PYTHONPATH for bench_layer.py. Only a new or empty folder, or one this script
#             installed into before (it holds sm12x_native_versions.txt), is written to.
# --work      the unpacked sources and build trees (default /tmp/sm12x-native/build)
# --out       also pack what was installed into DIR/native-build.tar.xz (split into 15 MiB parts
#             .partNN where larger) and, after --warm, DeepGEMM's kernel cache into
#             DIR/native-jit.tar.xz, so that a later run can take them with --prebuilt instead of
#             compiling (default: not packed)
# --prebuilt  unpack DIR/native-build.tar.xz* (and DIR/native-jit.tar.xz if there) into --target
#             and the kernel cache instead of building
# --warm      compile DeepGEMM's kernels for every step of bench_layer.py's scenario now, one
#             process per step in parallel (DeepGEMM compiles each kernel with nvcc on its first
#             call, one after another; the cache is DG_JIT_CACHE_DIR, default
#             /tmp/sm12x-native/jit, which bench_layer.py must then be given too)
# --jobs      parallel compiler jobs (default 16, FlashMLA's MAX_JOBS)
#
# Time: on a 16-core machine with an H100 and nvcc 13.0, both builds ran side by side in 100-170 s
# (FlashMLA's setup.py compiles 24 translation units; FLASH_MLA_DISABLE_SM100=1 leaves the SM100
# ones empty); DeepGEMM compiles its kernels later, at run time (--warm), with nvcc (its NVRTC
# mode, DG_JIT_USE_NVRTC=1, produced images the driver rejected there). Nothing is downloaded.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
SRC=.native/src.tar.xz
TARGET=/tmp/sm12x-native/site
WORK=/tmp/sm12x-native/build
PACK=
PREBUILT=
WARM=0
JOBS=16
export DG_JIT_CACHE_DIR=${DG_JIT_CACHE_DIR:-/tmp/sm12x-native/jit}

die() { echo "build_native: $*" >&2; exit 2; }
while [ $# -gt 0 ]; do
    case "$1" in
        --src) SRC=${2:?--src needs a path}; shift 2 ;;
        --target) TARGET=${2:?--target needs a folder}; shift 2 ;;
        --work) WORK=${2:?--work needs a folder}; shift 2 ;;
        --out) PACK=${2:?--out needs a folder}; shift 2 ;;
        --prebuilt) PREBUILT=${2:?--prebuilt needs a folder}; shift 2 ;;
        --warm) WARM=1; shift ;;
        --jobs) JOBS=${2:?--jobs needs a number}; shift 2 ;;
        *) die "unknown argument $1 (see the header of scripts/build_native.sh)" ;;
    esac
done
[[ "$JOBS" =~ ^[1-9][0-9]*$ ]] || die "--jobs $JOBS: a positive integer"
STAMP=sm12x_native_versions.txt
if [ -d "$TARGET" ] && [ -n "$(ls -A "$TARGET")" ] && [ ! -f "$TARGET/$STAMP" ]; then
    die "--target $TARGET holds files this script did not install (no $STAMP): give a new or empty folder"
fi
mkdir -p "$TARGET" "$DG_JIT_CACHE_DIR"
TARGET=$(cd "$TARGET" && pwd)

command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ] || die "no nvcc (CUDA's compiler) on PATH or in /usr/local/cuda"
command -v nvcc >/dev/null || export PATH=/usr/local/cuda/bin:$PATH
export CUDA_HOME=${CUDA_HOME:-$(dirname "$(dirname "$(command -v nvcc)")")}
echo "nvcc: $(nvcc --version | grep -o 'release [0-9.]*') ($CUDA_HOME)"
# CUDA 13 moved libcu++ (cuda/std/...) under include/cccl: host files that include CUTLASS, which
# FlashMLA's setup.py compiles with the host compiler alone, find it there only when told
if [ -d "$CUDA_HOME/include/cccl" ]; then
    export CPLUS_INCLUDE_PATH=$CUDA_HOME/include/cccl${CPLUS_INCLUDE_PATH:+:$CPLUS_INCLUDE_PATH}
fi
# A toolchain that links extensions with a static libstdc++ (seen on a CUDA 13 machine) gives
# each extension a private copy: inside a torch process that
# private copy's locale and stream state disagrees with the shared one torch loaded, and DeepGEMM's
# first kernel compile (std::regex, ostringstream) then segfaults. Linking the shared libstdc++
# first leaves nothing to take from the static archive; it is named by its file because a toolchain
# without the unversioned libstdc++.so link resolves -lstdc++ to the archive.
export LDFLAGS="-Wl,--no-as-needed -l:libstdc++.so.6${LDFLAGS:+ $LDFLAGS}"
python3 -c 'import torch; print(f"torch {torch.__version__} (CUDA {torch.version.cuda}); GPU:",
    torch.cuda.get_device_name() if torch.cuda.is_available() else "none")'

elapsed() { echo $(( $(date +%s) - $1 ))s; }

if [ -n "$PREBUILT" ]; then
    parts=("$PREBUILT"/native-build.tar.xz*)
    [ -e "${parts[0]}" ] || die "--prebuilt $PREBUILT has no native-build.tar.xz[.partNN]"
    rm -rf "$TARGET/flash_mla" "$TARGET/deep_gemm"
    cat "${parts[@]}" | xz -d | tar -x -C "$TARGET"
    echo "unpacked ${#parts[@]} file(s) of $PREBUILT into $TARGET"
    if [ -f "$PREBUILT/native-jit.tar.xz" ]; then
        xz -d < "$PREBUILT/native-jit.tar.xz" | tar -x -C "$DG_JIT_CACHE_DIR"
        echo "unpacked DeepGEMM's kernel cache into $DG_JIT_CACHE_DIR ($(ls "$DG_JIT_CACHE_DIR/cache" 2>/dev/null | wc -l) kernels)"
    fi
else
    [ -f "$SRC" ] || die "--src $SRC: no such archive (scripts/pack_native_src.sh makes it)"
    S=$WORK/src
    if [ -f "$S/VERSIONS" ] && [ "$(xz -d < "$SRC" | tar -x -O src/VERSIONS)" = "$(cat "$S/VERSIONS")" ]; then
        # the same sources unpacked before: their build trees are kept, so a build cut short by a
        # time limit goes on where it stopped (ninja skips the objects already compiled)
        echo "reusing the sources and build trees in $WORK"
    else
        rm -rf "$WORK"
        mkdir -p "$WORK"
        xz -d < "$SRC" | tar -x -C "$WORK"
    fi
    cat "$S/VERSIONS"
    # FlashMLA's setup.py runs `git submodule update` unconditionally: where git is missing, a
    # stand-in that fails (the trees are already in place) keeps it from stopping the build
    if ! command -v git >/dev/null; then
        mkdir -p "$WORK/bin" && printf '#!/bin/sh\nexit 1\n' > "$WORK/bin/git" && chmod +x "$WORK/bin/git"
        export PATH=$WORK/bin:$PATH
    fi
    t0=$(date +%s)
    (cd "$S/flashmla" && FLASH_MLA_DISABLE_SM100=1 MAX_JOBS=$JOBS NVCC_THREADS=1 \
        python3 setup.py build_ext --inplace) > "$WORK/flashmla.log" 2>&1 &
    fm=$!
    (cd "$S/deepgemm" && python3 setup.py build) > "$WORK/deepgemm.log" 2>&1 &
    dg=$!
    rc=0
    wait $dg || { rc=1; echo "DeepGEMM build FAILED ($(elapsed $t0)); the end of $WORK/deepgemm.log:"; tail -40 "$WORK/deepgemm.log"; }
    [ $rc = 1 ] || echo "DeepGEMM built in $(elapsed $t0)"
    wait $fm || { rc=1; echo "FlashMLA build FAILED ($(elapsed $t0)); the errors of $WORK/flashmla.log:";
                  grep -E -m 20 -B2 -A6 'error|Error' "$WORK/flashmla.log" | tail -60; }
    [ $rc = 1 ] || echo "FlashMLA built in $(elapsed $t0)"
    [ $rc = 0 ] || exit 1
    dg_pkg=$(dirname "$(find "$S/deepgemm/build" -path '*/deep_gemm/_C*.so' | head -1)")
    ls "$S"/flashmla/flash_mla/cuda*.so >/dev/null 2>&1 || die "FlashMLA's build made no flash_mla/cuda*.so"
    [ "$dg_pkg" != . ] || die "DeepGEMM's build made no deep_gemm/_C*.so"
    for so in "$dg_pkg"/_C*.so "$S"/flashmla/flash_mla/cuda*.so; do
        if ! readelf -d "$so" | grep -q 'libstdc++\.so'; then
            echo "g++ finds libstdc++.so at: $(g++ -print-file-name=libstdc++.so); LDFLAGS=$LDFLAGS"
            grep -h -- ' -shared' "$WORK"/deepgemm.log "$WORK"/flashmla.log | tail -2 | cut -c1-1500
            die "$so does not load the shared libstdc++ (a static copy crashes inside torch)"
        fi
    done
    rm -rf "$TARGET/flash_mla" "$TARGET/deep_gemm"
    cp -r "$S/flashmla/flash_mla" "$TARGET/"
    cp -r "$dg_pkg" "$TARGET/"
    cp "$S/VERSIONS" "$TARGET/$STAMP"
    if [ -n "$PACK" ]; then
        mkdir -p "$PACK"
        tar -C "$TARGET" -cf - . | xz -T"$JOBS" -6 > "$PACK/native-build.tar.xz"
        if [ "$(stat -c %s "$PACK/native-build.tar.xz")" -gt $((15 * 1024 * 1024)) ]; then
            split -b 15M -d -a 2 "$PACK/native-build.tar.xz" "$PACK/native-build.tar.xz.part"
            rm "$PACK/native-build.tar.xz"
        fi
        echo "packed into $PACK: $(cd "$PACK" && ls -s --block-size=M native-build.tar.xz* | tr '\n' ' ')"
    fi
fi

# what was installed, and that both import and run a call here
PYTHONPATH=$TARGET python3 - <<'EOF'
import torch
import deep_gemm
import flash_mla
print(f"installed: deep_gemm {deep_gemm.__version__} ({deep_gemm.__file__}), flash_mla {flash_mla.__version__} "
      f"({flash_mla.__file__})")
if torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9:
    m, n, k = 64, 256, 512
    a = torch.randn(m, k, device="cuda")
    b = torch.randn(n, k, device="cuda")
    sa = a.view(m, k // 128, 128).abs().amax(-1) / 448
    sb = b.view(n // 128, 128, k // 128, 128).abs().amax((1, 3)) / 448
    aq = (a / sa.repeat_interleave(128, 1)).to(torch.float8_e4m3fn)
    bq = (b / sb.repeat_interleave(128, 0).repeat_interleave(128, 1)).to(torch.float8_e4m3fn)
    d = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    deep_gemm.fp8_gemm_nt((aq, deep_gemm.get_mn_major_tma_aligned_tensor(sa)), (bq, sb), d)
    ref = (aq.float() * sa.repeat_interleave(128, 1)) @ (bq.float() * sb.repeat_interleave(128, 0).repeat_interleave(128, 1)).T
    err = float((d.float() - ref).norm() / ref.norm())
    print(f"DeepGEMM fp8_gemm_nt (SM90, JIT-compiled here) rel err {err:.2e}: {'ok' if err < 1e-2 else 'WRONG'}")
    assert err < 1e-2
EOF

if [ "$WARM" = 1 ]; then
    t0=$(date +%s)
    pids=()
    mkdir -p "$WORK"
    for i in 0 1 2 3 4 5; do
        PYTHONPATH=$TARGET python3 scripts/bench_layer.py --warm-native "$i" > "$WORK/warm$i.log" 2>&1 &
        pids+=($!)
    done
    rc=0
    for i in "${!pids[@]}"; do
        wait "${pids[$i]}" || { rc=1; echo "warm-up of step $i FAILED:"; tail -20 "$WORK/warm$i.log"; }
    done
    cat "$WORK"/warm*.log | grep '^warm' || true
    echo "DeepGEMM kernels compiled in $(elapsed $t0): $(ls "$DG_JIT_CACHE_DIR/cache" 2>/dev/null | wc -l) in $DG_JIT_CACHE_DIR"
    if [ -n "$PACK" ]; then
        mkdir -p "$PACK"
        tar -C "$DG_JIT_CACHE_DIR" -cf - . | xz -T"$JOBS" -6 > "$PACK/native-jit.tar.xz"
        echo "packed the kernel cache into $PACK/native-jit.tar.xz ($(ls -s --block-size=M "$PACK/native-jit.tar.xz" | cut -d' ' -f1))"
    fi
    [ $rc = 0 ] || exit 1
fi
echo "native build ready: PYTHONPATH=$TARGET DG_JIT_CACHE_DIR=$DG_JIT_CACHE_DIR python3 scripts/bench_layer.py"
