"""The op registry: every op has a reference, a self-test and a benchmark script that exists, and
the self-test and the compile check are driven by it."""
import os

from sm12x.kernels import registry

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_every_op_is_complete():
    ops = registry.all_ops()
    names = [op.name for op in ops]
    assert len(names) == len(set(names))
    assert {"sparse_mla_decode", "sparse_mla_prefill", "mqa_logits", "paged_mqa_logits",
            "indexer_topk"} <= set(names)
    for op in ops:
        assert op.family in registry.FAMILIES, op.name
        assert callable(op.reference) and callable(op.selftest), op.name
        assert op.compile_reports is None or callable(op.compile_reports), op.name
        assert op.benchmark and os.path.isfile(os.path.join(REPO, op.benchmark)), op.name


def test_selftest_runs_what_the_registry_lists(monkeypatch):
    """A registered op shows up in the self-test with no other edit."""
    from sm12x.commands import selftest

    seen = []

    def fake_selftest(device, full):
        seen.append(device)
        yield registry.result("fake_op", "one case", ok=True)

    fake = registry.Op(name="fake_op", family="gemm", reference=lambda: None, selftest=fake_selftest)
    monkeypatch.setattr(registry, "all_ops", lambda: [fake])
    assert selftest.run(ops=["fake_op"]) == 0
    assert seen == ["cpu"]
