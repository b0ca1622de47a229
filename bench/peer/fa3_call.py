"""vLLM 0.26.0's FLASH_ATTN decode call, reproduced argument for argument.

Read from vllm/v1/attention/backends/flash_attn.py (FlashAttentionMetadataBuilder.build and
FlashAttentionImpl.forward, the non-cascade, no-DCP path every pure decode batch takes) and
vllm/vllm_flash_attn/flash_attn_interface.py. What this reproduces:
- the KV cache: one tensor [num_blocks, 16, KV heads, 2 * d] (the NHD stride order of
  get_kv_cache_shape's logical [N, H, 16, 2d]); forward splits it into K = [..., :d] and
  V = [..., d:], both strided, and canonicalizes size-1 strides (one KV head) for TMA;
- the builder, outside the graph, every step: get_scheduler_metadata(...) with the step's
  sequence lengths, copied into a persistent int32 buffer of 1 + round_up(max batch, 4) * 4
  entries (the tail zeroed), and num_splits = 0 (FA3's own heuristic; eager and piecewise
  graphs) or flash_attn_max_num_splits_for_cuda_graph (32 by default) under full decode graphs;
- forward: flash_attn_varlen_func(q, k, v, out, cu_seqlens_q, max_seqlen_q=1, seqused_k,
  max_seqlen_k, softmax_scale, causal=True, alibi None, window None, block_table, softcap 0,
  scheduler_metadata, fa_version=3, q/k/v_descale = the layer's 1.0 scales expanded to
  (batch, KV heads), dynamic_causal None, num_splits, s_aux None, mask_mod None, aux None).
Nothing here imports torch or vLLM at module level: the CPU tests check these argument sets
against vLLM's signatures without a GPU.
"""
from __future__ import annotations

from typing import Any

from .grid import PAGE

# AttentionConfig.flash_attn_max_num_splits_for_cuda_graph's default in vLLM 0.26.0.
VLLM_GRAPH_MAX_SPLITS = 32
# The two settings timed: FA3's heuristic (vLLM eager / piecewise) and vLLM's full-graph cap.
SPLIT_SETTINGS = (("free", 0), ("cap32", VLLM_GRAPH_MAX_SPLITS))


def round_up(x: int, m: int) -> int:
    return (x + m - 1) // m * m


def metadata_buffer_len(max_batch: int) -> int:
    """The builder's persistent scheduler_metadata buffer (full graphs + FA3)."""
    return 1 + round_up(max_batch, 4) * 4


def scheduler_kwargs(*, batch: int, context: int, hq: int, hkv: int, d: int, seq_lens: Any,
                     cu_seqlens_q: Any, qkv_dtype: Any, num_splits: int) -> dict[str, Any]:
    """get_scheduler_metadata's arguments as the builder's schedule() passes them for a pure
    decode batch (max_query_len 1, every sequence `context` tokens, no sliding window)."""
    return dict(batch_size=batch, max_seqlen_q=1, max_seqlen_k=context, num_heads_q=hq,
                num_heads_kv=hkv, headdim=d, cache_seqlens=seq_lens, qkv_dtype=qkv_dtype,
                cu_seqlens_q=cu_seqlens_q, page_size=PAGE, causal=True,
                window_size=(-1, -1), num_splits=num_splits)


def varlen_kwargs(*, q: Any, k_cache: Any, v_cache: Any, out: Any, cu_seqlens_q: Any,
                  seq_lens: Any, context: int, block_table: Any, softmax_scale: float,
                  scheduler_metadata: Any, descale: Any, num_splits: int) -> dict[str, Any]:
    """flash_attn_varlen_func's arguments as FlashAttentionImpl.forward passes them."""
    return dict(q=q, k=k_cache, v=v_cache, out=out, cu_seqlens_q=cu_seqlens_q, max_seqlen_q=1,
                seqused_k=seq_lens, max_seqlen_k=context, softmax_scale=softmax_scale,
                causal=True, alibi_slopes=None, window_size=None, block_table=block_table,
                softcap=0.0, scheduler_metadata=scheduler_metadata, fa_version=3,
                q_descale=descale, k_descale=descale, v_descale=descale, dynamic_causal=None,
                num_splits=num_splits, s_aux=None, mask_mod=None, aux_tensors=None)


def packed_cache(torch: Any, blocks: int, hkv: int, d: int, device: Any):
    """vLLM 0.26 FLASH_ATTN's cache for one layer and its K / V views (strided, as forward
    makes them). Returns (raw, k, v); raw is [blocks, 16, hkv, 2d] bf16, uninitialized."""
    raw = torch.empty((blocks, PAGE, hkv, 2 * d), dtype=torch.bfloat16, device=device)
    return raw, raw[..., :d], raw[..., d:]


def split_cache(torch: Any, blocks: int, hkv: int, d: int, device: Any):
    """K and V as two contiguous [blocks, 16, hkv, d] tensors (the layout LOCKS and the C++
    bench use; FA3 reads either). Returns (raw, k, v) with raw = [2, blocks, 16, hkv, d]."""
    raw = torch.empty((2, blocks, PAGE, hkv, d), dtype=torch.bfloat16, device=device)
    return raw, raw[0], raw[1]


def block_table(torch: Any, batch: int, pages: int, kind: str, seed: int, device: Any):
    """[batch, pages] int32 block ids over a pool of batch * pages blocks.

    perm: a random permutation of the pool (a cache after churn: no locality between a
    sequence's consecutive pages); interleaved: block j of sequence b is j * batch + b (the
    C++ bench's table); contiguous: sequence b owns blocks [b * pages, (b + 1) * pages)."""
    n = batch * pages
    if kind == "perm":
        gen = torch.Generator(device="cpu").manual_seed(seed)
        ids = torch.randperm(n, generator=gen, dtype=torch.int64).view(batch, pages)
    elif kind == "interleaved":
        ids = torch.arange(n, dtype=torch.int64).view(pages, batch).t()
    elif kind == "contiguous":
        ids = torch.arange(n, dtype=torch.int64).view(batch, pages)
    else:
        raise ValueError(f"block table kind {kind!r}: perm, interleaved or contiguous")
    return ids.to(torch.int32).contiguous().to(device)
