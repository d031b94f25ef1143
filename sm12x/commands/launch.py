"""``sm12x launch {vllm,sglang} --model PATH``: serve DeepSeek-V4-Flash from a stock image with the bundle.

Contract:
- Uses the Docker SDK (``docker`` package, imported only when an engine is needed). Never pulls.
  Every problem found before starting (arguments, bundle, engine, local image) is one line on
  stderr, all of them listed, exit code 2.
- Mounts the bundle read-only at /sm12x and the model read-only at /model; sets
  ``PYTHONPATH=/sm12x:<the image's own PYTHONPATH>`` (read from the image config Env); requests GPUs
  (all, or ``--gpus 0,1``); ``ipc=host``, a large /dev/shm, unlimited memlock.
- Always prints the equivalent ``docker run`` line. ``--dry-run`` prints only, and works without any
  engine (the image is then not checked and its env is assumed to have no PYTHONPATH; stderr says so).
- The framework command line is the DeepSeek-V4-Flash recipe below (``recipe_args``), each flag with the
  reason it is there; ``--no-recipe`` keeps only model/TP/port; arguments after ``--`` are appended
  last, so they override recipe values (both frameworks take the last value of a repeated flag).

The user-facing help is ``LAUNCH_HELP``. ``argument_problems``, ``pythonpath_with_bundle``,
``recipe_args``, ``recipe_env``, ``build_spec`` and ``docker_run_line`` need no Docker.
"""
from __future__ import annotations

import argparse
import os
import shlex
import sys
from dataclasses import dataclass, field

MOUNT = "/sm12x"
MODEL_MOUNT = "/model"
DEFAULT_IMAGES = {"vllm": "vllm/vllm-openai:latest", "sglang": "lmsysorg/sglang:latest"}
DEFAULT_PORT = 8000
SHM_SIZE = "16g"  # NCCL and the frameworks' shared-memory queues; ignored by Docker under ipc=host


class LaunchError(Exception):
    """A user-facing problem: printed as one line, exit code 2."""


# ---------------------------------------------------------------------------------------------------
# The DeepSeek-V4-Flash recipe. Sources: the community SM12x recipes (0xSero's SGLang recipe,
# hikarioyama's vLLM TP2, jasl's PR #41834 line, hermia's stock vLLM 4x TP4).
# ---------------------------------------------------------------------------------------------------

