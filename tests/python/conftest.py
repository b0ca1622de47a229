import os
import sys

import pytest

# Run against the installed package (pip install --no-build-isolation .), never the source tree:
# python/locks has no compiled library in it.
sys.path = [p for p in sys.path if os.path.abspath(p) != os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "python"))]


@pytest.fixture(scope="module")
def tiny_llama():
    """A 2-layer random Llama (GQA 4/2, head_dim 32) for the drop-in's selector tests."""
    import torch

    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                                   max_position_embeddings=1024)
    return transformers.LlamaForCausalLM(cfg).eval()


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
