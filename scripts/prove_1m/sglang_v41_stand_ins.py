"""The stand-ins of SGLang's DeepSeek-V4.1 passes (:mod:`prove_1m.sglang_v41`, whose docstring lists
them and why): SGLang's JIT CUDA kernels behind a stand-in ``load_jit``, its fused RoPE + FP4 query
pack, the SGLang Python beside the extracted modules (``expand_index_page_table``, the
logits-budget helpers, the package's ``topk_transform_ragged_v2``), ``msgspec.Struct`` where msgspec
is absent, the SM120 capability while the backend is built, and CUDA streams on the CPU."""
from __future__ import annotations

import contextlib
import functools
import inspect
import sys
import types

from prove_1m.common import logits_topk

BLOCK = 8  # SGLang's CANDIDATE_BLOCK_SIZE
INT32_MAX = 2 ** 31 - 1


def _msgspec_module():
    class Struct:
        """msgspec.Struct as SGLang's V4.1 records use it: annotated fields (bases first), set by
        keyword or position, class attributes as defaults."""

        def __init_subclass__(cls, frozen=False, kw_only=False, **kwargs):
            super().__init_subclass__(**kwargs)
            fields = []
            for base in reversed(cls.__mro__):
                for name in inspect.get_annotations(base):
                    if name not in fields:
                        fields.append(name)
            cls.__struct_fields__ = tuple(fields)

        def __init__(self, *args, **kwargs):
            fields = type(self).__struct_fields__
            if len(args) > len(fields):
                raise TypeError(f"{type(self).__name__}: {len(args)} positional fields, {len(fields)} declared")
            values = dict(zip(fields, args), **kwargs)
            for name in fields:
                if name in values:
                    object.__setattr__(self, name, values[name])
                elif not hasattr(type(self), name):
                    raise TypeError(f"{type(self).__name__}: missing field {name!r}")

    module = types.ModuleType("msgspec")
    module.Struct = Struct
    return module


def install_msgspec():
    """The stand-in ``msgspec`` where none is installed."""
    try:
        import msgspec  # noqa: F401
    except ImportError:
        sys.modules["msgspec"] = _msgspec_module()


def _topk_transform_ragged(scores, seq_lens, row_starts, out_offsets, out_indices):
    """Top-k v2 ragged: per row the k best of ``scores[i, s : s + seq_lens[i]]`` (s = row_starts[i],
    0 without them) as ``position + out_offsets[i]``, -1 padded."""
    import torch

    lens = seq_lens.reshape(-1).to(torch.int32)
    starts = torch.zeros_like(lens) if row_starts is None else row_starts.reshape(-1).to(torch.int32)
    pos = logits_topk(scores, out_indices.shape[1], starts + lens, starts)
    out_indices.copy_(torch.where(pos >= 0, pos + out_offsets.reshape(-1, 1).to(pos.dtype), -1).to(out_indices.dtype))


def _package_topk_transform_ragged_v2(*args, **kwargs):
    """``sglang.kernels.ops.attention.dsv4.topk_transform_ragged_v2``: the package re-exports the
    ``topk`` module's function (extracted, real)."""
    from sglang.kernels.ops.attention.dsv4.topk import topk_transform_ragged_v2

    return topk_transform_ragged_v2(*args, **kwargs)


def _topk_plan(seq_lens, metadata, static_threshold):
    """No plan: the path a GPU without thread-block clusters takes."""


def _topk_transform_paged(scores, seq_lens, page_tables, out_page_indices, page_size, metadata,
                          out_raw_indices=None):
    """Top-k v2: per row the k best of its first seq_len scores (all of them when at most k),
    -1 padded; through ``page_tables`` as pool slots when given, raw positions otherwise."""
    from prove_1m.stand_ins import sglang_topk_transform

    if page_tables is not None:
        sglang_topk_transform(scores, seq_lens, page_tables, out_page_indices, page_size, out_raw_indices)
        return
    positions = logits_topk(scores, out_page_indices.shape[1], seq_lens.reshape(-1))
    out_page_indices.copy_(positions)


