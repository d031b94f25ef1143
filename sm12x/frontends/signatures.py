"""Reading an original function's signature, shared by every front end's wrappers."""
from __future__ import annotations


def signature_of(fn):
    """``inspect.signature(fn)``, or None where there is none to read (compiled functions)."""
    import inspect

    try:
        return inspect.signature(fn)
    except (TypeError, ValueError):
        return None


def takes_args(signature) -> bool:
    """Whether ``signature`` has a ``*args`` parameter: a stub, or an API that reads nothing by
    name (FlashMLA's current ``get_mla_metadata(*args, **kwargs)``)."""
    return signature is not None and any(p.kind is p.VAR_POSITIONAL for p in signature.parameters.values())
