"""The self-test cases of the indexer ops (declared in :mod:`sm12x.kernels.manifest`):
DeepGEMM-compatible MQA logits (prefill and paged) and the fused logits -> top-k."""
from __future__ import annotations

from sm12x.kernels.common.timing import time_us


def _mqa_inputs(device, s, s_kv, h, d, seed=0, fp4=False):
    """(q, q_sf, k, k_sf, w, ks, ke): FP8 q (q_sf None) and k with float32 scales, or with ``fp4``
    packed e2m1 q and k with int32 ue8m0 scales."""
    import torch

    from sm12x.kernels.indexer.cache import quant_fp4_per_token, quant_fp8_per_token

    g = torch.Generator().manual_seed(seed)
    q = torch.randn(s, h, d, generator=g)
    q, q_sf = quant_fp4_per_token(q) if fp4 else (q.to(torch.float8_e4m3fn), None)
    k = torch.randn(s_kv, d, generator=g)
    k, k_sf = quant_fp4_per_token(k) if fp4 else quant_fp8_per_token(k)
    w = torch.randn(s, h, generator=g)
    # causal-like ragged ranges, one of them empty
    ke = torch.linspace(max(1, s_kv // 4), s_kv, s).round().int()
    ks = (ke - torch.randint(1, max(2, s_kv // 2), (s,), generator=g).int()).clamp(min=0)
    ks[0] = ke[0]
    to = lambda t: None if t is None else t.to(device)  # noqa: E731
    return to(q), to(q_sf), to(k), to(k_sf), to(w), to(ks), to(ke)


def check_mqa_logits(device, full):
    from sm12x.kernels.indexer.mqa_logits import mqa_logits
    from sm12x.kernels.indexer.validation import check_mqa
    from sm12x.kernels.indexer.reference import ref_fp4_mqa_logits, ref_mqa_logits
    from sm12x.kernels.common.tolerance import deepgemm_diff

    shapes = [(48, 256, 16, 64)] if device != "cuda" else [(2048, 8192, 64, 128)]
    if full and device == "cuda":
        shapes.append((4096, 32768, 64, 128))
    # FP4 runs on a different MMA (block-scaled e2m1 on sm_120): one case of it as well
    cases = [(shape, False) for shape in shapes] + [(shapes[0], True)]
    for (s, s_kv, h, d), fp4 in cases:
        q, q_sf, k, k_sf, w, ks, ke = _mqa_inputs(device, s, s_kv, h, d, fp4=fp4)
        check_mqa("mqa_logits", q, q_sf, k, k_sf, w, ks, ke)
        run = lambda: mqa_logits(q, q_sf, k, k_sf, w, ks, ke, clean_logits=True)  # noqa: E731
        out = run()
        if fp4:
            ref = ref_fp4_mqa_logits(q, q_sf, k, k_sf, w, ks, ke, clean_logits=True)
        else:
            ref = ref_mqa_logits(q, k, k_sf, w, ks, ke, clean_logits=True)
        same_mask = bool(((out == float("-inf")) == (ref == float("-inf"))).all())
        diff = deepgemm_diff(out, ref)
        err = (out - ref).nan_to_num(0, 0, 0).abs()
        us = time_us(run, device)
        flops = 2.0 * h * d * float((ke - ks).clamp(min=0).sum())
        yield dict(op="mqa_logits", case=f"{'fp4' if fp4 else 'fp8'} S={s} S_kv={s_kv} H={h} D={d}",
                   ok=same_mask and diff < 1e-3, max_abs=float(err.max()),
                   max_rel=diff, detail="" if same_mask else "-inf mask differs",
                   us=us, throughput=f"{flops / us / 1e6:.1f} TFLOPS")


def _paged_inputs(device, b, next_n, h, d, block_kv, ctx, seed=0, fp4=False):
    """(q, cache, w, context_lens, block_table, max_context_len); with ``fp4`` q is (packed e2m1,
    int32 ue8m0 scales) and the cache the FP4 layout."""
    import torch

    from sm12x.kernels.indexer.cache import quant_fp4_paged_cache, quant_fp4_per_token, quant_fp8_paged_cache

    g = torch.Generator().manual_seed(seed)
    max_blocks = (ctx + block_kv - 1) // block_kv
    nblocks = b * max_blocks + 1
    cache = torch.randn(nblocks, block_kv, d, generator=g)
    cache = quant_fp4_paged_cache(cache) if fp4 else quant_fp8_paged_cache(cache)
    q = torch.randn(b, next_n, h, d, generator=g)
    q = quant_fp4_per_token(q) if fp4 else q.to(torch.float8_e4m3fn)
    w = torch.randn(b * next_n, h, generator=g)
    lens = torch.randint(ctx // 2, ctx + 1, (b,), generator=g).int()
    cl = torch.stack([lens - (next_n - 1 - t) for t in range(next_n)], 1).int().contiguous()
    bt = torch.randperm(nblocks, generator=g)[: b * max_blocks].view(b, max_blocks).int()
    to = lambda t: tuple(x.to(device) for x in t) if isinstance(t, tuple) else t.to(device)  # noqa: E731
    return to(q), to(cache), to(w), to(cl), to(bt), max_blocks * block_kv


def check_paged_mqa_logits(device, full):
    from sm12x.kernels.indexer.paged_mqa_logits import paged_mqa_logits
    from sm12x.kernels.indexer.validation import check_paged
    from sm12x.kernels.indexer.reference import ref_paged_mqa_logits
    from sm12x.kernels.common.tolerance import deepgemm_diff

    shapes = [(3, 2, 16, 64, 64, 200)] if device != "cuda" else [(256, 1, 64, 128, 64, 8192)]
    if full and device == "cuda":
        shapes += [(256, 2, 64, 128, 64, 32768)]
    cases = [(shape, False) for shape in shapes] + [(shapes[0][:1] + (2,) + shapes[0][2:], True)]
    for (b, next_n, h, d, block_kv, ctx), fp4 in cases:
        q, cache, w, cl, bt, max_len = _paged_inputs(device, b, next_n, h, d, block_kv, ctx, fp4=fp4)
        qv, qs = q if fp4 else (q, None)
        cache_u8 = check_paged("paged_mqa_logits", qv, qs, cache, w, cl, bt, None, max_len)
        run = lambda: paged_mqa_logits(qv, qs, cache_u8, w, cl, bt, max_len,  # noqa: E731
                                       clean_logits=True)
        out = run()
        rows = list(range(0, b * next_n, max(1, (b * next_n) // 8)))  # reference on a sample
        q_cpu = tuple(x.cpu() for x in q) if fp4 else q.cpu()
        ref = ref_paged_mqa_logits(q_cpu, cache.cpu(), w.cpu(), cl.cpu(), bt.cpu(), max_len,
                                   clean_logits=True)[rows]
        got = out[rows].float().cpu()
        same_mask = bool(((got == float("-inf")) == (ref == float("-inf"))).all())
        diff = deepgemm_diff(got, ref)
        us = time_us(run, device)
        kv_bytes = float(cl[:, -1].sum()) * ((d // 2 if fp4 else d) + 4) + out.numel() * 4
        yield dict(op="paged_mqa_logits",
                   case=f"{'fp4' if fp4 else 'fp8'} B={b} next_n={next_n} H={h} ctx<={ctx}",
                   ok=same_mask and diff < 1e-3,
                   max_abs=float((got - ref).nan_to_num(0, 0, 0).abs().max()), max_rel=diff,
                   detail="" if same_mask else "-inf mask differs", us=us,
                   throughput=f"{kv_bytes / us / 1e3:.0f} GB/s")


def check_indexer_topk(device, full):
    from sm12x.kernels.indexer.mqa_logits import mqa_logits
    from sm12x.kernels.indexer.fused_topk import mqa_topk_indices
    from sm12x.kernels.indexer.reference import ref_indexer_topk

    shapes = [(32, 300, 16, 64, 64)] if device != "cuda" else [(4096, 65536, 64, 128, 512)]
    for s, s_kv, h, d, topk in shapes:
        q, _, k, k_sf, w, ks, ke = _mqa_inputs(device, s, s_kv, h, d, seed=1)
        idx = mqa_topk_indices(q, (k, k_sf), w, ks, ke, topk)
        logits = mqa_logits(q, None, k, k_sf, w, ks, ke, clean_logits=True)
        ref = ref_indexer_topk(logits, topk, ks, ke)
        mismatched = int((idx != ref).any(dim=1).sum())
        us = time_us(lambda: mqa_topk_indices(q, (k, k_sf), w, ks, ke, topk), device)
        yield dict(op="indexer_topk", case=f"prefill S={s} S_kv={s_kv} topk={topk}",
                   ok=mismatched == 0, max_abs=float(mismatched), max_rel=0.0,
                   detail=f"{mismatched} rows differ from top-k of the logits" if mismatched else "",
                   us=us, throughput="")


def check_paged_sparse_mqa_logits(device, full):
    """DeepSeek-V4.1's candidate-only logits: each row's published blocks (the newest included)
    of an FP4 pool, through the kernel's schedule and logits functions (the DeepGEMM-compatible
    front end, ``sm12x.frontends.deep_gemm.sparse_indexer``, only validates and forwards)."""
    import torch

    from sm12x.kernels.indexer import paged_sparse_mqa_logits as kernel
    from sm12x.kernels.common.tolerance import deepgemm_diff
    from sm12x.kernels.indexer.cache import quant_fp4_paged_cache, quant_fp4_per_token
    from sm12x.kernels.indexer.reference import ref_paged_sparse_mqa_logits

    # (rows, heads, context, published blocks): V4.1 decode on a GPU, a tiny case on the CPU
    shapes = [(4, 32, 300, 12)] if device != "cuda" else [(64, 32, 65536, 512)]
    if full and device == "cuda":
        shapes.append((256, 32, 262144, 512))
    page, bs = 64, 8
    for rows, h, ctx, nb in shapes:
        g = torch.Generator().manual_seed(rows)
        pages = -(-ctx // page)
        cache = quant_fp4_paged_cache(torch.randn(rows * pages, page, 128, generator=g)).to(device)
        q, q_sf = (t.to(device) for t in quant_fp4_per_token(torch.randn(rows, h, 128, generator=g)))
        w = torch.randn(rows, h, generator=g).to(device)
        lens = torch.randint(ctx // 2, ctx + 1, (rows,), generator=g).int()
        table = torch.randperm(rows * pages, generator=g).view(rows, pages).int()
        blocks = torch.full((rows, nb), 2**31 - 1, dtype=torch.int32)
        for r in range(rows):
            n = -(-int(lens[r]) // bs)
            pick = torch.arange(n) if n <= nb else torch.cat(
                [torch.randperm(n - 1, generator=g)[: nb - 1], torch.tensor([n - 1])]).sort().values
            blocks[r, : pick.numel()] = pick.int()
        lens_d, table_d, blocks_d = lens.to(device), table.to(device), blocks.to(device)
        meta = kernel.build_schedule(lens_d, table_d, blocks_d, page, bs)
        run = lambda: kernel.paged_sparse_mqa_logits(q, q_sf, cache, w, meta, nb, bs)  # noqa: E731
        out = run().float().cpu()
        sample = list(range(0, rows, max(1, rows // 8)))
        ref = ref_paged_sparse_mqa_logits(q[sample].cpu(), q_sf[sample].cpu(), cache.cpu(), w[sample].cpu(),
                                          lens[sample], table[sample], blocks[sample], bs)
        got = out[sample]
        same_mask = bool(((got == float("-inf")) == (ref == float("-inf"))).all())
        diff = deepgemm_diff(got, ref)
        us = time_us(run, device)
        yield dict(op="paged_sparse_mqa_logits", case=f"fp4 rows={rows} H={h} ctx<={ctx} blocks={nb}x{bs}",
                   ok=same_mask and diff < 1e-3,
                   max_abs=float((got - ref).nan_to_num(0, 0, 0).abs().max()), max_rel=diff,
                   detail="" if same_mask else "-inf mask differs", us=us,
                   throughput=f"{rows * nb * bs * 68 / us / 1e3:.0f} GB/s")


def check_candidate_topk(device, full):
    """DeepSeek-V4.1's candidate blocks fused with the prefill top-k: the source's published
    blocks against vLLM's selection on the kernel's logits, a consumer's indices against the
    top-k of those logits under vLLM's candidate mask."""
    import torch

    from sm12x.kernels.indexer.candidate_topk import MASKED, mqa_candidate_topk_indices
    from sm12x.kernels.indexer.mqa_logits import mqa_logits
    from sm12x.kernels.indexer.reference import (HEAD_SUM_TOL, ref_candidate_mask, ref_indexer_topk,
                                                 ref_logit_sizes, ref_mqa_logits, ref_select_candidate_blocks,
                                                 topk_rows_differing)

    # (rows, keys, heads, dim, topk, block size, candidate blocks)
    shapes = [(8, 160, 8, 64, 16, 8, 4)] if device != "cuda" else [(2048, 65536, 64, 128, 512, 64, 10)]
    for s, s_kv, h, d, topk, bs, kb in shapes:
        q, _, k, k_sf, w, _, ke = _mqa_inputs(device, s, s_kv, h, d, seed=3)
        ks = torch.zeros_like(ke)  # one request: row-local positions are key positions
        logits = mqa_logits(q, None, k, k_sf, w, ks, ke, clean_logits=True)
        cand = torch.empty((s, kb), dtype=torch.int32, device=q.device)
        mqa_candidate_topk_indices(q, (k, k_sf), w, ks, ke, topk, width=s_kv, block_size=bs, candidates=cand,
                                   write=True)
        want_cand = ref_select_candidate_blocks(logits, ke, kb, bs)
        idx = mqa_candidate_topk_indices(q, (k, k_sf), w, ks, ke, topk, width=s_kv, block_size=bs,
                                         candidates=want_cand.to(torch.int32), write=False)
        # long rows rank their candidate keys in the paged kernel (candidate_gather), not in the
        # mqa_logits above: against the float32 reference, as sets where a differing key must be
        # within the logits kernels' stated rounding (HEAD_SUM_TOL of its size) of the k-th score
        masked = ref_candidate_mask(ref_mqa_logits(q, k, k_sf, w, ks, ke), ke, want_cand, bs, fill=MASKED)
        want = ref_indexer_topk(masked, topk, ks, ke)
        slack = HEAD_SUM_TOL * ref_logit_sizes(q, k, k_sf, w, ks, ke)
        bad = int((cand.long() != want_cand).any(dim=1).sum()) + topk_rows_differing(idx, want, masked, ks,
                                                                                      slack=slack)
        us = time_us(lambda: mqa_candidate_topk_indices(q, (k, k_sf), w, ks, ke, topk, width=s_kv, block_size=bs,
                                                        candidates=cand, write=False), device)
        yield dict(op="candidate_topk", case=f"prefill S={s} S_kv={s_kv} topk={topk} blocks={kb}x{bs}",
                   ok=bad == 0, max_abs=float(bad), max_rel=0.0,
                   detail=f"{bad} rows differ (candidates or indices)" if bad else "", us=us, throughput="")
