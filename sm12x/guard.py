"""The runtime correctness guard: an sm12x kernel proves itself on the user's GPU before it serves.

The first time a patched function that runs an sm12x op is called in a process, the op's
known-answer check runs first: its registry self-test (:mod:`sm12x.kernels.registry`) at the small
shapes, on the call's GPU, against the op's PyTorch reference. The verdict is kept for the process
and cached per (GPU name, compute capability, driver, Triton, sm12x) in a per-user cache folder
(``$XDG_CACHE_HOME/sm12x`` or ``~/.cache/sm12x``; never the mount), so a later process on the same
combination skips the check. An op that fails is not routed: the upstream original serves where
it can run (a GPU that is not SM12x under ``SM12X_FORCE=1``, or a framework's own indexer path
behind the fused top-k, or FlashInfer's own DeepSeek-V4 decode), otherwise every call raises one
line naming the op, the Triton version and the fix.

``SM12X_VERIFY``: ``once`` (default: check once per combination, trust the cache), ``always``
(check in every process, ignore the cache), ``off`` (no guard at all: the replacements are
installed unwrapped).

Rules of the guard, and why:

- Nothing runs at import or at patch time: the wrapper costs one list read per call once decided.
- The check never runs inside CUDA-graph capture or a torch.compile trace (both forbid its
  allocations and host syncs), nor before CUDA is initialised: such a call is served by sm12x
  unchecked and the decision waits for the next call outside them.
- Known-bad (Triton, GPU, op) combinations are refused before any check (``KNOWN_BAD``).
- The check saves and restores the RNG state of the CPU and of the GPU it runs on: the host's
  sampling seeds must not move because sm12x checked a kernel.
- Every record that runs the same ops gets the same verdict in a process, so a group of records
  that must agree (the deferred logits and the top-k that reads them) routes together.
"""
from __future__ import annotations

import functools
import os
import sys
import time
import types

from sm12x.frontends import callers

MODES = ("once", "always", "off")
CACHE_FILE = "verdicts.json"
CACHE_FORMAT = 1

# every indexer top-k record is checked with both fused top-k ops: the V4.1 candidate steps and the
# placeholder logits they read must be refused (or served) together
TOPK = ("indexer_topk", "candidate_topk")


class KnownBad:
    """A (Triton, GPU, op) combination refused without a check: ``triton`` a release range
    (:func:`sm12x.platform.in_range`), ``capabilities`` ("12.1", ...), ``ops`` (empty: every op),
    ``reason`` the user's line, ``unless_env`` an environment variable that lifts it. (A plain
    class: a dataclass costs a millisecond of import in every process that imports a framework.)"""

    def __init__(self, triton: str, capabilities: tuple, ops: tuple, reason: str, unless_env: str = ""):
        self.triton, self.capabilities, self.ops = triton, capabilities, ops
        self.reason, self.unless_env = reason, unless_env


# Triton 3.8.0's sm_120 miscompiles (triton #10726: MN-packed FP4 tl.dot_scaled gives wrong
# results; #11262: a batched (3-D) scaled dot fails to compile; backport #11734) hit no op here:
# the FP4 logits kernels pass K-packed 2-D operands, and the MoE kernels widen e2m1 to e4m3 before
# a 2-D dot_scaled. An op that starts to use either form belongs in this table for 3.8.0 on 12.0.
KNOWN_BAD = (
    KnownBad(triton="<3.6", capabilities=("12.1",), ops=(),
             reason="Triton before 3.6 bundles a ptxas (CUDA 12.8) that cannot assemble sm_121a "
                    "(triton #10331): use an image with Triton >= 3.6, or set TRITON_PTXAS_PATH to a "
                    "CUDA >= 12.9 ptxas", unless_env="TRITON_PTXAS_PATH"),
)

# records whose original runs on an SM12x GPU (the framework's own indexer path behind the fused
# top-k; FlashInfer's own DeepSeek-V4 decode for the shapes it serves): a refused op hands these
# back to it. Any other original is known to fail on SM12x, so a refused op there raises.
ORIGINAL_SERVES_ON_SM12X = ("vllm.flashinfer_dsv4.",)

PROCESS_VERDICTS: dict = {}  # op -> {"ok", "detail", "source", "ms"}; this process's verdicts
_ROUTES: dict = {}  # ops tuple -> (ok, detail) once decided in this process
_LOGGED: set = set()


class GuardError(RuntimeError):
    """A refused op with no upstream path to serve the call."""


