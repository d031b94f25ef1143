"""What every part of the proof shares: the releases and passes, the shapes' constants, the state
the stand-ins read while a pass runs, and the frameworks' top-k over materialised logits."""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if REPO not in sys.path:
    sys.path.insert(0, REPO)
# the script the parent runs each worker as
SCRIPT = os.path.join(REPO, "scripts", "prove_1m_indexer.py")

RELEASES = ("vllm-0.34.0", "vllm-0.25.1", "sglang-0.5.23")
# SGLang's prefill runs twice: the paged route SM120 takes by default (TileLang logits for every
# row) and the non-paged one a single-request extend takes with the TileLang and torch logits off
PASSES = {"vllm-0.34.0": ("prefill", "decode"), "vllm-0.25.1": ("prefill", "decode"),
          "sglang-0.5.23": ("prefill", "prefill-nonpaged", "decode")}
FRAMEWORK_CALL = {"vllm-0.34.0": "vllm 0.34.0 sparse_attn_indexer", "vllm-0.25.1": "vllm 0.25.1 sparse_attn_indexer",
                  "sglang-0.5.23": "sglang 0.5.23 forward_c4_indexer"}
# DeepSeek-V4.1's two-level selection through vLLM 0.34's indexer (--v41): the candidate source
# layer and a consumer layer, a prefill chunk and decode rows
V41_PASSES = {"vllm-0.34.0": ("prefill-v41", "decode-v41"),
              # SGLang 0.5.23's V4.1 candidate indexer (prove_1m.sglang_v41): backend init, then a
              # source and a consumer layer in a prefill chunk and in decode (whole and row-chunked)
              "sglang-0.5.23": ("init-v41", "prefill-v41", "decode-v41", "decode-v41-chunked")}
# GLM-5-next's pool indexer through vLLM 0.34's own module (--glm5next; prove_1m.glm5next)
# (its dense prefill too: what layers outside the fused seam take, with real logits either way)
GLM5NEXT_PASSES = {"vllm-0.34.0": ("prefill-glm5next", "prefill-dense-glm5next", "decode-glm5next")}


def passes_for(release, v41=False, glm5next=False, only=()):
    """The passes a release runs (with ``v41`` / ``glm5next``, its DeepSeek-V4.1 / GLM-5-next
    passes too; ``only``: those of them named there)."""
    passes = (PASSES[release] + (V41_PASSES.get(release, ()) if v41 else ())
              + (GLM5NEXT_PASSES.get(release, ()) if glm5next else ()))
    return tuple(p for p in passes if p in only) if only else passes


PASS_LABEL = {("sglang-0.5.23", "prefill"): "prefill (paged: TileLang, SM120 default)",
              ("sglang-0.5.23", "prefill-nonpaged"): "prefill (non-paged: TileLang and torch logits off)",
              ("sglang-0.5.23", "decode"): "decode (paged: TileLang)",
              ("vllm-0.34.0", "prefill-v41"): "V4.1 prefill (candidate source + consumer layer)",
              ("vllm-0.34.0", "decode-v41"): "V4.1 decode (candidate source + consumer layer)",
              ("vllm-0.34.0", "prefill-glm5next"): "GLM-5-next prefill (keys: pools)",
              ("vllm-0.34.0", "prefill-dense-glm5next"): "GLM-5-next dense prefill (VLLM_USE_FUSED_MQA_TOPK=0)",
              ("vllm-0.34.0", "decode-glm5next"): "GLM-5-next decode (keys: pools)",
              ("sglang-0.5.23", "init-v41"): "V4.1 attention-backend init (SM120)",
              ("sglang-0.5.23", "prefill-v41"): "V4.1 prefill chunk (up to 1024 rows; no sm12x top-k record)",
              ("sglang-0.5.23", "decode-v41"): "V4.1 decode (candidate source + consumer layer)",
              ("sglang-0.5.23", "decode-v41-chunked"): "V4.1 decode, logits plan in 2 row chunks"}
# the framework function a pass runs, where it is not the release's FRAMEWORK_CALL
PASS_CALL = {("sglang-0.5.23", "init-v41"): "sglang 0.5.23 v41_indexer.make_candidate_indexer",
             ("sglang-0.5.23", "prefill-v41"): "sglang 0.5.23 SparseTableBackend.publish_prefill + consume_prefill",
             ("sglang-0.5.23", "decode-v41"): "sglang 0.5.23 SparseTableBackend.publish_decode + consume_decode",
             ("sglang-0.5.23", "decode-v41-chunked"):
                 "sglang 0.5.23 SparseTableBackend._publish_decode_chunked + consume_decode",
             **{("vllm-0.34.0", kind): "vllm 0.34.0 glm5next SparseAttnIndexerKpool"
                for kind in ("prefill-glm5next", "prefill-dense-glm5next", "decode-glm5next")}}
BLOCK = 64  # key-cache page size (vLLM's indexer cache and SGLang's C4 pages)
TIE_TOL = 1e-5  # relative: a key this close to the k-th score counts as tied with it
SEED = 1234


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


def block_table(keys, rows, device):
    """int32 [rows, pages of ``keys``]: every request maps its page p to cache page p."""
    import torch

    return torch.arange(-(-keys // BLOCK), dtype=torch.int32, device=device)[None].expand(rows, -1).contiguous()


def forward_context(metadata, device):
    """vLLM's forward context as the indexer reads it: the metadata under "indexer", no CUDA graph."""
    import types

    from vllm.config import CUDAGraphMode

    return types.SimpleNamespace(attn_metadata={"indexer": metadata}, cudagraph_runtime_mode=CUDAGraphMode.NONE,
                                 device=device)
