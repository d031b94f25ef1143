"""``sm12x contract``: verdicts on small release trees built here (a wheel and the same files as a
folder), for records written in the test, and the exit code."""
import functools
import io
import json
import zipfile

import pytest

from sm12x.commands import contract
from sm12x.patches import Patch

# A release of "vllm" (a library key sm12x knows), shaped like the real ones: a kernel module with
# a function, an alias, a stub-or-import pair, a class with a static method, a module that sets a
# name through globals(), re-exports, and modules holding `from X import f` copies.
FILES = {
    "vllm/__init__.py": "",
    "vllm/ops/__init__.py": "",
    "vllm/ops/kernels.py": (
        "from typing import TYPE_CHECKING\n"
        "def logits(q, kv, weights, ks, ke, clean_logits=False):\n    pass\n"
        "def strict(q, kv, *, scale):\n    pass\n"
        "logits_alias = logits\n"
        "try:\n    from vllm.ops._impl import decode\n"
        "except ImportError:\n    def decode(*args, **kwargs):\n        raise RuntimeError('missing')\n"
        "class Experts:\n    @staticmethod\n    def supported():\n        return False\n"
        "if TYPE_CHECKING:\n    def only_typing(x):\n        pass\n"
        "import vllm._custom as ops\n"),
    "vllm/ops/_impl.py": "def decode(q, k_cache, block_table):\n    pass\n",
    "vllm/_custom.py": "def top_k(x):\n    pass\n",
    "vllm/ops/dynamic.py": "def _bind():\n    globals().update({'late': 1})\n_names = ('late',)\n",
    "vllm/ops/reexport.py": "from vllm.ops.kernels import logits\n",
    "vllm/layers/__init__.py": "",
    "vllm/layers/listed.py": "from vllm.ops.kernels import logits\n",
    "vllm/layers/unlisted.py": "from ..ops.kernels import logits as renamed\n",
    "vllm/layers/via_reexport.py": "from vllm.ops.reexport import logits\n",
    "vllm/layers/call_time.py": "def f():\n    from vllm.ops.kernels import logits\n    return logits\n",
    "vllm/layers/typing_only.py": ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                   "    from vllm.ops.kernels import logits\n"),
    "vllm/layers/foreign.py": "from deep_gemm import fp8_mqa_logits\n",
    "vllm/layers/star.py": "from vllm.ops.kernels import *\n",
    # compiled files: a Python extension (exports PyInit_<name>) and a torch.ops library
    "vllm/ops/_ext.abi3.so": "\x7fELF PyInit__ext sparse_decode_fwd",
    "vllm/ops/torch_lib.abi3.so": "\x7fELF sparse_decode_fwd",
    "vllm-0.30.1.dist-info/METADATA": "Metadata-Version: 2.1\nName: vllm\nVersion: 0.30.1\n",
}


def ours(q, kv, weights, cu_seq_len_k_start, cu_seq_len_k_end, clean_logits=True, **kwargs):
    """An sm12x-style front end: unknown keywords are accepted only as None / False."""


def make_passthrough(original):
    """A replacement that takes *args and hands calls on to ``ours`` as they came."""
    @functools.wraps(ours)
    def replacement(*args, **kwargs):
        return ours(*args, **kwargs)

    return replacement


def reads_any(*args, **kwargs):
    """An sm12x-style front end that reads every call itself (two API eras)."""


def make_to_reader(original):
    @functools.wraps(reads_any)
    def replacement(*args, **kwargs):
        return reads_any(*args, **kwargs)

    return replacement


def make_explicit(original):
    @functools.wraps(original)
    def logits(q, kv, weights, ks, ke, clean_logits=True):
        return None

    return logits


def make_needs_scale(original):
    @functools.wraps(original)
    def logits(q, kv, weights, ks, ke, clean_logits=True, *, scale):
        return None

    return logits


def make_anything(original):
    @functools.wraps(original)
    def replacement(*args, **kwargs):
        return original(*args, **kwargs)

    return replacement


def make_module_view(original):
    return object()


def record(name, target, make=make_explicit, versions=">=0.30,<0.31", library="vllm", **kw):
    kw.setdefault("retire_when", "test")
    return Patch(name=name, target=target, make=make, why="test", upstream="test", library=library,
                 versions=versions, **kw)


@pytest.fixture(params=["wheel", "folder"])
def release(request, tmp_path):
    if request.param == "folder":
        root = tmp_path / "site"
        for rel, text in FILES.items():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_text(text)
        return str(root)
    path = tmp_path / "vllm-0.30.1-cp38-abi3-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(path, "w") as z:
        for rel, text in FILES.items():
            z.writestr(rel, text)
    return str(path)


def check(path, *patches):
    report = contract.check_release(path, list(patches))
    return {r["name"]: r for r in report["patches"]}, report


