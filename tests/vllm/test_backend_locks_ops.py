"""The backend impl on the compiled `locks` CPU operators (skipped where `locks` is not built):
the same steps as test_backend_cpu, checked against the torch reference over the pages the
operators selected (so selection near-ties cannot make it flaky)."""
import types

import pytest
import torch

import locks.vllm.library as lib
from locks.vllm import reference as ref

try:
    import locks

    HAVE_OPS = hasattr(locks, "DecodeWrapper")
except ImportError:
    HAVE_OPS = False

from test_backend_cpu import H, dense_of, full_blocks, step, tables
import test_backend_cpu as tb

pytestmark = pytest.mark.skipif(not HAVE_OPS, reason="the compiled locks operators are not installed")


@pytest.fixture(autouse=True)
def _reset_ops():
    yield
    lib.set_ops(None)


def _make(monkeypatch, locks_cfg, runner="v2", **kw):
    return tb.make_setup(monkeypatch, locks_cfg, ops=locks, runner=runner, **kw)


@pytest.mark.parametrize("runner", ["v2", "v1"])
@pytest.mark.parametrize("precision", ["fp32", "int4"])
def test_real_ops_sparse_decode_matches_reference_over_selected_pages(monkeypatch, precision, runner):
    s = _make(monkeypatch, {"precision": precision, "budget": 64}, runner)
    bt, gen = tables(), torch.Generator().manual_seed(0)
    step(s, bt, [100, 37], [100, 37], gen)
    if precision == "fp32":  # the operators' summaries of the filled blocks: centroids exact
        mu = s.impl.side.summaries()[0]
        for b in full_blocks(bt, [100, 37]):
            assert torch.allclose(mu[b], s.kv[0][b].float().mean(0), atol=1e-6)
    cm, md, q, out = step(s, bt, [1, 1], [101, 38], gen)
    assert md.pure_decode
    b = md.bufs
    pages = [[[int(x) for x in b.pages[i, h, : int(b.counts[i, h])]] for h in range(H)] for i in range(2)]
    assert pages[0][0][-1] == 6 and len(pages[0][0]) == 4      # tail page (101 = 6*16 + 5) + 3
    assert pages[1] == [[0, 1, 2], [0, 1, 2]]                  # 38 tokens <= budget: all pages
    want, _ = ref.attend(q.float(), s.kv[0], s.kv[1], bt, cm.seq_lens, pages)
    # The kernels write vLLM's bf16 output directly: the fp32 result (~1e-5 from float64)
    # rounded once, within half a bf16 ulp (at most 2^-8 relative)
    assert ((out.double() - want).abs() <= want.abs() * 2 ** -8 + 1e-5).all()
    dense = dense_of(s, q, bt, cm.seq_lens)
    assert (want[0] - dense[0]).abs().max() > 1e-2              # really sparse


@pytest.mark.parametrize("runner", ["v2", "v1"])
def test_real_ops_budget_at_least_context_is_dense(monkeypatch, runner):
    s = _make(monkeypatch, {"precision": "int4", "budget": 512}, runner)
    bt, gen = tables(), torch.Generator().manual_seed(1)
    step(s, bt, [90, 200], [90, 200], gen)
    cm, md, q, out = step(s, bt, [1, 1], [91, 201], gen)
    assert (out.double() - dense_of(s, q, bt, cm.seq_lens)).abs().max() < 2 ** -7


