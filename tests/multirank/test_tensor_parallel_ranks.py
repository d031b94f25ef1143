"""Tensor-parallel ranks: sm12x is active and correct in every rank process the engines start.

A launcher interpreter (the "engine process", started with the sm12x folder on PYTHONPATH like a
container with the bundle mounted) starts N ranks with ``torch.multiprocessing`` ("spawn", as
SGLang does; "fork", vLLM's default). Each rank imports stand-in ``flash_mla`` / ``deep_gemm``
packages whose originals raise the SM12x errors, computes its shard of sparse MLA decode (heads)
and of the indexer paged logits (requests) through the patched entry points, and all-gathers; rank
0 compares with the same launches made in one process (bit for bit), with the unsharded kernel
(bit for bit for the indexer and rank 0's heads; within an ulp / FlashMLA's tolerance for heads
that move inside the head tile) and with the PyTorch references. Each rank's
``status_data()``, bootstrap and CUDA-initialisation evidence come back in ``rank<r>.json`` /
``summary.json``. The rank body is ``rank_worker.py`` next to this file.

CPU (always): gloo, Triton interpreter, small shapes. GPU (``-m gpu``, >= 2 devices): NCCL with the
PCIe-Blackwell settings, one device per rank, production-like shapes, a CUDA graph per rank.
"""
import json
import os
import textwrap

import pytest

from tests_support import REPO, run_py

HERE = os.path.dirname(os.path.abspath(__file__))

SPARSE_ERR = "Unsupported architecture for sparse decode fwd"
DG_ERR = "Unsupported architecture (attention.hpp:211)"
DG_NAMES = ("fp8_mqa_logits", "fp8_fp4_mqa_logits", "get_paged_mqa_logits_metadata",
            "fp8_paged_mqa_logits", "fp8_fp4_paged_mqa_logits")

# pip FlashMLA's layout (package re-exports the interface), original raising on the sparse path;
# DeepGEMM with indexer functions raising as on SM12x.
STANDINS = {
    "flash_mla/__init__.py":
        "from flash_mla.flash_mla_interface import flash_mla_with_kvcache, get_mla_metadata\n",
    "flash_mla/flash_mla_interface.py": textwrap.dedent(f"""
        def get_mla_metadata(*args, **kwargs):
            return "original-meta", None

        def flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, head_dim_v,
                                   tile_scheduler_metadata, num_splits=None, softmax_scale=None,
                                   causal=False, is_fp8_kvcache=False, indices=None,
                                   attn_sink=None, extra_k_cache=None,
                                   extra_indices_in_kvcache=None, topk_length=None,
                                   extra_topk_length=None):
            if indices is not None:
                raise RuntimeError({SPARSE_ERR!r})
            return "original-dense"
    """),
    "deep_gemm/__init__.py": "".join(
        f"def {n}(*args, **kwargs):\n    raise RuntimeError({DG_ERR!r})\n" for n in DG_NAMES),
}

FLASH_MLA_PATCHES = ("flash_mla.interface.decode", "flash_mla.decode",
                     "flash_mla.interface.metadata", "flash_mla.metadata")
DEEP_GEMM_PATCHES = tuple(f"deep_gemm.{n}" for n in DG_NAMES)

# CPU shapes (Triton interpreter): h_q 16 -> 8 / 4 heads per rank; 4 requests -> 2 / 1 per rank.
CPU_DECODE = dict(fmt="model1", b=2, s_q=1, h_q=16, topk=64, page=64, extra_topk=64, extra_page=2,
                  extra_topk_length=True, seed=0)
CPU_INDEXER = dict(b=4, next_n=1, h=16, d=64, block_kv=64, blocks=4, ctx=[17, 200, 64, 129],
                   seed=1)
# GPU shapes: DeepSeek-V4-Flash decode (h_q 64 -> 32 / 16 per rank, MTP s_q 2, topk 512 + SWA
# extra cache) and its indexer (64 heads x 128, MTP next_n 2, 8K contexts).
GPU_DECODE = dict(fmt="model1", b=8, s_q=2, h_q=64, topk=512, page=256, extra_topk=128,
                  extra_page=64, topk_length=True, extra_topk_length=True, seed=3)
