"""How upstream libraries call sm12x: one sub-package per replaced API surface (FlashMLA, DeepGEMM,
SGLang's own entry points). Each reads a call by the original's signature, translates API eras,
decides whether the call is ours, and calls an op in :mod:`sm12x.kernels`. The only place that
knows a caller's conventions. ``wrappers`` modules (stdlib only) hold the factories the patch
records install; the API modules beside them import torch."""
