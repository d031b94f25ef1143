"""The runtime correctness guard (sm12x.guard): a planted wrong kernel is refused and the upstream
original serves (or one line is raised), verdicts are cached per user outside the mount,
SM12X_VERIFY, capture, known-bad combinations, the RNG state, nothing at import.

The CPU twins run the check under the Triton interpreter (the guard's device is forced to "cpu");
the ``gpu`` twin runs the same on a CUDA GPU with SM12X_FORCE=1."""
import json
import os
import sys
import types

import pytest
import torch

from tests_support import REPO, run_py

from sm12x import apply, guard
from sm12x.patches import Patch, all_patches

OP = "tf32_hc_prenorm_gemm"  # the cheapest check under the interpreter (~0.3 s)
UPSTREAM_MARK = 7.0


def upstream_tf32_hc_prenorm_gemm(a, b, d, sqr_sum, num_splits=None):
    """A stand-in for DeepGEMM's function: right math, and a mark that says it served."""
    d.copy_(a.float() @ b.float().t())
    sqr_sum.fill_(UPSTREAM_MARK)


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    """A clean guard (no verdicts in the process), its cache in tmp_path, an H100 under
    SM12X_FORCE (upstream runs there) unless a test says otherwise."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("SM12X_ARCH", "9.0")
    monkeypatch.setenv("SM12X_FORCE", "1")
    monkeypatch.delenv("SM12X_VERIFY", raising=False)
    monkeypatch.setattr(guard, "PROCESS_VERDICTS", {})
    monkeypatch.setattr(guard, "_ROUTES", {})
    if os.environ.get("SM12X_TEST_DEVICE", "cpu") == "cpu":
        monkeypatch.setattr(guard, "_call_device", lambda args, kwargs: "cpu")
    return tmp_path


def _install(name):
    """A stand-in DeepGEMM module with the upstream function, patched by a record that runs
    sm12x's front end; returns the module."""
    from sm12x.frontends.deep_gemm.gemm_wrappers import FACTORIES

    module = types.ModuleType(f"guard_standin_{name}")
    module.tf32_hc_prenorm_gemm = upstream_tf32_hc_prenorm_gemm
    sys.modules[module.__name__] = module
    patch = Patch(name=f"test.guard.{name}", target=f"{module.__name__}:tf32_hc_prenorm_gemm",
                  make=FACTORIES["tf32_hc_prenorm_gemm"], why="test", upstream="test", library="*",
                  versions="*", versions_note="test stand-in", retire_when="test stand-in")
    assert apply.apply_patch(patch, module) == "applied", apply.OUTCOMES[patch.name]
    return module


def _call(module, device):
    a = torch.randn(5, 512, device=device).bfloat16()
    b = torch.randn(24, 512, device=device) / 512 ** 0.5
    d, sq = torch.empty(5, 24, device=device), torch.empty(5, device=device)
    module.tf32_hc_prenorm_gemm(a, b, d, sq)
    return d, sq


def _plant_wrong_kernel(monkeypatch):
    from sm12x.kernels.gemm import hc_prenorm_gemm as kernel

    right = kernel.hc_prenorm_gemm

    def wrong(a, b, d, sqr_sum, num_splits=None, **kw):
        right(a, b, d, sqr_sum, num_splits, **kw)
        d.mul_(1.01)  # a 1% error: what a miscompile looks like

    monkeypatch.setattr(kernel, "hc_prenorm_gemm", wrong)


def _cached(tmp_path):
    with open(tmp_path / "cache" / "sm12x" / guard.CACHE_FILE) as f:
        return json.load(f)["verdicts"]


def test_every_guarded_op_is_a_registered_op():
    from sm12x.kernels.registry import op_names

    names = set(op_names())
    for ops in guard.ops_by_factory().values():
        assert set(ops) <= names
    assert set(guard.TOPK) <= names
    guarded = [p.name for p in all_patches() if guard.ops_for(p)]
    # every kernel-running route is guarded; the gates are not
    assert "flash_mla.decode" in guarded and "deep_gemm.fp8_gemm_nt" in guarded
    assert "vllm.sparse_attn_indexer.get_indexer_topk" in guarded
    assert "sglang.gb10.deep_gemm_gate" not in guarded and "vllm.platforms.cuda.support_deep_gemm" not in guarded


def test_a_right_kernel_serves_and_its_verdict_is_cached(fresh, device):
    module = _install("right")
    d, sq = _call(module, device)
    assert float(sq[0]) != UPSTREAM_MARK  # sm12x served
    v = guard.PROCESS_VERDICTS[OP]
    assert v["ok"] and v["source"] == "checked" and v["ms"] > 0
    ((key, ops),) = _cached(fresh).items()
    assert ops[OP]["ok"] and "triton" in key and "sm12x" in key


