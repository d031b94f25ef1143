"""The run: inputs, the drivers that call each framework function as the framework does, the
worker (one release, one mode, every pass and context) and the parent's worker launch."""
from __future__ import annotations

import dataclasses
import json
import os
import statistics
import subprocess
import sys
import time
import types
from dataclasses import dataclass

from prove_1m import sglang_v41, sglang_v41_stand_ins
from prove_1m.common import BLOCK, REPO, RUN, SCRIPT, SEED, TIE_TOL, block_table, forward_context, passes_for
from prove_1m.finder import install_framework
from prove_1m.glm5next import MODULE as GLM5NEXT_MODULE
from prove_1m.glm5next import compare_glm5next, glm5next_pass
from prove_1m.stand_ins import (SGLANG_ENV, ForwardMode, PagedIndexerMetadata, VllmDecodeMetadata,
                                VllmIndexerMetadata, dense_logits_rows)

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


# ---------------------------------------------------------------------------------------------
# Drivers: each calls the framework function the way the framework does, returns the indices
# ---------------------------------------------------------------------------------------------

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


def vllm_pass(module, release, kind, inputs, keys, topk, candidates=(0, 0)):
    """A call running vLLM's ``sparse_attn_indexer`` (in ``module``) with the metadata and forward
    context vLLM builds for one pass at ``keys`` keys (``kind`` "prefill": the chunk's rows;
    "decode": the decode rows, next_n 1); it returns the index buffer, int32 [rows, topk].
    ``kind`` "prefill-v41" / "decode-v41": DeepSeek-V4.1's two-level selection, two indexer
    layers in turn, the candidate source (``candidate_write``) and a consumer (its own head
    weights: the source's reversed), sharing a candidate buffer of ``candidates`` = (blocks per
    row, block size) as vLLM's model allocates it (int32 [rows, blocks]); it returns [source
    indices | consumer indices | candidate blocks], int32 [rows, 2 topk + blocks]."""
    import torch

    device = inputs.cache.device
    vllm_cache = inputs.cache.squeeze(2)  # vLLM's indexer cache: [pages, block, dim + 4]
    base = kind.partition("-")[0]
    q, w = (inputs.q_prefill, inputs.w_prefill) if base == "prefill" else (inputs.q_decode, inputs.w_decode)
    rows, _, dim = q.shape
    buffer = torch.full((rows, topk), -7, dtype=torch.int32, device=device)
    if base == "prefill":
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
    RUN.forward_context = forward_context(metadata, device)
    hidden = torch.empty(rows, 1, device=device)
    common = dict(hidden_states=hidden, k_cache_prefix="indexer", kv_cache=vllm_cache, q_quant=q, q_scale=None,
                  k=None, weights=w, quant_block_size=128, scale_fmt="ue8m0", topk_tokens=topk, head_dim=dim,
                  max_model_len=keys, total_seq_lens=keys, topk_indices_buffer=buffer, skip_k_cache_insert=True)
    if release == "vllm-0.34.0":
        common.update(use_pcp=False, pcp_shard_decode_requests=False, dense_mha_metadata_layer_name="")

    if not kind.endswith("-v41"):
        def call():
            module.sparse_attn_indexer(**common)
            return buffer

        return call
    blocks, block_size = candidates
    published = torch.full((rows, blocks), -7, dtype=torch.int32, device=device)
    consumer = dict(common, topk_indices_buffer=torch.full_like(buffer, -7), weights=w.flip(-1).contiguous())
    layer = dict(candidate_blocks=published, candidate_block_size=block_size)

    def call_v41():
        module.sparse_attn_indexer(**common, **layer, candidate_write=True)
        module.sparse_attn_indexer(**consumer, **layer, candidate_write=False)
        return torch.cat([buffer, consumer["topk_indices_buffer"], published], dim=1)

    return call_v41


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


def reference_scores(kind, inputs, keys, k, rows, sizes=False):
    """Reference logits (``sm12x.kernels.indexer.reference``) of ``rows`` (row numbers) of a pass
    over the dequantised keys ``k``: float32 [len(rows), keys], -inf where a row sees no key. With
    ``sizes``, each logit's size instead (``ref_logit_sizes``: the scale of a kernel's rounding)."""
    import torch

    from sm12x.kernels.indexer.reference import ref_logit_sizes, ref_mqa_logits

    device = inputs.cache.device
    prefill = kind.startswith("prefill")
    q, w = (inputs.q_prefill, inputs.w_prefill) if prefill else (inputs.q_decode, inputs.w_decode)
    ends = row_ends(kind, keys, q.shape[0], device)
    idx = torch.tensor(rows, device=device)
    return (ref_logit_sizes if sizes else ref_mqa_logits)(
        q[idx].float(), k, torch.ones(keys, device=device), w[idx],
        torch.zeros(len(rows), dtype=torch.int32, device=device), ends[idx])


