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
  ones (the reference follows the patched choices, see ``sm12x.layer.reference``): the top-k
  recall is the smallest of any row; the expert agreements are pooled over every row of every step
  of a layer (a share of picks, and of tokens whose whole set matched) and the worst layer is
  reported (``decisions_per_layer`` has each). These are informative, not budgeted: the reference's
  own activations drift from the patched ones by the FP8 casts, so a gate score within that drift
  of the k-th picks the other expert, more often the deeper the layer.
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
# Measured 3.5e-3 for every FP8 / MXFP4 GEMM and 2e-3 for the attention calls (small widths, CPU).
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
# Layer boundaries: the floor is the FP8 casts, not the kernels. The patched path casts bf16
# activations, the reference float32 ones; a value within 2^-9 of an e4m3 rounding boundary (3
# mantissa bits) lands one step (up to 12.5%) apart, which is about 1.5% RMS per cast, and a layer
# chains 3-4 casts (wq_a -> wq_b, wo_a -> wo_b, w13 -> w2) after the FP8 KV cache. Measured at
# small widths (CPU, every step): worst boundary 0.066 in layer 0 and 0.113 in layer 1 of two, the
# layer output 0.052 and 0.076. The budget grows with depth as the streams carry the drift on; a
# cache or scale layout that a reader takes differently from its writer gives O(1) at the first
# boundary after it.
BOUNDARY_BUDGET = (0.10, 0.06)   # layer i (from 0): 0.10 + 0.06 i
OUT_BUDGET = (0.07, 0.04)        # the streams after layer i: 0.07 + 0.04 i


def budget(kind, layer: int) -> float:
    base, per_layer = BOUNDARY_BUDGET if kind != "out" else OUT_BUDGET
    return base + per_layer * layer


@dataclasses.dataclass
class Scenario:
    prefill_len: int = 4096        # request 0
    batch: int = 64                # requests; 1 .. batch-1 are prefilled together in one chunk
    other_len: int = 256           # the others' lengths are drawn from [compress_ratio, other_len]
    spec: tuple = (2, 4)           # query tokens per request in the spec-decode steps
    spec_batch: int = 8            # requests in a spec-decode step
    batch1: bool = True            # a decode step of request 0 alone

    def max_tokens(self) -> int:
        grow = 2 + sum(self.spec)
        return max(self.prefill_len, self.other_len) + grow + 64  # 64: the timed runs' extra steps


PRODUCTION = Scenario()
SMALL = Scenario(prefill_len=44, batch=3, other_len=20, spec=(2, 3), spec_batch=2)


