"""The patch records: each states its range, its upstream and its own reason."""
import pytest


def test_every_record_states_its_range_and_upstream():
    """Each real patch names what it answers upstream, has its own why, and a checked release
    range (or says why it holds for every release); fixed_in is a release number or empty."""
    from sm12x.patches import all_patches

    patches = all_patches()
    assert len({p.name for p in patches}) == len(patches)
    for p in patches:
        assert p.upstream and p.why, p.name
        assert p.versions not in ("", "*") or p.versions_note, p.name
    whys = [p.why for p in patches]
    assert len(set(whys)) == len(whys), "two records share one why"
    # why: the failure and its effect in a sentence or two (release-reading notes go to notes)
    for r in list(patches) + [layer for p in patches for layer in p.layers]:
        assert len(r.why) <= 500, f"{r.name}: why has {len(r.why)} characters; move release notes to notes"


def test_one_record_per_target_and_release():
    """Two records of one target never share a release of their library: behaviours that stack on
    one target are the record's layers, so no composition depends on the tables' order."""
    from sm12x.patches import Patch, all_patches, records_sharing_a_release

    assert records_sharing_a_release(all_patches()) == []
    # the check finds an overlap when there is one
    a = Patch(name="a", target="m:f", make=None, why="w", upstream="u", library="vllm",
              versions=">=0.22.1,<0.30", retire_when="r")
    b = Patch(name="b", target="m:f", make=None, why="w", upstream="u", library="vllm",
              versions=">=0.29.0,<0.35", retire_when="r")
    c = Patch(name="c", target="m:f", make=None, why="w", upstream="u", library="vllm",
              versions=">=0.30.0,<0.35", retire_when="r")
    star = Patch(name="s", target="m:f", make=None, why="w", upstream="u", library="vllm", versions="*",
                 versions_note="n", retire_when="r")
    assert [x[:2] for x in records_sharing_a_release([a, b, c])] == [("a", "b"), ("b", "c")]
    assert records_sharing_a_release([a, c]) == []
    assert records_sharing_a_release([a, star])


def test_every_record_and_layer_has_a_retire_condition():
    """fixed_in (a release) or retire_when (the upstream change that makes it unnecessary), for
    records and layers alike; layer names are unique among all names."""
    from sm12x.patches import Layer, Patch, all_patches

    patches = all_patches()
    names = [n for p in patches for n in (p.name,) + tuple(layer.name for layer in p.layers)]
    assert len(names) == len(set(names))
    for r in list(patches) + [layer for p in patches for layer in p.layers]:
        assert r.fixed_in or r.retire_when.strip(), r.name
        assert r.retire_when != r.why, r.name
    with pytest.raises(ValueError, match="retire_when"):
        Patch(name="x", target="m:f", make=None, why="w", upstream="u", library="vllm", versions=">=1")
    with pytest.raises(ValueError, match="retire_when"):
        Layer(name="x", make=None, why="w", upstream="u", library="vllm", versions=">=1")
    with pytest.raises(ValueError, match="layers"):
        Patch(name="x", target="m:f", make=None, why="w", upstream="u", library="vllm", versions=">=1",
              fixed_in="2", layers=("not a layer",))


def test_a_star_range_needs_a_reason():
    from sm12x.patches import Patch

    with pytest.raises(ValueError, match="versions_note"):
        Patch(name="x", target="m:f", make=None, why="w", upstream="u", library="vllm", versions="*")
    with pytest.raises(ValueError, match="fixed_in"):
        Patch(name="x", target="m:f", make=None, why="w", upstream="u", library="vllm",
              versions=">=1", fixed_in="none known")
    with pytest.raises(ValueError, match="arch 'gb10'"):
        Patch(name="x", target="m:f", make=None, why="w", upstream="u", library="vllm",
              versions=">=1", arch="gb10", fixed_in="2")



def test_a_record_declares_its_stack(monkeypatch):
    """A record's layers wrap its replacement in the order declared, each with an outcome of its
    own; a layer SM12X_SKIP names, or one outside its range, leaves the layers below serving."""
    import sys
    import types

    from sm12x import apply
    from sm12x.patches import Layer, Patch

    module = types.ModuleType("sm12x_test_stack")
    module.f = lambda: ["original"]
    monkeypatch.setitem(sys.modules, "sm12x_test_stack", module)
    monkeypatch.setattr(apply, "_versions", lambda: {"lib": "1.5"})

    def base(original):
        return lambda: original() + ["record"]

    def layer(tag):
        def make(original, below):
            return lambda: below() + [tag]
        return make

    common = dict(why="w", upstream="u", library="lib", retire_when="r")
    record = Patch(name="t.record", target="sm12x_test_stack:f", make=base, versions=">=1,<2", arch="any",
                   layers=(Layer(name="t.one", make=layer("one"), versions=">=1,<2", **common),
                           Layer(name="t.two", make=layer("two"), versions=">=1.6,<2", **common),
                           Layer(name="t.three", make=layer("three"), versions=">=1,<2", **common)),
                   **common)
    monkeypatch.setattr(apply, "OUTCOMES", {})
    monkeypatch.setenv("SM12X_SKIP", "t.three")
    assert apply.apply_patch(record, module) == "applied"
    assert module.f() == ["original", "record", "one"]
    assert apply.OUTCOMES["t.one"] == ("applied", "")
    assert apply.OUTCOMES["t.two"][0] == "skipped" and "outside the checked range" in apply.OUTCOMES["t.two"][1]
    assert apply.OUTCOMES["t.three"] == ("skipped", apply.SKIP_REASON)
    monkeypatch.setenv("SM12X_SKIP", "sglang.dsv4.paged_indexer.tilelang")  # a real layer's name
    assert apply.unmatched_skips() == []
