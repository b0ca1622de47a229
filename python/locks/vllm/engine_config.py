"""What the plugin reads from vLLM's engine config: the LOCKS settings (additional_config
["locks"] + LOCKS_* environment) and the engine-wide features it refuses."""
from __future__ import annotations

import torch

from .settings import LocksSettings, parse_settings

BLOCK_SIZE = 16


def _dtype_name(dt: torch.dtype) -> str:
    return {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}.get(dt, str(dt))


def settings_from(vllm_config) -> LocksSettings:
    extra = getattr(vllm_config, "additional_config", None) or {}
    return parse_settings(extra if isinstance(extra, dict) else {}, block_size=BLOCK_SIZE)


def refuse_config(vllm_config) -> list[str]:
    """Whole-engine settings the backend does not serve (checked when the first layer is built)."""
    why = []
    if getattr(vllm_config, "kv_transfer_config", None) is not None:
        why.append("KV connectors (--kv-transfer-config) are not supported: the summaries live in "
                   "a side cache the connector would not move; drop --kv-transfer-config or use "
                   "--attention-backend FLASH_ATTN")
    cc = vllm_config.cache_config
    if getattr(cc, "kv_offloading_size", None):
        why.append("KV-cache offloading (--kv-offloading-size) is not supported; unset it")
    if cc.block_size is not None and cc.block_size != BLOCK_SIZE:
        why.append(f"--block-size {cc.block_size}: LOCKS pages are {BLOCK_SIZE} tokens; use --block-size 16")
    pc = vllm_config.parallel_config
    if getattr(pc, "decode_context_parallel_size", 1) > 1 or getattr(pc, "prefill_context_parallel_size", 1) > 1:
        why.append("decode/prefill context parallelism is not supported; set it to 1")
    spec = getattr(vllm_config, "speculative_config", None)
    method = getattr(spec, "method", None)
    if spec is not None and method not in SPEC_METHODS:
        why.append(f"speculative decoding with method {method!r} is not supported: its draft model's "
                   "attention layers would need LOCKS summaries of their own; use a proposer without "
                   f"attention layers ({', '.join(sorted(SPEC_METHODS))}) or drop --speculative-config")
    return why


# Speculative decoding methods whose proposers have no attention layers of their own (n-gram
# and suffix lookups, heads on the target's hidden states): the target model's decode steps
# verify 1 + k tokens a request, which the LOCKS step serves as one row a token.
SPEC_METHODS = frozenset({"ngram", "ngram_gpu", "suffix", "medusa", "mlp_speculator"})


