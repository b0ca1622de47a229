"""The two-level torch operators (locks.two_level; CPU): super summaries against float64
torch statistics, super_update against super_build, decode_two_level against the float64
attention over its own selection (and over every token when the budget covers the context),
opcheck, and the refusals."""
import math

import pytest
import torch

import locks

from locks import ops, two_level
from test_ops import D, H, P, batch, make_cache, ref_attention

S, R = 4, 8  # pages a group, group rank
LENS = [16 * S * 20 + 7, 16 * S * 12]  # 20 and 12 complete groups; the second ends on an edge


def setup(lens=LENS, seed=0):
    mb = max(-(-n // P) for n in lens)
    nb = len(lens) * mb + 3
    k, v = make_cache(nb, seed=seed)
    bt, sl = batch(nb, lens, mb)
    s = ops.new_summaries(nb, H, D, P, 8, precision="int4")
    ops.summary_build(k, torch.arange(nb, dtype=torch.int32), s)
    table, gb, gs = complete_groups(bt, lens, S)
    sup = two_level.new_supers(len(gs), H, D, S, R)
    two_level.super_build(k, gb, gs, sup)
    return k, v, bt, sl, s, sup, table, gb, gs


def complete_groups(bt, lens, group_pages):
    """Every complete group of every sequence in slots 0, 1, ...: the super table [B, groups]
    (0 where no group), the groups' blocks [n, S] and their slots [n] (CPU int32 tensors)."""
    table = torch.zeros(len(lens), -(-bt.shape[1] // group_pages), dtype=torch.int32)
    blocks, slots = [], []
    for b, n in enumerate(lens):
        for j in range(n // P // group_pages):
            table[b, j] = len(slots)
            slots.append(len(slots))
            blocks.append(bt[b, j * group_pages:(j + 1) * group_pages])
    return table, torch.stack(blocks).contiguous(), torch.tensor(slots, dtype=torch.int32)


def basis(sup, slot, h):
    """The dequantized int4 basis rows [R, d] of (slot, h), float64 on the CPU."""
    codes = sup.basis_q[slot, h].cpu().to(torch.int16)
    lo, hi = ((codes & 0xF) ^ 8) - 8, ((codes >> 4) ^ 8) - 8
    W = torch.stack([lo, hi], -1).reshape(codes.shape[0], -1).double()
    return W * sup.basis_scale[slot, h, :, None].double().cpu()


def group_keys(k, blocks, h):
    return k[blocks.long(), :, h].reshape(-1, D).double()  # [S * P, d]


def test_super_build_centroid_and_basis():
    k, v, bt, sl, s, sup, table, gb, gs = setup()
    for slot in (0, 13, len(gs) - 1):
        for h in range(H):
            keys = group_keys(k, gb[slot], h)
            mean = keys.mean(0)
            mu = sup.mu_q[slot, h].double() * float(sup.mu_scale[slot, h])
            assert torch.allclose(mu, mean, atol=0.5 * float(sup.mu_scale[slot, h]) + 1e-6)
            # The int4 basis rows span (nearly) the top-R principal subspace.
            Q, _ = torch.linalg.qr(basis(sup, slot, h).T)
            C = (keys - mean).T @ (keys - mean) / keys.shape[0]
            best = torch.linalg.eigvalsh(C)[-R:].sum()
            assert float(torch.trace(Q.T @ C @ Q)) >= 0.9 * float(best)


def test_super_update_builds_what_super_build_builds():
    k, v, bt, sl, s, sup, table, gb, gs = setup()
    fresh = two_level.new_supers(len(gs), H, D, S, R)
    two_level.super_update(k, bt, sl, table, fresh)
    done = int(table[1, 11])  # sequence 1 ends on the edge of its group 11; sequence 0 does not
    for a, b in zip(fresh, sup):
        assert torch.equal(a[done], b[done])
        others = torch.cat([a[:done].flatten(), a[done + 1:].flatten()])
        assert not others.any()


def test_full_budget_is_dense():
    k, v, bt, sl, s, sup, table, gb, gs = setup()
    q = torch.randn(len(LENS), 3 * H, D)
    out, lse = two_level.two_level_decode(q, k, v, s, sup, table, bt, sl, budget_tokens=max(LENS))
    ro, rl = ref_attention(q, k, v, bt, sl)
    assert torch.allclose(out.double(), ro, atol=1e-4, rtol=1e-4)
    assert torch.allclose(lse.double(), rl, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("sink, recent", [(0, 0), (1, 2)])
def test_selection_and_attention_over_it(sink, recent):
    k, v, bt, sl, s, sup, table, gb, gs = setup(seed=3)
    q = torch.randn(len(LENS), 3 * H, D) * 2
    budget = 128
    out, lse, pages, counts = two_level.two_level_decode(
        q, k, v, s, sup, table, bt, sl, budget_tokens=budget, sink_pages=sink, recent_pages=recent,
        alpha=2.0, min_groups=4, return_selection=True)  # few groups: engage level 1
    for b, n in enumerate(LENS):
        npages = -(-n // P)
        for h in range(H):
            c = int(counts[b, h])
            assert c == budget // P
            sel = pages[b, h, :c].tolist()
            assert sel == sorted(set(sel)) and 0 <= sel[0] and sel[-1] < npages
            if n % P:  # a partial tail page has no summary: always attended
                assert sel[-1] == npages - 1
            full = n // P
            assert all(p in sel for p in range(sink))
            assert all(p in sel for p in range(full - recent, full))
    ro, rl = ref_attention(q, k, v, bt, sl, pages, counts)
    assert torch.allclose(out.double(), ro, atol=1e-4, rtol=1e-4)
    assert torch.allclose(lse.double(), rl, atol=1e-4, rtol=1e-4)


def test_min_groups_keeps_more_groups_or_falls_back_to_flat():
    """min_groups is the floor of the kept groups (m = max(min_groups, ceil(alpha k / S))): a
    floor above the complete groups makes the step flat LOCKS (the plan's fallback), selecting
    what the flat selection selects, where a floor of 4 selects otherwise; the default floor
    (32) is above this test's complete groups, so it is flat too."""
    k, v, bt, sl, s, sup, table, gb, gs = setup(seed=3)
    q = torch.randn(len(LENS), 3 * H, D) * 2
    kw = dict(budget_tokens=128, alpha=2.0, return_selection=True)
    base = two_level.two_level_decode(q, k, v, s, sup, table, bt, sl, min_groups=4, **kw)
    default = two_level.two_level_decode(q, k, v, s, sup, table, bt, sl, **kw)
    flat_all = two_level.two_level_decode(q, k, v, s, sup, table, bt, sl, min_groups=10 ** 6, **kw)
    flat = locks.DecodeWrapper.allocate(num_q_heads=3 * H, num_kv_heads=H, head_dim=D, num_blocks=k.shape[0],
                                        max_batch=len(LENS), max_blocks_per_seq=bt.shape[1], budget_tokens=128)
    fp, fc = flat.select(q.float(), s, bt, sl)
    for b in range(len(LENS)):
        for h in range(H):
            assert torch.equal(flat_all[2][b, h, : int(flat_all[3][b, h])], fp[b, h, : int(fc[b, h])])
            assert torch.equal(default[2][b, h, : int(default[3][b, h])], fp[b, h, : int(fc[b, h])])
    # Two-level with a floor of 4 is really two-level here (another selection somewhere).
    assert any(not torch.equal(base[2][b, h, : int(base[3][b, h])], fp[b, h, : int(fc[b, h])])
               for b in range(len(LENS)) for h in range(H))


def test_flat_below_groups_makes_shorter_rows_flat():
    """flat_below_groups: a row with fewer complete groups scores every page (flat LOCKS inside
    the two-level step), a row with at least that many stays two-level. LENS has 20 and 12
    complete groups: 21 makes both rows flat, 13 the second only, 8 (the default) neither."""
    k, v, bt, sl, s, sup, table, gb, gs = setup(seed=3)
    q = torch.randn(len(LENS), 3 * H, D) * 2
    kw = dict(budget_tokens=128, alpha=2.0, min_groups=4, return_selection=True)
    flat = locks.DecodeWrapper.allocate(num_q_heads=3 * H, num_kv_heads=H, head_dim=D, num_blocks=k.shape[0],
                                        max_batch=len(LENS), max_blocks_per_seq=bt.shape[1], budget_tokens=128)
    fp, fc = flat.select(q.float(), s, bt, sl)

    def same_as_flat(res, b):
        return all(torch.equal(res[2][b, h, : int(res[3][b, h])], fp[b, h, : int(fc[b, h])]) for h in range(H))

    by = {fb: two_level.two_level_decode(q, k, v, s, sup, table, bt, sl, flat_below_groups=fb, **kw)
          for fb in (8, 13, 21)}
    assert [same_as_flat(by[21], b) for b in range(2)] == [True, True]
    assert same_as_flat(by[13], 1) and not same_as_flat(by[13], 0)
    assert not same_as_flat(by[8], 0) and not same_as_flat(by[8], 1)  # really two-level below
    # The row at or above the floor selects as with the default floor.
    assert torch.equal(by[13][2][0], by[8][2][0]) and torch.equal(by[13][3][0], by[8][3][0])
    ro, rl = ref_attention(q, k, v, bt, sl, by[13][2], by[13][3])
    assert torch.allclose(by[13][0].double(), ro, atol=1e-4, rtol=1e-4)
    with pytest.raises(ValueError, match="flat_below_groups"):
        _plan(flat_below_groups=-1)


def _plan(**kw):
    args = dict(num_q_heads=3 * H, num_kv_heads=H, head_dim=D, num_blocks=200, max_batch=2,
                max_blocks_per_seq=81, budget_tokens=128, group_pages=S, super_slots=32,
                super_rank=R, alpha=2.0, min_groups=4)
    args.update(kw)
    return ops.plan(**args)


def test_refusals():
    k, v, bt, sl, s, sup, table, gb, gs = setup()
    q = torch.randn(len(LENS), 3 * H, D)
    with pytest.raises(ValueError, match="super_slots"):
        _plan(super_slots=0)
    with pytest.raises(ValueError, match="alpha"):
        _plan(alpha=0.5)
    with pytest.raises(ValueError, match="min_groups"):
        _plan(min_groups=0)
    flat = ops.plan(num_q_heads=3 * H, num_kv_heads=H, head_dim=D, num_blocks=k.shape[0],
                    max_batch=2, max_blocks_per_seq=bt.shape[1], budget_tokens=128)
    ws = torch.empty(ops.plan_workspace_bytes(flat), dtype=torch.uint8)
    out, lse = torch.empty_like(q), torch.empty(2, 3 * H)
    with pytest.raises(ValueError, match="two-level"):
        torch.ops.locks.decode_two_level(ws, flat, q, k, v, list(s), list(sup), table, bt, sl, out, lse)
    with pytest.raises(ValueError, match="supers"):
        two_level.super_build(k, gb, gs, list(sup)[:10])
    with pytest.raises(ValueError, match="group_blocks"):
        two_level.super_build(k, gb[:, :2].contiguous(), gs, sup)
    with pytest.raises(ValueError, match="super_table"):
        two_level.super_update(k, bt, sl, table.float(), sup)
    bad = sl.clone()
    bad[0] = 10**6
    with pytest.raises(ValueError):
        two_level.super_update(k, bt, bad, table, sup)


def test_opcheck():
    k, v, bt, sl, s, sup, table, gb, gs = setup()
    torch.library.opcheck(torch.ops.locks.super_build.default, (k, gb, gs, list(sup)))
    q = torch.randn(len(LENS), 3 * H, D)
    vec = _plan(num_blocks=k.shape[0], max_blocks_per_seq=bt.shape[1], super_slots=len(gs),
                kv_dtype=k.dtype)
    ws = torch.empty(ops.plan_workspace_bytes(vec), dtype=torch.uint8)
    out, lse = torch.empty_like(q), torch.empty(2, 3 * H)
    torch.library.opcheck(torch.ops.locks.decode_two_level.default,
                          (ws, vec, q, k, v, list(s), list(sup), table, bt, sl, out, lse))
    assert math.isfinite(float(lse.sum()))


def test_wrapper_run_two_level_equals_the_one_shot_op():
    import locks

    k, v, bt, sl, s, sup, table, gb, gs = setup()
    q = torch.randn(len(LENS), 3 * H, D)
    w = locks.DecodeWrapper.allocate(num_q_heads=3 * H, num_kv_heads=H, head_dim=D,
                                     num_blocks=k.shape[0], max_batch=2,
                                     max_blocks_per_seq=bt.shape[1], kv_dtype=k.dtype,
                                     budget_tokens=128, group_pages=S, super_slots=len(gs),
                                     super_rank=R, alpha=2.0, min_groups=4)
    out, lse = w.run_two_level(q, k, v, s, sup, table, bt, sl)
    ro, rl = two_level.two_level_decode(q, k, v, s, sup, table, bt, sl, budget_tokens=128, alpha=2.0,
                                        min_groups=4)
    assert torch.equal(out, ro) and torch.equal(lse, rl)
    flat = locks.DecodeWrapper.allocate(num_q_heads=3 * H, num_kv_heads=H, head_dim=D,
                                        num_blocks=k.shape[0], max_batch=2,
                                        max_blocks_per_seq=bt.shape[1], kv_dtype=k.dtype)
    with pytest.raises(ValueError, match="group_pages"):
        flat.run_two_level(q, k, v, s, sup, table, bt, sl)


def test_plan_vector_with_an_edited_region_is_refused_and_writes_nothing():
    """A plan vector is the caller's list (plan.h): one whose first workspace region (the head
    scores, at offset 0) was shrunk is refused by the run's region check before any write,
    and the step leaves out, lse, pages and counts as they were (outputs whole or not at all)."""
    k, v, bt, sl, s, sup, table, gb, gs = setup()
    B = len(LENS)
    q = torch.randn(B, 3 * H, D)
    vec = _plan(num_blocks=k.shape[0], max_blocks_per_seq=bt.shape[1], super_slots=len(gs),
                kv_dtype=k.dtype)
    need = B * 3 * H * bt.shape[1] * 4  # head scores [B, Hq, M] float32
    at = [i for i in range(4, len(vec) - 1) if vec[i] == 0 and vec[i + 1] == need]
    assert at, "the head-score region (offset 0, its bytes) is in the vector"
    bad = list(vec)
    bad[at[0] + 1] = 256
    ws = torch.empty(ops.plan_workspace_bytes(vec), dtype=torch.uint8)
    out, lse = torch.full_like(q, -3.0), torch.full((B, 3 * H), -3.0)
    cap = vec[1]
    pages, counts = torch.full((B, H, cap), -7, dtype=torch.int32), torch.full((B, H), -7, dtype=torch.int32)
    with pytest.raises(ValueError, match="region"):
        torch.ops.locks.decode_two_level(ws, bad, q, k, v, list(s), list(sup), table, bt, sl, out, lse,
                                         pages, counts)
    assert (out == -3.0).all() and (lse == -3.0).all()
    assert (pages == -7).all() and (counts == -7).all()
    # The vector as planned runs and writes them all.
    torch.ops.locks.decode_two_level(ws, vec, q, k, v, list(s), list(sup), table, bt, sl, out, lse,
                                     pages, counts)
    assert torch.isfinite(lse).all() and (counts >= 1).all()
