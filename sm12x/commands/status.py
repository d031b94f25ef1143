"""``sm12x status``: the platform facts and what each patch would do (or did, with ``--apply``).

The text form is a short summary (GPU, frameworks found, how many patches apply and why the others
do not, what serves DeepSeek-V4's MoE experts per installed release: ``moe_paths``), then the
patches that apply or failed; ``--verbose`` lists every patch, ``--json`` prints
everything (``status_data``).
"""
from __future__ import annotations

import functools
import json
import os
import platform as _python
import sys
import textwrap

from sm12x.apply import ARCH_ONLY  # how sm12x.apply.exact_arch's skip reasons start

FRAMEWORK_KEYS = ("vllm", "sglang")
# libraries whose absence is expected on most machines: named once in the summary, not per patch
NOT_INSTALLED = " is not installed"
BOOTSTRAP_OFF = (
    "not active in this process: sm12x's sitecustomize.py did not run when this Python started, so "
    "nothing is patched here. That is expected outside a container. Inside one it runs when the bundle "
    "is mounted and PYTHONPATH starts with it (-v BUNDLE:/sm12x:ro -e PYTHONPATH=/sm12x); python -I, -E "
    "or -S and SM12X_DISABLE=1 turn it off. `sm12x doctor --image IMAGE` checks an image.")


def status_data(apply: bool = False) -> dict:
    """The ``status --json`` document."""
    from sm12x import apply as applier
    from sm12x import hooks, platform, shims
    from sm12x.commands import model_paths, moe_paths
    from sm12x.kernels.sparse_mla import precision
    from sm12x.patches import all_patches

    hooks.install_watcher()
    arch = platform.gpu_arch()
    rows = applier.apply_installed() if apply else applier.plan()
    site = sys.modules.get("sitecustomize")
    ours = site is not None and hasattr(site, "_sm12x_active")
    ok, why = platform.wants_sm12x_patches(arch)
    return {
        "arch": {"capability": list(arch.capability) if arch.capability else None,
                 "source": arch.source, "devices": [list(c) for c in arch.devices],
                 "detail": arch.detail, "sm12x_patches": ok, "why": why},
        "python": {"version": _python.python_version(), "executable": sys.executable,
                   "cache_tag": sys.implementation.cache_tag},
        "versions": platform.versions(),
        "torch_build": platform.torch_build(),
        "patches": rows,
        "moe": moe_paths.moe_rows(platform.versions(), rows),
        # per op of the manifest, the upstream calls that reach it (records and layers, with state)
        "ops": applier.op_routes(rows),
        "attention": precision.serving(arch.capability, platform.versions().get("triton")),
        "models": model_paths.model_rows(platform.versions(), rows),
        "shims": {name: shims.shim_state(name) for name in shims.SHIMS},
        "skip": {"items": applier.skip_items(), "unmatched": applier.unmatched_skips()},
        # records for one compute capability only (GB10's gates): shown on that GPU even when skipped
        "exact_arch": exact_arch_records(all_patches()),
        "verify": verify_data(),
        "bootstrap": {
            "sitecustomize": getattr(site, "__file__", None) if ours else None,
            "chained": getattr(site, "_sm12x_chained", None) if ours else None,
            "active": bool(ours and getattr(site, "_sm12x_active", False)),
            # ran, but SM12X_DISABLE=1 kept the watcher off
            "disabled": bool(ours and not getattr(site, "_sm12x_active", False)
                             and os.environ.get("SM12X_DISABLE") == "1"),
        },
    }


def verify_data() -> dict:
    """The runtime guard's mode, cache folder and verdicts for this machine's GPUs."""
    from sm12x import guard

    try:
        rows = guard.status_rows()
    except Exception as e:  # a status must print whatever the cache holds
        rows = [{"combination": "?", "op": "?", "ok": False, "detail": f"cache unreadable: {e}"}]
    return {"mode": guard.mode(), "cache": guard.cache_dir(), "verdicts": rows}


def _print_verify(v: dict, print_) -> None:
    if v["mode"] == "off":
        print_("verify:     off (SM12X_VERIFY=off: kernels serve without a known-answer check)")
        return
    rows = v["verdicts"]
    where = v["cache"] or "no cache folder: verdicts last one process"
    if not rows:
        print_(textwrap.fill(f"SM12X_VERIFY={v['mode']}; no op checked on this GPU yet (each is checked on "
                             f"its first call; cache {where})", 100, initial_indent="verify:     ",
                             subsequent_indent=" " * 12))
        return
    failed = [r for r in rows if not r["ok"]]
    print_(textwrap.fill(f"SM12X_VERIFY={v['mode']}; {len(rows) - len(failed)} op(s) passed their known-answer "
                         f"check on this GPU, {len(failed)} refused (cache {where})", 100,
                         initial_indent="verify:     ", subsequent_indent=" " * 12))
    for r in failed:
        print_(textwrap.fill(f"REFUSED {r['op']} [{r['combination']}]: {r['detail']}", 100,
                             initial_indent="            ", subsequent_indent=" " * 14))


