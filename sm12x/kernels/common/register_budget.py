"""Register budgets (the ``maxnreg`` launch option) for the indexer kernels.

A configuration's ``maxnreg`` is tuned with one Triton; another Triton's ptxas may need more
registers for the same kernel and spill under it. Triton 3.6 (still in framework images) spills
40-416 B in sm_120/sm_121 prefill-logits variants that compile spill-free under 3.8 and 3.9 with the
configured 192. So a kernel variant is compiled with each budget of
``budgets`` in turn and launched with the first that does not spill (the last if all do). The
compile check (``compile_check.compile_kernel``) follows the same order.
"""
from __future__ import annotations

MAX_REGISTERS = 255  # the most a thread can address


def budgets(maxnreg: int | None) -> list:
    """Budgets to try, in order: the configuration's, ptxas' own choice (None), then the maximum.
    ptxas left to itself sometimes keeps 128 registers and spills where 255 would not."""
    out = []
    for b in (maxnreg, None, MAX_REGISTERS):
        if b not in out:
            out.append(b)
    return out


def as_option(budget: int | None) -> dict:
    return {} if budget is None else {"maxnreg": budget}


_CHOSEN: dict = {}


def launch_budget(kernel, args, kwargs: dict, maxnreg: int | None, device) -> dict:
    """The ``maxnreg`` option (as a launch kwarg dict) for this variant of ``kernel``: the first of
    ``budgets(maxnreg)`` it compiles under without spilling. Each variant is compiled on its first
    call only (``kernel.warmup``, which also fills the launch cache); later calls hit a dict."""
    key = (kernel, device.index, maxnreg) + tuple(kwargs.items())
    hit = _CHOSEN.get(key)
    if hit is not None:
        return hit
    options = budgets(maxnreg)
    chosen = as_option(options[-1])
    for budget in options:
        try:
            compiled = kernel.warmup(*args, grid=(1,), **kwargs, **as_option(budget))
            compiled._init_handles()
        except Exception:  # e.g. ptxas: too few registers for one instruction
            continue
        if not compiled.n_spills:
            chosen = as_option(budget)
            break
    _CHOSEN[key] = chosen
    return chosen
