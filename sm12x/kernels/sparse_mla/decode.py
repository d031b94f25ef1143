"""Sparse MLA decode on FP8 KV caches (FlashMLA ``sparse_decode_fwd`` semantics) in Triton.

Work: a row is BLOCK_H heads of one query token over its candidate list (main top-k tiles, then
extra top-k tiles, BLOCK_N tokens each); a unit is one tile of one row. Each program takes a
contiguous, near-equal range of units (``plan``: whole rows, rows cut into equal parts, or, to
fill every SM, units dealt out evenly with rows cut anywhere). Per tile it gathers the rows,
dequantises FP8 -> bf16 in registers (exact: the scales are powers of two), runs QK^T and PV as
bf16 x bf16 -> fp32 dots with an online base-2 softmax. The next tile's indices (PREFETCH 1) or
rows (PREFETCH 2) are loaded while the current tile computes. A whole row is written out (sink
applied, bf16 ``out``, natural-log ``lse``); the parts of a row split between programs go to a
workspace that a combine kernel merges. Where the combine's programs fit on the SMs the split
kernel leaves idle, the combine is launched as its programmatic dependent (PDL, ``Plan.pdl``): it
starts while the split kernel runs and waits for its results in ``griddepcontrol.wait``.

The plan and the workspace depend on shapes only (CUDA-graph capturable).
Formats: see ``mla_kv_cache``. The public entry point is :func:`sparse_mla_decode`.
"""
from __future__ import annotations

import os

import torch

from sm12x.kernels.common import checks, configs
from sm12x.kernels.common.compile_check import interpreting, reports_in_subprocess
from sm12x.kernels.sparse_mla import decode_mxfp8
from sm12x.kernels.sparse_mla.decode_kernels import _sparse_mla_combine_kernel, _sparse_mla_split_kernel
from sm12x.kernels.sparse_mla.decode_plan import (COMBINE_CONFIG, CONFIGS, D_V, DECODE_FORMATS, WIDE_PRODUCT,
                                                  _combine_grid, plan, split_signature)

OP = "sparse_mla_decode"
LOG2E = 1.4426950408889634
# the V4.1 caches' declared formats (``kv_cache.V41_FORMATS``) -> the kernel's KV_FMT / XKV_FMT
V41_CODES = {"v41": 1, "v41_block_split": 2, "v41_fp4": 3, "v41_fp4_block_split": 4}
V41_BYTES = {"v41": 528, "v41_block_split": 528, "v41_fp4": 288, "v41_fp4_block_split": 288}



# ----------------------------------------------------------------------------------------------
# Launcher


def cache_formats(op, d_qk, k_cache, extra_k_cache, kv_format, extra_kv_format):
    """The declared formats of the main and extra caches -> (KV_FMT, XKV_FMT) kernel codes.
    ``kv_format`` None: V4 (584 B) or V3.2 (656 B) by d_qk; "v41" / "v41_block_split": a 528-byte
    V4.1 main cache, interleaved or block-split. The extra cache then takes the same arrangement,
    528 or 288 bytes by its size (FlashMLA's rule), unless ``extra_kv_format`` names its format.
    A 528 / 288-byte cache without a declared format is refused: its two arrangements have the
    same size, so the size alone would misread one of them."""
    if kv_format is None:
        for name, cache in (("k_cache", k_cache), ("extra_k_cache", extra_k_cache)):
            bpt = cache.shape[-1] if cache is not None and cache.dim() == 4 else None
            if bpt in (528, 288):
                raise checks.bad(op, "kv_format", None, f"'v41' or 'v41_block_split' for a {bpt}-byte "
                                 f"DeepSeek-V4.1 {name} (the arrangement is declared, never guessed)")
        checks.require(extra_kv_format is None, op, "extra_kv_format", repr(extra_kv_format),
                       "None unless kv_format names a V4.1 main cache")
        return 0, 0
    checks.require(kv_format in ("v41", "v41_block_split"), op, "kv_format", repr(kv_format),
                   "None (V4 / V3.2 caches), 'v41' or 'v41_block_split' (the main cache is FP8; "
                   "the FP4 format is for extra_k_cache only)")
    checks.require(d_qk == 512, op, "kv_format", f"{kv_format!r} with d_qk {d_qk}", "d_qk 512")
    if extra_k_cache is None:
        checks.require(extra_kv_format is None, op, "extra_kv_format", repr(extra_kv_format),
                       "None without extra_k_cache")
        return V41_CODES[kv_format], 0
    if extra_kv_format is None:
        fp4 = extra_k_cache.dim() == 4 and extra_k_cache.shape[-1] == 288
        extra_kv_format = ("v41_fp4" if fp4 else "v41") + ("" if kv_format == "v41" else "_block_split")
    checks.require(extra_kv_format in V41_CODES, op, "extra_kv_format", repr(extra_kv_format),
                   f"one of {sorted(V41_CODES)}")
    return V41_CODES[kv_format], V41_CODES[extra_kv_format]


