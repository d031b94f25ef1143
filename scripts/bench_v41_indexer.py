"""Benchmark DeepSeek-V4.1's candidate-only indexer logits (sm12x's DeepGEMM-compatible
``fp8_fp4_paged_sparse_mqa_logits``) against the dense paged FP4 logits over each row's whole
context (sm12x's ``fp8_fp4_paged_mqa_logits``: what a consumer layer would score without the
candidate blocks; DeepGEMM's own sparse kernel is SM100-only, so nothing else runs on SM12x).

Decode rows of 32 index heads (head_dim 128, FP4 index-K pool of 64-slot pages), each with 512
published blocks of 8 positions; contexts in compressed positions. Prints one markdown table: the
time of each, the keys each reads per row, and the ratio.

A second table (per ``--candidates`` shape: 18 blocks of 64, 512 of 8) races vLLM 0.34's V4.1
decode step on SM12x (64 FP8 index heads, 64-slot pages, top-1024, ``max_model_len`` wide) against sm12x's fused candidate top-k
(``sm12x.kernels.indexer.candidate_topk``), for the candidate source and a consumer layer: the
materialised side is sm12x's paged logits (what the DeepGEMM records serve) with the block
selection / mask of ``sm12x.kernels.indexer.reference`` and ``torch.topk`` standing for vLLM's
Triton steps and radix top-k (those run as vLLM's own in ``scripts/prove_1m_indexer.py --v41``,
which times both paths through vLLM's indexer). Its consumer rows also give the fused top-k's
other consumer structure, every visible key scored and masked, where the default ranks the
candidate keys only (``sm12x.kernels.indexer.candidate_gather``). Needs a CUDA GPU.

    python3 scripts/bench_v41_indexer.py [--rows 64] [--contexts 32768,131072,262144] [--graph]

``--graph`` adds columns to the second table: each call captured in a CUDA graph and timed by
replay, as the frameworks run decode (no host launch gaps between its kernels: the eager columns
are the host's launch rate wherever the kernels are short; the performance model's sm_90
validation rows, ``scripts/perf_model.py`` ``MEASURED_H100``, take the fused one).
"""
from __future__ import annotations