def recipe_args(framework: str, tp: int, port: int, served_name: str, spec: bool = True,
                recipe: bool = True) -> list[str]:
    """Framework argv after the entrypoint (model path at /model)."""
    common = ["--host", "0.0.0.0", "--port", str(port), "--served-model-name", served_name,
              "--tensor-parallel-size", str(tp), "--trust-remote-code"]
    if framework == "vllm":
        args = [MODEL_MOUNT] + common                 # `vllm serve MODEL`
        if not recipe:
            return args
        args += [
            # DSv4's sparse-MLA cache is the FP8 "fp8_ds_mla" layout in 256-token pages; other
            # dtypes/block sizes have no SM12x kernel (jasl #41834, hikarioyama).
            "--kv-cache-dtype", "fp8",
            "--block-size", "256",
            # Experts sharded by EP, not TP: what every measured SM12x vLLM recipe uses (hermia, jasl).
            "--enable-expert-parallel",
            # 256K is the stock single-request ceiling (longer prefills hit DeepGEMM error 719 and can
            # drop a GPU off the bus, hermia BUGS.md); raise it only with a patch set that covers it.
            "--max-model-len", "262144",
            "--gpu-memory-utilization", "0.90",
            # PCIe Blackwell: vLLM's custom all-reduce deadlocks/hangs without NVLink (hikarioyama,
            # ambientlight); NCCL does the all-reduce instead.
            "--disable-custom-all-reduce",
            # FULL graphs for decode + piecewise for prefill: the >100 tok/s recipes all keep this
            # (jasl #41834 promotion gate "keep FULL_AND_PIECEWISE").
            "--compilation-config", '{"cudagraph_mode":"FULL_AND_PIECEWISE"}',
            # DeepSeek ships a Python encoder, not a Jinja template: use the built-in DSv4 tokenizer
            # mode and parsers (tool calls in DSML, reasoning block first).
            "--tokenizer-mode", "deepseek_v4",
            "--tool-call-parser", "deepseek_v4", "--enable-auto-tool-choice",
            "--reasoning-parser", "deepseek_v4",
        ]
        if spec:
            # MTP with 2 draft tokens: +68% single stream in jasl's harness; MTP=1 hangs at C=4
            # (NCCL allgather, vllm#51593). Stock SM120 decode rejects it (num_tokens > 64 check); the
            # sm12x spec-decode patch lifts that (`sm12x doctor` says whether it applies to the image).
            args += ["--speculative-config", '{"method":"mtp","num_speculative_tokens":2}']
        return args

    if framework == "sglang":
        args = ["--model-path", MODEL_MOUNT] + common
        if not recipe:
            return args
        args += [
            # FP8 KV in 256-token pages: the DSv4 "MODEL1" cache layout the sparse decode reads
            # ("expects 584 bytes/token" means a wrong dtype or page size, 0xSero troubleshooting).
            "--kv-cache-dtype", "fp8_e4m3",
            "--page-size", "256",
            "--context-length", "262144",
            "--mem-fraction-static", "0.85",
            "--chunked-prefill-size", "8192",
            # Route FP8 GEMMs and MoE to Triton: the DeepGEMM / SM100 runners have no sm_120 build.
            "--fp8-gemm-backend", "triton",
            "--moe-runner-backend", "triton",
            # PCIe Blackwell: custom all-reduce deadlocks without NVLink (ambientlight).
            "--disable-custom-all-reduce",
            # Keep CUDA graphs on (0xSero's correction: disabling them is the slow path).
            "--cuda-graph-max-bs", "32",
            # DSv4 has no Jinja template: these parsers select SGLang's built-in encoding_dsv4.
            "--tool-call-parser", "deepseekv4",
            "--reasoning-parser", "deepseek-v4",
            "--watchdog-timeout", "3600",  # first-start Triton compilation can take many minutes
        ]
        if spec:
            # EAGLE with the checkpoint's MTP head: 1 step, top-k 1, 2 draft tokens (0xSero HEAD);
            # the DSv4 draft worker only supports topk 1; decode-mode attention for the draft.
            args += ["--speculative-algorithm", "EAGLE", "--speculative-num-steps", "1",
                     "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "2",
                     "--speculative-attention-mode", "decode"]
        return args
    raise LaunchError(f"unknown framework {framework!r}: use vllm or sglang")


def recipe_env(framework: str, spec: bool = True, recipe: bool = True) -> dict[str, str]:
    """Container environment for the recipe (PYTHONPATH is added by build_spec)."""
    if not recipe:
        return {}
    env = {
        # Blackwell PCIe (RTX PRO 6000, no NVLink): NCCL P2P all-reduce deadlocks (hermia, hikarioyama).
        "NCCL_P2P_DISABLE": "1",
        # Single host: never probe InfiniBand.
        "NCCL_IB_DISABLE": "1",
    }
    if framework == "vllm":
        # FlashInfer's sampler errors on 4x RTX PRO 6000 (jasl #41834 notes); the torch sampler is fine.
        env["VLLM_USE_FLASHINFER_SAMPLER"] = "0"
    else:
        # DeepGEMM JIT has no sm_120 target: don't JIT or precompile it at start (0xSero recipe).
        env["SGLANG_ENABLE_JIT_DEEPGEMM"] = "0"
        env["SGLANG_JIT_DEEPGEMM_PRECOMPILE"] = "0"
        if spec:
            env["SGLANG_ENABLE_SPEC_V2"] = "True"  # DSv4 EAGLE runs on the spec-v2 worker only
    return env


# ---------------------------------------------------------------------------------------------------
# Container spec and the equivalent docker run line
# ---------------------------------------------------------------------------------------------------

def env_list_to_dict(env: list[str] | None) -> dict[str, str]:
    """Docker image config ``Env`` (["K=V", ...]) as a dict."""
    out = {}
    for item in env or []:
        key, _, value = item.partition("=")
        out[key] = value
    return out