def mode() -> str:
    """``SM12X_VERIFY`` (once, always, off); anything else is ``once``, with one warning line."""
    value = os.environ.get("SM12X_VERIFY", "once").strip().lower() or "once"
    if value not in MODES:
        _log("warning", f"SM12X_VERIFY={value!r} is not once, always or off: using once")
        return "once"
    return value


def _log(level, message):
    if message in _LOGGED:
        return
    _LOGGED.add(message)
    import logging

    # logger "sm12x", set up by the apply loop (which installs every guarded function)
    getattr(logging.getLogger("sm12x"), level)(message)


@functools.lru_cache(maxsize=None)
def _topk_records() -> frozenset:
    from sm12x.patches import indexer_topk

    return frozenset(p.name for p in indexer_topk.PATCHES)


@functools.lru_cache(maxsize=None)
def ops_by_factory() -> dict:
    """``{factory path: (op,)}``: the op behind every factory the op manifest lists under an
    upstream function an op backs (metadata and layout helpers, and the rules that send a
    framework to the op, follow their op: when the op is refused, the original's metadata must go
    with the original's kernel)."""
    from sm12x.kernels import manifest

    return {path: (op,) for path, (op, _api) in manifest.op_of_wrapper().items()}


def ops_for(patch) -> tuple:
    """The registry ops a record's replacement runs: every record of the indexer_topk set runs the
    fused top-k whatever its target (TOPK); any other runs the op its factory serves in the op
    manifest, and a record whose factory the manifest does not list (gates, expert-method choices)
    runs no op of ours and is not guarded."""
    if patch.name in _topk_records():
        return TOPK
    from sm12x.kernels.manifest import factory_path

    return ops_by_factory().get(factory_path(patch.make), ())


def original_serves(patch) -> bool:
    """Whether ``patch``'s original can serve a call on this GPU when its op is refused."""
    from sm12x import platform

    capability = platform.gpu_arch().capability
    if capability is not None and capability[0] != 12:  # SM12X_FORCE=1 on a Hopper / Blackwell DC
        return True
    return patch.name in _topk_records() or patch.name.startswith(ORIGINAL_SERVES_ON_SM12X)


# --- the combination and its cache ----------------------------------------------------------------

def combination(index: int = 0) -> str:
    """This machine's key for device ``index``: GPU name, compute capability, driver, Triton,
    sm12x (NVML only; no CUDA call)."""
    from sm12x import platform
    from sm12x.version import __version__

    identities = platform.gpu_identities()
    name, capability, driver = identities[index] if index < len(identities) else ("unknown GPU", "?", "?")
    return f"{name} | {capability} | driver {driver} | triton {_triton_version()} | sm12x {__version__}"


def _triton_version() -> str:
    from sm12x import platform

    module = sys.modules.get("triton")
    return getattr(module, "__version__", None) or platform.versions().get("triton") or "none"


