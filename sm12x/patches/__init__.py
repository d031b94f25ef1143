"""Patch records.

A patch is declarative: what it replaces (``target`` = ``"module:qualname"``), which modules copy
the target with ``from X import f`` (``consumers``, rebound too), which library release range and
GPU arch it is for, why it exists, the upstream issue or source it answers, when it retires
(``fixed_in``, or ``retire_when``: the upstream change that would make it unnecessary), and
``make``: the factory (in :mod:`sm12x.frontends`) that takes the original object and returns the
replacement; a record whose replacement runs an op takes it from the op manifest
(:func:`sm12x.kernels.manifest.factory`), which is how the runtime guard and ``sm12x status`` know
the op. Replacements are plain functions (``functools.wraps``), never proxies, because
torch.compile traces through wrapt wrappers to the original silently.

One record per target and release: two records of one target never share a release of their
library. Where a second behaviour stacks on a target for part of its range (the indexer's
deferred logits on a paged-logits function that sm12x already computes), the target's record
declares it as a :class:`Layer`: ``layer.make(original, below)`` wraps the record's replacement,
so the composition is stated in one place and does not depend on the order of the tables.

The patch sets live in this package by what they patch: ``indexer_topk`` (the frameworks'
indexer logits -> top-k, and the layers the DeepGEMM records stack), ``flash_mla`` (every FlashMLA
route), ``deep_gemm`` (the DeepGEMM indexer surface), ``deep_gemm_dense`` (DeepGEMM's dense GEMMs,
einsum and mHC pre-norm GEMM), ``deep_gemm_moe`` (DeepGEMM's grouped MoE GEMMs),
``flashinfer_dsv4`` (the DeepSeek-V4 shapes FlashInfer's SM120 attention does not serve in vLLM),
``sglang_moe`` (SGLang's MoE expert-method choices that end on SM100-only kernels) and ``gb10``
(gates that answer 12.1 unlike 12.0), ``v41`` (DeepSeek-V4.1's candidate-only indexer logits and
SGLang's V4.1 indexer gate) and ``fp4_indexer`` (vLLM's MXFP4 indexer-cache refusal).
``all_patches()`` lists them all.
"""
from __future__ import annotations

from dataclasses import dataclass


def _check_common(kind: str, r) -> None:
    """The checks a record and a layer share: a release range or a note saying why none, a
    retire condition, a release number in ``fixed_in``."""
    if r.versions in ("", "*") and not r.versions_note:
        raise ValueError(f"{kind} {r.name}: versions '*' needs versions_note (why every release)")
    if r.fixed_in and not r.fixed_in.replace(".", "").isdigit():
        raise ValueError(f"{kind} {r.name}: fixed_in {r.fixed_in!r} is not a release number")
    if not r.fixed_in and not r.retire_when.strip():
        raise ValueError(f"{kind} {r.name}: needs fixed_in or retire_when (the upstream change that "
                         f"makes it unnecessary)")


@dataclass(frozen=True)
class Layer:
    """A behaviour stacked on a record's replacement for part of the record's range.

    ``make(original, below) -> replacement`` gets the target's original and the replacement below
    it (the record's, or the previous layer's) and returns the one installed. ``name`` is the
    layer's own outcome and ``SM12X_SKIP`` name (skipping it keeps the record's replacement);
    ``library`` / ``versions`` its own range; ``why``, ``upstream``, ``fixed_in``,
    ``retire_when`` and ``notes`` as a record's.
    """

    name: str
    make: object  # factory(original, below) -> replacement
    why: str
    upstream: str
    library: str
    versions: str
    fixed_in: str = ""
    retire_when: str = ""
    notes: str = ""
    versions_note: str = ""

    def __post_init__(self):
        _check_common("layer", self)