def pythonpath_with_bundle(image_env: list[str] | dict | None, mount: str = MOUNT) -> str:
    """``mount`` first, then the image's own PYTHONPATH entries (without duplicating ``mount``)."""
    env = image_env if isinstance(image_env, dict) else env_list_to_dict(image_env)
    rest = [p for p in env.get("PYTHONPATH", "").split(":") if p and p.rstrip("/") != mount]
    return ":".join([mount, *rest])


@dataclass
class LaunchSpec:
    """Everything `docker run` needs; ``sdk_kwargs`` and ``docker_run_line`` render it."""
    image: str
    entrypoint: list[str]
    command: list[str]
    environment: dict[str, str]
    volumes: dict[str, dict] = field(default_factory=dict)
    gpus: str = "all"             # "all", "0,1" or "none"
    ports: dict[int, int] = field(default_factory=dict)
    name: str | None = None
    ipc_mode: str = "host"        # NCCL/CUDA IPC between TP ranks needs the host IPC namespace
    shm_size: str = SHM_SIZE
    # NCCL pins host buffers (memlock); NVIDIA's recommended stack size for CUDA containers.
    ulimits: dict[str, int] = field(default_factory=lambda: {"memlock": -1, "stack": 67108864})
    detach: bool = False

    def sdk_kwargs(self) -> dict:
        """Keyword arguments for ``client.containers.create`` (``image`` included)."""
        docker = docker_sdk()

        if self.gpus == "none":
            devices = []
        elif self.gpus == "all":
            devices = [docker.types.DeviceRequest(count=-1, capabilities=[["gpu"]])]
        else:
            devices = [docker.types.DeviceRequest(device_ids=self.gpus.split(","), capabilities=[["gpu"]])]
        return dict(
            image=self.image, entrypoint=self.entrypoint, command=self.command,
            environment=self.environment, volumes=self.volumes, device_requests=devices,
            ports={f"{c}/tcp": h for c, h in self.ports.items()}, name=self.name,
            ipc_mode=self.ipc_mode, shm_size=self.shm_size,
            ulimits=[docker.types.Ulimit(name=k, soft=v, hard=v) for k, v in self.ulimits.items()],
            # Detached: the engine removes it on exit. Foreground: _run removes it after reading
            # the exit code (an auto-removed container can vanish before wait() returns).
            auto_remove=self.detach)


def docker_run_line(spec: LaunchSpec) -> str:
    """The `docker run ...` command equivalent to ``spec`` (one line, shell-quoted)."""
    argv = ["docker", "run", "--rm"] + (["-d"] if spec.detach else [])
    if spec.name:
        argv += ["--name", spec.name]
    if spec.gpus != "none":
        argv += ["--gpus", "all" if spec.gpus == "all" else f'"device={spec.gpus}"']
    argv += [f"--ipc={spec.ipc_mode}", f"--shm-size={spec.shm_size}"]
    argv += [f"--ulimit={k}={v}" for k, v in spec.ulimits.items()]
    for host, m in spec.volumes.items():
        argv += ["-v", f"{host}:{m['bind']}:{m.get('mode', 'rw')}"]
    for c, h in spec.ports.items():
        argv += ["-p", f"{h}:{c}"]
    for k, v in spec.environment.items():
        argv += ["-e", f"{k}={v}"]
    argv += ["--entrypoint", spec.entrypoint[0], spec.image, *spec.entrypoint[1:], *spec.command]
    return shlex.join(argv)


