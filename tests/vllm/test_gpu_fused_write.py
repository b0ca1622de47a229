"""The fused decode write (locks.cache_write in do_kv_cache_update) on the GPU, without an
engine (`python -m pytest tests/vllm/test_gpu_fused_write.py` in the vLLM bundle's environment;
skipped without CUDA): a decode step's K/V write and forward captured in one CUDA graph inside a
forward context, as vLLM's full decode graphs run them, replayed across page boundaries, against
the same steps on a second backend instance with fused_write off (vLLM's reshape_and_cache_flash,
then a summary_update launch), eagerly: the same cache, summaries and outputs, bit for bit."""
import contextlib
import types

import pytest
import torch

import locks.vllm.library as lib

from test_backend_cpu import D, HQ, H, tables
from test_gpu_two_level_backend import DEV, HAVE, LAYER, gstep, metadata
import test_backend_cpu as tb

if HAVE:
    import locks

pytestmark = pytest.mark.skipif(not HAVE, reason="needs CUDA and the CUDA locks operators")


@pytest.fixture(autouse=True)
def _reset_ops():
    yield
    lib.set_ops(None)


@contextlib.contextmanager
def forward_context(md):
    """vLLM's forward-context slot holding this step's metadata (what the engine sets around a
    model forward; the tests' config is a stand-in that set_forward_context rejects)."""
    import vllm.forward_context as fc

    old, fc._forward_context = fc._forward_context, types.SimpleNamespace(attn_metadata={tb.NAME: md})
    try:
        yield
    finally:
        fc._forward_context = old


def capture_step(s, md, n):
    """One engine step of n tokens (K/V write + forward) captured in a CUDA graph inside a
    forward context holding md, as vLLM's full decode graphs capture it; returns the graph and
    its persistent query, key, value and output buffers."""
    q = torch.zeros(n, HQ, D, dtype=torch.bfloat16, device=DEV)
    kin, vin = (torch.zeros(n, H, D, dtype=torch.bfloat16, device=DEV) for _ in range(2))
    out = torch.zeros(n, HQ * D, dtype=torch.bfloat16, device=DEV)
    g = torch.cuda.CUDAGraph()
    with forward_context(md), torch.cuda.graph(g):
        s.impl.do_kv_cache_update(LAYER, kin, vin, s.kv, md.slot_mapping)
        s.impl.forward(LAYER, q, kin, vin, s.kv, md, out)
    assert md.fused_writes == {tb.NAME}
    return g, q, kin, vin, out


@pytest.mark.parametrize("runner", ["v2", "v1"])
def test_gpu_fused_decode_write_in_a_cuda_graph(monkeypatch, runner):
    from vllm.config.compilation import CUDAGraphMode

    import vllm.v1.attention.backends.flash_attn as fa_mod

    monkeypatch.setattr(fa_mod, "get_flash_attn_version", lambda *a, **k: None)
    cfg = {"precision": "int4", "budget": 64}
    fused, plain = (tb.make_setup(monkeypatch, dict(cfg, fused_write=f), ops=locks, runner=runner,
                                  cudagraph_mode=CUDAGraphMode.FULL_DECODE_ONLY, device=DEV)
                    for f in (True, False))
    bt = tables().to(DEV)
    for s in (fused, plain):  # the same prefill and first decode step on both (eager, no context)
        gen = torch.Generator().manual_seed(7)
        gstep(s, bt, [200, 90], [200, 90], gen)
        cm, md, _, _ = gstep(s, bt, [1, 1], [201, 91], gen)
    md = fused.builder.build(0, metadata([1, 1], [202, 92], bt))
    assert md.pure_decode
    g, q, kin, vin, out = capture_step(fused, md, 2)
    gen = torch.Generator().manual_seed(8)
    lens = [201, 91]
    for _ in range(40):  # crosses 208, 224, 240 and 96, 112, 128
        lens = [n + 1 for n in lens]
        qn, kn, vn = (torch.randn(2, h, D, generator=gen).to(torch.bfloat16).to(DEV) for h in (HQ, H, H))
        cm = metadata([1, 1], lens, bt)
        fused.builder.build(0, cm)  # the persistent slot mapping and lengths the graph reads
        q.copy_(qn), kin.copy_(kn), vin.copy_(vn)
        g.replay()
        plain.impl.do_kv_cache_update(LAYER, kn, vn, plain.kv, cm.slot_mapping)
        mp = plain.builder.build(0, cm)
        want = torch.zeros_like(out)
        plain.impl.forward(LAYER, qn, kn, vn, plain.kv, mp, want)
        assert not mp.fused_writes
        torch.cuda.synchronize()
        assert torch.equal(out, want), lens
    assert torch.equal(fused.kv, plain.kv)
    for a, b in zip(fused.impl.side.summaries(), plain.impl.side.summaries()):
        assert torch.equal(a, b)
