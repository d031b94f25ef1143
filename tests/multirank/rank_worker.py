"""Rank body of the multi-rank harness (``test_tensor_parallel_ranks.py``); not a test module.

The test starts a *launcher* interpreter the way a container starts a framework's engine process:
PYTHONPATH = the sm12x folder (so our ``sitecustomize`` runs), the stand-in framework packages and
this folder; ``SM12X_ARCH`` set. The launcher (``launch``) starts N ranks with
``torch.multiprocessing`` ("spawn" like SGLang, "fork" like vLLM's default), and each rank
(``run_rank``):

1. records its bootstrap (our ``sitecustomize`` loaded, watcher on ``sys.meta_path``) and that CUDA
   is not initialised yet; on GPUs binds ``cuda:rank`` with ``torch.cuda.set_device`` before any
   CUDA work;
2. joins a ``torch.distributed`` group (gloo on CPU, NCCL on GPUs; ``file://`` store);
3. imports the stand-in ``flash_mla`` / ``deep_gemm`` (whose originals raise the SM12x errors), so
   the real sm12x patches apply in this process (or were inherited through fork);
4. computes its shard: sparse MLA decode heads ``[r*h/N, (r+1)*h/N)`` through the patched
   ``flash_mla.flash_mla_with_kvcache``, and indexer paged logits for requests
   ``[r*b/N, (r+1)*b/N)`` through the patched ``deep_gemm.fp8_paged_mqa_logits`` (the indexer sums
   over heads, so it is sharded by request instead); on GPUs also captures each shard in a CUDA
   graph and replays it with new inputs;
5. all-gathers the shards, the ``sm12x.commands.status.status_data()`` outcome and the evidence; rank 0
   compares the gathered result bit for bit with the same kernel on the full inputs (and with each
   shard recomputed in one process), and within tolerance with the PyTorch references.

Every rank writes ``rank<r>.json``, rank 0 also ``summary.json`` (in ``out_dir``); the test
asserts on those files. Inputs are built from a seed on the CPU, so every rank has the same full
inputs without communication.
"""
import json
import os
import sys
import time


def _bootstrap_info():
    site = sys.modules.get("sitecustomize")
    return {
        "sitecustomize": getattr(site, "__file__", None),
        "active": bool(getattr(site, "_sm12x_active", False)),
        "watcher": any(getattr(f, "__sm12x_watcher__", False) for f in sys.meta_path),
    }


# ----------------------------------------------------------------------------------------------
# CUDA context evidence (driver API, read-only: never creates a context)


def _primary_contexts():
    """{ordinal: primary context active?} for every visible device, from
    ``cuDevicePrimaryCtxGetState`` (asking does not create a context). None when libcuda is absent."""
    import ctypes

    try:
        cu = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    if cu.cuInit(0) != 0:
        return None
    count = ctypes.c_int()
    if cu.cuDeviceGetCount(ctypes.byref(count)) != 0:
        return None
    states = {}
    for i in range(count.value):
        dev, flags, active = ctypes.c_int(), ctypes.c_uint(), ctypes.c_int()
        if cu.cuDeviceGet(ctypes.byref(dev), i) != 0:
            return None
        if cu.cuDevicePrimaryCtxGetState(dev, ctypes.byref(flags), ctypes.byref(active)) != 0:
            return None
        states[i] = bool(active.value)
    return states


def _allocated_elsewhere(torch, rank):
    """{ordinal: bytes the caching allocator holds} on the devices other than ``rank``."""
    return {i: int(torch.cuda.memory_allocated(i))
            for i in range(torch.cuda.device_count()) if i != rank}


# ----------------------------------------------------------------------------------------------
# inputs (same seed on every rank -> identical full inputs)


def decode_case(shape, device):
    import torch
    from sm12x.kernels.sparse_mla.reference import make_case

    case = make_case(**shape)  # built on the CPU: same bytes on every rank
    return {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in case.items()}


def decode_kwargs(case, lo, hi):
    """``flash_mla_with_kvcache`` keyword arguments for heads [lo, hi) (sink sliced with them)."""
    sink = case.get("attn_sink")
    return dict(softmax_scale=case["softmax_scale"], is_fp8_kvcache=True, indices=case["indices"],
                attn_sink=None if sink is None else sink[lo:hi].contiguous(),
                extra_k_cache=case.get("extra_k_cache"),
                extra_indices_in_kvcache=case.get("extra_indices"),
                topk_length=case.get("topk_length"), extra_topk_length=case.get("extra_topk_length"))


