"""Run the V4-Flash layer (or a stack of them) through the patched calls beside the float32
reference, and report the error at every op boundary against a stated budget.

The scenario: a prefill of one long request (4,096 tokens at production size) writing the caches,
a prefill chunk of the other requests (ragged lengths, several requests in one call), then decode
steps reading the caches: batch 1, batch ``batch`` (64), and the spec-decode form with 2 to 4 query
tokens per request (``spec``). Each step feeds both paths the same embeddings (the mHC streams
start as hc copies of them) and runs every layer of the stack.

Errors are relative Frobenius norms, ||patched - reference|| / ||reference||:

- ``op_errors``: each kernel call against the float32 reference of that op on the very inputs it
  got (its own error; ``indexer_topk_recall``: the smallest share of a row's float32 top-k set the
  fused top-k returned);
- ``boundaries``: the patched activations against the reference layer's at each op boundary
  (``attn_in`` .. ``out``), which adds what every earlier op and the bf16 activations contributed;
- ``decisions``: how often the reference's own top-k sets and expert picks agree with the patched
  ones (the reference follows the patched choices, see ``sm12x.layer.reference``).
"""
from __future__ import annotations

import dataclasses
import time

import torch

from sm12x.layer.caches import PagedCaches
from sm12x.layer.config import LayerConfig
from sm12x.layer.forward import Step, layer_forward
from sm12x.layer.patched import PatchedBackend
from sm12x.layer.reference import ReferenceBackend, rel_error
from sm12x.layer.weights import make_weights

# Relative error budget. Per op (same inputs): bf16 outputs round at 2^-9 (about 0.2% RMS), TF32
# keeps 10 mantissa bits, fp32 accumulation order differs; attention rounds P to bf16 before PV.
# Layer boundaries: the bf16 activations between ops and the FP8 casts they feed (a value near a
# rounding boundary of e4m3, 3 mantissa bits, lands on the other side) add up over the ~15 ops
# of a layer; the budget for a boundary grows with the layers before it in the stack.
OP_BUDGET = {
    "tf32_hc_prenorm_gemm": 5e-3,
    "fp8_gemm_nt": 1e-2,
    "fp8_einsum": 1e-2,
    "flash_mla_sparse_fwd": 1.5e-2,
    "flash_mla_with_kvcache": 1.5e-2,
    "m_grouped_fp8_fp4_gemm_nt_contiguous": 1e-2,
    "m_grouped_fp8_fp4_gemm_nt_masked": 1e-2,
}
MIN_TOPK_RECALL = 0.9          # ties and near-ties of the float32 scores may go either way
BOUNDARY_BUDGET = 3e-2         # per layer of depth: layer i's boundaries get (i + 1) x this
OUT_BUDGET = 2e-2              # the streams after layer i: (i + 1) x this


@dataclasses.dataclass
class Scenario:
    prefill_len: int = 4096        # request 0
    batch: int = 64                # requests; 1 .. batch-1 are prefilled together in one chunk
    other_len: int = 256           # the others' lengths are drawn from [compress_ratio, other_len]
    spec: tuple = (2, 4)           # query tokens per request in the spec-decode steps
    spec_batch: int = 8            # requests in a spec-decode step

    def max_tokens(self) -> int:
        grow = 2 + sum(self.spec)
        return max(self.prefill_len, self.other_len) + grow + 64  # 64: the timed runs' extra steps


PRODUCTION = Scenario()
SMALL = Scenario(prefill_len=44, batch=3, other_len=20, spec=(2, 3), spec_batch=2)


class LayerStack:
    """``layers`` layers of ``cfg`` with their weights, caches and both backends."""

    def __init__(self, cfg: LayerConfig, layers: int, scenario: Scenario, device, *, dg=None, fmla=None,
                 check_ops=True, reference=True, scale_format="packed", seed=0):
        self.cfg, self.device, self.scenario = cfg, torch.device(device), scenario
        self.weights = [make_weights(cfg, device, seed + i).t for i in range(layers)]
        self.trace: dict = {}
        self.patched = [PatchedBackend(cfg, PagedCaches(cfg, scenario.batch, scenario.max_tokens(), device, seed + i),
                                       w["attn_sink"], dg=dg, fmla=fmla, check_ops=check_ops, trace=self.trace,
                                       layer=i, scale_format=scale_format)
                        for i, w in enumerate(self.weights)]
        self.reference = [ReferenceBackend(cfg, w["attn_sink"], trace=self.trace, layer=i)
                          for i, w in enumerate(self.weights)] if reference else None
        self.lengths = [0] * scenario.batch
        self.step_no = 0
        self.gen = torch.Generator(device="cpu").manual_seed(seed + 1000)

    def embeddings(self, rows: int) -> torch.Tensor:
        x = torch.randn(rows, self.cfg.hidden, generator=self.gen).to(self.device, torch.bfloat16)
        return x[:, None, :].expand(rows, self.cfg.hc_mult, self.cfg.hidden).contiguous()

    def step(self, reqs, counts, decode: bool, compare=True):
        """One forward of every layer for ``counts[i]`` new tokens of ``reqs[i]``; returns the
        per-layer comparison (None when the reference is off or ``compare`` is False)."""
        step = Step(list(reqs), [self.lengths[r] for r in reqs], list(counts), decode)
        x = self.embeddings(step.rows)
        xp, xr, layers = x, x.float(), []
        for i, w in enumerate(self.weights):
            be = self.patched[i]
            be.step_no = self.step_no
            taps_p: dict = {}
            xp = layer_forward(be, w, self.cfg, xp, step, taps_p)
            if self.reference is not None and compare:
                ref = self.reference[i]
                ref.step_no = self.step_no
                taps_r: dict = {}
                xr = layer_forward(ref, w, self.cfg, xr, step, taps_r)
                layers.append({name: rel_error(taps_p[name], taps_r[name]) for name in taps_p
                               if taps_p[name].is_floating_point()})
        for r, n in zip(reqs, counts):
            self.lengths[r] += n
        self.step_no += 1
        return layers if layers else None


