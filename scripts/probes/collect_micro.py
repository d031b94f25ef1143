"""Probe (GPU, the fold of topk_fold): what makes the collect slow (a [4096, 16384] float32 window, ~64 keys above floor)."""
import os, sys
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
import torch, triton
import triton.language as tl
from sm12x.kernels.indexer.topk_select import sort_key
from sm12x.kernels.indexer import topk_fold as tf
from functools import partial
from probe_timing import ev_time
ev_time = partial(ev_time, iters=20)  # short kernels: more calls per timing


@triton.jit
def _v(x_ptr, stride_x, W, R, col_start, floor_ptr, fthr_ptr, cand_ptr, stride_c, count_ptr,
       MODE: tl.constexpr, ROWS: tl.constexpr, COLS: tl.constexpr):
    r = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    c = tl.program_id(1) * COLS + tl.arange(0, COLS)
    r_ok = r < R
    r64 = r.to(tl.int64)
    v = tl.load(x_ptr + r64[:, None] * stride_x + c[None, :], mask=r_ok[:, None] & (c < W)[None, :],
                other=float("-inf"))
    if MODE == 0:  # float compare, count only
        take = v > tl.load(fthr_ptr + r, mask=r_ok, other=float("inf"))[:, None]
        tl.atomic_add(count_ptr + r, tl.sum(take.to(tl.int32), axis=1), mask=r_ok)
    elif MODE == 1:  # int64 key compare, count only
        floor = tl.load(floor_ptr + r, mask=r_ok, other=9223372036854775807)
        take = sort_key(v, c[None, :], col_start, 0) > floor[:, None]
        tl.atomic_add(count_ptr + r, tl.sum(take.to(tl.int32), axis=1), mask=r_ok)
    elif MODE == 2:  # + cumsum and store at pos (first = 0)
        floor = tl.load(floor_ptr + r, mask=r_ok, other=9223372036854775807)
        key = sort_key(v, c[None, :], col_start, 0)
        take = key > floor[:, None]
        pos = tl.cumsum(take.to(tl.int32), axis=1) - 1
        tl.store(cand_ptr + r64[:, None] * stride_c + pos, key, mask=take & (pos < 256))
        tl.atomic_add(count_ptr + r, tl.sum(take.to(tl.int32), axis=1), mask=r_ok)
    elif MODE == 4:  # one atomic per candidate (unordered places)
        floor = tl.load(floor_ptr + r, mask=r_ok, other=9223372036854775807)
        key = sort_key(v, c[None, :], col_start, 0)
        take = key > floor[:, None]
        ones = tl.full(take.shape, 1, tl.int32)
        pos = tl.atomic_add(count_ptr + r64[:, None] + 0 * c[None, :], ones, mask=take)
        tl.store(cand_ptr + r64[:, None] * stride_c + pos, key, mask=take & (pos < 256))
    elif MODE == 3:  # float pre-test: only tiles with a value >= the floor's value do the key work
        fthr = tl.load(fthr_ptr + r, mask=r_ok, other=float("inf"))
        maybe = v >= fthr[:, None]
        if tl.sum(maybe.to(tl.int32)) > 0:
            floor = tl.load(floor_ptr + r, mask=r_ok, other=9223372036854775807)
            key = sort_key(v, c[None, :], col_start, 0)
            take = maybe & (key > floor[:, None])
            n = tl.sum(take.to(tl.int32), axis=1)
            first = tl.atomic_add(count_ptr + r, n, mask=n > 0)
            pos = first[:, None] + tl.cumsum(take.to(tl.int32), axis=1) - 1
            tl.store(cand_ptr + r64[:, None] * stride_c + pos, key, mask=take & (pos < 256))

R, W, K = 4096, 16384, 512
x = torch.randn(R, W, device="cuda")
col_start = 3 * W
prev = torch.randn(R, 3 * W, device="cuda")
thr = prev.topk(K, dim=1).values[:, -1].contiguous()  # the floor's value
b = thr.view(torch.int32)
sb = torch.where(b < 0, b ^ 0x7FFFFFFF, b).to(torch.int64)
floor = ((sb << 32) | 0x7FFFFFFF - 5).contiguous()  # index 5
del prev
cand = torch.empty(R, K, dtype=torch.int64, device="cuda")
count = torch.zeros(R, dtype=torch.int32, device="cuda")
print("amax read", ev_time(lambda: x.amax(1)))
print("mean above floor", float((x > thr[:, None]).sum(1).float().mean()))
for rows, cols, warps in [(4, 1024, 4), (1, 1024, 4), (1, 256, 1), (1, 512, 1), (1, 1024, 1), (2, 512, 1),
                          (4, 256, 1), (1, 1024, 2), (1, 2048, 1), (4, 1024, 1)]:
    for mode in (2, 4):
        f = lambda: _v[(triton.cdiv(R, rows), triton.cdiv(W, cols))](
            x, x.stride(0), W, R, col_start, floor, thr, cand, cand.stride(0), count, MODE=mode,
            ROWS=rows, COLS=cols, num_warps=warps)
        print(f"tile {rows}x{cols} warps {warps} mode {mode}: {ev_time(f):.3f} ms")
# the real fold on this data
best = (floor[:, None] + torch.arange(K - 1, -1, -1, device="cuda")[None, :]).contiguous()
scratch = torch.empty(R, K, dtype=torch.int64, device="cuda")
done = torch.empty(R, dtype=torch.int32, device="cuda")
keep = best.clone()
def fold():
    best.copy_(keep)
    tf.fold_above_floor(x, best, col_start, None, scratch, done)
print("fold (incl. 16 MB copy)", ev_time(fold), "copy", ev_time(lambda: best.copy_(keep)), "folded", int(done.sum()))
for K2 in (512, 2048):
    best = (floor[:, None] + torch.arange(K2 - 1, -1, -1, device="cuda")[None, :]).contiguous()
    scratch = torch.empty(R, K2, dtype=torch.int64, device="cuda").random_()
    keep = best.clone()
    for mw in (4, 8):
        def merge_only():
            best.copy_(keep)
            done.fill_(100)
            kp = triton.next_power_of_2(K2)
            tf._merge_kernel[(R,)](best, best.stride(0), K2, scratch, scratch.stride(0), done, 256, CAND=256,
                                   KP=kp, STEPS_K=K2.bit_length(), STEPS_C=(256).bit_length(), num_warps=mw)
        print(f"merge only K={K2} warps {mw} (100 candidates, incl. copy)", ev_time(merge_only),
              "copy", ev_time(lambda: best.copy_(keep)))
