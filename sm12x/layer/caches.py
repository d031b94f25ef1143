"""The paged caches of one V4-Flash CSA layer, in the byte layouts the kernels read, and the
block tables of the requests that write them.

- ``swa``: MODEL1 (584 B per token) of every token's KV; FlashMLA's main ``k_cache``, read through
  the window indices (a page of ``cache_block`` tokens: 576 B per token of 448 e4m3 + 64 bf16, then
  8 B per token of 7 UE8M0 exponents and a pad; pages padded to a multiple of 576 B).
- ``comp``: MODEL1 of the compressed entries (one per ``compress_ratio`` tokens); FlashMLA's
  ``extra_k_cache``, read through the indexer's top-k.
- ``index``: the indexer keys, DeepGEMM's fused paged FP8 layout (uint8 [pages, block, 1, 132]:
  block x 128 e4m3, then block float32 scales), read by ``fp8_paged_mqa_logits``.

Pages are handed out from a shuffled free list, so a request's pages are not contiguous and every
reader goes through its block table.
"""
from __future__ import annotations

import torch

from sm12x.kernels.sparse_mla.kv_cache import MODEL1_BYTES_PER_TOKEN
from sm12x.layer.blocks import quant_fp8


def _model1_arena(pages: int, block: int, device):
    stride = -(-block * MODEL1_BYTES_PER_TOKEN // 576) * 576
    arena = torch.zeros(pages, stride, dtype=torch.uint8, device=device)
    view = arena.as_strided((pages, block, 1, MODEL1_BYTES_PER_TOKEN),
                            (stride, MODEL1_BYTES_PER_TOKEN, MODEL1_BYTES_PER_TOKEN, 1))
    return arena, view


def write_model1(arena: torch.Tensor, block: int, slots: torch.Tensor, kv: torch.Tensor, nope: int = 448):
    """Write tokens ``kv`` [n, 512] (float) at cache slots [n] (page * block + offset)."""
    page, off = (slots // block).long(), (slots % block).long()
    q, sf = quant_fp8(kv[:, :nope], 64)                                   # e4m3 [n, 448], [n, 7]
    data = torch.cat((q.view(torch.uint8), kv[:, nope:].to(torch.bfloat16).contiguous().view(torch.uint8)), -1)
    cols = off[:, None] * 576 + torch.arange(576, device=kv.device)
    arena[page[:, None], cols] = data
    exps = ((sf.contiguous().view(torch.int32) >> 23) & 0xFF).to(torch.uint8)
    exps = torch.cat((exps, torch.zeros_like(exps[:, :1])), -1)              # 7 exponents + pad
    cols = block * 576 + off[:, None] * 8 + torch.arange(8, device=kv.device)
    arena[page[:, None], cols] = exps


def write_index(arena: torch.Tensor, block: int, slots: torch.Tensor, k: torch.Tensor):
    """Write indexer keys ``k`` [n, 128] (float) at slots [n]: e4m3 per token, float32 UE8M0 scale."""
    d = k.shape[1]
    page, off = (slots // block).long(), (slots % block).long()
    q, sf = quant_fp8(k, d)
    cols = off[:, None] * d + torch.arange(d, device=k.device)
    arena[page[:, None], cols] = q.view(torch.uint8)
    cols = block * d + off[:, None] * 4 + torch.arange(4, device=k.device)
    arena[page[:, None], cols] = sf.contiguous().view(torch.uint8).view(-1, 4)


class PagedCaches:
    """The three caches for ``requests`` of up to ``max_tokens`` tokens each."""

    def __init__(self, cfg, requests: int, max_tokens: int, device, seed: int = 0):
        self.cfg = cfg
        self.block = cfg.cache_block
        self.tok_pages = -(-max_tokens // self.block)
        self.ent_pages = -(-(max_tokens // cfg.compress_ratio + 1) // self.block)
        g = torch.Generator(device="cpu").manual_seed(seed)

        def table(per_req):
            perm = torch.randperm(requests * per_req, generator=g).to(torch.int32)
            return perm.view(requests, per_req).to(device)

        self.swa_table = table(self.tok_pages)
        self.comp_table = table(self.ent_pages)
        self.index_table = table(self.ent_pages)
        self.swa_arena, self.swa = _model1_arena(requests * self.tok_pages, self.block, device)
        self.comp_arena, self.comp = _model1_arena(requests * self.ent_pages, self.block, device)
        d = cfg.index_dim
        self.index_arena = torch.zeros(requests * self.ent_pages, self.block * (d + 4), dtype=torch.uint8,
                                       device=device)
        self.index = self.index_arena.view(-1, self.block, 1, d + 4)

    @staticmethod
    def slots(table: torch.Tensor, req: int, positions: torch.Tensor, block: int) -> torch.Tensor:
        """Cache slots of positions [n] (-1 kept) of request ``req``."""
        pos = positions.clamp_min(0).long()
        s = table[req].long()[pos // block] * block + pos % block
        return torch.where(positions < 0, -1, s).to(torch.int32)

    def write_tokens(self, row_req, positions, kv):
        """Tokens of several requests at once: row r is request ``row_req[r]`` at ``positions[r]``."""
        pos = positions.long()
        slots = self.swa_table[row_req.long(), pos // self.block].long() * self.block + pos % self.block
        write_model1(self.swa_arena, self.block, slots, kv)

    def write_entries(self, req, entries, comp, index_keys):
        write_model1(self.comp_arena, self.block, self.slots(self.comp_table, req, entries, self.block), comp)
        write_index(self.index_arena, self.block, self.slots(self.index_table, req, entries, self.block),
                    index_keys)
