"""FlashInfer's ``trtllm_batch_decode_sparse_mla_dsv4`` as vLLM's DeepSeek-V4 attention calls it on
SM12x, with the shapes FlashInfer's SM120 kernels do not serve sent to sm12x's sparse decode.

vLLM >= 0.24 (``DeepseekV4FlashInferSM120Attention`` in
``vllm/models/deepseek_v4/nvidia/flashinfer_sparse.py``) runs every DeepSeek-V4 attention call on
SM12x (decode, MTP / EAGLE / DSpark verify, prefill chunks) through
``vllm.utils.flashinfer.flashinfer_trtllm_batch_decode_sparse_mla_dsv4``, by keyword:
``query`` bf16 [T, H, 512] (heads already zero-padded to the output's H), ``swa_kv_cache`` and
``compressed_kv_cache`` packed uint8 [num_pages, page, 1, 584] (``kv_layout="NHD"``),
``sparse_indices`` / ``extra_sparse_indices`` int32 [T, 1, topk] global slots (page * page_size +
offset, -1 invalid), ``swa_topk_lens`` / ``extra_sparse_topk_lens`` int32 [T], ``sinks`` fp32 [H],
``bmm1_scale`` the softmax scale, ``out`` bf16 [T, H, 512] written in place. Every token is its own
row (a verify step's k + 1 tokens per request are k + 1 rows), so a call is (T, H, topk, page,
extra topk, extra page).

What FlashInfer serves on SM120 (``flashinfer/mla/_sparse_mla_sm120`` and its csrc, read at tags
v0.6.13, v0.6.14, v0.6.16.post4, v0.6.17, v0.6.18rc7 and in the 0.6.12, 0.7.2.post1 and 0.7.4
wheels):
- T <= 64 goes to its decode kernels when the SWA page is 64 tokens and (H, topk) is in
  ``_DECODE_DSV4_DISPATCH``: 0.6.14-0.6.17 {8, 16, 32, 64, 128} x {128, 512, 1024};
  0.6.18 adds topk 192 and 256; 0.7 makes the table a predicate (1 <= H <= 128, any topk, any
  page). A T <= 64 call outside it reaches the C++ prefill orchestrator, which refuses it: a
  process abort "num_tokens > 64 ... got num_tokens=N" up to 0.6.17, a ValueError from 0.6.18.
- Larger T goes to that orchestrator (csrc/sparse_mla_sm120_prefill.cu): 0.6.14-0.6.17 serve
  H in {16, 32, 64, 128}, the main page 64, topk in {128, 512, 1024, 2048} with one cache and
  topk 128 with a compressed cache of page 64 or 2; 0.6.18 (flashinfer#4380) adds H 8 to both
  and topk 192 / 256 for one cache. 0.7 (attention_plan.h, attention_resolve.cu) serves any T with
  H in {8, 16, 32, 64, 128} and topk a multiple of 64.
- FlashInfer before 0.6.14 has no SM120 path (vLLM 0.24.0 pins 0.6.12, 0.25.x 0.6.13; both
  functions reject the ``swa_topk_lens`` keyword: vllm#48054), so it serves nothing.
So DSpark's SWA width 256 (vllm#50720) and 8 heads per rank in prefill chunks (vllm#55526) fail
in FlashInfer before 0.6.18, at any token count; sm12x's decode serves them all
(any H up to 128, any topk, any page, the same 584-byte cache).

The decision reads shapes and dtypes only (no tensor values), so it is the same in every replay of
a captured CUDA graph; sm12x's decode allocates by shape only.

The cache formats are one: FlashInfer's DSV4 ``KVCacheTraits`` (FlashMLA ABI) and sm12x's MODEL1
cache both keep per page ``page * 576`` bytes of token data (448 FP8 E4M3 NoPE, then 64 bf16 RoPE)
followed by an 8-byte footer per token (7 UE8M0 exponents for the 64-wide NoPE groups and a pad
byte); the softmax, the sink (out * sigmoid(lse - sink)) and the empty-row output (0) are the same.
"""
from __future__ import annotations

import dataclasses
import functools
import importlib
from typing import Optional

import torch

from sm12x import platform
from sm12x.kernels.common import checks
from sm12x.kernels.sparse_mla.decode import sparse_mla_decode

OP = "trtllm_batch_decode_sparse_mla_dsv4"