def test_a_planted_wrong_kernel_is_refused_and_upstream_serves(fresh, monkeypatch, device):
    _plant_wrong_kernel(monkeypatch)
    module = _install("wrong")
    d, sq = _call(module, device)
    assert float(sq[0]) == UPSTREAM_MARK  # the upstream original served
    v = guard.PROCESS_VERDICTS[OP]
    assert not v["ok"] and "wrong result" in v["detail"]
    assert not next(iter(_cached(fresh).values()))[OP]["ok"]
    _call(module, device)  # decided once: the check does not run again
    assert guard.PROCESS_VERDICTS[OP] is v


def test_no_upstream_path_raises_one_line(fresh, monkeypatch, device):
    monkeypatch.setenv("SM12X_ARCH", "12.0")  # on SM12x DeepGEMM's own function cannot run
    _plant_wrong_kernel(monkeypatch)
    module = _install("refused")
    with pytest.raises(guard.GuardError) as e:
        _call(module, device)
    line = str(e.value)
    assert "\n" not in line and OP in line and "Triton" in line and "SM12X_DISABLE=1" in line


def test_once_trusts_the_cache_always_checks_off_unwraps(fresh, monkeypatch, device):
    _call(_install("first"), device)
    monkeypatch.setattr(guard, "PROCESS_VERDICTS", {})
    monkeypatch.setattr(guard, "_ROUTES", {})
    monkeypatch.setattr(guard, "check_op", lambda op, dev: pytest.fail("once: the cache answers"))
    _call(_install("second"), device)
    assert guard.PROCESS_VERDICTS[OP]["source"] == "cache"

    monkeypatch.setattr(guard, "PROCESS_VERDICTS", {})
    monkeypatch.setattr(guard, "_ROUTES", {})
    monkeypatch.setenv("SM12X_VERIFY", "always")
    ran = []
    monkeypatch.setattr(guard, "check_op", lambda op, dev: ran.append(op) or {"ok": True, "detail": "", "ms": 1})
    _call(_install("third"), device)
    assert ran == [OP]

    monkeypatch.setenv("SM12X_VERIFY", "off")
    module = _install("off")
    assert not hasattr(module.tf32_hc_prenorm_gemm, "__sm12x_guarded__")


def test_no_check_inside_capture_or_before_cuda(fresh, monkeypatch, device):
    monkeypatch.setattr(guard, "_cannot_check_now", lambda: "inside CUDA-graph capture")
    module = _install("capture")
    d, sq = _call(module, device)
    assert float(sq[0]) != UPSTREAM_MARK and OP not in guard.PROCESS_VERDICTS  # served, unchecked
    monkeypatch.setattr(guard, "_cannot_check_now", lambda: "")
    _call(module, device)
    assert guard.PROCESS_VERDICTS[OP]["ok"]  # the next call outside capture decides


def test_known_bad_is_refused_without_a_check(fresh, monkeypatch):
    # the table: Triton < 3.6 cannot assemble sm_121a unless TRITON_PTXAS_PATH names a newer ptxas
    assert guard.known_bad("fp8_gemm_nt", "12.1", "3.5.1") and not guard.known_bad("fp8_gemm_nt", "12.0", "3.5.1")
    assert not guard.known_bad("fp8_gemm_nt", "12.1", "3.6.0")
    monkeypatch.setenv("TRITON_PTXAS_PATH", "/usr/local/cuda/bin/ptxas")
    assert not guard.known_bad("fp8_gemm_nt", "12.1", "3.5.1")
    rule = guard.KnownBad(triton=">=0", capabilities=(guard.combination(0).split(" | ")[1],), ops=(OP,), reason="planted: Triton X miscompiles")
    monkeypatch.setattr(guard, "KNOWN_BAD", (rule,))
    monkeypatch.setattr(guard, "check_op", lambda op, dev: pytest.fail("known-bad needs no check"))
    v = guard.verdict(OP, "cpu")
    assert not v["ok"] and v["source"] == "known-bad" and "planted" in v["detail"]


def test_cache_never_in_the_mount_and_unwritable_is_harmless(fresh, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", REPO)
    assert guard.cache_dir() is None
    blocker = fresh / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))  # the folder cannot be made
    guard._write_cache("k", OP, {"ok": True})
    assert guard.read_cache() == {}


def test_the_check_leaves_the_rng_alone(fresh, device):
    where = "cuda:0" if device == "cuda" else "cpu"
    torch.manual_seed(1234)
    expected = torch.rand(3), torch.rand(3, device=where)
    torch.manual_seed(1234)
    assert guard.check_op(OP, where)["ok"]
    assert torch.equal(torch.rand(3), expected[0]) and torch.equal(torch.rand(3, device=where), expected[1])


def test_bad_verify_value_warns_and_means_once(fresh, monkeypatch):
    monkeypatch.setenv("SM12X_VERIFY", "sometimes")
    assert guard.mode() == "once"