def default_bundle() -> str:
    """The folder this package was loaded from (a bundle or a checkout: it holds sitecustomize.py)."""
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def build_spec(framework: str, model: str, image: str, image_env: list[str] | None, *, tp: int = 1,
               port: int = DEFAULT_PORT, bundle: str | None = None, gpus: str = "all",
               extra: list[str] | None = None, spec_decode: bool = True, recipe: bool = True,
               env: dict[str, str] | None = None, name: str | None = None,
               detach: bool = False, ulimits: bool = True) -> LaunchSpec:
    """The container to run: entrypoint, framework argv, env (PYTHONPATH prepended), mounts, GPUs."""
    model = os.path.abspath(model)
    bundle = os.path.abspath(bundle or default_bundle())
    served = os.path.basename(model.rstrip("/")) or "model"
    if framework == "vllm":
        entrypoint = ["vllm", "serve"]  # image entrypoints differ by version; be explicit
    else:
        entrypoint = ["python3", "-m", "sglang.launch_server"]  # never -I/-E/-S: they skip sitecustomize
    environment = recipe_env(framework, spec_decode, recipe)
    environment.update(env or {})
    # /sm12x always first; after it, the user's --env PYTHONPATH if given, else the image's own.
    base = {"PYTHONPATH": env["PYTHONPATH"]} if env and "PYTHONPATH" in env else image_env
    environment["PYTHONPATH"] = pythonpath_with_bundle(base)
    command = recipe_args(framework, tp, port, served, spec_decode, recipe) + list(extra or [])
    spec = LaunchSpec(
        image=image, entrypoint=entrypoint, command=command, environment=environment,
        volumes={bundle: {"bind": MOUNT, "mode": "ro"}, model: {"bind": MODEL_MOUNT, "mode": "ro"}},
        gpus=gpus, ports={port: port}, name=name, detach=detach)
    if not ulimits:
        spec.ulimits = {}
    return spec


# ---------------------------------------------------------------------------------------------------
# Docker access (shared with sm12x.commands.doctor)
# ---------------------------------------------------------------------------------------------------

def docker_sdk():
    """The Docker SDK module, or LaunchError when it is not installed.

    Run from a checkout, the repository's own ``docker/`` folder (compose files, no
    ``__init__.py``) is importable as an empty namespace package named ``docker``; that is not
    the SDK (an installed SDK, a regular package, always wins over it)."""
    try:
        import docker
    except ImportError:
        docker = None
    if docker is None or not hasattr(docker, "from_env"):
        for name in [m for m in sys.modules if m == "docker" or m.startswith("docker.")]:
            if getattr(sys.modules[name], "__file__", None) is None:
                del sys.modules[name]  # the namespace stand-in: never leave it as `docker`
        raise LaunchError("the `docker` Python package (Docker SDK) is not installed: pip install docker")
    return docker


def connect():
    """A connected Docker client, or LaunchError naming what is missing."""
    docker = docker_sdk()
    try:
        client = docker.from_env(timeout=30)
        client.ping()
    except Exception as e:
        host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
        raise LaunchError(f"no Docker engine reachable at {host} ({type(e).__name__}): start Docker, "
                          "or point DOCKER_HOST at it") from None
    return client


def local_image(client, image: str):
    """The image if present locally (never pulls), else LaunchError."""
    docker = docker_sdk()
    if not image.strip():
        raise LaunchError("--image '': give an image name, e.g. vllm/vllm-openai:TAG")
    try:
        return client.images.get(image)
    except docker.errors.ImageNotFound:
        raise LaunchError(f"image {image} is not present locally (sm12x never pulls): "
                          f"docker pull {image}") from None
    except docker.errors.APIError as e:  # e.g. "invalid reference format": the name itself
        raise LaunchError(f"--image {image!r}: the Docker engine refused it "
                          f"({e.explanation or e}); give a name such as vllm/vllm-openai:TAG") from None


# ---------------------------------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------------------------------

def _parse_env(items: list[str]) -> dict[str, str]:
    out = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise LaunchError(f"--env {item!r}: expected KEY=VALUE, e.g. --env NCCL_DEBUG=INFO")
        out[key] = value
    return out


def bundle_problem(bundle: str) -> str | None:
    """Why ``bundle`` cannot be mounted as the sm12x bundle, or None."""
    if not os.path.isdir(bundle):
        return (f"--bundle {bundle}: no such folder (make one with: python3 -m sm12x bundle {bundle})")
    missing = [n for n in ("sitecustomize.py", os.path.join("sm12x", "__init__.py"))
               if not os.path.isfile(os.path.join(bundle, n))]
    if missing:
        return (f"--bundle {bundle}: not an sm12x bundle (no {' or '.join(missing)}); "
                f"make one with: python3 -m sm12x bundle DIR")
    return None


