"""Test set-up shared by every test.

Kernel tests run on the device named by ``SM12X_TEST_DEVICE`` (default ``cpu``). On the CPU the
Triton kernels run under the interpreter (``TRITON_INTERPRET=1``, set here before Triton is
imported). Tests marked ``gpu`` need ``SM12X_TEST_DEVICE=cuda`` and are skipped otherwise, with the
reason printed: a skipped GPU test is not a pass.
"""
import os
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for _p in (REPO, os.path.join(REPO, "tests")):
    if _p not in sys.path:
        sys.path.insert(0, _p)

TEST_DEVICE = os.environ.get("SM12X_TEST_DEVICE", "cpu")
if TEST_DEVICE == "cpu":
    os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs SM12X_TEST_DEVICE=cuda (a CUDA GPU)")
    config.addinivalue_line("markers", "slow: long-running on the CPU interpreter")
    config.addinivalue_line("markers", "cpu_only: builds its inputs on the CPU for the Triton "
                            "interpreter; its production-shape twin is marked gpu")


def pytest_collection_modifyitems(config, items):
    if TEST_DEVICE == "cuda":
        skip = pytest.mark.skip(reason="interpreter test (CPU tensors): its GPU twin is marked gpu")
        for item in items:
            if "cpu_only" in item.keywords and "gpu" not in item.keywords:
                item.add_marker(skip)
        return
    skip = pytest.mark.skip(reason="GPU test: run with SM12X_TEST_DEVICE=cuda on a GPU machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def device():
    return TEST_DEVICE
