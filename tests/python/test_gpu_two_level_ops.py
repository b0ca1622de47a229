"""The two-level CUDA operators (locks.two_level) against the CPU ones and the float64
attention, within the derived bounds of gpu_util.py. Run on the GPU machine:
scripts/gpu_tests.sh python-ops. (Written 2026-12-04 when no GPU was lent: not yet run.)"""
import math

import pytest
import torch

from locks import ops, two_level

from gpu_util import DEV, assert_attention_close, paged, ref_attention
from test_two_level_ops import basis, complete_groups

pytestmark = pytest.mark.gpu
P, S, R = 16, 8, 8


def setup(device, lens=(16 * S * 24 + 9, 16 * S * 20, 300), H=2, Hq=8, d=128):
    k, v, bt, sl, q = paged(B=len(lens), lens=lens, H=H, Hq=Hq, d=d)
    nb = k.shape[0]
    s = ops.new_summaries(nb, H, d, P, 8, precision="int4", device=device)
    kd = k.to(device)
    ops.summary_build(kd, torch.arange(nb, dtype=torch.int32, device=device), s)
    table, gb, gs = complete_groups(bt, lens, S)
    sup = two_level.new_supers(len(gs), H, d, S, R, device=device)
    two_level.super_build(kd, gb.to(device), gs.to(device), sup)
    return k, v, bt, sl, q, s, sup, table, gb, gs


def captured(keys, W):
    """Variance of the keys captured by the span of W's rows (float64)."""
    D = keys - keys.mean(0)
    C = D.T @ D / keys.shape[0]
    Q, _ = torch.linalg.qr(W.T)
    return float(torch.trace(Q.T @ C @ Q))


@pytest.mark.skipif(DEV != "cuda", reason="CUDA operators")
def test_super_build_matches_the_cpu_build():
    """The CUDA build against the CPU one on the same keys: centroids within 1.5 code steps;
    the basis captures as much of the group's variance (within 3%: these keys' group spectra
    have near-ties, where the two builds may pick different but equally good directions)."""
    k, v, bt, sl, q, s, sup, table, gb, gs = setup("cuda")
    cpu = two_level.new_supers(len(gs), 2, 128, S, R)
    two_level.super_build(k, gb, gs, cpu)
    for slot in (0, 7, len(gs) - 1):
        for h in range(2):
            step = 1.5 * max(float(sup.mu_scale[slot, h]), float(cpu.mu_scale[slot, h]))
            mg = sup.mu_q[slot, h].double().cpu() * float(sup.mu_scale[slot, h])
            mc = cpu.mu_q[slot, h].double() * float(cpu.mu_scale[slot, h])
            assert (mg - mc).abs().max() <= step + 1e-7
            keys = k[gb[slot].long(), :, h].reshape(-1, 128).double()
            assert captured(keys, basis(sup, slot, h)) >= 0.97 * captured(keys, basis(cpu, slot, h))


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
