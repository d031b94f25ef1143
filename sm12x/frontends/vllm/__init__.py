"""vLLM's sparse-attention indexer surface: ``indexer`` (logits -> top-k in vLLM's conventions,
torch), ``wrappers`` (the factories the patch records in :mod:`sm12x.patches.indexer_topk`
install; stdlib only)."""
