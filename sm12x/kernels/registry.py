"""The op registry: every op sm12x provides, with its reference, self-test cases, benchmark and
compile-check entry, so that ``sm12x selftest``, the sm_120/sm_121 compile check and the
benchmarks iterate one list.

Adding an op is its module (kernel, launcher, validation, configs) plus one :class:`Op` in its
family's ``cases`` module; :func:`all_ops` lists the families. Importing this module imports
nothing heavy; :func:`all_ops` imports the families (torch, triton).
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


def all_ops() -> list:
    """Every registered op, family by family."""
    import importlib

    ops = []
    for family in FAMILIES:
        try:
            cases = importlib.import_module(f"sm12x.kernels.{family}.cases")
        except ModuleNotFoundError as e:  # a family not built yet has no cases module
            if e.name != f"sm12x.kernels.{family}.cases" and e.name != f"sm12x.kernels.{family}":
                raise
            continue
        ops.extend(cases.OPS)
    return ops


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


def reference_in(module: str, name: str):
    """An Op's reference: ``module.name``, imported on its first call (the references need torch,
    the registry does not)."""
    def reference(*args, **kwargs):
        import importlib

        return getattr(importlib.import_module(module), name)(*args, **kwargs)

    reference.__name__ = name
    return reference


def result(op: str, case: str, ok: bool, max_abs: float = 0.0, max_rel: float = 0.0, detail: str = "",
           us: float = 0.0, throughput: str = "") -> dict:
    """One self-test result row."""
    return dict(op=op, case=case, ok=ok, max_abs=max_abs, max_rel=max_rel, detail=detail, us=us,
                throughput=throughput)
