"""The injector with real interpreters: bootstrap, watcher, apply loop, chaining, children,
both install routes, selection by arch and version, torch.compile.

Stand-in framework packages are written to a temporary folder (a real package named ``flash_mla``
with a submodule and a ``from X import f`` consumer), and a small patch set replaces
``sm12x.apply.all_patches`` inside the child process, so these tests exercise the real mechanism
without the kernels.
"""
import json
import os
import textwrap

import pytest

from tests_support import REPO, last_json, run_py, write_tree

STANDIN = {
    "flash_mla/__init__.py": """
        from flash_mla.flash_mla_interface import flash_mla_with_kvcache, get_mla_metadata
        from flash_mla import consumer
        IMPORTED_CONSUMER_VALUE = consumer.captured
    """,
    "flash_mla/flash_mla_interface.py": """
        def flash_mla_with_kvcache(x):
            return ("original", x)

        def get_mla_metadata():
            return "original-meta"

        class Scheduler:
            @staticmethod
            def plan(x):
                return ("original-plan", x)
    """,
    "flash_mla/consumer.py": """
        from flash_mla.flash_mla_interface import flash_mla_with_kvcache
        captured = flash_mla_with_kvcache
        def run(x):
            return flash_mla_with_kvcache(x)
    """,
    "flash_mla/late_consumer.py": """
        from flash_mla.flash_mla_interface import flash_mla_with_kvcache
    """,
    "flash_mla-1.2.0.dist-info/METADATA": """
        Metadata-Version: 2.1
        Name: flash-mla
        Version: 1.2.0
    """,
    "standin_patches.py": """
        import functools
        from sm12x.patches import Patch

        def make(original):
            @functools.wraps(original)
            def replacement(x):
                return ("sm12x", x)
            return replacement

        def make_plan(original):
            def plan(x):
                return ("sm12x-plan", x)
            return plan

        def make_broken(original):
            raise RuntimeError("factory exploded")

        T = dict(why="test", upstream="test", library="flash_mla", versions="*", versions_note="test",
                 retire_when="test")
        PATCHES = [
            Patch(name="t.decode", target="flash_mla.flash_mla_interface:flash_mla_with_kvcache",
                  make="standin_patches:make", **T,
                  consumers=("flash_mla.consumer", "flash_mla.late_consumer")),
            Patch(name="t.static", target="flash_mla.flash_mla_interface:Scheduler.plan",
                  make="standin_patches:make_plan", **T),
        ]
        EXTRA = {
            "missing": Patch(name="t.missing", target="flash_mla.flash_mla_interface:gone",
                             make="standin_patches:make", **T),
            "old_range": Patch(name="t.range", target="flash_mla.flash_mla_interface:get_mla_metadata",
                               make="standin_patches:make", why="test", upstream="test",
                               library="flash_mla", versions="<1.0", retire_when="test"),
            "in_range": Patch(name="t.range", target="flash_mla.flash_mla_interface:get_mla_metadata",
                              make="standin_patches:make", why="test", upstream="test",
                              library="flash_mla", versions=">=1.2,<1.3", retire_when="test"),
            "retired": Patch(name="t.range", target="flash_mla.flash_mla_interface:get_mla_metadata",
                             make="standin_patches:make", why="test", upstream="test",
                             library="flash_mla", versions=">=1.0,<2", fixed_in="1.2"),
            "broken": Patch(name="t.broken", target="flash_mla.flash_mla_interface:get_mla_metadata",
                            make="standin_patches:make_broken", **T),
        }

        def use(*extra):
            import sm12x.apply
            chosen = PATCHES + [EXTRA[e] for e in extra]
            sm12x.apply.all_patches = lambda: list(chosen)
    """,
}


@pytest.fixture
def standin(tmp_path):
    return write_tree(tmp_path, STANDIN)


SETUP = """
import standin_patches; standin_patches.use({extra})
"""


