"""``sm12x status``: the platform facts and what each patch would do (or did, with ``--apply``)."""
from __future__ import annotations

import functools
import json
import sys


def status_data(apply: bool = False) -> dict:
    """The ``status --json`` document."""
    from sm12x import apply as applier
    from sm12x import hooks, platform, shims

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
        "versions": platform.versions(),
        "patches": rows,
        "shims": {name: shims.shim_state(name) for name in shims.SHIMS},
        "skip": {"items": applier.skip_items(), "unmatched": applier.unmatched_skips()},
        "bootstrap": {
            "sitecustomize": getattr(site, "__file__", None) if ours else None,
            "chained": getattr(site, "_sm12x_chained", None) if ours else None,
            "active": bool(ours and getattr(site, "_sm12x_active", False)),
        },
    }


def print_status(data: dict, stream=None) -> None:
    """The human-readable form of :func:`status_data`."""
    print_ = functools.partial(print, file=stream or sys.stdout)
    a = data["arch"]
    cap = "no GPU" if a["capability"] is None else "%d.%d" % tuple(a["capability"])
    print_(f"arch: {cap} (source: {a['source']}; {a['detail']})")
    print_(f"SM12x patches: {'yes' if a['sm12x_patches'] else 'no'} - {a['why']}")
    b = data["bootstrap"]
    print_(f"bootstrap: {'active' if b['active'] else 'not active'}"
           f" (sitecustomize: {b['sitecustomize']}; chained: {b['chained']})")
    print_("versions:")
    for name, v in data["versions"].items():
        print_(f"  {name:18} {v or '-'}")
    print_("shims: " + ", ".join(f"{k}: {v}" for k, v in data["shims"].items()))
    skip = data.get("skip") or {}
    if skip.get("items"):
        print_("SM12X_SKIP: " + ", ".join(skip["items"])
               + (f" (names no patch: {', '.join(skip['unmatched'])})" if skip.get("unmatched") else ""))
    print_("patches:")
    for p in data["patches"]:
        reason = f"  ({p['reason']})" if p["reason"] else ""
        print_(f"  {p['state']:11} {p['name']:40} {p['target']}{reason}")


def run(as_json: bool = False, apply: bool = False) -> int:
    """Print the status (JSON or text); 1 when a patch failed."""
    data = status_data(apply=apply)
    if as_json:
        print(json.dumps(data, indent=2))
    else:
        print_status(data)
    return 1 if any(p["state"] == "failed" for p in data["patches"]) else 0