def argument_problems(args) -> list[str]:
    """Every problem with the arguments that can be told without Docker, one line each."""
    problems = []
    if not os.path.isdir(args.model):
        what = "is a file, not a folder" if os.path.exists(args.model) else "no such folder"
        problems.append(f"--model {args.model}: {what} (give the model's folder on this host; "
                        "it is mounted read-only at /model)")
    elif not os.path.isfile(os.path.join(args.model, "config.json")):
        problems.append(f"--model {args.model}: no config.json in it (give the folder that holds the "
                        "model's config.json and weights, as downloaded from Hugging Face)")
    problem = bundle_problem(args.bundle or default_bundle())
    if problem:
        problems.append(problem)
    if args.tp < 1:
        problems.append(f"--tp {args.tp}: the tensor-parallel size is the number of GPUs the model "
                        "is split over: 1 or more, e.g. --tp 2")
    gpus = [g.strip() for g in args.gpus.split(",")]
    if args.gpus not in ("all", "none") and not all(g.isdigit() or g.startswith(("GPU-", "MIG-")) for g in gpus):
        problems.append(f"--gpus {args.gpus!r}: give all, none, or device ids such as 0,1 (or GPU UUIDs)")
    elif args.gpus not in ("all", "none") and args.tp > len(gpus):
        problems.append(f"--tp {args.tp} needs {args.tp} GPUs but --gpus {args.gpus} gives {len(gpus)}")
    if not 1 <= args.port <= 65535:
        problems.append(f"--port {args.port}: give a TCP port between 1 and 65535")
    try:
        _parse_env(args.env)
    except LaunchError as e:
        problems.append(str(e))
    return problems


def report_problems(command: str, problems: list) -> int:
    """Print each problem as one line naming the command; the exit code for user errors (2)."""
    for problem in problems:
        print(f"sm12x {command}: {problem}", file=sys.stderr)
    return 2


def run_launch(args) -> int:
    """Entry point of ``sm12x launch``: returns the exit code (2 for any problem found before
    starting: every one is listed, one line each)."""
    extra = list(args.extra or [])
    if extra[:1] == ["--"]:
        extra = extra[1:]
    image = args.image or DEFAULT_IMAGES[args.framework]
    problems = argument_problems(args)
    image_env, note, client = None, None, None
    try:
        client = connect()
    except LaunchError as e:
        if not args.dry_run:
            problems.append(str(e))
        else:  # a dry run works without Docker; it says what it could not check
            note = f"# image {image} not checked ({e}); assumed it sets no PYTHONPATH"
    if client is not None:
        try:
            image_env = local_image(client, image).attrs["Config"].get("Env")
        except LaunchError as e:
            problems.append(str(e))
    if problems:
        return report_problems("launch", problems)
    spec = build_spec(args.framework, args.model, image, image_env, tp=args.tp, port=args.port,
                      bundle=args.bundle, gpus=args.gpus, extra=extra, spec_decode=args.spec,
                      recipe=not args.no_recipe, env=_parse_env(args.env), name=args.name,
                      detach=args.detach, ulimits=not args.no_ulimits)
    if note:
        print(note, file=sys.stderr)
    print(docker_run_line(spec))
    if args.dry_run:
        return 1 if note else 0  # 1: the image could not be checked
    return _run(client, spec)


