"""``sm12x doctor --image IMAGE [--bundle DIR]``: will the sm12x mount take effect in this image?

Contract:
- Runs, inside IMAGE (local only, never pulled; no GPU; network disabled; as the image's user unless
  ``--user``), a stdlib probe with the bundle mounted read-only at /sm12x and
  ``PYTHONPATH=/sm12x:<image PYTHONPATH>``. The probe runs ``<python> -m sm12x status --json`` with the
  interpreter the image's entrypoint would use (``python3`` when that cannot be told), with
  ``SM12X_ARCH`` set (default 12.0: the GPU is not there, the plan is made as if it were).
- Prints one plain line per finding: ``ok``, ``info``, ``warn`` or ``error``.
- Exit code: 0 when the mount takes effect (warnings allowed), 1 when it would not (any ``error``
  finding), 2 when the engine, the image or the bundle is missing.

The checks live in pure functions (``analyse(image_config, report)``, ``python_flags``) so they are
unit-tested without Docker; ``report`` is the probe's JSON (see PROBE).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import sys
from dataclasses import dataclass

from sm12x.commands.bundle import byte_code_tags
from sm12x.commands.launch import (MOUNT, LaunchError, bundle_problem, connect, default_bundle, report_problems,
                                   env_list_to_dict, local_image, pythonpath_with_bundle)

MARKER = "SM12X_DOCTOR "
CPU_TORCH = "needs a CUDA build of torch; the installed torch is a CPU build"
FRAMEWORKS = ("vllm", "sglang")

# Runs inside the image with its python3 (stdlib only; keep it valid for Python 3.8+). argv[1] is the
# image's Entrypoint+Cmd as JSON. Prints one line: MARKER + JSON report.
PROBE = r'''
import json, os, re, shutil, subprocess, sys, tempfile
PY = re.compile(r"python(\d(\.\d+)?)?$")
r = {"python": sys.executable, "python_version": sys.version.split()[0], "uid": os.getuid(),
     "gid": os.getgid(), "home": os.path.expanduser("~"), "sys_path": sys.path,
     "pythonpath": os.environ.get("PYTHONPATH")}
r["sitecustomize_candidates"] = [os.path.join(p or os.getcwd(), "sitecustomize.py") for p in sys.path
                                 if os.path.isfile(os.path.join(p or os.getcwd(), "sitecustomize.py"))]
r["nvcc"] = shutil.which("nvcc")
r["nvcc_off_path"] = next((c for c in (os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "nvcc"),
                                       "/usr/local/cuda/bin/nvcc") if os.path.isfile(c)), None)
if os.environ.get("TRITON_CACHE_DIR"):
    d, src = os.environ["TRITON_CACHE_DIR"], "TRITON_CACHE_DIR"
else:
    base = os.environ.get("TRITON_HOME") or os.path.expanduser("~")
    d, src = os.path.join(base, ".triton", "cache"), "TRITON_HOME" if os.environ.get("TRITON_HOME") else "HOME"
near = d
while near and not os.path.isdir(near):
    near = os.path.dirname(near)
tc = {"dir": d, "source": src, "exists": os.path.isdir(d), "checked": near, "writable": False, "error": None}
try:
    fd, f = tempfile.mkstemp(dir=near or "/")
    os.close(fd)
    os.unlink(f)
    tc["writable"] = True
except OSError as e:
    tc["error"] = "%s: %s" % (type(e).__name__, e)
r["triton_cache"] = tc
# Which interpreter would the image's own command run? A pythonX word, or a script's #! line.
argv = json.loads(sys.argv[1]) if len(sys.argv) > 1 else []
interp, shebang = None, None
for word in argv[:1]:
    if PY.match(os.path.basename(word)):
        interp = shutil.which(word)
    else:
        path = shutil.which(word)
        if path:
            try:
                with open(path, "rb") as fh:
                    first = fh.readline(300).decode("utf-8", "replace").strip()
            except OSError:
                first = ""
            if first.startswith("#!") and "python" in first:
                shebang = first
                words = first[2:].split()
                if words and os.path.basename(words[0]) == "env":
                    words = [w for w in words[1:] if not w.startswith("-")]
                    words[:1] = [shutil.which(words[0])] if words else []
                interp = words[0] if words else None
r["entry_interpreter"], r["entry_shebang"] = interp, shebang
exe = interp or sys.executable
try:
    p = subprocess.run([exe, "-m", "sm12x", "status", "--json"], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, universal_newlines=True, timeout=300)
    r["status_rc"], r["status_stderr"] = p.returncode, p.stderr[-3000:]
    r["status"] = None
    # the JSON is the last thing on stdout; the image's own sitecustomize may print before it
    starts = [0] + [m.start() + 1 for m in re.finditer(r"\n\{", p.stdout)]
    for start in starts:
        try:
            r["status"] = json.loads(p.stdout[start:])
            break
        except ValueError:
            continue
    if r["status"] is None:
        r["status_stdout"] = p.stdout[-3000:]
except Exception as e:
    r["status"], r["status_rc"], r["status_stderr"] = None, None, "%s: %s" % (type(e).__name__, e)
r["status_python"] = exe
try:  # the plugin route: entry points registered by the dist-info on the mount
    from importlib.metadata import entry_points
    eps = entry_points()
    r["plugins"] = {g: sorted(e.name for e in (eps.select(group=g) if hasattr(eps, "select") else eps.get(g, [])))
                    for g in ("vllm.general_plugins", "sglang.srt.plugins")}
except Exception as e:
    r["plugins"] = None
print("SM12X_DOCTOR " + json.dumps(r))
'''


@dataclass
class Finding:
    """One line of the diagnosis. level: ok | info | warn | error (error = the mount won't take effect)."""
    level: str
    code: str
    text: str

    def __str__(self) -> str:
        return f"{self.level:5}  {self.text}"


_PY = re.compile(r"python(\d(\.\d+)?)?$")
_END_OPTS = set("cm")   # -c CMD / -m MOD: everything after belongs to the program
_ARG_OPTS = set("WXQ")  # take a value: the rest of the word, or the next word


def _option_word(word: str) -> tuple[set[str], str]:
    """Letters of one python option word like ``-Esm`` and what follows: "next", "skip" (a value word) or "end"."""
    letters: set[str] = set()
    for k, ch in enumerate(word[1:], start=1):
        letters.add(ch)
        if ch in _END_OPTS:
            return letters, "end"
        if ch in _ARG_OPTS:
            return letters, "skip" if k == len(word) - 1 else "next"
    return letters, "next"


def python_flags(argv: list[str] | None) -> set[str]:
    """Single-letter interpreter options given to any python in ``argv`` (shell strings are split).

    ``["python3", "-Im", "x"]`` -> {"I", "m"}; ``["sh", "-c", "exec python -E app.py"]`` -> {"E"}.
    """
    words: list[str] = []
    for item in argv or []:
        try:
            words += shlex.split(item) if " " in item else [item]
        except ValueError:
            words += item.split()
    flags: set[str] = set()
    i = 0
    while i < len(words):
        is_python = _PY.match(os.path.basename(words[i]))
        i += 1
        if not is_python:
            continue
        while i < len(words) and words[i].startswith("-") and not words[i].startswith("--") and words[i] != "-":
            letters, then = _option_word(words[i])
            flags |= letters
            i += 2 if then == "skip" else 1
            if then == "end":
                break
    return flags


def _shebang_flags(shebang: str | None) -> set[str]:
    if not shebang:
        return set()
    words = shebang[2:].split()
    if words and os.path.basename(words[0]) == "env":
        words = [w for w in words[1:] if w != "-S"]
    return python_flags(words)


def _under(path: str | None, mount: str) -> bool:
    return bool(path) and os.path.normpath(path).startswith(mount.rstrip("/") + "/")


def analyse(image_config: dict, report: dict | None, mount: str = MOUNT,
            bundle_tags: list | None = None, bundle: str = "DIR") -> list[Finding]:
    """Findings for an image (docker inspect ``Config``) and the probe report (None: the probe failed).
    ``bundle_tags``: the interpreter tags the bundle's byte code was made for (None: not checked);
    ``bundle``: the bundle's path on this host, for the commands the findings suggest."""
    out: list[Finding] = []
    add = lambda level, code, text: out.append(Finding(level, code, text))  # noqa: E731
    cfg = image_config or {}
    env = env_list_to_dict(cfg.get("Env"))

    # 1. Static: the image's own command line and environment.
    argv = list(cfg.get("Entrypoint") or []) + list(cfg.get("Cmd") or [])
    flags = python_flags(argv)
    if report and report.get("entry_shebang"):
        flags |= _shebang_flags(report["entry_shebang"])
    if flags & {"I", "E"}:
        add("error", "entrypoint-disables-site",
            f"image command {shlex.join(argv)} runs python with "
            + " and ".join(f"-{f}" for f in sorted(flags & {"I", "E"}))
            + ": PYTHONPATH is ignored, so neither our sitecustomize nor our plugin entry points load; "
            "override the entrypoint (sm12x launch and the compose files do)")
    elif "S" in flags:
        add("warn", "entrypoint-disables-site",
            f"image command {shlex.join(argv)} runs python with -S: our sitecustomize never loads; only the "
            "plugin entry points (vllm.general_plugins / sglang.srt.plugins) apply patches, and only in "
            "processes where the framework loads plugins; override the entrypoint to get both")
    for var in ("VLLM_PLUGINS", "SGLANG_PLUGINS"):
        if var in env and "sm12x" not in env[var].split(","):
            add("info", "plugin-allow-list", f"image sets {var}={env[var]}: the sm12x plugin route is off "
                                             "(the sitecustomize route is not affected)")
    if env.get("SM12X_DISABLE") == "1":
        add("error", "disabled", "image env sets SM12X_DISABLE=1: the bootstrap stops after chaining")
    image_pp = env.get("PYTHONPATH")
    if image_pp:
        add("info", "image-pythonpath",
            f"image sets PYTHONPATH={image_pp}: use PYTHONPATH={pythonpath_with_bundle(cfg.get('Env'), mount)}"
            f" (launch and the compose files do); PYTHONPATH={mount} alone would drop the image's entries")

    if report is None:
        add("error", "probe-failed", "could not run the probe in the image (see above)")
        return out
    status = report.get("status")
    if status is None:
        tail = (report.get("status_stderr") or report.get("status_stdout") or "").strip().splitlines()[-1:]
        add("error", "status-failed",
            f"`{report.get('status_python')} -m sm12x status --json` failed in the image"
            + (f": {tail[0]}" if tail else ""))
        return out

    # 2. Did the bootstrap run, and is ours the sitecustomize that Python picks?
    run_pp = [p for p in (report.get("pythonpath") or "").split(":") if p]
    if run_pp and run_pp[0].rstrip("/") != mount:
        ahead = run_pp[: run_pp.index(mount)] if mount in run_pp else run_pp
        add("warn", "pythonpath-order",
            f"PYTHONPATH={':'.join(run_pp)} puts {':'.join(ahead)} ahead of {mount}"
            + ("" if mount in run_pp else f" and leaves {mount} out")
            + f": a sitecustomize.py there would win; use PYTHONPATH={mount}:...")
    boot = status.get("bootstrap") or {}
    cands = report.get("sitecustomize_candidates") or []
    first = cands[0] if cands else None
    if boot.get("disabled") and _under(boot.get("sitecustomize"), mount):
        if env.get("SM12X_DISABLE") != "1":  # set for this run (--env), not by the image
            add("error", "disabled", f"SM12X_DISABLE=1 is set for the run: the bootstrap ran "
                                     f"({boot['sitecustomize']}) and patches nothing; leave it unset")
    elif boot.get("active") and _under(boot.get("sitecustomize"), mount):
        add("ok", "bootstrap", f"bootstrap ran: {boot['sitecustomize']} (as {report.get('status_python')}, "
                               f"uid {report.get('uid')})")
    elif first and not _under(first, mount):
        add("error", "shadowed", f"{first} comes before {mount} on sys.path and shadows our sitecustomize "
                                 f"(sys.path: {':'.join(report.get('sys_path') or [])})")
    else:
        add("error", "bootstrap-inactive",
            f"the bootstrap did not run (sitecustomize: {boot.get('sitecustomize')}); check PYTHONPATH and "
            "that the bundle has sitecustomize.py")
    others = [c for c in cands if not _under(c, mount)]
    if boot.get("chained"):
        add("ok", "chained", f"chained the image's own sitecustomize: {boot['chained']}")
    elif others:
        add("warn", "not-chained", f"image has {others[0]} but the bootstrap did not chain it")
    else:
        add("info", "nothing-to-chain", "image has no sitecustomize of its own: nothing to chain")

    if bundle_tags is not None:
        out.append(byte_code_finding(status, report, bundle_tags, bundle))

    plugins = report.get("plugins") or {}
    groups = [g for g, names in plugins.items() if "sm12x" in names]
    if groups:
        add("ok", "plugin-route", "plugin entry points registered: " + ", ".join(groups))
    elif plugins:
        add("info", "plugin-route", "no sm12x plugin entry points (bundle without the dist-info?): "
                                    "only the sitecustomize route applies")

    # 3. The patch plan.
    have = {k: v for k, v in (status.get("versions") or {}).items() if v}
    add("info", "versions", "versions in the image: "
        + (", ".join(f"{k} {v}" for k, v in have.items()) if have else "none of the watched libraries"))
    arch = status.get("arch") or {}
    if arch.get("source") == "env":
        add("info", "arch", f"planned as if on {arch.get('detail')} (doctor runs without a GPU)")
    patches = [dict(p) for p in status.get("patches") or []]
    if status.get("torch_build") == "cpu":  # the plan ran without a GPU; the image is for one
        for p in patches:
            if p.get("state") == "would-apply":
                p["state"], p["reason"] = "skipped", CPU_TORCH
    absent: dict[str, int] = {}  # "X is not installed": one line per library, not one per patch
    blocked: dict[str, list] = {}  # the same reason for several patches: one line
    for p in patches:
        reason = p.get("reason") or ""
        if p.get("state") in ("would-apply", "applied"):
            add("ok", "patch-applies", f"will apply: {p['name']} -> {p['target']}")
        elif p.get("state") == "failed":
            add("warn", "patch-failed", f"failed: {p['name']} -> {p['target']} ({reason})")
        elif p.get("state") == "retired":
            add("info", "patch-retired", f"not needed: {p['name']} ({reason})")
        elif reason.endswith(" is not installed") and not reason.startswith("needs "):
            lib = reason[: -len(" is not installed")]
            absent[lib] = absent.get(lib, 0) + 1
        else:
            blocked.setdefault(reason, []).append(p["name"])
    for reason, names in blocked.items():
        if reason.startswith("needs ") or reason == CPU_TORCH:
            add("warn", "dependency-missing", f"{len(names)} patch(es) of what is installed will not apply: "
                f"{reason} in the image (sm12x's kernels run on torch and triton)")
        elif len(names) > 2:
            add("info", "patch-skipped", f"will not apply ({len(names)}): {reason}: {', '.join(names)}")
        else:
            for name in names:
                add("info", "patch-skipped", f"will not apply: {name} ({reason})")
    if absent:
        add("info", "patch-not-installed", "not in this image, so their patches skip: "
            + ", ".join(f"{lib} ({n})" for lib, n in sorted(absent.items())))
    versions = status.get("versions") or {}
    out_of_range = sorted({p["reason"].split()[0] for p in patches
                           if p.get("state") == "skipped" and " outside " in (p.get("reason") or "")})
    for lib in out_of_range:
        mine = [p for p in patches if (p.get("reason") or "").split()[:1] == [lib]
                or p["target"].split(".")[0].split(":")[0] == lib.replace("-", "_")]
        if mine and all(" outside " in (p.get("reason") or "") for p in mine):
            add("warn", "version-out-of-range",
                f"{lib} {versions.get(lib) or ''} is outside every sm12x patch range for it: "
                "none of its patches will apply (newer upstream may not need them; see the reasons above)")
    unmatched = (status.get("skip") or {}).get("unmatched") or []
    if unmatched:
        add("warn", "skip-unmatched", "SM12X_SKIP names no sm12x patch: " + ", ".join(unmatched)
            + " (names as `sm12x status` lists them, or dotted prefixes of them)")
    installed = [f for f in FRAMEWORKS if versions.get(f)]
    if not installed:
        add("info", "no-framework", "neither vllm nor sglang is installed in this image")
    if patches and not any(p.get("state") in ("would-apply", "applied") for p in patches):
        add("warn", "nothing-applies", "no sm12x patch will apply in this image (reasons above)")

    # 4. Toolchain and caches the kernels need at run time.
    if not report.get("nvcc"):
        if report.get("nvcc_off_path"):
            add("warn", "nvcc-off-path", f"nvcc exists at {report['nvcc_off_path']} but is not on PATH: "
                                         f"add -e PATH=...:{os.path.dirname(report['nvcc_off_path'])}")
        elif installed:
            add("warn", "nvcc-missing", "no nvcc in the image: vLLM's TileLang MHC-prenorm JIT and SGLang's JIT "
                                        "kernels compile with it at start (sm12x's Triton kernels do not)")
        else:
            add("info", "nvcc-missing", "no nvcc in the image (only framework JIT kernels need it)")
    tc = report.get("triton_cache") or {}
    if tc.get("writable"):
        state = "exists" if tc.get("exists") else f"will be created under {tc.get('checked')}"
        add("ok", "triton-cache", f"Triton cache {tc.get('dir')} ({tc.get('source')}) is writable as uid "
                                  f"{report.get('uid')}; {state}")
    else:
        add("warn", "triton-cache",
            f"Triton cache {tc.get('dir')} ({tc.get('source')}) is not writable as uid {report.get('uid')} "
            f"({tc.get('error') or 'missing'}): Triton cannot compile sm12x kernels; "
            "set -e TRITON_CACHE_DIR=/tmp/triton or mount a writable volume there")
    return out


def byte_code_finding(status: dict, report: dict, tags: list, bundle: str) -> Finding:
    """Whether the bundle holds byte code for the Python the image runs sm12x with."""
    py = status.get("python") or {}
    version = py.get("version") or report.get("python_version") or ""
    major_minor = ".".join(version.split(".")[:2])
    tag = py.get("cache_tag") or ("cpython-" + major_minor.replace(".", "") if major_minor else None)
    if tag is None:
        return Finding("info", "byte-code", "could not tell the image's Python version")
    if tag in tags:
        return Finding("ok", "byte-code", f"the bundle has byte code for the image's Python {version} ({tag})")
    made = ", ".join(tags) if tags else "no Python (built with --no-compile)"
    return Finding("warn", "byte-code",
                   f"the bundle's byte code is for {made}, but the image runs Python {version}: every Python "
                   f"process there compiles sm12x's start-up code again (a few ms each; the mount is read-only); "
                   f"fix: python3 -m sm12x bundle {shlex.quote(bundle)} --compile-with python{major_minor} "
                   f"(any Python {major_minor} on this machine)")


def verdict(findings: list[Finding]) -> str:
    """The last line of doctor's report: whether the bootstrap loads, and what it will change."""
    if exit_code(findings):
        return "the mount would NOT take effect"
    applies = sum(1 for f in findings if f.code == "patch-applies")
    if applies:
        return f"the mount takes effect: {applies} patch(es) will apply"
    missing = sorted({f.text.split(": ", 1)[1].split(" in the image")[0] for f in findings
                      if f.code == "dependency-missing"})
    return ("the bootstrap loads, but no sm12x patch will apply in this image"
            + (f" ({'; '.join(missing)})" if missing else ""))


def exit_code(findings: list[Finding]) -> int:
    """1 when any finding says the mount would not take effect, else 0."""
    return 1 if any(f.level == "error" for f in findings) else 0


def parse_probe_output(text: str) -> dict | None:
    """The report JSON from the probe's stdout (the line starting with MARKER), or None."""
    for line in reversed(text.splitlines()):
        if line.startswith(MARKER):
            try:
                return json.loads(line[len(MARKER):])
            except ValueError:
                return None
    return None


def run_probe(client, image: str, image_config: dict, bundle: str, *, arch: str = "12.0",
              user: str | None = None, env: dict | None = None, timeout: int = 300) -> tuple[dict | None, str]:
    """Run PROBE in ``image``; returns (report or None, combined output for error messages)."""
    argv = list(image_config.get("Entrypoint") or []) + list(image_config.get("Cmd") or [])
    environment = {"PYTHONPATH": pythonpath_with_bundle(image_config.get("Env")), **(env or {})}
    if arch:
        environment["SM12X_ARCH"] = arch
    errors = []
    for python in ("python3", "python"):  # an image without python3 on PATH may still have python
        container = client.containers.create(
            image, entrypoint=[python, "-c", PROBE, json.dumps(argv)], environment=environment,
            volumes={os.path.abspath(bundle): {"bind": MOUNT, "mode": "ro"}}, network_disabled=True,
            user=user or image_config.get("User") or "")
        try:
            container.start()
            try:
                container.wait(timeout=timeout)
            except Exception:
                container.kill()
                return None, f"probe timed out after {timeout}s"
            stdout = container.logs(stdout=True, stderr=False).decode(errors="replace")
            stderr = container.logs(stdout=False, stderr=True).decode(errors="replace")
            return parse_probe_output(stdout), (stdout + stderr).strip()
        except Exception as e:  # "executable file not found": the start itself fails
            errors.append(f"{python}: {type(e).__name__}: {e}")
        finally:
            try:
                container.remove(force=True)
            except Exception:
                pass
    return None, "; ".join(errors)


def request_problems(args) -> list[str]:
    """Every problem with doctor's arguments that can be told without Docker, one line each."""
    from sm12x.platform import ArchError, parse_arch

    problems = []
    problem = bundle_problem(os.path.abspath(args.bundle or default_bundle()))
    if problem:
        problems.append(problem)
    if args.arch:
        try:
            parse_arch(args.arch)
        except ArchError as e:
            problems.append("--arch " + str(e).replace("SM12X_ARCH=", "", 1))
    for item in args.env or []:
        key, sep, _ = item.partition("=")
        if not sep or not key:
            problems.append(f"--env {item!r}: expected KEY=VALUE, e.g. --env TRITON_CACHE_DIR=/tmp/triton")
    return problems


def run_doctor(args) -> int:
    """Entry point of ``sm12x doctor``: prints findings, returns the exit code (see module docstring)."""
    bundle = os.path.abspath(args.bundle or default_bundle())
    problems = request_problems(args)
    client = config = None
    try:
        client = connect()
        config = local_image(client, args.image).attrs["Config"] or {}
    except LaunchError as e:
        problems.append(str(e))
    if problems:
        if args.json:  # a script reading the JSON gets JSON, whatever went wrong
            print(json.dumps({"image": args.image, "exit_code": 2, "problems": problems, "report": None,
                              "findings": []}, indent=2))
        return report_problems("doctor", problems)
    env = dict(item.partition("=")[::2] for item in args.env or [])
    report, output = run_probe(client, args.image, config, bundle, arch=args.arch, user=args.user, env=env)
    if report is None:
        print(f"sm12x doctor: probe failed in {args.image}: {output[-2000:]}", file=sys.stderr)
    findings = analyse(config, report, bundle_tags=byte_code_tags(bundle), bundle=bundle)
    code = exit_code(findings)
    if args.json:
        print(json.dumps({"image": args.image, "exit_code": code, "report": report,
                          "findings": [f.__dict__ for f in findings]}, indent=2))
        return code
    print(f"sm12x doctor: {args.image} with {bundle} mounted read-only at {MOUNT}")
    for f in findings:
        print(f)
    print("verdict: " + verdict(findings))
    return code


DOCTOR_HELP = """\
Check, without a GPU, whether the sm12x bundle takes effect in a container image you have
locally (it is never pulled): it starts the image once with the bundle mounted as your real run
would, and reports whether sm12x's start-up code runs there, whether the image's own start-up
code still runs, which patches would apply to the frameworks installed in it, and what the
kernels need at run time (a writable Triton cache, byte code for the image's Python).

Each finding is one line: ok, info, warn or error. Exit code 0: the mount takes effect (warnings
allowed); 1: it would not (an error); 2: the image, the bundle, Docker or an argument is missing.

examples:
  python3 -m sm12x doctor --image vllm/vllm-openai:TAG --bundle ./sm12x-bundle
  python3 -m sm12x doctor --image lmsysorg/sglang:TAG --bundle ./sm12x-bundle --arch 12.1
  python3 -m sm12x doctor --image vllm/vllm-openai:TAG --env PYTHONPATH=/sm12x:/app --json
"""


def add_doctor_command(subparsers) -> argparse.ArgumentParser:
    """Register ``doctor`` on the sm12x CLI (``func`` = run_doctor)."""
    p = subparsers.add_parser("doctor", help="check, without a GPU, that the bundle takes effect in a local image",
                              description=DOCTOR_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--image", required=True, help="a local image (never pulled), e.g. vllm/vllm-openai:TAG")
    p.add_argument("--bundle", metavar="DIR",
                   help="the folder made by `sm12x bundle` (default: the folder sm12x runs from)")
    p.add_argument("--arch", default="12.0",
                   help="plan as if on this GPU: 12.0 (RTX PRO 6000 / RTX 5090, default), 12.1 (DGX Spark); "
                        "'' asks the container's GPU")
    p.add_argument("--user", help="run as this user (default: the image's USER)")
    p.add_argument("--env", "-e", action="append", default=[], metavar="KEY=VALUE",
                   help="environment as your real run sets it (repeatable)")
    p.add_argument("--json", action="store_true", help="the probe's report and the findings as JSON")
    p.set_defaults(func=run_doctor)
    return p