def row_ends(kind, keys, rows, device):
    """int32 [rows]: the exclusive end of each row's visible keys in a pass (all start at 0)."""
    return prefill_ends(keys, rows, device) if kind.startswith("prefill") else decode_lens(keys, rows, device)


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


def compare_v41(kind, inputs, keys, got, want, topk, block_size):
    """Rows of a V4.1 pass ([source | consumer | candidates], see ``vllm_pass``) in sm12x's run
    against the unpatched one: (same, tied, wrong). The source indices and the published blocks
    must be the same sets: both runs rank the same logits kernel's scores, lowest position first at
    equal ones. A consumer row whose sets differ ranks other kernels' scores in sm12x's run (its
    long rows score only their candidate keys, in the paged kernel, ``candidate_gather``), so it
    is tied when both runs' sets are the top-k of the float32 reference under vLLM's candidate mask
    within a 1e-5 tie plus the logits kernels' stated rounding (``reference.HEAD_SUM_TOL`` of the
    scores' sizes), and wrong otherwise."""
    import torch

    from sm12x.kernels.indexer.cache import dequant_paged_cache
    from sm12x.kernels.indexer.candidate_topk import MASKED
    from sm12x.kernels.indexer.reference import (HEAD_SUM_TOL, ref_candidate_mask, ref_indexer_topk,
                                                 topk_rows_differing)

    def differing(lo, hi):
        return (torch.sort(got[:, lo:hi], dim=1).values != torch.sort(want[:, lo:hi], dim=1).values).any(dim=1)

    wrong = differing(0, topk) | differing(2 * topk, got.shape[1])
    consumer = differing(topk, 2 * topk) & ~wrong
    check = consumer.nonzero().flatten().tolist()
    if check:
        dim = inputs.q_prefill.shape[-1]
        k = dequant_paged_cache(inputs.cache[:-(-keys // BLOCK)], dim, fp4=False).reshape(-1, dim)[:keys]
        ends = row_ends(kind, keys, got.shape[0], got.device)
        # the consumer ranks with the source's head weights reversed (``vllm_pass``)
        flipped = dataclasses.replace(inputs, w_prefill=inputs.w_prefill.flip(-1), w_decode=inputs.w_decode.flip(-1))
    for i in range(0, len(check), 64):  # reference logits for 64 rows at a time
        rows = check[i:i + 64]
        idx = torch.tensor(rows, device=got.device)
        masked = ref_candidate_mask(reference_scores(kind, flipped, keys, k, rows), ends[idx],
                                    got[idx, 2 * topk:], block_size, fill=MASKED)
        slack = HEAD_SUM_TOL * reference_scores(kind, flipped, keys, k, rows, sizes=True)
        ref = ref_indexer_topk(masked, topk, None, ends[idx])
        for j, row in enumerate(rows):
            one = slice(j, j + 1)
            for run in (got, want):
                if topk_rows_differing(run[row:row + 1, topk:2 * topk], ref[one], masked[one], slack=slack[one]):
                    wrong[row] = True
    ties = int((consumer & ~wrong).sum())
    return got.shape[0] - int((consumer | wrong).sum()), ties, int(wrong.sum())


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
    top = args.release.partition("-")[0]
    sglang_v41_on = top == "sglang" and args.v41
    if sglang_v41_on:
        sglang_v41_stand_ins.install_msgspec()
        if device.type == "cpu":
            sglang_v41_stand_ins.cpu_cuda_stand_ins()
    install_framework(args.release, args.src)
    module = __import__("vllm.model_executor.layers.sparse_attn_indexer" if top == "vllm"
                        else "sglang.srt.layers.attention.dsv4.indexer", fromlist=["_"])
    from sm12x import apply

    if device.type == "cuda" and args.memory_cap_gib:
        index = torch.cuda.current_device() if device.index is None else device.index
        total = torch.cuda.get_device_properties(index).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, args.memory_cap_gib * 2 ** 30 / total), index)
    inputs = make_inputs(args, device)
    v41_inputs = sglang_v41.make_inputs(args, device) if sglang_v41_on else None
    results, call, out, want = [], None, None, None
    for kind in passes_for(args.release, args.v41, args.glm5next, args.pass_list):
        for keys in args.context_list:
            if kind == "init-v41" and keys != args.context_list[-1]:
                continue  # backend init: once, whatever the context
            row = {"release": args.release, "mode": args.mode, "pass": kind,
                   "keys": args.keys if kind == "init-v41" else keys}
            if args.deadline and time.time() > args.deadline:
                row.update(ok=False, error="not run: --budget-s spent")
                print(json.dumps(row), flush=True)
                results.append(row)
                continue
            try:
                if kind in sglang_v41.PASSES and top == "sglang":
                    _sglang_v41_pass(kind, v41_inputs, keys, args, device, row)
                    results.append(row)
                    print(json.dumps(row), flush=True)
                    continue
                if kind.endswith("-glm5next"):
                    call = glm5next_pass(__import__(GLM5NEXT_MODULE, fromlist=["_"]), kind, inputs, keys, args.topk,
                                         args.index_kpool)
                elif top == "vllm":
                    call = vllm_pass(module, args.release, kind, inputs, keys, args.topk,
                                     (args.candidate_blocks, args.candidate_block_size))
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
                    if kind.endswith("-v41"):
                        check = compare_v41(kind, inputs, keys, out, want, args.topk, args.candidate_block_size)
                    elif kind.endswith("-glm5next"):
                        check = compare_glm5next(kind, inputs, keys, out, want, args.topk, args.index_kpool)
                    else:
                        check = compare(kind, inputs, keys, out, want, args.topk)
                    row["same"], row["ties"], row["wrong"] = check
            except torch.cuda.OutOfMemoryError as e:
                row.pop("checked", None)
                row.update(ok=False, error=f"out of memory under the {args.memory_cap_gib} GiB cap: "
                                           f"{str(e).splitlines()[0][:120]}")
            except Exception as e:  # a failing pass is a result: reported, stepping stops
                row.pop("checked", None)
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
    # read last: a pass's module (GLM-5-next's) imports, and its records apply, during the run
    records = set(indexer_topk_record_names()) | ({sglang_v41.GATE} if sglang_v41_on else set())
    outcomes = {k: v[0] for k, v in apply.OUTCOMES.items() if k in records}
    print(json.dumps({"outcomes": outcomes, "release": args.release, "mode": args.mode}), flush=True)


def _sglang_v41_pass(kind, inputs, keys, args, device, row):
    """SGLang's V4.1 passes (:mod:`prove_1m.sglang_v41`): the init outcome, or the prefill or decode
    pass measured and checked against the references, into ``row``."""
    if kind == "init-v41":
        row.update(ok=True, peak=None, ms=None, logits_topk_calls=0, checked="reference",
                   **sglang_v41.init_outcome(inputs, args.topk, args.mode, device))
        return
    prefill = kind.startswith("prefill")
    call = (sglang_v41.prefill_call(inputs, keys, args, args.mode, device) if prefill else
            sglang_v41.decode_call(inputs, keys, args, args.mode, device, chunked=kind.endswith("-chunked")))
    RUN.logits_topk_calls = 0
    out, peak, ms = measure(call, device, args.reps)
    row.update(ok=True, peak=peak, ms=ms, logits_topk_calls=RUN.logits_topk_calls // (1 + args.reps))
    row["same"], row["ties"], row["wrong"] = sglang_v41.check(inputs, keys, args, out, prefill=prefill)
    row["checked"] = "reference"


# ---------------------------------------------------------------------------------------------
# The parent: a worker per (release, mode), then one table
# ---------------------------------------------------------------------------------------------

def indexer_topk_record_names():
    """The indexer top-k records and the layers they stack on the DeepGEMM-route records: what the
    unpatched workers skip."""
    from sm12x.patches import indexer_topk

    return [p.name for p in indexer_topk.PATCHES] + [layer.name for layer in indexer_topk.PAGED_LAYERS.values()]


def run_worker(args, release, mode, work):
    """Run one (release, mode) worker; its rows stream to stderr as they come (a log that a
    time limit cuts still shows the passes done)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SM12X_")}
    env["PYTHONPATH"] = os.pathsep.join([REPO] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
    env["SM12X_FORCE"] = "1"
    if args.device == "cpu":
        env.update(SM12X_ARCH="12.0", TRITON_INTERPRET="1")
    if mode == "unpatched":
        # with SGLang's V4.1 passes the candidate-indexer gate too: its init must refuse as SGLang does
        gate = [sglang_v41.GATE] if args.v41 and release.startswith("sglang") else []
        env["SM12X_SKIP"] = ",".join(indexer_topk_record_names() + gate)
    contexts = args.context_list if mode == "unpatched" else sorted(set(args.context_list) | {args.keys})
    cmd = [sys.executable, SCRIPT, "--worker", "--release", release, "--mode", mode,
           "--src", args.src, "--work", work, "--device", args.device, "--contexts", ",".join(map(str, contexts)),
           "--keys", str(args.keys), "--queries", str(args.queries), "--decode-rows", str(args.decode_rows),
           "--topk", str(args.topk), "--heads", str(args.heads), "--dim", str(args.dim), "--reps", str(args.reps),
           "--memory-cap-gib", str(args.memory_cap_gib), "--deadline", str(args.deadline),
           "--candidate-blocks", str(args.candidate_blocks), "--candidate-block-size", str(args.candidate_block_size)]
    if args.v41:
        cmd.append("--v41")
    if args.glm5next:
        cmd += ["--glm5next", "--index-kpool", str(args.index_kpool)]
    if args.passes:
        cmd += ["--passes", args.passes]
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