def test_real_ops_v1_and_v2_layouts_give_the_same_bits(monkeypatch):
    """The V1 runner's interleaved cache (block stride 2 * 16 * H * d) and the V2 runner's dense
    halves hold the same K/V: summaries, selection and output are identical."""
    res = []
    for runner in ("v2", "v1"):
        s = _make(monkeypatch, {"precision": "int4", "budget": 64}, runner)
        bt, gen = tables(), torch.Generator().manual_seed(5)
        step(s, bt, [100, 37], [100, 37], gen)
        _, md, _, out = step(s, bt, [1, 1], [101, 38], gen)
        res.append((out.clone(), md.bufs.pages[:2].clone(), md.bufs.counts[:2].clone(),
                    [t.clone() for t in s.impl.side.summaries()]))
    (o2, p2, c2, s2), (o1, p1, c1, s1) = res
    assert torch.equal(o1, o2) and torch.equal(c1, c2)
    for i in range(2):
        for h in range(H):
            assert torch.equal(p1[i, h, : int(c1[i, h])], p2[i, h, : int(c2[i, h])])
    assert all(torch.equal(a, b) for a, b in zip(s1, s2))


@pytest.mark.parametrize("precision", ["fp32", "int4"])
def test_real_ops_min_context_above_budget_per_sequence(monkeypatch, precision):
    """min_context 200 > budget 64 under full decode graphs: one plan, one launch; the
    101-token sequence attends all 7 pages, the 301-token one selects 4."""
    from vllm.config.compilation import CUDAGraphMode

    s = _make(monkeypatch, {"precision": precision, "budget": 64, "min_context": 200},
              cudagraph_mode=CUDAGraphMode.FULL_DECODE_ONLY)
    bt, gen = tables(), torch.Generator().manual_seed(6)
    step(s, bt, [300, 100], [300, 100], gen)
    cm, md, q, out = step(s, bt, [1, 1], [301, 101], gen)
    assert md.pure_decode and not md.dense
    b = md.bufs
    assert b.pages.shape[2] == s.impl.wrapper.capacity == 13    # every page of 199 tokens
    assert b.counts[:2].tolist() == [[4, 4], [7, 7]]
    pages = [[[int(x) for x in b.pages[i, h, : int(b.counts[i, h])]] for h in range(H)] for i in range(2)]
    assert pages[1] == [list(range(7))] * H
    want, _ = ref.attend(q.float(), s.kv[0], s.kv[1], bt, cm.seq_lens, pages)
    assert ((out[:2].double() - want).abs() <= want.abs() * 2 ** -8 + 1e-5).all()
    dense = dense_of(s, q, bt, cm.seq_lens)
    assert (out[1].double() - dense[1]).abs().max() < 2 ** -7
    assert (want[0] - dense[0]).abs().max() > 1e-2


@pytest.mark.parametrize("precision", ["fp32", "int4"])
def test_real_ops_mixed_batch(monkeypatch, precision):
    """Two decodes and a new prompt in one step: the decode rows through the compiled LOCKS step
    (checked against the reference over the pages it selected), the prompt through
    FlashAttention (here the torch stand-in) over its own rows."""
    s = _make(monkeypatch, {"precision": precision, "budget": 64})
    bt, gen = tb.tables3(), torch.Generator().manual_seed(10)
    step(s, bt[:2], [100, 37], [100, 37], gen)
    cm, md, q, out = step(s, bt, [1, 1, 50], [101, 38, 50], gen)
    assert md.mixed_decodes and md.num_decodes == 2
    b = md.bufs
    pages = [[[int(x) for x in b.pages[i, h, : int(b.counts[i, h])]] for h in range(H)] for i in range(2)]
    assert pages[0][0][-1] == 6 and len(pages[0][0]) == 4 and pages[1] == [[0, 1, 2], [0, 1, 2]]
    want, _ = ref.attend(q[:2].float(), s.kv[0], s.kv[1], bt[:2], cm.seq_lens[:2], pages)
    assert ((out[:2].double() - want).abs() <= want.abs() * 2 ** -8 + 1e-5).all()
    assert torch.equal(out[2:], tb.flash_rows(s, q, bt, cm, range(2, 3)))


