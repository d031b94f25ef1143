"""Stand-in modules for what the frameworks' indexer modules import: configuration, distributed
state, forward context, metadata classes, and the compiled kernels they call (absent on a GPU
machine without the frameworks). ``vllm_stand_ins(release)`` / ``sglang_stand_ins(release)`` map module names to
the attributes the finder (:mod:`prove_1m.finder`) puts in them."""
from __future__ import annotations

import importlib
import logging
import os
import types

from prove_1m.common import BLOCK, RUN, logits_topk

class Absent:
    """A name a stand-in module does not provide: importable, but calling it says which."""

    def __init__(self, name):
        self.name = name

    def __call__(self, *args, **kwargs):
        raise RuntimeError(f"prove_1m_indexer: stand-in {self.name} is not provided (the proof's path should "
                           f"not call it)")

    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return Absent(f"{self.name}.{attr}")

    def __repr__(self):
        return f"<absent {self.name}>"


class StandInModule(types.ModuleType):
    """A stand-in module (or package): a name it lacks is its submodule when the finder serves
    one (``from vllm import _custom_ops``), else ``Absent``."""

    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        full = f"{self.__name__}.{attr}"
        finder = self.__dict__.get("__proof_finder__")
        if finder is not None and finder.find_spec(full) is not None:
            return importlib.import_module(full)
        return Absent(full)


