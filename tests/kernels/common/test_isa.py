"""The ISA report: SASS read for matrix instructions, loops and the full-rate verdict.

The planted kernels are compiled for sm_120 here (no GPU): an FP8 dot through plain ``tl.dot``
(plain QMMA with FP32 accumulation, half rate) and FP8 widened to bf16 before ``tl.dot`` (HMMA
after in-register dequantisation) must fail the report; the same product through ``tl.dot_scaled``
with unit scales (block-scaled QMMA.SF) must pass it.
"""
import pytest

from sm12x.kernels.common import isa

SASS = """
        /*0000*/                   S2R R0, SR_TID.X ;
        /*0010*/                   MOV R2, RZ ;
        /*0020*/                   LDG.E.128 R4, desc[UR4][R2.64] ;
        /*0030*/                   F2FP.F16.E4M3.UNPACK_B R8, R4 ;
        /*0040*/                   HMMA.16816.F32.BF16 R12, R8, R10, R12 ;
        /*0050*/                   QMMA.16832.F32.E4M3.E4M3 R16, R8, R10, R16 ;
        /*0060*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;
        /*0070*/                   ISETP.GE.AND P0, PT, R0, 0x10, PT ;
        /*0080*/              @!P0 BRA 0x20 ;
        /*0090*/                   QMMA.SF.16832.F32.E4M3.E4M3.E8 R20, R8, R10, R20, R1, R2, URZ ;
        /*00a0*/                   EXIT ;
        /*00b0*/                   BRA 0xb0;
"""


def test_analyse_finds_the_loop_and_its_matrix_instructions():
    s = isa.analyse(SASS)
    assert s.mma == {"HMMA.16816.F32.BF16": 1, "QMMA.16832.F32.E4M3.E4M3": 1,
                     "QMMA.SF.16832.F32.E4M3.E4M3.E8": 1}
    assert s.loop_mma == {"HMMA.16816.F32.BF16": 1, "QMMA.16832.F32.E4M3.E4M3": 1}  # not the one after it
    assert s.loop_instructions == 7 and s.loop_widen == 1
    assert s.loop_ratio == pytest.approx(2.5)


def test_stream_loops_of_a_kernel_without_matrix_instructions():
    """Outermost loops that load from global memory, in address order; a loop without a load (a
    padding store) and a loop nested in another are not among them; none where there is an MMA."""
    sass = """
        /*0000*/                   MOV R2, RZ ;
        /*0010*/                   LDG.E R4, desc[UR4][R2.64] ;
        /*0020*/                   IADD3 R2, R2, 0x4, RZ ;
        /*0030*/                   LDG.E R5, desc[UR4][R2.64] ;
        /*0040*/                   ISETP.GE.AND P1, PT, R2, 0x8, PT ;
        /*0050*/              @!P1 BRA 0x30 ;
        /*0060*/                   ISETP.GE.AND P0, PT, R2, 0x10, PT ;
        /*0070*/              @!P0 BRA 0x10 ;
        /*0080*/                   STG.E desc[UR4][R2.64], R4 ;
        /*0090*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;
        /*00a0*/              @!P0 BRA 0x80 ;
        /*00b0*/                   LDG.E R6, desc[UR4][R2.64] ;
        /*00c0*/                   ISETP.GE.AND P0, PT, R2, 0x30, PT ;
        /*00d0*/              @!P0 BRA 0xb0 ;
        /*00e0*/                   EXIT ;
        /*00f0*/                   BRA 0xf0;
"""
    s = isa.analyse(sass)
    assert s.mma == {} and s.stream_loops == [7, 3] and s.barriers == 1
    assert isa.analyse(SASS).stream_loops == []


def test_rate_classes_and_flops():
    assert isa.mma_kind("QMMA.SF.16832.F32.E4M3.E4M3.E8") == isa.FULL_RATE
    assert isa.mma_kind("OMMA.SF.16864.F32.E2M1.E2M1.E8") == isa.FULL_RATE
    assert isa.mma_kind("QMMA.16832.F32.E4M3.E4M3") == isa.REDUCED_FP8
    assert isa.mma_kind("HMMA.16816.F32.BF16") == isa.BF16
    assert isa.mma_kind("HMMA.1688.F32.TF32") == isa.TF32
    assert isa.mma_kind("QGMMA.64x128x32.F32.E4M3.E4M3") == isa.HOPPER
    assert isa.mma_flops("QMMA.16832.F32.E4M3.E4M3") == 2 * 16 * 8 * 32
    assert isa.mma_flops("HMMA.16816.F32.BF16") == 2 * 16 * 8 * 16
    assert isa.mma_flops("OMMA.SF.16864.F32.E2M1.E2M1.E8") == 2 * 16 * 8 * 64
    assert isa.mma_flops("HGMMA.64x128x16.F32.BF16") == 2 * 64 * 128 * 16 // 4


