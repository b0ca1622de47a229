"""The CUDA operators against the CPU operators and the float64 reference, within the derived
bounds (gpu_util.py, from tests/common/test_compare.h), and torch.library.opcheck on CUDA.
Run on the GPU machine: scripts/gpu_tests.sh python."""
import pytest
import torch

import locks
from locks import ops

from gpu_util import (DEV, UNIT, as_float_summaries, assert_attention_close, assert_selections_agree,
                      full_blocks, group_shares, needs_cuda, paged, ref_attention)

pytestmark = pytest.mark.gpu
P = 16


def wrapper(device, B, Hq, H, d, nb, mb, budget, precision="int4", dtype=torch.bfloat16, **kw):
    return locks.DecodeWrapper.allocate(num_q_heads=Hq, num_kv_heads=H, head_dim=d, num_blocks=nb,
                                        max_batch=B, max_blocks_per_seq=mb, precision=precision,
                                        kv_dtype=dtype, budget_tokens=budget, device=device, **kw)


SHAPES = [  # (head_dim, H, Hq, dtype)
    (128, 2, 8, torch.bfloat16),
    (64, 4, 4, torch.bfloat16),
    (128, 1, 16, torch.float16),
]


def assert_same_fit(k, blocks, s_a, s_b, precision, as_float=False):
    """Two summary builds of the same pages fit equally well: each page's residual energy
    (the sum of its keys' squared reconstruction errors, i.e. the eigenvalues past rank r)
    agrees. That objective is stable when the r-th and (r+1)-th eigenvalues nearly tie, where
    each key's own residual is not (two solvers may keep different directions of a tied pair:
    seen on random keys); bases differ in sign and, at equal singular values, rotation.
    fp32: each fit is within 64 r P eps32 (sigma_0^2 + ||K - mu||^2) of the optimal residual
    (the bound of expect_summary_matches in tests/ops/test_backend_ops.cpp; sigma_0^2 <=
    ||K - mu||^2), so the two differ by at most twice that; int4: each key moves by at most
    one basis quantization step (0.05 of the page's largest key norm), so the page's residual
    norm moves by at most that times sqrt(P)."""
    fa, fb = (s_a, s_b) if as_float else (as_float_summaries(s_a), as_float_summaries(s_b))
    rec = lambda s: (s[0][:, None] + torch.einsum("bhpr,bhrd->bphd", s[2], s[1]))[blocks.long()]  # noqa: E731
    kk = k[blocks.long()].double()
    e_a = ((rec(fa).double() - kk).norm(dim=-1) ** 2).sum(1)  # [pages, H]
    e_b = ((rec(fb).double() - kk).norm(dim=-1) ** 2).sum(1)
    if precision == "fp32":
        frob = ((kk - kk.mean(1, keepdim=True)) ** 2).sum(dim=(1, 3))
        bound = 2 * 64 * 8 * P * 2.0 ** -24 * (2 * frob) + 1e-12
        assert ((e_a - e_b).abs() <= bound).all(), float(((e_a - e_b).abs() / bound).max())
    else:
        bound = 0.05 * kk.norm(dim=-1).amax(1) * P ** 0.5
        assert ((e_a.sqrt() - e_b.sqrt()).abs() <= bound).all(), float(((e_a.sqrt() - e_b.sqrt()).abs() / bound).max())


@pytest.mark.parametrize("d,H,Hq,dtype", SHAPES)
@pytest.mark.parametrize("precision", ["fp32", "int4"])
def test_cuda_summary_build_matches_cpu(d, H, Hq, dtype, precision):
    """The CUDA bulk build (warp Jacobi) fits every full page as well as the CPU's (Eigen)."""
    k, _, bt, sl, _ = paged(H=H, Hq=Hq, d=d, dtype=dtype)
    nb = k.shape[0]
    full = full_blocks(bt, sl)
    sc = ops.new_summaries(nb, H, d, P, 8, precision=precision)
    sg = ops.new_summaries(nb, H, d, P, 8, DEV, precision)
    ops.summary_build(k, full, sc)
    ops.summary_build(k.to(DEV), full.to(DEV), sg)
    assert_same_fit(k, full, sc, sg, precision)