def test_identity_from_dist_info(release):
    _, report = check(release)
    assert (report["distribution"], report["version"], report["library"]) == ("vllm", "0.30.1", "vllm")


def test_range_states(release):
    rows, _ = check(release,
                    record("in", "vllm.ops.kernels:logits"),
                    record("out", "vllm.ops.kernels:logits", versions=">=0.31"),
                    record("retired", "vllm.ops.kernels:logits", versions=">=0.29", fixed_in="0.30"),
                    record("other", "deep_gemm:fp8_mqa_logits", library="deep_gemm", versions="<1"))
    assert [rows[n]["in_range"] for n in ("in", "out", "retired", "other")] == [
        "yes", "no", "retired", "not this library"]
    assert rows["in"]["problem"] is False


def test_missing_module_and_attribute_are_problems_only_in_range(release):
    rows, _ = check(release,
                    record("no_module", "vllm.ops.gone:logits"),
                    record("no_attr", "vllm.ops.kernels:gone"),
                    record("typing_only", "vllm.ops.kernels:only_typing"),
                    record("no_attr_out", "vllm.ops.kernels:gone", versions=">=0.31"),
                    record("no_attr_retired", "vllm.ops.kernels:gone", versions=">=0.29", fixed_in="0.30"))
    assert rows["no_module"]["module"] == "missing (vllm.ops has no gone)"
    assert rows["no_attr"]["module"] == "found" and rows["no_attr"]["attribute"] == "missing"
    assert rows["typing_only"]["attribute"] == "missing"  # bound under `if TYPE_CHECKING:` only
    assert [rows[n]["problem"] for n in rows] == [True, True, True, False, False]


def test_what_a_target_is_bound_to(release):
    rows, _ = check(release,
                    record("alias", "vllm.ops.kernels:logits_alias"),
                    record("stub_or_import", "vllm.ops.kernels:decode", make=make_anything),
                    record("method", "vllm.ops.kernels:Experts.supported", make=make_anything),
                    record("module", "vllm.ops.kernels:ops", make=make_module_view),
                    record("dynamic", "vllm.ops.dynamic:late", make=make_anything))
    assert rows["alias"]["attribute"] == "found: function"
    assert rows["alias"]["signature"] == "compatible"
    assert rows["stub_or_import"]["attribute"].count("function") == 2  # the import and the stub
    assert "in vllm.ops._impl" in rows["stub_or_import"]["attribute"]
    assert rows["method"]["attribute"] == "found: method (staticmethod)"
    assert rows["module"]["attribute"] == "found: module (vllm._custom)"
    assert rows["module"]["signature"] == "n/a"
    assert rows["dynamic"]["attribute"].startswith("found: dynamic")
    assert rows["dynamic"]["signature"] == "unknown" and rows["dynamic"]["problem"] is False


def test_compiled_modules(release):
    rows, _ = check(release,
                    record("ext", "vllm.ops._ext:sparse_decode_fwd", make=make_anything),
                    record("ext_gone", "vllm.ops._ext:other_fwd", make=make_anything),
                    record("torch_lib", "vllm.ops.torch_lib:sparse_decode_fwd", make=make_anything))
    assert rows["ext"]["module"] == "found (compiled extension)"
    assert rows["ext"]["attribute"].startswith("found: compiled") and rows["ext"]["signature"] == "unknown"
    assert rows["ext"]["problem"] is False
    assert rows["ext_gone"]["attribute"] == "missing" and rows["ext_gone"]["problem"]
    assert "loaded through torch.ops, not a Python module" in rows["torch_lib"]["module"]
    assert rows["torch_lib"]["problem"]


def test_explicit_replacement_signatures(release):
    rows, _ = check(release,
                    record("same", "vllm.ops.kernels:logits"),
                    record("renamed", "vllm.ops.kernels:strict"),
                    record("needs_more", "vllm.ops.kernels:logits", make=make_needs_scale))
    assert rows["same"]["signature"] == "compatible"
    # strict(q, kv, *, scale) against logits(q, kv, weights, ks, ke, ...): scale= is refused, and
    # weights / ks / ke are required by the replacement but never passed
    assert rows["renamed"]["signature"] == "incompatible"
    assert "scale= is refused" in rows["renamed"]["signature_detail"]
    assert "requires weights" in rows["renamed"]["signature_detail"]
    assert rows["needs_more"]["signature"] == "incompatible"
    assert "requires scale" in rows["needs_more"]["signature_detail"]
    assert rows["renamed"]["problem"] and rows["needs_more"]["problem"]


