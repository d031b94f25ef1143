"""What DeepSeek-V4.1's fused candidate top-k (``candidate_topk``:
``candidate_topk.mqa_candidate_topk_indices`` in a prefill chunk,
``paged_mqa_candidate_topk_indices`` in decode) launches for its production cases, for the
performance model.

A call splits its rows into groups whose block state fits 128 MiB (``candidate_topk._group_rows``)
and runs, per group, the fused top-k (``fused_topk``, planned by :mod:`sm12x.perfmodel.topk_plan`:
per window of key columns the logits kernel, then the select / filter / fold / merge kernels) with
a window hook between each window's logits and its top-k:

- the candidate source layer (``write=True``): ``_block_max_kernel`` folds the window into each
  row's block maxima (grid rows x ceil((window / block_size + 1) / 16), straight-line code); after
  the group, ``publish``: the newest block pinned and ``torch.topk`` over the [rows, nblocks]
  float32 block scores, costed as bytes (four radix passes over the scores and a gather, the K
  values and indices written) and a launch, beside the group's small torch launches (the scores'
  fill, the pin, the -1 fill and the copy into the candidates: ``SOURCE_TORCH_LAUNCHES``, each a
  launch). Its own top-k is the plain fused top-k of its unmasked window.
- a consumer layer (``write=False``): the group's block flags are built from the candidates (one
  scatter and a few elementwise launches: ``CONSUMER_TORCH_LAUNCHES``); per window
  ``_mask_window_kernel`` writes -FLT_MAX over every visible key outside the row's candidate blocks
  (grid rows x ceil(window / 1024), straight-line code). The top-k then sees windows where only
  the candidate blocks' keys keep their scores (``topk_plan._Call.window``'s ``real``): its first
  window's candidate filter draws a -FLT_MAX threshold wherever the sample holds fewer real keys
  than the threshold's rank (every long row with a few thousand candidate keys), so such rows pay
  the filter's passes and then the full radix select; later windows fold in only their real keys
  while the running set's floor is a masked key.

- a consumer whose width is at least ``candidate_gather.MIN_WIDTH_RATIO`` times its candidate keys
  (every production consumer here: the widths are 65,536-262,144, the candidate keys 1,153 or
  4,097) takes ``candidate_gather`` instead: per row group (``candidate_gather._group_rows``) the
  blocks' sort (``GATHER_TORCH_LAUNCHES`` torch launches on [rows, K] int64, two of them sorts),
  ``_gather_kernel`` (grid rows x slots / 32; its straight-line code from the SASS; each listed
  key's row read and written), the fused paged top-k over one "request" per row of
  min(visible, K x block_size) keys in a window of the padded candidate count, and
  ``_map_fill_kernel`` (one program per row; the fill's rank search runs only for rows with fewer
  candidate keys than topk, none here).

What the SASS cannot say is taken as in ``topk_plan`` (independent scores), and: the source's best
blocks are then uniform over each row's visible blocks, so a consumer row's candidate keys
(min(K x block_size, visible)) are spread evenly over its visible columns.

The cases (64 index heads x 128 as the logits kernels are compiled for them; FP8 keys of 132 B,
FP4 of 68 B):

- vLLM 0.34's V4.1 dense indexer on SM12x (``sparse_attn_indexer`` with ``candidate_blocks``; the
  FP8 index cache, vLLM's default): a prefill chunk of 2,048 rows over 65,536 compressed keys at
  top-1024 with 18 candidate blocks of 64 (the GPU test's shape), and a 1M-token prompt's chunk of
  4,096 rows over 262,144 keys at top-512 with 512 blocks of 8 (the block size V4.1's kernels
  special-case); decode rows over the model's 262,144-column width (vLLM passes
  ``max_model_len``): 64 requests at 32,768 / 131,072 / 262,144 keys, top-1024, 18 blocks of 64
  (``scripts/bench_v41_indexer.py``'s race, so the sm_90 model can be held against its fused
  column), and one 262,144-key request at top-512 with 512 blocks of 8. Each as the source layer
  and as a consumer.
- SGLang 0.5.23's V4.1 source layer (``SparseTableBackend.publish_decode``: FP4 queries and the
  MXFP4 index-K pool, its default for V4.1, 512 blocks of 8, top-512): 64 requests of 32,768 keys
  and one of 262,144 over a 262,144-column ``max_compressed_seq_len``. Its consumers read
  candidate-only logits (``paged_sparse_mqa_logits``, modeled on its own) and its prefill scores in
  its own tiles: not this op.
- GLM-5-next's pool decode (``sparse_attn_indexer_kpool``) runs the plain fused paged top-k
  (``indexer_topk``), not this op.

On sm_90 the cases also include the shapes of the H100 run the model is checked against
(``VALIDATION``: both layers of one vLLM pass over 1,048,576 keys), not production shapes.
"""
from __future__ import annotations