def indexer_case(shape, device):
    import torch
    from sm12x.kernels.indexer.cache import quant_fp8_paged_cache

    g = torch.Generator().manual_seed(shape.get("seed", 0))
    b, next_n, h, d = shape["b"], shape["next_n"], shape["h"], shape["d"]
    bkv, blocks = shape["block_kv"], shape["blocks"]
    cache = quant_fp8_paged_cache(torch.randn(b * blocks, bkv, d, generator=g))
    q = torch.randn(b, next_n, h, d, generator=g).to(torch.float8_e4m3fn)
    w = torch.randn(b * next_n, h, generator=g)
    ctx = torch.tensor(shape["ctx"], dtype=torch.int32)
    if next_n > 1:  # MTP: 2-D context_lens, row (b, t) sees < ctx[b] - next_n + t + 1
        lens = (ctx[:, None] - next_n + 1 + torch.arange(next_n, dtype=torch.int32)[None, :])
        lens = lens.to(torch.int32).contiguous()
    else:
        lens = ctx
    bt = torch.randperm(b * blocks, generator=g).to(torch.int32).view(b, blocks)
    case = dict(q=q, cache=cache, w=w, lens=lens, bt=bt, max_ctx=blocks * bkv, block_kv=bkv,
                next_n=next_n)
    return {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in case.items()}


def indexer_shard(case, lo, hi):
    n = case["next_n"]
    return dict(q=case["q"][lo:hi].contiguous(), w=case["w"][lo * n:hi * n].contiguous(),
                lens=case["lens"][lo:hi].contiguous(), bt=case["bt"][lo:hi].contiguous())


# ----------------------------------------------------------------------------------------------
# the kernels, through the patched framework entry points


def run_decode(flash_mla, case, lo, hi):
    q = case["q"][:, :, lo:hi].contiguous()
    meta = flash_mla.get_mla_metadata()[0]  # one SchedMeta per call configuration
    out, lse = flash_mla.flash_mla_with_kvcache(q, case["k_cache"], None, None, 512, meta,
                                                **decode_kwargs(case, lo, hi))
    return out, lse.contiguous()


def run_indexer(deep_gemm, case, shard, num_sms):
    meta = deep_gemm.get_paged_mqa_logits_metadata(shard["lens"], case["block_kv"], num_sms)
    logits = deep_gemm.fp8_paged_mqa_logits(shard["q"], case["cache"], shard["w"], shard["lens"],
                                            shard["bt"], meta, case["max_ctx"], clean_logits=True)
    return logits.contiguous()  # the row stride is padded (DeepGEMM layout)


def bits(t):
    """Bit pattern view (exact comparison, NaN-safe)."""
    import torch

    t = t.contiguous()
    return t.view({2: torch.int16, 4: torch.int32, 1: torch.uint8}[t.element_size()])


def ulps(a, b):
    """Largest distance in units in the last place between same-shape float tensors (0 = bit
    identical; +-inf compare as ordinary bit patterns)."""
    import torch

    def ordered(t):
        x = bits(t).long()
        top = 1 << (8 * t.element_size() - 1)
        return torch.where(x < 0, -(x + top), x)

    return int((ordered(a) - ordered(b)).abs().max()) if a.numel() else 0


def same_bits(a, b):
    import torch

    return tuple(a.shape) == tuple(b.shape) and a.dtype == b.dtype and torch.equal(bits(a), bits(b))


def all_gather_cat(dist, t, dim):
    """Gather equal shards along ``dim`` (not the last) as raw bytes: exact for every dtype, and
    gloo has no bf16/int16 all-gather."""
    import torch

    assert dim < t.dim() - 1
    raw = t.contiguous().reshape(-1).view(torch.uint8).view(*t.shape[:-1], -1)
    parts = [torch.empty_like(raw) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, raw)
    whole = torch.cat(parts, dim)
    return whole.reshape(-1).view(t.dtype).view(*whole.shape[:-1], t.shape[-1])


