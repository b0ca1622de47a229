"""Fakes of the vLLM objects the plugin reads (a VllmConfig's fields, common metadata), CPU."""
from __future__ import annotations

import types

import torch

from vllm.config.compilation import CUDAGraphMode
from vllm.v1.attention.backend import CommonAttentionMetadata


class FakeModelConfig:
    def __init__(self, heads, kv_heads, head_dim, max_model_len, dtype=torch.bfloat16):
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.max_model_len, self.dtype = max_model_len, dtype
        self.rswa_window = None

    def get_num_attention_heads(self, parallel_config):
        return self.heads

    def get_num_kv_heads(self, parallel_config):
        return self.kv_heads

    def get_head_size(self):
        return self.head_dim


def fake_config(*, heads=8, kv_heads=2, head_dim=128, max_model_len=512, block_size=16,
                locks=None, cudagraph_mode=CUDAGraphMode.NONE, max_num_seqs=4, num_blocks=64,
                kv_transfer_config=None, speculative_config=None, **cache_kw):
    ns = types.SimpleNamespace
    return ns(
        model_config=FakeModelConfig(heads, kv_heads, head_dim, max_model_len),
        parallel_config=ns(cp_kv_cache_interleave_size=1, decode_context_parallel_size=1,
                           prefill_context_parallel_size=1),
        cache_config=ns(block_size=block_size, cache_dtype="auto", num_gpu_blocks=num_blocks,
                        kv_offloading_size=cache_kw.get("kv_offloading_size"),
                        num_gpu_blocks_override=None),
        compilation_config=ns(cudagraph_mode=cudagraph_mode, max_cudagraph_capture_size=max_num_seqs,
                              static_forward_context={}),
        attention_config=ns(flash_attn_max_num_splits_for_cuda_graph=32),
        scheduler_config=ns(max_num_seqs=max_num_seqs, max_num_batched_tokens=1024,
                            disable_hybrid_kv_cache_manager=False),
        speculative_config=speculative_config,
        kv_transfer_config=kv_transfer_config,
        additional_config={"locks": locks or {}},
    )


def common_metadata(query_lens, seq_lens, block_table, page_size=16):
    """CommonAttentionMetadata for a batch: query_lens new tokens ending at seq_lens."""
    ql = torch.tensor(query_lens, dtype=torch.int32)
    qsl = torch.zeros(len(query_lens) + 1, dtype=torch.int32)
    qsl[1:] = torch.cumsum(ql, 0)
    slots = []
    for b, (q, s) in enumerate(zip(query_lens, seq_lens)):
        for t in range(s - q, s):
            slots.append(int(block_table[b, t // page_size]) * page_size + t % page_size)
    return CommonAttentionMetadata(
        query_start_loc=qsl, query_start_loc_cpu=qsl.clone(),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32), num_reqs=len(query_lens),
        num_actual_tokens=int(ql.sum()), max_query_len=int(ql.max()), max_seq_len=max(seq_lens),
        block_table_tensor=block_table, slot_mapping=torch.tensor(slots, dtype=torch.int64))


def fake_spec(k=3, method="ngram_gpu", parallel_drafting=False):
    """The SpeculativeConfig fields the plugin and vLLM's reorder threshold read."""
    return types.SimpleNamespace(method=method, num_speculative_tokens=k, parallel_drafting=parallel_drafting)
