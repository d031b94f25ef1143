"""Prove the 1M-token indexer pass on the frameworks' own code: vLLM's ``sparse_attn_indexer``
(0.34.0 and 0.25.1: a prefill chunk and decode rows) and SGLang 0.5.23's DeepSeek-V4
``C4IndexerBackendMixin.forward_c4_indexer`` (SM120's default paged route: a prefill chunk and
decode rows), run with sm12x's indexer top-k records applied and without them.

    scripts/extract_indexer_sources.sh /tmp/moe-wheels .proof-src
    python3 scripts/prove_1m_indexer.py --src .proof-src                          # on a GPU
    python3 scripts/prove_1m_indexer.py --src .proof-src --device cpu --keys 512 --queries 16 --decode-rows 2 \\
        --topk 16 --heads 8 --dim 128                                                       # interpreter

What runs as the frameworks' code: the modules ``extract_indexer_sources.sh`` takes from the
wheels (vLLM: ``sparse_attn_indexer``, and for 0.34 ``indexer_topk`` and ``fused_mqa_topk``;
SGLang: ``srt/layers/attention/dsv4/indexer``). Every other module they import is a stand-in
defined here (``vllm_stand_ins``, ``sglang_stand_ins``): configuration, distributed state,
forward context, metadata classes, and the compiled kernels they call, which are absent on the
device machine:

- DeepGEMM's logits (vLLM's ``vllm.utils.deep_gemm`` wrappers) are sm12x's DeepGEMM front end;
  SGLang's TileLang paged logits are a stand-in that sm12x's DeepGEMM record
  ``sglang.dsa.tilelang_paged_logits`` replaces with its paged logits kernel (on SM12x those
  records put these kernels there);
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
import functools
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
import types
from dataclasses import dataclass, field

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

RELEASES = ("vllm-0.34.0", "vllm-0.25.1", "sglang-0.5.23")
# SGLang's prefill runs twice: the paged route SM120 takes by default (TileLang logits for every
# row) and the non-paged one a single-request extend takes with the TileLang and torch logits off
PASSES = {"vllm-0.34.0": ("prefill", "decode"), "vllm-0.25.1": ("prefill", "decode"),
          "sglang-0.5.23": ("prefill", "prefill-nonpaged", "decode")}
FRAMEWORK_CALL = {"vllm-0.34.0": "vllm 0.34.0 sparse_attn_indexer", "vllm-0.25.1": "vllm 0.25.1 sparse_attn_indexer",
                  "sglang-0.5.23": "sglang 0.5.23 forward_c4_indexer"}
PASS_LABEL = {("sglang-0.5.23", "prefill"): "prefill (paged: TileLang, SM120 default)",
              ("sglang-0.5.23", "prefill-nonpaged"): "prefill (non-paged: TileLang and torch logits off)",
              ("sglang-0.5.23", "decode"): "decode (paged: TileLang)"}
BLOCK = 64  # key-cache page size (vLLM's indexer cache and SGLang's C4 pages)
TIE_TOL = 1e-5  # relative: a key this close to the k-th score counts as tied with it
SEED = 1234


# ---------------------------------------------------------------------------------------------
# Stand-in modules for what the frameworks' indexer modules import
# ---------------------------------------------------------------------------------------------

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


@dataclass
class Run:
    """What the stand-ins read while a pass runs (set by the drivers)."""

    forward_context: object = None
    workspaces: dict = field(default_factory=dict)
    logits_topk_calls: int = 0  # the frameworks' top-k over materialised logits, per pass


RUN = Run()


def logits_topk(logits, topk, ends, starts=None, out=None):
    """The frameworks' compiled top-k over materialised logits: int32 [rows, topk], the column of
    each of the row's k best scores among columns starts[r] <= c < ends[r], minus starts[r], -1
    padded; equal scores lower column first. Memory O(rows x topk) (sm12x's radix select)."""
    import torch

    from sm12x.kernels.indexer.fused_topk import decode_keys
    from sm12x.kernels.indexer.topk_filter import topk_keys

    RUN.logits_topk_calls += 1
    ends = ends.reshape(-1).to(torch.int32).contiguous()
    starts = None if starts is None else starts.reshape(-1).to(torch.int32).contiguous()
    keys = topk_keys(logits, topk, ends=ends, starts=starts)
    shift = None if starts is None else (-starts).contiguous()
    return decode_keys(keys, topk, out=out, shift=shift)


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
        "vllm.model_executor.kernels.attention.dsa.candidate_blocks": {},
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
              "SGLANG_DSA_TOPK_FLASHINFER_DETERMINISTIC": False}


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
    """{module: {name: value}} for what SGLang 0.5.23's DeepSeek-V4 indexer module imports."""
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
                                       "get_platform": lambda: types.SimpleNamespace(is_sm120=True)},
        "sglang.srt.state_capturer.indexer_topk": {"get_global_indexer_capturer": lambda: None},
        "sglang.srt.utils": {"is_cuda": lambda: True, "is_hip": lambda: False, "is_xpu": lambda: False,
                             "add_prefix": lambda name, prefix: f"{prefix}.{name}" if prefix else name},
    }


class FrameworkFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves one framework release: its real modules from ``src`` (the extracted files), the
    stand-ins above for the modules they import, plain packages for the folders between, and
    ModuleNotFoundError for anything else (so an unexpected import is seen, not stubbed)."""

    def __init__(self, top, src, stand_ins):
        self.top, self.src, self.stand_ins = top, src, stand_ins
        self.packages = {name.rsplit(".", i)[0] for name in stand_ins for i in range(name.count(".") + 1)}

    def _file(self, fullname):
        path = os.path.join(self.src, *fullname.split("."))
        return path + ".py" if os.path.isfile(path + ".py") else None

    def find_spec(self, fullname, path=None, target=None):
        if fullname.partition(".")[0] != self.top:
            return None
        real = self._file(fullname)
        if real:
            return importlib.util.spec_from_file_location(fullname, real)
        folder = os.path.isdir(os.path.join(self.src, *fullname.split(".")))
        if fullname in self.stand_ins or fullname in self.packages or folder:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = StandInModule(spec.name)
        module.__path__ = [os.path.join(self.src, *spec.name.split("."))]
        module.__proof_finder__ = self
        return module

    def exec_module(self, module):
        for name, value in self.stand_ins.get(module.__name__, {}).items():
            setattr(module, name, value)


def install_framework(release, src):
    """Put the finder for ``release`` (extracted under ``src/<release>``) on sys.meta_path, after
    sm12x's import watcher, so the watcher applies the patch records as these modules import."""
    top = release.partition("-")[0]
    root = os.path.join(src, release)
    sys.path.insert(0, root)  # its dist-info first: the release sm12x reads is this one
    stand_ins = vllm_stand_ins(release) if top == "vllm" else sglang_stand_ins(release)
    # after sm12x's watcher (which wraps what this finder loads), before the path finders: an
    # installed copy of the framework must not be the one that runs
    watchers = [i for i, f in enumerate(sys.meta_path) if getattr(f, "__sm12x_watcher__", False)]
    sys.meta_path.insert(watchers[-1] + 1 if watchers else 0, FrameworkFinder(top, root, stand_ins))
    if top == "vllm":
        _register_radix_topk()


# ---------------------------------------------------------------------------------------------
# Inputs
# ---------------------------------------------------------------------------------------------

@dataclass
class Inputs:
    """The inputs of every pass, made once for the largest context."""

    cache: object  # uint8 [pages, BLOCK, 1, dim + 4] (DeepGEMM's paged indexer-cache layout)
    q_prefill: object  # float8 [queries, heads, dim]
    w_prefill: object  # float32 [queries, heads]
    q_decode: object  # float8 [decode_rows, heads, dim]
    w_decode: object  # float32 [decode_rows, heads]


