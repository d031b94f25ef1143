"""Probe: the MODEL1 FP8 -> bf16 dequantisation of the sparse MLA decode, four ways (H200,
SM12X_FORCE=1). Checks the inline-PTX conversion against PyTorch on every e4m3 byte and a range
of scales, then times each variant of the kernel (the module's source with the dequantisation
replaced, loaded as a separate module) on the benchmark's cases, interleaved, and checks each
against the reference at FlashMLA's tolerances.

    python scripts/probes/dequant_probe.py [--compile sm_120]   # --compile: resource use only
"""
import os
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path[:0] = [ROOT, os.path.join(ROOT, "scripts")]

import torch
import triton
import triton.language as tl

from sm12x.kernels.sparse_mla import decode as base
from source_variant import edited_module

BASE = """        e = (scale.to(tl.int32) << 23).to(tl.float32, bitcast=True)   # UE8M0 -> 2^(e - 127)
        nope = raw.to(tl.float8e4nv, bitcast=True).to(tl.float32) * e[:, :, None]
        is_nope = (tl.arange(0, 8) < 7)[None, :, None]
        return tl.reshape(tl.where(is_nope, nope.to(tl.bfloat16), rope), (BLOCK_N, 512))"""
POW2_BF16 = "        e = (scale.to(tl.int16) << 7).to(tl.bfloat16, bitcast=True)   # 2^(e - 127)\n"
SELECT = """
        is_nope = (tl.arange(0, 8) < 7)[None, :, None]
        return tl.reshape(tl.where(is_nope, nope, rope), (BLOCK_N, 512))"""
# FP8 e4m3 bytes x bf16 powers of two + bf16, four values per call: one e4m3x2 -> f16x2
# conversion per pair; each f16 becomes the bf16 of value * 2^-112 by moving its bits (every
# e4m3 value is a normal f16, zero stays zero); a bf16x2 multiply by 2^112 and a bf16x2
# multiply-add by the scale finish it.
HELPER = '''@triton.jit
def _e4m3_times_pow2_plus(raw, scale, add):
    return tl.inline_asm_elementwise(
        """
        {
        .reg .b16 lo, hi;
        .reg .b32 h0, h1, m0, m1, c;
        mov.b32 {lo, hi}, $2;
        cvt.rn.f16x2.e4m3x2 h0, lo;
        cvt.rn.f16x2.e4m3x2 h1, hi;
        shr.b32 m0, h0, 3;
        shr.b32 m1, h1, 3;
        and.b32 m0, m0, 0x0FFF0FFF;
        and.b32 m1, m1, 0x0FFF0FFF;
        and.b32 h0, h0, 0x80008000;
        and.b32 h1, h1, 0x80008000;
        or.b32 m0, m0, h0;
        or.b32 m1, m1, h1;
        mov.b32 c, 0x77807780;
        mul.rn.bf16x2 m0, m0, c;
        mul.rn.bf16x2 m1, m1, c;
        fma.rn.bf16x2 $0, m0, $3, $5;
        fma.rn.bf16x2 $1, m1, $4, $6;
        }
        """, "=r,=r,r,r,r,r,r", [raw, scale, add], dtype=tl.bfloat16, is_pure=True, pack=4)


'''
VARIANTS = {
    "fp32 route (main)": BASE,
    "PTX, multiply + select": POW2_BF16 + """        e = tl.broadcast_to(e[:, :, None], raw.shape)
        nope = _e4m3_times_pow2_plus(raw, e, tl.zeros(raw.shape, tl.bfloat16))""" + SELECT,
    "PTX, multiply-add of RoPE": POW2_BF16 + """        e = tl.broadcast_to(e[:, :, None], raw.shape)
        return tl.reshape(_e4m3_times_pow2_plus(raw, e, rope), (BLOCK_N, 512))""",
    "Triton bf16 multiply": POW2_BF16
    + "        nope = raw.to(tl.float8e4nv, bitcast=True).to(tl.bfloat16) * e[:, :, None]" + SELECT,
}
CASES = [("b2 h64 128+512p64", dict(b=2, h_q=64, extra_topk=512, extra_page=64)),
         ("b64 h64 128+512p64", dict(b=64, h_q=64, extra_topk=512, extra_page=64)),
         ("b256 h64 128+512p64", dict(b=256, h_q=64, extra_topk=512, extra_page=64)),
         ("b64 h128 128+1024p64", dict(b=64, h_q=128, extra_topk=1024, extra_page=64)),
         ("b256 h128 128+1024p64", dict(b=256, h_q=128, extra_topk=1024, extra_page=64)),
         ("b74 h64 128+1024p2 len", dict(b=74, h_q=64, extra_topk=1024, extra_page=2,
                                         extra_topk_length=True)),
         ("b1 s1 h16 128+512p64", dict(b=1, s_q=1, h_q=16, extra_topk=512, extra_page=64))]