def test_watcher_patches_submodule_and_consumers(standin):
    proc = run_py(SETUP.format(extra="") + """
import json, sys
import flash_mla
from flash_mla import consumer, flash_mla_interface as fi
from sm12x import apply
print(json.dumps({
    "interface": fi.flash_mla_with_kvcache(1),
    "package_copy": flash_mla.flash_mla_with_kvcache(2),
    "consumer": consumer.run(3),
    "captured_at_import": flash_mla.IMPORTED_CONSUMER_VALUE(4),
    "static": fi.Scheduler.plan(5),
    "static_is_static": isinstance(vars(fi.Scheduler)["plan"], staticmethod),
    "outcomes": apply.OUTCOMES,
    "original_kept": fi.flash_mla_with_kvcache.__sm12x_original__(6),
}))
""", pythonpath=[REPO, standin])
    out = last_json(proc)
    assert out["interface"] == ["sm12x", 1]
    assert out["package_copy"] == ["sm12x", 2]
    assert out["consumer"] == ["sm12x", 3]
    assert out["captured_at_import"] == ["sm12x", 4]
    assert out["static"] == ["sm12x-plan", 5]
    assert out["static_is_static"] is True
    assert out["outcomes"]["t.decode"][0] == "applied"
    assert out["original_kept"] == ["original", 6]


def test_nothing_heavy_until_watched_import(standin):
    proc = run_py("""
import json, sys
before = sorted(m for m in ("torch", "wrapt", "importlib.metadata", "sm12x.apply", "logging",
                            "sm12x.patches") if m in sys.modules)
import flash_mla
after = "sm12x.apply" in sys.modules
print(json.dumps({"before": before, "after": after,
                  "site": sys.modules["sitecustomize"].__file__}))
""", pythonpath=[REPO, standin])
    out = last_json(proc)
    assert out["before"] == []
    assert out["after"] is True
    assert out["site"] == os.path.join(REPO, "sitecustomize.py")


def test_no_cuda_init_in_a_process_with_torch(standin):
    pytest.importorskip("torch")
    proc = run_py(SETUP.format(extra="") + """
import json, torch, flash_mla, sm12x
sm12x.install()
from sm12x.commands.status import status_data
status_data()
print(json.dumps({"cuda_initialized": torch.cuda.is_initialized()}))
""", pythonpath=[REPO, standin])
    assert last_json(proc) == {"cuda_initialized": False}


def test_chaining_runs_original_once_and_survives_an_error(tmp_path):
    orig = tmp_path / "orig"
    orig.mkdir()
    marker = tmp_path / "ran.txt"
    (orig / "sitecustomize.py").write_text(
        f"open({str(marker)!r}, 'a').write('x')\nraise RuntimeError('image bug')\n")
    proc = run_py("""
import json, sys
site = sys.modules["sitecustomize"]
print(json.dumps({"ours": site.__file__, "chained": site._sm12x_chained,
                  "active": site._sm12x_active}))
""", pythonpath=[REPO, orig])
    out = last_json(proc)
    assert out["ours"] == os.path.join(REPO, "sitecustomize.py")
    assert out["chained"] == str(orig / "sitecustomize.py")
    assert out["active"] is True
    assert marker.read_text() == "x"  # exactly once


def test_disable_only_chains(tmp_path, standin):
    orig = tmp_path / "orig"
    orig.mkdir()
    (orig / "sitecustomize.py").write_text("import builtins\nbuiltins.ORIG_RAN = True\n")
    proc = run_py(SETUP.format(extra="") + """
import builtins, json, sys
import flash_mla
print(json.dumps({"orig": getattr(builtins, "ORIG_RAN", False),
                  "result": flash_mla.flash_mla_with_kvcache(1),
                  "watcher": any(hasattr(f, "__sm12x_watcher__") for f in sys.meta_path)}))
""", pythonpath=[REPO, standin, orig], env={"SM12X_DISABLE": "1"})
    assert last_json(proc) == {"orig": True, "result": ["original", 1], "watcher": False}


@pytest.mark.parametrize("flag", ["-I", "-E"])
def test_isolated_and_ignore_env_flags_disable_it(flag, standin):
    proc = run_py("""
import json, sys
site = sys.modules.get("sitecustomize")
print(json.dumps({"ours": getattr(site, "_sm12x_active", None) is not None}))
""", pythonpath=[REPO, standin], flags=(flag,))
    assert last_json(proc) == {"ours": False}