def test_verdict_fails_reduced_rate_and_honours_the_allow_list():
    s = isa.analyse(SASS)
    verdict, why = isa.verdict("k", "c", "sm_120", s, "3.9.0", allow=())
    assert verdict == "REDUCED" and "plain FP8 QMMA" in why and "widened" in why
    allow = (isa.Allowed("k", "*", ("sm_120",), ("3.9.*",), "a documented reason"),)
    assert isa.verdict("k", "c", "sm_120", s, "3.9.0", allow=allow)[0] == "allowed"
    assert isa.verdict("k", "c", "sm_120", s, "3.8.0", allow=allow)[0] == "REDUCED"
    assert isa.verdict("k", "c", "sm_90", s, "3.9.0", allow=())[0] == "not judged"


def test_a_conditional_uniform_branch_keeps_the_loop_body_whole():
    # ``BRA.U UP0, target`` is conditional: the code after it is reachable, the loop is not cut there
    sass = """
        /*0000*/                   MOV R1, RZ ;
        /*0010*/                   HMMA.16816.F32.BF16 R4, R8, R10, R4 ;
        /*0020*/                   BRA.U UP0, 0x10 ;
        /*0030*/                   HMMA.16816.F32.BF16 R4, R8, R10, R4 ;
        /*0040*/              @P0 BRA 0x10 ;
        /*0050*/                   EXIT ;
"""
    s = isa.analyse(sass)
    assert s.loop_mma == {"HMMA.16816.F32.BF16": 2} and s.inner and s.inner[0]["instructions"] == 2


def _planted():
    import triton
    import triton.language as tl

    @triton.jit
    def plain_fp8(a_ptr, b_ptr, c_ptr, K, BLOCK: tl.constexpr):
        offs = tl.arange(0, BLOCK)
        acc = tl.zeros((BLOCK, BLOCK), tl.float32)
        for k in range(0, K, BLOCK):
            a = tl.load(a_ptr + offs[:, None] * K + k + offs[None, :])
            b = tl.load(b_ptr + offs[:, None] * K + k + offs[None, :])
            acc = tl.dot(a, tl.trans(b), acc)
        tl.store(c_ptr + offs[:, None] * BLOCK + offs[None, :], acc)

    @triton.jit
    def widened_fp8(a_ptr, b_ptr, c_ptr, K, BLOCK: tl.constexpr):
        offs = tl.arange(0, BLOCK)
        acc = tl.zeros((BLOCK, BLOCK), tl.float32)
        for k in range(0, K, BLOCK):
            a = tl.load(a_ptr + offs[:, None] * K + k + offs[None, :]).to(tl.bfloat16)
            b = tl.load(b_ptr + offs[:, None] * K + k + offs[None, :]).to(tl.bfloat16)
            acc = tl.dot(a, tl.trans(b), acc)
        tl.store(c_ptr + offs[:, None] * BLOCK + offs[None, :], acc)

    @triton.jit
    def scaled_fp8(a_ptr, b_ptr, c_ptr, K, BLOCK: tl.constexpr):
        offs = tl.arange(0, BLOCK)
        ones = tl.full((BLOCK, BLOCK // 32), 127, tl.uint8)  # UE8M0 127 = 1.0: the same product
        acc = tl.zeros((BLOCK, BLOCK), tl.float32)
        for k in range(0, K, BLOCK):
            a = tl.load(a_ptr + offs[:, None] * K + k + offs[None, :])
            b = tl.load(b_ptr + offs[:, None] * K + k + offs[None, :])
            acc = tl.dot_scaled(a, ones, "e4m3", tl.trans(b), ones, "e4m3", acc)
        tl.store(c_ptr + offs[:, None] * BLOCK + offs[None, :], acc)

    return plain_fp8, widened_fp8, scaled_fp8


def _judge(fn):
    from sm12x.kernels.common.compile_check import compile_kernel
    from sm12x.kernels.common.isa_report import judge

    sig = {"a_ptr": "*fp8e4nv", "b_ptr": "*fp8e4nv", "c_ptr": "*fp32", "K": "i32", "BLOCK": "constexpr"}
    report = compile_kernel(fn, sig, {"BLOCK": 64}, target="sm_120", num_warps=4, num_stages=2,
                            config_name="planted")
    return judge("planted", [report])[0]


@pytest.mark.parametrize("which, verdict", [(0, "REDUCED"), (1, "REDUCED"), (2, "ok")])
def test_planted_kernels_compiled_for_sm120(which, verdict, monkeypatch):
    # compiling needs the real compiler, not the interpreter the CPU tests run under
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    import triton.knobs

    if getattr(triton.knobs.runtime, "interpret", False):
        monkeypatch.setattr(triton.knobs.runtime, "interpret", False)
    row = _judge(_planted()[which])
    assert row.verdict == verdict, (row.verdict, row.why, row.loop_mma)
    if verdict == "ok":
        assert row.kinds == isa.FULL_RATE
