"""What sm12x computes: one sub-package per op family (``sparse_mla``, ``indexer``, ``gemm``,
``moe``), each op owning its Triton kernel(s), launcher, validation and per-arch configs, with its
plain PyTorch reference (``<family>/reference.py``) and its self-test cases (``<family>/cases.py``);
:mod:`sm12x.kernels.manifest` declares every op once (and the upstream functions it backs), and
:mod:`sm12x.kernels.registry` turns it into the ops the self-test, compile check and benchmarks
iterate; ``common`` holds what every op
shares (argument checks, launch configs, tolerances, the sm_120/sm_121 compile check). Importing
this package imports nothing heavy; import the op modules directly."""
