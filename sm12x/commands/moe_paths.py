"""What serves DeepSeek-V4's MoE experts on SM12x, per framework release: the MoE rows of
``sm12x status``.

Each path names the experts, what runs them on SM12x, and the sm12x records it takes (none: the
framework's own SM120 kernels). A path whose records do not all apply (or would apply) says what
runs instead and why. Facts read in the releases' wheels; the records' modules
(:mod:`sm12x.patches.deep_gemm_moe`, :mod:`sm12x.patches.sglang_moe`) give the sources.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MoePath:
    """One statement of what serves some experts on SM12x for a release range of a framework
    (or of DeepGEMM), and the sm12x records it rests on."""

    framework: str  # key of sm12x.platform.DISTRIBUTIONS
    versions: str  # release range the statement was checked for
    experts: str  # which experts, of which checkpoints
    serves: str  # what runs them on SM12x
    records: tuple = ()  # sm12x records the path takes, all applied; () = the framework's own
    otherwise: str = ""  # what runs when one of the records does not apply


_VLLM_FP4 = ("vllm.third_party.deep_gemm.m_grouped_fp8_fp4_gemm_nt_contiguous",
             "vllm.fused_moe.DeepGemmFP4Experts._supports_current_device")
_SGL_DG = ("deep_gemm.m_grouped_fp8_gemm_nt_contiguous", "deep_gemm.m_grouped_fp8_fp4_gemm_nt_contiguous",
           "deep_gemm.fp8_m_grouped_gemm_nt_masked", "deep_gemm.m_grouped_fp8_fp4_gemm_nt_masked")
_TRTLLM_FAILS = "FlashInfer's TRT-LLM MXFP4 MoE, SM100-only: fails on SM12x"

PATHS = (
    MoePath("vllm", ">=0.22.1,<0.24", "MXFP4 routed experts",
            "DeepGEMM MXFP4 experts (FP8 x MXFP4, W4A8) on sm12x's grouped GEMM", _VLLM_FP4,
            otherwise="Marlin W4A16 (vLLM's own choice on SM12x)"),
    MoePath("vllm", ">=0.24.0,<0.25", "MXFP4 routed experts",
            "Marlin W4A16: sm12x's gate record turns vLLM's DeepGEMM off on SM12x, as 0.23.0 has it",
            ("vllm.platforms.cuda.support_deep_gemm",),
            otherwise="the vendored DeepGEMM, which has no SM120 kernels: fails on SM12x (FP8 block linears "
                      "stop at weight loading first, vllm #47436); VLLM_USE_DEEP_GEMM=0 gives Marlin"),
    MoePath("vllm", ">=0.25.0,<0.35", "MXFP4 routed experts",
            "DeepGEMM MXFP4 experts on the vendored DeepGEMM's own SM120 grouped kernels (vLLM's own)"),
    MoePath("sglang", ">=0.5.15,<0.5.16", "MXFP4 experts of FP8 checkpoints (target and MTP draft)",
            "Marlin W4A16 (SGLang's own SM120 choice for auto); --moe-runner-backend flashinfer_mxfp4 "
            "reaches Marlin too", ("sglang.moe.Fp8Config.get_quant_method",),
            otherwise="Marlin for auto; flashinfer_mxfp4 gets " + _TRTLLM_FAILS),
    MoePath("sglang", ">=0.5.16,<0.5.24", "MXFP4 experts of FP8 checkpoints (target and MTP draft)",
            "FlashInfer CUTLASS MXFP8 x MXFP4 (SGLang's own SM120 choice)"),
    MoePath("sglang", ">=0.5.15,<0.5.24", "MTP draft's MXFP4 experts of NVFP4 checkpoints",
            "SGLang's MXFP4 Marlin, or the --speculative-moe-runner-backend's method when it has SM12x "
            "kernels", ("sglang.moe.HybridFp8NvFp4Config.get_quant_method",), otherwise=_TRTLLM_FAILS),
    MoePath("sglang", ">=0.5.15,<0.5.17", "NVFP4 routed experts (target)",
            "nothing correct: auto picks flashinfer_trtllm_routed (SM100-only), flashinfer_cutlass runs "
            "without DeepSeek-V4's SwiGLU clamp, marlin scales the routed output twice; sm12x has no "
            "NVFP4 grouped GEMM"),
    MoePath("sglang", ">=0.5.17,<0.5.24", "NVFP4 routed experts (target)",
            "SGLang's NVFP4 Marlin (W4A16, with the SwiGLU clamp): a TRT-LLM runner (auto's "
            "flashinfer_trtllm_routed) becomes marlin", ("sglang.moe.runner_choice",),
            otherwise="auto picks flashinfer_trtllm_routed (SM100-only: fails); pass --moe-runner-backend "
                      "marlin"),
    MoePath("sglang", ">=0.5.15,<0.5.20", "DeepGEMM runner (--moe-runner-backend deep_gemm, DeepEP)",
            "unavailable: SGLang runs no DeepGEMM on SM12x in this release (12.1: with sm12x's gb10 record)"),
    MoePath("sglang", ">=0.5.20,<0.5.24", "DeepGEMM runner (--moe-runner-backend deep_gemm, DeepEP)",
            "sgl-deep-gemm's own SM120 grouped kernels (SGLang turns DeepGEMM on for SM12x only when the "
            "installed DeepGEMM has its SM120 APIs; unavailable otherwise)"),
    MoePath("deep_gemm", ">=0.1.4,<0.1.5", "grouped GEMMs of a caller that runs this DeepGEMM",
            "sm12x's grouped FP8 and FP8 x MXFP4 GEMMs", _SGL_DG,
            otherwise="sgl-deep-gemm's own, which has no SM120 kernels: fails on SM12x"),
)

_SERVING = ("applied", "would-apply")


def _state_serves(row: dict) -> bool:
    return row.get("state") in _SERVING


def path_rows(paths, versions: dict, patch_rows: list, part_key: str = "experts",
              serves_row=_state_serves) -> list:
    """Rows of ``paths`` (MoePath-shaped statements) for the installed releases: ``{"framework",
    "version", part_key, "serves", "via"}``; ``via`` names the records taken, or why one does not
    serve ("" for a path that takes none). ``serves_row(patch row)``: whether a record serves."""
    from sm12x import platform

    states = {r["name"]: r for r in patch_rows}
    rows = []
    for path in paths:
        have = versions.get(path.framework)
        if have is None or not platform.in_range(have, path.versions):
            continue
        blocked = [states.get(n, {"name": n, "state": "not registered"}) for n in path.records
                   if not serves_row(states.get(n, {}))]
        if not path.records:
            serves, via = path.serves, ""
        elif not blocked:
            serves, via = path.serves, "sm12x records: " + ", ".join(path.records)
        else:
            first = blocked[0]
            serves = path.otherwise
            via = f"{first['name']} {first['state']}" + (f" ({first['reason']})" if first.get("reason") else "")
        rows.append({"framework": path.framework, "version": have, part_key: path.experts,
                     "serves": serves, "via": via})
    return rows


def moe_rows(versions: dict, patch_rows: list) -> list:
    """The MoE paths of the installed releases (``path_rows`` with the ``experts`` key)."""
    return path_rows(PATHS, versions, patch_rows)
