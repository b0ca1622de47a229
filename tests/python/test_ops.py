"""The torch operators against straightforward float64 torch references, opcheck, and errors."""
import math

import pytest
import torch

import locks
from locks import ops

P, H, D = 16, 2, 64


def make_cache(num_blocks, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    # Keys with page-local structure: each page its own low-rank subspace plus noise, so that
    # page masses differ (real-key-like) rather than the near-uniform attention of i.i.d. keys.
    basis = torch.randn(num_blocks, H, 3, D, generator=g)
    coef = torch.randn(num_blocks, P, H, 3, generator=g) * 2
    k = torch.einsum("bphr,bhrd->bphd", coef, basis) + 0.1 * torch.randn(num_blocks, P, H, D, generator=g)
    v = torch.randn(num_blocks, P, H, D, generator=g)
    return k.to(dtype).contiguous(), v.to(dtype)


def batch(num_blocks, lens, max_blocks):
    g = torch.Generator().manual_seed(1)
    perm = torch.randperm(num_blocks, generator=g).to(torch.int32)
    bt = perm[: len(lens) * max_blocks].view(len(lens), max_blocks).contiguous()
    return bt, torch.tensor(lens, dtype=torch.int32)


def built(nb, lens, mb):
    """Cache, batch, a random query and fp32 summaries of every block (the usual test setup)."""
    k, v = make_cache(nb)
    bt, sl = batch(nb, lens, mb)
    q = torch.randn(len(lens), 3 * H, D)
    s = ops.new_summaries(nb, H, D, P, 8)
    ops.summary_build(k, torch.arange(nb, dtype=torch.int32), s)
    return k, v, bt, sl, q, s


def ref_attention(q, k, v, bt, lens, pages=None, counts=None):
    """float64: softmax attention of q [B, Hq, d] over the sequence's tokens (or selected pages)."""
    B, Hq, d = q.shape
    G = Hq // H
    out = torch.zeros(B, Hq, d, dtype=torch.float64)
    lse = torch.zeros(B, Hq, dtype=torch.float64)
    for b in range(B):
        n = int(lens[b])
        kk = k[bt[b].long()].reshape(-1, H, d)[:n].double()
        vv = v[bt[b].long()].reshape(-1, H, d)[:n].double()
        for h in range(Hq):
            g = h // G
            idx = torch.arange(n)
            if pages is not None:
                sel = pages[b, g, : counts[b, g]].long()
                idx = idx[torch.isin(idx // P, sel)]
            logits = kk[idx, g] @ q[b, h].double() / math.sqrt(d)
            lse[b, h] = torch.logsumexp(logits, 0)
            out[b, h] = torch.softmax(logits, 0) @ vv[idx, g]
    return out, lse


def ref_select(q, k, bt, lens, budget):
    """Selection by exact page mass with share-averaging (the rank P-1 fp32 limit of LOCKS)."""
    B, Hq, d = q.shape
    G = Hq // H
    res = []
    for b in range(B):
        n = int(lens[b])
        full, npages = n // P, -(-n // P)
        kk = k[bt[b].long()].double()  # [blocks, P, H, d]
        row = []
        for g in range(H):
            shares = torch.zeros(full, dtype=torch.float64)
            for h in range(g * G, (g + 1) * G):
                s = torch.logsumexp((kk[:full, :, g] @ q[b, h].double()) / math.sqrt(d), dim=1)
                shares += torch.softmax(s, 0)
            kpages = budget // P
            if budget >= n:
                row.append(list(range(npages)))
                continue
            chosen = [npages - 1] if npages > full else []
            order = sorted(range(full), key=lambda j: (-shares[j].item(), j))
            chosen += order[: kpages - len(chosen)]
            row.append(sorted(chosen))
        res.append(row)
    return res


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_summary_reconstructs_keys(dtype):
    nb, r = 6, P - 1
    k, _ = make_cache(nb, dtype)
    s = ops.new_summaries(nb, H, D, P, r)
    ops.summary_build(k, torch.arange(nb, dtype=torch.int32), s)
    kd = k.double()
    mu = kd.mean(1)  # [nb, H, d]
    torch.testing.assert_close(s.mu.double(), mu, rtol=1e-5, atol=1e-5)
    # rank P-1 captures the centred keys exactly: mu + coeff @ basis == keys
    rec = s.mu[:, None].double() + torch.einsum("bhpr,bhrd->bphd", s.coeff.double(), s.basis.double())
    torch.testing.assert_close(rec, kd, rtol=1e-4, atol=1e-4)


def test_summary_rank8_is_best_rank8_fit():
    nb, r = 4, 8
    k, _ = make_cache(nb)
    s = ops.new_summaries(nb, H, D, P, r)
    ops.summary_build(k, torch.arange(nb, dtype=torch.int32), s)
    for b in range(nb):
        for h in range(H):
            dev = k[b, :, h].double() - k[b, :, h].double().mean(0)
            sv = torch.linalg.svdvals(dev)
            rec = torch.einsum("pr,rd->pd", s.coeff[b, h].double(), s.basis[b, h].double())
            err = torch.linalg.norm(dev - rec)
            assert err.item() == pytest.approx(sv[r:].norm().item(), rel=1e-4, abs=1e-5)


def test_summary_update_builds_only_filled_pages():
    nb = 8
    k, _ = make_cache(nb)
    bt = torch.tensor([[0, 1, 2, 3], [4, 5, 6, 7]], dtype=torch.int32)
    lens = torch.tensor([32, 33], dtype=torch.int32)  # seq 0 just filled block 1; seq 1 did not
    s = ops.new_summaries(nb, H, D, P, 8)
    ops.summary_update(k, bt, lens, s)
    assert torch.allclose(s.mu[1].double(), k[1].double().mean(0), atol=1e-5)
    assert s.mu[[0, 2, 3, 4, 5, 6, 7]].abs().sum() == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dense_and_sparse_decode_match_reference(dtype):
    nb, mb = 24, 10
    k, v = make_cache(nb, dtype)
    bt, lens = batch(nb, [150, 37], mb)
    q = torch.randn(2, 3 * H, D, generator=torch.Generator().manual_seed(3))
    out, lse = ops.dense_decode(q, k, v, bt, lens)
    ro, rl = ref_attention(q, k, v, bt, lens)
    torch.testing.assert_close(out.double(), ro, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(lse.double(), rl, rtol=1e-4, atol=1e-4)
    pages = torch.tensor([[[0, 3, 9, -1], [1, 2, 9, -1]], [[0, 2, -1, -1], [1, 2, -1, -1]]], dtype=torch.int32)
    counts = torch.tensor([[3, 3], [2, 2]], dtype=torch.int32)
    out, lse = ops.sparse_decode(q, k, v, bt, lens, pages, counts)
    ro, rl = ref_attention(q, k, v, bt, lens, pages, counts)
    torch.testing.assert_close(out.double(), ro, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(lse.double(), rl, rtol=1e-4, atol=1e-4)


def strided(x, layout):
    """x [N, P, H, d] as a view with a block stride: "v1" K = kv[:, 0] of an [N, 2, P, H, d]
    cache (vLLM's V1 model runner; the other half NaN), "padded" blocks 64 elements apart
    beyond their size (NaN between them)."""
    N = x.shape[0]
    if layout == "v1":
        kv = torch.full((N, 2, *x.shape[1:]), math.nan, dtype=x.dtype)
        kv[:, 0] = x
        return kv[:, 0]
    e = x[0].numel()
    buf = torch.full((N * (e + 64),), math.nan, dtype=x.dtype)
    view = buf.as_strided(x.shape, (e + 64, *x.stride()[1:]))
    view.copy_(x)
    return view


@pytest.mark.parametrize("layout", ["v1", "padded"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_strided_cache_gives_the_dense_results_bit_for_bit(dtype, layout):
    nb, mb = 24, 10
    k, v = make_cache(nb, dtype)
    ks, vs = strided(k, layout), strided(v, layout)
    assert not ks.is_contiguous() and torch.equal(ks, k)
    bt, lens = batch(nb, [150, 37], mb)
    q = torch.randn(2, 3 * H, D, generator=torch.Generator().manual_seed(3))
    assert all(torch.equal(a, b) for a, b in zip(ops.dense_decode(q, ks, vs, bt, lens),
                                                  ops.dense_decode(q, k, v, bt, lens)))
    s1, s2 = (ops.new_summaries(nb, H, D, P, 8, precision="int4") for _ in range(2))
    ops.summary_build(k, torch.arange(nb, dtype=torch.int32), s1)
    ops.summary_build(ks, torch.arange(nb, dtype=torch.int32), s2)
    assert all(torch.equal(a, b) for a, b in zip(s1, s2))
    pages, counts = ops.select_pages(q, s1, bt, lens, 48)
    assert all(torch.equal(a, b) for a, b in zip(ops.sparse_decode(q, ks, vs, bt, lens, pages, counts),
                                                  ops.sparse_decode(q, k, v, bt, lens, pages, counts)))
    # The slot-mapping update (vLLM's path) reads the strided K too.
    u1, u2 = (ops.new_summaries(nb, H, D, P, 8) for _ in range(2))
    slots = torch.tensor([5 * P + P - 1, -1, 7 * P + 3], dtype=torch.int32)
    ops.summary_update(k, bt, lens, u1, slot_mapping=slots)
    ops.summary_update(ks, bt, lens, u2, slot_mapping=slots)
    assert all(torch.equal(a, b) for a, b in zip(u1, u2)) and u2[0][5].abs().sum() > 0


@pytest.mark.parametrize("mdtype", [torch.bfloat16, torch.float16])
def test_model_dtype_query_view_and_output_are_the_fp32_path_rounded(mdtype):
    """An engine's query (the model dtype, a strided view of a fused QKV output) and its
    output buffer go to the ops as they are: the selection equals the fp32 path's on the
    rounded query, and each output value is the fp32 result rounded once."""
    nb, mb, Hq = 24, 10, 3 * H
    k, v = make_cache(nb, torch.bfloat16)
    bt, lens = batch(nb, [150, 37], mb)
    qkv = torch.randn(2, (Hq + 2 * H) * D, generator=torch.Generator().manual_seed(3)).to(mdtype)
    q = qkv[:, : Hq * D].view(2, Hq, D)
    assert not q.is_contiguous() and q.stride(0) == (Hq + 2 * H) * D
    q32 = q.float().contiguous()
    s = ops.new_summaries(nb, H, D, P, 8, precision="int4")
    ops.summary_build(k, torch.arange(nb, dtype=torch.int32), s)
    w = locks.DecodeWrapper.allocate(num_q_heads=Hq, num_kv_heads=H, head_dim=D, num_blocks=nb,
                                     max_batch=2, max_blocks_per_seq=mb, precision="int4",
                                     budget_tokens=48)
    p32, c32 = w.select(q32, s, bt, lens)
    p16, c16 = w.select(q, s, bt, lens)
    assert torch.equal(p32, p16) and torch.equal(c32, c16)
    for dense in (False, True):
        o32, l32 = w.run(q32, k, v, s, bt, lens, dense=dense)
        out = torch.empty(2, Hq, D, dtype=mdtype)
        o16, l16 = w.run(q, k, v, s, bt, lens, out=out, dense=dense)
        assert o16 is out and torch.equal(o16, o32.to(mdtype)) and torch.equal(l16, l32)


def test_select_full_rank_equals_exact_mass_selection():
    nb, mb = 40, 20
    k, v = make_cache(nb)
    bt, lens = batch(nb, [300, 250], mb)
    q = torch.randn(2, 3 * H, D, generator=torch.Generator().manual_seed(4)) * 2
    s = ops.new_summaries(nb, H, D, P, P - 1)
    used = torch.unique(bt[:, : -(-300 // P)].flatten())
    ops.summary_build(k, used.to(torch.int32), s)
    for budget in (32, 64, 128):
        pages, counts = ops.select_pages(q, s, bt, lens, budget)
        ref = ref_select(q, k, bt, lens, budget)
        for b in range(2):
            for g in range(H):
                assert pages[b, g, : counts[b, g]].tolist() == ref[b][g], (budget, b, g)


@pytest.mark.parametrize("precision", ["fp32", "int4"])
def test_selection_capacity_is_select_capacity(precision):
    # The pages tensor is exactly select.h's capacity (the CUDA decoder requires equality).
    nb, mb = 24, 10
    k, _ = make_cache(nb)
    bt, lens = batch(nb, [150, 37], mb)
    s = ops.new_summaries(nb, H, D, P, 8, precision=precision)
    ops.summary_build(k, torch.arange(nb, dtype=torch.int32), s)
    for budget, cap in ((48, 3), (100, 7), (160, 10), (4096, 10)):
        pages, counts = ops.select_pages(torch.randn(2, 3 * H, D), s, bt, lens, budget)
        assert pages.shape == (2, H, cap) == (2, H, ops.select_capacity(budget, P, mb))


@pytest.mark.parametrize("precision", ["fp32", "int4"])
def test_dense_below_keeps_short_sequences_whole(precision):
    # A minimum context above the budget: the 37- and 150-token sequences (< 151) keep every
    # page, the 151-token one selects floor(48 / 16) = 3; the capacity holds 150 tokens' pages;
    # the long sequence's list is the one the plain budget gives.
    nb, mb = 40, 12
    k, _ = make_cache(nb)
    bt, lens = batch(nb, [151, 150, 37], mb)
    s = ops.new_summaries(nb, H, D, P, 8, precision=precision)
    ops.summary_build(k, torch.arange(nb, dtype=torch.int32), s)
    q = torch.randn(3, 3 * H, D)
    pages, counts = ops.select_pages(q, s, bt, lens, 48, dense_below=151)
    assert pages.shape == (3, H, 10) == (3, H, ops.select_capacity(48, P, mb, dense_below=151))
    assert counts.tolist() == [[3] * H, [10] * H, [3] * H]
    assert all(pages[1, g].tolist() == list(range(10)) for g in range(H))
    assert all(pages[2, g].tolist() == [0, 1, 2] + [-1] * 7 for g in range(H))
    plain, pc = ops.select_pages(q, s, bt, lens, 48)
    assert torch.equal(pages[0, :, :3], plain[0]) and torch.equal(counts[0], pc[0])
    with pytest.raises(ValueError, match="dense_below"):
        ops.select_pages(q, s, bt, lens, 48, dense_below=-1)
    assert ops.select_capacity(48, P, mb, dense_below=49) == 3     # <= b + 1: no change
    assert ops.select_capacity(48, P, 300, dense_below=4097) == 256
    assert ops.select_capacity(48, P, 100, dense_below=4097) == 100   # max_blocks caps


def test_budget_covering_context_is_dense_bit_for_bit():
    k, v, bt, lens, q, s = built(24, [150, 37], 10)
    pages, counts = ops.select_pages(q, s, bt, lens, 160)
    out, lse = ops.sparse_decode(q, k, v, bt, lens, pages, counts)
    dout, dlse = ops.dense_decode(q, k, v, bt, lens)
    assert torch.equal(out, dout) and torch.equal(lse, dlse)


def test_bad_input_gets_clear_errors():
    nb, mb = 8, 4
    k, v = make_cache(nb)
    bt, lens = batch(nb, [50, 20], mb)
    q = torch.randn(2, 3 * H, D)
    s = ops.new_summaries(nb, H, D, P, 8)
    with pytest.raises(ValueError, match="budget"):
        ops.select_pages(q, s, bt, lens, 8)
    with pytest.raises(ValueError, match="seq_lens"):
        ops.dense_decode(q, k, v, bt, torch.tensor([100, 20], dtype=torch.int32))
    with pytest.raises(ValueError, match="block_table"):
        ops.dense_decode(q, k, v, bt.long(), lens)
    with pytest.raises(ValueError, match="q"):
        ops.dense_decode(q[:, :, :32].contiguous(), k, v, bt, lens)
    with pytest.raises(ValueError, match="rank"):
        ops.new_summaries(nb, H, D, P, P)


def _opcheck_args(precision):
    nb, mb = 12, 5
    k, v, bt, lens, q, _ = built(nb, [70, 33], mb)
    s = ops.new_summaries(nb, H, D, P, 8, precision=precision)
    ids = torch.arange(nb, dtype=torch.int32)
    ops.summary_build(k, ids, s)
    w = locks.DecodeWrapper.allocate(num_q_heads=3 * H, num_kv_heads=H, head_dim=D, num_blocks=nb,
                                     max_batch=2, max_blocks_per_seq=mb, precision=precision,
                                     kv_dtype=k.dtype, budget_tokens=48, scale=0.125)
    pages, counts = w.select(q, s, bt, lens)
    out, lse = torch.empty_like(q), torch.empty(2, 3 * H)
    s2 = list(ops.new_summaries(nb, H, D, P, 8, precision=precision))
    ws, plan = w.workspace, w.plan_vector
    slots = torch.tensor([1 * P + P - 1, -1, 7 * P + 3], dtype=torch.int32)
    L = torch.ops.locks
    return [
        (L.summary_build.default, (k, ids, s2)),
        (L.summary_update.default, (k, bt, torch.tensor([64, 33], dtype=torch.int32), None, s2)),
        (L.summary_update.default, (k, bt, lens, slots, s2)),
        (L.select_pages.default, (ws, plan, q, list(s), bt, lens, pages.clone(), counts.clone())),
        (L.decode_attention.default, (ws, plan, q, k, v, bt, lens, pages, counts, out, lse)),
        (L.decode_attention.default, (ws, plan, q, k, v, bt, lens, None, None, out.clone(), lse.clone())),
        (L.cache_write.default, (*_step_rows(3, k.dtype, 2), k.clone(), v.clone(), slots, s2)),
    ]


@pytest.mark.parametrize("precision", ["fp32", "int4"])
@pytest.mark.parametrize("i", range(7))
def test_opcheck(precision, i):
    op, args = _opcheck_args(precision)[i]
    torch.library.opcheck(op, args)


def test_compile_traces_decode_step():
    nb, mb = 12, 5
    k, v, bt, lens, q, s = built(nb, [70, 33], mb)
    # Plan outside the compiled step (host work, once per shape); the step only runs.
    w = locks.DecodeWrapper.allocate(num_q_heads=3 * H, num_kv_heads=H, head_dim=D, num_blocks=nb,
                                     max_batch=2, max_blocks_per_seq=mb, precision="fp32",
                                     kv_dtype=k.dtype, budget_tokens=48)

    def step(q):
        return w.run(q * 1.0, k, v, s, bt, lens)[0]

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(q), step(q), rtol=0, atol=0)


def dequant(sq, d):
    """Python restatement of summary.h's quant storage -> float (int4 two's complement nibbles)."""
    mu = sq.mu_q.float() * sq.mu_scale[..., None]
    lo = (sq.basis_q & 0xF).to(torch.int16)
    hi = (sq.basis_q >> 4).to(torch.int16)
    lo = torch.where(lo > 7, lo - 16, lo)
    hi = torch.where(hi > 7, hi - 16, hi)
    codes = torch.stack([lo, hi], dim=-1).reshape(*sq.basis_q.shape[:-1], d).float()
    # basis_scale [N, H, r, d / g]: one scale per g dims of a row (summary.h's basis_group)
    basis = (codes.unflatten(-1, (sq.basis_scale.shape[-1], -1)) * sq.basis_scale[..., None]).flatten(-2)
    coeff = sq.coeff_q.float() * sq.coeff_scale[:, :, None, :]
    return mu, basis, coeff


@pytest.mark.parametrize("d,group", [(64, None), (128, None), (256, None), (128, 128), (256, 16)])
def test_quant_summaries_are_the_quantized_fp32_summaries(d, group):
    """int4 = the fp32 build quantized: each basis scale is its group's max / 7 (None: the
    default groups, 32 dims at d >= 256, one a row at 64 / 128) and every entry is within half its
    group's step."""
    nb = 6
    g = torch.Generator().manual_seed(3)
    k = torch.randn(nb, P, H, d, generator=g) * torch.exp(torch.randn(d, generator=g))  # uneven channels
    ids = torch.arange(nb, dtype=torch.int32)
    sf = ops.new_summaries(nb, H, d, P, 8)
    sq = ops.new_summaries(nb, H, d, P, 8, precision="int4", basis_group=group)
    gs = group or ops.default_basis_group(d)
    assert sq.basis_scale.shape == (nb, H, 8, d // gs)
    ops.summary_build(k, ids, sf)
    ops.summary_build(k, ids, sq)
    mu, basis, coeff = dequant(sq, d)
    assert (mu - sf.mu).abs().max() <= sq.mu_scale.max() / 2 * 1.001 + 1e-6
    # same solver, same singular vectors up to sign: compare each row with its sign aligned
    sign = torch.sign((basis * sf.basis).sum(-1, keepdim=True))
    step = sq.basis_scale.repeat_interleave(gs, dim=-1)  # each entry's own group scale
    assert ((sign * basis - sf.basis).abs() <= step / 2 * 1.001 + 1e-6).all()
    group_max = sf.basis.abs().unflatten(-1, (d // gs, gs)).amax(-1)
    torch.testing.assert_close(sq.basis_scale, group_max / 7, rtol=1e-6, atol=0)
    assert (sign.squeeze(-1)[:, :, None, :] * coeff - sf.coeff).abs().max() <= sq.coeff_scale.max() / 2 * 1.001 + 1e-5


def test_default_basis_scale_groups_decode_and_refuse_others():
    """The plans take the default groups (32 dims at d 256): int4 summaries of those decode;
    summaries with other groups (valid for the build) are refused at the step, naming
    basis_group; a basis_scale that is not [N, H, r, d / g] is refused by the views."""
    d, nb, mb = 256, 20, 10
    g = torch.Generator().manual_seed(5)
    k = torch.randn(nb, P, H, d, generator=g)
    v = torch.randn(nb, P, H, d, generator=g)
    bt, sl = batch(nb, [150, 90], mb)
    q = torch.randn(2, 3 * H, d, generator=g)
    w = locks.DecodeWrapper.allocate(num_q_heads=3 * H, num_kv_heads=H, head_dim=d, num_blocks=nb,
                                     max_batch=2, max_blocks_per_seq=mb, precision="int4",
                                     kv_dtype=torch.float32, budget_tokens=64)
    ids = torch.arange(nb, dtype=torch.int32)
    s = ops.new_summaries(nb, H, d, P, 8, precision="int4")
    ops.summary_build(k, ids, s)
    pages, counts = w.select(q, s, bt, sl)
    assert counts.tolist() == [[4, 4], [4, 4]]
    per_row = ops.new_summaries(nb, H, d, P, 8, precision="int4", basis_group=d)
    ops.summary_build(k, ids, per_row)
    with pytest.raises(ValueError, match="basis_group"):
        w.select(q, per_row, bt, sl)
    old = list(s)
    old[3] = s.basis_scale[..., 0].contiguous()  # [N, H, r]: the former one-a-row format
    with pytest.raises(ValueError, match="basis_scale"):
        ops.summary_build(k, ids, old)
    odd = list(s)
    odd[3] = torch.zeros(nb, H, 8, 3)  # 256 / 3 dims a group
    with pytest.raises(ValueError, match="basis_scale"):
        w.select(q, odd, bt, sl)
    for bad in (0, 3, 48, 512):
        with pytest.raises(ValueError, match="basis_group"):
            ops.new_summaries(nb, H, d, P, 8, precision="int4", basis_group=bad)


def test_quant_selection_and_update():
    nb, mb = 40, 20
    k, v = make_cache(nb)
    bt, lens = batch(nb, [300, 250], mb)
    q = torch.randn(2, 3 * H, D, generator=torch.Generator().manual_seed(4)) * 2
    sf = ops.new_summaries(nb, H, D, P, 8)
    sq = ops.new_summaries(nb, H, D, P, 8, precision="int4")
    used = torch.unique(bt[:, : -(-300 // P)].flatten()).to(torch.int32)
    ops.summary_build(k, used, sf)
    ops.summary_build(k, used, sq)
    pf, cf = ops.select_pages(q, sf, bt, lens, 128)
    pq, cq = ops.select_pages(q, sq, bt, lens, 128)
    assert torch.equal(cf, cq)
    overlap = sum(len(set(pf[b, g].tolist()) & set(pq[b, g].tolist())) for b in range(2) for g in range(H))
    assert overlap >= 0.8 * cf.sum().item()  # int4 moves at most a few borderline pages
    pa, ca = ops.select_pages(q, sq, bt, lens, 320)
    assert ca.tolist() == [[19, 19], [16, 16]]  # b >= length: every page
    s2 = ops.new_summaries(nb, H, D, P, 8, precision="int4")
    bt2 = torch.tensor([[0, 1, 2, 3], [4, 5, 6, 7]], dtype=torch.int32)
    ops.summary_update(k, bt2, torch.tensor([32, 33], dtype=torch.int32), s2)
    assert s2.mu_q[1].abs().sum() > 0 and s2.mu_q[[0, 2, 3, 4, 5, 6, 7]].abs().sum() == 0


def test_query_weighted_summaries():
    """Query-weighted summaries (summary.h): weights of ones are the plain summaries bit for bit;
    at full rank any weights give the exact-mass selection; bad weights are refused."""
    nb, mb = 40, 20
    k, _ = make_cache(nb)
    bt, lens = batch(nb, [300, 250], mb)
    q = torch.randn(2, 3 * H, D, generator=torch.Generator().manual_seed(4)) * 2
    ids = torch.arange(nb, dtype=torch.int32)
    plain, ones = ops.new_summaries(nb, H, D, P, 8), ops.new_summaries(nb, H, D, P, 8)
    ops.summary_build(k, ids, plain)
    ops.summary_build(k, ids, ops.with_qweight(ones, torch.ones(H, D)))
    for a, b in zip(plain, ones):
        assert torch.equal(a, b)
    p0, c0 = ops.select_pages(q, plain, bt, lens, 64)
    p1, c1 = ops.select_pages(q, ops.with_qweight(ones, torch.ones(H, D)), bt, lens, 64)
    assert torch.equal(p0, p1) and torch.equal(c0, c1)

    w = torch.exp(torch.randn(H, D, generator=torch.Generator().manual_seed(5)) * 1.2)
    full = ops.new_summaries(nb, H, D, P, P - 1)
    ops.summary_build(k, ids, ops.with_qweight(full, w))
    for budget in (32, 64, 128):
        pages, counts = ops.select_pages(q, ops.with_qweight(full, w), bt, lens, budget)
        ref = ref_select(q, k, bt, lens, budget)
        for b in range(2):
            for g in range(H):
                assert pages[b, g, : counts[b, g]].tolist() == ref[b][g], (budget, b, g)

    bad = w.clone()
    bad[1, 3] = 0.0
    with pytest.raises(ValueError, match=r"qweight.*KV head 1, channel 3"):
        ops.summary_build(k, ids, ops.with_qweight(full, bad))
    with pytest.raises(ValueError, match=r"qweight.*expected shape"):
        ops.select_pages(q, ops.with_qweight(full, w[:, :8].contiguous()), bt, lens, 64)


def test_qweight_from_queries_is_the_group_rms_with_a_floor():
    g = torch.Generator().manual_seed(6)
    q_obs = torch.randn(5, 3 * H, D, generator=g) * torch.linspace(0.01, 3.0, D)
    w = ops.qweight_from_queries(q_obs, H)
    assert w.shape == (H, D) and w.dtype == torch.float32
    power = q_obs.double().pow(2).view(5, H, 3, D).mean(dim=(0, 2))  # [H, D]
    want = power.clamp_min(1e-2 * power.mean(dim=1, keepdim=True)).sqrt()
    torch.testing.assert_close(w.double(), want, rtol=1e-6, atol=0)
    with pytest.raises(ValueError, match="num_q_heads must be a multiple"):
        ops.qweight_from_queries(q_obs[:, :5], H)
    with pytest.raises(ValueError, match="NaN"):
        ops.qweight_from_queries(torch.full((1, 2 * H, D), float("nan")), H)


def _step_rows(n, dtype, seed):
    """key / value [n, H, D] as vLLM hands them over: views into one fused QKV output."""
    qkv = torch.randn(n, (3 * H + 2 * H) * D, generator=torch.Generator().manual_seed(seed)).to(dtype)
    key = qkv[:, 3 * H * D:4 * H * D].view(n, H, D)
    value = qkv[:, 4 * H * D:].view(n, H, D)
    assert not key.is_contiguous()
    return key, value


@pytest.mark.parametrize("layout", ["dense", "v1"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cache_write_equals_the_write_then_summary_update(dtype, layout):
    """cache_write = the K/V scatter (the last of two tokens naming one slot stays) followed by
    summary_update(slot_mapping=...): the same cache bytes and the same summary bits, with a
    whole page written in one call, padding, and the V1 runner's interleaved cache."""
    nb = 12
    k, v = make_cache(nb, dtype)
    slots = [3 * P + P - 1, -1, 5 * P + 2] + [7 * P + j for j in range(P)] + [-1, 5 * P + 2]
    n = len(slots)
    slot_t = torch.tensor(slots, dtype=torch.int32)
    key, value = _step_rows(n, dtype, 5)
    bt, lens = batch(nb, [40], 3)
    for with_summaries in (True, False):
        ka, va, kb, vb = k.clone(), v.clone(), k.clone(), v.clone()
        if layout == "v1":  # blocks 2 P H D apart, as in vLLM's V1 runner's [N, 2, P, H, D] cache
            ka, va = strided(ka, "v1"), strided(va, "v1")
        sa, sb = (ops.new_summaries(nb, H, D, P, 8, precision="int4") for _ in range(2))
        ops.cache_write(key, value, ka, va, slot_t, sa if with_summaries else None)
        for i, s in enumerate(slots):  # the reference: a plain scatter in token order
            if s >= 0:
                kb[s // P, s % P] = key[i]
                vb[s // P, s % P] = value[i]
        if with_summaries:
            ops.summary_update(kb, bt, lens, sb, slot_mapping=slot_t)
        assert torch.equal(ka, kb) and torch.equal(va, vb)
        assert all(torch.equal(a, b) for a, b in zip(sa, sb))
        built = sa[0].flatten(1).abs().sum(1) > 0  # mu_q of each block
        assert built.tolist() == [with_summaries and b in (3, 7) for b in range(nb)]


def test_cache_write_refuses_bad_calls_and_writes_nothing():
    nb = 4
    k, v = make_cache(nb)
    key, value = _step_rows(2, torch.float32, 1)
    s = ops.new_summaries(nb, H, D, P, 8)
    ok = torch.tensor([P - 1, -1], dtype=torch.int32)
    k0, v0 = k.clone(), v.clone()
    bad = {
        "slot past the cache": (key, value, torch.tensor([P - 1, nb * P], dtype=torch.int32), s),
        "slot below -1": (key, value, torch.tensor([-2, 0], dtype=torch.int32), s),
        "int64 slots": (key, value, ok.long(), s),
        "key of another dtype": (key.double(), value, ok, s),
        "key with a strided head dim": (key.transpose(1, 2).contiguous().transpose(1, 2), value, ok, s),
        "rows and slots disagree": (key[:1], value[:1], ok, s),
        "summaries of another cache": (key, value, ok, ops.new_summaries(nb + 1, H, D, P, 8)),
        "non-finite key": (key.clone().fill_(math.inf), value, ok, s),
    }
    for what, (kk, vv, sl, ss) in bad.items():
        with pytest.raises(ValueError):
            ops.cache_write(kk, vv, k, v, sl, ss)
        assert torch.equal(k, k0) and torch.equal(v, v0), what
        assert not any(t.any() for t in s), what
    # validate=True: the same slot refused by the host-side check (what the CUDA op would skip)
    with pytest.raises(ValueError, match="slot_mapping"):
        ops.cache_write(key, value, k, v, torch.tensor([P - 1, nb * P], dtype=torch.int32), s, validate=True)
