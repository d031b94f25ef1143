"""The compiled side of a modeled case: the :class:`Case` a plan builds, the op's compile reports
for a target (compiled once per process) and the lookup of the one a launch runs, and the
environment that makes an op's own launch logic plan as on a modeled card."""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import os


@dataclasses.dataclass
class Case:
    """One production case of one op.

    op, name: the op and the case label (as the benchmark prints it).
    launches: the kernel launches (:class:`~sm12x.perfmodel.engine.Launch`).
    flops: the useful matrix FLOPs (the op's own count, no padding); ``kind``: the ``Card.rates``
        key of the fastest instruction for its operands on SM12x (the roofline's peak).
    dram_bytes: the bytes a perfect kernel moves (inputs read once, outputs written once).
    key: the case's key in the measured tables (``perf_model.MEASURED``).
    """

    op: str
    name: str
    launches: list
    flops: float
    kind: str
    dram_bytes: float
    key: tuple = ()


@contextlib.contextmanager
def as_card(card):
    """Run the ops' launch logic as on ``card``: its compile target's configurations, its SM count."""
    saved = {k: os.environ.get(k) for k in ("SM12X_KERNEL_CONFIGS", "SM12X_NUM_SMS")}
    os.environ["SM12X_KERNEL_CONFIGS"] = card.target
    os.environ["SM12X_NUM_SMS"] = str(card.sms)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@functools.lru_cache(maxsize=None)
def reports(op_name: str, target: str) -> tuple:
    """The op's compile reports for ``target`` (each with its SASS summary), compiled once."""
    from sm12x.kernels.registry import all_ops

    op = next(o for o in all_ops() if o.name == op_name)
    return tuple(op.compile_reports((target,)))


def find(op_name: str, target: str, match, what: str):
    """The first compile report of ``op_name`` on ``target`` whose (kernel, config) ``match`` accepts."""
    for r in reports(op_name, target):
        if match(r.kernel, r.config):
            return r
    raise LookupError(f"perf model: no {target} compile report of {op_name} matches {what}")