def _amax8_varlen(scores, seq_lens, out, topk):
    """Block maxima of 8 scores for blocks < ceil(seq_len / 8), the newest +inf, nothing written
    past that count; rows of at most ``topk`` blocks skipped (``topk`` 0: none). Four rows at a
    time, so the scratch stays O(4 x width)."""
    import torch

    rows, width = scores.shape
    nb = out.shape[1]
    for r0 in range(0, rows, 4):
        r1 = min(rows, r0 + 4)
        lens = seq_lens[r0:r1].long()
        n = (lens + BLOCK - 1) // BLOCK
        chunk = torch.full((r1 - r0, nb * BLOCK), float("-inf"), device=scores.device)
        chunk[:, :min(width, nb * BLOCK)] = scores[r0:r1, :nb * BLOCK].float()
        m = chunk.view(r1 - r0, nb, BLOCK).amax(dim=2)
        i = torch.arange(nb, device=scores.device)[None]
        m = torch.where(i == (n - 1)[:, None], torch.full_like(m, float("inf")), m)
        write = (i < n[:, None]) & ((n > topk)[:, None] if topk > 0 else True)
        out[r0:r1] = torch.where(write, m.to(out.dtype), out[r0:r1])


def _candidate_block_table(blocks, seq_lens, page_table, out_pages, page_size):
    """In place: a row's block ids ascending, INT32_MAX past min(k, ceil(seq_len / 8)); a row of
    at most k blocks the identity; their pool slots / 8 into ``out_pages``, same padding."""
    import torch

    k = blocks.shape[1]
    n = (seq_lens.long() + BLOCK - 1) // BLOCK
    col = torch.arange(k, device=blocks.device)[None]
    ids = torch.where(blocks >= 0, blocks.long(), torch.full_like(blocks, INT32_MAX, dtype=torch.long))
    ids = torch.where((n <= k)[:, None], col.expand_as(ids), ids.sort(dim=1).values)
    valid = col < torch.minimum(n, torch.full_like(n, k))[:, None]
    ids = torch.where(valid, ids, INT32_MAX)
    bpp = page_size // BLOCK
    pages = page_table.long().gather(1, (ids.clamp(max=page_table.shape[1] * bpp - 1) // bpp))
    slots = torch.where(valid, pages * bpp + ids % bpp, INT32_MAX)
    blocks.copy_(ids.to(blocks.dtype))
    out_pages.copy_(slots.to(out_pages.dtype))


def _topk_bf16_small(scores, seq_lens, page_table, out_page_indices, page_size):
    """The consumer's top-k: per row the k best of its first seq_len (bf16) scores, written as
    ``page_table[b, i // page_size] * page_size + i % page_size``, -1 padded."""
    import torch

    pos = logits_topk(scores.float(), out_page_indices.shape[1], seq_lens.reshape(-1)).long()
    p = pos.clamp(min=0)
    slot = page_table.long().gather(1, p // page_size) * page_size + p % page_size
    out_page_indices.copy_(torch.where(pos >= 0, slot, -1).to(out_page_indices.dtype))


# SGLang's JIT modules by their .cuh file: the wrapper names each Python function calls
JIT = {"topk_v2": {"topk_plan": _topk_plan, "topk_transform_paged": _topk_transform_paged,
                   "topk_transform_ragged": _topk_transform_ragged},
       "block_amax": {"amax8_varlen": _amax8_varlen},
       "candidate_block_table": {"transform": _candidate_block_table},
       "topk_bf16_small": {"topk_transform": _topk_bf16_small}}


def _load_jit(name, *args, cuda_files=(), cuda_wrappers=(), **kwargs):
    from prove_1m.stand_ins import Absent

    kernel = cuda_files[0].rsplit("/", 1)[-1].removesuffix(".cuh") if cuda_files else name
    impl = JIT.get(kernel, {})
    return types.SimpleNamespace(**{w: impl.get(w, Absent(f"JIT {kernel}.{w}")) for w, _ in cuda_wrappers})


def _index_q_rope_pack_weights(q, freqs, positions, weights, scale):
    from sm12x.kernels.indexer.cache import quant_fp4_per_token

    q_fp4, q_sf = quant_fp4_per_token(q.float())
    return q_fp4, q_sf, weights.float() * scale


def _async_h2d(values, dtype, device):
    import torch

    return torch.tensor(values, dtype=dtype, device=device)


def _mqa_logits_rows_per_chunk(*, num_rows, row_bytes, budget_bytes):
    if num_rows * row_bytes <= budget_bytes:
        return None
    rows = max(budget_bytes // max(row_bytes, 1), 1)
    return int(rows) if rows < num_rows else None


def _expand_index_page_table(page_table, *, full_page_size, compress_ratio, index_page_size):
    import torch

    per = full_page_size // compress_ratio // index_page_size
    if per == 1:
        return page_table
    base = page_table.to(torch.int64).unsqueeze(-1) * per + torch.arange(per, device=page_table.device)
    return base.reshape(page_table.shape[0], -1).to(torch.int32)


def stand_ins(base):
    """``base`` (the C4 indexer's stand-ins) with what the V4.1 modules import besides: SGLang's
    logits-budget helpers (``mqa_logits_row_bytes`` / ``_rows_per_chunk``, DeepGEMM's 256-column
    row stride) and ``expand_index_page_table`` with their SGLang semantics, the package's
    ``topk_transform_ragged_v2``, and the modules below."""
    merged = dict(base)
    merged["sglang.srt.layers.attention.mqa_logits_utils"] = {
        **base.get("sglang.srt.layers.attention.mqa_logits_utils", {}),
        "mqa_logits_row_bytes": lambda num_cols: -(-num_cols // 256) * 256 * 4,
        "mqa_logits_rows_per_chunk": _mqa_logits_rows_per_chunk}
    merged["sglang.srt.layers.attention.dsv4.metadata"] = {
        **base.get("sglang.srt.layers.attention.dsv4.metadata", {}), "expand_index_page_table": _expand_index_page_table}
    merged["sglang.kernels.ops.attention.dsv4"] = {
        **base.get("sglang.kernels.ops.attention.dsv4", {}), "topk_transform_ragged_v2": _package_topk_transform_ragged_v2}
    merged.update({
        "sglang.kernels.jit.utils": {"cache_once": functools.cache, "is_arch_support_pdl": lambda: False,
                                     "is_hip_runtime": lambda: False, "load_jit": _load_jit,
                                     "make_cpp_args": lambda *a: ", ".join(map(str, a))},
        "sglang.kernels.jit.utils.occupancy": {"NoSchedulableClustersError": RuntimeError,
                                               "get_max_active_clusters": lambda *a, **k: 0},
        "sglang.kernels.ops.attention.deep_select": {"is_deep_select_supported": lambda: False},
        "sglang.kernels.ops.attention.dsv4.fp4_indexer": {},
        "sglang.kernels.ops.attention.dsv4.fp4_indexer_rope":
            {"index_q_rope_pack_weights": _index_q_rope_pack_weights},
        "sglang.kernels.ops.quantization.fp4_indexer_quant": {},
        "sglang.srt.utils.common": {"async_h2d": _async_h2d, "ceil_align": lambda x, a: -(-x // a) * a},
        "sglang.srt.layers.attention.dsv4.dsv41_sparse": {},
        "sglang.srt.mem_cache.deepseek_v4_memory_pool": {},
        "sglang.srt.layers.deep_gemm_wrapper": {},
    })
    return merged


@contextlib.contextmanager
def sm120_capability():
    """``torch.cuda.get_device_capability`` answers (12, 0) inside: SGLang's V4.1 functions read the
    capability there, and a Hopper or CPU run must take SM120's branches. On a CPU build of torch,
    CUDA also reads as available inside (``has_dense_fp4_indexer`` asks), as on the GPU."""
    import torch

    real = torch.cuda.get_device_capability, torch.cuda.is_available, torch.version.cuda
    torch.cuda.get_device_capability = lambda *a, **k: (12, 0)
    if real[2] is None:
        torch.cuda.is_available, torch.version.cuda = (lambda: True), "cpu-stand-in"
    try:
        yield
    finally:
        torch.cuda.get_device_capability, torch.cuda.is_available, torch.version.cuda = real


def cpu_cuda_stand_ins():
    """One stream on the CPU: SGLang's V4.1 decode makes a side stream and events."""
    import torch

    class Stream:
        def __init__(self, *a, **k):
            pass

        def wait_stream(self, other):
            pass

        def wait_event(self, event):
            pass

    class Event:
        def __init__(self, *a, **k):
            pass

        def record(self, stream=None):
            pass

        def synchronize(self):
            pass

    main = Stream()
    torch.cuda.Stream, torch.cuda.Event = Stream, Event
    torch.cuda.current_stream = lambda *a, **k: main
    torch.cuda.stream = lambda s: contextlib.nullcontext()
    torch.Tensor.record_stream = lambda self, stream: None