# FlashInfer's parameter order (0.6.12-0.7.4; later releases append keyword arguments)
PARAMETERS = ("query", "swa_kv_cache", "workspace_buffer", "sparse_indices", "compressed_kv_cache",
              "sparse_topk_lens", "seq_lens", "out", "bmm1_scale", "bmm2_scale", "sinks",
              "kv_layout", "cum_seq_lens_q", "max_q_len", "enable_pdl", "swa_topk_lens",
              "extra_sparse_indices", "extra_sparse_topk_lens")
# arguments of the SM100 (TRTLLM-gen) form only; a call that passes one is not SM120's
SM100_ONLY = ("sparse_topk_lens", "seq_lens", "cum_seq_lens_q", "max_q_len")
# later keyword arguments (FlashInfer 0.7) a call may pass at these values and still be the SM120
# packed path; any other later keyword given a value makes the call FlashInfer's
NEUTRAL = {"backend": ("auto", "sparse")}
PACKED_BYTES = 584  # DeepSeek-V4 fp8_ds_mla / FlashMLA MODEL1 bytes per token
D_QK = 512
MAX_HEADS = 128


@dataclasses.dataclass(frozen=True)
class CallShape:
    """What decides a call's route: tokens (rows), heads, SWA topk and page, compressed topk and
    page (0 without a compressed segment)."""

    tokens: int
    heads: int
    topk: int
    page: int
    extra_topk: int = 0
    extra_page: int = 0


@dataclasses.dataclass(frozen=True)
class FlashInferRule:
    """The shapes one FlashInfer release serves on SM120 (see the module docstring).

    ``decode_table``: a container of (heads, topk) for T <= ``decode_max_tokens`` (None: no SM120
    path at all); ``decode_page``: the SWA page the decode kernels need (None: any).
    ``prefill_*``: the orchestrator, reached from ``prefill_min_tokens`` tokens; ``prefill_topks``
    (one cache) / ``prefill_dual_topks`` (with a compressed cache) None mean an SWA topk that is
    any multiple of 64; ``prefill_extra_pages`` / ``prefill_page`` None mean any page."""

    name: str
    decode_table: object = None
    decode_max_tokens: int = 64
    decode_page: Optional[int] = 64
    prefill_min_tokens: int = 65
    prefill_heads: frozenset = frozenset()
    prefill_topks: Optional[frozenset] = frozenset()
    prefill_dual_topks: Optional[frozenset] = frozenset()
    prefill_extra_pages: Optional[frozenset] = frozenset()
    prefill_page: Optional[int] = 64

    def decode_serves(self, s: CallShape) -> bool:
        """Whether the decode kernels take ``s``: at most ``decode_max_tokens`` rows, the SWA page
        ``decode_page`` and (heads, topk) in ``decode_table``."""
        return (self.decode_table is not None and s.tokens <= self.decode_max_tokens
                and (self.decode_page is None or s.page == self.decode_page)
                and (s.heads, s.topk) in self.decode_table)

    def prefill_serves(self, s: CallShape) -> bool:
        """Whether the prefill orchestrator takes ``s``: from ``prefill_min_tokens`` rows, heads in
        ``prefill_heads``, the SWA page ``prefill_page``, the SWA topk in ``prefill_topks`` (with a
        compressed cache: ``prefill_dual_topks``, its page in ``prefill_extra_pages``)."""
        if (self.decode_table is None or s.tokens < self.prefill_min_tokens
                or s.heads not in self.prefill_heads):
            return False
        if self.prefill_page is not None and s.page != self.prefill_page:
            return False
        topks = self.prefill_dual_topks if s.extra_topk else self.prefill_topks
        pages = self.prefill_extra_pages
        if s.extra_topk and pages is not None and s.extra_page not in pages:
            return False
        return s.topk % 64 == 0 if topks is None else s.topk in topks

    def serves(self, s: CallShape) -> bool:
        """Whether FlashInfer computes this call (True) or fails on it (False)."""
        return self.decode_serves(s) or self.prefill_serves(s)


class _HeadsUpTo:
    """FlashInfer 0.7's decode envelope when its module cannot be read: 1 <= heads <= 128."""

    def __contains__(self, pair):
        return 1 <= pair[0] <= MAX_HEADS and pair[1] >= 1


# The releases' own tables, for when the installed module cannot be read (its values win).
_TABLE_0614 = frozenset((h, k) for h in (8, 16, 32, 64, 128) for k in (128, 512, 1024))
_TABLE_0618 = frozenset((h, k) for h in (8, 16, 32, 64, 128) for k in (128, 192, 256, 512, 1024))
NO_SM120 = FlashInferRule("FlashInfer without an SM120 sparse MLA path (< 0.6.14)")
RULE_0614 = FlashInferRule(
    "FlashInfer 0.6.14-0.6.17", decode_table=_TABLE_0614, prefill_heads=frozenset({16, 32, 64, 128}),
    prefill_topks=frozenset({128, 512, 1024, 2048}), prefill_dual_topks=frozenset({128}),
    prefill_extra_pages=frozenset({64, 2}))