def _run(client, spec: LaunchSpec) -> int:
    """Start the container; unless detached, stream its output and return its exit code."""
    kwargs = spec.sdk_kwargs()
    image = kwargs.pop("image")
    container = None
    try:
        container = client.containers.create(image, **kwargs)
        container.start()
    except Exception as e:
        print(f"sm12x launch: docker run failed: {e}", file=sys.stderr)
        if "rlimit" in str(e):
            print("sm12x launch: this host does not let containers raise these limits: rerun with --no-ulimits",
                  file=sys.stderr)
        if container is not None:
            try:
                container.remove(force=True)
            except Exception:
                pass
        return 1
    print(f"started {container.name} ({container.short_id})", file=sys.stderr)
    if spec.detach:
        print(f"follow it with: docker logs -f {container.name}", file=sys.stderr)
        return 0
    try:
        for chunk in container.logs(stream=True, follow=True):
            sys.stdout.write(chunk.decode(errors="replace"))
            sys.stdout.flush()
        return int(container.wait().get("StatusCode", 1))
    except KeyboardInterrupt:
        print(f"\nstopping {container.name}", file=sys.stderr)
        container.stop(timeout=30)
        return 130
    except Exception as e:  # the engine went away, ...
        print(f"sm12x launch: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    finally:
        try:
            container.remove(force=True)
        except Exception:
            pass


LAUNCH_HELP = """\
Serve DeepSeek-V4-Flash from a stock {framework} image on this machine's GPUs, with the sm12x
bundle mounted (read-only at /sm12x, PYTHONPATH set) and the model folder mounted read-only at
/model. It uses a local image only (never pulls), prints the equivalent `docker run` line, then
runs it and follows its output. The framework flags are the DeepSeek-V4-Flash settings of published
SM12x setups (--no-recipe drops them); arguments after `--` are added last and override them.

--dry-run checks everything it can (model folder, bundle, --tp, --gpus, the image being present
locally) and prints the `docker run` line without starting anything; every problem found is
listed, one line each, and the exit code is 2. Without a Docker engine the image cannot be
checked: the line is still printed, stderr says so, and the exit code is 1.

examples:
  python3 -m sm12x launch {framework} --model /models/DeepSeek-V4-Flash --tp 2 --dry-run
  python3 -m sm12x launch {framework} --model /models/DeepSeek-V4-Flash --tp 2 --bundle ./sm12x-bundle
  python3 -m sm12x launch {framework} --model /models/DeepSeek-V4-Flash --tp 4 -- {extra}
"""


def add_launch_command(subparsers) -> argparse.ArgumentParser:
    """Register ``launch {vllm,sglang}`` on the sm12x CLI (``func`` = run_launch)."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--model", required=True, metavar="DIR",
                        help="the model's folder on this host (mounted read-only at /model)")
    common.add_argument("--tp", type=int, default=1, metavar="N",
                        help="number of GPUs the model is split over (tensor parallel; default 1)")
    common.add_argument("--image", help="local image (default: %s)" % ", ".join(
        f"{k}: {v}" for k, v in DEFAULT_IMAGES.items()))
    common.add_argument("--port", type=int, default=DEFAULT_PORT,
                        help=f"port the server listens on, here and in the container (default {DEFAULT_PORT})")
    common.add_argument("--bundle", metavar="DIR",
                        help="the folder made by `sm12x bundle` (default: the folder sm12x runs from)")
    common.add_argument("--gpus", default="all",
                        help='"all" (default), device ids such as 0,1, or "none" (CPU smoke tests)')
    common.add_argument("--env", "-e", action="append", default=[], metavar="KEY=VALUE",
                        help="extra container environment (repeatable)")
    common.add_argument("--name", help="container name")
    common.add_argument("--no-ulimits", action="store_true",
                        help="leave memlock/stack limits as the engine sets them (rootless or locked-down hosts)")
    common.add_argument("--no-spec", dest="spec", action="store_false",
                        help="no speculative decoding (use when doctor says the spec-decode patch is skipped)")
    common.add_argument("--no-recipe", action="store_true",
                        help="only model, TP and port: no DeepSeek-V4-Flash flags or env")
    common.add_argument("--detach", "-d", action="store_true", help="start and return (default: follow logs)")
    common.add_argument("--dry-run", action="store_true",
                        help="check the arguments and the image, print the docker run line, start nothing")
    # The only positional, so `-- --flag value` lands here intact (argparse keeps the "--").
    common.add_argument("extra", nargs=argparse.REMAINDER, help="-- extra framework arguments (added last)")

    p = subparsers.add_parser(
        "launch", help="serve DeepSeek-V4-Flash from a stock vLLM/SGLang image with the bundle mounted",
        description=LAUNCH_HELP.format(framework="vllm", extra="--max-num-seqs 8"),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    frameworks = p.add_subparsers(dest="framework", required=True, metavar="FRAMEWORK",
                                  title="FRAMEWORK (vllm or sglang)")
    extras = {"vllm": "--max-num-seqs 8", "sglang": "--max-running-requests 8"}
    for fw in ("vllm", "sglang"):
        sp = frameworks.add_parser(fw, parents=[common], help=f"serve with {fw} ({DEFAULT_IMAGES[fw]})",
                                   description=LAUNCH_HELP.format(framework=fw, extra=extras[fw]),
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
        sp.set_defaults(func=run_launch)
    p.set_defaults(func=run_launch)
    return p
