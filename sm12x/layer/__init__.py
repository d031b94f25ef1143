"""One DeepSeek-V4-Flash decoder layer end to end through the calls sm12x patches.

``forward.layer_forward`` is the layer (its docstring gives the order and where vLLM and SGLang
differ), ``patched.PatchedBackend`` makes its kernel calls through the upstream-compatible
``deep_gemm`` / ``flash_mla`` front ends, ``reference.ReferenceBackend`` computes the same layer in
float32, and ``run`` runs prefill, decode and spec decode through a stack of layers, reporting the
error at every op boundary against its budget (``run_check``) and the time per step (``time_layer``).
Used by ``sm12x selftest --layer`` and ``scripts/bench_layer.py``.
"""
