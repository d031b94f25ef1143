"""The op registry: every op sm12x provides, with its reference, self-test cases, benchmark and
compile-check entry, so that ``sm12x selftest``, the sm_120/sm_121 compile check and the
benchmarks iterate one list.

The ops are declared once, in :mod:`sm12x.kernels.manifest`; :func:`all_ops` turns each
declaration into an :class:`Op` whose callables import their modules on first call. Importing this
module, and calling :func:`all_ops`, imports nothing heavy (the references, self-tests and
compile checks import torch / triton when they run).
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Iterable, Optional


@dataclasses.dataclass(frozen=True)
class Op:
    """One op.

    name: the op's name in ``selftest --ops`` and in reports.
    family: its sub-package of :mod:`sm12x.kernels` (``sparse_mla``, ``indexer``, ``gemm``, ``moe``).
    reference: the plain PyTorch function the kernel is checked against (the source of truth).
    selftest: ``selftest(device, full) -> iterable of result rows`` (dicts with ``op, case, ok,
        max_abs, max_rel, detail, us, throughput``): production shapes on ``"cuda"`` (``full``: the
        sweep), small shapes on any other device: under the Triton interpreter on ``"cpu"``, and
        on ``"cuda:N"``, where the runtime guard (``sm12x.guard``) runs them as its known-answer
        check before an op first serves.
    compile_reports: ``compile_reports(targets) -> [CompileReport]`` for every launch
        configuration the op runs on ``targets`` (``("sm_120", "sm_121")``); None when the op
        launches no kernel of its own.
    benchmark: the script in ``scripts/`` that races the op against what it replaces.
    """

    name: str
    family: str
    reference: Callable
    selftest: Callable[[str, bool], Iterable[dict]]
    compile_reports: Optional[Callable[[tuple], list]] = None
    benchmark: str = ""


FAMILIES = ("sparse_mla", "indexer", "gemm", "moe")


def from_spec(spec) -> Op:
    """The :class:`Op` of one manifest declaration (:class:`sm12x.kernels.manifest.OpSpec`)."""
    return Op(name=spec.name, family=spec.family, reference=reference_in(*spec.reference.split(":")),
              selftest=_imported(*spec.selftest.split(":")),
              compile_reports=compiled_by(spec.compile, **dict(spec.compile_fixed)) if spec.compile else None,
              benchmark=spec.benchmark)


def all_ops() -> list:
    """Every op of the manifest, in its order (family by family)."""
    from sm12x.kernels import manifest

    return [from_spec(spec) for spec in manifest.OPS]


def op_names() -> list:
    return [op.name for op in all_ops()]


def compiled_by(module: str, **fixed):
    """An Op's compile entry: ``module.compile_reports(targets=targets, **fixed)``, imported when
    the check runs; under the Triton interpreter it runs in a fresh interpreter without it (kernels
    cannot be compiled in-process there)."""
    def compile_reports(targets):
        import importlib

        from sm12x.kernels.common.compile_check import interpreting, reports_in_subprocess

        if interpreting():
            return reports_in_subprocess(module, targets=tuple(targets), **fixed)
        return importlib.import_module(module).compile_reports(targets=tuple(targets), **fixed)

    return compile_reports


def _imported(module: str, name: str):
    """``module.name``, imported on its first call (the ops' modules need torch, the registry
    does not)."""
    def call(*args, **kwargs):
        import importlib

        return getattr(importlib.import_module(module), name)(*args, **kwargs)

    call.__name__ = call.__qualname__ = name
    call.__module__ = module
    return call


def reference_in(module: str, name: str):
    """An Op's reference: ``module.name``, imported on its first call."""
    return _imported(module, name)


def result(op: str, case: str, ok: bool, max_abs: float = 0.0, max_rel: float = 0.0, detail: str = "",
           us: float = 0.0, throughput: str = "") -> dict:
    """One self-test result row."""
    return dict(op=op, case=case, ok=ok, max_abs=max_abs, max_rel=max_rel, detail=detail, us=us,
                throughput=throughput)
