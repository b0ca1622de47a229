"""Issue #12, torch side: the bad-input matrix of the torch operators (called through the
Python helpers and directly as torch.ops.locks.*) and of locks.hf.enable, one case per
finding, each with the exception type and the words of its message. Also the NaN/Inf
policy at the torch level (docs/python.md): summary builds refuse non-finite keys, q is
checked, a NaN or Inf in K or V propagates to the affected heads' out and lse."""
import math

import pytest
import torch

import locks
from locks import ops

P, H, D, NB, MB = 16, 2, 64, 12, 5
L = torch.ops.locks


def base():
    g = torch.Generator().manual_seed(0)
    k = torch.randn(NB, P, H, D, generator=g)
    v = torch.randn(NB, P, H, D, generator=g)
    bt = torch.arange(2 * MB, dtype=torch.int32).view(2, MB).contiguous()
    sl = torch.tensor([70, 33], dtype=torch.int32)
    q = torch.randn(2, 3 * H, D, generator=g)
    s = ops.new_summaries(NB, H, D, P, 8)
    ops.summary_build(k, torch.arange(NB, dtype=torch.int32), s)
    w = locks.DecodeWrapper.allocate(num_q_heads=3 * H, num_kv_heads=H, head_dim=D, num_blocks=NB,
                                     max_batch=2, max_blocks_per_seq=MB, precision="fp32",
                                     kv_dtype=torch.float32, budget_tokens=48)
    pages, counts = w.select(q, s, bt, sl)
    out, lse = torch.empty_like(q), torch.empty(2, 3 * H)
    return dict(k=k, v=v, bt=bt, sl=sl, q=q, s=list(s), w=w, ws=w.workspace, plan=w.plan_vector,
                pages=pages, counts=counts, out=out, lse=lse)


def sel(a, **over):
    a = {**a, **over}
    L.select_pages(a["ws"], a["plan"], a["q"], a["s"], a["bt"], a["sl"], a["pages"], a["counts"])


def att(a, **over):
    a = {**a, **over}
    L.decode_attention(a["ws"], a["plan"], a["q"], a["k"], a["v"], a["bt"], a["sl"], a["pages"],
                       a["counts"], a["out"], a["lse"])


def rows_args(a):
    """request_rows over base()'s selection as two requests of T 2 token rows each."""
    return dict(req_pages=a["pages"], req_counts=a["counts"], req_lens=a["sl"],
                row_lens=torch.tensor([69, 70, 32, 33], dtype=torch.int32), T=2, P=P,
                pages=torch.empty(4, H, a["pages"].shape[2], dtype=torch.int32),
                counts=torch.empty(4, H, dtype=torch.int32))


def rows(a, **over):
    r = {**rows_args(a), **over}
    L.request_rows(r["req_pages"], r["req_counts"], r["req_lens"], r["row_lens"], r["T"], r["P"],
                   r["pages"], r["counts"])


def plan_args(**over):
    a = dict(backend=0, num_blocks=NB, page_size=P, num_kv_heads=H, head_dim=D, kv_dtype=torch.float32,
             rank=8, precision=0, num_q_heads=3 * H, max_batch=2, max_blocks_per_seq=MB,
             budget_tokens=48, sink_pages=0, recent_pages=0, scale=0.0)
    a.update(over)
    return list(a.values())


def _one_block_apart(a):
    """K and V in one buffer of NB + 1 blocks, V starting one block after K: they share NB - 1
    blocks (K block j + 1 is V block j)."""
    buf = torch.cat([a["k"], a["v"][:1]])
    return dict(k=buf[:NB], v=buf[1:])


def meta(t):
    return t.to("meta")


