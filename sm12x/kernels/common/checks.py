"""Input validation shared by the kernel launchers: every bad input is a ValueError that names the
op, the argument, what came and what is supported."""
from __future__ import annotations


def _text(x):
    return x() if callable(x) else x


def bad(op: str, arg: str, got, supported) -> ValueError:
    """``got`` / ``supported`` may be callables returning the text (formatted only on failure)."""
    return ValueError(f"sm12x {op}: argument '{arg}' got {_text(got)}; supported: {_text(supported)}")


def unsupported(op: str, arg: str, got, supported: str) -> NotImplementedError:
    return NotImplementedError(f"sm12x {op}: argument '{arg}' got {got}; supported: {supported}")


def require(cond: bool, op: str, arg: str, got, supported) -> None:
    """Raise ``bad(...)`` unless ``cond``; pass ``lambda: f"..."`` texts on hot paths."""
    if not cond:
        raise bad(op, arg, got, supported)


def require_dtype(t, dtypes, op: str, arg: str) -> None:
    if t.dtype not in dtypes:
        raise bad(op, arg, f"dtype {t.dtype}", " or ".join(str(d) for d in dtypes))


def require_shape(t, shape, op: str, arg: str) -> None:
    """``shape`` may hold None for any size."""
    ok = t.dim() == len(shape) and all(s is None or s == g for s, g in zip(shape, t.shape))
    if not ok:
        want = "[" + ", ".join("*" if s is None else str(s) for s in shape) + "]"
        raise bad(op, arg, f"shape {list(t.shape)}", f"shape {want}")


def require_same_device(op: str, ref, **tensors) -> None:
    for name, t in tensors.items():
        if t is not None and t.device != ref.device:
            raise bad(op, name, f"device {t.device}", f"the device of q ({ref.device})")