def absent_library(reason: str) -> str:
    """The library a skip reason says is not installed ("flash_mla is not installed"), or "" (a
    reason such as "needs torch, which is not installed" names a runtime need, not a target)."""
    name = reason[: -len(NOT_INSTALLED)] if reason.endswith(NOT_INSTALLED) else ""
    return name if name.replace("_", "").replace(".", "").isalnum() else ""


def skip_category(reason: str, arch_why: str) -> str:
    """A short class of a skip reason, for the summary's counts."""
    if reason == arch_why:
        return "not on an SM12x GPU"
    if absent_library(reason):
        return "library not installed"
    if "SM12X_SKIP" in reason:
        return "turned off by SM12X_SKIP"
    if " outside " in reason:
        return "version outside the checked range"
    if reason.startswith(ARCH_ONLY):
        return "for another compute capability"
    if " not found" in reason or "does not exist in the installed" in reason \
            or " of the installed version has no " in reason:
        return "target not in the installed version"
    return reason  # e.g. "needs torch, which is not installed"


def exact_arch_records(patches) -> dict:
    """{record name: "12.1"} for the records of one compute capability only."""
    from sm12x import platform

    out = {}
    for p in patches:
        if p.arch in ("sm12x", "any"):
            continue
        try:
            out[p.name] = "%d.%d" % platform.parse_arch(p.arch)
        except platform.ArchError:
            out[p.name] = p.arch
    return out


def arch_gate_rows(data: dict) -> list:
    """The patch rows of records for exactly this GPU's compute capability (``arch`` "12.1": the
    frameworks' gates that answer GB10 differently from 12.0), whatever their state."""
    cap = data["arch"]["capability"]
    label = "%d.%d" % tuple(cap) if cap else None
    exact = data.get("exact_arch") or {}
    return [p for p in data["patches"] if label and exact.get(p["name"]) == label]


def summary(data: dict) -> dict:
    """Counts per state and per skip category: {"applied": n, ..., "skipped_by": {category: n}}."""
    out: dict = {"skipped_by": {}}
    why = data["arch"]["why"]
    for p in data["patches"]:
        out[p["state"]] = out.get(p["state"], 0) + 1
        if p["state"] == "skipped":
            cat = skip_category(p.get("reason") or "", why)
            out["skipped_by"][cat] = out["skipped_by"].get(cat, 0) + 1
    return out


def _gpu_line(a: dict) -> str:
    if a["source"] == "invalid":
        return f"invalid SM12X_ARCH ({a['detail']})"
    if a["capability"] is None:
        return f"none found ({a['detail']}): SM12x patches off"
    cap = "%d.%d" % tuple(a["capability"])
    where = "pretended by SM12X_ARCH" if a["source"] == "env" else (
        f"NVML, {len(a['devices'])} visible: " + ", ".join("%d.%d" % tuple(c) for c in a["devices"]))
    verdict = "SM12x patches on" if a["sm12x_patches"] else "SM12x patches off"
    return f"compute capability {cap} ({where}): {verdict}" + (
        "" if a["why"].startswith("SM12x GPU") else f" ({a['why']})")