def cache_dir():
    """The per-user cache folder, or None where there is none to use (no home, or a folder inside
    the sm12x package's own folder: the mount is never written)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    if not os.path.isabs(base):
        return None
    folder = os.path.join(base, "sm12x")
    bundle = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        if os.path.commonpath([os.path.realpath(folder), os.path.realpath(bundle)]) == os.path.realpath(bundle):
            return None
    except ValueError:
        pass
    return folder


def read_cache() -> dict:
    """Every cached verdict: {combination: {op: {"ok", "detail", "ms", "checked"}}}; {} when
    there is none or it cannot be read."""
    folder = cache_dir()
    if folder is None:
        return {}
    try:
        import json

        with open(os.path.join(folder, CACHE_FILE)) as f:
            data = json.load(f)
        if data.get("format") == CACHE_FORMAT and isinstance(data.get("verdicts"), dict):
            return data["verdicts"]
    except Exception:
        pass
    return {}


def _write_cache(key: str, op: str, verdict: dict) -> None:
    """Add one verdict to the cache (atomically: a temporary file renamed over the old one); a
    folder that cannot be written only costs the next process a check."""
    folder = cache_dir()
    if folder is None:
        return
    try:
        import json
        import tempfile

        verdicts = read_cache()
        verdicts.setdefault(key, {})[op] = verdict
        os.makedirs(folder, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".verdicts-", dir=folder)
        try:
            with os.fdopen(fd, "w") as f:
                json.dump({"format": CACHE_FORMAT, "verdicts": verdicts}, f, indent=1, sort_keys=True)
            os.replace(tmp, os.path.join(folder, CACHE_FILE))
        except BaseException:
            os.unlink(tmp)
            raise
    except Exception as e:
        _log("debug", f"sm12x: could not write the verdict cache in {folder}: {type(e).__name__}: {e}")


# --- one op's verdict -------------------------------------------------------------------------------

def known_bad(op: str, capability: str, triton: str) -> str:
    """Why (Triton ``triton``, GPU ``capability``, ``op``) is refused without a check, or ""."""
    from sm12x import platform

    for rule in KNOWN_BAD:
        if capability in rule.capabilities and (not rule.ops or op in rule.ops) \
                and platform.in_range(triton, rule.triton) \
                and not (rule.unless_env and os.environ.get(rule.unless_env)):
            return rule.reason
    return ""


def check_op(op: str, device: str) -> dict:
    """Run ``op``'s known-answer check on ``device`` ("cuda:N", or "cpu" under the Triton
    interpreter): the registry self-test at its small shapes against the op's reference, with
    the RNG states of the CPU and that GPU restored afterwards. {"ok", "detail", "ms"}."""
    import torch

    from sm12x.kernels import registry

    entry = next((o for o in registry.all_ops() if o.name == op), None)
    if entry is None:
        return {"ok": False, "detail": f"no op {op!r} in the registry", "ms": 0.0}
    # the registry runs its small (interpreter) shapes on any device but exactly "cuda"
    gpus = [torch.device(device).index or 0] if device.startswith("cuda") else []
    import contextlib

    on_device = torch.cuda.device(gpus[0]) if gpus else contextlib.nullcontext()  # Triton launches there
    t0 = time.perf_counter()
    try:
        with torch.random.fork_rng(devices=gpus), on_device, torch.inference_mode():
            rows = list(entry.selftest(device, False))
        bad = [r for r in rows if not r.get("ok")]
        if not rows:
            verdict = {"ok": False, "detail": "the self-test ran no case"}
        elif bad:
            r = bad[0]
            verdict = {"ok": False, "detail": f"wrong result at {r.get('case')}: max abs err "
                                              f"{r.get('max_abs', 0):.3g}, rel {r.get('max_rel', 0):.3g}"
                                              + (f" ({r['detail']})" if r.get("detail") else "")}
        else:
            verdict = {"ok": True, "detail": f"{len(rows)} case(s) match the reference"}
    except Exception as e:  # a compile error, an illegal instruction, ...
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        verdict = {"ok": False, "detail": f"{type(e).__name__}: {first}"[:300],
                   "transient": isinstance(e, getattr(torch, "OutOfMemoryError", MemoryError))}
    verdict["ms"] = round((time.perf_counter() - t0) * 1e3, 2)
    return verdict


def verdict(op: str, device: str) -> dict:
    """This process's verdict on ``op``: known-bad, the cache (``once``), else a check on
    ``device``; kept for the process, and cached per combination."""
    if op in PROCESS_VERDICTS:
        return PROCESS_VERDICTS[op]
    index = int(device.partition(":")[2] or 0) if device.startswith("cuda") else 0
    key = combination(index)
    capability = key.split(" | ")[1]
    bad = known_bad(op, capability, _triton_version())
    if bad:
        result = {"ok": False, "detail": bad, "source": "known-bad", "ms": 0.0}
    else:
        cached = read_cache().get(key, {}).get(op) if mode() == "once" else None
        if cached is not None and "ok" in cached:
            result = dict(cached, source="cache")
        else:
            result = dict(check_op(op, device), source="checked", checked=time.strftime("%Y-%m-%dT%H:%M:%S"))
            if not result.pop("transient", False):
                _write_cache(key, op, {k: result[k] for k in ("ok", "detail", "ms", "checked")})
    PROCESS_VERDICTS[op] = result
    return result


# --- routing -----------------------------------------------------------------------------------------

def _call_device(args, kwargs):
    """"cuda:N" of the call's first CUDA tensor, else of the current device when CUDA is already
    initialised; None when there is nothing to check on (CPU tensors: the interpreter; or CUDA
    not initialised yet, which the guard never does itself)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    for value in list(args) + list(kwargs.values()):
        if isinstance(value, (tuple, list)) and value:
            value = value[0]
        if isinstance(value, torch.Tensor):
            if value.is_cuda and not _is_fake(value):
                return f"cuda:{value.device.index or 0}"
            return None  # CPU (the interpreter), meta or a tracer's fake tensor: nothing to run on
    if torch.cuda.is_initialized():
        return f"cuda:{torch.cuda.current_device()}"
    return None


