"""The register-budget ladder of the indexer kernels (``sm12x.kernels.common.register_budget``): at launch
and in the compile check, a variant takes the first budget it compiles under without spilling."""
import json
import os
import subprocess
import sys

import torch

from sm12x.kernels.common import register_budget
from sm12x.kernels.common.register_budget import MAX_REGISTERS, budgets, launch_budget

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def test_budgets_order():
    assert budgets(192) == [192, None, MAX_REGISTERS]
    assert budgets(None) == [None, MAX_REGISTERS]
    assert budgets(MAX_REGISTERS) == [MAX_REGISTERS, None]


class _Compiled:
    def __init__(self, spills):
        self.n_spills = spills

    def _init_handles(self):
        pass


class _FakeKernel:
    """Stands in for a JITFunction: ``spills`` maps a maxnreg (None: no option) to the spill bytes
    ptxas would give, or to an exception."""

    def __init__(self, spills):
        self.spills = spills
        self.warmups = []

    def warmup(self, *args, grid, **kwargs):
        budget = kwargs.get("maxnreg")
        self.warmups.append(budget)
        result = self.spills[budget]
        if isinstance(result, Exception):
            raise result
        return _Compiled(result)


def test_launch_budget_takes_the_first_spill_free_budget_once(monkeypatch):
    monkeypatch.setattr(register_budget, "_CHOSEN", {})
    dev = torch.device("cuda", 0)  # only its index is read
    kernel = _FakeKernel({192: 40, None: 8, MAX_REGISTERS: 0})
    assert launch_budget(kernel, (1,), {"H": 64}, 192, dev) == {"maxnreg": MAX_REGISTERS}
    assert kernel.warmups == [192, None, MAX_REGISTERS]
    assert launch_budget(kernel, (1,), {"H": 64}, 192, dev) == {"maxnreg": MAX_REGISTERS}
    assert kernel.warmups == [192, None, MAX_REGISTERS]  # decided once per variant

    kernel = _FakeKernel({64: 0, None: 0, MAX_REGISTERS: 0})
    assert launch_budget(kernel, (1,), {"H": 64}, 64, dev) == {"maxnreg": 64}
    assert kernel.warmups == [64]

    kernel = _FakeKernel({64: RuntimeError("ptxas: too few registers"), None: 0, MAX_REGISTERS: 0})
    assert launch_budget(kernel, (1,), {"H": 8}, 64, dev) == {}

    kernel = _FakeKernel({None: 16, MAX_REGISTERS: 8})  # all spill: the last, the largest budget
    assert launch_budget(kernel, (1,), {"H": 8}, None, dev) == {"maxnreg": MAX_REGISTERS}


LADDER_SNIPPET = """
import json
from sm12x.kernels.indexer import mqa_logits as m
from sm12x.kernels.common.compile_check import compile_kernel
cfg = m.CONFIGS["sm_120"]["fp8"]
const = dict(H=64, D=128, BLOCK_Q=m._block_q(64, cfg["rows"]), BLOCK_N=cfg["BLOCK_N"], N_ITERS=cfg["N_ITERS"],
             IS_FP4=False, CLEAN=True, COMPRESSED=False, KEY_ROWS=True, FP4_MMA=False, OUT_MODE=0, HEAD_MMA=0,
             FP8_MX=cfg["fp8_mx"])
out = []
for ladder in (False, True):
    r = compile_kernel(m._mqa_logits_kernel, m._signature(False, 0), const, target="sm_120",
                       num_warps=cfg["num_warps"], num_stages=cfg["num_stages"], config_name="fp8 H64 D128",
                       maxnreg=48, register_ladder=ladder)
    out.append([r.spill_bytes, r.registers, r.config, r.ok])
print(json.dumps(out))
"""


def test_compile_check_follows_the_ladder():
    """The production FP8 logits variant under a budget far too small for it (48 registers) spills;
    with the ladder the check reports the budget the launcher would take, without spills. (Compiled
    in a subprocess: under TRITON_INTERPRET kernels cannot be compiled in-process.)"""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    res = subprocess.run([sys.executable, "-c", LADDER_SNIPPET], env=env, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-4000:]
    (plain_spill, plain_regs, _, plain_ok), (spill, _, name, ok) = json.loads(res.stdout.strip().splitlines()[-1])
    assert plain_spill > 0 and plain_regs <= 48 and not plain_ok
    assert spill == 0 and ok
    assert "(maxnreg" in name
