"""The two-level CUDA operators (locks.two_level) against the CPU ones and the float64
attention, within the derived bounds of gpu_util.py. Run on the GPU machine:
scripts/gpu_tests.sh python-ops. (Written 2026-12-04 when no GPU was lent: not yet run.)"""
import math

import pytest
import torch

from locks import ops, two_level

from gpu_util import DEV, assert_attention_close, paged, ref_attention

pytestmark = pytest.mark.gpu
P, S, R = 16, 8, 8


def setup(device, lens=(16 * S * 24 + 9, 16 * S * 20, 300), H=2, Hq=8, d=128):
    k, v, bt, sl, q = paged(B=len(lens), lens=lens, H=H, Hq=Hq, d=d)
    nb = k.shape[0]
    s = ops.new_summaries(nb, H, d, P, 8, precision="int4", device=device)
    kd = k.to(device)
    ops.summary_build(kd, torch.arange(nb, dtype=torch.int32, device=device), s)
    max_groups = -(-bt.shape[1] // S)
    table = torch.zeros(len(lens), max_groups, dtype=torch.int32)
    blocks, slots = [], []
    for b, n in enumerate(lens):
        for j in range(n // P // S):
            table[b, j] = len(slots)
            slots.append(len(slots))
            blocks.append(bt[b, j * S:(j + 1) * S])
    gb = torch.stack(blocks).contiguous()
    gs = torch.tensor(slots, dtype=torch.int32)
    sup = two_level.new_supers(len(slots), H, d, S, R, device=device)
    two_level.super_build(kd, gb.to(device), gs.to(device), sup)
    return k, v, bt, sl, q, s, sup, table, gb, gs


def estimates(sup, q_head, slot, h, scale):
    """float64 extent estimate of every page of (slot, h) (super_summary.h, gamma 0)."""
    def deq(t, sc):
        return t.double().cpu() * sc.double().cpu()
    d = sup.mu_q.shape[2]
    mu = deq(sup.mu_q[slot, h], sup.mu_scale[slot, h])
    codes = sup.basis_q[slot, h].cpu().to(torch.int16)
    W = torch.stack([((codes & 0xF) ^ 8) - 8, ((codes >> 4) ^ 8) - 8], -1).reshape(R, d).double()
    W = W * sup.basis_scale[slot, h, :, None].double().cpu()
    lo = deq(sup.lo_q[slot, h], sup.extent_scale[slot, h])
    hi = deq(sup.hi_q[slot, h], sup.extent_scale[slot, h])
    w = W @ q_head.double()
    box = torch.maximum(w * hi, w * lo).sum(-1)
    return math.log(P) + scale * (float(q_head.double() @ mu) + box)


@pytest.mark.skipif(DEV != "cuda", reason="CUDA operators")
def test_super_build_matches_the_cpu_estimates():
    k, v, bt, sl, q, s, sup, table, gb, gs = setup("cuda")
    cpu = two_level.new_supers(len(gs), 2, 128, S, R)
    two_level.super_build(k, gb, gs, cpu)
    scale = 1 / math.sqrt(128)
    for slot in (0, 7, len(gs) - 1):
        for h in range(2):
            for qi in range(4):
                qh = q[0, qi]
                eg = estimates(sup, qh, slot, h, scale)
                ec = estimates(cpu, qh, slot, h, scale)
                # Both builds are within 1.5 code steps of each other (tests/cuda/
                # test_super_build.cpp) where the spectrum has gaps; these keys have them.
                assert torch.allclose(eg, ec, atol=0.05 * (1 + float(ec.abs().max())))


@pytest.mark.skipif(DEV != "cuda", reason="CUDA operators")
def test_super_update_matches_super_build_on_the_device():
    k, v, bt, sl, q, s, sup, table, gb, gs = setup("cuda")
    fresh = two_level.new_supers(len(gs), 2, 128, S, R, device="cuda")
    two_level.super_update(k.cuda(), bt.cuda(), sl.cuda(), table.cuda(), fresh)
    done = int(table[1, 19])  # sequence 1 ends on the edge of its group 19
    for a, b in zip(fresh, sup):
        assert torch.equal(a[done], b[done])
        assert not torch.cat([a[:done].flatten(), a[done + 1:].flatten()]).any()


@pytest.mark.parametrize("budget", [512, 10**6])
def test_decode_two_level_attends_its_selection(budget):
    k, v, bt, sl, q, s, sup, table, gb, gs = setup(DEV)
    dv = lambda t: t.to(DEV)  # noqa: E731
    out, lse, pages, counts = two_level.two_level_decode(
        dv(q), dv(k), dv(v), s, sup, dv(table), dv(bt), dv(sl), budget_tokens=budget,
        sink_pages=1, recent_pages=2, return_selection=True)
    scale = 1 / math.sqrt(q.shape[2])
    if budget >= int(sl.max()):
        ref = ref_attention(q, k, v, bt, sl, scale)
    else:
        ref = ref_attention(q, k, v, bt, sl, scale, pages.cpu(), counts.cpu())
        assert (counts.cpu() <= budget // P).all()
    assert_attention_close(out, lse, ref, k.dtype)