def scenario_steps(sc: Scenario):
    """(name, requests, tokens per request, decode) in the order they run."""
    others = list(range(1, sc.batch))
    g = torch.Generator().manual_seed(7)
    lens = [int(v) for v in torch.randint(4, sc.other_len + 1, (len(others),), generator=g)]
    steps = [(f"prefill {sc.prefill_len} tokens (1 request)", [0], [sc.prefill_len], False)]
    if others:
        steps.append((f"prefill chunk ({len(others)} requests, {sum(lens)} tokens)", others, lens, False))
    steps.append(("decode batch 1", [0], [1], True))
    steps.append((f"decode batch {sc.batch}", list(range(sc.batch)), [1] * sc.batch, True))
    for n in sc.spec:
        b = min(sc.spec_batch, sc.batch)
        steps.append((f"spec decode batch {b} x {n} tokens", list(range(b)), [n] * b, True))
    return steps


def run_check(cfg: LayerConfig, scenario: Scenario, device, layers: int = 1, **kwargs) -> dict:
    """The scenario through ``layers`` stacked layers, patched beside the reference -> a report dict
    (``ok``: every number within budget; ``failures``: what was not)."""
    stack = LayerStack(cfg, layers, scenario, device, **kwargs)
    report = {"layers": layers, "config": dataclasses.asdict(cfg), "scenario": dataclasses.asdict(scenario),
              "steps": [], "failures": []}
    for name, reqs, counts, decode in scenario_steps(scenario):
        per_layer = stack.step(reqs, counts, decode)
        report["steps"].append({"step": name, "rows": sum(counts), "layers": per_layer})
        for i, taps in enumerate(per_layer):
            for tap, err in taps.items():
                budget = (i + 1) * (OUT_BUDGET if tap == "out" else BOUNDARY_BUDGET)
                if not err <= budget:
                    report["failures"].append(f"{name}: layer {i} {tap} error {err:.3g} > {budget:.3g}")
    ops: dict = {}
    for be in stack.patched:
        for op, errs in be.op_errors.items():
            ops.setdefault(op, []).extend(errs)
    report["op_errors"] = {op: (min(v) if op.endswith("recall") else max(v)) for op, v in ops.items()}
    for op, err in report["op_errors"].items():
        if op.endswith("recall"):
            if not err >= MIN_TOPK_RECALL:
                report["failures"].append(f"{op} {err:.3g} < {MIN_TOPK_RECALL}")
        elif not err <= OP_BUDGET.get(op, 0.0):
            report["failures"].append(f"{op} error {err:.3g} > {OP_BUDGET.get(op, 0.0):.3g}")
    decisions: dict = {}
    for be in stack.reference or ():
        for k, v in be.decisions.items():
            decisions.setdefault(k, []).extend(v)
    report["decisions"] = {k: min(v) for k, v in decisions.items()}
    missing = sorted(set(OP_BUDGET) - set(report["op_errors"]))
    if missing:
        report["failures"].append(f"ops not exercised: {', '.join(missing)}")
    report["budget"] = {"ops": OP_BUDGET, "min_topk_recall": MIN_TOPK_RECALL,
                        "boundary_per_layer": BOUNDARY_BUDGET, "out_per_layer": OUT_BUDGET}
    report["ok"] = not report["failures"]
    return report


def _sync(device):
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def time_layer(cfg: LayerConfig, scenario: Scenario, device, layers: int = 1, repeats: int = 5, **kwargs) -> dict:
    """Wall time of the patched path alone (no reference, no op checks) after a warm-up pass that
    compiles every kernel: the prefill of request 0, the other requests' chunk, decode steps at
    batch 1 and ``batch`` and the spec form (median of ``repeats`` steps, each advancing the
    requests), in ms per step for the whole stack; peak GPU memory in GiB."""
    kwargs = dict(kwargs, check_ops=False, reference=False)
    warm = LayerStack(cfg, layers, scenario, device, **kwargs)
    for _, reqs, counts, decode in scenario_steps(scenario):
        warm.step(reqs, counts, decode)
    del warm
    stack = LayerStack(cfg, layers, scenario, device, **kwargs)
    if torch.device(device).type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    times: dict = {}
    for name, reqs, counts, decode in scenario_steps(scenario):
        runs = repeats if decode else 1
        samples = []
        for _ in range(runs):
            _sync(device)
            t0 = time.perf_counter()
            stack.step(reqs, counts, decode, compare=False)
            _sync(device)
            samples.append((time.perf_counter() - t0) * 1e3)
        times[name] = sorted(samples)[len(samples) // 2]
    peak = torch.cuda.max_memory_allocated() / 2**30 if torch.device(device).type == "cuda" else None
    return {"ms_per_step": times, "peak_gib": peak, "layers": layers}