def test_spawn_and_fork_children_are_patched(standin):
    (standin / "spawn_child.py").write_text(textwrap.dedent("""
        def child(q):
            import standin_patches; standin_patches.use()
            import flash_mla
            q.put(flash_mla.flash_mla_with_kvcache(7))
    """))
    proc = run_py(SETUP.format(extra="") + """
import json, multiprocessing as mp
from spawn_child import child
out = {}
for method in ("spawn", "fork"):
    ctx = mp.get_context(method)
    q = ctx.Queue()
    p = ctx.Process(target=child, args=(q,))
    p.start(); out[method] = q.get(timeout=120); p.join()
print(json.dumps(out))
""", pythonpath=[REPO, standin])
    assert last_json(proc) == {"spawn": ["sm12x", 7], "fork": ["sm12x", 7]}


def test_plugin_route_patches_already_imported_modules_and_rebinds(standin):
    """Without sitecustomize (not on the path), the plugin entry point found through the
    dist-info on the mount does the same job, rebinding copies taken before it ran."""
    proc = run_py(f"""
import sys; sys.path.insert(0, {REPO!r})
import standin_patches; standin_patches.use()
import json
import flash_mla.late_consumer as late
from importlib.metadata import entry_points
before = late.flash_mla_with_kvcache(1)
eps = [ep for ep in entry_points(group="vllm.general_plugins") if ep.name == "sm12x"]
eps[0].load()()
sg = [ep.value for ep in entry_points(group="sglang.srt.plugins") if ep.name == "sm12x"]
print(json.dumps({{"before": before, "after": late.flash_mla_with_kvcache(2), "sglang": sg}}))
""", pythonpath=[standin])
    out = last_json(proc)
    assert out["before"] == ["original", 1]
    assert out["after"] == ["sm12x", 2]
    assert out["sglang"] == ["sm12x.plugin:register"]


def test_both_routes_are_idempotent(standin):
    proc = run_py(SETUP.format(extra="") + """
import json, flash_mla
from flash_mla import flash_mla_interface as fi
from sm12x import plugin
first = fi.flash_mla_with_kvcache
plugin.register(); plugin.register()
import sm12x; sm12x.install()
print(json.dumps({"same": fi.flash_mla_with_kvcache is first,
                  "inner_is_original": fi.flash_mla_with_kvcache.__sm12x_original__(1),
                  "watchers": sum(hasattr(f, "__sm12x_watcher__") for f in __import__("sys").meta_path)}))
""", pythonpath=[REPO, standin])
    out = last_json(proc)
    assert out == {"same": True, "inner_is_original": ["original", 1], "watchers": 1}


def test_arch_selection(standin):
    code = SETUP.format(extra="") + """
import json, flash_mla
from sm12x import apply
print(json.dumps({"result": flash_mla.flash_mla_with_kvcache(1),
                  "outcome": apply.OUTCOMES["t.decode"]}))
"""
    hopper = last_json(run_py(code, pythonpath=[REPO, standin], env={"SM12X_ARCH": "9.0"}))
    assert hopper["result"] == ["original", 1]
    assert hopper["outcome"][0] == "skipped" and "SM12X_FORCE" in hopper["outcome"][1]
    forced = last_json(run_py(code, pythonpath=[REPO, standin],
                              env={"SM12X_ARCH": "9.0", "SM12X_FORCE": "1"}))
    assert forced["result"] == ["sm12x", 1]
    spark = last_json(run_py(code, pythonpath=[REPO, standin], env={"SM12X_ARCH": "12.1"}))
    assert spark["result"] == ["sm12x", 1]
    nogpu = last_json(run_py(code, pythonpath=[REPO, standin], env={"SM12X_ARCH": None}))
    assert nogpu["result"] == ["original", 1] and "no GPU" in nogpu["outcome"][1]