def _engine_step(s, block_table, query_lens, seq_lens, gen):
    """step() in the engine's order: the metadata first, then the K/V write and the attention
    inside a forward context (vLLM's module slot, where do_kv_cache_update finds the step's
    metadata; set directly: the tests' config is a stand-in that set_forward_context rejects)."""
    import contextlib

    import vllm.forward_context as fc

    from helpers import common_metadata

    @contextlib.contextmanager
    def set_forward_context(attn_metadata, _cfg):
        old, fc._forward_context = fc._forward_context, types.SimpleNamespace(attn_metadata=attn_metadata)
        try:
            yield
        finally:
            fc._forward_context = old

    cm = common_metadata(query_lens, seq_lens, block_table)
    n = cm.num_actual_tokens
    q, k, v = (torch.randn(n, h, tb.D, generator=gen).to(torch.bfloat16) for h in (tb.HQ, H, H))
    md = s.builder.build(0, cm)
    out = torch.zeros(n, tb.HQ * tb.D, dtype=torch.bfloat16)
    with set_forward_context({tb.NAME: md}, s.cfg):
        s.impl.do_kv_cache_update(tb.LAYER, k, v, s.kv, cm.slot_mapping)
        s.impl.forward(tb.LAYER, q, k, v, s.kv, md, out)
    return md, out


@pytest.mark.parametrize("runner", ["v2", "v1"])
def test_decode_steps_write_and_summarize_in_one_op(monkeypatch, runner):
    """In the engine (forward context set), a decode step's K/V write is locks.cache_write with
    the summaries (forward then skips summary_update); prefill steps keep the two launches.
    Against the same steps without the context (the scatter, then summary_update): the same
    cache, summaries and outputs, bit for bit, across decode steps that complete pages."""
    fused, plain = (_make(monkeypatch, {"precision": "int4", "budget": 64}, runner) for _ in range(2))
    calls = []
    real = locks.cache_write
    monkeypatch.setattr(locks, "cache_write", lambda *a, **k: (calls.append(a[4].numel()), real(*a, **k)))
    bt = tables()
    g1, g2 = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    md, o1 = _engine_step(fused, bt, [40, 29], [40, 29], g1)
    _, _, _, o2 = step(plain, bt, [40, 29], [40, 29], g2)
    assert not md.pure_decode and not md.fused_writes and calls == []  # prefill: two launches
    for t in range(1, 5):  # 41..44 / 30..33: sequence 1 completes its page at 32
        md, o1 = _engine_step(fused, bt, [1, 1], [40 + t, 29 + t], g1)
        _, _, _, o2 = step(plain, bt, [1, 1], [40 + t, 29 + t], g2)
        assert md.pure_decode and md.fused_writes == {tb.NAME}
        assert torch.equal(o1, o2.view_as(o1))
    assert len(calls) == 4
    assert torch.equal(fused.kv, plain.kv)
    for a, b in zip(fused.impl.side.summaries(), plain.impl.side.summaries()):
        assert torch.equal(a, b)
    assert fused.impl.side.summaries()[0][int(bt[1, 1])].any()  # the page completed at 32
    # fused_write off: the same engine step takes the two launches
    off = _make(monkeypatch, {"precision": "int4", "budget": 64, "fused_write": False}, runner)
    _engine_step(off, bt, [40, 29], [40, 29], torch.Generator().manual_seed(5))
    md, _ = _engine_step(off, bt, [1, 1], [41, 30], torch.Generator().manual_seed(6))
    assert md.pure_decode and not md.fused_writes and len(calls) == 4


def test_fused_write_limit_is_the_cuda_kernels():
    """The plugin's FUSED_WRITE_MAX_TOKENS (it must not need the compiled library to know it)
    is the C++ limit the CUDA cache write refuses past (include/locks/cuda/limits.h), so that a
    change of one cannot silently leave the other behind."""
    import pathlib
    import re

    import locks.vllm.impl as im

    header = pathlib.Path(__file__).resolve().parents[2] / "include/locks/cuda/limits.h"
    m = re.search(r"kCacheWriteMaxTokens\s*=\s*(\d+)\s*;", header.read_text())
    assert m, "kCacheWriteMaxTokens not found in limits.h"
    assert im.FUSED_WRITE_MAX_TOKENS == int(m.group(1))
