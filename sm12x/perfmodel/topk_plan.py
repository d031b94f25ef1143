"""What the fused indexer top-k (``indexer_topk``: ``fused_topk.mqa_topk_indices`` in prefill,
``paged_mqa_topk_indices`` in decode) launches for its production cases, for the performance model.

A call walks blocks of rows and, per block, windows of key columns (``fused_topk._plan``: a float32
workspace of at most 256 MiB). Per window it launches the logits kernel (``mqa_logits`` /
``paged_mqa_logits``, the variant without the -inf fill), then folds the window into the running
top-k: the first window of a block through ``topk_filter.topk_keys`` (sample threshold, count,
gather, a radix select over the candidates; the plain radix select where the filter does not pay)
and a merge; every later window through ``topk_fold`` (collect the keys above the running floor,
merge them in) and, for the rows with too many of them, the radix select with that floor and the
merge. A block ends with the key-to-index kernel. Each launch here is that kernel's compiled
configuration for the card, its grid (programs with work; those that exit at once are not
counted), its passes over the window's columns and the bytes it moves.

What the SASS cannot say is taken as follows (the same for every card):
- scores are independent draws, as in ``scripts/bench_indexer.py``: after a row has seen N keys,
  each new key beats its floor with probability topk / N, so a window of W keys holds about
  topk W / N above it (Poisson); a row folds when that count is within ``topk_fold``'s candidate
  limit (a normal approximation gives the share of rows that do);
- the filter's threshold keeps its expected share (``topk_filter.sample_rank``) and never fails
  (it is set 5 standard deviations wide);
- a merge width without its own compiled configuration (the first window's 512) takes the next
  compiled one (1024); a first window of top-2048 over more than 2048 rows is ``torch.sort``,
  costed as the 32-warp first-window sort kernel (measured within 3% of it on the H200);
- a radix select's later passes over a row (at most 64 KiB) re-read it from L2: DRAM sees the
  first; every other kernel reads the window from DRAM (a 256 MiB workspace outlives any L2);
- decode requests all have the benchmark's average context (uniform 0.7-1.3 x it there).
"""
from __future__ import annotations

import math

from sm12x.perfmodel import compiled
from sm12x.perfmodel.engine import Launch

H, D, BLOCK_KV = 64, 128, 64
MODEL_LEN = 262144  # DeepSeek-V4's 1M-token limit in 4x-compressed indexer keys (bench_indexer.py)


def _causal(s, s_kv):
    return [(0, s_kv - s + 1 + i) for i in range(s)]


def _chunk(new_tokens, prefixes):
    """A prefill chunk of several requests whose keys lie one after another (bench_indexer.py)."""
    rows, start = [], 0
    for n, p in zip(new_tokens, prefixes):
        rows += [(start, start + p + 1 + i) for i in range(n)]
        start += p + n
    return rows


# (label, S_kv, top-k, rows as (ks, ke)): scripts/bench_indexer.py's fused top-k cases
PREFILL = [
    ("prefill S 4096 x S_kv 262,144, top-512", 262144, 512, lambda: _causal(4096, 262144)),
    ("prefill S 4096 x S_kv 262,144, top-2048", 262144, 2048, lambda: _causal(4096, 262144)),
    ("1M-token prompt: chunk S 8192 x S_kv 262,144, top-512", 262144, 512, lambda: _causal(8192, 262144)),
    ("prefill chunk 8 requests x 1024 new after 31,744 keys, top-512", 262144, 512,
     lambda: _chunk([1024] * 8, [31744] * 8)),
    ("prefill chunk 16 requests x 512 new after 0-29,000 keys, top-2048", 240152, 2048,
     lambda: _chunk([512] * 16, [i * 1933 for i in range(16)])),
]
# (B, context, next_n, top-k, max_context_len or None for the batch's longest): its paged cases
DECODE = [(1, MODEL_LEN, 1, 512, MODEL_LEN), (1, MODEL_LEN, 2, 512, MODEL_LEN), (1, MODEL_LEN, 1, 2048, MODEL_LEN),
          (32, MODEL_LEN, 1, 512, MODEL_LEN), (64, 32768, 2, 512, None), (256, 8192, 1, 2048, None),
          (256, 8192, 1, 512, MODEL_LEN)]