def print_status(data: dict, stream=None, verbose: bool = False) -> None:
    """The human-readable form of :func:`status_data`."""
    print_ = functools.partial(print, file=stream or sys.stdout)
    a, versions = data["arch"], data["versions"]
    py = data.get("python") or {}
    print_(textwrap.fill(_gpu_line(a), 100, initial_indent="GPU:        ", subsequent_indent=" " * 12))
    found = [f"{k} {v}" for k, v in versions.items() if v]
    frameworks = [k for k in FRAMEWORK_KEYS if versions.get(k)]
    print_("frameworks: " + (", ".join(frameworks) if frameworks else "no vLLM or SGLang installed")
           + (f"; libraries: {', '.join(found)}" if found else "; none of the libraries sm12x patches"))
    if py:
        print_(f"python:     {py['version']} ({py['executable']})")
    b = data["bootstrap"]
    chained = f"; ran the image's own {b['chained']} first" if b["chained"] else ""
    if b["active"]:
        print_(f"bootstrap:  active ({b['sitecustomize']}{chained})")
    elif b.get("disabled"):
        print_(textwrap.fill(f"ran, but SM12X_DISABLE=1: nothing is patched in this process ({b['sitecustomize']}"
                             f"{chained})", 100, initial_indent="bootstrap:  ", subsequent_indent=" " * 12))
    else:
        print_(textwrap.fill(BOOTSTRAP_OFF, 100, initial_indent="bootstrap:  ", subsequent_indent=" " * 12))
    counts = summary(data)
    parts = [f"{counts.get(s, 0)} {label}" for s, label in
             (("applied", "applied"), ("would-apply", "would apply"), ("failed", "failed"),
              ("retired", "retired (fixed upstream)")) if counts.get(s) or s in ("applied", "would-apply")]
    skipped = counts.get("skipped", 0)
    if skipped:
        by = ", ".join(f"{n} {cat}" for cat, n in sorted(counts["skipped_by"].items(), key=lambda kv: -kv[1]))
        parts.append(f"{skipped} skipped ({by})")
    print_(f"patches:    {len(data['patches'])}: " + ", ".join(parts))
    absent = sorted({absent_library(p.get("reason") or "") for p in data["patches"]
                     if p["state"] == "skipped" and absent_library(p.get("reason") or "")})
    if absent:
        print_(f"            not installed here: {', '.join(absent)}")
    skip = data.get("skip") or {}
    if skip.get("items"):
        print_(f"SM12X_SKIP: {', '.join(skip['items'])}")
    if skip.get("unmatched"):
        print_(f"WARNING:    SM12X_SKIP names no sm12x patch: {', '.join(skip['unmatched'])} "
               "(a typo skips nothing; `sm12x status --verbose` lists the names)")
    shims = [f"{k}: {v.replace(a['why'], 'not on an SM12x GPU')}" for k, v in (data.get("shims") or {}).items()
             if not v.startswith("off (") or verbose]
    if shims:
        print_("stand-ins:  " + ", ".join(shims))
    if data.get("verify"):
        _print_verify(data["verify"], print_)
    gates = arch_gate_rows(data)
    if gates:
        listed = ", ".join(f"{p['name']} {p['state']}" + (f" ({p['reason']})" if p.get("reason") else "")
                           for p in gates)
        text = f"{len(gates)} for this GPU's compute capability only: {listed}"
        print_(textwrap.fill(text, 100, initial_indent="gates:      ", subsequent_indent=" " * 12))
    for m in data.get("moe") or ():
        via = f" [{m['via']}]" if m["via"] else ""
        print_(textwrap.fill(f"{m['framework']} {m['version']}: {m['experts']}: {m['serves']}{via}", 100,
                             initial_indent="MoE:        ", subsequent_indent=" " * 14))
    for op, routes in (data.get("ops") or {}).items():
        serving = [r for r in routes if verbose or r["state"] in ("applied", "would-apply")]
        if serving:
            calls = ", ".join(sorted({f"{r['api']} ({r['state']})" if verbose else r["api"] for r in serving}))
            print_(textwrap.fill(f"{op} <- {calls}", 100, initial_indent="op:         ",
                                 subsequent_indent=" " * 14))
    if data.get("attention"):
        print_(textwrap.fill(data["attention"], 100, initial_indent="attention:  ", subsequent_indent=" " * 12))
    for m in data.get("models") or ():
        via = f" [{m['via']}]" if m["via"] else ""
        print_(textwrap.fill(f"{m['framework']} {m['version']}: {m['part']}: {m['serves']}{via}", 100,
                             initial_indent="models:     ", subsequent_indent=" " * 14))
    rows = [p for p in data["patches"] if verbose or p["state"] not in ("skipped",)]
    if rows:
        print_("")
        width = max(len(p["name"]) for p in rows)
        for p in rows:
            reason = p.get("reason") or ""
            if reason == a["why"] and not a["sm12x_patches"]:
                reason = "not on an SM12x GPU (see GPU above)"
            print_(f"  {p['state']:11} {p['name']:{width}}  {p['target']}" + (f"  ({reason})" if reason else ""))
    hidden = len(data["patches"]) - len(rows)
    if hidden:
        print_(f"\n{hidden} skipped patches not listed: `sm12x status --verbose` lists every patch and why")


def _json_only_on_stdout(apply: bool) -> dict:
    """``status_data`` with this process's file descriptor 1 sent to stderr while it runs and for
    the rest of the process, the JSON alone going to the original stdout: frameworks imported by
    ``--apply`` print their log lines on stdout (vLLM's logger holds ``sys.stdout``, whose
    descriptor is 1), before the JSON and at exit, and a script reading it must get only the JSON."""
    sys.stdout.flush()
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    data = status_data(apply=apply)
    out.write(json.dumps(data, indent=2) + "\n")
    out.flush()
    return data


def run(as_json: bool = False, apply: bool = False, verbose: bool = False) -> int:
    """Print the status (JSON or text); 1 when a patch failed."""
    if as_json:
        data = _json_only_on_stdout(apply)
    else:
        data = status_data(apply=apply)
        print_status(data, verbose=verbose)
    return 1 if any(p["state"] == "failed" for p in data["patches"]) else 0