_BYTES = {0: None, 1: 528, 2: 528, 3: 288, 4: 288}


def prefill_max_block_h(fmt_code):
    """The largest head block of the sparse prefill on a V4.1 cache of kernel format ``fmt_code``.
    An FP4 cache's bytes are gathered twice each (``_gather_tile``), four times a 528-byte tile's
    registers when the next tile is held ahead (PREFETCH 2, the BLOCK_H 32 / 64 configs); alone
    in the list (no 528-byte list beside it, as in the decode) that spills at BLOCK_H 64 under
    Triton 3.7.1 and 3.9.0 (64-88 B) and at BLOCK_H 32 under 3.7.1 (24-104 B). The BLOCK_H 16
    config (no rows held ahead) compiles clean."""
    return 16 if fmt_code in (3, 4) else 64


# This runs on every decode call: message texts are lambdas, formatted only on failure.
def _check_cache(op, cache, name, d_qk, q, fmt=0):
    bpt = _BYTES[fmt] or (584 if d_qk == 512 else 656)
    checks.require_dtype(cache, (torch.uint8, torch.int8, torch.float8_e4m3fn), op, name)
    sh, st = cache.shape, cache.stride()
    checks.require(len(sh) == 4 and sh[2] == 1 and sh[3] == bpt, op, name,
                   lambda: f"shape {list(sh)}",
                   lambda: f"[num_blocks, page_block_size, 1, {bpt}] for d_qk {d_qk}"
                           + (f" and its declared format" if fmt else ""))
    checks.require(st[1] == bpt and st[3] == 1, op, name, lambda: f"strides {tuple(st)}",
                   lambda: f"stride(1) == {bpt} (bytes_per_token), stride(3) == 1")
    checks.require(sh[0] <= 1 or st[0] >= sh[1] * bpt, op, name, lambda: f"stride(0) {st[0]}",
                   lambda: f">= page_block_size * {bpt}")
    # The kernel tells the compiler that rows start on 16-byte boundaries (vector loads).
    ptr = cache.data_ptr()
    checks.require(ptr % 16 == 0 and (sh[0] <= 1 or st[0] % 16 == 0), op, name,
                   lambda: f"data_ptr % 16 = {ptr % 16}, stride(0) {st[0]}",
                   "a 16-byte aligned start and stride(0) a multiple of 16 bytes")
    checks.require_same_device(op, q, **{name: cache})


def _check_indices(op, idx, name, b, s_q, q):
    checks.require_dtype(idx, (torch.int32,), op, name)
    sh = idx.shape
    checks.require(len(sh) == 3 and sh[0] == b and sh[1] == s_q and sh[2] > 0, op, name,
                   lambda: f"shape {list(sh)}", lambda: f"[{b}, {s_q}, topk > 0]")
    checks.require(idx.stride(2) == 1, op, name, lambda: f"strides {tuple(idx.stride())}",
                   "a contiguous last dimension")
    checks.require_same_device(op, q, **{name: idx})


def _check_length(op, t, name, b, q):
    if t is None:
        return
    checks.require_dtype(t, (torch.int32,), op, name)
    checks.require_shape(t, (b,), op, name)
    checks.require_same_device(op, q, **{name: t})