def test_handed_on_replacement_maps_names_to_the_front_end(release):
    rows, _ = check(release, record("passthrough", "vllm.ops.kernels:logits", make=make_passthrough),
                    record("strict", "vllm.ops.kernels:strict", make=make_passthrough),
                    record("reader", "vllm.ops.kernels:strict", make=make_to_reader))
    assert rows["reader"]["signature"] == "compatible"
    assert "takes any arguments" in rows["reader"]["signature_detail"]
    # ks / ke have no counterpart by name and ours has **kwargs: accepted only as None/False, and
    # ours needs weights and the ranges, which strict() does not take
    assert rows["passthrough"]["signature"] == "incompatible"
    assert "cu_seq_len_k_start" in rows["passthrough"]["signature_detail"]
    assert "requires weights" in rows["strict"]["signature_detail"]


def test_deep_gemm_front_end_renames_by_position_and_refuses_unknown_defaults(tmp_path):
    """The real DeepGEMM factory (``_by_name``): sgl-deep-gemm's ks/ke are read as our ranges; a
    new required parameter, or a new default sm12x would refuse, is incompatible."""
    from sm12x.frontends.deep_gemm import wrappers

    def deep_gemm(signature):
        root = tmp_path / f"release{len(list(tmp_path.iterdir()))}"
        (root / "deep_gemm").mkdir(parents=True)
        (root / "deep_gemm" / "__init__.py").write_text(f"def fp8_mqa_logits({signature}):\n    pass\n")
        (root / "sgl_deep_gemm-0.1.4.dist-info").mkdir()
        (root / "sgl_deep_gemm-0.1.4.dist-info" / "METADATA").write_text("Name: sgl-deep-gemm\nVersion: 0.1.4\n")
        p = Patch(name="dg", target="deep_gemm:fp8_mqa_logits", make=wrappers.FACTORIES["fp8_mqa_logits"], why="t",
                  upstream="t", library="deep_gemm", versions="<0.2", retire_when="t")
        return contract.check_release(str(root), [p])["patches"][0]

    good = deep_gemm("q, kv, weights, ks, ke, clean_logits=False, max_seqlen_k=0")
    assert good["signature"] == "compatible", good
    assert "ks read as cu_seq_len_k_start" in good["signature_detail"]
    required = deep_gemm("q, kv, weights, ks, ke, page_size, clean_logits=False")
    assert required["signature"] == "incompatible" and "page_size" in required["signature_detail"]
    on_by_default = deep_gemm("q, kv, weights, ks, ke, clean_logits=False, *, fused_topk=True")
    assert on_by_default["signature"] == "incompatible"
    assert "fused_topk=True" in on_by_default["signature_detail"]
    off_by_default = deep_gemm("q, kv, weights, ks, ke, clean_logits=False, *, fused_topk=None")
    assert off_by_default["signature"] == "compatible"
    # a new positional parameter is read by position as ours there, as the front end does: shown
    in_our_place = deep_gemm("q, kv, weights, ks, ke, clean_logits=False, fused_topk=True")
    assert "fused_topk read as max_seqlen_k" in in_our_place["signature_detail"]


def test_consumers_copies_and_coverage(release):
    rows, _ = check(release,
                    record("logits", "vllm.ops.kernels:logits",
                           consumers=("vllm.layers.listed", "vllm.layers.call_time", "vllm.layers.gone",
                                      "sglang.srt.elsewhere")),
                    record("foreign", "deep_gemm:fp8_mqa_logits", library="deep_gemm", versions="<1"))
    c = rows["logits"]["consumers"]
    assert c["copies"] == ["vllm.layers.listed", "vllm.layers.star", "vllm.layers.unlisted",
                           "vllm.layers.via_reexport", "vllm.ops.reexport"]  # not call_time, not typing_only
    assert c["uncovered"] == ["vllm.layers.star", "vllm.layers.unlisted", "vllm.layers.via_reexport",
                              "vllm.ops.reexport"]
    states = {x["module"]: x["state"] for x in c["listed"]}
    assert states == {"vllm.layers.listed": "copy", "vllm.layers.call_time": "names it",
                      "vllm.layers.gone": "absent", "sglang.srt.elsewhere": "in another distribution"}
    # another library's target: the copies this release holds are reported too
    assert rows["foreign"]["consumers"]["uncovered"] == ["vllm.layers.foreign"]


def test_exit_code_and_output(release):
    ok = [record("fine", "vllm.ops.kernels:logits"), record("out", "vllm.ops.kernels:gone", versions=">=0.31")]
    out = io.StringIO()
    assert contract.run([release], stream=out, patches=ok) == 0
    assert "fine  ->  vllm.ops.kernels:logits" in out.getvalue() and "PROBLEM" not in out.getvalue()
    bad = ok + [record("broken", "vllm.ops.kernels:strict")]
    out = io.StringIO()
    assert contract.run([release], stream=out, patches=bad) == 1
    assert "PROBLEM broken" in out.getvalue()
    out = io.StringIO()
    assert contract.run([release], as_json=True, stream=out, patches=bad) == 1
    rows = {r["name"]: r for r in json.loads(out.getvalue())[0]["patches"]}
    assert rows["broken"]["problem"] and not rows["fine"]["problem"]