@pytest.mark.parametrize("extra,state,reason", [
    ("old_range", "skipped", "flash_mla 1.2.0 outside the checked range <1.0"),
    ("in_range", "applied", ""),
    ("retired", "retired", "flash_mla 1.2.0 serves this on SM12x itself (fixed in 1.2)"),
    ("missing", "skipped", "flash_mla.flash_mla_interface:gone not found"),
    ("broken", "failed", "RuntimeError: factory exploded"),
])
def test_version_range_missing_target_and_failure(standin, extra, state, reason):
    name = {"old_range": "t.range", "in_range": "t.range", "retired": "t.range", "missing": "t.missing",
            "broken": "t.broken"}[extra]
    proc = run_py(SETUP.format(extra=repr(extra)) + f"""
import json, flash_mla
from sm12x import apply
print(json.dumps({{"outcome": apply.OUTCOMES[{name!r}],
                   "meta": flash_mla.flash_mla_interface.get_mla_metadata.__module__,
                   "decode": flash_mla.flash_mla_with_kvcache(1)}}))
""", pythonpath=[REPO, standin])
    out = last_json(proc)
    assert out["outcome"][0] == state
    assert reason in out["outcome"][1]
    assert out["decode"] == ["sm12x", 1]  # one bad patch never stops the others
    if state != "applied":
        assert out["meta"] == "flash_mla.flash_mla_interface"  # never half-applied
    if state == "failed":
        assert "t.broken" in proc.stderr and "factory exploded" in proc.stderr  # logged


def test_strict_turns_skips_into_errors(standin):
    proc = run_py(SETUP.format(extra="'missing'") + """
import flash_mla
""", pythonpath=[REPO, standin], env={"SM12X_STRICT": "1"}, check=False)
    assert proc.returncode != 0
    assert "PatchError" in proc.stderr and "t.missing" in proc.stderr


def test_strict_leaves_a_release_outside_the_range_skipped(standin):
    """A record for other releases is skipped by design: strict mode records it and goes on."""
    proc = run_py(SETUP.format(extra="'old_range'") + """
import flash_mla
from sm12x import apply
print(apply.OUTCOMES["t.range"][0], apply.OUTCOMES["t.decode"][0])
""", pythonpath=[REPO, standin], env={"SM12X_STRICT": "1"})
    assert proc.stdout.split()[-2:] == ["skipped", "applied"]


def test_info_log_summary_line(standin):
    proc = run_py(SETUP.format(extra="") + "import flash_mla\n", pythonpath=[REPO, standin],
                  env={"SM12X_LOG": "info"})
    lines = [l for l in proc.stderr.splitlines() if "flash_mla.flash_mla_interface: arch 12.0" in l]
    assert len(lines) == 1 and "t.decode=applied" in lines[0]
    quiet = run_py(SETUP.format(extra="") + "import flash_mla\n", pythonpath=[REPO, standin])
    assert quiet.stderr.strip() == ""


def test_torch_compile_traces_the_replacement(standin):
    pytest.importorskip("torch")
    (standin / "flash_mla" / "scaler.py").write_text("def scale(x):\n    return x * 2\n")
    (standin / "scale_patch.py").write_text(textwrap.dedent("""
        import functools
        from sm12x.patches import Patch
        def make(original):
            @functools.wraps(original)
            def scale(x):
                return x * 3
            return scale
        P = Patch(name="t.scale", target="flash_mla.scaler:scale", make="scale_patch:make",
                  why="test", upstream="test", library="flash_mla", versions="*", versions_note="test",
                  retire_when="test")
    """))
    proc = run_py("""
import json, scale_patch, sm12x.apply
sm12x.apply.all_patches = lambda: [scale_patch.P]
import torch
import flash_mla.scaler as scaler

def model(x):
    return scaler.scale(x) + 1

compiled = torch.compile(model, backend="eager", fullgraph=True)
x = torch.ones(2)
print(json.dumps({"eager": model(x).tolist(), "compiled": compiled(x).tolist()}))
""", pythonpath=[REPO, standin])
    assert last_json(proc) == {"eager": [4.0, 4.0], "compiled": [4.0, 4.0]}