GPU_INDEXER = dict(b=8, next_n=2, h=64, d=128, block_kv=64, blocks=128,
                   ctx=[8192, 7001, 4096, 1, 6500, 8000, 300, 5555], seed=4)

# NCCL on PCIe Blackwell (docker/compose.*.yaml, sm12x.commands.launch.recipe_env): P2P all-reduce
# deadlocks without NVLink, so go through host memory; single host, no InfiniBand. NVLink
# multicast (NVLS) stays off everywhere. Defaults only: a caller may set NCCL_P2P_DISABLE=0 on
# NVLink hosts. (vLLM/SGLang's own custom all-reduce, --disable-custom-all-reduce, is not used
# by torch.distributed collectives and so not exercised here.)
NCCL_ENV_DEFAULTS = {"NCCL_P2P_DISABLE": "1", "NCCL_IB_DISABLE": "1"}
NCCL_ENV_FORCED = {"NCCL_NVLS_ENABLE": "0"}


@pytest.fixture
def standins(tmp_path):
    root = tmp_path / "standins"
    for rel, body in STANDINS.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(body)
    return root


def launch_ranks(tmp_path, standins, *, world_size, start_method, device, backend, decode,
                 indexer, env=None, import_before_start=False, timeout=600):
    """Run the launcher in a fresh interpreter; returns (summary, {rank: evidence}, launcher)."""
    out = tmp_path / "out"
    out.mkdir()
    cfg = dict(world_size=world_size, start_method=start_method, device=device, backend=backend,
               init_method=f"file://{tmp_path / 'store'}", out_dir=str(out), decode=decode,
               indexer=indexer, import_before_start=import_before_start, timeout_s=timeout)
    cfg_path = tmp_path / "cfg.json"
    cfg_path.write_text(json.dumps(cfg))
    run_py(f"import rank_worker; rank_worker.launch({str(cfg_path)!r})",
           pythonpath=[REPO, standins, HERE], env=env, timeout=timeout)
    summary = json.loads((out / "summary.json").read_text())
    ranks = {r: json.loads((out / f"rank{r}.json").read_text()) for r in range(world_size)}
    launcher = json.loads((out / "launcher.json").read_text())
    return summary, ranks, launcher