def _vllm_custom_ops():
    import torch

    def top_k_per_row_prefill(logits, row_starts, row_ends, out, num_rows, stride0, stride1, topk):
        logits_topk(logits[:num_rows], topk, row_ends[:num_rows], row_starts[:num_rows], out=out[:num_rows, :topk])

    def cp_gather_indexer_k_quant_cache(kv_cache, k_quant, k_scale, block_table, cu_seq_lens):
        from sm12x.kernels.indexer.cache import paged_cache_parts

        vals, scales = paged_cache_parts(kv_cache, k_quant.shape[-1], fp4=False)
        bounds = cu_seq_lens.tolist()
        k_u8, k_f32 = k_quant.view(torch.uint8), k_scale.view(torch.float32).reshape(-1)
        for req in range(len(bounds) - 1):
            lo, n = bounds[req], bounds[req + 1] - bounds[req]
            for p0 in range(0, -(-n // BLOCK), 4096):  # 4096 pages a copy bounds the temporary
                pages = block_table[req, p0:min(-(-n // BLOCK), p0 + 4096)].long()
                take = min(n - p0 * BLOCK, pages.numel() * BLOCK)
                dst = slice(lo + p0 * BLOCK, lo + p0 * BLOCK + take)
                k_u8[dst] = vals[pages].reshape(-1, vals.shape[-1])[:take]
                k_f32[dst] = scales[pages].reshape(-1)[:take]

    def top_k_per_row_decode(logits, next_n, seq_lens, out, num_rows, stride0, stride1, topk):
        logits_topk(logits[:num_rows], topk, decode_row_ends(seq_lens, num_rows), out=out[:num_rows, :topk])

    return {"top_k_per_row_prefill": top_k_per_row_prefill, "top_k_per_row_decode": top_k_per_row_decode,
            "cp_gather_indexer_k_quant_cache": cp_gather_indexer_k_quant_cache}


def decode_row_ends(seq_lens, rows):
    """vLLM's decode row ends: seq_lens [B, next_n] per row, or [B, 1] / [B] expanded over the
    request's next_n rows (row t of a request ends at len - next_n + 1 + t)."""
    import torch

    if seq_lens.numel() == rows:
        return seq_lens.reshape(-1)
    next_n = rows // seq_lens.shape[0]
    offsets = torch.arange(next_n, dtype=seq_lens.dtype, device=seq_lens.device)
    return (seq_lens.reshape(-1, 1) - next_n + 1 + offsets).clamp(min=0).reshape(-1)


def _register_radix_topk():
    """torch.ops._C.persistent_topk and cooperative_topk (vLLM's compiled decode top-k, which its
    indexer looks up through torch.ops at call time): row ends from seq_lens, positions out."""
    import torch

    if hasattr(torch.ops._C, "persistent_topk"):
        return
    lib = torch.library.Library("_C", "FRAGMENT")

    def radix_topk(logits, seq_lens, out, workspace, k, max_seq_len):
        logits_topk(logits, k, decode_row_ends(seq_lens, logits.shape[0]), out=out)

    for op in ("persistent_topk", "cooperative_topk"):
        lib.define(f"{op}(Tensor logits, Tensor seq_lens, Tensor(a!) out, Tensor workspace, int k, "
                   "int max_seq_len) -> ()")
        lib.impl(op, radix_topk, "CompositeExplicitAutograd")
    _register_radix_topk.lib = lib  # the library lives as long as the process


def _workspace_manager():
    import torch

    class Workspaces:
        """vLLM's workspace manager: buffers kept per shape (vLLM grows one and keeps it)."""

        def get_simultaneous(self, *specs):
            device = RUN.forward_context.device
            out = []
            for shape, dtype in specs:
                key = (tuple(shape), dtype)
                if key not in RUN.workspaces:
                    RUN.workspaces[key] = torch.empty(shape, dtype=dtype, device=device)
                out.append(RUN.workspaces[key])
            return out

    return Workspaces()


class _Platform:
    """vLLM's current_platform as an SM12x GPU shows it (capability family 120)."""

    dispatch_key = "CUDA"

    def fp8_dtype(self):
        import torch

        return torch.float8_e4m3fn

    def is_cuda(self):
        return True

    def is_cuda_alike(self):
        return True

    def is_rocm(self):
        return False

    def is_xpu(self):
        return False

    def is_cpu(self):
        return False

    def is_device_capability_family(self, family):
        return family == 120

    def has_device_capability(self, capability):
        return capability <= 120

    def is_device_capability(self, capability):
        return capability == 120


class _CustomOp:
    @classmethod
    def register(cls, name):
        return lambda c: c

    def __init__(self, *args, **kwargs):
        pass


def _vllm_deep_gemm(release):
    """vllm.utils.deep_gemm: its wrappers' signatures for ``release``, DeepGEMM = sm12x's front end."""
    import torch

    def dg():
        from sm12x.frontends.deep_gemm import indexer

        return indexer

    if release == "vllm-0.25.1":
        def fp8_fp4_mqa_logits(q, kv, weights, cu_seqlen_ks, cu_seqlen_ke, clean_logits):
            return dg().fp8_fp4_mqa_logits(q, kv, weights, cu_seqlen_ks, cu_seqlen_ke, clean_logits=clean_logits)
    else:
        def fp8_fp4_mqa_logits(q, kv, weights, cu_seqlen_ks, cu_seqlen_ke, max_seqlen_k, logits_dtype=torch.float32):
            return dg().fp8_fp4_mqa_logits(q, kv, weights, cu_seqlen_ks, cu_seqlen_ke, clean_logits=False,
                                           max_seqlen_k=max_seqlen_k, logits_dtype=logits_dtype)

    def fp8_fp4_paged_mqa_logits(q, kv_cache, weights, context_lens, block_tables, schedule_metadata, max_model_len,
                                 clean_logits=False, logits_dtype=torch.float32, indices=None):
        # 0.25.1 passes clean_logits=False, 0.34.0 logits_dtype= and indices=
        return dg().fp8_fp4_paged_mqa_logits(q, kv_cache, weights, context_lens, block_tables, schedule_metadata,
                                             max_model_len, clean_logits=clean_logits, logits_dtype=logits_dtype,
                                             indices=indices)

    return {"fp8_fp4_mqa_logits": fp8_fp4_mqa_logits, "fp8_fp4_paged_mqa_logits": fp8_fp4_paged_mqa_logits,
            "get_paged_mqa_logits_metadata": lambda *a, **k: dg().get_paged_mqa_logits_metadata(*a, **k),
            "has_deep_gemm": lambda: True, "mqa_logits_use_mx_scales": lambda: False,
            # off SM100 vLLM passes the q scale and weights through unchanged
            "mqa_logits_mx_inputs": lambda q, q_scale, weights, logits_dtype: (q_scale, weights)}


class VllmIndexerMetadata(types.SimpleNamespace):
    """DeepseekV32IndexerMetadata: the fields sparse_attn_indexer reads."""


class VllmDecodeMetadata(types.SimpleNamespace):
    """DeepSeekV32IndexerDecodeMetadata: the fields sparse_attn_indexer reads."""


def dense_logits_rows(max_seqlen_k, max_logits_bytes=None):
    """vLLM 0.34's rows per dense logits call: float32 [rows, max_seqlen_k] within the
    VLLM_SPARSE_INDEXER_MAX_LOGITS_MB budget (512 MB by default), at least one row."""
    budget = (max_logits_bytes if max_logits_bytes is not None
              else int(os.environ.get("VLLM_SPARSE_INDEXER_MAX_LOGITS_MB", "512")) * 1024 * 1024)
    return max(1, budget // (4 * max(1, max_seqlen_k)))


def vllm_stand_ins(release):
    """{module: {name: value}} for what vLLM's indexer modules import (``release`` picks the
    ``vllm.utils.deep_gemm`` signatures)."""
    import enum

    import torch
    import triton
    import triton.language as tl

    class CUDAGraphMode(enum.Enum):
        NONE = 0
        PIECEWISE = 1
        FULL = 2

    envs = {"VLLM_SPARSE_INDEXER_MAX_LOGITS_MB": int(os.environ.get("VLLM_SPARSE_INDEXER_MAX_LOGITS_MB", "512")),
            "VLLM_SPARSE_INDEXER_MAX_DECODE_LOGITS_MB": 2048, "VLLM_USE_FUSED_MQA_TOPK": True,
            "VLLM_BATCH_INVARIANT": False, "VLLM_USE_DIRECT_DCP_A2A": False}
    group = types.SimpleNamespace(world_size=1, rank_in_group=0)
    return {
        "vllm.envs": envs,
        "vllm._custom_ops": _vllm_custom_ops(),
        "vllm._cpu_ops": {},
        "vllm._aiter_ops": {},
        "vllm.compilation.breakable_cudagraph": {"eager_break_during_capture": lambda f: f},
        "vllm.config": {"CUDAGraphMode": CUDAGraphMode, "get_current_vllm_config": Absent("vllm config"),
                        "get_current_vllm_config_or_none": lambda: None},
        "vllm.distributed": {"get_dcp_group": lambda: group, "get_pcp_group": lambda: group},
        "vllm.forward_context": {"get_forward_context": lambda: RUN.forward_context},
        "vllm.logger": {"init_logger": logging.getLogger, "logger": logging.getLogger("vllm")},
        "vllm.model_executor.custom_op": {"CustomOp": _CustomOp},
        "vllm.model_executor.kernels.attention.dsa.candidate_blocks": {},  # the real one where extracted
        # DeepSelect: the SM100 family only (candidate_blocks asks before ranking blocks)
        "vllm.model_executor.kernels.attention.dsa.sparse_mqa_logits": {"has_deep_select": lambda: False},
        "vllm.model_executor.layers.quantization.utils.quant_utils": {},
        "vllm.platforms": {"current_platform": _Platform()},
        "vllm.triton_utils": {"triton": triton, "tl": tl},
        "vllm.utils.deep_gemm": _vllm_deep_gemm(release),
        "vllm.utils.flashinfer": {"has_flashinfer": lambda: False},
        "vllm.utils.import_utils": {"has_cutedsl": lambda: False},
        "vllm.utils.math_utils": {"round_up": lambda x, y: -(-x // y) * y, "cdiv": lambda x, y: -(-x // y)},
        "vllm.utils.torch_utils": {"STR_DTYPE_TO_TORCH_DTYPE": {"float32": torch.float32}, "LayerNameType": str,
                                   "_encode_layer_name": lambda name: name, "_resolve_layer_name": lambda name: name,
                                   "direct_register_custom_op": lambda **kwargs: None},
        "vllm.v1.attention.backends.mla.indexer": {"DeepseekV32IndexerMetadata": VllmIndexerMetadata,
                                                   "DeepSeekV32IndexerDecodeMetadata": VllmDecodeMetadata,
                                                   "dense_logits_rows": dense_logits_rows},
        "vllm.v1.attention.ops.common": {},
        "vllm.v1.attention.ops.pcp": {},
        "vllm.v1.worker.workspace": {"current_workspace_manager": _workspace_manager},
    }


class _Flag:
    def __init__(self, value):
        self.value = value

    def get(self):
        return self.value


# SGLang's environment as its DeepSeek-V4 model hook sets it on SM120 (TileLang paged indexer,
# torch paged logits fallback, which also drops the logits budget's row chunking)
SGLANG_ENV = {"SGLANG_OPT_USE_TILELANG_INDEXER": True, "SGLANG_FP8_PAGED_MQA_LOGITS_TORCH": True,
              "SGLANG_OPT_USE_AITER_INDEXER": False, "SGLANG_DSA_FUSE_TOPK": False,
              "SGLANG_OPT_DSV4_NONPAGED_INDEXER": True, "SGLANG_OPT_DSV4_NONPAGED_INDEXER_MIN_QUERY_TOKENS": 1,
              "SGLANG_DSA_TOPK_FLASHINFER_DETERMINISTIC": False,
              # read by the V4.1 passes (sglang_v41): logits dtype left to SGLang, its DeepGEMM on
              "SGLANG_OPT_DSV41_BF16_INDEX_LOGITS": None, "SGLANG_ENABLE_JIT_DEEPGEMM": True}


class ForwardMode:
    """SGLang's ForwardMode as forward_c4_indexer reads it."""

    EXTEND = "extend"
    DECODE = "decode"

    def __init__(self, kind):
        self.kind = kind

    def is_idle(self):
        return False

    def is_decode(self):
        return self.kind == self.DECODE

    def is_target_verify(self):
        return False

    def __eq__(self, other):
        return getattr(other, "kind", other) == self.kind

    def __hash__(self):
        return hash(self.kind)


class DSATopKBackend:
    """SGLang's DSATopKBackend.SGL_KERNEL (the default): sgl-kernel's topk_transform_paged."""

    SGL_KERNEL = None

    def is_torch(self):
        return False

    def is_flashinfer(self):
        return False

    def should_use_topk_v2(self):
        return False

    def is_sgl_kernel(self):
        return True


DSATopKBackend.SGL_KERNEL = DSATopKBackend()


class PagedIndexerMetadata(types.SimpleNamespace):
    """SGLang's PagedIndexerMetadata: the fields forward_c4_indexer reads."""


def iter_row_chunks(*, num_rows, rows_per_chunk):
    step = num_rows if rows_per_chunk is None else max(1, rows_per_chunk)
    for start in range(0, num_rows, max(step, 1)):
        yield slice(start, min(start + step, num_rows))


def sglang_topk_transform(scores, seq_lens, page_tables, out_page_indices, page_size, out_raw_indices=None):
    """sgl-kernel's topk_transform_paged: per row with seq_len > topk the topk best positions
    p < seq_len, rows of at most topk keys positions 0..seq_len-1, -1 after them; page slots to
    ``out_page_indices``, positions to ``out_raw_indices``."""
    from sm12x.frontends.sglang.indexer import write_page_indices

    positions = logits_topk(scores, out_page_indices.shape[1], seq_lens.reshape(-1))
    write_page_indices(positions, seq_lens, page_tables, out_page_indices, page_size, out_raw_indices)


def _tilelang_paged_logits(q_fp8, kvcache_fp8, weight, seq_lens, page_table, deep_gemm_metadata, max_seq_len,
                           clean_logits=True):
    raise RuntimeError("TileLang is not installed here: sm12x's DeepGEMM record replaces this function "
                       "(sglang.dsa.tilelang_paged_logits)")


def sglang_stand_ins(release):
    """{module: {name: value}} for what SGLang 0.5.23's DeepSeek-V4 indexer module imports (its
    DeepSeek-V4.1 indexer package's: :func:`prove_1m.sglang_v41_stand_ins.stand_ins` over these)."""
    import torch

    return {
        "sglang.kernels.ops.attention.dsv4": {"topk_transform_paged": sglang_topk_transform,
                                              "topk_transform_paged_v2": Absent("topk_transform_paged_v2")},
        "sglang.kernels.ops.attention.dsv4.fp4_indexer_hip": {"FP4RowgroupDecodeWorkspace": type("Absent", (), {})},
        "sglang.kernels.ops.attention.dsa.tilelang_kernel": {"tilelang_fp8_paged_mqa_logits": _tilelang_paged_logits},
        "sglang.kernels.ops.quantization.fp8_kernel": {"is_fp8_fnuz": lambda: False},
        "sglang.srt.configs.deepseek_v4": {},
        "sglang.srt.environ": {"envs": types.SimpleNamespace(**{k: _Flag(v) for k, v in SGLANG_ENV.items()})},
        "sglang.srt.layers.attention.dsa.dsa_topk_backend": {"DSATopKBackend": DSATopKBackend},
        "sglang.srt.layers.attention.dsa.utils": {},
        "sglang.srt.layers.attention.dsv4.compressor": {},
        "sglang.srt.layers.attention.dsv4.metadata": {"PagedIndexerMetadata": PagedIndexerMetadata,
                                                      "NonPagedIndexerPlan": types.SimpleNamespace,
                                                      "iter_row_chunks": iter_row_chunks},
        "sglang.srt.layers.attention.mqa_logits_utils": {},
        "sglang.srt.layers.linear": {"ReplicatedLinear": torch.nn.Linear},
        "sglang.srt.model_executor.forward_batch_info": {"ForwardMode": ForwardMode},
        "sglang.srt.model_executor.runner_backend_utils.breakable_cuda_graph.context":
            {"is_in_breakable_cuda_graph": lambda: False},
        "sglang.srt.model_executor.runner_backend_utils.tc_piecewise_cuda_graph":
            {"is_in_tc_piecewise_cuda_graph": lambda: False},
        "sglang.srt.runtime_context": {"get_parallel": lambda: types.SimpleNamespace(attn_cp_size=1),
                                       "get_platform": lambda: types.SimpleNamespace(is_sm120=True, is_sm100=False,
                                                                                     is_sm90=False)},
        "sglang.srt.state_capturer.indexer_topk": {"get_global_indexer_capturer": lambda: None},
        "sglang.srt.utils": {"is_cuda": lambda: True, "is_hip": lambda: False, "is_xpu": lambda: False,
                             "is_musa": lambda: False, "get_device_sm": lambda: 120,
                             "add_prefix": lambda name, prefix: f"{prefix}.{name}" if prefix else name},
    }
