"""Prove the 1M-token indexer pass on the frameworks' own code: vLLM's ``sparse_attn_indexer``
(0.34.0 and 0.25.1: a prefill chunk and decode rows) and SGLang 0.5.23's DeepSeek-V4
``C4IndexerBackendMixin.forward_c4_indexer`` (SM120's default paged route: a prefill chunk and
decode rows), run with sm12x's indexer top-k records applied and without them. With ``--v41``,
vLLM 0.34.0 also runs DeepSeek-V4.1's two-level selection: for a prefill chunk and for decode
rows, the candidate source layer (``candidate_write``: publishes each row's best blocks) and a
consumer layer (ranks only keys in them), through vLLM's own ``candidate_blocks`` kernels when
unpatched; the source's index sets and the published blocks are compared exactly, a consumer's
(which sm12x ranks in another logits kernel: ``prove_1m.run.compare_v41``) against the float32
reference where they differ. With
``--glm5next``, vLLM 0.34.0 also runs GLM-5-next's pool indexer (``SparseAttnIndexerKpool`` from
``models/glm5next``, a prefill chunk and decode rows; keys are pools of ``--index-kpool`` tokens;
``scripts/prove_1m/glm5next.py`` says what runs and how the indices are compared).
With ``--v41``, SGLang 0.5.23 also runs its own V4.1 candidate indexer package (``v41_indexer``) on a
GPU it reads as SM120: the attention backend's ``make_candidate_indexer`` (SGLang's
``RuntimeError`` unpatched, the sparse-table backend patched) and a candidate source layer with
a consumer layer in a prefill chunk and in decode (whole and in SGLang's row chunks), checked
against sm12x's references in both modes
(``scripts/prove_1m/sglang_v41.py`` says what runs and what stands in).

    scripts/extract_indexer_sources.sh /tmp/moe-wheels .proof-src
    python3 scripts/prove_1m_indexer.py --src .proof-src                          # on a GPU
    python3 scripts/prove_1m_indexer.py --src .proof-src --device cpu --keys 512 --queries 16 --decode-rows 2 \\
        --topk 16 --heads 8 --dim 128                                                       # interpreter

What runs as the frameworks' code: the modules ``extract_indexer_sources.sh`` takes from the
wheels (vLLM: ``sparse_attn_indexer``, and for 0.34 ``indexer_topk`` and ``fused_mqa_topk``;
SGLang: ``srt/layers/attention/dsv4/indexer``, and for ``--v41`` its V4.1 indexer package with
the kernel-op modules it calls, listed in ``scripts/prove_1m/sglang_v41.py``). Every other module
they import is a stand-in
(``scripts/prove_1m/stand_ins.py``: ``vllm_stand_ins``, ``sglang_stand_ins``): configuration, distributed state,
forward context, metadata classes, and the compiled kernels they call, which are absent on the
a GPU machine without the frameworks:

- DeepGEMM's logits (vLLM's ``vllm.utils.deep_gemm`` wrappers) are sm12x's DeepGEMM front end;
  SGLang's TileLang paged logits are a stand-in that sm12x's DeepGEMM record
  ``sglang.dsa.tilelang_paged_logits`` replaces with its paged logits kernel (on SM12x those
  records put these kernels there; its layer ``sglang.dsv4.paged_indexer.tilelang`` is the
  patched runs' placeholder);
- the frameworks' compiled top-k over materialised logits (vLLM's ``top_k_per_row_prefill`` and
  ``torch.ops._C.persistent_topk``, SGLang's ``topk_transform_paged``) are ``logits_topk``: the
  same selection semantics (the k best visible keys, -1 padded; SGLang: rows of at most topk keys
  take positions 0..n-1) through sm12x's radix select, which allocates O(rows x topk) like the
  CUDA kernels they stand for;
- vLLM's indexer-cache gather (``cp_gather_indexer_k_quant_cache``) is a torch copy.

"Unpatched" is the same process set-up with sm12x's indexer top-k records skipped
(``SM12X_SKIP``): the framework computes [rows, keys] logits and runs its top-k on them, as
SM12x serves it with only the DeepGEMM records. "Patched" applies every record. The workers get
``SM12X_FORCE=1`` (the records on a GPU that is not SM12x, e.g. an H200) and on the CPU
``SM12X_ARCH=12.0``. Each (release, mode) runs in its own interpreter, so the records apply at
import as they do in a server.

Shapes (defaults: DeepSeek-V3.2's indexer, 64 heads x 128, top-2048; ``--keys`` counts indexer
keys, i.e. compressed entries for DeepSeek-V4's C4 indexer): one request whose prefill chunk is
the last ``--queries`` tokens of a ``--keys`` context (row i sees keys [0, keys - queries + i +
1)), and ``--decode-rows`` decode requests each seeing about ``--keys`` keys (their block tables
share the cache pages). The unpatched function steps up the context (``--contexts``) until it
fails or its peak passes ``--memory-cap-gib`` (enforced with
``torch.cuda.set_per_process_memory_fraction``); the patched one runs at every step and at the
full ``--keys``. Where both ran, the indices are compared as sets per row; a row whose sets
differ passes only when every differing key scores within ``TIE_TOL`` (relative: float32
accumulation order) of the row's k-th score in the reference logits
(``sm12x.kernels.indexer.reference``), i.e. a tie at the k-th score, which each top-k may break
its own way; such rows are counted in the table. Any other difference, or a
failing patched pass, exits 1.

Memory: ``torch.cuda.max_memory_allocated`` during the pass minus what was allocated before it
(the inputs: key cache, queries, weights, index buffers); time: the median of ``--reps`` timed
calls after one warm-up call (CUDA events). The table is markdown for docs/performance.md.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the prove_1m package beside this script

from prove_1m import run  # noqa: E402 (its module: the test replaces the reference scores there)
from prove_1m.common import BLOCK, RELEASES, REPO  # noqa: E402,F401 (BLOCK: the test reads it here)
from prove_1m.report import report, table  # noqa: E402,F401 (table: the test's)
from prove_1m.run import Inputs, compare, compare_v41, run_worker, worker  # noqa: E402,F401 (the test's)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--src", default=os.path.join(REPO, ".proof-src"),
                   help="folder of extracted sources (scripts/extract_indexer_sources.sh), or a stand-in tree")
    p.add_argument("--releases", default=",".join(RELEASES))
    p.add_argument("--device", default="cuda")
    p.add_argument("--keys", type=int, default=1 << 20, help="indexer keys of the full context")
    p.add_argument("--queries", type=int, default=8192, help="rows of the prefill chunk")
    p.add_argument("--decode-rows", type=int, default=64)
    p.add_argument("--topk", type=int, default=2048)
    p.add_argument("--heads", type=int, default=64)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--contexts", default="", help="unpatched step-up, comma-separated keys "
                   "(default: --keys / 8, / 4, / 2, --keys, those >= --queries)")
    p.add_argument("--memory-cap-gib", type=float, default=32.0,
                   help="the unpatched step-up stops where a pass needs more (default: an RTX 5090's 32 GiB)")
    p.add_argument("--budget-s", type=float, default=0.0,
                   help="wall-clock budget: passes not started by then are reported as not run")
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--markdown", default="", help="also write the table to this file")
    p.add_argument("--json", default="", help="also write every measured row (JSON list) to this file")
    p.add_argument("--v41", action="store_true",
                   help="also run DeepSeek-V4.1's passes (vLLM 0.34.0: candidate source and consumer layers)")
    p.add_argument("--passes", default="",
                   help="run only these passes (comma list, e.g. init-v41,decode-v41); default: every pass")
    p.add_argument("--candidate-block-size", type=int, default=64,
                   help="V4.1 candidate block size, in indexer keys (default 64)")
    p.add_argument("--candidate-blocks", type=int, default=0,
                   help="V4.1 candidate blocks per row (default: topk / block size + 2, so that a consumer row "
                        "of more than topk keys keeps at least topk of them)")
    p.add_argument("--glm5next", action="store_true",
                   help="also run GLM-5-next's passes (vLLM 0.34.0: SparseAttnIndexerKpool, prefill and decode; "
                        "keys are pools)")
    p.add_argument("--index-kpool", type=int, default=4, help="GLM-5-next tokens per indexer pool (default 4)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--release", help=argparse.SUPPRESS)
    p.add_argument("--mode", help=argparse.SUPPRESS)
    p.add_argument("--work", help=argparse.SUPPRESS)
    p.add_argument("--deadline", type=float, default=0.0, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.contexts:
        args.context_list = sorted(int(c) for c in args.contexts.split(","))
    else:
        args.context_list = sorted({max(args.queries, args.keys >> s) for s in (3, 2, 1, 0)})
    args.release_list = [r for r in args.releases.split(",") if r]
    args.pass_list = tuple(x for x in args.passes.split(",") if x)
    if not args.candidate_blocks:
        args.candidate_blocks = -(-args.topk // args.candidate_block_size) + 2
    if args.budget_s and not args.worker:
        args.deadline = time.time() + args.budget_s
    if not args.release_list:
        p.error(f"--releases: none given (from {RELEASES})")
    unknown = set(args.release_list) - set(RELEASES)
    if unknown:
        p.error(f"--releases: {sorted(unknown)} not among {RELEASES}")
    if args.glm5next and (args.index_kpool < 2 or args.topk % args.index_kpool):
        p.error(f"--index-kpool: {args.index_kpool} must be at least 2 and divide --topk {args.topk}")
    if args.keys < args.queries or min(args.context_list) < args.queries:
        p.error("every context needs at least --queries keys (the chunk's rows are its last tokens)")
    return args


def main(argv=None):
    args = parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    missing = [r for r in args.release_list if not os.path.isdir(os.path.join(args.src, r))]
    if missing:
        print(f"prove_1m_indexer: {args.src} has no {', '.join(missing)} "
              f"(scripts/extract_indexer_sources.sh WHEEL_DIR {args.src})", file=sys.stderr)
        return 2
    rows, outcomes = [], {}
    with tempfile.TemporaryDirectory(prefix="prove-1m-") as work:
        for release in args.release_list:
            for mode in ("unpatched", "patched"):
                got, applied = run_worker(args, release, mode, work)
                rows += got
                outcomes[(release, mode)] = applied
                text, failures = report(args, rows)  # written after every worker: a cut-off run keeps them
    print(text)
    applied = {r: sorted(k for k, v in o.items() if v == "applied") for (r, m), o in outcomes.items() if m == "patched"}
    print("\nsm12x indexer top-k records applied (patched runs): "
          + "; ".join(f"{r}: {len(v)}" for r, v in applied.items()))
    for failure in failures:
        print(f"FAIL: {failure}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