RULE_0618 = dataclasses.replace(
    RULE_0614, name="FlashInfer 0.6.18", decode_table=_TABLE_0618,
    prefill_heads=frozenset({8, 16, 32, 64, 128}),
    prefill_topks=frozenset({128, 192, 256, 512, 1024, 2048}))
RULE_07 = FlashInferRule(
    "FlashInfer 0.7", decode_table=_HeadsUpTo(), decode_page=None, prefill_min_tokens=1,
    prefill_heads=frozenset({8, 16, 32, 64, 128}), prefill_topks=None, prefill_dual_topks=None,
    prefill_extra_pages=None, prefill_page=None)


def rule_for(version: Optional[str], module=None) -> FlashInferRule:
    """The rule of the installed FlashInfer: from its ``flashinfer.mla._sparse_mla_sm120``
    ``module`` when that imports (its decode table, token limit and page; the table also tells the
    prefill envelope: a set holding (16, 256) comes with flashinfer#4380, which added topk 192 /
    256 and 8-head prefill in the same change; a table that is not a set is 0.7's predicate), else
    from release ``version`` (None: not installed)."""
    table = getattr(module, "_DECODE_DSV4_DISPATCH", None)
    if table is None:
        if version is None or platform.parse_release(version) < (0, 6, 14):
            return NO_SM120
        release = platform.parse_release(version)
        return RULE_0614 if release < (0, 6, 18) else RULE_0618 if release < (0, 7) else RULE_07
    if isinstance(table, (set, frozenset)):
        base = RULE_0618 if (16, 256) in table else RULE_0614
    else:
        base = RULE_07
    return dataclasses.replace(
        base, name=f"{base.name} (installed {version}: its _DECODE_DSV4_DISPATCH)", decode_table=table,
        decode_max_tokens=int(getattr(module, "_DECODE_MAX_TOKENS", base.decode_max_tokens)),
        decode_page=getattr(module, "_DECODE_DSV4_PAGE_BLOCK_SIZE", base.decode_page))


@functools.lru_cache(maxsize=None)
def installed_rule() -> FlashInferRule:
    """The rule of the installed FlashInfer (read once per process)."""
    version = platform.versions().get("flashinfer-python")
    try:
        module = importlib.import_module("flashinfer.mla._sparse_mla_sm120")
    except Exception:  # absent before 0.6.14, or FlashInfer itself does not import
        module = None
    return rule_for(version, module)


def sm12x_serves(s: CallShape) -> bool:
    """Whether sm12x's sparse decode takes this shape (any page, any topk, 1-128 heads)."""
    return 1 <= s.heads <= MAX_HEADS and s.topk >= 1 and s.tokens >= 1


def routes_to_sm12x(s: CallShape, rule: FlashInferRule) -> bool:
    """The route of one call: sm12x where FlashInfer fails on the shape and sm12x serves it."""
    return not rule.serves(s) and sm12x_serves(s)


# ----------------------------------------------------------------------------------------------
# Reading a call


def bind(args, kwargs) -> Optional[dict]:
    """A call's arguments by FlashInfer's names; None when it does not fit that signature."""
    if len(args) > len(PARAMETERS) or set(PARAMETERS[:len(args)]) & kwargs.keys():
        return None
    return {**dict(zip(PARAMETERS, args)), **kwargs}


def _page_of(cache, layout):
    """Page size of a packed cache in FlashInfer's accepted forms, or None."""
    if cache.dim() == 3:
        return cache.shape[1]
    if cache.dim() == 4:
        if layout == "NHD" and cache.shape[2] == 1:
            return cache.shape[1]
        if layout == "HND" and cache.shape[1] == 1:
            return cache.shape[2]
    return None


def _packed(cache):
    return cache is not None and cache.dtype == torch.uint8 and cache.shape[-1] == PACKED_BYTES


