"""What sm12x computes: one sub-package per op family (``sparse_mla``, ``indexer``, ``gemm``,
``moe``), each op owning its Triton kernel(s), launcher, validation and per-arch configs, with its
plain PyTorch reference (``<family>/reference.py``) and its registry entries
(``<family>/cases.py``, listed by :mod:`sm12x.kernels.registry`); ``common`` holds what every op
shares (argument checks, launch configs, tolerances, the sm_120/sm_121 compile check). Importing
this package imports nothing heavy; import the op modules directly."""