def test_nothing_at_import():
    proc = run_py("""
        import sys
        at_start_up = "sm12x.guard" in sys.modules  # the mount's bootstrap has run by now
        import sm12x.guard, sm12x.apply
        print(at_start_up, sorted(m for m in ("torch", "triton", "importlib.metadata") if m in sys.modules))
    """, pythonpath=[REPO])
    assert proc.stdout.strip() == "False []"


@pytest.mark.gpu
def test_gpu_planted_wrong_kernel_refused_upstream_serves(fresh, monkeypatch, device):
    """On a CUDA GPU with SM12X_FORCE=1 (H100 / H200): the check runs on the GPU, a right kernel
    serves, a planted wrong one is refused and the upstream stand-in serves."""
    assert device == "cuda"
    test_a_right_kernel_serves_and_its_verdict_is_cached(fresh, device)
    print(f"first-call check of {OP} on the GPU: {guard.PROCESS_VERDICTS[OP]['ms']} ms")
    monkeypatch.setattr(guard, "PROCESS_VERDICTS", {})
    monkeypatch.setattr(guard, "_ROUTES", {})
    monkeypatch.setenv("SM12X_VERIFY", "always")
    test_a_planted_wrong_kernel_is_refused_and_upstream_serves(fresh, monkeypatch, device)


def test_status_shows_the_verdicts(fresh):
    guard._write_cache(guard.combination(0), OP, {"ok": False, "detail": "wrong result at M=7", "ms": 1.0,
                                                  "checked": "now"})
    guard._write_cache(guard.combination(0), "fp8_gemm_nt", {"ok": True, "detail": "2 case(s)", "ms": 1.0,
                                                             "checked": "now"})
    proc = run_py("from sm12x.cli import main; main(['status'])", pythonpath=[REPO], check=False,
                  env={"XDG_CACHE_HOME": str(fresh / "cache")})
    assert "1 op(s) passed" in proc.stdout and f"REFUSED {OP}" in proc.stdout, proc.stdout + proc.stderr
    proc = run_py("from sm12x.cli import main; main(['status', '--json'])", pythonpath=[REPO], check=False,
                  env={"XDG_CACHE_HOME": str(fresh / "cache")})
    verify = json.loads(proc.stdout)["verify"]
    assert verify["mode"] == "once" and {r["op"]: r["ok"] for r in verify["verdicts"]} == {OP: False, "fp8_gemm_nt": True}


def test_front_ends_that_read_their_caller_see_past_the_guard(fresh, monkeypatch):
    """Replacements that decide by their caller's code (sys._getframe) must see the framework's
    function, not the guard's wrapper (sm12x.frontends.callers)."""
    from sm12x.frontends import callers

    def make(original):
        def fp8_gemm_nt(*args):
            return callers.caller().f_code.co_name
        return fp8_gemm_nt

    # the manifest lists this factory under fp8_gemm_nt (the guard knows a record's op by its factory)
    monkeypatch.setattr(guard, "ops_by_factory", lambda: {f"{__name__}:make": ("fp8_gemm_nt",)})
    module = types.ModuleType("guard_standin_frames")
    module.fp8_gemm_nt = lambda *a: "original"
    sys.modules[module.__name__] = module
    patch = Patch(name="test.guard.frames", target=f"{module.__name__}:fp8_gemm_nt", make=make, why="t",
                  upstream="t", library="*", versions="*", versions_note="test stand-in", retire_when="test stand-in")
    assert apply.apply_patch(patch, module) == "applied"
    assert hasattr(module.fp8_gemm_nt, "__sm12x_guarded__")
    monkeypatch.setattr(guard, "check_op", lambda op, dev: {"ok": True, "detail": "", "ms": 0.0})

    def framework_function():
        return module.fp8_gemm_nt()

    assert framework_function() == "framework_function"  # the first call, which decides
    assert framework_function() == "framework_function"  # and the calls after it


def test_no_check_on_fake_or_meta_tensors():
    from torch._subclasses.fake_tensor import FakeTensorMode

    assert guard._call_device((torch.empty(2, device="meta"),), {}) is None
    with FakeTensorMode():
        fake = torch.empty(2, device="cuda")  # a traced CUDA tensor: no GPU behind it
    assert fake.is_cuda and guard._is_fake(fake) and guard._call_device((fake,), {}) is None


def test_a_failure_of_the_guard_itself_never_breaks_the_call(fresh, monkeypatch, device):
    def broken(*a, **k):
        raise OSError("no NVML")

    monkeypatch.setattr(guard, "combination", broken)
    d, sq = _call(_install("broken_guard"), device)
    assert float(sq[0]) != UPSTREAM_MARK  # sm12x served, unchecked, as before the guard
