"""The backend's metadata builder and impl on CPU tensors, with the torch reference standing
in for the compiled operators and a torch paged attention standing in for FlashAttention."""
import math
import types

import pytest
import torch

from vllm.config.compilation import CUDAGraphMode
from vllm.v1.kv_cache_interface import FullAttentionSpec

import locks.vllm.backend as be
import locks.vllm.builder as bd
import locks.vllm.impl as im
import locks.vllm.library as lib
from locks.vllm import reference as ref
from locks.vllm.side_cache import side_layer_name

from helpers import common_metadata, fake_config

HQ, H, D, P, NB = 8, 2, 128, 16, 64
NAME = "model.layers.0.self_attn.attn"


def torch_flash_varlen(*, q, k, v, out, cu_seqlens_q, max_seqlen_q, seqused_k, max_seqlen_k,
                       softmax_scale, causal, block_table, **_):
    """Causal paged attention (what vLLM's flash_attn_varlen_func computes), float64 inside."""
    G = q.shape[1] // k.shape[2]
    for b in range(cu_seqlens_q.shape[0] - 1):
        a, e = int(cu_seqlens_q[b]), int(cu_seqlens_q[b + 1])
        n = int(seqused_k[b])
        blocks = block_table[b, : -(-n // P)].long()
        kk = k[blocks].reshape(-1, k.shape[2], D)[:n].double()
        vv = v[blocks].reshape(-1, k.shape[2], D)[:n].double()
        for i in range(a, e):
            pos = n - (e - a) + (i - a)
            for h in range(q.shape[1]):
                w = torch.softmax(kk[: pos + 1, h // G] @ q[i, h].double() * softmax_scale, 0)
                out[i, h] = (w @ vv[: pos + 1, h // G]).to(out.dtype)


def v1_layout(kv: torch.Tensor) -> torch.Tensor:
    """What vLLM 0.26's V1 model runner does to this backend's [2, N, P, H, d] cache
    (GPUModelRunner._update_hybrid_attention_mamba_layout, applied because the side cache's
    blocks-first layout and ours differ: _has_mixed_attention_kv_layout): blocks first in
    memory, K and V interleaved per block, so kv[0] has block stride 2 * P * H * d."""
    hidden = kv.shape[2:].numel()
    return kv.as_strided_(size=kv.shape, stride=(hidden, 2 * hidden, *kv.stride()[2:]))


def make_setup(monkeypatch, locks_cfg, cudagraph_mode=CUDAGraphMode.NONE, heads=HQ, window=None, ops=None,
               runner="v2", device="cpu", spec=None):
    """One attention layer (impl + side cache + builder) over a cache of NB blocks (on the CPU
    unless `device` says otherwise); ops: the `locks` functions to use (default: the torch
    reference); runner: the KV-cache layout of vLLM's V2 ("v2", as the backend asks) or V1
    ("v1", v1_layout) model runner."""
    cfg = fake_config(heads=heads, kv_heads=H, head_dim=D, num_blocks=NB, locks=locks_cfg,
                      cudagraph_mode=cudagraph_mode, speculative_config=spec)
    monkeypatch.setattr(im, "get_current_vllm_config", lambda: cfg)
    monkeypatch.setattr(im, "flash_attn_varlen_func", torch_flash_varlen)
    lib.set_ops(ops if ops is not None else ref.ReferenceOps(rank=locks_cfg.get("rank", 8)))
    impl = im.LocksAttentionImpl(heads, D, 1 / math.sqrt(D), H, None, window, "auto", layer_name=NAME)
    spec = FullAttentionSpec(block_size=P, num_kv_heads=H, head_size=D, dtype=torch.bfloat16)
    builder = bd.LocksMetadataBuilder(spec, [NAME], cfg, torch.device(device))
    kv = torch.zeros(be.LocksAttentionBackend.get_kv_cache_shape(NB, P, H, D), dtype=torch.bfloat16,
                     device=device)
    if runner == "v1":
        kv = v1_layout(kv)
    impl.side.kv_cache = torch.zeros(NB, P, impl.geom.token_bytes, dtype=torch.uint8, device=device)
    return types.SimpleNamespace(cfg=cfg, impl=impl, builder=builder, kv=kv)


@pytest.fixture
def setup(monkeypatch):
    yield lambda *a, **k: make_setup(monkeypatch, *a, **k)
    lib.set_ops(None)


LAYER = types.SimpleNamespace(_k_scale=torch.ones(1), _v_scale=torch.ones(1))


def step(s, block_table, query_lens, seq_lens, gen):
    cm = common_metadata(query_lens, seq_lens, block_table)
    n = cm.num_actual_tokens
    q = torch.randn(n, HQ, D, generator=gen).to(torch.bfloat16)
    k = torch.randn(n, H, D, generator=gen).to(torch.bfloat16)
    v = torch.randn(n, H, D, generator=gen).to(torch.bfloat16)
    s.impl.do_kv_cache_update(LAYER, k, v, s.kv, cm.slot_mapping)
    md = s.builder.build(0, cm)
    out = torch.zeros(n, HQ * D, dtype=torch.bfloat16)
    s.impl.forward(LAYER, q, k, v, s.kv, md, out)
    return cm, md, q, out.view(n, HQ, D)


def tables():
    perm = torch.randperm(NB, generator=torch.Generator().manual_seed(3)).to(torch.int32)
    return torch.stack([perm[:32], perm[32:64]])


def full_blocks(bt, lens):
    return sorted(int(bt[b, j]) for b, n in enumerate(lens) for j in range(n // P))


def check_summaries(s, blocks):
    mu, basis, coeff = s.impl.side.summaries()
    want = tuple(torch.zeros_like(t) for t in (mu, basis, coeff))
    ref.build_summaries(s.kv[0], torch.tensor(blocks), want, 8)
    for b in blocks:
        assert torch.allclose(mu[b], want[0][b]) and torch.allclose(coeff[b].abs(), want[2][b].abs(), atol=1e-5)


@pytest.mark.parametrize("runner", ["v2", "v1"])
def test_prefill_then_sparse_decode(setup, runner):
    s = setup({"precision": "fp32", "budget": 64}, runner=runner)
    assert s.kv[0].is_contiguous() == (runner == "v2")
    bt, gen = tables(), torch.Generator().manual_seed(0)
    # Prefill (FlashAttention path), ragged: 100 and 37 tokens.
    cm, md, q, out = step(s, bt, [100, 37], [100, 37], gen)
    assert not md.pure_decode
    want = torch.zeros(137, HQ, D, dtype=torch.bfloat16)
    torch_flash_varlen(q=q, k=s.kv[0], v=s.kv[1], out=want, cu_seqlens_q=cm.query_start_loc,
                       max_seqlen_q=100, seqused_k=cm.seq_lens, max_seqlen_k=100,
                       softmax_scale=1 / math.sqrt(D), causal=True, block_table=bt)
    assert torch.equal(out, want)
    check_summaries(s, full_blocks(bt, [100, 37]))          # 6 + 2 blocks filled by the prefill
    # Builder output: persistent int32 copies, padding past this step.
    assert md.slot_mapping[:137].tolist() == cm.slot_mapping.tolist()
    assert (md.slot_mapping[137:] == -1).all() and md.slot_mapping.dtype == torch.int32
    # Decode step (LOCKS path): budget 64 < 101 tokens -> sequence 0 is sparse.
    cm, md, q, out = step(s, bt, [1, 1], [101, 38], gen)
    assert md.pure_decode and not md.dense and md.num_reqs == 2
    assert torch.equal(md.block_table[:2], bt) and md.seq_lens[:2].tolist() == [101, 38]
    assert (md.seq_lens[2:] == 1).all()                      # padded rows stay valid
    sm = s.impl.side.summaries()
    want, _ = ref.decode(q.float(), s.kv[0], s.kv[1], sm, bt, cm.seq_lens, budget=64)
    dense = dense_of(s, q, bt, cm.seq_lens)
    tol = 2 ** -7  # bf16 output rounding (8 significant bits) of values |x| < 1
    assert (out.double() - want).abs().max() < tol
    assert (want[0] - dense[0]).abs().max() > 10 * tol       # sequence 0 really was sparse
    assert (out[1].double() - dense[1]).abs().max() < tol    # 38 tokens <= budget: dense
    # Next step writes slot 15 of sequence 1's third block: its summary is rebuilt.
    for t in range(38, 48):
        step(s, bt, [1, 1], [102 + t - 38, t + 1], gen)
    check_summaries(s, full_blocks(bt, [111, 48]))


def dense_of(s, q, bt, lens):
    out, _ = ref.attend(q.float(), s.kv[0], s.kv[1], bt, lens)
    return out


def test_budget_at_least_context_is_dense(setup):
    s = setup({"precision": "fp32", "budget": 512})
    bt, gen = tables(), torch.Generator().manual_seed(1)
    step(s, bt, [90, 200], [90, 200], gen)
    cm, md, q, out = step(s, bt, [1, 1], [91, 201], gen)
    assert md.pure_decode
    assert (out.double() - dense_of(s, q, bt, cm.seq_lens)).abs().max() < 2 ** -7


def test_each_batch_size_runs_the_plan_of_its_bucket(setup):
    """One plan per batch bucket (1, 2, 4 = max_num_seqs here) over one workspace: a decode of
    two sequences runs the wrapper planned for max_batch 2, and a larger batch the next one."""
    assert bd.batch_buckets(1) == [1] and bd.batch_buckets(4) == [1, 2, 4]
    assert bd.batch_buckets(6) == [1, 2, 4, 6] and bd.batch_buckets(256)[-2:] == [128, 256]
    s = setup({"precision": "fp32", "budget": 64})
    bt, gen = tables(), torch.Generator().manual_seed(5)
    step(s, bt, [100, 37], [100, 37], gen)
    step(s, bt, [1, 1], [101, 38], gen)
    planned = [(mb, w.max_batch) for mb, w in s.impl.wrappers]
    assert planned == [(1, 1), (2, 2), (4, 4)]
    assert [len(w.runs) for _, w in s.impl.wrappers] == [0, 1, 0]
    assert s.impl.wrapper_for(1) is s.impl.wrappers[0][1] and s.impl.wrapper_for(3) is s.impl.wrapper


def tables3():
    """Block tables of three sequences (21 blocks each) over the NB blocks, shuffled."""
    perm = torch.randperm(NB, generator=torch.Generator().manual_seed(7)).to(torch.int32)
    return torch.stack([perm[:21], perm[21:42], perm[42:63]])


def flash_rows(s, q, bt, cm, rows):
    """FlashAttention's output (torch_flash_varlen) for the requests in `rows` of a step."""
    want = torch.zeros(q.shape, dtype=torch.bfloat16)
    torch_flash_varlen(q=q, k=s.kv[0], v=s.kv[1], out=want, cu_seqlens_q=cm.query_start_loc,
                       max_seqlen_q=cm.max_query_len, seqused_k=cm.seq_lens, max_seqlen_k=cm.max_seq_len,
                       softmax_scale=1 / math.sqrt(D), causal=True, block_table=bt)
    qsl = cm.query_start_loc.tolist()
    return want[qsl[rows.start]:qsl[rows.stop]]


@pytest.mark.parametrize("runner", ["v2", "v1"])
def test_mixed_batch_decode_rows_are_sparse(setup, runner):
    """Decodes first, then a new prompt (continuous batching with chunked prefill): the decode
    rows take the LOCKS step, the prompt FlashAttention over its own rows."""
    s = setup({"precision": "fp32", "budget": 64}, runner=runner)
    bt, gen = tables3(), torch.Generator().manual_seed(8)
    step(s, bt[:2], [100, 37], [100, 37], gen)
    cm, md, q, out = step(s, bt, [1, 1, 50], [101, 38, 50], gen)
    assert not md.pure_decode and md.mixed_decodes and md.num_decodes == 2
    assert s.impl.wrapper_for(2).runs[-1] == (2, False)
    want, _ = ref.decode(q[:2].float(), s.kv[0], s.kv[1], s.impl.side.summaries(), bt[:2],
                         cm.seq_lens[:2], budget=64)
    dense = dense_of(s, q[:2], bt[:2], cm.seq_lens[:2])
    tol = 2 ** -7
    assert (out[:2].double() - want).abs().max() < tol
    assert (want[0] - dense[0]).abs().max() > 10 * tol          # sequence 0 really was sparse
    assert torch.equal(out[2:], flash_rows(s, q, bt, cm, range(2, 3)))  # the prompt: FlashAttention
    check_summaries(s, full_blocks(bt, [101, 38, 50]))          # the prompt's 3 full blocks built
    # A chunk of a longer prompt (an extend: 40 more tokens on 50) beside one decode.
    cm, md, q, out = step(s, bt[1:], [1, 40], [39, 90], gen)
    assert md.mixed_decodes and md.num_decodes == 1
    assert (out[:1].double() - dense_of(s, q[:1], bt[1:2], cm.seq_lens[:1])).abs().max() < tol
    assert torch.equal(out[1:], flash_rows(s, q, bt[1:], cm, range(1, 2)))


def test_mixed_batch_below_min_context_stays_on_flash_attention(setup):
    """No sequence of a mixed batch reaches min_context: the whole batch on FlashAttention (the
    decode rows are cheaper there), as before the mixed path."""
    s = setup({"precision": "fp32", "budget": 64, "min_context": 4096})
    bt, gen = tables3(), torch.Generator().manual_seed(9)
    step(s, bt[:2], [100, 37], [100, 37], gen)
    runs = [len(w.runs) for _, w in s.impl.wrappers]
    cm, md, q, out = step(s, bt, [1, 1, 50], [101, 38, 50], gen)
    assert not md.pure_decode and not md.mixed_decodes and md.num_decodes == 2
    assert [len(w.runs) for _, w in s.impl.wrappers] == runs       # no LOCKS step ran
    assert torch.equal(out, flash_rows(s, q, bt, cm, range(0, 3)))


def test_min_context_dense_switch_eager_only(setup):
    s = setup({"precision": "fp32", "budget": 64, "min_context": 4096})
    bt, gen = tables(), torch.Generator().manual_seed(2)
    step(s, bt, [100, 37], [100, 37], gen)
    _, md, _, _ = step(s, bt, [1, 1], [101, 38], gen)
    assert md.dense and s.impl.wrapper_for(2).runs[-1] == (2, True)


def test_min_context_above_budget_in_full_graphs_is_per_sequence(setup):
    # Full graphs: no batch-level switch (a graph cannot change paths); the plan's dense_below
    # keeps each sequence shorter than min_context exact and lets the longer ones select, in the
    # same launch. Sequence 0 (301 tokens) selects, sequence 1 (101 < 200) attends every page.
    s = setup({"precision": "fp32", "budget": 64, "min_context": 200},
              cudagraph_mode=CUDAGraphMode.FULL_DECODE_ONLY)
    bt, gen = tables(), torch.Generator().manual_seed(4)
    step(s, bt, [300, 100], [300, 100], gen)
    cm, md, q, out = step(s, bt, [1, 1], [301, 101], gen)
    assert md.pure_decode and not md.dense and s.impl.wrapper_for(2).runs[-1] == (2, False)
    # Capacity: every page of a 199-token sequence (13), more than the budget's 4.
    assert s.impl.wrapper.capacity == 13 == md.bufs.pages.shape[2]
    dense = dense_of(s, q, bt, cm.seq_lens)
    tol = 2 ** -7
    assert (out[1].double() - dense[1]).abs().max() < tol           # below min_context: exact
    assert (out[0].double() - dense[0]).abs().max() > 10 * tol      # above: really sparse
    want, _ = ref.decode(q.float(), s.kv[0], s.kv[1], s.impl.side.summaries(), bt, cm.seq_lens,
                         budget=64, dense_below=200)
    assert (out.double() - want).abs().max() < tol


def test_side_cache_registered_under_the_layer_name(setup):
    s = setup({"precision": "fp32"})
    assert s.cfg.compilation_config.static_forward_context[side_layer_name(NAME)] is s.impl.side
    spec = s.impl.side.get_kv_cache_spec(s.cfg)
    assert spec.block_size == P and spec.page_size_bytes == s.impl.geom.page_bytes


def test_impl_refusals(setup):
    with pytest.raises(NotImplementedError, match="sliding-window"):
        setup({}, window=4096)
    with pytest.raises(NotImplementedError, match="GQA group 33"):
        setup({}, heads=66)


def test_cudagraph_support_level():
    from vllm.v1.attention.backend import AttentionCGSupport

    assert bd.LocksMetadataBuilder.get_cudagraph_support(None, None) == AttentionCGSupport.UNIFORM_BATCH
    from locks.vllm.side_cache import LocksSummaryMetadataBuilder

    assert LocksSummaryMetadataBuilder.get_cudagraph_support(None, None) == AttentionCGSupport.ALWAYS


def test_kv_layout_gives_contiguous_k_and_v():
    kv = torch.zeros(be.LocksAttentionBackend.get_kv_cache_shape(10, P, H, D))
    assert kv[0].is_contiguous() and kv[1].is_contiguous() and tuple(kv[0].shape) == (10, P, H, D)


def test_v1_runner_layout_is_read_with_a_block_stride():
    kv = v1_layout(torch.zeros(be.LocksAttentionBackend.get_kv_cache_shape(10, P, H, D)))
    k, v = kv[0], kv[1]
    assert k.stride() == (2 * P * H * D, H * D, D, 1) and v.storage_offset() == P * H * D
    assert im.kv_layout_problem(k, v) is None


@pytest.mark.parametrize("layout, why", [
    # Heads before tokens inside a block (an HND cache): a block is not contiguous.
    ("hnd", "block .* is not contiguous"),
    # vLLM's own FLASH_ATTN layout, K and V packed in the last dim ([N, P, H, 2d]).
    ("packed", "block .* is not contiguous"),
])
def test_kv_layouts_the_kernels_cannot_read_are_refused(setup, layout, why):
    s = setup({"precision": "fp32", "budget": 64})
    if layout == "hnd":
        kv = torch.zeros(2, NB, H, P, D, dtype=torch.bfloat16).transpose(2, 3)
    else:
        kv = torch.zeros(NB, P, H, 2 * D, dtype=torch.bfloat16).view(NB, P, H, 2, D).permute(3, 0, 1, 2, 4)
    assert tuple(kv.shape) == (2, NB, P, H, D)
    cm = common_metadata([37, 20], [37, 20], tables())
    n = cm.num_actual_tokens
    md = s.builder.build(0, cm)
    q = torch.zeros(n, HQ, D, dtype=torch.bfloat16)
    kv_new = torch.zeros(n, H, D, dtype=torch.bfloat16)
    out = torch.zeros(n, HQ * D, dtype=torch.bfloat16)
    with pytest.raises(NotImplementedError, match=why):
        s.impl.forward(LAYER, q, kv_new, kv_new, kv, md, out)


def test_step_metadata_from_the_forward_context(monkeypatch, setup):
    """The fused decode write finds the step's metadata where vLLM's attention op does: the
    forward context's dict by layer name, or its first dict under speculative decoding; None
    outside a forward, for another layer or for another backend's metadata."""
    import vllm.forward_context as fc

    s = setup({"budget": 64})
    cm = common_metadata([1, 1], [40, 29], tables())
    md = s.builder.build(0, cm)
    assert im._step_metadata(NAME) is None  # no forward context: the two-launch write
    for ctx, want in (({NAME: md}, md), ([{NAME: md}], md), ({"other.attn": md}, None),
                      ({NAME: object()}, None), ([], None)):
        monkeypatch.setattr(fc, "_forward_context", types.SimpleNamespace(attn_metadata=ctx))
        assert im._step_metadata(NAME) is want
