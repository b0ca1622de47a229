"""Benchmark-only mode (LOCKS_BENCH_SKIP_PREFILL_ATTENTION=1): prefill still writes K/V (and
LOCKS still builds its summaries) but skips the attention arithmetic, writing zeros, for every
backend alike, so that a 1M-token context can be set up in under a minute. Decode is untouched.
Outputs are meaningless in this mode; it exists for time-per-output-token measurements only
(docs/vllm.md says so next to every number measured with it)."""
from __future__ import annotations

import os

from vllm.v1.attention.backends.flash_attn import FlashAttentionBackend, FlashAttentionImpl

ENV = "LOCKS_BENCH_SKIP_PREFILL_ATTENTION"


def skip_prefill() -> bool:
    return os.environ.get(ENV, "0") == "1"


class SkipPrefillFlashAttentionImpl(FlashAttentionImpl):
    def forward(self, layer, query, key, value, kv_cache, attn_metadata, output, output_scale=None,
                output_block_scale=None):
        if attn_metadata is not None and attn_metadata.max_query_len > 1:
            output[: attn_metadata.num_actual_tokens].zero_()
            return output
        return super().forward(layer, query, key, value, kv_cache, attn_metadata, output,
                               output_scale, output_block_scale)


class SkipPrefillFlashAttentionBackend(FlashAttentionBackend):
    @staticmethod
    def get_impl_cls():
        return SkipPrefillFlashAttentionImpl