def call_shape(named: dict) -> Optional[CallShape]:
    """The shape of an SM120 packed-cache call (bf16 [T, H, 512] or [b, s_q, H, 512] query, uint8
    584-byte caches, float scales, no SM100-only argument), or None for any other call (left to
    FlashInfer). Reads shapes and dtypes only."""
    for name, value in named.items():
        if name in SM100_ONLY and value is not None:
            return None
        if name not in PARAMETERS and value is not None and value not in NEUTRAL.get(name, ()):
            return None
    q, swa = named.get("query"), named.get("swa_kv_cache")
    indices, layout = named.get("sparse_indices"), named.get("kv_layout", "HND")
    if (q is None or indices is None or q.dtype != torch.bfloat16 or q.dim() not in (3, 4)
            or q.shape[-1] != D_QK):
        return None
    if not _packed(swa) or isinstance(named.get("bmm1_scale", 1.0), torch.Tensor):
        return None
    if isinstance(named.get("bmm2_scale", 1.0), torch.Tensor) or named.get("bmm2_scale", 1.0) != 1.0:
        return None
    page = _page_of(swa, layout)
    if page is None:
        return None
    tokens = q.shape[0] if q.dim() == 3 else q.shape[0] * q.shape[1]
    extra_indices = named.get("extra_sparse_indices")
    extra_topk = extra_page = 0
    if extra_indices is not None:
        extra = named.get("compressed_kv_cache")
        if not _packed(extra) or _page_of(extra, layout) is None:
            return None
        extra_topk, extra_page = extra_indices.shape[-1], _page_of(extra, layout)
    return CallShape(tokens, q.shape[-2], indices.shape[-1], page, extra_topk, extra_page)


# ----------------------------------------------------------------------------------------------
# The call on sm12x


def _as_nhd(cache, layout):
    """A packed cache as sm12x's [num_pages, page, 1, 584] view (no copy)."""
    if cache.dim() == 3:
        return cache.unsqueeze(2)
    return cache.transpose(1, 2) if layout == "HND" else cache


def _rows(t, tokens, name):
    """[T, topk] / [T, 1, topk] / [b, s_q, topk] indices -> [T, 1, topk]; lengths -> [T]."""
    if t is None:
        return None
    if name.endswith("lens"):
        return t.reshape(tokens)
    return t.reshape(tokens, 1, t.shape[-1])


def sparse_mla_dsv4(named: dict):
    """Run one SM120-form call (``call_shape`` not None) on sm12x's sparse decode, writing into
    ``out`` as FlashInfer does (``out`` shaped like ``query``; allocated when None) -> ``out``."""
    q, layout = named["query"], named.get("kv_layout", "HND")
    tokens, heads = (q.shape[0] if q.dim() == 3 else q.shape[0] * q.shape[1]), q.shape[-2]
    out = named.get("out")
    if out is None:
        out = torch.empty(q.shape, dtype=torch.bfloat16, device=q.device)
    checks.require(out.shape == q.shape and out.dtype == torch.bfloat16, OP, "out",
                   lambda: f"{out.dtype} {list(out.shape)}",
                   lambda: f"bf16 {list(q.shape)} (the query's shape)")
    sinks = named.get("sinks")
    if isinstance(sinks, (list, tuple)):
        sinks = sinks[0] if len(sinks) == 1 else sinks
    extra_indices = named.get("extra_sparse_indices")
    extra_cache = named.get("compressed_kv_cache") if extra_indices is not None else None
    if extra_indices is None and named.get("extra_sparse_topk_lens") is not None:
        raise checks.bad(OP, "extra_sparse_topk_lens", "a tensor without extra_sparse_indices",
                         "None unless extra_sparse_indices is given")
    try:
        target = out.view(tokens, 1, heads, out.shape[-1])
    except RuntimeError:  # an out that cannot be viewed per row: compute aside, copy in
        target = torch.empty((tokens, 1, heads, out.shape[-1]), dtype=torch.bfloat16, device=q.device)
    sparse_mla_decode(
        q.reshape(tokens, 1, heads, q.shape[-1]), _as_nhd(named["swa_kv_cache"], layout),
        _rows(named["sparse_indices"], tokens, "sparse_indices"),
        topk_length=_rows(named.get("swa_topk_lens"), tokens, "swa_topk_lens"), attn_sink=sinks,
        extra_k_cache=_as_nhd(extra_cache, layout) if extra_cache is not None else None,
        extra_indices=_rows(extra_indices, tokens, "extra_sparse_indices"),
        extra_topk_length=_rows(named.get("extra_sparse_topk_lens"), tokens, "extra_sparse_topk_lens"),
        softmax_scale=float(named.get("bmm1_scale", 1.0)), out=target, op=OP)
    if target.data_ptr() != out.data_ptr():
        out.copy_(target.view(out.shape))
    return out

