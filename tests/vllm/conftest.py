"""tests/vllm: the vLLM plugin on CPU. Skipped as a whole when vLLM is not importable.

The plugin is tested against the torch reference (locks/vllm/reference.py) so that these tests
do not need the compiled operators; when `locks` itself cannot be imported (its compiled
library is missing), the package's Python sources are used directly.
"""
import importlib
import os
import sys
import types

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

try:
    importlib.import_module("vllm.v1.attention.backend")
    importlib.import_module("vllm.v1.attention.backends.flash_attn")
    HAVE_VLLM = True
    WHY = ""
except Exception as e:  # noqa: BLE001
    HAVE_VLLM = False
    WHY = f"vllm not importable ({type(e).__name__}: {e}); install with scripts/python_tests.sh"

if HAVE_VLLM:
    try:
        import locks  # noqa: F401  (the installed package, with its compiled operators)
    except ImportError:
        pkg = types.ModuleType("locks")
        pkg.__path__ = [os.path.join(ROOT, "python", "locks")]
        sys.modules["locks"] = pkg


def pytest_collection_modifyitems(config, items):
    if HAVE_VLLM:
        return
    skip = pytest.mark.skip(reason=WHY)
    for it in items:
        if "tests/vllm" in str(it.fspath).replace(os.sep, "/"):
            it.add_marker(skip)


def pytest_ignore_collect(collection_path, config):
    # The test modules import vllm at the top: do not even import them without it.
    if not HAVE_VLLM and collection_path.suffix == ".py" and collection_path.name.startswith("test_"):
        print(f"tests/vllm skipped: {WHY}")
        return True
    return None