def validate(op, q, k_cache, indices, topk_length, attn_sink, extra_k_cache, extra_indices,
             extra_topk_length, d_v, kv_format=None, extra_kv_format=None):
    """Raise ValueError naming ``op`` and the argument for anything the kernel does not handle;
    returns the caches' kernel format codes (``cache_formats``)."""
    checks.require_dtype(q, (torch.bfloat16,), op, "q")
    checks.require(q.dim() == 4 and q.shape[-1] in (512, 576), op, "q",
                   lambda: f"shape {list(q.shape)}",
                   "[b, s_q, h_q, d_qk] with d_qk 512 (MODEL1) or 576 (V3.2)")
    checks.require(q.stride(-1) == 1, op, "q", lambda: f"strides {tuple(q.stride())}",
                   "a contiguous last dimension")
    checks.require(d_v == D_V, op, "head_dim_v", d_v, "512")
    b, s_q, h_q, d_qk = q.shape
    checks.require(b > 0 and s_q > 0 and h_q > 0, op, "q", lambda: f"shape {list(q.shape)}",
                   "non-empty b, s_q, h_q")
    fmt, xfmt = cache_formats(op, d_qk, k_cache, extra_k_cache, kv_format, extra_kv_format)
    _check_cache(op, k_cache, "k_cache", d_qk, q, fmt)
    if indices is None:
        raise checks.bad(op, "indices", None, "an int32 tensor [b, s_q, topk] (sparse decode)")
    _check_indices(op, indices, "indices", b, s_q, q)
    _check_length(op, topk_length, "topk_length", b, q)
    if attn_sink is not None:
        checks.require_dtype(attn_sink, (torch.float32,), op, "attn_sink")
        checks.require_shape(attn_sink, (h_q,), op, "attn_sink")
        checks.require_same_device(op, q, attn_sink=attn_sink)
    if (extra_k_cache is None) != (extra_indices is None):
        name = "extra_indices_in_kvcache" if extra_k_cache is not None else "extra_k_cache"
        raise checks.bad(op, name, None, "extra_k_cache and extra_indices_in_kvcache together")
    if extra_k_cache is not None:
        _check_cache(op, extra_k_cache, "extra_k_cache", d_qk, q, xfmt)
        _check_indices(op, extra_indices, "extra_indices_in_kvcache", b, s_q, q)
        _check_length(op, extra_topk_length, "extra_topk_length", b, q)
    elif extra_topk_length is not None:
        raise checks.bad(op, "extra_topk_length", "a tensor without extra_k_cache",
                         "None unless extra_k_cache is given")
    return fmt, xfmt


def _rows_aligned(t):
    """Every [..., d] row of a bf16 tensor starts on a 16-byte boundary."""
    return t.data_ptr() % 16 == 0 and all(st % 8 == 0 for st in t.stride()[:-1])


def _byte_view(cache):
    return cache if cache.dtype == torch.uint8 else cache.view(torch.uint8)


def _ntok(cache):
    return min(cache.shape[0] * cache.shape[1], 2**31 - 1)


