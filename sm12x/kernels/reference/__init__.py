"""Plain PyTorch versions of every op, the source of truth for tests and the self-test.
One module per op family: ``sparse_mla`` (FlashMLA sparse decode), ``indexer`` (DeepGEMM MQA logits
and top-k)."""
