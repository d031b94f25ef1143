"""SGLang 0.5.23's DeepSeek-V4.1 candidate indexer in the proof (``--v41`` with the SGLang release):
its own ``v41_indexer`` package run on a GPU that SGLang reads as SM120.

Four passes:

- ``init-v41``: ``make_candidate_indexer`` (the call ``DeepseekV4AttnBackend.__init__`` makes for a
  V4.1 model, ``candidate_topk_blocks > 0``). Unpatched (the gate record skipped) it must raise
  SGLang's ``RuntimeError`` ("the candidate indexer needs DeepGEMM's paged sparse MQA logits"),
  patched it must build the sparse-table backend (``SparseTableBackend``) for decode (and, where
  DeepGEMM's flat FP4 logits are there, sm12x's included, for prefill).
- ``decode-v41``: the candidate source layer's decode (``SparseTableBackend.publish_decode``: its
  own top-k as pool slots, and the table of its best blocks of 8 positions) and a consumer layer
  (``consume_decode``: candidate-only paged sparse logits over those blocks, then SGLang's top-k),
  one decode row per request, at every context. Patched, the backend is the one
  ``make_candidate_indexer`` built; unpatched, SGLang's ``SparseTableBackend`` itself (the class
  that function builds where SGLang's own flag is true), so that the source layer computes its
  [rows, max_compressed_seq_len] FP32 logits as SGLang does.
- ``prefill-v41``: a prefill chunk of one request (the last ``min(--queries, 1024)`` tokens of
  the context) through the source layer's ``publish_prefill`` (SGLang's flat-K FP4 logits in its
  own 2 GiB tiles, its top-k and block selection per tile, the table) and a consumer's
  ``consume_prefill`` (the table's sparse logits), as request-local positions; sm12x serves the
  DeepGEMM calls (flat and sparse logits, the table's schedule), no top-k record takes part.
- ``decode-v41-chunked``: the same with the metadata in two row chunks, SGLang's plan past SM120's
  4,096-row cap or an eager step's free-memory budget: the source layer's
  ``_publish_decode_chunked`` (a chunk's logits at a time, ranked through the DeepSeek-V4 indexer
  module's ``topk_transform_paged_from_metadata``).

In the prefill and decode passes both layers' index sets and the published blocks are checked
in both modes against ``sm12x.kernels.indexer.reference``: the same sets per row, or sets that
differ only by entries tied with the row's k-th reference score (``TIE_TOL`` relative for the
FP32 source scores and block maxima, ``BF16_TOL`` for the consumer, whose logits are bf16 as
DeepGEMM's sparse logits are).

What runs as SGLang's code (extracted from the wheel by ``extract_indexer_sources.sh``):
``srt/layers/attention/dsv4/v41_indexer/`` (``__init__``, ``types``, ``sparse_table``,
``scoring``, ``full_topk``, ``dense_blocks``), ``kernels/ops/attention/dsv4/`` ``index_logits``,
``candidate_blocks`` (its Triton ``candidate_row_lens`` kernel included), ``candidate_table``,
``topk`` and ``utils``, ``srt/layers/deep_gemm_wrapper/configurer`` (which computes
``DEEPGEMM_PAGED_SPARSE_MQA_LOGITS`` from the stand-in SM120 platform), and the DeepSeek-V4
``indexer`` module the C4 passes run. DeepGEMM is what SGLang imports on SM12x: sm12x's records,
or sm12x's stand-in ``deep_gemm`` where none is installed. Stand-ins (besides those of
``stand_ins.sglang_stand_ins``), all for code absent where no framework is installed:

- SGLang's JIT CUDA kernels, returned by a stand-in ``load_jit``: top-k v2 (``topk_plan``: no
  plan, as on a GPU without clusters; ``topk_transform_paged`` / ``_ragged``: the k best of a
  row's first ``seq_len`` scores through ``common.logits_topk``), ``block_amax`` (block maxima of 8, the
  newest block +inf, nothing written past a row's block count), ``candidate_block_table`` (the
  block ids ascending, INT32_MAX padded, and their pool slots / 8) and ``topk_bf16_small`` (the
  consumer's top-k over its sparse row, page-table transform included), each with the semantics
  its Python wrapper documents;
- ``fp4_indexer_rope.index_q_rope_pack_weights`` (SGLang's fused RoPE + FP4 query pack): sm12x's
  FP4 quantiser on the stand-in's already-rotated query, the head weights times their scale;
- the model layer (``DeepseekV41Indexer``: its ``wq_b`` hands the query through), the memory
  pool (one MXFP4 index-K pool of 68-byte slots at SGLang's SM12x page of 64 slots, slot =
  compressed position, shared by both layers; its flat-K gather by slot for prefill) and the
  configuration / platform (``get_device_sm`` 120, ``is_sm100`` false);
- SGLang Python beside the extracted modules, with its semantics: ``expand_index_page_table``
  and the logits-budget helpers ``mqa_logits_row_bytes`` / ``mqa_logits_rows_per_chunk`` (their
  modules import what the proof does not provide), the package's ``topk_transform_ragged_v2``
  (the ``topk`` module's);
- ``torch.cuda.get_device_capability`` answers (12, 0) while ``make_candidate_indexer`` first
  runs (its ``is_sm100_or_newer`` is cached from that call, as it would be on an SM120 card; on
  a CPU build CUDA also reads as available there);
- ``msgspec.Struct`` where msgspec is not installed (a keyword / positional record class);
- on the CPU only, CUDA streams and events (no-ops: one stream).

The metadata is SM120's: DeepGEMM's schedule (SGLang forces it for the FP4 indexer on SM120)
and no top-k v2 (SGLang's SM120 hook turns it off, so the plan is empty and the chunked form ranks
through the v1 transform; the unchunked ``publish_decode`` calls the v2 transform regardless).

Shapes: ``--decode-rows`` requests, request b seeing ``keys - 7 b`` compressed positions (V4.1's
candidate layers are its low-ratio index layers: at ratio 1 one compressed position per token,
so 1,048,576 keys are a 1M-token context, at ratio 2 524,288 keys are; the layers run at ratio 1
here),
``--heads`` x ``--dim`` index heads, top ``--topk``, ``2 topk / 8`` candidate blocks of 8.
"""
from __future__ import annotations

