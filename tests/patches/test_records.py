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


def test_a_star_range_needs_a_reason():
    from sm12x.patches import Patch

    with pytest.raises(ValueError, match="versions_note"):
        Patch(name="x", target="m:f", make=None, why="w", upstream="u", library="vllm", versions="*")
    with pytest.raises(ValueError, match="fixed_in"):
        Patch(name="x", target="m:f", make=None, why="w", upstream="u", library="vllm",
              versions=">=1", fixed_in="none known")
    with pytest.raises(ValueError, match="arch 'gb10'"):
        Patch(name="x", target="m:f", make=None, why="w", upstream="u", library="vllm",
              versions=">=1", arch="gb10")

