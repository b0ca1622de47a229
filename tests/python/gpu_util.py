"""Shared setup of the GPU tests (tests/python/test_gpu_*.py): a ragged paged batch with
page-local key structure, and the derived error bounds of tests/common/test_compare.h
restated in torch (float64), with the CUDA kernels' extra rounding:
  attention: q is rounded to the cache dtype for the tensor-core QK^T (u_query) and the
  softmax weights to the cache dtype for PV (u_weight): 2^-8 for bfloat16, 2^-11 for float16.
"""
from __future__ import annotations

import math
import os

import pytest
import torch

# The device under test: cuda, or cpu to check the tests' own logic without a GPU.
DEV = os.environ.get("LOCKS_GPU_TEST_DEVICE", "cuda")
needs_cuda = pytest.mark.skipif(DEV != "cuda", reason="CUDA graphs / CUDA-only behaviour")

EPS32 = 5.96e-8
UNIT = {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11, torch.float32: 0.0}


def paged(B=4, lens=(700, 1500, 2300, 4000), H=2, Hq=8, d=128, P=16, dtype=torch.bfloat16,
          seed=0, spare_blocks=4):
    """k, v [nb, P, H, d] in dtype, block_table [B, mb] (a random permutation of blocks),
    seq_lens [B], q [B, Hq, d] float32 (CPU tensors)."""
    g = torch.Generator().manual_seed(seed)
    mb = -(-max(lens) // P) + spare_blocks
    nb = B * mb
    basis = torch.randn(nb, H, 4, d, generator=g)
    coef = torch.randn(nb, P, H, 4, generator=g) * 2
    k = torch.einsum("bphr,bhrd->bphd", coef, basis) + 0.2 * torch.randn(nb, P, H, d, generator=g)
    v = torch.randn(nb, P, H, d, generator=g)
    bt = torch.randperm(nb, generator=g).to(torch.int32).view(B, mb).contiguous()
    sl = torch.tensor(lens, dtype=torch.int32)
    q = torch.randn(B, Hq, d, generator=g)
    return k.to(dtype).contiguous(), v.to(dtype).contiguous(), bt, sl, q


def full_blocks(bt, sl, P=16):
    return torch.cat([bt[b, : int(sl[b]) // P] for b in range(bt.shape[0])]).contiguous()


def ref_attention(q, k, v, bt, sl, scale, pages=None, counts=None):
    """float64 attention and the derived bound terms per (b, h): A (max |q.k| scale), n
    tokens, n pages, max |v| (test_compare.h's expect_attention_match)."""
    B, Hq, d = q.shape
    P, H = k.shape[1], k.shape[2]
    G = Hq // H
    out = torch.zeros(B, Hq, d, dtype=torch.float64)
    lse = torch.zeros(B, Hq, dtype=torch.float64)
    terms = torch.zeros(B, Hq, 4, dtype=torch.float64)
    for b in range(B):
        n = int(sl[b])
        kk = k[bt[b].long()].reshape(-1, H, d)[:n].double()
        vv = v[bt[b].long()].reshape(-1, H, d)[:n].double()
        for h in range(Hq):
            g = h // G
            idx = torch.arange(n)
            if pages is not None:
                chosen = pages[b, g, : counts[b, g]].long()
                idx = idx[torch.isin(idx // P, chosen)]
            qq = q[b, h].double()
            logits = kk[idx, g] @ qq * scale
            lse[b, h] = torch.logsumexp(logits, 0)
            out[b, h] = torch.softmax(logits, 0) @ vv[idx, g]
            A = float((kk[idx, g].abs() @ qq.abs()).max()) * scale
            terms[b, h] = torch.tensor([A, len(idx), len(torch.unique(idx // P)),
                                        float(vv[idx, g].abs().max())])
    return out, lse, terms


def assert_attention_close(out, lse, ref, kv_dtype):
    """|out - ref| <= vmax (4 u_q A + 2 u_w + 4 eps (d A + n + pages + 1)), and the lse bound."""
    ro, rl, t = ref
    d = ro.shape[-1]
    u = UNIT[kv_dtype]
    A, n, pages, vmax = t.unbind(-1)
    base = d * A + n + pages + 1
    tol_lse = 2 * u * A + 4 * EPS32 * (base + rl.abs())
    tol_out = vmax * (4 * u * A + 2 * u + 4 * EPS32 * base)
    err_lse = (lse.double().cpu() - rl).abs()
    err_out = (out.double().cpu() - ro).abs().amax(-1)
    assert (err_lse <= tol_lse).all(), f"lse error {float((err_lse / tol_lse).max()):.3g} x the bound"
    assert (err_out <= tol_out).all(), f"out error {float((err_out / tol_out).max()):.3g} x the bound"


def group_shares(q, summaries, bt, sl, scale, P=16, qweight=None):
    """float64 LOCKS page scores from the (fp32 or dequantized) summaries, share-averaged per
    GQA group: shares [B, H, mb] (0 for pages without a summary), and the per-page logit
    error budget A (test_compare.h's logit_magnitude). qweight [H, d]: query-weighted
    summaries (the basis multiplies q / w)."""
    mu, basis, coeff = [t.double().cpu() for t in summaries]
    qw = qweight.double().cpu() if qweight is not None else None
    B, Hq, d = q.shape
    H = mu.shape[1]
    G = Hq // H
    mb = bt.shape[1]
    shares = torch.zeros(B, H, mb, dtype=torch.float64)
    budget = torch.zeros(B, H, mb, dtype=torch.float64)
    for b in range(B):
        full = int(sl[b]) // P
        blk = bt[b, :full].long()
        for g in range(H):
            for h in range(g * G, (g + 1) * G):
                qq = q[b, h].double().cpu()
                qb = qq / qw[g] if qw is not None else qq  # what the basis multiplies
                w = basis[blk, g] @ qb  # [full, r]
                logits = scale * (mu[blk, g] @ qq)[:, None] + scale * (coeff[blk, g] @ w[:, :, None])[..., 0]
                s = torch.logsumexp(logits, 1)
                shares[b, g, :full] += torch.softmax(s, 0) / G
                A = scale * ((mu[blk, g].abs() @ qq.abs()) + (coeff[blk, g].abs() @ (basis[blk, g].abs() @ qb.abs())[:, :, None])[..., 0].amax(1))
                budget[b, g, :full] = torch.maximum(budget[b, g, :full], A)
    return shares, budget


def assert_selections_agree(pages_a, counts_a, pages_b, counts_b, shares, budget, u_score, P=16):
    """Two selections of the same summaries agree up to near-ties: same counts, and every page
    one takes and the other does not has a share within the derived tolerance of the other's
    smallest taken share (a logit error of u_score A + float terms moves a share by at most
    exp(2 err) - 1 relative)."""
    assert torch.equal(counts_a.cpu(), counts_b.cpu()), "counts differ"
    pa, pb = pages_a.cpu(), pages_b.cpu()
    B, H, _ = pa.shape
    for b in range(B):
        for g in range(H):
            n = int(counts_a[b, g])
            sa = set(pa[b, g, :n].tolist())
            sb = set(pb[b, g, :n].tolist())
            if sa == sb:
                continue
            err = float(budget[b, g].max()) * (u_score + 64 * EPS32) + 64 * EPS32
            rel = math.expm1(2 * err) + 1e-6
            for x, other in ((sa - sb, sb), (sb - sa, sa)):
                floor = min(float(shares[b, g, j]) for j in other if j < shares.shape[2])
                for j in x:
                    assert abs(float(shares[b, g, j]) - floor) <= rel * max(floor, float(shares[b, g, j])), \
                        f"seq {b} group {g}: page {j} (share {float(shares[b, g, j]):.3g}) vs {floor:.3g}"


def dequant(sq):
    """Python restatement of summary.h's int4 storage -> float (two's complement nibbles)."""
    mu_q, mu_scale, basis_q, basis_scale, coeff_q, coeff_scale = [t.cpu() for t in sq]
    d = mu_q.shape[-1]
    mu = mu_q.float() * mu_scale[..., None]
    lo = (basis_q & 0xF).to(torch.int16)
    hi = (basis_q >> 4).to(torch.int16)
    lo = torch.where(lo > 7, lo - 16, lo)
    hi = torch.where(hi > 7, hi - 16, hi)
    codes = torch.stack([lo, hi], dim=-1).reshape(*basis_q.shape[:-1], d).float()
    # basis_scale [N, H, r, d / g]: one scale per g dims of a row (summary.h's basis_group)
    basis = (codes.unflatten(-1, (basis_scale.shape[-1], -1)) * basis_scale[..., None]).flatten(-2)
    coeff = coeff_q.float() * coeff_scale[:, :, None, :]
    return mu, basis, coeff


def as_float_summaries(s):
    return dequant(s) if len(s) == 6 else tuple(t.cpu() for t in s)