def _is_fake(tensor) -> bool:
    """A tensor without data (torch.compile's FakeTensor, a functional wrapper)."""
    return type(tensor).__name__ in ("FakeTensor", "FunctionalTensor") or tensor.device.type == "meta"


def _cannot_check_now() -> str:
    torch = sys.modules.get("torch")
    if torch is None:
        return ""
    compiler = getattr(torch, "compiler", None)
    if compiler is not None and getattr(compiler, "is_compiling", None) and compiler.is_compiling():
        return "inside a torch.compile trace"
    if torch.cuda.is_initialized() and torch.cuda.is_current_stream_capturing():
        return "inside CUDA-graph capture"
    return ""


def decide(ops: tuple, device: str):
    """(ok, detail) for a set of ops in this process (the first refused op's reason)."""
    if ops in _ROUTES:
        return _ROUTES[ops]
    decision = (True, "")
    for op in ops:
        v = verdict(op, device)
        if not v["ok"]:
            decision = (False, f"{op}: {v['detail']}")
            break
    _ROUTES[ops] = decision
    return decision


def refusal(patch, detail: str) -> str:
    """The one line a refused op with no upstream path raises."""
    return (f"sm12x: {patch.target} cannot be served on this GPU: {detail} (Triton {_triton_version()}); "
            f"use an image with another Triton release, or SM12X_DISABLE=1 (or SM12X_SKIP={patch.name}) "
            f"to run the image's own code")


def wrap(patch, replacement, original):
    """``replacement`` guarded: its first call (outside capture and tracing, with CUDA up)
    decides, for the process, whether ``replacement`` or ``original`` serves, or every call
    raises :class:`GuardError`. Unchanged when the record runs no op, ``SM12X_VERIFY=off``, or
    the replacement is not a plain function."""
    ops = ops_for(patch)
    if not ops or not isinstance(replacement, types.FunctionType) or mode() == "off":
        return replacement
    route = [None]

    def first_call(args, kwargs):
        device = _call_device(args, kwargs)
        why_not = _cannot_check_now() if device is not None else "no CUDA device in use yet"
        if device is None or why_not:
            _log("debug", f"sm12x: {patch.name} served unchecked ({why_not}); the check waits for the next call")
            return replacement
        try:
            ok, detail = decide(ops, device)
        except Exception as e:  # the guard's own machinery must never break the host's call
            _log("warning", f"sm12x: the known-answer check of {', '.join(ops)} could not run "
                            f"({type(e).__name__}: {e}); {patch.name} serves unchecked")
            ok, detail = True, ""
        if ok:
            route[0] = replacement
        elif original_serves(patch):
            _log("warning", f"sm12x: {detail} (Triton {_triton_version()}); {patch.target} is served by "
                            f"the image's own code")
            route[0] = original
        else:
            message = refusal(patch, detail)
            _log("error", message)

            def refuse(*args, **kwargs):
                raise GuardError(message)

            route[0] = refuse
        return route[0]

    @functools.wraps(replacement)
    def guarded(*args, **kwargs):
        serve = route[0]
        if serve is None:
            serve = first_call(args, kwargs)
        return serve(*args, **kwargs)

    guarded.__sm12x_guarded__ = ops
    # front ends that read their caller's frame look past this wrapper (sm12x.frontends.callers)
    callers.WRAPPER_CODES.add(guarded.__code__)
    return guarded


def status_rows() -> list:
    """The cached verdicts of this machine's GPUs (``sm12x status``): one dict per (combination,
    op), and this process's own verdicts (``status --apply`` after a call)."""
    rows = []
    from sm12x import platform

    keys = {combination(i) for i in range(max(1, len(platform.gpu_identities())))}
    for key, ops in sorted(read_cache().items()):
        if key not in keys:
            continue
        for op, v in sorted(ops.items()):
            rows.append({"combination": key, "op": op, "ok": bool(v.get("ok")), "detail": v.get("detail", ""),
                         "ms": v.get("ms"), "checked": v.get("checked", "")})
    for op, v in sorted(PROCESS_VERDICTS.items()):
        if v.get("source") != "cache":
            rows.append({"combination": "this process", "op": op, "ok": bool(v["ok"]), "detail": v["detail"],
                         "ms": v.get("ms"), "checked": v.get("source", "")})
    return rows
