"""Tensor parallelism (#13), on CPU: each rank's attention layer holds a shard of the heads.
vLLM builds Attention (and so the LOCKS impl) with the per-rank head counts and the metadata
builder reads model_config.get_num_*_heads(parallel_config), which divide by the TP size (KV
heads replicated when TP > KV heads). Every shape the backend uses (supports() query, plan,
decode buffers, side-cache geometry) must be the rank's, never the whole model's."""
import math
import types

import pytest
import torch

from vllm.v1.kv_cache_interface import FullAttentionSpec

import locks.vllm.backend as be
import locks.vllm.builder as bd
import locks.vllm.impl as im
import locks.vllm.library as lib
from locks.vllm import reference as ref

from helpers import common_metadata, fake_config

P, D, NB = 16, 128, 48
NAME = "model.layers.3.self_attn.attn"


class TPModelConfig:
    """The whole model's head counts; per-rank answers as vLLM's ModelConfig gives them."""

    def __init__(self, heads, kv_heads, head_dim, max_model_len, dtype=torch.bfloat16):
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.max_model_len, self.dtype, self.rswa_window = max_model_len, dtype, None

    def get_num_attention_heads(self, parallel_config):
        return self.heads // parallel_config.tensor_parallel_size

    def get_num_kv_heads(self, parallel_config):
        return max(1, self.kv_heads // parallel_config.tensor_parallel_size)

    def get_head_size(self):
        return self.head_dim


class SpyOps(ref.ReferenceOps):
    def __init__(self, rank):
        super().__init__(rank)
        self.supports_calls, self.plans = [], []
        spy = self

        class Wrapper(ref.ReferenceWrapper):
            def plan(self, **kw):
                spy.plans.append(kw)
                return super().plan(**kw)

        self.DecodeWrapper = Wrapper

    def supports(self, backend, **kw):
        self.supports_calls.append(kw)
        return ref.ReferenceOps.supports(backend, **kw)


# (model, total q heads, total KV heads, TP size): per-rank shapes of the configs
CASES = [("Llama-3.1-70B TP 8", 64, 8, 8), ("GLM-4-9B TP 2", 32, 2, 2),
         ("GLM-4-9B-Chat-1M TP 2", 32, 4, 2), ("Llama-3.1-8B TP 16 (KV replicated)", 32, 8, 16)]


@pytest.mark.parametrize("name,hq,hkv,tp", CASES, ids=[c[0] for c in CASES])
def test_every_shape_is_the_ranks(monkeypatch, name, hq, hkv, tp):
    rq, rkv = hq // tp, max(1, hkv // tp)
    cfg = fake_config(heads=hq, kv_heads=hkv, head_dim=D, num_blocks=NB,
                      locks={"precision": "fp32", "budget": 64})
    cfg.model_config = TPModelConfig(hq, hkv, D, 512)
    cfg.parallel_config.tensor_parallel_size = tp
    monkeypatch.setattr(im, "get_current_vllm_config", lambda: cfg)
    spy = SpyOps(rank=8)
    lib.set_ops(spy)
    try:
        impl = im.LocksAttentionImpl(rq, D, 1 / math.sqrt(D), rkv, None, None, "auto", layer_name=NAME)
        spec = FullAttentionSpec(block_size=P, num_kv_heads=rkv, head_size=D, dtype=torch.bfloat16)
        builder = bd.LocksMetadataBuilder(spec, [NAME], cfg, torch.device("cpu"))
        kv = torch.zeros(be.LocksAttentionBackend.get_kv_cache_shape(NB, P, rkv, D), dtype=torch.bfloat16)
        impl.side.kv_cache = torch.zeros(NB, P, impl.geom.token_bytes, dtype=torch.uint8)
        assert spy.supports_calls[-1]["group"] == rq // rkv
        assert impl.geom.num_kv_heads == rkv
        assert (builder.num_heads_q, builder.num_heads_kv) == (rq, rkv)

        gen = torch.Generator().manual_seed(tp)
        bt = torch.randperm(NB, generator=gen).to(torch.int32)[:40].view(2, 20)
        layer = types.SimpleNamespace(_k_scale=torch.ones(1), _v_scale=torch.ones(1))

        def step(query_lens, seq_lens):
            cm = common_metadata(query_lens, seq_lens, bt)
            n = cm.num_actual_tokens
            q = torch.randn(n, rq, D, generator=gen).to(torch.bfloat16)
            k = torch.randn(n, rkv, D, generator=gen).to(torch.bfloat16)
            v = torch.randn(n, rkv, D, generator=gen).to(torch.bfloat16)
            impl.do_kv_cache_update(layer, k, v, kv, cm.slot_mapping)
            md = builder.build(0, cm)
            out = torch.zeros(n, rq * D, dtype=torch.bfloat16)
            impl.forward(layer, q, k, v, kv, md, out)
            return cm, md, q, out.view(n, rq, D)

        monkeypatch.setattr(im, "flash_attn_varlen_func", lambda **kw: kw["out"].zero_())
        step([150, 70], [150, 70])                       # prefill (stand-in FlashAttention)
        cm, md, q, out = step([1, 1], [151, 71])         # decode through LOCKS
        assert md.pure_decode
        plan = spy.plans[-1]
        assert (plan["num_q_heads"], plan["num_kv_heads"]) == (rq, rkv)
        assert tuple(md.bufs.pages.shape[:2]) == (builder.max_batch, rkv)
        assert tuple(md.bufs.lse.shape[1:]) == (rq,)
        want, _ = ref.decode(q.float(), kv[0], kv[1], impl.side.summaries(), bt, cm.seq_lens, budget=64)
        assert (out.double() - want).abs().max() < 2 ** -7  # bf16 output rounding
    finally:
        lib.set_ops(None)