def make_inputs(args, device):
    """Deterministic inputs for the largest context; each context uses the cache's first pages."""
    import torch

    from sm12x.kernels.indexer.cache import quant_fp8_paged_cache

    g = torch.Generator(device=device).manual_seed(SEED)
    pages = -(-args.keys // BLOCK)
    values = torch.empty(pages, BLOCK, args.dim, device=device)
    for p0 in range(0, pages, 2048):  # in slices: the float32 keys take 4 bytes a value
        values[p0:p0 + 2048].normal_(generator=g)
    cache = quant_fp8_paged_cache(values)
    del values

    def queries(rows):
        q = torch.randn(rows, args.heads, args.dim, generator=g, device=device).to(torch.float8_e4m3fn)
        return q, torch.rand(rows, args.heads, generator=g, device=device)

    q_prefill, w_prefill = queries(args.queries)
    q_decode, w_decode = queries(args.decode_rows)
    return Inputs(cache, q_prefill, w_prefill, q_decode, w_decode)


def prefill_ends(keys, queries, device):
    """Row i of the chunk (the last ``queries`` tokens of a ``keys`` context) sees [0, ends[i])."""
    import torch

    return torch.arange(keys - queries + 1, keys + 1, dtype=torch.int32, device=device)


def decode_lens(keys, rows, device):
    """Decode request b sees about ``keys`` keys (a few fewer per row: distinct row lengths)."""
    import torch

    return (keys - 7 * torch.arange(rows, dtype=torch.int32, device=device)).clamp(min=1)


def block_table(keys, rows, device):
    """int32 [rows, pages of ``keys``]: every request maps its page p to cache page p."""
    import torch

    return torch.arange(-(-keys // BLOCK), dtype=torch.int32, device=device)[None].expand(rows, -1).contiguous()


# ---------------------------------------------------------------------------------------------
# Drivers: each calls the framework function the way the framework does, returns the indices
# ---------------------------------------------------------------------------------------------

def _forward_context(metadata, device):
    from vllm.config import CUDAGraphMode

    return types.SimpleNamespace(attn_metadata={"indexer": metadata}, cudagraph_runtime_mode=CUDAGraphMode.NONE,
                                 device=device)


def _vllm_prefill_chunks(release, keys, queries, device):
    """The prefill metadata vLLM's planner builds for one request: vLLM 0.34 one chunk (the
    indexer splits a dense chunk's rows by the logits budget itself); vLLM 0.25.1 query
    sub-chunks within VLLM_SPARSE_INDEXER_MAX_LOGITS_MB, later ones reusing the gathered keys."""
    import torch

    ends = prefill_ends(keys, queries, device)
    rows = queries if release == "vllm-0.34.0" else max(1, dense_logits_rows(keys))
    chunks = []
    for start in range(0, queries, rows):
        stop = min(queries, start + rows)
        chunks.append(types.SimpleNamespace(
            cu_seqlen_ks=torch.zeros(stop - start, dtype=torch.int32, device=device), cu_seqlen_ke=ends[start:stop],
            local_cu_seq_lens=torch.tensor([0, keys], dtype=torch.int32, device=device),
            max_local_total_seq_lens=keys, local_total_seq_lens=keys, skip_kv_gather=start > 0,
            block_table=block_table(keys, 1, device), token_start=start, token_end=stop, pcp_deinterleave_idx=None,
            max_seqlen_k=int(ends[stop - 1].item())))
    return chunks


def vllm_pass(module, release, kind, inputs, keys, topk):
    """A call running vLLM's ``sparse_attn_indexer`` (in ``module``) with the metadata and forward
    context vLLM builds for one pass at ``keys`` keys (``kind`` "prefill": the chunk's rows;
    "decode": the decode rows, next_n 1); it returns the index buffer, int32 [rows, topk]."""
    import torch

    device = inputs.cache.device
    vllm_cache = inputs.cache.squeeze(2)  # vLLM's indexer cache: [pages, block, dim + 4]
    q, w = (inputs.q_prefill, inputs.w_prefill) if kind == "prefill" else (inputs.q_decode, inputs.w_decode)
    rows, _, dim = q.shape
    buffer = torch.full((rows, topk), -7, dtype=torch.int32, device=device)
    if kind == "prefill":
        metadata = VllmIndexerMetadata(
            slot_mapping=torch.zeros(rows, dtype=torch.int64, device=device), num_decodes=0, num_decode_tokens=0,
            num_prefills=1, decode=None, max_seq_len=keys,
            prefill=types.SimpleNamespace(chunks=_vllm_prefill_chunks(release, keys, rows, device),
                                          shardq_gather_indices=None))
    else:
        from vllm.utils.deep_gemm import get_paged_mqa_logits_metadata

        lens = decode_lens(keys, rows, device)[:, None].contiguous()  # [B, 1]: next_n = 1
        decode = VllmDecodeMetadata(
            decode_lens=torch.ones(rows, dtype=torch.int32, device=device), requires_padding=False, seq_lens=lens,
            block_table=block_table(keys, rows, device), indices=None, global_seq_lens=None,
            schedule_metadata=get_paged_mqa_logits_metadata(lens, BLOCK, 132))
        metadata = VllmIndexerMetadata(slot_mapping=torch.zeros(rows, dtype=torch.int64, device=device),
                                       num_decodes=rows, num_decode_tokens=rows, num_prefills=0, prefill=None,
                                       decode=decode, max_seq_len=keys)
    RUN.forward_context = _forward_context(metadata, device)
    hidden = torch.empty(rows, 1, device=device)
    common = dict(hidden_states=hidden, k_cache_prefix="indexer", kv_cache=vllm_cache, q_quant=q, q_scale=None,
                  k=None, weights=w, quant_block_size=128, scale_fmt="ue8m0", topk_tokens=topk, head_dim=dim,
                  max_model_len=keys, total_seq_lens=keys, topk_indices_buffer=buffer, skip_k_cache_insert=True)
    if release == "vllm-0.34.0":
        common.update(use_pcp=False, pcp_shard_decode_requests=False, dense_mha_metadata_layer_name="")

    def call():
        module.sparse_attn_indexer(**common)
        return buffer

    return call


def _gather_index_keys(cache, page_table, seq_len_sum):
    """SGLang's get_index_k_scale_buffer for one request: its first ``seq_len_sum`` index keys
    as (uint8 [N, dim] FP8 bytes, uint8 [N, 4] float32 scale bytes)."""
    import torch

    from sm12x.kernels.indexer.cache import paged_cache_parts

    vals, scales = paged_cache_parts(cache, cache.shape[-1] - 4, fp4=False)
    pages = page_table[0, :-(-seq_len_sum // BLOCK)].long()
    k = vals[pages].reshape(-1, vals.shape[-1])[:seq_len_sum].contiguous()
    s = scales[pages].reshape(-1)[:seq_len_sum].contiguous()
    return k, s.view(torch.uint8).reshape(-1, 4)


def sglang_pass(module, kind, inputs, keys, topk):
    """A call running SGLang's ``forward_c4_indexer`` (``module.C4IndexerBackendMixin``) for one
    pass at ``keys`` keys (``kind`` "prefill" on the paged route, "prefill-nonpaged", "decode");
    it returns the raw (position) indices, int32 [rows, topk]."""
    import torch

    device = inputs.cache.device
    prefill = kind.startswith("prefill")
    q, w = (inputs.q_prefill, inputs.w_prefill) if prefill else (inputs.q_decode, inputs.w_decode)
    rows = q.shape[0]
    lens = prefill_ends(keys, rows, device) if prefill else decode_lens(keys, rows, device)
    pages = -(-keys // BLOCK)
    cache = inputs.cache[:pages]
    flat = cache.reshape(pages, -1)  # SGLang's C4 index-key buffer: [pages, 64 x 132] bytes
    page_table = block_table(keys, rows, device)
    page_out = torch.full((rows, topk), -7, dtype=torch.int32, device=device)
    raw_out = torch.full((rows, topk), -7, dtype=torch.int32, device=device)

    class Backend(module.C4IndexerBackendMixin):
        pass

    backend = Backend()
    backend.token_to_kv_pool = types.SimpleNamespace(
        get_index_k_with_scale_buffer=lambda layer_id: flat,
        get_index_k_scale_buffer=lambda layer_id, seq_len_tensor, page_indices, seq_len_sum, max_seq_len:
            _gather_index_keys(cache, page_indices, seq_len_sum))
    backend.hisparse_coordinator = None
    backend.forward_metadata = types.SimpleNamespace(
        indexer_metadata=PagedIndexerMetadata(
            page_size=BLOCK, compressed_page_size=BLOCK, page_table=page_table, compressed_seq_lens=lens,
            use_topk_v2=False, use_prefill_cuda_graph=False, deep_gemm_metadata=None, topk_metadata=None,
            nonpaged_plan=None, max_compressed_seq_len=keys, mqa_logits_budget_bytes=None, rows_per_chunk=None),
        core_metadata=types.SimpleNamespace(positions=torch.arange(rows, device=device),
                                            c4_sparse_page_indices=page_out, c4_sparse_raw_indices=raw_out))
    weights3 = w[:, :, None]
    indexer = types.SimpleNamespace(layer_id=0, use_fp4_indexer=False, index_topk=topk,
                                    compute_weights=lambda x, skip_scale=False: weights3,
                                    compute_q=lambda q_lora, positions, weights, q_lora_quant=None: (q, weights))
    # one request: its extend is the chunk's rows, its length the keys' tokens (4 per C4 entry)
    tokens = torch.tensor([4 * keys], device=device)
    batch = types.SimpleNamespace(
        forward_mode=ForwardMode(ForwardMode.EXTEND if prefill else ForwardMode.DECODE), _original_forward_mode=None,
        tbo_parent_token_range=None, batch_size=1 if prefill else rows, seq_lens=tokens, seq_lens_cpu=[4 * keys],
        extend_seq_lens_cpu=[rows], extend_seq_lens=torch.tensor([rows], device=device),
        extend_start_loc=torch.zeros(1, dtype=torch.int64, device=device), extend_num_tokens=rows)
    flags = {"SGLANG_OPT_USE_TILELANG_INDEXER": kind != "prefill-nonpaged",
             "SGLANG_FP8_PAGED_MQA_LOGITS_TORCH": kind != "prefill-nonpaged"}
    envs = sys.modules["sglang.srt.environ"].envs
    x = torch.empty(rows, 1, device=device)

    def call():
        for name, value in flags.items():
            getattr(envs, name).value = value
        backend.forward_metadata.indexer_metadata.nonpaged_plan = None  # SGLang plans once per forward
        try:
            backend.forward_c4_indexer(x=x, q_lora=x, c4_indexer=indexer, forward_batch=batch, skip_compressor=True)
        finally:
            for name in flags:
                getattr(envs, name).value = SGLANG_ENV[name]
        return raw_out

    return call


# ---------------------------------------------------------------------------------------------
# The worker: one release, one mode, every pass and context
# ---------------------------------------------------------------------------------------------

def _sync(device):
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize()


def measure(call, device, reps):
    """(indices, peak bytes above what was allocated before, median ms)."""
    import torch

    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    out = call().clone()  # warm-up: compiles, and allocates what the pass keeps
    times = []
    for _ in range(reps):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            call()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            call()
            times.append((time.perf_counter() - t0) * 1e3)
    peak = torch.cuda.max_memory_allocated() - before if cuda else None
    return out, peak, statistics.median(times) if times else None


def reference_scores(kind, inputs, keys, k, rows):
    """Reference logits (``sm12x.kernels.indexer.reference``) of ``rows`` (row numbers) of a pass
    over the dequantised keys ``k``: float32 [len(rows), keys], -inf where a row sees no key."""
    import torch

    from sm12x.kernels.indexer.reference import ref_mqa_logits

    device = inputs.cache.device
    prefill = kind.startswith("prefill")
    q, w = (inputs.q_prefill, inputs.w_prefill) if prefill else (inputs.q_decode, inputs.w_decode)
    ends = prefill_ends(keys, q.shape[0], device) if prefill else decode_lens(keys, q.shape[0], device)
    idx = torch.tensor(rows, device=device)
    return ref_mqa_logits(q[idx].float(), k, torch.ones(keys, device=device), w[idx],
                          torch.zeros(len(rows), dtype=torch.int32, device=device), ends[idx])


def compare(kind, inputs, keys, got, want, topk):
    """Rows of (sm12x's, the unpatched function's) indices: (same set, differing only by keys
    tied with the row's k-th reference score, differing otherwise)."""
    import torch

    from sm12x.kernels.indexer.cache import dequant_paged_cache

    differ = (torch.sort(got, dim=1).values != torch.sort(want, dim=1).values).any(dim=1).nonzero().flatten().tolist()
    ties = wrong = 0
    if differ:
        dim = inputs.q_prefill.shape[-1]
        k = dequant_paged_cache(inputs.cache[:-(-keys // BLOCK)], dim, fp4=False).reshape(-1, dim)[:keys]
    for i in range(0, len(differ), 64):  # reference logits for 64 rows at a time
        rows = differ[i:i + 64]
        scores = reference_scores(kind, inputs, keys, k, rows)
        for s, row in zip(scores, rows):
            kth = torch.topk(s, min(topk, s.numel())).values[-1]
            mine, theirs = set(got[row].tolist()) - {-1}, set(want[row].tolist()) - {-1}
            extra = torch.tensor(sorted(mine ^ theirs), device=s.device, dtype=torch.long)
            tied = bool(((s[extra] - kth).abs() <= TIE_TOL * kth.abs().clamp(min=1e-6)).all())
            ties += len(mine) == len(theirs) and tied
            wrong += not (len(mine) == len(theirs) and tied)
    return got.shape[0] - len(differ), ties, wrong


def worker(args):
    """One (release, mode) process: installs the release (the records apply as its modules
    import, or are skipped through SM12X_SKIP), runs every pass at each context, prints a JSON
    row per pass (the patched rows compared with the unpatched run's saved indices) and the
    records' outcomes last."""
    import torch

    device = torch.device(args.device)
    if device.type == "cpu":
        # a CPU build of torch cannot ask CUDA whether a graph is being captured (SGLang's
        # non-paged plan asks); the answer on the CPU is no
        torch.cuda.is_current_stream_capturing = lambda: False
    install_framework(args.release, args.src)
    top = args.release.partition("-")[0]
    module = __import__("vllm.model_executor.layers.sparse_attn_indexer" if top == "vllm"
                        else "sglang.srt.layers.attention.dsv4.indexer", fromlist=["_"])
    from sm12x import apply

    records = set(indexer_topk_record_names())
    outcomes = {k: v[0] for k, v in apply.OUTCOMES.items() if k in records}
    if device.type == "cuda" and args.memory_cap_gib:
        index = torch.cuda.current_device() if device.index is None else device.index
        total = torch.cuda.get_device_properties(index).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, args.memory_cap_gib * 2 ** 30 / total), index)
    inputs = make_inputs(args, device)
    results, call, out, want = [], None, None, None
    for kind in PASSES[args.release]:
        for keys in args.context_list:
            row = {"release": args.release, "mode": args.mode, "pass": kind, "keys": keys}
            if args.deadline and time.time() > args.deadline:
                row.update(ok=False, error="not run: --budget-s spent")
                print(json.dumps(row), flush=True)
                results.append(row)
                continue
            try:
                if top == "vllm":
                    call = vllm_pass(module, args.release, kind, inputs, keys, args.topk)
                else:
                    call = sglang_pass(module, kind, inputs, keys, args.topk)
                RUN.logits_topk_calls = 0
                out, peak, ms = measure(call, device, args.reps)
                row.update(ok=True, peak=peak, ms=ms, logits_topk_calls=RUN.logits_topk_calls // (1 + args.reps))
                path = os.path.join(args.work, f"{args.release}-{kind}-{keys}")
                if args.mode == "unpatched":
                    torch.save(out.cpu(), path + ".pt")
                elif os.path.exists(path + ".pt"):
                    want = torch.load(path + ".pt").to(device)
                    row["same"], row["ties"], row["wrong"] = compare(kind, inputs, keys, out, want, args.topk)
            except torch.cuda.OutOfMemoryError as e:
                row.update(ok=False, error=f"out of memory under the {args.memory_cap_gib} GiB cap: "
                                           f"{str(e).splitlines()[0][:120]}")
            except Exception as e:  # a failing pass is a result: reported, stepping stops
                row.update(ok=False, error=f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}")
            call = out = want = None  # this pass's buffers go before the next one is measured
            RUN.workspaces.clear()
            _sync(device)
            if device.type == "cuda":
                torch.cuda.empty_cache()
            results.append(row)
            print(json.dumps(row), flush=True)
            if args.mode == "unpatched" and (not row["ok"] or (row.get("peak") or 0) > args.memory_cap_gib * 2 ** 30):
                break
    print(json.dumps({"outcomes": outcomes, "release": args.release, "mode": args.mode}), flush=True)


# ---------------------------------------------------------------------------------------------
# The parent: a worker per (release, mode), then one table
# ---------------------------------------------------------------------------------------------

def indexer_topk_record_names():
    from sm12x.patches import indexer_topk

    return [p.name for p in indexer_topk.PATCHES]


def run_worker(args, release, mode, work):
    """Run one (release, mode) worker; its rows stream to stderr as they come (a log that a
    time limit cuts still shows the passes done)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SM12X_")}
    env["PYTHONPATH"] = os.pathsep.join([REPO] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
    env["SM12X_FORCE"] = "1"
    if args.device == "cpu":
        env.update(SM12X_ARCH="12.0", TRITON_INTERPRET="1")
    if mode == "unpatched":
        env["SM12X_SKIP"] = ",".join(indexer_topk_record_names())
    contexts = args.context_list if mode == "unpatched" else sorted(set(args.context_list) | {args.keys})
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--release", release, "--mode", mode,
           "--src", args.src, "--work", work, "--device", args.device, "--contexts", ",".join(map(str, contexts)),
           "--keys", str(args.keys), "--queries", str(args.queries), "--decode-rows", str(args.decode_rows),
           "--topk", str(args.topk), "--heads", str(args.heads), "--dim", str(args.dim), "--reps", str(args.reps),
           "--memory-cap-gib", str(args.memory_cap_gib), "--deadline", str(args.deadline)]
    rows, outcomes, other = [], None, []
    with subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO) as proc:
        for line in proc.stdout:
            if not line.startswith("{"):
                other.append(line.rstrip())
                continue
            item = json.loads(line)
            if "outcomes" in item:
                outcomes = item["outcomes"]
            else:
                rows.append(item)
                print(f"[{release} {mode}] {line.rstrip()}", file=sys.stderr, flush=True)
    if proc.returncode != 0 or outcomes is None:
        rows.append({"release": release, "mode": mode, "pass": "worker", "keys": 0, "ok": False,
                     "error": f"worker exited {proc.returncode}: " + " | ".join(other[-15:])})
    return rows, outcomes or {}


def _gib(b):
    return "n/a" if b is None else f"{b / 2 ** 30:.2f} GiB"


def _ms(t):
    return "n/a" if t is None else (f"{t:.1f} ms" if t < 1000 else f"{t / 1000:.2f} s")


def table(args, rows):
    """One markdown table: per release and pass, a row per context step (the unpatched function
    and sm12x side by side) and the full --keys."""
    head = (f"Indexer pass through the frameworks' own functions, one {args.queries}-row prefill chunk (the "
            f"last {args.queries} tokens of the context) and {args.decode_rows} decode rows, {args.heads} heads x "
            f"{args.dim}, top-{args.topk}. Keys are indexer keys: a token each for DeepSeek-V3.2 / GLM-5, four "
            f"tokens each for DeepSeek-V4's C4 indexer (262,144 keys: a 1M-token V4 prompt). "
            f"sm12x: every indexer top-k record applied; unpatched: those records "
            f"skipped ([rows, keys] logits from sm12x's DeepGEMM-surface kernels, then the framework's top-k). "
            f"Peak: most memory allocated during the pass above its inputs; time: median of {args.reps} calls "
            f"after a warm-up. The unpatched function steps up the context until a pass fails or passes the "
            f"{args.memory_cap_gib:g} GiB cap. Tied rows: index sets that differ only by keys within "
            f"{TIE_TOL:g} (relative) of the row's k-th reference score.")
    lines = [head, "",
             ("| framework function | pass | keys | unpatched peak | unpatched time | sm12x peak | sm12x time | "
              "peak ratio | speed-up | top-k calls on logits (unpatched / sm12x) | rows same / tied / wrong | "
              "unpatched step-up |"),
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    failures = []
    by = {(r["release"], r["mode"], r["pass"], r["keys"]): r for r in rows}
    for release in args.release_list:
        for kind in PASSES[release]:
            un = [r for r in rows if r["release"] == release and r["mode"] == "unpatched" and r["pass"] == kind]
            stop = next((r for r in un if not r["ok"]), None)
            shown = sorted({r["keys"] for r in rows if r["release"] == release and r["pass"] == kind} | {args.keys})
            for keys in shown:
                u = by.get((release, "unpatched", kind, keys))
                p = by.get((release, "patched", kind, keys))
                u_ok, p_ok = bool(u and u["ok"]), bool(p and p["ok"])
                if p is not None and not p_ok:
                    failures.append(f"{release} {kind} at {keys} keys (sm12x): {p['error']}")
                if stop is not None:
                    note = stop["error"] if keys == stop["keys"] else ""
                else:
                    note = "within the cap at every step" if un and keys == shown[-1] else ""
                ratio = f"{u['peak'] / p['peak']:.1f}x" if u_ok and p_ok and u["peak"] and p["peak"] else ""
                speed = f"{u['ms'] / p['ms']:.2f}x" if u_ok and p_ok and u["ms"] and p["ms"] else ""
                check = f"{p['same']} / {p['ties']} / {p['wrong']}" if p_ok and "same" in p else ""
                calls = f"{u['logits_topk_calls'] if u_ok else '-'} / {p['logits_topk_calls'] if p_ok else '-'}"
                unpatched = (f"{_gib(u['peak'])} | {_ms(u['ms'])}" if u_ok
                             else f"{'failed' if u else 'not run'} | ")
                mine = f"{_gib(p['peak'])} | {_ms(p['ms'])}" if p_ok else f"{'FAILED' if p else 'not run'} | "
                lines.append(f"| {FRAMEWORK_CALL[release]} | {PASS_LABEL.get((release, kind), kind)} | {keys:,} | "
                             f"{unpatched} | {mine} | {ratio} | {speed} | {calls} | {check} | {note} |")
    for r in rows:
        if r["mode"] == "patched" and r.get("ok") and r.get("wrong"):
            failures.append(f"{r['release']} {r['pass']} at {r['keys']} keys: {r['wrong']} rows differ beyond ties")
        if r["pass"] == "worker":
            failures.append(f"{r['release']} {r['mode']}: {r['error']}")
    return "\n".join(lines), failures


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
    if args.budget_s and not args.worker:
        args.deadline = time.time() + args.budget_s
    if not args.release_list:
        p.error(f"--releases: none given (from {RELEASES})")
    unknown = set(args.release_list) - set(RELEASES)
    if unknown:
        p.error(f"--releases: {sorted(unknown)} not among {RELEASES}")
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


def report(args, rows):
    """The table (with its date / GPU / versions line) and the failures so far; written to
    ``--markdown`` and the rows to ``--json`` when given."""
    table_text, failures = table(args, rows)
    text = f"{time.strftime('%Y-%m-%d')}, {_versions(args.device)}\n\n{table_text}"
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(text + "\n")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return text, failures


@functools.cache
def _versions(device):
    import torch
    import triton

    gpu = torch.cuda.get_device_name() if device == "cuda" and torch.cuda.is_available() else "CPU (interpreter)"
    return f"{gpu}, torch {torch.__version__}, triton {triton.__version__}"


if __name__ == "__main__":
    sys.exit(main())