import math

from sm12x.perfmodel import compiled, topk_plan
from sm12x.perfmodel.compiled import Case, as_card
from sm12x.perfmodel.engine import Launch

H, D = topk_plan.H, topk_plan.D
MODEL_LEN = topk_plan.MODEL_LEN
# small torch launches per row group besides the kernels (see the module docstring), counted in
# ``candidate_topk``: the source's score fill, row ends, the pin (11: ends to the newest block, its
# gather / +inf / scatter) and the candidates' -inf test, where, cast and copy (4); a consumer's row
# ends, flag fill, int64 cast, the edge and -1 slots (4) and the scatter
SOURCE_TORCH_LAUNCHES = 17
CONSUMER_TORCH_LAUNCHES = 9
# candidate_gather's torch launches per row group: the cast, the real-block test and where, the
# two sorts with the repeat test and fill, the arange of the gathered pages' table
GATHER_TORCH_LAUNCHES = 9
TOPK_PASSES = 4  # torch.topk's radix passes over float32 scores (8 bits each), then one gather

# (framework, label, the rows' (ks, ke) (a function), keys = width, top-k, K blocks, block size, fp4)
PREFILL = [
    ("vLLM", "prefill chunk S 2048 x 65,536 keys, top-1024, 18 blocks of 64", lambda: topk_plan._causal(2048, 65536),
     65536, 1024, 18, 64, False),
    ("vLLM", "1M-token prompt: chunk S 4096 x 262,144 keys, top-512, 512 blocks of 8",
     lambda: topk_plan._causal(4096, 262144), 262144, 512, 512, 8, False),
]
# (framework, requests, context, next_n, top-k, K blocks, block size, fp4, layers)
DECODE = [
    *[("vLLM", 64, ctx, 1, 1024, 18, 64, False, ("source", "consumer")) for ctx in (32768, 131072, 262144)],
    ("vLLM", 1, 262144, 1, 512, 512, 8, False, ("source", "consumer")),
    ("SGLang", 64, 32768, 1, 512, 512, 8, True, ("source",)),
    ("SGLang", 1, 262144, 1, 512, 512, 8, True, ("source",)),
]

# The H100 run the sm_90 model is held against (``scripts/prove_1m_indexer.py --v41 --topk 1024
# --candidate-blocks 512 --candidate-block-size 8``, docs/performance.md): both layers in turn (the
# source, then a consumer) through vLLM 0.34's ``sparse_attn_indexer``, FP8 keys, 64 heads, over
# 1,048,576 indexer keys: the last 8,192 rows of one prompt (width 1,048,576), and 64 decode rows of
# 1,048,576 - 7 b keys (width ``max_model_len`` 1,048,576). Four times the model's limit, so built
# for sm_90 only, as the validation's cases: (label, kind, rows / requests, keys).
VALIDATION = [("prefill chunk S 8192 x 1,048,576 keys", "prefill", 8192, 1 << 20),
              ("decode B 64 x ctx ~1,048,576", "decode", 64, 1 << 20)]
VALIDATION_TOPK, VALIDATION_BLOCKS = 1024, (512, 8)


def _torch_report(target):
    """A stand-in report for a torch launch: no instructions, so the engine costs it by its bytes
    and its launch alone."""
    from sm12x.kernels.common.compile_check import CompileReport

    isa = dict(mma={}, loop_mma={}, loop_instructions=0, loop_widen=0, loop_class={}, instructions=0)
    return CompileReport("torch", "torch (bytes and launch)", target, 0, 0, 0, True, num_warps=4, ctas_per_sm=1,
                         isa=isa)


