"""Command line: ``sm12x`` / ``python -m sm12x``. Argument parsing and user-facing errors only; each
command lives in ``sm12x.commands``. A user error (a bad argument, a bad ``SM12X_ARCH``, a missing
path) is one line on stderr naming the argument and the fix, exit code 2, never a traceback."""
from __future__ import annotations

import argparse
import sys

RAW = argparse.RawDescriptionHelpFormatter

DESCRIPTION = """\
sm12x runs DeepSeek-V4-Flash, DeepSeek-V3.2 and GLM-5 on SM12x GPUs (RTX PRO 6000, RTX 5090,
DGX Spark) in stock vLLM and SGLang containers: you mount one folder (the bundle) into the
container and it swaps the kernels that have no SM12x build for its own Triton kernels.

examples:
  python3 -m sm12x bundle ./sm12x-bundle                   # the folder to mount
  python3 -m sm12x doctor --image vllm/vllm-openai:TAG     # will it take effect in that image?
  python3 -m sm12x launch vllm --model /models/DeepSeek-V4-Flash --tp 2 --dry-run
  python3 -m sm12x status                                  # inside a container: what applies here
  python3 -m sm12x selftest                                # every kernel against its reference here
  python3 -m sm12x selftest --layer                        # V4-Flash layers end to end, with decode / prefill times
  python3 -m sm12x contract vllm-0.34.0-*.whl              # do the patch records fit that release?
"""

STATUS_HELP = """\
Show what sm12x does in this Python environment: the GPU it sees, the frameworks installed, and
for every patch whether it applies, and if not, why. Nothing is imported or changed unless --apply
is given.

examples:
  python3 -m sm12x status                 # summary, then the patches that apply
  python3 -m sm12x status --verbose       # every patch, with the reason for each one skipped
  SM12X_ARCH=12.0 python3 -m sm12x status # plan as if on an RTX PRO 6000 (no GPU needed)
"""

BUNDLE_HELP = """\
Write the folder you mount into containers (-v DIR:/sm12x:ro -e PYTHONPATH=/sm12x): sm12x's
bootstrap (sitecustomize.py), its package and its plugin registration, with byte code for the
image's Python. DIR must be new, empty, or a bundle written before: then only the files that
bundle wrote are replaced, and nothing else in DIR is touched.

examples:
  python3 -m sm12x bundle ./sm12x-bundle
  python3 -m sm12x bundle ./sm12x-bundle --compile-with python3.12   # images with Python 3.12
"""


def cmd_status(args) -> int:
    from sm12x import platform
    from sm12x.commands import status

    platform.check_arch_env()
    return status.run(as_json=args.json, apply=args.apply, verbose=args.verbose)


def cmd_bundle(args) -> int:
    from sm12x.commands import bundle

    info = bundle.write_bundle(args.dir, compile_with=[] if args.no_compile else args.compile_with)
    how = "replaced the previous bundle with" if info["replaced"] else "wrote"
    kept = f"; {info['kept']} other file(s) in it left as they were" if info["kept"] else ""
    code = ", ".join(info["byte_code"]) or "none (every process compiles the bootstrap: a few ms more)"
    print(f"bundle: {how} {info['files']} files in {info['path']}{kept}")
    print(f"byte code for: {code}")
    print(f"mount it with: -v {info['path']}:/sm12x:ro -e PYTHONPATH=/sm12x")
    if info.get("private"):
        print(f"sm12x bundle: warning: {info['path']} is not readable by other users, so a container user "
              f"other than you cannot read the bundle: chmod 755 {info['path']}", file=sys.stderr)
    return 0


def build_parser() -> argparse.ArgumentParser:
    from sm12x.version import __version__

    parser = argparse.ArgumentParser(prog="sm12x", description=DESCRIPTION, formatter_class=RAW)
    parser.add_argument("--version", action="version", version=f"sm12x {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("status", help="what sm12x does here: GPU, frameworks, which patches apply and why",
                       description=STATUS_HELP, formatter_class=RAW)
    p.add_argument("--verbose", "-v", action="store_true", help="list every patch, skipped ones included")
    p.add_argument("--json", action="store_true", help="everything, as JSON (for scripts)")
    p.add_argument("--apply", action="store_true",
                   help="import the installed frameworks first and report what really applied")
    p.set_defaults(func=cmd_status)

    p = sub.add_parser("bundle", help="write the folder to mount into containers",
                       description=BUNDLE_HELP, formatter_class=RAW)
    p.add_argument("dir", metavar="DIR", help="new, empty, or previous bundle folder")
    p.add_argument("--compile-with", action="append", metavar="PYTHON",
                   help="write byte code for this interpreter (repeatable; default: the one running sm12x). "
                        "Give the image's Python version, e.g. python3.12")
    p.add_argument("--no-compile", action="store_true", help="write no byte code")
    p.set_defaults(func=cmd_bundle)

    from sm12x.commands import contract, doctor, launch, selftest  # stdlib-only at import; heavy parts are lazy

    selftest.add_selftest_command(sub)
    launch.add_launch_command(sub)
    doctor.add_doctor_command(sub)
    contract.add_contract_command(sub)
    return parser


def _user_errors() -> tuple:
    from sm12x.commands.bundle import BundleError
    from sm12x.commands.contract import ContractError
    from sm12x.commands.launch import LaunchError
    from sm12x.platform import ArchError

    return (ArchError, BundleError, ContractError, LaunchError)


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "selftest":
            from sm12x import platform

            platform.check_arch_env()
        return int(args.func(args) or 0)
    except _user_errors() as e:
        print(f"sm12x {args.command}: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"sm12x {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `sm12x status | head`: the reader left; say nothing more
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


if __name__ == "__main__":
    sys.exit(main())