def test_markdown_matrix(release):
    patches = [record("fine", "vllm.ops.kernels:logits", consumers=("vllm.layers.listed",)),
               record("out", "vllm.ops.kernels:gone", versions=">=0.31"),
               record("old", "vllm.ops.kernels:logits", versions="<0.30"),
               record("broken", "vllm.ops.kernels:gone")]
    out = io.StringIO()
    assert contract.run([release], stream=out, patches=patches, markdown=True) == 1
    text = out.getvalue()
    assert "### vllm 0.30.1" in text
    assert "| `fine` | `vllm.ops.kernels:logits` | `>=0.30,<0.31` | resolves: target found, signature compatible |" in text
    assert "| `out` | `vllm.ops.kernels:gone` | `>=0.31` | skips: outside >=0.31 |" in text
    assert "| `broken` | `vllm.ops.kernels:gone` | `>=0.30,<0.31` | **record bug**: attribute missing |" in text
    assert "`vllm.layers.unlisted`" in text  # a copy the record does not list
    assert "not in `old`'s consumers" not in text  # a record that skips here installs nothing


def test_cli(release, capsys, tmp_path):
    from sm12x.cli import main

    assert main(["contract", str(tmp_path / "nothing.whl")]) == 2
    assert "does not exist" in capsys.readouterr().err
    not_a_wheel = tmp_path / "notes.txt"
    not_a_wheel.write_text("x")
    assert main(["contract", str(not_a_wheel)]) == 2
    # sm12x's own records against this small release: vllm 0.30.1 is inside their vLLM ranges and
    # holds none of their targets, so they are record bugs here (exit code 1)
    assert main(["contract", release]) == 1
    out = capsys.readouterr().out
    assert "vllm 0.30.1 (vllm)" in out and "PROBLEM vllm.third_party.flashmla.decode" in out


def test_site_packages_folder_reports_each_patched_distribution(tmp_path):
    root = tmp_path / "site-packages"
    for rel, text in {"vllm/__init__.py": "def f(x):\n    pass\n",
                      "deep_gemm/__init__.py": "def g(x):\n    pass\n",
                      "requests/__init__.py": "",
                      "requests-2.0.dist-info/METADATA": "Name: requests\nVersion: 2.0\n",
                      "vllm-0.30.1.dist-info/METADATA": "Name: vllm\nVersion: 0.30.1\n",
                      "deep_gemm-2.5.0.dist-info/METADATA": "Name: deep-gemm\nVersion: 2.5.0\n"}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    patches = [record("v", "vllm:f", make=make_anything),
               record("d", "deep_gemm:g", library="deep_gemm", versions=">=2.5", make=make_anything)]
    reports = contract.check_releases(str(root), patches)
    assert sorted((r["library"], r["version"]) for r in reports) == [("deep_gemm", "2.5.0"), ("vllm", "0.30.1")]
    for r in reports:
        mine = [row for row in r["patches"] if row["in_range"] == "yes"]
        assert len(mine) == 1 and mine[0]["attribute"] == "found: function"


def _layer(name, versions, library="vllm"):
    from sm12x.patches import Layer

    return Layer(name=name, make=make_anything, why="test", upstream="test", library=library, versions=versions,
                 retire_when="test")


def test_layer_ranges_are_checked(release):
    """A stacked layer's range is read against the release like its record's; a layer in range
    where its record is not would never stack: a record bug (exit code 1)."""
    rec = record("stacked", "vllm.ops.kernels:logits",
                 layers=(_layer("stacked.in", ">=0.30"), _layer("stacked.out", "<0.30"),
                         _layer("stacked.dg", "<9", library="deep_gemm")))
    rows, _ = check(release, rec)
    assert [(l["name"], l["in_range"], l["problem"]) for l in rows["stacked"]["layers"]] == [
        ("stacked.in", "yes", False), ("stacked.out", "no", False)]
    assert not rows["stacked"]["problem"]
    stray = record("stray", "vllm.ops.kernels:logits", versions=">=0.31",
                   layers=(_layer("stray.in", ">=0.30,<0.32"),))
    rows, _ = check(release, stray)
    assert rows["stray"]["in_range"] == "no" and rows["stray"]["layers"][0]["problem"] and rows["stray"]["problem"]
    out = io.StringIO()
    assert contract.run([release], stream=out, patches=[rec, stray]) == 1
    assert "PROBLEM layer stray.in" in out.getvalue()
    md = io.StringIO()
    contract.run([release], stream=md, patches=[rec, stray], markdown=True)
    assert "| `stacked.in` (layer) |" in md.getvalue() and "in range where its record is not" in md.getvalue()
