"""FlashMLA's API surface: ``api`` (FlashMLA-compatible functions), ``wrappers`` (the factories the
patch records install)."""
