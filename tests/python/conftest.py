import os
import sys

import pytest

# Run against the installed package (pip install --no-build-isolation .), never the source tree:
# python/locks has no compiled library in it.
sys.path = [p for p in sys.path if os.path.abspath(p) != os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "python"))]


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU and the CUDA operators (tests/python/test_gpu_*.py; "
                                       "skipped without CUDA, failing when CUDA is there but the operators are not)")


def pytest_collection_modifyitems(config, items):
    import torch

    # LOCKS_GPU_TEST_DEVICE=cpu runs the GPU tests' logic on the CPU operators (a check of the
    # tests themselves where there is no GPU; graph-capture tests still skip).
    if torch.cuda.is_available() or os.environ.get("LOCKS_GPU_TEST_DEVICE") == "cpu":
        return
    skip = pytest.mark.skip(reason="no CUDA device (the GPU suite runs on the H200: scripts/gpu_tests.sh python)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