def graph_replays(torch, step, inputs, refresh, n=2):
    """Capture ``step()`` in a CUDA graph on this rank's device, then ``n`` times: put new values
    into the captured inputs (``refresh``), replay, run eagerly, compare bit for bit."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        step()  # compile / warm up outside the graph
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    results = []
    for i in range(n):
        refresh(inputs, i)
        graph.replay()
        eager = step()
        torch.cuda.synchronize()
        results.append(all(same_bits(g, e) for g, e in zip(captured, eager)))
    return {"replays": n, "replay_equals_eager": results,
            "pool_device": torch.cuda.current_device()}


# ----------------------------------------------------------------------------------------------
# one rank


def run_rank(rank, cfg):
    t_start = time.time()
    ev = {"rank": rank, "pid": os.getpid(), "ppid": os.getppid(),
          "start_method": cfg["start_method"], "bootstrap": _bootstrap_info(),
          "flash_mla_in_sys_modules_at_start": "flash_mla" in sys.modules,
          "env_pythonpath": os.environ.get("PYTHONPATH", "")}
    import torch
    import torch.distributed as dist

    ws = cfg["world_size"]
    gpu = cfg["device"] == "cuda"
    ev["cuda_initialized_at_start"] = torch.cuda.is_initialized()
    if gpu:
        ev["contexts_before_set_device"] = _primary_contexts()
        torch.cuda.set_device(rank)  # before any CUDA work, as the frameworks do
        device = torch.device("cuda", rank)
    else:
        device = torch.device("cpu")
    from datetime import timedelta

    kw = {"device_id": device} if gpu else {}
    dist.init_process_group(cfg["backend"], init_method=cfg["init_method"], rank=rank,
                            world_size=ws, timeout=timedelta(seconds=cfg.get("timeout_s", 300)),
                            **kw)
    ev["cuda_initialized_after_init_process_group"] = torch.cuda.is_initialized()

    import deep_gemm
    import flash_mla

    ev["patched"] = {
        "flash_mla.flash_mla_with_kvcache":
            getattr(flash_mla.flash_mla_with_kvcache, "__sm12x_patch__", None),
        "flash_mla.get_mla_metadata": getattr(flash_mla.get_mla_metadata, "__sm12x_patch__", None),
        "deep_gemm.fp8_paged_mqa_logits":
            getattr(deep_gemm.fp8_paged_mqa_logits, "__sm12x_patch__", None),
        "deep_gemm.get_paged_mqa_logits_metadata":
            getattr(deep_gemm.get_paged_mqa_logits_metadata, "__sm12x_patch__", None),
    }
    ev["cuda_initialized_after_patching"] = torch.cuda.is_initialized()

    # ---- sparse MLA decode: heads sharded
    dcase = decode_case(cfg["decode"], device)
    h_q = dcase["q"].shape[2]
    hs = h_q // ws
    lo, hi = rank * hs, (rank + 1) * hs
    t0 = time.time()
    out, lse = run_decode(flash_mla, dcase, lo, hi)
    ev["decode_s"] = round(time.time() - t0, 3)
    ev["decode_shard"] = {"heads": [lo, hi], "out": list(out.shape), "lse": list(lse.shape)}
    from sm12x.kernels.sparse_mla.decode_plan import plan

    s = dcase["q"].shape
    xtopk = dcase["extra_indices"].shape[-1] if dcase.get("extra_indices") is not None else 0
    ev["decode_plan"] = {"shard": repr(plan(s[0], s[1], hs, dcase["indices"].shape[-1], xtopk, device)),
                         "full": repr(plan(s[0], s[1], h_q, dcase["indices"].shape[-1], xtopk, device))}

    # ---- indexer paged logits: requests sharded
    icase = indexer_case(cfg["indexer"], device)
    b = icase["q"].shape[0]
    bs = b // ws
    rlo, rhi = rank * bs, (rank + 1) * bs
    num_sms = cfg.get("num_sms", 188)
    ishard = indexer_shard(icase, rlo, rhi)
    t0 = time.time()
    logits = run_indexer(deep_gemm, icase, ishard, num_sms)
    ev["indexer_s"] = round(time.time() - t0, 3)
    ev["indexer_shard"] = {"requests": [rlo, rhi], "logits": list(logits.shape)}

    # ---- CUDA graphs per rank (GPU only)
    if gpu:
        dq = dcase["q"][:, :, lo:hi].contiguous()
        dmeta = flash_mla.get_mla_metadata()[0]
        dkw = decode_kwargs(dcase, lo, hi)

        def dstep():
            o, l = flash_mla.flash_mla_with_kvcache(dq, dcase["k_cache"], None, None, 512, dmeta,
                                                    **dkw)
            return o, l

        def drefresh(inputs, i):
            g = torch.Generator(device=device).manual_seed(100 + 10 * rank + i)
            inputs.copy_(torch.randn(inputs.shape, generator=g, device=device).clamp(-1, 1))

        ev["decode_graph"] = graph_replays(torch, dstep, dq, drefresh)

        iq = ishard["q"].clone()

        def istep():
            meta = deep_gemm.get_paged_mqa_logits_metadata(ishard["lens"], icase["block_kv"],
                                                           num_sms)
            return (deep_gemm.fp8_paged_mqa_logits(iq, icase["cache"], ishard["w"], ishard["lens"],
                                                   ishard["bt"], meta, icase["max_ctx"],
                                                   clean_logits=True),)

        def irefresh(inputs, i):
            g = torch.Generator(device=device).manual_seed(200 + 10 * rank + i)
            inputs.copy_(torch.randn(inputs.shape, generator=g, device=device)
                         .to(torch.float8_e4m3fn))

        ev["indexer_graph"] = graph_replays(torch, istep, iq, irefresh)

    # ---- gather shards
    full_out = all_gather_cat(dist, out, 2)
    full_lse = all_gather_cat(dist, lse, 1)
    full_logits = all_gather_cat(dist, logits, 0)

    # ---- evidence, then gather it (status touches no CUDA: asserted through the flags below)
    from sm12x.commands.status import status_data

    st = status_data()
    ev["status"] = {"patches": {p["name"]: [p["state"], p["reason"]] for p in st["patches"]},
                    "bootstrap": st["bootstrap"], "arch": st["arch"]["capability"],
                    "arch_source": st["arch"]["source"], "sm12x_patches": st["arch"]["sm12x_patches"]}
    ev["sys_modules_sitecustomize"] = _bootstrap_info()
    if gpu:
        torch.cuda.synchronize()
        ev["current_device"] = torch.cuda.current_device()
        ev["contexts_at_end"] = _primary_contexts()
        ev["allocated_on_other_devices"] = _allocated_elsewhere(torch, rank)
    ev["cuda_initialized_at_end"] = torch.cuda.is_initialized()
    ev["rank_s"] = round(time.time() - t_start, 3)
    gathered = [None] * ws
    dist.all_gather_object(gathered, ev)

    with open(os.path.join(cfg["out_dir"], f"rank{rank}.json"), "w") as f:
        json.dump(ev, f, indent=1, default=str)

    if rank == 0:
        summary = {"world_size": ws, "start_method": cfg["start_method"],
                   "backend": dist.get_backend(), "ranks": gathered,
                   "compare": compare(flash_mla, deep_gemm, dcase, icase, ws, num_sms,
                                      full_out, full_lse, full_logits)}
        with open(os.path.join(cfg["out_dir"], "summary.json"), "w") as f:
            json.dump(summary, f, indent=1, default=str)
    dist.barrier()
    dist.destroy_process_group()


def compare(flash_mla, deep_gemm, dcase, icase, ws, num_sms, g_out, g_lse, g_logits):
    """Rank 0: the gathered shards vs (a) the same kernel on the full inputs in one process,
    (b) every shard recomputed here (same launches as the ranks made), (c) the references."""
    import torch
    from sm12x.kernels.indexer.reference import ref_paged_mqa_logits
    from sm12x.kernels.sparse_mla.reference import ref_sparse_mla_decode
    from sm12x.kernels.common.tolerance import FLASHMLA_LSE, FLASHMLA_OUT, deepgemm_diff, flashmla_close

    res = {}
    h_q = dcase["q"].shape[2]
    hs = h_q // ws
    f_out, f_lse = run_decode(flash_mla, dcase, 0, h_q)
    res["decode_exact_vs_full"] = same_bits(g_out, f_out) and same_bits(g_lse, f_lse)
    # per rank's heads: a shard puts its heads at rows 0.. of the head tile, the full launch at
    # rows lo..; the rank-0 shard has the same rows in the same places
    res["decode_exact_vs_full_by_rank"] = [
        same_bits(g_out[:, :, r * hs:(r + 1) * hs], f_out[:, :, r * hs:(r + 1) * hs])
        and same_bits(g_lse[:, r * hs:(r + 1) * hs], f_lse[:, r * hs:(r + 1) * hs])
        for r in range(ws)]
    res["decode_ulps_vs_full"] = {"out": ulps(g_out, f_out), "lse": ulps(g_lse, f_lse)}
    v_out = flashmla_close(g_out.float().cpu(), f_out.float().cpu(), **FLASHMLA_OUT)
    v_lse = flashmla_close(g_lse.cpu(), f_lse.cpu(), **FLASHMLA_LSE)
    res["decode_vs_full"] = {"out": vars(v_out), "lse": vars(v_lse)}
    parts = [run_decode(flash_mla, dcase, r * hs, (r + 1) * hs) for r in range(ws)]
    res["decode_exact_vs_local_shards"] = (
        same_bits(g_out, torch.cat([p[0] for p in parts], 2))
        and same_bits(g_lse, torch.cat([p[1] for p in parts], 1)))
    ref_out, ref_lse = ref_sparse_mla_decode(
        dcase["q"], dcase["k_cache"], dcase["indices"], dcase.get("topk_length"),
        dcase.get("attn_sink"), dcase.get("extra_k_cache"), dcase.get("extra_indices"),
        dcase.get("extra_topk_length"), dcase["softmax_scale"])
    v_out = flashmla_close(g_out.float().cpu(), ref_out.float().cpu(), **FLASHMLA_OUT)
    v_lse = flashmla_close(g_lse.cpu(), ref_lse.cpu(), **FLASHMLA_LSE)
    res["decode_vs_reference"] = {"out": vars(v_out), "lse": vars(v_lse)}

    f_logits = run_indexer(deep_gemm, icase, indexer_shard(icase, 0, icase["q"].shape[0]),
                           num_sms)
    res["indexer_exact_vs_full"] = same_bits(g_logits, f_logits)
    bs = icase["q"].shape[0] // ws
    local = [run_indexer(deep_gemm, icase, indexer_shard(icase, r * bs, (r + 1) * bs), num_sms)
             for r in range(ws)]
    res["indexer_exact_vs_local_shards"] = same_bits(g_logits, torch.cat(local, 0))
    ref = ref_paged_mqa_logits(icase["q"], icase["cache"], icase["w"], icase["lens"], icase["bt"],
                               icase["max_ctx"], clean_logits=True)
    x = g_logits.float()
    res["indexer_vs_reference"] = {
        "masks_match": bool(((x == float("-inf")) == (ref == float("-inf"))).all()),
        "diff": deepgemm_diff(x.cpu(), ref.cpu()), "finite": int(x.isfinite().sum())}
    return res


# ----------------------------------------------------------------------------------------------
# launcher (the "engine process")


def launch(cfg_path):
    with open(cfg_path) as f:
        cfg = json.load(f)
    info = {"pid": os.getpid(), "bootstrap": _bootstrap_info()}
    if cfg.get("import_before_start"):
        # vLLM's engine core has the framework imported before it forks its workers: the patches
        # are applied here and the ranks inherit them.
        import deep_gemm  # noqa: F401
        import flash_mla  # noqa: F401

        info["patched_in_launcher"] = getattr(flash_mla.flash_mla_with_kvcache,
                                              "__sm12x_patch__", None)
    import torch
    import torch.multiprocessing as mp

    info["cuda_initialized_before_start"] = torch.cuda.is_initialized()
    info["modules_before_start"] = sorted(m for m in ("flash_mla", "deep_gemm", "sm12x.apply",
                                                      "triton") if m in sys.modules)
    with open(os.path.join(cfg["out_dir"], "launcher.json"), "w") as f:
        json.dump(info, f, indent=1)
    t0 = time.time()
    mp.start_processes(run_rank, args=(cfg,), nprocs=cfg["world_size"], join=True,
                       start_method=cfg["start_method"])
    print(json.dumps({"ranks_s": round(time.time() - t0, 2)}))


if __name__ == "__main__":
    launch(sys.argv[1])
