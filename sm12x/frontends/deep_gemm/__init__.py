"""DeepGEMM's API surface: ``indexer`` (the lightning-indexer functions), ``wrappers`` (the
factories the patch records install)."""
