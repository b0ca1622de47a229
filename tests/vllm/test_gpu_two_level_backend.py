"""Two-level LOCKS in the vLLM backend on the GPU, without an engine (the vLLM bundle's
environment on the H200: `python -m pytest tests/vllm/test_gpu_two_level_backend.py`; skipped
without CUDA): the CUDA completed-group list (candidates at slot -1 skipped by the build), the
decode-time super_update and the two-level step captured in one CUDA graph per step as vLLM's
full decode graphs do, checked against one bulk build and the one-shot operator."""
import dataclasses
import types

import pytest
import torch

import locks.vllm.library as lib

from helpers import common_metadata
from test_backend_cpu import D, HQ, H, tables
from test_two_level_backend import bulk_supers, step_matches_operator
import test_backend_cpu as tb

try:
    import locks

    HAVE = torch.cuda.is_available() and hasattr(locks, "two_level")
except ImportError:
    HAVE = False

pytestmark = pytest.mark.skipif(not HAVE, reason="needs CUDA and the CUDA locks operators")
DEV = "cuda"
# The attention layer's K/V scales: vLLM's reshape_and_cache_flash reads them on the device.
LAYER = types.SimpleNamespace(_k_scale=torch.ones(1, device=DEV) if HAVE else None,
                              _v_scale=torch.ones(1, device=DEV) if HAVE else None)


@pytest.fixture(autouse=True)
def _reset_ops():
    yield
    lib.set_ops(None)


def metadata(query_lens, seq_lens, bt):
    cm = common_metadata(query_lens, seq_lens, bt.cpu())
    return dataclasses.replace(cm, query_start_loc=cm.query_start_loc.to(DEV), seq_lens=cm.seq_lens.to(DEV),
                               block_table_tensor=bt, slot_mapping=cm.slot_mapping.to(DEV))


def gstep(s, bt, query_lens, seq_lens, gen):
    """One eager step on the GPU: K/V write, metadata, forward."""
    cm = metadata(query_lens, seq_lens, bt)
    n = cm.num_actual_tokens
    q, k, v = (torch.randn(n, h, D, generator=gen).to(torch.bfloat16).to(DEV) for h in (HQ, H, H))
    s.impl.do_kv_cache_update(LAYER, k, v, s.kv, cm.slot_mapping)
    md = s.builder.build(0, cm)
    out = torch.zeros(n, HQ * D, dtype=torch.bfloat16, device=DEV)
    s.impl.forward(LAYER, q, k, v, s.kv, md, out)
    return cm, md, q, out.view(n, HQ, D)


@pytest.mark.parametrize("runner,min_ctx", [("v2", None), ("v1", None), ("v2", 300)])
def test_gpu_two_level_backend_in_cuda_graphs(monkeypatch, runner, min_ctx):
    """min_ctx 300 (two_level_min_context; 10 groups of S 2): the ~92-132-token row decodes flat
    inside the same graph, the ~352-392-token row two-level."""
    from vllm.config.compilation import CUDAGraphMode

    import vllm.v1.attention.backends.flash_attn as fa_mod

    # Prefill runs on the test's torch stand-in of FlashAttention: keep FA3's ahead-of-time
    # scheduler (which the stand-in ignores) out of the metadata builder.
    monkeypatch.setattr(fa_mod, "get_flash_attn_version", lambda *a, **k: None)
    S = 2
    s = tb.make_setup(monkeypatch, {"precision": "int4", "budget": 64, "group_pages": S, "alpha": 1.0,
                                    "min_groups": 4, "two_level_min_context": min_ctx},
                      cudagraph_mode=CUDAGraphMode.FULL_DECODE_ONLY, ops=locks, runner=runner, device=DEV)
    bt, gen = tables().to(DEV), torch.Generator().manual_seed(31)
    gstep(s, bt, [200, 90], [200, 90], gen)                  # prefill: groups at slot -1 skipped
    gstep(s, bt[[1, 0]], [1, 150], [91, 350], gen)             # mixed: a decode row and an extend
    lens = [350, 91]
    # One pure decode step eagerly (plans every bucket), then the same forward captured.
    lens = [n + 1 for n in lens]
    cm, md, _, _ = gstep(s, bt, [1, 1], lens, gen)
    q = torch.zeros(2, HQ, D, dtype=torch.bfloat16, device=DEV)
    kv_in = torch.zeros(2, H, D, dtype=torch.bfloat16, device=DEV)
    out = torch.zeros(2, HQ * D, dtype=torch.bfloat16, device=DEV)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        s.impl.forward(LAYER, q, kv_in, kv_in, s.kv, md, out)
    for _ in range(40):                                      # crosses 352, 384 and 96, 128
        lens = [n + 1 for n in lens]
        cm = metadata([1, 1], lens, bt)
        qn, kn, vn = (torch.randn(2, h, D, generator=gen).to(torch.bfloat16).to(DEV) for h in (HQ, H, H))
        s.impl.do_kv_cache_update(LAYER, kn, vn, s.kv, cm.slot_mapping)
        md2 = s.builder.build(0, cm)                         # writes the persistent buffers
        assert md2.pure_decode and md2.super_table.data_ptr() == md.super_table.data_ptr()
        q.copy_(qn)
        g.replay()
    torch.cuda.synchronize()
    want_sup, slots = bulk_supers(s, bt, lens, S)
    for got, w in zip(s.impl.side.supers(), want_sup):
        for x in slots:
            assert torch.equal(got[x], w[x])
    step_matches_operator(s, md, q, out.view(2, HQ, D), bt, cm.seq_lens, want_sup)