@pytest.mark.parametrize("precision", ["fp32", "int4"])
def test_cuda_summary_update_both_rules_match_bulk(precision):
    """summary_update by lengths and by slot mapping run the same latency kernel over the same
    pages: bit-identical, and nothing written for a padding slot or a mid-page slot. That
    kernel is not the bulk build's (a different Jacobi schedule, measured on the H200
    2026-12-02: not bit-identical), so against the bulk build they agree as fits do."""
    k, _, bt, sl, _ = paged()
    nb, H, d = k.shape[0], 2, 128
    kd, btd = k.to(DEV), bt.to(DEV)
    lens = (sl // P) * P  # every sequence has just filled its last page
    last = torch.stack([bt[b, int(lens[b]) // P - 1] for b in range(bt.shape[0])]).to(torch.int32)
    bulk = ops.new_summaries(nb, H, d, P, 8, DEV, precision)
    ops.summary_build(kd, last.to(DEV), bulk)
    by_lens = ops.new_summaries(nb, H, d, P, 8, DEV, precision)
    ops.summary_update(kd, btd, lens.to(DEV), by_lens)
    by_slots = ops.new_summaries(nb, H, d, P, 8, DEV, precision)
    slots = (last.long() * P + P - 1).to(torch.int32)
    slots = torch.cat([slots, torch.tensor([-1, 5], dtype=torch.int32)])  # padding, a mid-page slot
    ops.summary_update(kd, btd, lens.to(DEV), by_slots, slot_mapping=slots.to(DEV))
    for a, b in zip(by_lens, by_slots):
        assert torch.equal(a, b)
    others = torch.tensor(sorted(set(range(nb)) - set(last.tolist())))
    for a in by_lens:  # pages that did not fill stay as allocated (zeros)
        assert not a[others.to(DEV)].any()
    assert_same_fit(k, last, bulk, by_lens, precision)


@pytest.mark.parametrize("d,H,Hq,dtype", SHAPES)
@pytest.mark.parametrize("precision", ["fp32", "int4"])
@pytest.mark.parametrize("budget", [16, 128, 512, 1 << 20])
def test_cuda_select_matches_cpu_up_to_near_ties(d, H, Hq, dtype, precision, budget):
    k, _, bt, sl, q = paged(H=H, Hq=Hq, d=d, dtype=dtype)
    nb, mb = k.shape[0], bt.shape[1]
    s = ops.new_summaries(nb, H, d, P, 8, precision=precision)
    ops.summary_build(k, full_blocks(bt, sl), s)  # the same summaries on both backends
    sg = [t.to(DEV) for t in s]
    wc = wrapper("cpu", 4, Hq, H, d, nb, mb, budget, precision, dtype)
    wg = wrapper(DEV, 4, Hq, H, d, nb, mb, budget, precision, dtype)
    assert wc.capacity == wg.capacity
    pc, cc = wc.select(q, s, bt, sl)
    pg, cg = wg.select(q.to(DEV), sg, bt.to(DEV), sl.to(DEV))
    shares, A = group_shares(q, as_float_summaries(s), bt, sl, d ** -0.5)
    assert_selections_agree(pc, cc, pg, cg, shares, A, u_score=UNIT[torch.bfloat16])


def test_cuda_select_runs_the_plans_one_launch_selection():
    """select() aggregates and selects as the plan chose: in one cluster launch on a small grid
    (the plan's select_cluster), in separate launches under the adaptive budget (tau > 0). The
    operator once ran the separate kernels whatever the plan said (vLLM's kernel profile showed
    the two selection stages at batch 1); the results are the same bits either way, so only the
    kernels launched tell."""
    k, _, bt, sl, q = paged()
    nb, mb = k.shape[0], bt.shape[1]
    s = ops.new_summaries(nb, 2, 128, P, 8, DEV, "int4")
    ops.summary_build(k.to(DEV), full_blocks(bt, sl).to(DEV), s)
    args = (q.to(DEV), s, bt.to(DEV), sl.to(DEV))

    def kernels(**kw):
        w = wrapper(DEV, 4, 8, 2, 128, nb, mb, 128, **kw)
        w.select(*args)
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            w.select(*args)
            torch.cuda.synchronize()
        return " ".join(e.key for e in prof.key_averages())

    one = kernels()
    assert "aggregate_select_cluster" in one and "select_stage1" not in one, one
    separate = kernels(tau=0.9)
    assert "aggregate_select_cluster" not in separate and "aggregate_kernel" in separate, separate


@pytest.mark.parametrize("precision", ["fp32", "int4"])
def test_cuda_dense_below_matches_cpu(precision):
    """The minimum context (dense_below) through the CUDA plan: sequences shorter than the
    longest keep every page, the longest selects under budget 128, as on the CPU."""
    k, _, bt, sl, q = paged()
    nb, mb, H, d, Hq = k.shape[0], bt.shape[1], 2, 128, q.shape[1]
    s = ops.new_summaries(nb, H, d, P, 8, precision=precision)
    ops.summary_build(k, full_blocks(bt, sl), s)
    sg = [t.to(DEV) for t in s]
    longest = int(sl.max())
    assert int(sl.min()) < longest and longest > 128
    wc = wrapper("cpu", 4, Hq, H, d, nb, mb, 128, precision, dense_below=longest)
    wg = wrapper(DEV, 4, Hq, H, d, nb, mb, 128, precision, dense_below=longest)
    assert wc.capacity == wg.capacity == ops.select_capacity(128, P, mb, dense_below=longest)
    pc, cc = wc.select(q, s, bt, sl)
    pg, cg = wg.select(q.to(DEV), sg, bt.to(DEV), sl.to(DEV))
    for b in range(sl.shape[0]):
        n = -(-int(sl[b]) // P)
        if int(sl[b]) < longest:  # exact: every page, in order, on both backends
            assert cg[b].tolist() == cc[b].tolist() == [n] * H
            assert pg[b, :, :n].cpu().tolist() == [list(range(n))] * H
    shares, A = group_shares(q, as_float_summaries(s), bt, sl, d ** -0.5)
    assert_selections_agree(pc, cc, pg, cg, shares, A, u_score=UNIT[torch.bfloat16])


@pytest.mark.parametrize("d,H,Hq", [(128, 2, 16), (256, 1, 4)])
@pytest.mark.parametrize("precision", ["fp32", "int4"])
def test_cuda_query_weighted_matches_cpu(d, H, Hq, precision):
    """Query-weighted summaries (summary.h): the CUDA build fits the weighted deviations as the
    CPU does, and CUDA selection on them agrees with the CPU's up to near ties (d 256: Gemma-3's
    global layers, where the drop-in turns them on)."""
    k, _, bt, sl, q = paged(H=H, Hq=Hq, d=d)
    nb, mb = k.shape[0], bt.shape[1]
    w = torch.exp(torch.randn(H, d, generator=torch.Generator().manual_seed(9)) * 1.2)
    blocks = full_blocks(bt, sl)
    s = ops.new_summaries(nb, H, d, P, 8, precision=precision)
    ops.summary_build(k, blocks, ops.with_qweight(s, w))
    sd = ops.new_summaries(nb, H, d, P, 8, precision=precision, device=DEV)
    ops.summary_build(k.to(DEV), blocks.to(DEV), ops.with_qweight(sd, w.to(DEV)))
    # the fits compared in the weighted metric: both sides' keys and centroids times w
    scaled = lambda x: [x[0] * w, x[1], x[2]]  # noqa: E731
    fa = scaled(as_float_summaries(s))
    fb = scaled(as_float_summaries(sd))
    kk = k.double() * w.double()
    assert_same_fit(kk, blocks, fa, fb, precision, as_float=True)
    wc = wrapper("cpu", 4, Hq, H, d, nb, mb, 512, precision)
    wg = wrapper(DEV, 4, Hq, H, d, nb, mb, 512, precision)
    pc, cc = wc.select(q, ops.with_qweight(s, w), bt, sl)
    sg = [t.to(DEV) for t in s]
    pg, cg = wg.select(q.to(DEV), ops.with_qweight(sg, w.to(DEV)), bt.to(DEV), sl.to(DEV))
    shares, A = group_shares(q, as_float_summaries(s), bt, sl, d ** -0.5, qweight=w)
    assert_selections_agree(pc, cc, pg, cg, shares, A, u_score=UNIT[torch.bfloat16])


@pytest.mark.parametrize("d,H,Hq,dtype", SHAPES)
@pytest.mark.parametrize("budget", [128, 512, None])
def test_cuda_attention_within_derived_bounds(d, H, Hq, dtype, budget):
    k, v, bt, sl, q = paged(H=H, Hq=Hq, d=d, dtype=dtype)
    nb, mb = k.shape[0], bt.shape[1]
    s = ops.new_summaries(nb, H, d, P, 8, precision="int4")
    ops.summary_build(k, full_blocks(bt, sl), s)
    wc = wrapper("cpu", 4, Hq, H, d, nb, mb, budget or mb * P, "int4", dtype)
    wg = wrapper(DEV, 4, Hq, H, d, nb, mb, budget or mb * P, "int4", dtype)
    args = lambda dev: [t.to(dev) for t in (q, k, v)] + [[t.to(dev) for t in s]] + [bt.to(dev), sl.to(dev)]  # noqa: E731
    scale = d ** -0.5
    if budget is None:
        og, lg = wg.run(*args(DEV), dense=True)
        ref = ref_attention(q, k, v, bt, sl, scale)
    else:
        pages, counts = wc.select(q, s, bt, sl)  # the CPU's selection, attended on both
        og, lg = wg.attend(*[t.to(DEV) for t in (q, k, v, bt, sl)], pages=pages.to(DEV), counts=counts.to(DEV))
        ref = ref_attention(q, k, v, bt, sl, scale, pages, counts)
    assert_attention_close(og, lg, ref, dtype)


def _strided(x, layout):
    """x [N, P, H, d] on DEV with a block stride: "v1" = kv[:, 0] of an [N, 2, P, H, d] cache
    (vLLM's V1 model runner: block stride 2 P H d; the other half NaN), "padded" = blocks
    P H d + 64 elements apart (NaN between them)."""
    N, e = x.shape[0], x[0].numel()
    if layout == "v1":
        kv = torch.full((N, 2, *x.shape[1:]), float("nan"), dtype=x.dtype, device=DEV)
        kv[:, 0] = x
        return kv[:, 0]
    buf = torch.full((N * (e + 64),), float("nan"), dtype=x.dtype, device=DEV)
    view = buf.as_strided(x.shape, (e + 64, *x.stride()[1:]))
    view.copy_(x)
    return view


@pytest.mark.parametrize("layout", ["v1", "padded"])
@pytest.mark.parametrize("d,H,Hq,dtype", SHAPES + [(256, 1, 4, torch.bfloat16)])
def test_cuda_strided_cache_gives_the_dense_results_bit_for_bit(d, H, Hq, dtype, layout):
    """A K/V cache with a block stride (KvCacheView::block_stride; issue #10: vLLM's V1 model
    runner interleaves K and V per block) gives the dense cache's results bit for bit: bulk
    and filled summary builds (both rules), selection on those summaries, the sparse step and
    dense attention."""
    k, v, bt, sl, q = [t.to(DEV) for t in paged(H=H, Hq=Hq, d=d, dtype=dtype)]
    nb, mb = k.shape[0], bt.shape[1]
    ks, vs = _strided(k, layout), _strided(v, layout)
    assert not ks.is_contiguous() and torch.equal(ks, k) and ks.stride(0) != k.stride(0)
    full = full_blocks(bt.cpu(), sl.cpu()).to(DEV)
    lens = (sl // P) * P
    slots = torch.cat([(full.long() * P + P - 1).to(torch.int32),
                       torch.tensor([-1, 5], dtype=torch.int32, device=DEV)])
    res = []
    for kk, vv in ((k, v), (ks, vs)):
        s = ops.new_summaries(nb, H, d, P, 8, DEV, "int4")
        ops.summary_build(kk, full, s)
        by_lens = ops.new_summaries(nb, H, d, P, 8, DEV, "int4")
        ops.summary_update(kk, bt, lens, by_lens)
        by_slots = ops.new_summaries(nb, H, d, P, 8, DEV, "int4")
        ops.summary_update(kk, bt, lens, by_slots, slot_mapping=slots)
        w = wrapper(DEV, 4, Hq, H, d, nb, mb, 512, "int4", dtype)
        o, l = w.run(q, kk, vv, s, bt, sl)
        od, ld = w.run(q, kk, vv, s, bt, sl, dense=True)
        torch.cuda.synchronize()
        res.append([*s, *by_lens, *by_slots, o.clone(), l.clone(), od.clone(), ld.clone()])
    assert not any(torch.isnan(t).any() for t in res[0] if t.is_floating_point())
    for a, b in zip(*res):
        assert torch.equal(a, b)


@pytest.mark.parametrize("d,H,Hq,dtype", SHAPES + [(256, 1, 4, torch.bfloat16)])
def test_cuda_model_dtype_query_view_and_output_are_the_fp32_path_rounded(d, H, Hq, dtype):
    """vLLM's query (the model dtype, a strided view of the fused QKV output) and its output
    buffer, read and written by the kernels directly: the selection equals the fp32 path's on
    the rounded query and each output value is the fp32 result rounded once (graph replay
    included)."""
    k, v, bt, sl, q = [t.to(DEV) for t in paged(H=H, Hq=Hq, d=d, dtype=dtype)]
    nb, mb, B = k.shape[0], bt.shape[1], q.shape[0]
    full = full_blocks(bt.cpu(), sl.cpu()).to(DEV)
    s = ops.new_summaries(nb, H, d, P, 8, DEV, "int4")
    ops.summary_build(k, full, s)
    qkv = torch.full((B, (Hq + 2 * H) * d), float("nan"), dtype=dtype, device=DEV)
    qkv[:, : Hq * d] = q.reshape(B, -1).to(dtype)
    qm = qkv[:, : Hq * d].view(B, Hq, d)
    q32 = qm.float().contiguous()
    w = wrapper(DEV, B, Hq, H, d, nb, mb, 512, "int4", dtype)
    p32, c32 = w.select(q32, s, bt, sl)
    p16, c16 = w.select(qm, s, bt, sl)
    assert torch.equal(p32, p16) and torch.equal(c32, c16)
    for dense in (False, True):
        o32, l32 = w.run(q32, k, v, s, bt, sl, dense=dense)
        out = torch.empty(B, Hq, d, dtype=dtype, device=DEV)
        w.run(qm, k, v, s, bt, sl, out=out, dense=dense)
        torch.cuda.synchronize()
        assert not torch.isnan(o32).any()
        assert torch.equal(out, o32.to(dtype)), f"dense={dense}"
    g = torch.cuda.CUDAGraph()
    out = torch.empty(B, Hq, d, dtype=dtype, device=DEV)
    lse = torch.empty(B, Hq, device=DEV)
    with torch.cuda.graph(g):
        w.run(qm, k, v, s, bt, sl, out=out, lse=lse)
    qkv[:, : Hq * d] = (q.reshape(B, -1) * 0.5).to(dtype)
    g.replay()
    o32, _ = w.run(qm.float().contiguous(), k, v, s, bt, sl)
    torch.cuda.synchronize()
    assert torch.equal(out, o32.to(dtype))


def _opcheck_cases():
    k, v, bt, sl, q = [t.to(DEV) for t in paged(B=2, lens=(70, 33), d=128)]
    H, d = 2, 128
    nb, mb = k.shape[0], bt.shape[1]
    cases = {}
    for precision in ("fp32", "int4"):
        s = ops.new_summaries(nb, H, d, P, 8, DEV, precision)
        ids = torch.arange(nb, dtype=torch.int32, device=DEV)
        ops.summary_build(k, ids, s)
        w = wrapper(DEV, 2, 8, H, d, nb, mb, 48, precision)
        pages, counts = w.select(q, s, bt, sl)
        out, lse = torch.empty_like(q), torch.empty(2, 8, device=DEV)
        s2 = list(ops.new_summaries(nb, H, d, P, 8, DEV, precision))
        L = torch.ops.locks
        slots = torch.tensor([15, -1, 33], dtype=torch.int32, device=DEV)
        cases.update({
            f"summary_build_{precision}": (L.summary_build.default, (k, ids, s2)),
            f"summary_update_lens_{precision}": (L.summary_update.default, (k, bt, torch.tensor([64, 33], dtype=torch.int32, device=DEV), None, s2)),
            f"summary_update_slots_{precision}": (L.summary_update.default, (k, bt, sl, slots, s2)),
            f"select_pages_{precision}": (L.select_pages.default, (w.workspace, w.plan_vector, q, list(s), bt, sl, pages.clone(), counts.clone())),
            f"decode_attention_sparse_{precision}": (L.decode_attention.default, (w.workspace, w.plan_vector, q, k, v, bt, sl, pages, counts, out, lse)),
            f"decode_attention_dense_{precision}": (L.decode_attention.default, (w.workspace, w.plan_vector, q, k, v, bt, sl, None, None, out.clone(), lse.clone())),
        })
    return cases


OPCHECK = ["summary_build", "summary_update_lens", "summary_update_slots", "select_pages",
           "decode_attention_sparse", "decode_attention_dense"]


@pytest.mark.parametrize("precision", ["fp32", "int4"])
@pytest.mark.parametrize("name", OPCHECK)
def test_cuda_opcheck(name, precision):
    op, args = _opcheck_cases()[f"{name}_{precision}"]
    torch.library.opcheck(op, args)


@needs_cuda
def test_cuda_supports_agrees_with_plan():
    for d in (32, 64, 96, 128, 256):
        for group in (1, 4, 8, 16, 32):
            ok, why = locks.supports("cuda", head_dim=d, group=group)
            try:
                wrapper(DEV, 2, 2 * group, 2, d, 64, 16, 128)
                planned = True
            except NotImplementedError as e:
                planned = False
                assert why and why in str(e)
            assert planned == ok, (d, group, why)


@needs_cuda
@pytest.mark.parametrize("d,H,Hq,dtype", SHAPES)
def test_cache_write_equals_the_write_then_summary_update_and_replays(d, H, Hq, dtype):
    """The CUDA cache_write against vLLM's two steps (the K/V scatter, then summary_update over
    the slots): the same cache bytes and the same summary bits, with a whole page written in
    one call (its build reads the call's rows), a slot named twice (the later row stays),
    padding and a slot past the cache (skipped); rows as views into a fused QKV output. Then
    captured in a CUDA graph: replays on new rows equal eager calls."""
    k, v, bt, lens, _ = paged(B=2, lens=(300, 200), H=H, Hq=Hq, d=d, dtype=dtype)
    nb = k.shape[0]
    slots = [3 * P + P - 1, -1, 5 * P + 2] + [7 * P + j for j in range(P)] + [-1, 5 * P + 2, nb * P + 5]
    n = len(slots)
    slot_t = torch.tensor(slots, dtype=torch.int32, device=DEV)

    def rows(seed):
        qkv = torch.randn(n, (Hq + 2 * H) * d, generator=torch.Generator().manual_seed(seed))
        qkv = qkv.to(dtype).to(DEV)
        return qkv[:, Hq * d:(Hq + H) * d].view(n, H, d), qkv[:, (Hq + H) * d:].view(n, H, d)

    def fused(kc, vc, key, value):
        s = ops.new_summaries(nb, H, d, P, 8, DEV, "int4")
        ops.cache_write(key, value, kc, vc, slot_t, s)
        return s

    def two_steps(kc, vc, key, value):
        for i, s in enumerate(slots):
            if 0 <= s < nb * P:
                kc[s // P, s % P], vc[s // P, s % P] = key[i], value[i]
        s = ops.new_summaries(nb, H, d, P, 8, DEV, "int4")
        ops.summary_update(kc, bt.to(DEV), lens.to(DEV), s, slot_mapping=slot_t)
        return s

    key, value = rows(1)
    ka, va, kb, vb = (x.to(DEV) for x in (k, v, k, v))
    sa, sb = fused(ka, va, key, value), two_steps(kb, vb, key, value)
    torch.cuda.synchronize()
    assert torch.equal(ka, kb) and torch.equal(va, vb)
    for a, b in zip(sa, sb):
        assert torch.equal(a, b)
    assert sa[0][3].any() and sa[0][7].any() and not sa[0][5].any()

    # A captured call replayed on new rows == the eager call on the same cache.
    kg, vg = ka.clone(), va.clone()
    sk, sv = (torch.empty_like(x) for x in rows(2))
    sg = ops.new_summaries(nb, H, d, P, 8, DEV, "int4")
    sk.copy_(rows(2)[0]), sv.copy_(rows(2)[1])
    ops.cache_write(sk, sv, kg, vg, slot_t, sg)  # warm-up outside the capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        ops.cache_write(sk, sv, kg, vg, slot_t, sg)
    for seed in (3, 4):
        key, value = rows(seed)
        sk.copy_(key), sv.copy_(value)
        g.replay()
        se = fused(ka, va, key, value)
        torch.cuda.synchronize()
        assert torch.equal(kg, ka) and torch.equal(vg, va)
        for a, b in zip(sg, se):
            assert torch.equal(a, b)