@dataclass(frozen=True)
class Patch:
    """One replacement.

    ``versions`` is the release range of ``library`` the patch was checked against (a version
    outside it is skipped, naming the range); ``"*"`` only for a patch that does not depend on the
    release, with ``versions_note`` saying why. ``fixed_in`` is the first release of ``library``
    whose own code serves SM12x for this target ("" when none is known): at or past it the patch
    is ``retired``, not applied. A record without a known ``fixed_in`` names in ``retire_when``
    the upstream change that would make it unnecessary (checked like ``versions_note``).
    ``upstream`` names the upstream issue, PR or source location the patch answers; ``why`` says
    the failure and its effect in a sentence or two; ``notes`` holds what reading the releases
    showed (which releases were read, where a name moved). ``layers`` are the behaviours stacked
    on this record's replacement (:class:`Layer`).
    """

    name: str
    target: str  # "package.module:Qualified.name"
    # factory(original) -> replacement: for a record that runs an op, the manifest's
    # (``sm12x.kernels.manifest.factory(api)``, a "module:function" loaded when the record applies,
    # or a DeepGEMM wrappers module's ``FACTORIES[name]``); a gate's own function otherwise
    make: object
    why: str
    upstream: str
    library: str  # key of sm12x.platform.DISTRIBUTIONS whose version is checked
    versions: str  # release range of ``library``, e.g. ">=0.25.1,<0.35"
    fixed_in: str = ""  # first release of ``library`` that serves this target on SM12x
    versions_note: str = ""  # why the patch holds for every release (versions "*")
    # "sm12x" (SM12x, or any GPU with SM12X_FORCE=1), "any", or one compute capability such as
    # "12.1" (a gate only that GPU answers wrongly; SM12X_FORCE does not widen it)
    arch: str = "sm12x"
    # modules that hold `from <target module> import <name>` copies, or "module:attribute" for one
    # global a module filled from the target at run time (rebound whatever its aliases)
    consumers: tuple = ()
    retire_when: str = ""  # the upstream change that makes the record unnecessary (no fixed_in known)
    notes: str = ""  # what reading the releases showed
    layers: tuple = ()  # Layer, in stacking order

    def __post_init__(self):
        _check_common("patch", self)
        for layer in self.layers:
            if not isinstance(layer, Layer):
                raise ValueError(f"patch {self.name}: layers holds {type(layer).__name__}, not Layer")
        major, _, minor = self.arch.partition(".")
        if self.arch not in ("sm12x", "any") and not (major.isdigit() and minor.isdigit()):
            raise ValueError(f"patch {self.name}: arch {self.arch!r} is not 'sm12x', 'any' or a compute "
                             f"capability such as '12.1'")

    @property
    def module(self) -> str:
        return self.target.partition(":")[0]

    @property
    def qualname(self) -> str:
        return self.target.partition(":")[2]


def all_patches() -> list:
    """Every registered patch (the order carries no meaning: stacked behaviours are layers)."""
    from sm12x.patches import (deep_gemm, deep_gemm_dense, deep_gemm_moe, flash_mla, flashinfer_dsv4,
                               fp4_indexer, gb10, indexer_topk, sglang_moe, v41)

    return (list(indexer_topk.PATCHES) + list(flash_mla.PATCHES) + list(deep_gemm.PATCHES)
            + list(deep_gemm_dense.PATCHES) + list(deep_gemm_moe.PATCHES) + list(flashinfer_dsv4.PATCHES)
            + list(sglang_moe.PATCHES) + list(gb10.PATCHES) + list(v41.PATCHES)
            + list(fp4_indexer.PATCHES))


def _releases_named(spec: str) -> list:
    """Releases to try for a range overlap: every bound ``spec`` names, a release just past each,
    and the lowest release."""
    import re

    out = ["0"]
    for number in re.findall(r"[\d.]+", spec):
        out += [number, number + ".0.1"]
    return out


def shared_releases(a, b) -> list:
    """Releases in both ``a``'s and ``b``'s ranges (records or layers of one library); [] when they
    share none. Two ranges of ">=", ">", "<=", "<", "==" bounds that overlap share the higher of
    their lower bounds (or a release just past it), so trying every bound finds one."""
    from sm12x.platform import in_range

    if a.library != b.library and "*" not in (a.library, b.library):
        return []
    return sorted({v for v in _releases_named(a.versions) + _releases_named(b.versions)
                   if in_range(v, a.versions) and in_range(v, b.versions)})


def records_sharing_a_release(patches) -> list:
    """``(name, name, target, releases)`` for every two records of one target whose ranges
    share a release: the table states one record per target and release, stacked behaviours being
    one record's layers."""
    out = []
    by_target: dict = {}
    for p in patches:
        by_target.setdefault(p.target, []).append(p)
    for target, records in by_target.items():
        for i, a in enumerate(records):
            for b in records[i + 1:]:
                shared = shared_releases(a, b)
                if shared:
                    out.append((a.name, b.name, target, shared))
    return out
