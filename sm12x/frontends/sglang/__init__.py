"""SGLang's DeepSeek-V4 indexer surface: ``indexer`` (logits -> top-k -> page slots in SGLang's
conventions, torch), ``wrappers`` (the factories the patch records in
:mod:`sm12x.patches.indexer_topk` install; stdlib only)."""
