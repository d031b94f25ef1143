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


def pytest_collection_modifyitems(config, items):
    if TEST_DEVICE == "cuda":
        return
    skip = pytest.mark.skip(reason="GPU test: run with SM12X_TEST_DEVICE=cuda on a GPU machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def device():
    return TEST_DEVICE
