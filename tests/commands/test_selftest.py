"""`sm12x selftest` on this machine (CPU: Triton interpreter), checked field by field."""
import json

from tests_support import REPO, run_py


def test_selftest_cpu_json(tmp_path):
    path = tmp_path / "st.json"
    proc = run_py(f"from sm12x.cli import main; raise SystemExit(main(['selftest', '--json', {str(path)!r}]))",
                  pythonpath=[REPO], env={"SM12X_ARCH": None})
    doc = json.loads(path.read_text())
    assert doc["mode"] == "interpreter" and doc["device"] == "none"
    assert doc["failed"] == 0 and doc["passed"] == len(doc["results"]) >= 5
    from sm12x.kernels.registry import op_names

    assert {r["op"] for r in doc["results"]} == set(op_names())  # every registered op, nothing else
    for r in doc["results"]:
        assert set(r) >= {"op", "case", "ok", "max_abs", "max_rel", "detail", "us", "throughput"}
        assert r["ok"] is True and r["detail"] == ""
    assert {"arch", "versions", "patches", "bootstrap"} <= set(doc["status"])
    assert "interpreter" in proc.stdout and proc.stdout.strip().endswith("0 failed")


def test_selftest_ops_filter_and_bad_op(tmp_path):
    proc = run_py("from sm12x.cli import main; raise SystemExit(main(['selftest', '--ops', 'mqa_logits']))",
                  pythonpath=[REPO])
    assert "PASS mqa_logits" in proc.stdout and "sparse_mla_decode" not in proc.stdout
    bad = run_py("from sm12x.cli import main; raise SystemExit(main(['selftest', '--ops', 'nope']))",
                 pythonpath=[REPO], check=False)
    assert bad.returncode == 2 and "'--ops' got nope" in bad.stderr