# (id, call(a), exception, message regex)
CASES = [
    # int64 arguments beyond int: checked, never narrowed (budget 2^32 + 16 used to select 1 page)
    ("plan_budget_2^32+16", lambda a: L.plan(*plan_args(budget_tokens=2**32 + 16)), ValueError, "budget_tokens.*out of range"),
    ("plan_sink_2^32", lambda a: L.plan(*plan_args(sink_pages=2**32)), ValueError, "sink_pages.*out of range"),
    ("plan_recent_negative", lambda a: L.plan(*plan_args(recent_pages=-1)), ValueError, "recent_pages.*out of range"),
    ("plan_max_batch_2^31", lambda a: L.plan(*plan_args(max_batch=2**31)), ValueError, "max_batch.*out of range"),
    ("plan_num_q_heads_2^32+6", lambda a: L.plan(*plan_args(num_q_heads=2**32 + 6)), ValueError, "num_q_heads.*out of range"),
    ("plan_scale_nan", lambda a: L.plan(*plan_args(scale=math.nan)), ValueError, "scale"),
    ("plan_budget_too_small", lambda a: L.plan(*plan_args(budget_tokens=8)), ValueError, "budget"),
    ("plan_tau_nan", lambda a: L.plan(*plan_args(tau=math.nan)), ValueError, "tau"),
    ("plan_tau_negative", lambda a: L.plan(*plan_args(tau=-0.1)), ValueError, "tau"),
    ("plan_tau_above_1", lambda a: L.plan(*plan_args(tau=1.5)), ValueError, "tau"),
    ("plan_tau_below_float", lambda a: L.plan(*plan_args(tau=1e-60)), ValueError, "tau"),
    ("plan_floor_negative", lambda a: L.plan(*plan_args(tau=0.5, floor_pages=-1)), ValueError, "floor_pages"),
    ("plan_floor_above_budget", lambda a: L.plan(*plan_args(tau=0.5, floor_pages=3)), ValueError, "floor_pages"),
    ("plan_backend_7", lambda a: L.plan(*plan_args(backend=7)), ValueError, "backend"),
    ("plan_precision_3", lambda a: L.plan(*plan_args(precision=3)), ValueError, "precision"),
    ("plan_kv_dtype_int8", lambda a: L.plan(*plan_args(kv_dtype=torch.int8)), ValueError, "kv_dtype"),
    ("plan_head_dim_47", lambda a: L.plan(*plan_args(head_dim=47)), NotImplementedError, "head_dim"),
    ("plan_head_dim_514", lambda a: L.plan(*plan_args(head_dim=514)), NotImplementedError, "head_dim"),
    ("py_select_budget_2^32+16", lambda a: ops.select_pages(a["q"], a["s"], a["bt"], a["sl"], 2**32 + 16), ValueError, "budget_tokens"),
    ("py_select_budget_float", lambda a: ops.select_pages(a["q"], a["s"], a["bt"], a["sl"], 64.0), TypeError, "budget_tokens must be an int"),
    ("py_select_budget_bool", lambda a: ops.select_pages(a["q"], a["s"], a["bt"], a["sl"], True), TypeError, "budget_tokens must be an int"),
    ("py_new_summaries_rank_P", lambda a: ops.new_summaries(NB, H, D, P, P), ValueError, "rank"),
    # meta and mixed devices: an error, never uninitialised outputs
    ("select_all_meta", lambda a: sel({k: meta(v) if isinstance(v, torch.Tensor) else v for k, v in a.items()}, s=[meta(t) for t in a["s"]]), ValueError, "meta"),
    ("select_q_meta", lambda a: sel(a, q=meta(a["q"])), ValueError, "meta|mixed"),
    ("select_pages_out_meta", lambda a: sel(a, pages=meta(a["pages"])), ValueError, "meta|mixed"),
    ("attention_k_meta", lambda a: att(a, k=meta(a["k"])), ValueError, "meta|mixed"),
    ("attention_out_meta", lambda a: att(a, out=meta(a["out"])), ValueError, "meta|mixed"),
    ("build_k_meta", lambda a: L.summary_build(meta(a["k"]), torch.arange(NB, dtype=torch.int32), a["s"]), ValueError, "meta|mixed"),
    ("build_summary_meta", lambda a: L.summary_build(a["k"], torch.arange(NB, dtype=torch.int32), [meta(a["s"][0]), *a["s"][1:]]), ValueError, "meta|mixed"),
    ("update_all_meta", lambda a: L.summary_update(meta(a["k"]), meta(a["bt"]), meta(a["sl"]), None, [meta(t) for t in a["s"]]), ValueError, "meta"),
    # dtypes, shapes, layouts
    ("block_table_int64", lambda a: att(a, bt=a["bt"].long()), ValueError, "block_table"),
    ("seq_lens_int64", lambda a: att(a, sl=a["sl"].long()), ValueError, "seq_lens"),
    # (float16 / bfloat16 queries and outputs are served: test_ops.py's model-dtype tests)
    ("q_float64", lambda a: att(a, q=a["q"].double()), ValueError, "q: dtype"),
    ("q_rows_overlap", lambda a: att(a, q=a["q"].as_strided(a["q"].shape, (a["q"].shape[2], a["q"].shape[2], 1))), ValueError, "q: each sequence"),
    ("out_int32", lambda a: att(a, out=a["out"].int()), ValueError, "out: dtype"),
    ("q_noncontiguous", lambda a: att(a, q=a["q"].transpose(0, 1).contiguous().transpose(0, 1)), ValueError, "q.*contiguous"),
    ("q_wrong_head_dim", lambda a: att(a, q=a["q"][:, :, :32].contiguous()), ValueError, "q"),
    ("v_shape_differs", lambda a: att(a, v=a["v"][:, :8].contiguous()), ValueError, "v_cache"),
    ("v_dtype_differs", lambda a: att(a, v=a["v"].bfloat16()), ValueError, "v_cache"),
    ("k_int8", lambda a: L.summary_build(a["k"].to(torch.int8), torch.arange(NB, dtype=torch.int32), a["s"]), ValueError, "k_cache"),
    # block strides (kv_cache.h): blocks [P, H, d] contiguous, any block stride >= P * H * d, the
    # same for K and V, K and V disjoint
    ("k_block_not_contiguous", lambda a: att(a, k=a["k"].transpose(1, 2).contiguous().transpose(1, 2)), ValueError, r"k_cache: each block .* must be contiguous"),
    ("v_block_not_contiguous", lambda a: att(a, v=a["v"].transpose(2, 3).contiguous().transpose(2, 3)), ValueError, r"v_cache: each block .* must be contiguous"),
    ("build_k_block_not_contiguous", lambda a: L.summary_build(a["k"].transpose(1, 2).contiguous().transpose(1, 2), torch.arange(NB, dtype=torch.int32), a["s"]), ValueError, "k_cache: each block"),
    ("k_blocks_overlap", lambda a: att(a, k=a["k"].as_strided(a["k"].shape, (P * H * D // 2, H * D, D, 1))), ValueError, "k_cache: block stride .* below one block"),
    ("k_block_stride_0", lambda a: att(a, k=a["k"][:1].expand(NB, P, H, D)), ValueError, "k_cache: block stride 0"),
    ("update_k_blocks_overlap", lambda a: L.summary_update(a["k"].as_strided(a["k"].shape, (64, H * D, D, 1)), a["bt"], a["sl"], None, a["s"]), ValueError, "k_cache: block stride"),
    ("v_block_stride_differs", lambda a: att(a, v=torch.stack([a["v"], a["v"]], 1)[:, 0]), ValueError, "v_cache: block stride .* differs"),
    ("v_is_k", lambda a: att(a, v=a["k"]), ValueError, "overlap"),
    ("v_one_block_into_k", lambda a: att(a, **_one_block_apart(a)), ValueError, "overlap"),
    # a 4th tensor is read as the query weights [H, d] (summary.h): named when it is not one
    ("summaries_4_tensors", lambda a: sel(a, s=a["s"] + [a["s"][0]]), ValueError,
     r"summaries\[-1\] \(qweight\): expected 2 dimensions"),
    ("summaries_5_tensors", lambda a: sel(a, s=a["s"] + [a["s"][0], a["s"][0]]), ValueError,
     "summaries: expected 3"),
    ("qweight_zero", lambda a: sel(a, s=a["s"] + [torch.zeros(a["s"][0].shape[1], a["s"][0].shape[2])]),
     ValueError, r"qweight.*finite and > 0"),
    ("summaries_mixed_dtypes", lambda a: sel(a, s=[a["s"][0].to(torch.int8), *a["s"][1:]]), ValueError, "summaries"),
    ("summaries_wrong_blocks", lambda a: L.summary_build(a["k"], torch.arange(4, dtype=torch.int32), [t[:4].contiguous() for t in a["s"]]), ValueError, "do not match the cache"),
    ("out_wrong_shape", lambda a: att(a, out=a["out"][:1].contiguous()), ValueError, "out"),
    ("lse_float64", lambda a: att(a, lse=a["lse"].double()), ValueError, "lse"),
    ("pages_without_counts", lambda a: att(a, counts=None), ValueError, "pages and counts"),
    ("pages_past_plan_capacity", lambda a: att(a, pages=torch.zeros(2, H, 4, dtype=torch.int32)), ValueError, "capacity"),
    ("batch_0", lambda a: att(a, q=a["q"][:0], bt=a["bt"][:0], sl=a["sl"][:0], out=a["out"][:0], lse=a["lse"][:0]), ValueError, "batch"),
    ("batch_past_plan", lambda a: att(a, pages=None, counts=None, q=torch.cat([a["q"]] * 2), bt=torch.cat([a["bt"]] * 2), sl=torch.cat([a["sl"]] * 2), out=torch.cat([a["out"]] * 2), lse=torch.cat([a["lse"]] * 2)), ValueError, "batch"),
    # values the core checks: lengths past capacity, block ids out of range
    ("lens_past_capacity", lambda a: att(a, sl=torch.tensor([MB * P + 1, 33], dtype=torch.int32), pages=None, counts=None), ValueError, "seq_lens|length"),
    ("lens_negative", lambda a: att(a, sl=torch.tensor([-1, 33], dtype=torch.int32), pages=None, counts=None), ValueError, "seq_lens|length"),
    ("block_id_out_of_range", lambda a: att(a, bt=torch.full((2, MB), NB, dtype=torch.int32), pages=None, counts=None), ValueError, "block"),
    ("build_block_id_out_of_range", lambda a: L.summary_build(a["k"], torch.tensor([NB], dtype=torch.int32), a["s"]), ValueError, "block"),
    ("update_slot_mapping_int64", lambda a: L.summary_update(a["k"], a["bt"], a["sl"], torch.tensor([15]), a["s"]), ValueError, "slot_mapping"),
    ("update_slot_out_of_range", lambda a: L.summary_update(a["k"], a["bt"], a["sl"], torch.tensor([NB * P + P - 1], dtype=torch.int32), a["s"]), ValueError, "slot|block"),
    ("selected_page_out_of_range", lambda a: att(a, pages=torch.full((2, H, 3), MB, dtype=torch.int32), counts=torch.full((2, H), 3, dtype=torch.int32)), ValueError, "page|pages"),
    # request_rows (speculative verification, include/locks/request_rows.h): T 2 rows a request
    ("rows_meta", lambda a: rows(a, pages=meta(rows_args(a)["pages"])), ValueError, "meta|mixed"),
    ("rows_pages_int64", lambda a: rows(a, req_pages=a["pages"].long()), ValueError, "req_pages: expected dtype"),
    ("rows_count_mismatch", lambda a: rows(a, T=3), ValueError, "seq_lens: 4 rows, expected 2 requests x 3"),
    ("rows_tokens_0", lambda a: rows(a, T=0), ValueError, "seq_lens"),
    ("rows_capacity_below", lambda a: rows(a, pages=torch.zeros(4, H, 1, dtype=torch.int32)), ValueError, "capacity"),
    ("rows_page_size_0", lambda a: rows(a, P=0), ValueError, "page_size"),
    ("rows_past_request", lambda a: rows(a, row_lens=torch.tensor([69, 70 + P, 32, 33], dtype=torch.int32)), ValueError, "ends past the last page"),
    ("rows_len_0", lambda a: rows(a, row_lens=torch.tensor([0, 70, 32, 33], dtype=torch.int32)), ValueError, "row_seq_lens"),
    ("rows_request_count_0", lambda a: rows(a, req_counts=torch.zeros(2, H, dtype=torch.int32)), ValueError, "count"),
    # plan / workspace misuse
    ("plan_vector_truncated", lambda a: sel(a, plan=a["plan"][:8]), ValueError, "plan"),
    ("workspace_too_small", lambda a: sel(a, ws=a["ws"][:100]), ValueError, "workspace"),
    ("workspace_float", lambda a: sel(a, ws=a["ws"].float()), ValueError, "workspace"),
    # NaN/Inf policy: checked where the data enters
    ("build_nan_key", lambda a: L.summary_build(a["k"].index_fill(0, torch.tensor([3]), math.nan), torch.arange(NB, dtype=torch.int32), a["s"]), ValueError, "non-finite"),
    ("build_inf_key", lambda a: L.summary_build(a["k"].index_fill(0, torch.tensor([3]), math.inf), torch.arange(NB, dtype=torch.int32), a["s"]), ValueError, "non-finite"),
    ("q_nan", lambda a: att(a, q=a["q"].index_fill(0, torch.tensor([1]), math.nan)), ValueError, "non-finite"),
    ("select_q_inf", lambda a: sel(a, q=a["q"].index_fill(0, torch.tensor([0]), math.inf)), ValueError, "non-finite"),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_input(case):
    _, call, exc, msg = case
    a = base()
    before = a["out"].clone(), a["pages"].clone()
    with pytest.raises(exc, match=msg):
        call(a)
    # outputs written whole or not at all: a refused call leaves the caller's tensors alone
    assert torch.equal(a["out"], before[0]) or torch.isnan(before[0]).any()
    assert torch.equal(a["pages"], before[1])


def test_cuda_plan_without_cuda_build_is_not_implemented():
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: covered by tests/python/test_gpu_*.py")
    with pytest.raises((NotImplementedError, RuntimeError, AssertionError)):
        L.plan(*plan_args(backend=1))


@pytest.mark.parametrize("where,value", [("k", math.nan), ("v", math.nan), ("v", math.inf), ("k", math.inf)])
def test_nan_or_inf_in_the_cache_propagates_to_the_affected_heads(where, value):
    """Attention never drops a token silently: a NaN logit (NaN in K), a +Inf logit (Inf in K
    against a query of the same sign) or a NaN/Inf in V makes out (and, for K, lse) of the
    query heads that read it non-finite; other heads are unchanged. (An Inf in K against a
    query of the other sign is a -Inf logit: weight 0, the exact softmax.)"""
    a = base()
    clean, clean_lse = ops.dense_decode(a["q"], a["k"], a["v"], a["bt"], a["sl"])
    heads = [3, 4, 5]  # KV head 1's query heads (group 3)
    sign = torch.sign(a["q"][0, heads])  # [3, d]
    j = int(torch.nonzero((sign > 0).any(0) & (sign < 0).any(0))[0])  # a dim where the signs differ
    bad = a[where].clone()
    bad[int(a["bt"][0, 1]), 4, 1, j] = value  # sequence 0, token 20, KV head 1, dim j
    k, v = (bad, a["v"]) if where == "k" else (a["k"], bad)
    out, lse = ops.dense_decode(a["q"], k, v, a["bt"], a["sl"])
    if where == "k" and value == math.inf:
        plus = [h for h in heads if a["q"][0, h, j] > 0]
        minus = [h for h in heads if a["q"][0, h, j] < 0]
        assert torch.isfinite(out[0, minus]).all()  # -Inf logit: weight 0
        heads = plus
    if where == "k":
        assert torch.isnan(out[0, heads]).all() and torch.isnan(lse[0, heads]).all(), "the token was dropped"
    else:
        assert not torch.isfinite(out[0, heads, j]).any(), "the token was dropped"
        assert torch.equal(lse[0], clean_lse[0])  # V does not enter the logits
    assert torch.equal(out[0, :3], clean[0, :3]) and torch.equal(out[1], clean[1])
    assert torch.equal(lse[1], clean_lse[1])


# -- locks.hf.enable: validated when called -------------------------------------------------
transformers = pytest.importorskip("transformers")
import locks.hf as lhf  # noqa: E402


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(num_hidden_layers=2, hidden_size=128, intermediate_size=256,
                                   num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                                   vocab_size=100, max_position_embeddings=4096)
    return transformers.LlamaForCausalLM(cfg).eval()


HF_CASES = [
    (dict(budget=64.5), TypeError, "budget must be an int"),
    (dict(budget="64"), TypeError, "budget must be an int"),
    (dict(budget=True), TypeError, "budget must be an int"),
    (dict(budget=2**32 + 16), ValueError, "budget"),
    (dict(budget=0), ValueError, "budget"),
    (dict(budget=8), ValueError, "budget 8 is too small"),
    (dict(budget=64, sink_pages=2, recent_pages=2), ValueError, "too small"),
    (dict(page_size=16.0), TypeError, "page_size must be an int"),
    (dict(page_size=1), ValueError, "page_size"),
    (dict(page_size=512), ValueError, "page_size"),
    (dict(rank=0), ValueError, "rank"),
    (dict(rank=16), ValueError, "rank"),
    (dict(rank=8.0), TypeError, "rank must be an int"),
    (dict(reserve_tokens=-1000), ValueError, "reserve_tokens"),
    (dict(reserve_tokens=None), TypeError, "reserve_tokens"),
    (dict(sink_pages=-5), ValueError, "sink_pages"),
    (dict(sink_pages=2**32), ValueError, "sink_pages"),
    (dict(recent_pages=-1), ValueError, "recent_pages"),
    (dict(recent_pages="1"), TypeError, "recent_pages"),
    (dict(precision="int8"), ValueError, "precision"),
    (dict(precision=4), ValueError, "precision"),
    (dict(check_finite=1), TypeError, "check_finite"),
    (dict(tau=math.nan), ValueError, "tau"),
    (dict(tau=-0.1), ValueError, "tau"),
    (dict(tau=1.5), ValueError, "tau"),
    (dict(tau="0.9"), TypeError, "tau must be a float"),
    (dict(tau=True), TypeError, "tau must be a float"),
    (dict(tau=0.9, floor_pages=-1), ValueError, "floor_pages"),
    (dict(tau=0.9, floor_pages=1.0), TypeError, "floor_pages must be an int"),
    (dict(budget=64, tau=0.9, floor_pages=4), ValueError, "floor_pages must be in \\[0, 3\\]"),
    (dict(tau=0.9, selector="quest"), ValueError, "needs a budget and the 'locks' selector"),
    (dict(budget=None, tau=0.9), ValueError, "needs a budget"),
]


@pytest.mark.parametrize("kw,exc,msg", HF_CASES, ids=[str(c[0]) for c in HF_CASES])
def test_hf_enable_validates_when_called(tiny, kw, exc, msg):
    with pytest.raises(exc, match=msg):
        lhf.enable(tiny, **{"budget": 512, **kw})
    with pytest.raises(exc, match=msg):
        lhf.LocksCache(tiny.config, **{"budget": 512, **kw})
    assert not hasattr(tiny, "locks_config")  # nothing was changed


def test_hf_enable_accepts_valid_configurations(tiny):
    for kw in (dict(budget=None), dict(budget=512, page_size=32, rank=4, precision="fp32"),
               dict(budget=96, sink_pages=1, recent_pages=1, reserve_tokens=0, check_finite=True)):
        lhf.enable(tiny, **kw)
        assert tiny.locks_config.budget == kw["budget"]
        lhf.disable(tiny)


def test_hf_enable_unsupported_head_dim_is_not_implemented():
    cfg = transformers.LlamaConfig(num_hidden_layers=1, hidden_size=96, num_attention_heads=2,
                                   num_key_value_heads=1, head_dim=520, vocab_size=64,
                                   intermediate_size=64)
    ok, why = locks.supports("cpu", head_dim=520, group=2, kv_dtype=torch.float32)
    assert not ok and why == "cpu: head_dim must be even and in [8, 512], got 520"
    with pytest.raises(NotImplementedError, match="head_dim"):
        lhf.enable(transformers.LlamaForCausalLM(cfg), budget=512)


def test_hf_budget_2_pow_32_is_refused_not_one_page(tiny):
    # the finding: hf.enable(budget=2**32 + 16) selected one page
    with pytest.raises(ValueError, match="budget"):
        lhf.enable(tiny, budget=2**32 + 16)


def test_hf_check_finite_stops_generate_on_a_nan_key(tiny):
    ids = torch.randint(0, 100, (1, 40))
    layer = tiny.model.layers[0].self_attn.k_proj
    saved = layer.weight.detach().clone()
    try:
        lhf.enable(tiny, budget=64, check_finite=True)
        with torch.no_grad():
            layer.weight[0, 0] = math.nan
        with pytest.raises(ValueError, match="NaN or Inf"):
            tiny.generate(ids, max_new_tokens=2, do_sample=False)
    finally:
        with torch.no_grad():
            layer.weight.copy_(saved)
        lhf.disable(tiny)


# validate=True (issue #12, device-side values): the same bad values the CPU ops refuse on
# the host are refused by the eager check first, with the tensor's name and the first bad
# index, before any kernel runs; the CPU ops' own errors are the fallback (validate=False).
def _bad_pages(a):
    p = a["pages"].clone()
    p[1, 0, 0] = MB  # counted entry past the sequence's pages (seq 1 has 3 pages)
    return p


VALIDATE_CASES = [
    ("lens_past_capacity", dict(sl=torch.tensor([MB * P + 1, 33], dtype=torch.int32)), r"seq_lens\[0\] = 81 is outside \[1, 80\]"),
    ("lens_zero", dict(sl=torch.tensor([70, 0], dtype=torch.int32)), r"seq_lens\[1\] = 0"),
    ("lens_negative", dict(sl=torch.tensor([-1, 33], dtype=torch.int32)), r"seq_lens\[0\] = -1"),
    ("block_id_out_of_range", dict(bt=torch.tensor([[0, 1, 2, 3, 4], [5, 6, NB, 0, 0]], dtype=torch.int32)), r"block_table\[1, 2\] = 12 .*\[0, 12\)"),
    ("block_id_negative", dict(bt=torch.tensor([[0, 1, -3, 3, 4], [5, 6, 7, 0, 0]], dtype=torch.int32)), r"block_table\[0, 2\] = -3"),
]


@pytest.mark.parametrize("case", VALIDATE_CASES, ids=[c[0] for c in VALIDATE_CASES])
@pytest.mark.parametrize("entry", ["run", "run_dense", "select", "attend"])
def test_validate_raises(case, entry):
    _, over, msg = case
    a = {**base(), **over}
    w = a["w"]
    with pytest.raises(ValueError, match=msg):
        if entry == "run":
            w.run(a["q"], a["k"], a["v"], a["s"], a["bt"], a["sl"], validate=True)
        elif entry == "run_dense":
            w.run(a["q"], a["k"], a["v"], a["s"], a["bt"], a["sl"], dense=True, validate=True)
        elif entry == "select":
            w.select(a["q"], a["s"], a["bt"], a["sl"], validate=True)
        else:
            w.attend(a["q"], a["k"], a["v"], a["bt"], a["sl"], validate=True)
    # the CPU ops refuse the same values on their own (validate=False): consistent answers
    with pytest.raises(ValueError):
        w.run(a["q"], a["k"], a["v"], a["s"], a["bt"], a["sl"], dense=True)


def test_validate_unused_block_ids_are_not_checked():
    a = base()
    bt = a["bt"].clone()
    bt[1, 3:] = 10_000  # seq 1 (33 tokens) uses pages 0..2 only
    o1, l1 = a["w"].run(a["q"], a["k"], a["v"], a["s"], bt, a["sl"], validate=True)
    o2, l2 = a["w"].run(a["q"], a["k"], a["v"], a["s"], a["bt"], a["sl"])
    assert torch.equal(o1, o2) and torch.equal(l1, l2)


@pytest.mark.parametrize("what", ["page", "count_high", "count_negative"])
def test_validate_selection(what):
    a = base()
    pages, counts = a["pages"], a["counts"]
    if what == "page":
        pages, msg = _bad_pages(a), r"pages\[1, 0, 0\] = 5 .*pages of its sequence"
        counts = counts.clone()
        counts[1, 0] = max(1, int(counts[1, 0]))
    elif what == "count_high":
        counts, msg = counts.clone(), r"counts\[0, 1\] = 99 is outside \[0, "
        counts[0, 1] = 99
    else:
        counts, msg = counts.clone(), r"counts\[1, 1\] = -2"
        counts[1, 1] = -2
    with pytest.raises(ValueError, match=msg):
        a["w"].attend(a["q"], a["k"], a["v"], a["bt"], a["sl"], pages=pages, counts=counts,
                      validate=True)
    with pytest.raises(ValueError):  # the CPU op refuses it too
        a["w"].attend(a["q"], a["k"], a["v"], a["bt"], a["sl"], pages=pages, counts=counts)


def test_validate_valid_inputs_unchanged():
    a = base()
    w = a["w"]
    o1, l1 = w.run(a["q"], a["k"], a["v"], a["s"], a["bt"], a["sl"], validate=True)
    o2, l2 = w.run(a["q"], a["k"], a["v"], a["s"], a["bt"], a["sl"])
    assert torch.equal(o1, o2) and torch.equal(l1, l2)
    p, c = w.select(a["q"], a["s"], a["bt"], a["sl"], validate=True)
    o3, _ = w.attend(a["q"], a["k"], a["v"], a["bt"], a["sl"], pages=p, counts=c, validate=True)
    assert torch.equal(o3, o1)


def test_validate_summary_helpers():
    a = base()
    with pytest.raises(ValueError, match=r"block_ids\[1\] = 12 is outside \[0, 12\)"):
        ops.summary_build(a["k"], torch.tensor([0, NB], dtype=torch.int32), a["s"], validate=True)
    with pytest.raises(ValueError, match=r"block_ids\[0\] = -1"):
        ops.summary_build(a["k"], torch.tensor([-1], dtype=torch.int32), a["s"], validate=True)
    with pytest.raises(ValueError, match=r"slot_mapping\[1\] = 192 is neither -1 nor in \[0, 192\)"):
        ops.summary_update(a["k"], a["bt"], a["sl"], a["s"],
                           slot_mapping=torch.tensor([15, NB * P], dtype=torch.int32), validate=True)
    with pytest.raises(ValueError, match=r"slot_mapping\[0\] = -2"):
        ops.summary_update(a["k"], a["bt"], a["sl"], a["s"],
                           slot_mapping=torch.tensor([-2], dtype=torch.int32), validate=True)
    with pytest.raises(ValueError, match=r"seq_lens\[1\] = 200"):
        ops.summary_update(a["k"], a["bt"], torch.tensor([70, 200], dtype=torch.int32), a["s"],
                           validate=True)
    # valid: padding -1 and in-range slots pass, and the build matches validate=False
    s2 = [t.clone() for t in a["s"]]
    ops.summary_update(a["k"], a["bt"], a["sl"], a["s"],
                       slot_mapping=torch.tensor([-1, 15, 31], dtype=torch.int32), validate=True)
    ops.summary_update(a["k"], a["bt"], a["sl"], s2,
                       slot_mapping=torch.tensor([-1, 15, 31], dtype=torch.int32))
    assert all(torch.equal(x, y) for x, y in zip(a["s"], s2))
    ops.summary_build(a["k"], torch.arange(NB, dtype=torch.int32), a["s"], validate=True)


def test_request_rows_base_call_is_valid():
    """The request_rows cases above each change one thing of a call that succeeds."""
    a = base()
    r = rows_args(a)
    rows(a, pages=r["pages"], counts=r["counts"])
    assert (r["counts"] >= 1).all() and (r["pages"][:, :, 0] >= 0).all()