def sparse_mla_decode(q, k_cache, indices, topk_length=None, attn_sink=None, extra_k_cache=None,
                      extra_indices=None, extra_topk_length=None, softmax_scale=None, d_v=D_V,
                      num_splits=None, out=None, lse=None, op=OP, validate_inputs=True,
                      kv_format=None, extra_kv_format=None):
    """FlashMLA sparse decode. q bf16 [b, s_q, h_q, 512 | 576]; caches uint8/int8/fp8 views
    [num_blocks, page, 1, 584 | 656], or with ``kv_format`` "v41" / "v41_block_split" the
    DeepSeek-V4.1 caches (528; the extra cache 528 or 288, ``cache_formats``; layouts in
    ``kv_cache``); indices int32 [b, s_q, topk] (-1 = invalid);
    topk_length / extra_topk_length int32 [b]; attn_sink fp32 [h_q].
    -> (out bf16 [b, s_q, h_q, 512], lse fp32 [b, h_q, s_q], a transposed view of [b, s_q, h_q]).
    ``num_splits`` cuts every row into that many parts (default: ``plan`` from shapes and SMs)."""
    if validate_inputs:
        fmts = validate(op, q, k_cache, indices, topk_length, attn_sink, extra_k_cache, extra_indices,
                        extra_topk_length, d_v, kv_format, extra_kv_format)
    else:
        fmts = cache_formats(op, q.shape[-1], k_cache, extra_k_cache, kv_format, extra_kv_format)
    b, s_q, h_q, d_qk = q.shape
    if softmax_scale is None:
        softmax_scale = d_qk ** -0.5
    topk = indices.shape[-1]
    has_extra = extra_k_cache is not None
    xtopk = extra_indices.shape[-1] if has_extra else 0
    fmt = "model1" if d_qk == 512 else "v32"
    ragged = topk_length is not None or (has_extra and extra_topk_length is not None)
    # SM12X_ATTENTION_PRECISION=fast: MODEL1 caches through block-scaled MXFP8 MMAs (decode_mxfp8);
    # the DeepSeek-V4.1 cache formats take the exact path
    fast = fmts == (0, 0) and decode_mxfp8.serves(d_qk, q.device)
    pl = None if fast else plan(b, s_q, h_q, topk, xtopk, q.device, num_splits, fmt=fmt, ragged=ragged)
    if pl is not None and not pl.dealt and not fp4_split_form_ok(fmts, pl.cfg):
        pl = _dealt_plan(b, s_q, h_q, topk, xtopk, q.device, num_splits, pl.cfg, ragged)
    if not _rows_aligned(q):
        q = q.clone(memory_format=torch.contiguous_format)
    if out is None:
        out = torch.empty((b, s_q, h_q, D_V), dtype=torch.bfloat16, device=q.device)
    checks.require(out.shape == (b, s_q, h_q, D_V) and out.dtype == torch.bfloat16
                   and out.stride(3) == 1 and _rows_aligned(out), op, "out",
                   f"{out.dtype} {list(out.shape)} strides {tuple(out.stride())}",
                   f"bf16 [{b}, {s_q}, {h_q}, 512], 16-byte aligned rows")
    if lse is None:
        lse = torch.empty((b, s_q, h_q), dtype=torch.float32, device=q.device)
    checks.require(lse.shape == (b, s_q, h_q) and lse.dtype == torch.float32
                   and lse.is_contiguous(), op, "lse", f"{lse.dtype} {list(lse.shape)}",
                   f"contiguous fp32 [{b}, {s_q}, {h_q}]")
    if fast:
        decode_mxfp8.launch(q, k_cache, indices, topk_length, attn_sink, extra_k_cache, extra_indices,
                            extra_topk_length, softmax_scale, out, lse, num_splits)
    else:
        launch(q, k_cache, indices, topk_length, attn_sink, extra_k_cache, extra_indices,
               extra_topk_length, softmax_scale, pl, out, lse, kv_fmts=fmts)
    return out, lse.transpose(1, 2)


# The FP4 cache's load step holds each prefetched byte twice (``_gather_tile``): at BLOCK_H 64,
# next to the 64 x 512 fp32 accumulator, a 528 + 288-byte decode spilled 8 B under Triton 3.7.1 in
# its DIRECT specialisation and in the split (not dealt) form, while the dealt general form (which
# writes a whole row the same way, after one branch per row; a dealt plan with a multiple of the
# rows as its program count cuts each row into near-equal parts as the split form does) compiles
# clean under 3.6.0-3.9.0. Those calls run the dealt general form.
def built_direct(direct, kv_fmts, cfg):
    """The DIRECT constexpr a call of plan form ``direct`` is built with (see above)."""
    fp4 = any(f in (3, 4) for f in kv_fmts)
    return direct and not (fp4 and cfg["BLOCK_H"] >= 64)


def fp4_split_form_ok(kv_fmts, cfg):
    """Whether a call with the caches' ``kv_fmts`` codes may run the split (not dealt) form."""
    return not (any(f in (3, 4) for f in kv_fmts) and cfg["BLOCK_H"] >= 64)


_DEALT_PLANS: dict = {}


def _dealt_plan(b, s_q, h_q, topk, xtopk, device, num_splits, cfg, ragged):
    """``plan``'s program count in the dealt form (memoised by shape like ``plan``)."""
    from sm12x.kernels.sparse_mla import decode_plan

    key = (b, s_q, h_q, topk, xtopk, configs.arch_key(device), configs.sm_count(device), num_splits,
           ragged, tuple(sorted(cfg.items())))
    hit = _DEALT_PLANS.get(key)
    if hit is None:
        hit = _DEALT_PLANS[key] = decode_plan._plan(b, s_q, h_q, topk, xtopk, device, num_splits, cfg,
                                                    ragged, dealt_only=True)
    return hit