def test_status_json_contract(standin):
    proc = run_py(SETUP.format(extra="'missing'") + """
from sm12x.cli import main
main(["status", "--json", "--apply"])
""", pythonpath=[REPO, standin])
    data = json.loads(proc.stdout)
    assert data["arch"]["capability"] == [12, 0] and data["arch"]["source"] == "env"
    assert set(data["versions"]) >= {"vllm", "sglang", "sgl-kernel", "flashinfer-python",
                                     "flash_mla", "deep_gemm", "torch", "triton"}
    assert data["versions"]["flash_mla"] == "1.2.0"
    states = {p["name"]: (p["state"], p["reason"]) for p in data["patches"]}
    assert states["t.decode"][0] == "applied"
    assert states["t.missing"][0] == "skipped"
    for p in data["patches"]:
        assert set(p) == {"name", "target", "state", "reason", "library", "versions", "fixed_in",
                          "retire_when", "upstream", "why", "layer_of"}
        assert p["state"] in {"would-apply", "applied", "skipped", "retired", "failed"}
    assert data["bootstrap"]["active"] is True


def test_status_plan_without_importing(standin):
    proc = run_py(SETUP.format(extra="") + """
import sys
from sm12x.cli import main
main(["status", "--json"])
assert "flash_mla" not in sys.modules
""", pythonpath=[REPO, standin])
    data = json.loads(proc.stdout)
    assert {p["name"]: p["state"] for p in data["patches"]} == {"t.decode": "would-apply",
                                                                "t.static": "would-apply"}
    plain = run_py(SETUP.format(extra="") + "from sm12x.cli import main; main(['status'])",
                   pythonpath=[REPO, standin])
    assert "would-apply" in plain.stdout
    assert "GPU:        compute capability 12.0 (pretended by SM12X_ARCH): SM12x patches on" in plain.stdout


def test_real_registry_plan_lists_every_route(standin):
    proc = run_py("from sm12x.cli import main; main(['status', '--json'])",
                  pythonpath=[REPO])
    targets = {p["target"] for p in json.loads(proc.stdout)["patches"]}
    for t in ("flash_mla:flash_mla_with_kvcache", "flash_mla.cuda:sparse_decode_fwd",
              "sgl_kernel.flash_mla:flash_mla_with_kvcache",
              "vllm.third_party.flashmla.flash_mla_interface:flash_mla_with_kvcache",
              "deep_gemm:fp8_paged_mqa_logits"):
        assert t in targets


def test_deep_gemm_stand_in_only_when_absent(standin):
    pytest.importorskip("torch")
    code = """
import importlib.util, json
assert importlib.util.find_spec("deep_gemm") is not None  # how vLLM's has_deep_gemm() asks
import deep_gemm
from sm12x.frontends.deep_gemm import indexer as deep_gemm_api
from sm12x import shims
print(json.dumps({"shim": getattr(deep_gemm, "__sm12x_shim__", False),
                  "has_all": all(hasattr(deep_gemm, n) for n in deep_gemm_api.NAMES
                                 + deep_gemm_api.HELPER_NAMES),
                  "state": shims.shim_state("deep_gemm"),
                  "paged": deep_gemm.fp8_paged_mqa_logits.__module__}))
"""
    out = last_json(run_py(code, pythonpath=[REPO]))
    assert out == {"shim": True, "has_all": True, "state": "active",
                   "paged": "sm12x.frontends.deep_gemm.indexer"}
    off = run_py("import deep_gemm", pythonpath=[REPO], env={"SM12X_SHIMS": "0"}, check=False)
    assert "No module named 'deep_gemm'" in off.stderr
    hopper = run_py("import deep_gemm", pythonpath=[REPO], env={"SM12X_ARCH": "9.0"}, check=False)
    assert "No module named 'deep_gemm'" in hopper.stderr
    # a real (stand-in) deep_gemm wins and gets patched instead
    (standin / "deep_gemm").mkdir()
    (standin / "deep_gemm" / "__init__.py").write_text(
        "def fp8_paged_mqa_logits(*a, **k):\n    raise RuntimeError('Unsupported architecture')\n")
    real = last_json(run_py("""
import json, deep_gemm
from sm12x import apply
print(json.dumps({"shim": getattr(deep_gemm, "__sm12x_shim__", False),
                  "patched": getattr(deep_gemm.fp8_paged_mqa_logits, "__sm12x_patch__", None),
                  "missing": apply.OUTCOMES["deep_gemm.fp8_mqa_logits"][0]}))
""", pythonpath=[REPO, standin]))
    assert real == {"shim": False, "patched": "deep_gemm.fp8_paged_mqa_logits",
                    "missing": "skipped"}
    # vLLM with a vendored copy: no stand-in, the vendored copy is what vLLM uses
    for rel in ("vllm/__init__.py", "vllm/third_party/__init__.py",
                "vllm/third_party/deep_gemm/__init__.py"):
        (standin / rel).parent.mkdir(parents=True, exist_ok=True)
        (standin / rel).write_text("")
    (standin / "deep_gemm" / "__init__.py").unlink()
    (standin / "deep_gemm").rmdir()
    vendored = run_py("import vllm, deep_gemm", pythonpath=[REPO, standin], check=False)
    assert "No module named 'deep_gemm'" in vendored.stderr


