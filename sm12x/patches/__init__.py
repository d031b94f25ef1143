"""Patch records.

A patch is declarative: what it replaces (``target`` = ``"module:qualname"``), which modules copy
the target with ``from X import f`` (``consumers``, rebound too), which library release range and
GPU arch it is for, why it exists, the upstream issue or source it answers, the release that makes
it unnecessary, and ``make``: the factory (in :mod:`sm12x.frontends`) that takes the original
object and returns the replacement. Replacements are plain functions (``functools.wraps``), never
proxies, because torch.compile traces through wrapt wrappers to the original silently.

The patch sets live in this package by what they patch: ``indexer_topk`` (the frameworks'
indexer logits -> top-k), ``flash_mla`` (every FlashMLA route), ``deep_gemm`` (the DeepGEMM
indexer surface), ``deep_gemm_dense`` (DeepGEMM's dense GEMMs, einsum and mHC pre-norm GEMM),
``deep_gemm_moe`` (DeepGEMM's grouped MoE GEMMs), ``flashinfer_dsv4`` (the DeepSeek-V4 shapes
FlashInfer's SM120 attention does not serve in vLLM), ``sglang_moe`` (SGLang's MoE expert-method
choices that end on SM100-only kernels), ``gb10`` (gates that answer 12.1 unlike 12.0) and ``v41``
(DeepSeek-V4.1's candidate-only indexer logits and SGLang's V4.1 indexer gate).
``all_patches()`` lists them all, in application
order: ``indexer_topk`` first, because three of its records take targets of ``deep_gemm``'s and
build on their factories.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Patch:
    """One replacement.

    ``versions`` is the release range of ``library`` the patch was checked against (a version
    outside it is skipped, naming the range); ``"*"`` only for a patch that does not depend on the
    release, with ``versions_note`` saying why. ``fixed_in`` is the first release of ``library``
    whose own code serves SM12x for this target ("" when none is known): at or past it the patch
    is ``retired``, not applied. ``upstream`` names the upstream issue, PR or source location the
    patch answers; ``why`` is this record's own reason.
    """

    name: str
    target: str  # "package.module:Qualified.name"
    make: object  # factory(original) -> replacement (a front end's wrappers function)
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

    def __post_init__(self):
        if self.versions in ("", "*") and not self.versions_note:
            raise ValueError(f"patch {self.name}: versions '*' needs versions_note (why every release)")
        if self.fixed_in and not self.fixed_in.replace(".", "").isdigit():
            raise ValueError(f"patch {self.name}: fixed_in {self.fixed_in!r} is not a release number")
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
    """Every registered patch, in application order."""
    from sm12x.patches import (deep_gemm, deep_gemm_dense, deep_gemm_moe, flash_mla, flashinfer_dsv4,
                               gb10, indexer_topk, sglang_moe, v41)

    return (list(indexer_topk.PATCHES) + list(flash_mla.PATCHES) + list(deep_gemm.PATCHES)
            + list(deep_gemm_dense.PATCHES) + list(deep_gemm_moe.PATCHES) + list(flashinfer_dsv4.PATCHES)
            + list(sglang_moe.PATCHES) + list(gb10.PATCHES) + list(v41.PATCHES))