# Two 528-byte lists (main and extra) at BLOCK_H 64 with the next tile's rows held ahead
# (PREFETCH 2) spilled 8 B under Triton 3.6.0 in the forms that leave row parts to the combine;
# holding only the next indices (PREFETCH 1) compiles clean under 3.6.0-3.9.0 (98,304 B of shared
# memory, within sm_120's 101,376; one block per SM either way).
def built_prefetch(kv_fmts, cfg):
    """The PREFETCH depth a call with the caches' ``kv_fmts`` codes is built with (see above)."""
    both_528 = kv_fmts[0] in (1, 2) and kv_fmts[1] in (1, 2)
    if both_528 and cfg["BLOCK_H"] >= 64:
        return min(cfg.get("PREFETCH", 1), 1)
    return cfg.get("PREFETCH", 1)


def launch(q, k_cache, indices, topk_length, attn_sink, extra_k_cache, extra_indices,
           extra_topk_length, softmax_scale, pl, out, lse, max_logits=None, kv_bf16=False,
           kv_fmts=(0, 0)):
    """Run plan ``pl`` on checked inputs: q [b, s_q, h_q, d_qk] with 16-byte aligned rows, out
    [b, s_q, h_q, 512], lse contiguous [b, s_q, h_q]. ``kv_bf16``: ``k_cache`` is bf16 rows
    [s_kv, 1, d_qk] (sparse prefill) instead of an FP8 cache; ``max_logits`` (shaped like lse)
    receives each row's largest scaled logit. ``kv_fmts``: the caches' (KV_FMT, XKV_FMT) codes
    (``cache_formats``)."""
    b, s_q, h_q, d_qk = q.shape
    cfg, head_blocks, tiles, programs = pl.cfg, pl.head_blocks, pl.tiles, pl.programs
    direct = pl.direct
    topk = indices.shape[-1]
    has_extra = extra_k_cache is not None
    xtopk = extra_indices.shape[-1] if has_extra else 0
    wide = b * s_q * head_blocks * tiles * (programs + 1) >= WIDE_PRODUCT
    has_max = max_logits is not None
    if direct:
        ows = lsews = mws = lse  # unused
    else:  # a dealt-out program leaves up to two parts (its first and last row segments)
        slots = programs * (2 if pl.dealt else 1)
        ows = torch.empty((slots, cfg["BLOCK_H"], D_V), dtype=torch.float32, device=q.device)
        lsews = torch.empty((slots, cfg["BLOCK_H"]), dtype=torch.float32, device=q.device)
        mws = torch.empty_like(lsews) if has_max else lsews
    # [b] / [h_q] vectors: the kernel indexes them densely (a no-op unless strided).
    topk_length = topk_length.contiguous() if topk_length is not None else None
    extra_topk_length = extra_topk_length.contiguous() if extra_topk_length is not None else None
    attn_sink = attn_sink.contiguous() if attn_sink is not None else None
    cache = _byte_view(k_cache)
    xcache = _byte_view(extra_k_cache) if has_extra else cache
    xidx = extra_indices if has_extra else indices
    sink = attn_sink if attn_sink is not None else lse
    max_logits = max_logits if has_max else lse
    dummy_len = indices
    grid = (programs,) if pl.dealt else (head_blocks, pl.splits, b * s_q)
    _sparse_mla_split_kernel[grid](
        q, q.stride(0), q.stride(1), q.stride(2),
        cache, cache.stride(0), _ntok(cache), indices, indices.stride(0), indices.stride(1),
        topk_length if topk_length is not None else dummy_len,
        xcache, xcache.stride(0), _ntok(xcache), xidx, xidx.stride(0), xidx.stride(1),
        extra_topk_length if extra_topk_length is not None else dummy_len,
        ows, lsews, mws, out, lse, sink, max_logits, out.stride(0), out.stride(1), out.stride(2),
        s_q, h_q, topk, xtopk, b * s_q, head_blocks, int(pl.head_major), tiles, pl.splits,
        pl.tiles_per_split, programs, float(softmax_scale) * LOG2E,
        PAGE=k_cache.shape[1], XPAGE=xcache.shape[1], IS_MODEL1=d_qk == 512, KV_BF16=kv_bf16,
        HAS_LEN=topk_length is not None, HAS_EXTRA=has_extra,
        HAS_XLEN=has_extra and extra_topk_length is not None, HAS_SINK=attn_sink is not None,
        HAS_MAX=has_max, DIRECT=built_direct(direct, kv_fmts, cfg), DEALT=pl.dealt, WIDE=wide,
        BLOCK_H=cfg["BLOCK_H"], BLOCK_N=cfg["BLOCK_N"], PREFETCH=built_prefetch(kv_fmts, cfg),
        PDL=pl.pdl, INTERPRET=interpreting(), KV_FMT=kv_fmts[0], XKV_FMT=kv_fmts[1],
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    if not direct:
        bhc, bdc = COMBINE_CONFIG["BLOCK_HC"], COMBINE_CONFIG["BLOCK_DC"]
        _sparse_mla_combine_kernel[_combine_grid(h_q, b * s_q)](
            ows, lsews, mws, out, lse, sink, max_logits, out.stride(0), out.stride(1),
            out.stride(2), s_q, h_q, b * s_q, head_blocks, int(pl.head_major), tiles, pl.splits,
            programs, HAS_SINK=attn_sink is not None, HAS_MAX=has_max, DEALT=pl.dealt, WIDE=wide,
            BLOCK_H=cfg["BLOCK_H"], BLOCK_HC=bhc, BLOCK_DC=bdc, INTERPRET=interpreting(),
            PARTS=COMBINE_CONFIG["DEALT_PARTS" if pl.dealt else "PARTS"], SKIP_EMPTY=pl.skip_empty,
            PDL=pl.pdl, num_warps=COMBINE_CONFIG["num_warps"],
            **({"launch_pdl": True} if pl.pdl else {}))  # older Tritons lack the option


# ----------------------------------------------------------------------------------------------
# Compile checks (no GPU needed)

_PAGE_VARIANTS = ((256, 64), (64, 2))  # (main, extra) page sizes of V4's CSA and HCA layers
# (HAS_LEN, HAS_EXTRA, HAS_XLEN): all inputs, main list only, extra list without its lengths
_INPUT_VARIANTS = ((True, True, True), (False, False, False), (False, True, False))
# (KV_FMT, XKV_FMT) of the V4.1 caches: 528 + 288 interleaved, block-split; 528 + 528 both ways
_V41_VARIANTS = ((1, 3), (2, 4), (1, 1), (2, 2))


def _split_signature(cfg, is_model1, page, xpage, direct, dealt=False,
                     inputs=_INPUT_VARIANTS[0], prefill=False, pdl=False, fmts=(0, 0), has_max=None):
    has_len, has_extra, has_xlen = inputs
    const = dict(PAGE=page, XPAGE=xpage, IS_MODEL1=is_model1, KV_BF16=prefill, HAS_LEN=has_len,
                 HAS_EXTRA=has_extra, HAS_XLEN=has_xlen, HAS_SINK=True,
                 HAS_MAX=prefill if has_max is None else has_max,
                 DIRECT=direct,
                 DEALT=dealt, WIDE=False, BLOCK_H=cfg["BLOCK_H"], BLOCK_N=cfg["BLOCK_N"],
                 PREFETCH=built_prefetch(fmts, cfg), PDL=pdl, INTERPRET=False, KV_FMT=fmts[0],
                 XKV_FMT=fmts[1])
    return split_signature(_sparse_mla_split_kernel, const)


def compile_reports(targets=("sm_120", "sm_121"), full=False):
    """Compile every configuration of both kernels for ``targets`` -> list of CompileReport, with
    the V4 CSA page sizes and every optional input, and the sparse prefill's variants; ``full``:
    also the HCA page sizes and the calls without per-request lengths or without the extra list.
    Kernels that leave parts to the combine are built with the PDL trigger (how the small
    calls run them), and also without it when ``full``; the combine both ways.
    Under the Triton interpreter the kernels cannot be compiled in-process, so this re-runs
    itself in a subprocess without TRITON_INTERPRET."""

    if interpreting():
        return reports_in_subprocess(__name__, targets=tuple(targets), full=full)

    jobs = []
    for target in targets:
        key = target if target in CONFIGS else "sm_120"
        for fmt, options in CONFIGS[key].items():
            for cfg in options:
                if fmt not in DECODE_FORMATS:
                    # sparse prefill (sparse_mla_prefill): bf16 rows, with and without
                    # per-query lengths
                    for has_len in (True, False):
                        for direct in (False, True):  # always dealt out (``plan``)
                            for pdl in _pdl_variants(direct, full):
                                jobs.append(("prefill", target, fmt, cfg,
                                             (has_len, direct, True, pdl)))
                    continue
                for pages in (_PAGE_VARIANTS if full else _PAGE_VARIANTS[:1]):
                    for inputs in (_INPUT_VARIANTS if full else _INPUT_VARIANTS[:1]):
                        for direct, dealt in ((False, False), (False, True), (True, True)):
                            for pdl in _pdl_variants(direct, full):
                                jobs.append(("split", target, fmt, cfg,
                                             (direct, dealt, pages, inputs, pdl, (0, 0))))
                if fmt == "model1":
                    # the V4.1 caches (d_qk 512, model1's configs): 528 main with a 528 or 288
                    # extra, interleaved and block-split (by default the heaviest load step, 528 +
                    # 288, in the dealt form; ``full``: every pair, every form)
                    for fmts in (_V41_VARIANTS if full else _V41_VARIANTS[:1]):
                        for direct, dealt in (((False, False), (False, True), (True, True)) if full
                                              else ((False, True),)):
                            if not dealt and not fp4_split_form_ok(fmts, cfg):
                                continue  # never launched (``fp4_split_form_ok``)
                            for pdl in _pdl_variants(direct, full):
                                jobs.append(("split", target, fmt, cfg,
                                             (direct, dealt, _PAGE_VARIANTS[0], _INPUT_VARIANTS[0],
                                              pdl, fmts)))
                    # the sparse prefill on a V4.1 cache (one list, max_logits out; 64-token
                    # pages): by default the 528 and FP4 load steps with lengths, dealt; ``full``:
                    # every format and form, with and without lengths
                    for fmt_code in ((1, 2, 3, 4) if full else (1, 3)):
                        if fmt_code in (3, 4) and cfg["BLOCK_H"] > prefill_max_block_h(fmt_code):
                            continue  # never launched (``prefill_max_block_h``)
                        for has_len in ((True, False) if full else (True,)):
                            for direct, dealt in (((False, False), (False, True), (True, True))
                                                  if full else ((False, True),)):
                                for pdl in _pdl_variants(direct, full):
                                    jobs.append(("prefill41", target, fmt, cfg,
                                                 (direct, dealt, has_len, pdl, fmt_code)))
        for block_h in sorted({c["BLOCK_H"] for opts in CONFIGS[key].values() for c in opts}):
            for dealt in (False, True):
                for has_max in (False, True):  # decode / sparse prefill
                    for skip in (False, True):
                        for pdl in (False, True):
                            jobs.append(("combine", target, None, COMBINE_CONFIG,
                                         (block_h, dealt, has_max, skip, pdl)))
    # the fast precision's MXFP8 kernel (SM12X_ATTENTION_PRECISION=fast) serves these calls too
    fast = decode_mxfp8.compile_reports(targets)
    if len(jobs) > 2 and (os.cpu_count() or 1) > 1:
        import concurrent.futures
        import multiprocessing

        with concurrent.futures.ProcessPoolExecutor(
                min(os.cpu_count(), 8), mp_context=multiprocessing.get_context("fork")) as pool:
            return list(pool.map(_compile_job, jobs)) + fast
    return [_compile_job(job) for job in jobs] + fast


def _pdl_variants(direct, full):
    """PDL values to compile a split-kernel variant with (a direct call has no combine)."""
    return (False,) if direct else ((False, True) if full else (True,))


def _compile_job(job):
    from sm12x.kernels.common.compile_check import compile_kernel

    kind, target, fmt, cfg, variant = job
    if kind in ("prefill", "split", "prefill41"):
        if kind == "prefill41":
            direct, dealt, has_len, pdl, fmt_code = variant
            sig, const = _split_signature(cfg, True, 64, 1, built_direct(direct, (fmt_code, 0), cfg),
                                          dealt, (has_len, False, False), pdl=pdl,
                                          fmts=(fmt_code, 0), has_max=True)
            shape = (f"prefill v41 {_BYTES[fmt_code]}{' block-split' if fmt_code in (2, 4) else ''} "
                     f"H{cfg['BLOCK_H']} N{cfg['BLOCK_N']} w{cfg['num_warps']}{' L' if has_len else ''}")
        elif kind == "prefill":
            has_len, direct, dealt, pdl = variant
            sig, const = _split_signature(cfg, fmt == "bf16_512", 1, 1, direct, dealt,
                                          (has_len, False, False), prefill=True, pdl=pdl)
            shape = f"prefill {fmt} H{cfg['BLOCK_H']} N{cfg['BLOCK_N']} w{cfg['num_warps']}{' L' if has_len else ''}"
        else:
            direct, dealt, (page, xpage), inputs, pdl, fmts = variant
            sig, const = _split_signature(cfg, fmt == "model1", page, xpage,
                                          built_direct(direct, fmts, cfg), dealt, inputs,
                                          pdl=pdl, fmts=fmts)
            flags = "".join(f for f, on in zip(("L", "X", "XL"), inputs) if on)
            kind_name = {(0, 0): fmt}.get(fmts, f"v41 {_BYTES[fmts[0]]}/{_BYTES[fmts[1]]}"
                                                 f"{' block-split' if fmts[0] == 2 else ''}")
            shape = (f"{kind_name} H{cfg['BLOCK_H']} N{cfg['BLOCK_N']} w{cfg['num_warps']} p{page}/{xpage} "
                     f"{flags or '-'}")
        name = f"{shape}{' direct' if direct else ''}{' dealt' if dealt else ''}{' pdl' if pdl else ''}"
        return compile_kernel(_sparse_mla_split_kernel, sig, const, target=target,
                              num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
                              config_name=name)
    sig = {"ows_ptr": "*fp32", "lsews_ptr": "*fp32", "mws_ptr": "*fp32", "out_ptr": "*bf16",
           "lse_ptr": "*fp32", "sink_ptr": "*fp32", "max_ptr": "*fp32", "stride_ob": "i32",
           "stride_os": "i32", "stride_oh": "i32",
           "S_Q": "i32", "H": "i32", "QUERIES": "i32", "HEAD_BLOCKS": "i32", "HEAD_MAJOR": "i32",
           "TILES": "i32", "SPLITS": "i32", "PROGRAMS": "i32", "HAS_SINK": "constexpr",
           "HAS_MAX": "constexpr", "DEALT": "constexpr", "WIDE": "constexpr",
           "BLOCK_H": "constexpr",
           "BLOCK_HC": "constexpr", "BLOCK_DC": "constexpr", "PARTS": "constexpr",
           "SKIP_EMPTY": "constexpr", "PDL": "constexpr", "INTERPRET": "constexpr"}
    block_h, dealt, has_max, skip, pdl = variant
    const = {"HAS_SINK": True, "HAS_MAX": has_max, "DEALT": dealt, "WIDE": False,
             "BLOCK_H": block_h, "BLOCK_HC": cfg["BLOCK_HC"], "BLOCK_DC": cfg["BLOCK_DC"],
             "PARTS": cfg["DEALT_PARTS" if dealt else "PARTS"], "SKIP_EMPTY": skip, "PDL": pdl,
             "INTERPRET": False}
    return compile_kernel(_sparse_mla_combine_kernel, sig, const, target=target,
                          num_warps=cfg["num_warps"], num_stages=1,
                          config_name=f"H{block_h} HC{cfg['BLOCK_HC']} DC{cfg['BLOCK_DC']} "
                                      f"P{const['PARTS']}{' dealt' if dealt else ''}"
                                      f"{' max' if has_max else ''}{' skip' if skip else ''}"
                                      f"{' pdl' if pdl else ''}")


if __name__ == "__main__":
    from sm12x.kernels.common.compile_check import format_reports

    print(format_reports(compile_reports(("sm_120", "sm_121", "sm_90"))))
