"""The LOCKS attention backend for vLLM (v1 attention interface, vLLM 0.26.0).

- Prefill, chunked prefill and mixed batches: vLLM's own FlashAttention (varlen, paged) over the
  same cache, with FlashAttention's metadata (the builder subclasses FA's builder).
- Pure single-token decode batches: LOCKS (`locks.DecodeWrapper.run`: score pages from the
  summaries, select under the budget with the tail page always attended, split-K attention
  over the selected pages), capturable in full CUDA graphs (UNIFORM_SINGLE_TOKEN_DECODE).
- Every step (prefill or decode) rebuilds the summary of each block whose last slot it wrote
  (`locks.summary_update(..., slot_mapping=...)`), into the side-cache layer (side_cache.py).

KV-cache layout: [2, num_blocks, block_size, num_kv_heads, head_size], K = kv_cache[0] and
V = kv_cache[1], each [num_blocks, P, H, d] with every block [P, H, d] contiguous. The V2 model
runner allocates it as asked (dense halves). The V1 runner (VLLM_USE_V2_MODEL_RUNNER=0) sees two
block layouts in one KV-cache group (this backend's K/V-first shape, block dim 1, and the side
cache's blocks-first one, block dim 0: GPUModelRunner._has_mixed_attention_kv_layout) and
re-strides this layer's cache blocks-first (_update_hybrid_attention_mamba_layout): [N, 2, P, H,
d] physically, K and V interleaved per block, so kv_cache[0] has block stride 2 * P * H * d. The
LOCKS kernels read K/V at any block stride (KvCacheView::block_stride), so both runners are
served. (vLLM 0.26's FLASH_ATTN packs K and V into the last dim, [N, P, H, 2d]: rows inside a
block are then strided, which the LOCKS kernels do not read; not this backend's layout.)

Graph safety: the metadata builder runs outside the graph every step and writes the persistent
buffers (int32 slot mapping, block table, seq_lens); in-graph work reads only those, the
summaries, the cache and the wrapper's workspace, all allocated once.
"""
from __future__ import annotations

from typing import ClassVar

import torch

from vllm.v1.attention.backend import AttentionBackend, AttentionType, MultipleOf

from .engine_config import BLOCK_SIZE, _dtype_name
from .library import ops


class LocksAttentionBackend(AttentionBackend):
    supported_dtypes: ClassVar[list[torch.dtype]] = [torch.float16, torch.bfloat16]
    supported_kv_cache_dtypes: ClassVar[list[str]] = ["auto", "float16", "bfloat16"]
    forward_includes_kv_cache_update: bool = False  # vLLM calls impl.do_kv_cache_update first

    @staticmethod
    def get_name() -> str:
        return "CUSTOM"  # Attention.__init__ looks up AttentionBackendEnum[get_name()]

    @staticmethod
    def get_supported_kernel_block_sizes() -> list[int | MultipleOf]:
        return [BLOCK_SIZE]

    @staticmethod
    def get_impl_cls():
        from .impl import LocksAttentionImpl

        return LocksAttentionImpl

    @staticmethod
    def get_builder_cls():
        from .builder import LocksMetadataBuilder

        return LocksMetadataBuilder

    @staticmethod
    def get_kv_cache_shape(num_blocks, block_size, num_kv_heads, head_size, cache_dtype_str="auto"):
        return (2, num_blocks, block_size, num_kv_heads, head_size)

    @staticmethod
    def get_kv_cache_stride_order(include_num_layers_dimension: bool = False):
        # Identity (and layers first when asked): no cross-layer KV layout.
        return tuple(range(6 if include_num_layers_dimension else 5))

    @staticmethod
    def _head_size_support(head_size: int) -> tuple[bool, str]:
        # The kernels' own table, through the capability query (include/locks/support.h).
        return ops().supports("cuda", head_dim=head_size, page_size=BLOCK_SIZE)

    @classmethod
    def supports_head_size(cls, head_size: int) -> bool:
        return cls._head_size_support(head_size)[0]

    @classmethod
    def supports_compute_capability(cls, capability) -> bool:
        return capability.major >= 8

    @classmethod
    def validate_configuration(cls, head_size, dtype, kv_cache_dtype, block_size, use_mla, has_sink,
                               use_sparse, use_mm_prefix, use_per_head_quant_scales,
                               device_capability, attn_type, has_sliding_window=False,
                               use_non_causal=False, use_batch_invariant=False,
                               use_kv_connector=False, use_pcp=False) -> list[str]:
        """vLLM asks this before it builds a layer with the backend the user selected; each
        reason names the setting and what to do (vLLM prints them in its ValueError)."""
        r = []
        if dtype not in cls.supported_dtypes:
            r.append(f"model dtype {dtype} not supported by LOCKS: use --dtype bfloat16 or float16")
        if kv_cache_dtype not in (None, "auto", _dtype_name(dtype)):
            r.append(f"--kv-cache-dtype {kv_cache_dtype}: LOCKS reads a KV cache in the model dtype "
                     f"({_dtype_name(dtype)}); use --kv-cache-dtype auto")
        if block_size is not None and block_size != BLOCK_SIZE:
            r.append(f"--block-size {block_size}: LOCKS pages are {BLOCK_SIZE} tokens; use --block-size 16")
        head_ok, head_why = cls._head_size_support(head_size)
        if not head_ok:
            r.append(f"head size {head_size} not supported by LOCKS kernels ({head_why}); use "
                     "--attention-backend FLASH_ATTN for this model")
        if use_mla:
            r.append("MLA models are not supported by LOCKS; use the MLA backends")
        if has_sink:
            r.append("attention-sink layers (learned sinks) are not supported by LOCKS; use "
                     "--attention-backend FLASH_ATTN")
        if has_sliding_window:
            r.append("sliding-window layers are not supported by LOCKS (selection would ignore the "
                     "window); use --attention-backend FLASH_ATTN for this model")
        if use_sparse:
            r.append("models with their own sparse attention are not supported by LOCKS")
        if use_mm_prefix:
            r.append("prefix-LM multimodal attention is not supported by LOCKS")
        if use_per_head_quant_scales:
            r.append("per-head KV quantization scales are not supported (LOCKS reads an unquantized cache)")
        if attn_type != AttentionType.DECODER:
            r.append(f"attention type {attn_type} not supported: LOCKS serves decoder self-attention only")
        if use_non_causal:
            r.append("non-causal attention is not supported by LOCKS")
        if use_batch_invariant:
            r.append("VLLM_BATCH_INVARIANT is not supported by LOCKS; unset it")
        if use_kv_connector:
            r.append("KV connectors are not supported by LOCKS (the summary side cache would not be "
                     "transferred); drop --kv-transfer-config")
        if use_pcp:
            r.append("prefill context parallelism is not supported by LOCKS")
        if device_capability is not None and not cls.supports_compute_capability(device_capability):
            r.append(f"compute capability {device_capability} < 8.0 not supported by LOCKS")
        return r