import sys
import types

from prove_1m.common import SEED, TIE_TOL
from prove_1m.sglang_v41_stand_ins import BLOCK, INT32_MAX, sm120_capability

PAGE = 64  # the index-K pool's page on SM12x (dsv41_index_page_size without DeepGEMM's SM100 flag)
KV_PAGE = 256  # SGLang's DeepSeek-V4 KV page (model override)
SLOT_BYTES = 68  # MXFP4 index key: 64 bytes of e2m1 and 4 of packed UE8M0
BF16_TOL = 2.0 ** -6  # relative: scores equal once rounded to bf16 lie within one ulp (<= 2**-7); twice that
PASSES = ("init-v41", "prefill-v41", "decode-v41", "decode-v41-chunked")
PREFILL_ROWS = 1024  # rows of the V4.1 prefill chunk (at most --queries)
GATE = "sglang.v41.candidate_indexer_gate"
PACKAGE = "sglang.srt.layers.attention.dsv4.v41_indexer"
GATE_ERROR = "the candidate indexer needs DeepGEMM's paged sparse MQA logits"


def topk_blocks(topk):
    """Candidate blocks per row: twice the top-k's worth of blocks of 8."""
    return max(1, 2 * topk // BLOCK)


# ---------------------------------------------------------------------------------------------
# Inputs and the passes
# ---------------------------------------------------------------------------------------------

class V41Inputs(types.SimpleNamespace):
    """The pool (uint8 [pages, PAGE x 68], ``cache`` its [pages, PAGE, 1, 68] view) and per layer
    the stand-in's rotated query (float32 [rows, heads x dim]) and head weights [rows, heads]."""


def make_inputs(args, device):
    import torch

    from sm12x.kernels.indexer.cache import quant_fp4_paged_cache

    g = torch.Generator(device=device).manual_seed(SEED + 41)
    pages = -(-args.keys // PAGE)
    flat = torch.empty(pages, PAGE * SLOT_BYTES, dtype=torch.uint8, device=device)
    for p0 in range(0, pages, 2048):  # in slices: the float32 keys take 4 bytes a value
        p1 = min(pages, p0 + 2048)
        values = torch.randn(p1 - p0, PAGE, args.dim, generator=g, device=device)
        flat[p0:p1] = quant_fp4_paged_cache(values).reshape(p1 - p0, -1)

    def layer(rows):
        return (torch.randn(rows, args.heads * args.dim, generator=g, device=device),
                torch.rand(rows, args.heads, generator=g, device=device))

    (q_src, w_src), (q_con, w_con) = layer(args.decode_rows), layer(args.decode_rows)
    prefill_rows = min(args.queries, PREFILL_ROWS)
    (p_src, pw_src), (p_con, pw_con) = layer(prefill_rows), layer(prefill_rows)
    return V41Inputs(flat=flat, cache=flat.view(pages, PAGE, 1, SLOT_BYTES), dim=args.dim, q_src=q_src, w_src=w_src,
                     q_con=q_con, w_con=w_con, p_src=p_src, pw_src=pw_src, p_con=p_con, pw_con=pw_con)


def _lens(keys, rows, device):
    import torch

    return (keys - 7 * torch.arange(rows, dtype=torch.int32, device=device)).clamp(min=1)


def _pool(inputs):
    """The DeepSeek-V4 memory pool as the V4.1 indexer reads it: one MXFP4 index-K pool (slot =
    compressed position here), paged at PAGE slots, and its rows gathered flat by slot."""
    from sm12x.kernels.indexer.cache import paged_cache_parts

    def flat_keys(layer_id, slots):
        import torch

        vals, scales = paged_cache_parts(inputs.cache, inputs.dim, fp4=True)
        s = slots.long()
        return vals.reshape(-1, vals.shape[-1])[s].view(torch.int8), scales.reshape(-1)[s]

    return types.SimpleNamespace(get_index_k_with_scale_buffer=lambda layer_id: inputs.flat,
                                 get_index_k_page_size=lambda ratio: PAGE, get_low_ratio_index_k_fp4=flat_keys)



def make_backend(inputs, topk, device):
    """SGLang's ``make_candidate_indexer`` as the attention backend calls it for a V4.1 model:
    (prefill backend, decode backend), or the exception it raises."""
    import torch

    package = sys.modules.get(PACKAGE) or __import__(PACKAGE, fromlist=["_"])
    settle_guard(device)
    with sm120_capability():
        return package.make_candidate_indexer(
            token_to_kv_pool=_pool(inputs), req_to_token=torch.zeros(1, 1, dtype=torch.int32, device=device),
            page_size=KV_PAGE, candidate_topk_blocks=topk_blocks(topk), candidate_block_size=BLOCK)


def settle_guard(device):
    """sm12x's runtime guard checks an op on the GPU the first time a record running it is
    called, and the V4.1 gate's first call is SGLang's backend init, which runs under the
    stand-in SM120 capability: there the check would take the sm_120 configurations on a Hopper
    GPU. Its verdicts on the ops these passes route (the gate's sparse logits, the fused top-k
    ops) are settled first, on the GPU's own capability, as a server on SM12x would see them (the
    kernels' configuration key is also cached per process at its first read)."""
    if getattr(device, "type", str(device).partition(":")[0]) != "cuda":
        return  # the guard checks nothing on the CPU (the interpreter)
    from sm12x import guard

    index = getattr(device, "index", None) or 0
    for op in ("paged_sparse_mqa_logits",) + guard.TOPK:
        guard.verdict(op, f"cuda:{index}")


def init_outcome(inputs, topk, mode, device):
    """The init pass: {outcome, same, ties, wrong} (wrong 1 when the outcome is not the mode's)."""
    try:
        prefill, decode = make_backend(inputs, topk, device)
        outcome = f"{type(decode).__name__} (prefill: {type(prefill).__name__})"
        good = mode == "patched" and type(decode).__name__ == "SparseTableBackend"
    except Exception as e:  # SGLang's refusal is this pass's unpatched result
        outcome = f"{type(e).__name__}: {str(e).splitlines()[0][:90] if str(e) else ''}"
        good = mode == "unpatched" and isinstance(e, RuntimeError) and GATE_ERROR in str(e)
    return {"outcome": outcome, "same": int(good), "ties": 0, "wrong": int(not good), "deep_gemm": _deep_gemm_seen()}


def _deep_gemm_seen():
    """What the gate saw: the ``deep_gemm`` SGLang imports and whether sm12x serves its sparse logits."""
    try:
        import deep_gemm

        from sm12x.frontends.deep_gemm.sparse_wrappers import SPARSE_NAMES, sm12x_serves_sparse_logits

        shim = getattr(deep_gemm, "__sm12x_shim__", False)
        has = [n for n in SPARSE_NAMES if callable(getattr(deep_gemm, n, None))]
        from sm12x import guard

        verdicts = {op: True if v.get("ok") else v.get("detail", "refused")[:160]
                    for op, v in guard.PROCESS_VERDICTS.items()}
        return (f"{'sm12x stand-in' if shim else getattr(deep_gemm, '__file__', '?')}; sparse functions {has}; "
                f"sm12x serves them: {sm12x_serves_sparse_logits()}; guard verdicts {verdicts}")
    except Exception as e:  # what the import raised is the answer
        return f"import deep_gemm: {type(e).__name__}: {e}"


def _backend(inputs, args, mode, device, decode):
    """Patched: the backend ``make_candidate_indexer`` built (its decode or prefill one); unpatched,
    where SGLang refuses to build one: its ``SparseTableBackend``, the class it builds for both."""
    if mode == "patched":
        return make_backend(inputs, args.topk, device)[1 if decode else 0]
    from sglang.srt.layers.attention.dsv4.v41_indexer.sparse_table import SparseTableBackend

    return SparseTableBackend(token_to_kv_pool=_pool(inputs), page_size=KV_PAGE,
                              candidate_topk_blocks=topk_blocks(args.topk), candidate_block_size=BLOCK)


def _indexer(args):
    """The model layer (``DeepseekV41Indexer``) as the indexer reads it: its ``wq_b`` hands the
    stand-in's rotated query through, its head weights are ``x``."""
    return types.SimpleNamespace(n_local_heads=args.heads, n_heads=args.heads, index_head_dim=args.dim,
                                 index_topk=args.topk, wq_b=lambda q_lora: (q_lora, None),
                                 head_weights_raw=lambda x: x, head_weight_scale=1.0)


def prefill_rows(args, keys):
    return min(args.queries, PREFILL_ROWS, keys)


def prefill_call(inputs, keys, args, mode, device):
    """A call running the source layer's ``publish_prefill`` and a consumer's ``consume_prefill`` for
    one request's prefill chunk (its last ``prefill_rows`` tokens) at ``keys`` compressed positions;
    it returns [source positions | consumer positions | published blocks (INT32_MAX padded)]."""
    import torch

    types_mod = sys.modules.get(f"{PACKAGE}.types") or __import__(f"{PACKAGE}.types", fromlist=["_"])
    backend = _backend(inputs, args, mode, device, decode=False)
    rows = prefill_rows(args, keys)
    positions = torch.arange(keys - rows, keys, device=device)
    kv_pages = -(-keys // KV_PAGE)
    freqs = torch.ones(1, 1, dtype=torch.complex64, device=device)

    def layer(layer_id, q, w):
        return types_mod.PrefillInputs(
            indexer=_indexer(args), layer_id=layer_id, compress_ratio=1, freqs_cis=freqs, x=w[:rows], q_lora=q[:rows],
            positions=positions, req_rows=torch.zeros(rows, dtype=torch.int64, device=device),
            req_pool_indices=torch.zeros(1, dtype=torch.int64, device=device),
            k_slots=torch.arange(keys, dtype=torch.int64, device=device), index_plans=None,
            kv_page_table=torch.arange(kv_pages, dtype=torch.int32, device=device)[None].expand(rows, -1).contiguous(),
            seq_lens_cpu=[keys], rows_per_request=[rows],
            rows_per_request_device=torch.tensor([rows], dtype=torch.int32, device=device),
            out_raw_indices=torch.full((rows, args.topk), -7, dtype=torch.int32, device=device), out_page_indices=None)

    source, consumer = layer(0, inputs.p_src, inputs.pw_src), layer(1, inputs.p_con, inputs.pw_con)

    def call():
        published = backend.publish_prefill(source)
        backend.consume_prefill(consumer, published)
        return torch.cat([source.out_raw_indices, consumer.out_raw_indices, published.blocks], dim=1)

    return call


class ChunkedMetadata(types.SimpleNamespace):
    """SGLang's PagedIndexerMetadata with its logits plan in row chunks: ``deep_gemm_metadata`` a
    list of per-chunk schedules, ``row_chunks()`` the (rows, schedule) pairs."""

    def row_chunks(self):
        n = self.compressed_seq_lens.shape[0]
        starts = range(0, n, self.rows_per_chunk)
        return [(slice(s, min(s + self.rows_per_chunk, n)), plan) for s, plan in zip(starts, self.deep_gemm_metadata)]


def decode_call(inputs, keys, args, mode, device, chunked=False):
    """A call running the source layer's ``publish_decode`` (``chunked``: with its metadata in two
    row chunks, so SGLang takes ``_publish_decode_chunked``) and a consumer's ``consume_decode`` at
    ``keys`` compressed positions; it returns [source slots | consumer slots | published blocks
    (INT32_MAX padded)], int32 [rows, 2 topk + topk_blocks]."""
    import torch

    import deep_gemm
    from sglang.srt.layers.attention.dsv4.metadata import PagedIndexerMetadata

    types_mod = sys.modules.get(f"{PACKAGE}.types") or __import__(f"{PACKAGE}.types", fromlist=["_"])
    backend = _backend(inputs, args, mode, device, decode=True)
    rows = args.decode_rows
    lens = _lens(keys, rows, device)
    pages = -(-keys // PAGE)
    table = torch.arange(pages, dtype=torch.int32, device=device)[None].expand(rows, -1).contiguous()

    def schedule(rows):
        return deep_gemm.get_paged_mqa_logits_metadata(lens[rows, None].contiguous(), PAGE, 132)

    common = dict(page_size=KV_PAGE, compressed_page_size=PAGE, page_table=table, compressed_seq_lens=lens,
                  use_topk_v2=False, topk_metadata=torch.empty((0,)), topk_metadata_chunks=None,
                  max_compressed_seq_len=keys, rows_per_request=1)
    if chunked:
        per = max(1, -(-rows // 2))
        metadata = ChunkedMetadata(**common, rows_per_chunk=per,
                                   deep_gemm_metadata=[schedule(slice(s, s + per)) for s in range(0, rows, per)])
    else:
        metadata = PagedIndexerMetadata(**common, rows_per_chunk=None, deep_gemm_metadata=schedule(slice(None)))
    indexer = _indexer(args)
    freqs = torch.ones(1, 1, dtype=torch.complex64, device=device)

    def layer(layer_id, q, w):
        return types_mod.DecodeInputs(
            indexer=indexer, layer_id=layer_id, compress_ratio=1, freqs_cis=freqs, x=w, q_lora=q,
            positions=(lens - 1).long(), req_rows=torch.arange(rows, device=device), paged_metadata=metadata,
            is_verify=False, out_page_indices=torch.full((rows, args.topk), -7, dtype=torch.int32, device=device))

    source, consumer = layer(0, inputs.q_src, inputs.w_src), layer(1, inputs.q_con, inputs.w_con)

    def call():
        published = backend.publish_decode(source)
        backend.consume_decode(consumer, published)
        return torch.cat([source.out_page_indices, consumer.out_page_indices, published.blocks], dim=1)

    return call


# ---------------------------------------------------------------------------------------------
# The check against the references
# ---------------------------------------------------------------------------------------------

def _verdict(scores, got, k, tol):
    """'same', 'tied' or 'wrong': ``got`` (a set of columns) against the k best of ``scores`` (one
    row, -inf where invalid), entries that differ allowed only within ``tol`` of the k-th."""
    import torch

    k = min(k, int(torch.isfinite(scores).sum()) + int((scores == float("inf")).sum()))
    if len(got) != k:
        return "wrong"
    if k == 0:
        return "same"
    want = set(torch.topk(scores, k).indices.tolist())
    if got == want:
        return "same"
    kth = scores[list(want)].min()
    diff = torch.tensor(sorted(got ^ want), device=scores.device)
    if bool(((scores[diff] - kth).abs() <= tol * kth.abs().clamp(min=1e-6)).all()):
        return "tied"
    return "wrong"


def check(inputs, keys, args, out, prefill=False):
    """(rows same, rows tied, rows wrong) of a prefill or decode pass's output against the
    references."""
    import torch

    from sm12x.kernels.indexer.cache import dequant_fp4, dequant_paged_cache, quant_fp4_per_token
    from sm12x.kernels.indexer.reference import ref_mqa_logits

    device = inputs.flat.device
    topk, kb = args.topk, topk_blocks(args.topk)
    if prefill:
        rows = prefill_rows(args, keys)
        lens = torch.arange(keys - rows + 1, keys + 1, dtype=torch.int32, device=device)
        q_src, w_src, q_con, w_con = inputs.p_src, inputs.pw_src, inputs.p_con, inputs.pw_con
    else:
        rows = args.decode_rows
        lens = _lens(keys, rows, device)
        q_src, w_src, q_con, w_con = inputs.q_src, inputs.w_src, inputs.q_con, inputs.w_con
    pages = -(-keys // PAGE)
    k = dequant_paged_cache(inputs.cache[:pages], args.dim, fp4=True).reshape(-1, args.dim)[:keys]

    def ref(q, w, idx):  # the scores of the query the stand-in packs: its FP4 values
        qf = dequant_fp4(*quant_fp4_per_token(q[idx].view(-1, args.heads, args.dim).float()))
        return ref_mqa_logits(qf, k, None, w[idx], torch.zeros(len(idx), dtype=torch.int32, device=device),
                              lens[idx])

    counts = {"same": 0, "tied": 0, "wrong": 0}
    for r0 in range(0, rows, 64):  # 64 rows of reference scores at a time
        idx = list(range(r0, min(rows, r0 + 64)))
        s_src, s_con = ref(q_src, w_src, idx), ref(q_con, w_con, idx)
        nb = -(-keys // BLOCK)
        padded = torch.full((len(idx), nb * BLOCK), float("-inf"), device=device)
        padded[:, :keys] = s_src
        block_scores = padded.view(len(idx), nb, BLOCK).amax(dim=2)
        for i, r in enumerate(idx):
            n = -(-int(lens[r]) // BLOCK)
            block_scores[i, n - 1] = float("inf")
            block_scores[i, n:] = float("-inf")
            src = set(out[r, :topk].tolist()) - {-1}
            con = set(out[r, topk:2 * topk].tolist()) - {-1}
            blocks = set(out[r, 2 * topk:].tolist()) - {INT32_MAX, -1}
            allowed = torch.full_like(s_con[i], float("-inf"))
            ids = torch.tensor(sorted(blocks), dtype=torch.long, device=device)
            cols = (ids[:, None] * BLOCK + torch.arange(BLOCK, device=device)[None]).flatten()
            cols = cols[cols < int(lens[r])]
            allowed[cols] = s_con[i, cols]
            verdicts = {_verdict(s_src[i], src, topk, TIE_TOL), _verdict(block_scores[i], blocks, kb, TIE_TOL),
                        _verdict(allowed, con, topk, BF16_TOL)}
            counts["wrong" if "wrong" in verdicts else "tied" if "tied" in verdicts else "same"] += 1
    return counts["same"], counts["tied"], counts["wrong"]
