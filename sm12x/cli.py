"""Command line: ``sm12x`` / ``python -m sm12x``.

  status [--json] [--apply]   arch, versions and what each patch would do (or did, with --apply)
  selftest [...]              every kernel against its reference on this machine
  bundle DIR                  write a self-contained folder to mount into containers
  launch, doctor              run / check a container with the bundle mounted
"""
from __future__ import annotations

import argparse
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


def cmd_status(args) -> int:
    data = status_data(apply=args.apply)
    if args.json:
        print(json.dumps(data, indent=2))
    else:
        print_status(data)
    return 1 if any(p["state"] == "failed" for p in data["patches"]) else 0


def cmd_bundle(args) -> int:
    from sm12x import bundle

    path = bundle.write_bundle(args.dir, compile_with=[] if args.no_compile else args.compile_with)
    print(f"bundle written to {path}")
    print(f"mount it with: -v {path}:/sm12x:ro -e PYTHONPATH=/sm12x")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sm12x", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("status", help="arch, versions and the patch plan")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--apply", action="store_true",
                   help="import the installed targets and report actual outcomes")
    p.set_defaults(func=cmd_status)

    p = sub.add_parser("bundle", help="write a self-contained mount folder")
    p.add_argument("dir")
    p.add_argument("--compile-with", action="append", metavar="PYTHON",
                   help="also write .pyc files for this interpreter (repeatable; default: this one). "
                        "Use the image's python version, e.g. python3.12")
    p.add_argument("--no-compile", action="store_true", help="write no byte code")
    p.set_defaults(func=cmd_bundle)

    from sm12x import doctor, launch, selftest  # stdlib-only at import; heavy parts are lazy

    selftest.add_selftest_command(sub)
    launch.add_launch_command(sub)
    doctor.add_doctor_command(sub)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