def _report(card, match, what):
    return compiled.find("indexer_topk", card.target, match, what)


def _by_name(card, name):
    return _report(card, lambda k, c: c.startswith(name), name)


def _folded_share(lam: float, limit: int) -> float:
    """Share of rows whose count above the floor (Poisson, mean ``lam``) is within ``limit``."""
    if lam <= 0:
        return 1.0
    z = (limit + 0.5 - lam) / math.sqrt(lam)
    return 0.5 * (1.0 + math.erf(z / math.sqrt(2.0)))


class _Call:
    """Collects one call's launches on one card."""

    def __init__(self, card, topk, tag):
        from sm12x.kernels.indexer import topk_select as sel

        self.card, self.topk, self.tag, self.sel = card, topk, tag, sel
        self.launches = []

    def add(self, rep, ctas, dram, trips=None, passes=1.0, flops=0.0):
        self.launches.append(Launch(rep, max(int(math.ceil(ctas)), 0), flops, dram, trips=trips, passes=passes))

    def select(self, vis, n, k, passes_of, skip_share=None):
        """A radix select over a window ([R, n]; ``vis`` the visible columns per row), rows left
        by ``skip_share`` (share skipped per row, or None), ``passes_of(row)`` passes each."""
        import torch

        sel = self.sel
        rows = len(vis)
        seg = sel.segment_width(rows, n, torch.device("cpu"))
        keep = [1.0 - (skip_share[i] if skip_share else 0.0) for i in range(rows)]
        active = sum(keep)  # rows it skips exit at once: they cost the launch only
        if seg >= n:
            rep = _by_name(self.card, f"row{self.tag} B")
            work = sum(keep[i] * passes_of(i) * vis[i] for i in range(rows))
            # a row's later passes re-read its <= 64 KiB from L2: DRAM sees the first
            read = sum(keep[i] * vis[i] for i in range(rows))
            self.add(rep, active, read * 4 + active * k * 8, trips=work / max(active, 1e-9) / sel.BLOCK)
            return
        width = sel.SEGMENT if seg == sel.SEGMENT else sel.BLOCK
        read = sum(keep[i] * vis[i] for i in range(rows))
        programs = sum(keep[i] * max(1, math.ceil(vis[i] / seg)) for i in range(rows) if vis[i])
        for kind in ["histogram"] * sel.PASSES + ["count", "write"]:
            rep = _by_name(self.card, f"segment {kind}{self.tag} S{width}")
            self.add(rep, programs, read * 4, trips=read / max(programs, 1) / sel.BLOCK)

    def merge(self, rows, width, skip_rows=None, first=False):
        """merge_topk_keys of a running set (or none: ``first``) and a window's candidates."""
        from sm12x.kernels.indexer import topk_merge as tm

        active = rows - (skip_rows or 0.0)
        if width > tm.MAX_WIDTH and not first and max(self.topk, width - self.topk) <= tm.SORTED_MERGE_MAX:
            name = f"sorted merge {tm.SORTED_MERGE_MAX}" + (" skip" if skip_rows is not None else "")
        elif first and width >= tm.FIRST_SORT_WIDTH:
            name = f"merge W{tm.FIRST_SORT_WIDTH} first"  # torch.sort above FIRST_SORT_MAX_ROWS rows
        elif width <= tm.MAX_WIDTH:
            name = f"merge W{tm.MAX_WIDTH}"
        else:
            name = f"merge W{tm.MAX_WIDTH_SKIPPING}"
        rep = _report(self.card, lambda k, c: c == name, name)
        self.add(rep, active, active * width * 8 * 2, trips=0)

    def window(self, vis, seen, n, starts, first, real=None, real_seen=None):
        """Fold one window of logits ([rows, n], ``vis`` visible columns per row, ``seen`` visible
        before it) into the running top-k. ``real`` / ``real_seen`` (a candidate consumer's masked
        window, :mod:`sm12x.perfmodel.candidate_plan`): per row, the keys of this window and of the
        earlier ones that keep their scores; the others score -FLT_MAX. None: every key does."""
        from sm12x.kernels.indexer import topk_filter as tf
        from sm12x.kernels.indexer import topk_fold as tfo

        rows, k = len(vis), self.topk
        k_w = min(k, n)
        read = sum(vis)
        if first:
            cap = tf.capacity(rows, n, k_w)
            if cap:
                import torch

                seg = self.sel.segment_width(rows, n, torch.device("cpu"))
                width = self.sel.SEGMENT if seg == self.sel.SEGMENT else self.sel.BLOCK
                programs = sum(max(1, math.ceil(v / seg)) for v in vis if v)
                # a masked row whose sample holds fewer real keys than the threshold's rank gets a
                # -FLT_MAX threshold: every key reaches it, more than the candidate row holds, and
                # the row takes the full radix select after the filter's passes
                fails = [0.0] * rows
                if real is not None:
                    fails = [1.0 if v >= tf.SAMPLE and v > cap and 2 * tf.sample_rank(k_w, v) <= tf.SAMPLE
                             and tf.SAMPLE * r / v < tf.sample_rank(k_w, v) else 0.0 for v, r in zip(vis, real)]
                self.add(_by_name(self.card, "filter threshold"), rows, rows * tf.SAMPLE * 4, trips=0)
                self.add(_by_name(self.card, f"filter count S{width}"), programs, read * 4,
                         trips=read / max(programs, 1) / self.sel.BLOCK)
                kept = [0.0 if f else min(cap, v * tf.sample_rank(k_w, v) / tf.SAMPLE) if v >= tf.SAMPLE else v
                        for v, f in zip(vis, fails)]
                good = [v * (1.0 - f) for v, f in zip(vis, fails)]
                g_programs = sum(max(1, math.ceil(v / seg)) for v in good if v)
                self.add(_by_name(self.card, f"filter gather S{width}"), programs, sum(good) * 4 + sum(kept) * 8,
                         trips=sum(good) / max(g_programs, 1) / self.sel.BLOCK)
                # the radix select over each row's candidates: four histogram passes and a write
                ok_rows = rows - sum(fails)
                rep = _by_name(self.card, "row candidates B")
                self.add(rep, ok_rows, sum(kept) * 8 + ok_rows * k_w * 8,
                         trips=sum(kept) / max(ok_rows, 1e-9) / self.sel.BLOCK, passes=self.sel.PASSES + 1)
                if any(fails):
                    self.select(vis, n, k_w, lambda i: self.sel.PASSES + 1, skip_share=[1.0 - f for f in fails])
            else:
                self.select(vis, n, k_w, lambda i: self.sel.PASSES + 1)
            self.merge(rows, 1 << (k - 1).bit_length(), first=True)
            return
        limit, _ = tfo.fold_limits(k)
        # expected keys above the floor per row, and the share of rows the fold takes; in a masked
        # window every real key beats a floor that is still a masked (-FLT_MAX) key
        if real is None:
            lam = [k * v / s if s else float(v) for v, s in zip(vis, seen)]
        else:
            lam = [float(r) if rs < k else k * r / rs for r, rs in zip(real, real_seen)]
        share = [_folded_share(x, limit) if k <= tfo.MAX_K else 0.0 for x in lam]
        if k <= tfo.MAX_K:
            ctag = " starts ends" if starts else " ends"
            programs = sum(math.ceil(v / tfo.COLS) for v in vis)
            self.add(_by_name(self.card, f"collect {tfo.COLS}{ctag}"), programs, read * 4, trips=0)
            kp = 1 << (k - 1).bit_length()
            self.add(_by_name(self.card, f"merge K{kp} C"), rows, rows * k * 8 * 2, trips=0)
        # the rest: the select with the floor (count, then write when within top-k; else the radix
        # passes too), then the merge
        self.select(vis, n, k_w, lambda i: 2 if lam[i] <= k_w else 2 + self.sel.PASSES, skip_share=share)
        self.merge(rows, 1 << (k + k_w - 1).bit_length(), skip_rows=sum(share))

    def keys_to_indices(self, rows):
        from sm12x.kernels.indexer import fused_topk as ft

        self.add(_by_name(self.card, "key indices"), rows * math.ceil(self.topk / ft.INDEX_BLOCK),
                 rows * self.topk * 12, trips=0)