import argparse
import datetime
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--blocks", type=int, default=512, help="published blocks per row (8 positions each)")
    ap.add_argument("--contexts", default="32768,131072,262144", help="compressed positions per row")
    ap.add_argument("--candidates", default="18x64,512x8",
                    help="second table: candidate blocks per row x positions per block, comma-separated")
    ap.add_argument("--graph", action="store_true", help="also time the fused candidate top-k by CUDA-graph replay")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("bench_v41_indexer: needs a CUDA GPU", file=sys.stderr)
        return 2
    from triton.testing import do_bench

    from sm12x.frontends.deep_gemm import indexer, sparse_indexer
    from sm12x.kernels.indexer.cache import quant_fp4_per_token

    dev, page, bs = torch.device("cuda"), 64, 8
    g = torch.Generator(device=dev).manual_seed(0)
    print(f"# V4.1 candidate-only indexer logits — {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC}")
    print(f"GPU: {torch.cuda.get_device_name()}; torch {torch.__version__}; rows {args.rows}, "
          f"{args.heads} heads, {args.blocks} blocks of {bs}")
    print()
    print("| context | sparse (us) | keys / row | dense (us) | keys / row | dense / sparse |")
    print("|---|---|---|---|---|---|")
    for ctx in (int(c) for c in args.contexts.split(",")):
        pages = -(-ctx // page)
        npages = args.rows * pages
        cache = torch.randint(0, 256, (npages, page, 1, 68), dtype=torch.uint8, device=dev, generator=g)
        cache.view(npages, -1)[:, page * 64:] = 127  # ue8m0 scale bytes of 1.0
        q, q_sf = quant_fp4_per_token(torch.randn(args.rows, args.heads, 128, device=dev, generator=g))
        w = torch.randn(args.rows, args.heads, device=dev, generator=g)
        lens = torch.full((args.rows,), ctx, dtype=torch.int32, device=dev)
        table = torch.randperm(npages, device=dev, generator=g).view(args.rows, pages).int()
        nblk = -(-ctx // bs)
        blocks = torch.stack([torch.cat([torch.randperm(nblk - 1, device=dev, generator=g)[: args.blocks - 1],
                                         torch.tensor([nblk - 1], device=dev)]).sort().values
                              for _ in range(args.rows)]).int()
        meta = sparse_indexer.get_paged_sparse_mqa_logits_metadata(lens, table, None, page, blocks, torch.int8, bs)
        qq = (q[:, None], q_sf[:, None])
        sparse = do_bench(lambda: sparse_indexer.fp8_fp4_paged_sparse_mqa_logits(qq, cache, w, meta, args.blocks, bs))
        sched = indexer.get_paged_mqa_logits_metadata(lens[:, None], page, indexer.get_num_sms())
        dense = do_bench(lambda: indexer.fp8_fp4_paged_mqa_logits(qq, cache, w, lens[:, None], table, sched, ctx))
        print(f"| {ctx} | {sparse * 1e3:.1f} | {args.blocks * bs} | {dense * 1e3:.1f} | {ctx} | "
              f"{dense / sparse:.1f}x |")
    for spec in args.candidates.split(","):
        kb, block = (int(x) for x in spec.split("x"))
        candidate_topk_table(args, dev, block=block, kb=kb)
    return 0


def candidate_topk_table(args, dev, topk=1024, block=64, kb=18, heads=64, model_len=262144):
    """vLLM 0.34's V4.1 decode step, materialised against fused (see the module docstring)."""
    from triton.testing import do_bench

    from sm12x.frontends.deep_gemm import indexer
    import gpu_timing
    from sm12x.kernels.indexer import candidate_gather as cg
    from sm12x.kernels.indexer import candidate_topk as ct
    from sm12x.kernels.indexer.cache import quant_fp8_paged_cache
    from sm12x.kernels.indexer.reference import ref_candidate_mask, ref_select_candidate_blocks

    print()
    print(f"V4.1 decode step, {args.rows} rows, {heads} FP8 heads, top-{topk}, {kb} candidate blocks of {block}, "
          f"max_model_len {model_len}")
    print()
    graph_cols = (" fused, CUDA graph (us) | materialised, CUDA graph (us) | every key scored, CUDA graph (us) |"
                  if args.graph else "")
    print("| context | layer | materialised (us) | fused (us) | materialised / fused | fused, every key scored (us) "
          f"| logits (MiB) |{graph_cols}")
    print("|---|---|---|---|---|---|---|" + ("---|---|---|" if args.graph else ""))
    g = torch.Generator(device=dev).manual_seed(1)
    for ctx in (int(c) for c in args.contexts.split(",")):
        pages = -(-ctx // 64)
        # each row its own pages, as each request has in a server (rows sharing pages would read
        # them from L2: the source's read would then beat DRAM's rate)
        cache = quant_fp8_paged_cache(torch.randn(args.rows * pages, 64, 128, device=dev, generator=g,
                                                  dtype=torch.bfloat16))
        q = (torch.randn(args.rows, 1, heads, 128, device=dev, generator=g).to(torch.float8_e4m3fn), None)
        w = torch.randn(args.rows, heads, device=dev, generator=g)
        lens = torch.full((args.rows, 1), ctx, dtype=torch.int32, device=dev)
        table = torch.arange(args.rows * pages, device=dev, dtype=torch.int32).view(args.rows, pages)
        table = torch.nn.functional.pad(table, (0, model_len // 64 - pages))
        ends = lens.reshape(-1)
        blocks = torch.empty((args.rows, kb), dtype=torch.int32, device=dev)

        def materialised(write):
            logits = indexer.fp8_fp4_paged_mqa_logits(q, cache, w, lens, table, None, model_len, clean_logits=False)
            if write:
                blocks.copy_(ref_select_candidate_blocks(logits, ends, kb, block))
            else:
                logits = ref_candidate_mask(logits, ends, blocks, block)
            return logits.topk(topk, dim=-1)

        def fused(write):
            return ct.paged_mqa_candidate_topk_indices(q, cache, w, lens, table, model_len, topk, block_size=block,
                                                       candidates=blocks, write=write)

        for write, layer in ((True, "source"), (False, "consumer")):
            m = do_bench(lambda: materialised(write))
            f = do_bench(lambda: fused(write))
            every = every_graph = "-"
            if not write and cg.worthwhile(model_len, kb, block):
                # the consumer's other structure: score every visible key, mask outside the candidates
                ratio, cg.MIN_WIDTH_RATIO = cg.MIN_WIDTH_RATIO, 1 << 62
                try:
                    every = f"{do_bench(lambda: fused(write)) * 1e3:.1f}"
                    if args.graph:  # captured while the other structure is chosen
                        every_graph = f"{do_bench(gpu_timing.graphed(lambda: fused(write))) * 1e3:.1f}"
                finally:
                    cg.MIN_WIDTH_RATIO = ratio
            replay = ""
            if args.graph:
                try:  # the stand-in steps are capture-safe (no host sync); a torch that disagrees gets "-"
                    mat_graph = f"{do_bench(gpu_timing.graphed(lambda: materialised(write))) * 1e3:.1f}"
                except RuntimeError as e:
                    mat_graph = f"- ({type(e).__name__})"
                replay = (f" {do_bench(gpu_timing.graphed(lambda: fused(write))) * 1e3:.1f} | {mat_graph} | "
                          f"{every_graph} |")
            print(f"| {ctx} | {layer} | {m * 1e3:.1f} | {f * 1e3:.1f} | {m / f:.2f}x | {every} | "
                  f"{args.rows * model_len * 4 / 2 ** 20:.0f} |{replay}")


if __name__ == "__main__":
    sys.exit(main())
