"""Command line: ``sm12x`` / ``python -m sm12x``.

  status [--json] [--apply]   arch, versions and what each patch would do (or did, with --apply)
  selftest [...]              every kernel against its reference on this machine
  bundle DIR                  write a self-contained folder to mount into containers
  launch, doctor              run / check a container with the bundle mounted
"""
from __future__ import annotations

import argparse
import sys


def cmd_status(args) -> int:
    from sm12x.commands import status

    return status.run(as_json=args.json, apply=args.apply)


def cmd_bundle(args) -> int:
    from sm12x.commands import bundle

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

    from sm12x.commands import doctor, launch, selftest  # stdlib-only at import; heavy parts are lazy

    selftest.add_selftest_command(sub)
    launch.add_launch_command(sub)
    doctor.add_doctor_command(sub)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