class _Hook:
    """One row group's window hook (``candidate_topk._Group.hook``) as launches."""

    def __init__(self, card, write, k_blocks, block_size, width):
        from sm12x.kernels.indexer import candidate_topk as ct

        self.ct, self.write, self.k_blocks, self.bs = ct, write, k_blocks, block_size
        self.nblocks = -(-width // block_size)
        name = f"candidate {'block max' if write else 'mask'} B{block_size}"
        self.rep = compiled.find("candidate_topk", card.target, lambda k, c: c == name, name)

    def __call__(self, call, vis, totals, n):
        rows, read = len(vis), sum(vis)
        if self.write:
            spans = -(-n // self.bs) + 1
            ctas = rows * math.ceil(spans / self.ct.BLOCKS_PER_PROGRAM)
            # the window's visible keys read, each touched block's score read and written
            call.launches.append(Launch(self.rep, ctas, 0.0, read * 4 + read / self.bs * 8, trips=0))
            return None
        real = [v * min(1.0, self.k_blocks * self.bs / t) if t else 0.0 for v, t in zip(vis, totals)]
        ctas = rows * math.ceil(n / self.ct.MASK_TILE)
        # the flags read (once per row, then from L1 / L2), -FLT_MAX written over the masked keys
        call.launches.append(Launch(self.rep, ctas, 0.0, rows * (self.nblocks + 2) + (read - sum(real)) * 4, trips=0))
        return real


def _group_extras(call, card, rows, write, k_blocks, nblocks):
    """A row group's torch launches: the block state's fill (float32 scores or uint8 flags), the
    small ones on [rows] / [rows, K] tensors, and the source's torch.topk."""
    torch_rep = _torch_report(card.target)
    small = SOURCE_TORCH_LAUNCHES if write else CONSUMER_TORCH_LAUNCHES
    fill = rows * nblocks * 4 if write else rows * (nblocks + 2)
    call.launches.append(Launch(torch_rep, 1, 0.0, fill))
    call.launches += [Launch(torch_rep, 1, 0.0, rows * 8) for _ in range(small - 1)]
    if write:
        k = min(k_blocks, nblocks)
        scores = rows * nblocks * 4
        call.launches.append(Launch(torch_rep, 1, 0.0, scores * (TOPK_PASSES + 1) + rows * k * 12))


def _groups(rows, nblocks):
    from sm12x.kernels.indexer import candidate_topk as ct

    step = ct._group_rows(rows, nblocks)
    return [(g0, min(rows, g0 + step)) for g0 in range(0, rows, step)]


def _gathered(call, card, visible, topk, k_blocks, bs, fp4):
    """A consumer on ``candidate_gather``: rows that see ``visible`` keys each (see the module
    docstring); adds its launches to ``call``."""
    from sm12x.kernels.indexer import candidate_gather as cg

    torch_rep = _torch_report(card.target)
    db = D // 2 if fp4 else D
    gather = compiled.find("candidate_topk", card.target,
                           lambda k, c: k == "_gather_kernel" and f" B{bs} " in c and ("FP4" in c) == fp4, "gather")
    fill = compiled.find("candidate_topk", card.target, lambda k, c: k == "_map_fill_kernel", "map and fill")
    n_pad = -(-(k_blocks * bs + 1) // cg.PAGE) * cg.PAGE
    step = cg._group_rows(len(visible), k_blocks * bs + cg.PAGE, db + 4)
    for g0 in range(0, len(visible), step):
        rows = visible[g0:g0 + step]
        r = len(rows)
        keys = sum(min(v, k_blocks * bs) for v in rows)
        call.launches += [Launch(torch_rep, 1, 0.0, r * k_blocks * 8 * 2) for _ in range(GATHER_TORCH_LAUNCHES)]
        # each listed key's row read (whole 32-byte sectors) and written, every slot's position written
        call.launches.append(Launch(gather, r * math.ceil(n_pad / cg.GATHER_SLOTS), 0.0,
                                    keys * (db + 4) * 2 + r * n_pad * 4, trips=0))
        topk_plan.decode_windows(call, card, [min(v, k_blocks * bs) for v in rows], 1, topk, n_pad, fp4=fp4)
        call.launches.append(Launch(fill, r, 0.0, r * topk * 12, trips=0))


def _prefill(card, make_rows, s_kv, topk, k_blocks, bs, fp4, write):
    from sm12x.kernels.indexer import candidate_gather as cg

    ranges = make_rows()
    if not write and cg.worthwhile(s_kv, k_blocks, bs):
        call = topk_plan._Call(card, topk, " ends")
        visible = [ke - ks for ks, ke in ranges]
        _gathered(call, card, visible, topk, k_blocks, bs, fp4)
        key_bytes = D // 2 + 4 if fp4 else D + 4
        keys = sum(min(v, k_blocks * bs) for v in visible)
        return call.launches, 2.0 * H * D * keys, keys * key_bytes * 3 + len(ranges) * (topk * 4 + k_blocks * 4)
    nblocks = -(-s_kv // bs)
    call = topk_plan._Call(card, topk, " starts ends")
    for g0, g1 in _groups(len(ranges), nblocks):
        hook = _Hook(card, write, k_blocks, bs, s_kv)
        topk_plan.prefill_windows(call, card, ranges[g0:g1], s_kv, topk, fp4=fp4, hook=hook)
        _group_extras(call, card, g1 - g0, write, k_blocks, nblocks)
    key_bytes = D // 2 + 4 if fp4 else D + 4
    pairs = sum(ke - ks for ks, ke in ranges)
    flops = 2.0 * H * D * pairs
    dram = s_kv * key_bytes + len(ranges) * H * key_bytes + len(ranges) * (topk * 4 + k_blocks * 4)
    return call.launches, flops, dram


def _decode(card, b, ctx, next_n, topk, k_blocks, bs, fp4, write, width=MODEL_LEN):
    """``b`` requests of context ``ctx`` (an int, or a list of one per request)."""
    from sm12x.kernels.indexer import candidate_gather as cg

    ctxs = list(ctx) if isinstance(ctx, (list, tuple)) else [ctx] * b
    nblocks = -(-width // bs)
    rows = b * next_n
    call = topk_plan._Call(card, topk, " ends")
    if not write and cg.worthwhile(width, k_blocks, bs):
        visible = [min(c - next_n + 1 + t, width) for c in ctxs for t in range(next_n)]
        _gathered(call, card, visible, topk, k_blocks, bs, fp4)
        key_bytes = D // 2 + 4 if fp4 else D + 4
        keys = sum(min(v, k_blocks * bs) for v in visible)
        return call.launches, 2.0 * H * D * keys, keys * key_bytes * 3 + rows * (topk * 4 + k_blocks * 4)
    for g0, g1 in _groups(rows, nblocks):  # whole requests: the groups are multiples of next_n
        hook = _Hook(card, write, k_blocks, bs, width)
        topk_plan.decode_windows(call, card, ctxs[g0 // next_n:g1 // next_n], next_n, topk, width, fp4=fp4,
                                 hook=hook)
        _group_extras(call, card, g1 - g0, write, k_blocks, nblocks)
    key_bytes = D // 2 + 4 if fp4 else D + 4
    flops = 2.0 * next_n * sum(ctxs) * H * D
    dram = sum(ctxs) * key_bytes + rows * (topk * 4 + k_blocks * 4)
    return call.launches, flops, dram


def validation_cases(card) -> list:
    """The H100 run's passes (``VALIDATION``: source and consumer layer in one case), on sm_90."""
    if card.target != "sm_90":
        return []
    kb, bs = VALIDATION_BLOCKS
    out = []
    with as_card(card):
        for label, kind, n, keys in VALIDATION:
            launches, flops, dram = [], 0.0, 0.0
            for write in (True, False):
                if kind == "prefill":
                    part = _prefill(card, lambda: topk_plan._causal(n, keys), keys, VALIDATION_TOPK, kb, bs, False,
                                    write)
                else:
                    part = _decode(card, n, [keys - 7 * i for i in range(n)], 1, VALIDATION_TOPK, kb, bs, False,
                                   write, width=keys)
                launches += part[0]
                flops += part[1]
                dram += part[2]
            out.append(Case("candidate_topk", f"vLLM V4.1 source + consumer: {label}, top-{VALIDATION_TOPK}, "
                            f"{kb} blocks of {bs}", launches, flops, "mxf8", dram,
                            ("candidate_topk", "vLLM", "source + consumer", kind, n, keys)))
    return out


def cases(card) -> list:
    """The candidate top-k's production cases on ``card`` (see the module docstring), and on sm_90
    the validation's cases."""
    out = validation_cases(card)
    with as_card(card):
        for fw, label, make_rows, s_kv, topk, kb, bs, fp4 in PREFILL:
            for layer in ("source", "consumer"):
                launches, flops, dram = _prefill(card, make_rows, s_kv, topk, kb, bs, fp4, layer == "source")
                out.append(Case("candidate_topk", f"{fw} V4.1 {layer}: {label}", launches, flops,
                                "mxf4" if fp4 else "mxf8", dram, ("candidate_topk", fw, layer, label)))
        for fw, b, ctx, next_n, topk, kb, bs, fp4, layers in DECODE:
            for layer in layers:
                launches, flops, dram = _decode(card, b, ctx, next_n, topk, kb, bs, fp4, layer == "source")
                label = (f"{fw} V4.1 {layer}: decode B {b} x ctx {ctx:,}, next_n {next_n}, top-{topk}, "
                         f"{kb} blocks of {bs}, width {MODEL_LEN:,}{', FP4' if fp4 else ''}")
                out.append(Case("candidate_topk", label, launches, flops, "mxf4" if fp4 else "mxf8", dram,
                                ("candidate_topk", fw, layer, "decode", b, ctx, next_n, topk, kb, bs, fp4)))
    return out