class LayerStack:
    """``layers`` layers of ``cfg`` with their weights, caches and both backends."""

    def __init__(self, cfg: LayerConfig, layers: int, scenario: Scenario, device, *, dg=None, fmla=None,
                 check_ops=True, reference=True, patched=True, scale_format="packed", reference_dtype=torch.float32,
                 seed=0, native=False):
        """``native``: the kernel calls in FlashMLA's and DeepGEMM's SM90 forms on the modules
        ``dg`` / ``fmla`` (``sm12x.layer.native``) instead of sm12x's."""
        self.cfg, self.device, self.scenario = cfg, torch.device(device), scenario
        self.weights = [make_weights(cfg, device, seed + i).t for i in range(layers)]
        self.trace: dict = {}
        if native:
            from sm12x.layer.native import NativeBackend, fp8_experts

            if dg is None or fmla is None:
                raise ValueError("sm12x layer: native=True needs the deep_gemm and flash_mla modules (dg, fmla)")

            def backend(caches, w, i):
                # the experts' FP8 copies made here, not inside the first (timed) step
                experts = (fp8_experts(w["experts_w13"]), fp8_experts(w["experts_w2"]))
                return NativeBackend(cfg, caches, w["attn_sink"], dg, fmla, experts=experts, check_ops=check_ops,
                                     trace=self.trace, layer=i)
        else:
            def backend(caches, w, i):
                return PatchedBackend(cfg, caches, w["attn_sink"], dg=dg, fmla=fmla, check_ops=check_ops,
                                      trace=self.trace, layer=i, scale_format=scale_format)
        self.patched = None if not patched else [
            backend(PagedCaches(cfg, scenario.batch, scenario.max_tokens(), device, seed + i), w, i)
            for i, w in enumerate(self.weights)]
        self.reference = [ReferenceBackend(cfg, w["attn_sink"], trace=self.trace, layer=i, dtype=reference_dtype)
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
            taps_p: dict = {}
            if self.patched is not None:
                be = self.patched[i]
                be.step_no = self.step_no
                xp = layer_forward(be, w, self.cfg, xp, step, taps_p)
            if self.reference is not None and compare:
                ref = self.reference[i]
                ref.step_no = self.step_no
                taps_r: dict = {}
                xr = layer_forward(ref, w, self.cfg, xr, step, taps_r)
                if taps_p:
                    layers.append({name: rel_error(taps_p[name], taps_r[name]) for name in taps_p
                                   if taps_p[name].is_floating_point()})
        for r, n in zip(reqs, counts):
            self.lengths[r] += n
        self.step_no += 1
        return layers if layers else None


def scenario_steps(sc: Scenario):
    """(name, requests, tokens per request, decode) in the order they run."""
    others = list(range(1 if sc.prefill_len else 0, sc.batch))
    g = torch.Generator().manual_seed(7)
    lens = [int(v) for v in torch.randint(4, sc.other_len + 1, (len(others),), generator=g)]
    steps = [(f"prefill {sc.prefill_len} tokens (1 request)", [0], [sc.prefill_len], False)] if sc.prefill_len else []
    if others:
        steps.append((f"prefill chunk ({len(others)} requests, {sum(lens)} tokens)", others, lens, False))
    if sc.batch1:
        steps.append(("decode batch 1", [0], [1], True))
    if sc.batch > 1 or not sc.batch1:
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
                limit = budget(tap, i)
                if not err <= limit:
                    report["failures"].append(f"{name}: layer {i} {tap} error {err:.3g} > {limit:.3g}")
    ops: dict = {}
    for be in stack.patched:
        for op, errs in be.op_errors.items():
            ops.setdefault(op, []).extend(errs)
    op_budget = op_budgets(stack.patched[0])
    report["op_errors"] = {op: (min(v) if op.endswith("recall") else max(v)) for op, v in ops.items()}
    for op, err in report["op_errors"].items():
        if op.endswith("recall"):
            if not err >= MIN_TOPK_RECALL:
                report["failures"].append(f"{op} {err:.3g} < {MIN_TOPK_RECALL}")
        elif not err <= op_budget.get(op, 0.0):
            report["failures"].append(f"{op} error {err:.3g} > {op_budget.get(op, 0.0):.3g}")
    report["decisions_per_layer"] = decisions_per_layer(stack.reference or ())
    report["decisions"] = {k: min(v) for k, v in report["decisions_per_layer"].items()}
    missing = sorted(set(op_budget) - set(report["op_errors"]))
    if missing:
        report["failures"].append(f"ops not exercised: {', '.join(missing)}")
    report["budget"] = {"ops": op_budget, "min_topk_recall": MIN_TOPK_RECALL,
                        "boundary": [budget("boundary", i) for i in range(layers)],
                        "out": [budget("out", i) for i in range(layers)]}
    report["ok"] = not report["failures"]
    return report


def op_budgets(backend) -> dict:
    """The per-op budgets of the calls ``backend`` makes: ``OP_BUDGET`` with the routed experts'
    grouped GEMMs named as the backend calls them (FP8 x FP4, or FP8 on SM90), same budget."""
    grouped = [op for op in OP_BUDGET if op.startswith("m_grouped_")]
    budgets = {op: b for op, b in OP_BUDGET.items() if op not in grouped}
    for op, like in zip(backend.EXPERT_OPS, grouped):
        budgets[op] = OP_BUDGET[like]
    return budgets


def decisions_per_layer(references) -> dict:
    """{decision: [value per layer]}: a float list's smallest entry (the top-k recall of the worst
    row), a list of (agreeing, total) pairs pooled over the layer's steps (the expert picks)."""
    out: dict = {}
    for be in references:
        for k, v in be.decisions.items():
            if not v:
                continue
            if isinstance(v[0], tuple):
                value = sum(a for a, _ in v) / max(1, sum(n for _, n in v))
            else:
                value = min(v)
            out.setdefault(k, []).append(value)
    return out


def _sync(device):
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def time_layer(cfg: LayerConfig, scenario: Scenario, device, layers: int = 1, repeats: int = 5, warm: bool = True,
               reference: bool = False, **kwargs) -> dict:
    """Wall time of the patched path alone (no reference, no op checks) after a warm-up pass that
    compiles every kernel (``warm`` False: the caller ran these shapes already): the prefill of request 0, the other requests' chunk, decode steps at
    batch 1 and ``batch`` and the spec form (median of ``repeats`` steps, each advancing the
    requests), in ms per step for the whole stack; peak GPU memory in GiB. ``reference``: time the
    reference backend alone instead (``reference_dtype`` in ``kwargs``, e.g. bf16)."""
    kwargs = dict(kwargs, check_ops=False, reference=reference, patched=not reference)
    if warm:
        # the warm-up takes every step the timed pass takes (decode steps ``repeats`` times): each
        # decode step lengthens the requests, and a length a kernel has not seen yet can mean a
        # new specialisation (Triton) or kernel (DeepGEMM's JIT) compiled inside the timed step
        first = LayerStack(cfg, layers, scenario, device, **kwargs)
        for _, reqs, counts, decode in scenario_steps(scenario):
            for _ in range(repeats if decode else 1):
                first.step(reqs, counts, decode)
        del first
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
            stack.step(reqs, counts, decode, compare=reference)
            _sync(device)
            samples.append((time.perf_counter() - t0) * 1e3)
        times[name] = sorted(samples)[len(samples) // 2]
    peak = torch.cuda.max_memory_allocated() / 2**30 if torch.device(device).type == "cuda" else None
    return {"ms_per_step": times, "peak_gib": peak, "layers": layers}
