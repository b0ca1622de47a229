"""Speculative-decoding verification steps on the GPU, without an engine (the vLLM bundle's
environment: `python -m pytest tests/vllm/test_gpu_spec_decode.py`; skipped without CUDA): a
uniform batch of 1 + k tokens a request, its K/V write (the fused cache write) and the LOCKS
step captured in one CUDA graph inside a forward context, as vLLM's UNIFORM_BATCH full decode
graphs run them, replayed across page (and group) boundaries, against a second backend that
decodes the same tokens one step at a time, eagerly: the same outputs, cache and summaries,
bit for bit (the step's rows are independent and the plans give the same bits whatever the
batch bucket)."""
import pytest
import torch

import locks.vllm.library as lib

from helpers import fake_spec
from test_backend_cpu import D, HQ, H, tables
from test_gpu_fused_write import capture_step
from test_gpu_two_level_backend import DEV, HAVE, LAYER, gstep, metadata
import test_backend_cpu as tb

if HAVE:
    import locks

pytestmark = pytest.mark.skipif(not HAVE, reason="needs CUDA and the CUDA locks operators")
K = 3  # speculative tokens: 4 query tokens a request


@pytest.fixture(autouse=True)
def _reset_ops():
    yield
    lib.set_ops(None)


@pytest.mark.parametrize("cfg", [{"precision": "int4", "budget": 64},
                                 {"precision": "int4", "budget": 64, "group_pages": 2, "alpha": 1.0,
                                  "min_groups": 4, "two_level_min_context": 0}],
                         ids=["flat", "two-level"])
def test_gpu_verification_steps_in_a_cuda_graph(monkeypatch, cfg):
    from vllm.config.compilation import CUDAGraphMode

    import vllm.v1.attention.backends.flash_attn as fa_mod

    monkeypatch.setattr(fa_mod, "get_flash_attn_version", lambda *a, **k: None)
    spec = tb.make_setup(monkeypatch, cfg, ops=locks, cudagraph_mode=CUDAGraphMode.FULL_DECODE_ONLY,
                         device=DEV, spec=fake_spec(k=K))
    one = tb.make_setup(monkeypatch, cfg, ops=locks, device=DEV)
    bt = tables().to(DEV)
    for s in (spec, one):  # the same prefill on both (eager)
        gstep(s, bt, [200, 90], [200, 90], torch.Generator().manual_seed(7))
    T = 2 * (K + 1)
    lens = [200, 90]
    md = spec.builder.build(0, metadata([K + 1] * 2, [n + K + 1 for n in lens], bt))
    assert md.pure_decode and md.num_decode_tokens == T
    g, q, kin, vin, out = capture_step(spec, md, T)
    gen = torch.Generator().manual_seed(8)
    for _ in range(10):  # 200 -> 240 and 90 -> 130: pages at 208 ... 240, 96 ... 128; groups at 224, 96, 128
        lens = [n + K + 1 for n in lens]
        qn, kn, vn = (torch.randn(T, h, D, generator=gen).to(torch.bfloat16).to(DEV) for h in (HQ, H, H))
        spec.builder.build(0, metadata([K + 1] * 2, lens, bt))  # the persistent rows the graph reads
        q.copy_(qn), kin.copy_(kn), vin.copy_(vn)
        g.replay()
        want = torch.zeros_like(out).view(T, HQ, D)
        for i in range(K + 1):  # token i of each request, one decode step
            idx = [i, K + 1 + i]
            cm = metadata([1, 1], [n - K + i for n in lens], bt)
            one.impl.do_kv_cache_update(LAYER, kn[idx], vn[idx], one.kv, cm.slot_mapping)
            mo = one.builder.build(0, cm)
            o = torch.zeros(2, HQ * D, dtype=torch.bfloat16, device=DEV)
            one.impl.forward(LAYER, qn[idx], kn[idx], vn[idx], one.kv, mo, o)
            want[idx] = o.view(2, HQ, D)
        torch.cuda.synchronize()
        assert torch.equal(out.view(T, HQ, D), want), lens
    assert torch.equal(spec.kv, one.kv)
    for a, b in zip(spec.impl.side.summaries(), one.impl.side.summaries()):
        assert torch.equal(a, b)
    if cfg.get("group_pages"):
        for a, b in zip(spec.impl.side.supers(), one.impl.side.supers()):
            assert torch.equal(a, b)


def test_gpu_request_selection_in_a_cuda_graph(monkeypatch):
    """spec_selection "request": the verification step (one selection a request, each row's own
    tail) captured in a CUDA graph and replayed across page boundaries equals the same steps
    run eagerly on a second backend, bit for bit, and every row's pages end at its own tail."""
    from vllm.config.compilation import CUDAGraphMode

    import vllm.v1.attention.backends.flash_attn as fa_mod

    monkeypatch.setattr(fa_mod, "get_flash_attn_version", lambda *a, **k: None)
    cfg = {"precision": "int4", "budget": 64, "spec_selection": "request"}
    graph = tb.make_setup(monkeypatch, cfg, ops=locks, cudagraph_mode=CUDAGraphMode.FULL_DECODE_ONLY,
                          device=DEV, spec=fake_spec(k=K))
    eager = tb.make_setup(monkeypatch, cfg, ops=locks, device=DEV, spec=fake_spec(k=K))
    bt = tables().to(DEV)
    for s in (graph, eager):
        gstep(s, bt, [200, 90], [200, 90], torch.Generator().manual_seed(9))
    T = 2 * (K + 1)
    lens = [200, 90]
    md = graph.builder.build(0, metadata([K + 1] * 2, [n + K + 1 for n in lens], bt))
    assert md.request_tokens == K + 1
    g, q, kin, vin, out = capture_step(graph, md, T)
    assert graph.impl.req_wrappers  # planned by the captured step (its first decode step)
    gen = torch.Generator().manual_seed(10)
    for _ in range(10):
        lens = [n + K + 1 for n in lens]
        qn, kn, vn = (torch.randn(T, h, D, generator=gen).to(torch.bfloat16).to(DEV) for h in (HQ, H, H))
        mg = graph.builder.build(0, metadata([K + 1] * 2, lens, bt))
        q.copy_(qn), kin.copy_(kn), vin.copy_(vn)
        g.replay()
        cm = metadata([K + 1] * 2, lens, bt)
        eager.impl.do_kv_cache_update(LAYER, kn, vn, eager.kv, cm.slot_mapping)
        me = eager.builder.build(0, cm)
        want = torch.zeros_like(out)
        eager.impl.forward(LAYER, qn, kn, vn, eager.kv, me, want)
        torch.cuda.synchronize()
        assert torch.equal(out, want), lens
        b = mg.bufs
        row_lens = mg.seq_lens[:T].tolist()
        for i, n in enumerate(row_lens):
            for h in range(H):
                assert int(b.pages[i, h, int(b.counts[i, h]) - 1]) == (n - 1) // tb.P
        # One selection a request: its rows' lists differ only in the rows' own tail pages
        # (token rows would select apart: budget 64 of 13-16 pages, random queries).
        for r in range(2):
            rows = range(r * (K + 1), (r + 1) * (K + 1))
            tails = {(row_lens[i] - 1) // tb.P for i in rows}
            for h in range(H):
                sets = [set(b.pages[i, h, : int(b.counts[i, h])].tolist()) - tails for i in rows]
                assert all(x == sets[0] for x in sets), (lens, r, h, sets)