def load_variant(name, tmp):
    edits = [(BASE, VARIANTS[name]),
             ("@triton.jit\ndef _dequant_tile", HELPER + "@triton.jit\ndef _dequant_tile")]
    return edited_module(open(base.__file__).read(), edits, f"dq_{abs(hash(name))}", tmp)


helper_fn = None  # the variant's conversion, set by exhaustive_check before the first launch


@triton.jit
def _convert_kernel(raw_ptr, e_ptr, add_ptr, out_ptr, N: tl.constexpr):
    i = tl.arange(0, N)
    e = (tl.load(e_ptr + i).to(tl.int16) << 7).to(tl.bfloat16, bitcast=True)
    tl.store(out_ptr + i, helper_fn(tl.load(raw_ptr + i), e, tl.load(add_ptr + i)))


def exhaustive_check(helper):
    """Every e4m3 byte x scale exponents 1..254, and RoPE values added to zero bytes."""
    global helper_fn
    helper_fn = helper
    kernel = _convert_kernel
    exps = torch.arange(1, 255, dtype=torch.int32)
    raw = torch.arange(256, dtype=torch.int32).repeat(len(exps)).to(torch.uint8)
    e = exps.repeat_interleave(256).to(torch.uint8)
    n = triton.next_power_of_2(raw.numel())
    raw = torch.nn.functional.pad(raw, (0, n - raw.numel())).cuda()
    e = torch.nn.functional.pad(e, (0, n - e.numel()), value=127).cuda()
    add = torch.zeros(n, dtype=torch.bfloat16, device="cuda")
    out = torch.empty(n, dtype=torch.bfloat16, device="cuda")
    kernel[(1,)](raw, e, add, out, N=n, num_warps=8)
    ref = (raw.view(torch.float8_e4m3fn).float() * torch.exp2(e.float() - 127)).to(torch.bfloat16)
    nan_byte = (raw & 0x7F) == 0x7F
    same = (out.float() == ref.float()) | (out.isnan() & ref.isnan())  # -0 comes out as +0
    bad = (~same & ~nan_byte).sum().item()
    print(f"exhaustive: {n - nan_byte.sum().item()} byte x scale pairs, {bad} differ from "
          f"PyTorch; NaN bytes give {sorted(set(out[nan_byte].float().tolist()))[:4]}")
    rope = torch.randn(n, device="cuda").to(torch.bfloat16)
    kernel[(1,)](torch.zeros_like(raw), e, rope, out, N=n, num_warps=8)
    differ = (out.view(torch.int16) != rope.view(torch.int16)).sum().item()
    print(f"zero byte + RoPE: {differ} differ")


def compile_only(target):
    from sm12x.kernels.common.compile_check import compile_kernel

    with tempfile.TemporaryDirectory() as tmp:
        for name in VARIANTS:
            mod = load_variant(name, tmp)
            for cfg in mod.CONFIGS[target]["model1"]:
                sig, const = mod._split_signature(cfg, True, 256, 64, False, True)
                r = compile_kernel(mod._sparse_mla_split_kernel, sig, const, target=target,
                                   num_warps=cfg["num_warps"], num_stages=1)
                print(f"{name:28} H{cfg['BLOCK_H']} N{cfg['BLOCK_N']}: regs {r.registers} "
                      f"spill {r.spill_bytes} smem {r.shared_bytes}", flush=True)


def main():
    if "--compile" in sys.argv:
        return compile_only(sys.argv[sys.argv.index("--compile") + 1])
    from gpu_timing import kernel_span_us
    from sm12x.kernels.sparse_mla.reference import make_case, ref_sparse_mla_decode
    from sm12x.kernels.common.tolerance import failures, flashmla_decode_close

    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, "
          f"triton {triton.__version__}")
    cases = [(label, make_case(device="cuda", sink=True, **{"s_q": 2, **kw}))
             for label, kw in CASES]
    with tempfile.TemporaryDirectory() as tmp:
        mods = {name: load_variant(name, tmp) for name in VARIANTS}
        exhaustive_check(mods["PTX, multiply-add of RoPE"]._e4m3_times_pow2_plus)
        print("\n| case | " + " | ".join(mods) + " |\n|---|" + "---:|" * len(mods))
        for label, case in cases:
            row = []
            for name, mod in mods.items():
                row.append(min(kernel_span_us(lambda: mod.sparse_mla_decode(**case))
                               for _ in range(2)))
            print(f"| {label} | " + " | ".join(f"{t:.1f}" for t in row) + " |", flush=True)
        print()
        for name, mod in mods.items():
            for arch, picked in (("default", [0, 1, 5, 6]), ("sm_120", [1, 5])):
                if arch != "default":
                    os.environ["SM12X_KERNEL_CONFIGS"] = arch
                for i in picked:
                    label, case = cases[i]
                    bad = failures(flashmla_decode_close(mod.sparse_mla_decode(**case),
                                                         ref_sparse_mla_decode(**case)))
                    print(f"{name} {arch} {label}: {bad or 'matches the reference'}", flush=True)
                os.environ.pop("SM12X_KERNEL_CONFIGS", None)


if __name__ == "__main__":
    main()