def test_bundle_is_a_self_contained_mount(tmp_path, standin):
    bundle = tmp_path / "bundle"
    run_py(f"from sm12x.cli import main; main(['bundle', {str(bundle)!r}])", pythonpath=[REPO])
    names = sorted(p.name for p in bundle.iterdir())
    assert names == ["__pycache__", "sitecustomize.py", "sm12x", "sm12x_plugin-0.1.0.dist-info"]
    assert not list(bundle.rglob("*.so"))  # pure Python: the same folder serves x86_64 and aarch64
    assert not (bundle / "tests").exists() and not (bundle / "scripts").exists()
    # the bundle alone (not the repo) on PYTHONPATH does the job
    proc = run_py("""
import json
import standin_patches; standin_patches.use()
import flash_mla, sm12x
print(json.dumps({"pkg": sm12x.__file__, "result": flash_mla.flash_mla_with_kvcache(1)}))
""", pythonpath=[bundle, standin])
    out = last_json(proc)
    assert out["pkg"].startswith(str(bundle)) and out["result"] == ["sm12x", 1]


def test_skip_names_patches_and_prefixes(standin):
    """SM12X_SKIP leaves out the patches it names (exactly or by a dotted prefix), records why,
    and is not an error under SM12X_STRICT; a prefix must end at a dot, and status names the
    entries that match no patch."""
    code = SETUP.format(extra="") + """
import json, flash_mla
from sm12x import apply
print(json.dumps({"decode": flash_mla.flash_mla_with_kvcache(1),
                  "plan": flash_mla.flash_mla_interface.Scheduler.plan(2),
                  "outcomes": {k: list(v) for k, v in apply.OUTCOMES.items()}}))
"""
    by_name = last_json(run_py(code, pythonpath=[REPO, standin],
                               env={"SM12X_SKIP": "t.decode", "SM12X_STRICT": "1"}))
    assert by_name["decode"] == ["original", 1] and by_name["plan"] == ["sm12x-plan", 2]
    assert by_name["outcomes"]["t.decode"] == ["skipped", "turned off by SM12X_SKIP"]
    by_prefix = last_json(run_py(code, pythonpath=[REPO, standin], env={"SM12X_SKIP": " x, t "}))
    assert by_prefix["decode"] == ["original", 1] and by_prefix["plan"] == ["original-plan", 2]
    partial = last_json(run_py(code, pythonpath=[REPO, standin], env={"SM12X_SKIP": "t.dec"}))
    assert partial["decode"] == ["sm12x", 1]
    status = run_py(SETUP.format(extra="") + """
import json
from sm12x.commands.status import status_data, print_status
print_status(status_data())
print(json.dumps(status_data()["skip"]))
""", pythonpath=[REPO, standin], env={"SM12X_SKIP": "t.decode,t.dec"})
    assert last_json(status) == {"items": ["t.decode", "t.dec"], "unmatched": ["t.dec"]}
    assert "SM12X_SKIP: t.decode, t.dec\n" in status.stdout
    assert "WARNING:    SM12X_SKIP names no sm12x patch: t.dec (a typo skips nothing" in status.stdout


def test_status_plan_reports_retired(standin):
    proc = run_py(SETUP.format(extra="'retired'") + """
import sys
from sm12x.cli import main
main(["status", "--json"])
assert "flash_mla" not in sys.modules
""", pythonpath=[REPO, standin])
    rows = {p["name"]: p for p in json.loads(proc.stdout)["patches"]}
    assert rows["t.range"]["state"] == "retired" and rows["t.range"]["fixed_in"] == "1.2"
    assert rows["t.decode"]["state"] == "would-apply"