def check_common(summary, ranks, launcher, world_size, start_method, gpu):
    """Assertions shared by the CPU and GPU runs."""
    assert summary["world_size"] == world_size and len(summary["ranks"]) == world_size
    # the launcher is the engine process: our sitecustomize ran in it
    assert launcher["bootstrap"]["active"], launcher
    assert launcher["bootstrap"]["sitecustomize"] == os.path.join(REPO, "sitecustomize.py")
    assert launcher["cuda_initialized_before_start"] is False
    pids = set()
    for r in range(world_size):
        ev = ranks[r]
        assert summary["ranks"][r]["rank"] == r  # gathered to rank 0 in rank order
        assert summary["ranks"][r]["pid"] == ev["pid"]
        pids.add(ev["pid"])
        assert ev["start_method"] == start_method
        if start_method == "fork":  # a forked rank is a child of the launcher
            assert ev["ppid"] == launcher["pid"], (r, ev["ppid"], launcher["pid"])
        # bootstrap: our sitecustomize in every rank (spawn: it ran at the child's start-up;
        # fork: inherited), the watcher on sys.meta_path, status agrees
        for key in ("bootstrap", "sys_modules_sitecustomize"):
            assert ev[key]["active"] and ev[key]["watcher"], (r, key, ev[key])
            assert ev[key]["sitecustomize"] == os.path.join(REPO, "sitecustomize.py"), (r, ev[key])
        st = ev["status"]
        assert st["bootstrap"]["active"] is True, (r, st["bootstrap"])
        assert st["sm12x_patches"] is True, (r, st)
        if gpu:  # real NVML probe in every rank (SM12X_FORCE=1 on a non-SM12x test GPU)
            assert st["arch_source"] == "nvml" and st["arch"] is not None, (r, st)
        else:
            assert st["arch_source"] == "env" and st["arch"] == [12, 0], (r, st)
        for name in FLASH_MLA_PATCHES + DEEP_GEMM_PATCHES:
            assert st["patches"][name][0] == "applied", (r, name, st["patches"][name])
        assert not [n for n, (s, _) in st["patches"].items() if s == "failed"], (r, st["patches"])
        assert all(v for v in ev["patched"].values()), (r, ev["patched"])
        # shard shapes
        h_q = (GPU_DECODE if gpu else CPU_DECODE)["h_q"]
        b = (GPU_INDEXER if gpu else CPU_INDEXER)["b"]
        assert ev["decode_shard"]["heads"] == [r * h_q // world_size, (r + 1) * h_q // world_size]
        assert ev["indexer_shard"]["requests"] == [r * b // world_size, (r + 1) * b // world_size]
        # CUDA: never initialised before the rank chose its device
        assert ev["cuda_initialized_at_start"] is False, r
    assert len(pids) == world_size  # really N processes

    cmp = summary["compare"]
    assert cmp["decode_exact_vs_local_shards"], cmp
    assert cmp["indexer_exact_vs_local_shards"], cmp
    # requests are independent rows of the indexer: sharding cannot change a bit
    assert cmp["indexer_exact_vs_full"], cmp
    ref = cmp["decode_vs_reference"]
    assert ref["out"]["ok"] and ref["lse"]["ok"], ref
    full = cmp["decode_vs_full"]  # gathered shards vs the unsharded kernel, FlashMLA's criterion
    assert full["out"]["ok"] and full["lse"]["ok"], full
    iref = cmp["indexer_vs_reference"]
    assert iref["masks_match"] and iref["diff"] < 1e-5 and iref["finite"] > 0, iref
    return cmp


# ----------------------------------------------------------------------------------------------
# CPU: gloo + Triton interpreter

# fork-4 also passes (~20 s more); left out to keep the module under ~2 minutes on 2 cores. Fork is
# safe here: the launcher forks before any torch thread pool or CUDA exists (asserted).
CPU_CASES = [
    pytest.param(2, "spawn", False, id="spawn-2"),
    pytest.param(4, "spawn", False, id="spawn-4"),
    pytest.param(2, "fork", False, id="fork-2"),
    # vLLM's engine core imports the framework before forking: patches applied in the parent
    pytest.param(2, "fork", True, id="fork-2-imported-before-fork"),
]


@pytest.mark.parametrize("world_size,start_method,import_before_start", CPU_CASES)
def test_cpu_ranks_gloo(tmp_path, standins, world_size, start_method, import_before_start):
    pytest.importorskip("torch")
    pytest.importorskip("triton")
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available in this torch build")
    # GPUs stay visible when there are any: then "CUDA never initialised" is a real check
    env = {"TRITON_INTERPRET": "1", "TRITON_DEFAULT_FP_FUSION": "1",
           "OMP_NUM_THREADS": "1"}  # N ranks on a small CPU machine
    summary, ranks, launcher = launch_ranks(
        tmp_path, standins, world_size=world_size, start_method=start_method, device="cpu",
        backend="gloo", decode=CPU_DECODE, indexer=CPU_INDEXER, env=env,
        import_before_start=import_before_start, timeout=300)
    assert summary["backend"] == "gloo"
    cmp = check_common(summary, ranks, launcher, world_size, start_method, gpu=False)
    if import_before_start:
        assert launcher["patched_in_launcher"] in FLASH_MLA_PATCHES, launcher
        assert all(ranks[r]["flash_mla_in_sys_modules_at_start"] for r in ranks)
    else:
        # nothing heavy in the engine process before the ranks start
        assert "flash_mla" not in launcher["modules_before_start"]
        assert "sm12x.apply" not in launcher["modules_before_start"]
        assert not any(ranks[r]["flash_mla_in_sys_modules_at_start"] for r in ranks)
    # on the CPU every shard runs the same launch plan as the full problem (BLOCK_H 16 covers
    # 16, 8 and 4 heads; same split count). Rank 0's heads sit at the same tile rows in both
    # launches: bit-identical. Other ranks' heads move to rows 0.. of the tile, and the
    # interpreter's dot (NumPy/BLAS) may round a row differently by its position: at most an ulp.
    for r in ranks:
        assert ranks[r]["decode_plan"]["shard"] == ranks[r]["decode_plan"]["full"]
    assert cmp["decode_exact_vs_full_by_rank"][0], cmp
    assert cmp["decode_ulps_vs_full"]["out"] <= 1 and cmp["decode_ulps_vs_full"]["lse"] <= 1, cmp
    for r, ev in ranks.items():
        for key in ("cuda_initialized_at_start", "cuda_initialized_after_init_process_group",
                    "cuda_initialized_after_patching", "cuda_initialized_at_end"):
            assert ev[key] is False, (r, key)


# ----------------------------------------------------------------------------------------------
# GPU: NCCL, one device per rank, production-like shapes, CUDA graphs


def _cuda_devices():
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


GPU_CASES = [
    pytest.param(2, "spawn", id="spawn-2"),
    pytest.param(2, "fork", id="fork-2"),
    pytest.param(4, "spawn", id="spawn-4"),
]


@pytest.mark.gpu
@pytest.mark.parametrize("world_size,start_method", GPU_CASES)
def test_gpu_ranks_nccl(tmp_path, standins, world_size, start_method):
    pytest.importorskip("triton")
    n = _cuda_devices()
    if n < world_size:
        pytest.skip(f"needs {world_size} CUDA devices for {world_size} ranks, found {n}")
    import torch.distributed as dist

    if not dist.is_nccl_available():
        pytest.skip("torch.distributed was built without NCCL")
    env = {k: os.environ.get(k, v) for k, v in NCCL_ENV_DEFAULTS.items()}
    env.update(NCCL_ENV_FORCED)
    # each rank asks NVML for the arch itself (no SM12X_ARCH pretence); SM12X_FORCE=1 lets a
    # non-SM12x test GPU (H200) take the SM12x patches, and is a no-op on SM12x
    env.update({"TRITON_INTERPRET": None, "SM12X_ARCH": None, "SM12X_FORCE": "1"})
    summary, ranks, launcher = launch_ranks(
        tmp_path, standins, world_size=world_size, start_method=start_method, device="cuda",
        backend="nccl", decode=GPU_DECODE, indexer=GPU_INDEXER, env=env, timeout=600)
    assert summary["backend"] == "nccl"
    cmp = check_common(summary, ranks, launcher, world_size, start_method, gpu=True)
    for r, ev in ranks.items():
        # the rank's device, and only it
        assert ev["current_device"] == r, (r, ev["current_device"])
        before, after = ev["contexts_before_set_device"], ev["contexts_at_end"]
        if before is not None and after is not None:  # libcuda readable (always on a GPU host)
            assert not any(before.values()), (r, "context before set_device", before)
            active = sorted(int(d) for d, on in after.items() if on)
            assert active == [r], (r, "primary contexts active on", active)
        assert all(v == 0 for v in ev["allocated_on_other_devices"].values()), (r, ev)
        # a graph per rank, captured on the rank's device, replays = eager bit for bit
        for key in ("decode_graph", "indexer_graph"):
            g = ev[key]
            assert g["pool_device"] == r and all(g["replay_equals_eager"]), (r, key, g)
    # sharded heads may pick another BLOCK_H than the full problem (64 -> 32 heads per rank on
    # sm_120): rank 0's heads are bit-identical only where the launch plans agree; FlashMLA's
    # tolerance vs the unsharded kernel always (check_common)
    if all(ranks[r]["decode_plan"]["shard"] == ranks[r]["decode_plan"]["full"] for r in ranks):
        assert cmp["decode_exact_vs_full_by_rank"][0], cmp
