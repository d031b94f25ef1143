"""scripts/perf_model.py's validation: each sm_90 card's modeled rows are held against that card's
own measured times (an H100 row never against the H200's table), and a card without a measured
case prints no table."""
import importlib.util
import os

import pytest

pytestmark = pytest.mark.cpu_only

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def perf_model(monkeypatch):
    # the script sets these at import: keep the suite's values afterwards
    monkeypatch.setenv("TRITON_INTERPRET", os.environ.get("TRITON_INTERPRET", "1"))
    monkeypatch.setenv("TRITON_DEFAULT_FP_FUSION", os.environ.get("TRITON_DEFAULT_FP_FUSION", "1"))
    spec = importlib.util.spec_from_file_location("perf_model", os.path.join(REPO, "scripts", "perf_model.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_each_card_against_its_own_times(perf_model, monkeypatch):
    key = ("candidate_topk", "vLLM", "source", "decode", 64, 32768, 1, 1024, 18, 64, False)
    monkeypatch.setitem(perf_model.MEASURED_H100, key, 300.0)
    row = dict(op="candidate_topk", case="c", target="sm_90", key=list(key), model_us=330.0, bound="memory")
    rows = [dict(row, card="H100 SXM"), dict(row, card="H200", model_us=200.0),
            dict(row, card="RTX 5090", target="sm_120")]
    h100 = perf_model.validation(rows, "H100 SXM")
    assert [(v["card"], v["measured_us"], v["error"]) for v in h100] == [("H100 SXM", 300.0, 0.1)]
    assert perf_model.validation(rows) == []  # the H200 has no time for this case
    assert perf_model.MEASURED_H100_NOTE in perf_model.validation_table(h100, "H100 SXM").splitlines()[0]
