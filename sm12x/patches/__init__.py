"""Patch records.

A patch is declarative: what it replaces (``target`` = ``"module:qualname"``), which modules copy
the target with ``from X import f`` (``consumers``, rebound too), which library version range and
GPU arch it is for, why it exists (the upstream error/issue it fixes), the upstream version that
makes it unnecessary, and ``make``: the factory (in :mod:`sm12x.frontends`) that takes the
original object and returns the replacement. Replacements are plain functions (``functools.wraps``), never
proxies, because torch.compile traces through wrapt wrappers to the original silently.

The patch sets live in this package by what they patch: ``flash_mla`` (every FlashMLA route),
``deep_gemm`` (the DeepGEMM indexer surface), ``deep_gemm_dense`` (DeepGEMM's dense GEMMs, einsum
and mHC pre-norm GEMM) and ``deep_gemm_moe`` (DeepGEMM's grouped MoE GEMMs). ``all_patches()`` lists them all.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Patch:
    name: str
    target: str  # "package.module:Qualified.name"
    make: object  # factory(original) -> replacement (a front end's wrappers function)
    why: str
    fixed_in: str  # upstream version that makes the patch unnecessary ("" = none yet)
    library: str = "*"  # key of sm12x.platform.DISTRIBUTIONS whose version is checked
    versions: str = "*"  # release range, e.g. ">=0.5,<0.6"
    arch: str = "sm12x"  # "sm12x" (SM12x, or any GPU with SM12X_FORCE=1) or "any"
    consumers: tuple = ()  # modules that hold `from <target module> import <name>` copies

    @property
    def module(self) -> str:
        return self.target.partition(":")[0]

    @property
    def qualname(self) -> str:
        return self.target.partition(":")[2]


def all_patches() -> list:
    """Every registered patch, in application order."""
    from sm12x.patches import deep_gemm, deep_gemm_dense, deep_gemm_moe, flash_mla

    return (list(flash_mla.PATCHES) + list(deep_gemm.PATCHES) + list(deep_gemm_dense.PATCHES)
            + list(deep_gemm_moe.PATCHES))
