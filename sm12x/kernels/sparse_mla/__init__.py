"""Sparse MLA attention (FlashMLA semantics): the split-KV decode kernel over the FP8 caches, the prefill over bf16 rows, the cache formats, the PyTorch reference."""