def prefill_windows(call, card, ranges, s_kv, topk, fp4=False, hook=None):
    """Add one ``mqa_topk_indices`` call's launches to ``call``: rows ``ranges`` ((ks, ke) in a flat
    key buffer of ``s_kv``), FP8 or FP4 (``fp4``) q and keys. ``hook(call, vis, totals, n)``, when
    given, adds the window hook's launches after each window's logits (``vis``: each row's visible
    columns in the window, ``totals``: its visible keys in all) and returns each row's keys that
    keep their scores, or None when all do."""
    import torch

    from sm12x.kernels.common import configs
    from sm12x.kernels.indexer import fused_topk as ft
    from sm12x.kernels.indexer import mqa_logits as ml

    cpu = torch.device("cpu")
    s = len(ranges)
    form = "fp4" if fp4 else "fp8"
    cfg = configs.pick(ml.CONFIGS, cpu)[form]
    logits = _report(card, lambda k, c: c.replace(" mx", "").startswith(f"{form} H{H} D{D} out0")
                     and "clean" not in c and "comp" not in c, f"mqa logits {form} out0")
    key_bytes = D // 2 + 4 if fp4 else D + 4
    bq = ml._block_q(H, cfg["rows"])
    row_block, win = ft._plan(s, s_kv, cfg["BLOCK_N"] * cfg["N_ITERS"], topk, ft.DEFAULT_WORKSPACE_BYTES)
    for r0 in range(0, s, row_block):
        rows = ranges[r0:r0 + row_block]
        totals = [ke - ks for ks, ke in rows]
        seen = [0] * len(rows)
        real_seen = [0.0] * len(rows)
        for c0 in range(0, s_kv, win):
            n = min(win, s_kv - c0)
            vis = [max(0, min(ke, c0 + n) - max(ks, c0)) for ks, ke in rows]
            pairs = sum(vis)
            tiles = -(-n // cfg["BLOCK_N"])
            n_iters = configs.fit_iters(cfg["N_ITERS"], tiles, -(-len(rows) // bq), cpu)
            grid = -(-len(rows) // bq) * -(-tiles // n_iters)
            call.add(logits, max(1, grid * pairs / (len(rows) * n)),
                     n * key_bytes + len(rows) * H * key_bytes + pairs * 4, flops=2.0 * H * D * pairs)
            real = hook(call, vis, totals, n) if hook else None
            call.window(vis, seen, n, True, c0 == 0, real=real, real_seen=real_seen)
            seen = [a + b for a, b in zip(seen, vis)]
            if real is not None:
                real_seen = [a + b for a, b in zip(real_seen, real)]
        call.keys_to_indices(len(rows))


def _prefill_case(card, label, s_kv, topk, make_rows):
    ranges = make_rows()
    s = len(ranges)
    call = _Call(card, topk, " starts ends")
    prefill_windows(call, card, ranges, s_kv, topk)
    flops = 2.0 * H * D * sum(ke - ks for ks, ke in ranges)
    dram = s_kv * (D + 4) + s * H * (D + 4) + s * topk * 4
    return call.launches, flops, dram


def decode_windows(call, card, ctxs, next_n, topk, mcl, fp4=False, hook=None):
    """Add one ``paged_mqa_topk_indices`` call's launches to ``call``: requests of contexts ``ctxs``,
    ``next_n`` rows each, a window of ``mcl`` (``max_context_len``) columns, FP8 or FP4 (``fp4``);
    ``hook`` as for :func:`prefill_windows`."""
    import torch

    from sm12x.kernels.common import configs
    from sm12x.kernels.indexer import fused_topk as ft
    from sm12x.kernels.indexer import paged_mqa_logits as pml

    cpu = torch.device("cpu")
    b = len(ctxs)
    form = "fp4" if fp4 else "fp8"
    pcfg = configs.pick(pml.CONFIGS, cpu)[form]
    key_bytes = D // 2 + 4 if fp4 else D + 4
    bt = pml.block_t(H, next_n, pcfg["rows"])
    pair = pml.pair_tokens(pcfg, bt, H, next_n, fp4)
    per_req = -(-next_n // (2 * bt if pair else bt))
    rows = b * next_n
    row_block, win = ft._plan(rows, mcl, BLOCK_KV * pcfg["N_ITERS"], topk, ft.DEFAULT_WORKSPACE_BYTES)
    req_block = max(1, row_block // next_n)
    ends = [min(ctx - next_n + 1 + t, mcl) for ctx in ctxs for t in range(next_n)]
    for b0 in range(0, b, req_block):
        nb = min(b, b0 + req_block) - b0
        row_ends = ends[b0 * next_n:(b0 + nb) * next_n]
        seen = [0] * len(row_ends)
        real_seen = [0.0] * len(row_ends)
        for c0 in range(0, mcl, win):
            n = min(win, mcl - c0)
            vis = [max(0, min(e - c0, n)) for e in row_ends]
            blocks = -(-n // BLOCK_KV)
            cols, _, multi = pml.grid_columns(blocks, nb * per_req, cpu, pcfg)
            want = f"{form} H{H} D{D} bkv{BLOCK_KV} T{bt}{'x2' if pair else ''} out0"
            rep = _report(card, lambda k, c: c.replace(" mx", "").startswith(want) and " ctx2d" in c
                          and "clean" not in c and ("multi-chunk" in c) == multi, want)
            ctas = 0
            flops = 0.0
            key_reads = 0
            for ctx in ctxs[b0:b0 + nb]:
                req_vis = max(0, min(ctx - c0, n))  # positions of a request in this window
                vblocks = -(-req_vis // BLOCK_KV)
                ctas += per_req * math.ceil(cols * vblocks / blocks) if vblocks else 0
                flops += 2.0 * (2 * bt if pair else bt) * H * D * BLOCK_KV * vblocks * per_req
                key_reads += req_vis
            call.add(rep, ctas, key_reads * key_bytes + sum(vis) * 4, flops=flops)
            real = hook(call, vis, row_ends, n) if hook else None
            call.window(vis, seen, n, False, c0 == 0, real=real, real_seen=real_seen)
            seen = [a + c for a, c in zip(seen, vis)]
            if real is not None:
                real_seen = [a + c for a, c in zip(real_seen, real)]
        call.keys_to_indices(len(row_ends))


def _decode_case(card, b, ctx, next_n, topk, model_len):
    mcl = model_len or -(-int(1.3 * ctx) // BLOCK_KV) * BLOCK_KV
    call = _Call(card, topk, " ends")
    decode_windows(call, card, [ctx] * b, next_n, topk, mcl)
    flops = 2.0 * b * next_n * ctx * H * D
    dram = b * ctx * (D + 4) + b * next_n * topk * 4
    return call.launches, flops, dram, mcl


def cases(card) -> list:
    """The fused top-k's production cases on ``card`` (bench_indexer.py's, H 64, D 128, FP8)."""
    from sm12x.perfmodel.compiled import Case, as_card

    out = []
    with as_card(card):
        for label, s_kv, topk, make_rows in PREFILL:
            launches, flops, dram = _prefill_case(card, label, s_kv, topk, make_rows)
            out.append(Case("indexer_topk", label, launches, flops, "mxf8", dram, ("indexer_topk", label)))
        for b, ctx, next_n, topk, model_len in DECODE:
            launches, flops, dram, mcl = _decode_case(card, b, ctx, next_n, topk, model_len)
            label = f"decode B {b} x ctx {ctx:,}, next_n {next_n}, top-{topk}, max_context_len {mcl:,}"
            out.append(Case("indexer_topk", label, launches, flops, "mxf8", dram,
                            ("indexer_topk", "decode", b, ctx, next_n, topk, model_len)))
    return out
