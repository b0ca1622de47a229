"""The drop-in's baseline selectors (locks/selectors.py): the budget path against the rules
written out as a loop (docs/method.md), the oracle's scores against brute-force page masses,
Quest's bound against the true largest logit, and a whole generation with every selector."""
import math
import random

import pytest
import torch

from locks import selectors as sel

P = 16


def rules_loop(shares, lens, budget, sink, recent):
    """docs/method.md, "Selection under a budget", one (sequence, KV head) at a time."""
    B, H, J = shares.shape
    out = []
    for b in range(B):
        n = int(lens[b])
        npages, full = -(-n // P), n // P
        rows = []
        for h in range(H):
            if n <= budget:
                rows.append(list(range(npages)))
                continue
            chosen = {npages - 1} if n % P else set()
            chosen |= set(range(min(sink, full))) | set(range(max(0, full - recent), full))
            for j in sorted(range(full), key=lambda j: (-float(shares[b, h, j]), j)):
                if len(chosen) >= budget // P:
                    break
                chosen.add(j)
            rows.append(sorted(chosen))
        out.append(rows)
    return out


@pytest.mark.parametrize("seed", range(6))
def test_budget_path_follows_the_rules(seed):
    rng, g = random.Random(seed), torch.Generator().manual_seed(seed)
    B, H, J = 3, 2, 40
    lens = torch.tensor([rng.randint(1, J * P) for _ in range(B)], dtype=torch.int32)
    sink, recent = rng.randint(0, 2), rng.randint(0, 2)
    budget = rng.choice([(sink + recent + 1) * P, 64, 100, 257, 400, 1000])
    budget = max(budget, (sink + recent + 1) * P)
    shares = torch.rand(B, H, J, generator=g)
    shares[:, :, ::7] = shares[:, :, 3:4]  # ties: lower index first
    full = torch.arange(J)[None, :] < (lens.long() // P)[:, None]
    shares = shares.masked_fill(~full[:, None, :], float("-inf"))
    cap = min(-(-budget // P), J)
    pages, counts = sel.select_from_scores(shares, lens, page_size=P, budget=budget, capacity=cap,
                                           sink_pages=sink, recent_pages=recent)
    want = rules_loop(shares, lens, budget, sink, recent)
    for b in range(B):
        for h in range(H):
            c = int(counts[b, h])
            assert pages[b, h, :c].tolist() == want[b][h], (b, h)
            assert (pages[b, h, c:] == -1).all()


def paged(B=2, H=2, G=3, d=32, J=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    nb = B * J
    k = torch.randn(nb, P, H, d, generator=g)
    bt = torch.randperm(nb, generator=g).view(B, J).to(torch.int32)
    q = torch.randn(B, H * G, d, generator=g)
    return q, k, bt


def test_oracle_scores_are_the_exact_page_shares():
    q, k, bt = paged()
    B, Hq, d = q.shape
    H, G = k.shape[2], Hq // k.shape[2]
    lens = torch.tensor([150, 77], dtype=torch.int32)
    scale = 1 / math.sqrt(d)
    got = sel.oracle_scores(q, k, bt, lens, scale)
    for b in range(B):
        full = int(lens[b]) // P
        for h in range(H):
            keys = k[bt[b, :full].long(), :, h].double()  # [full, P, d]
            masses = []
            for gg in range(G):
                w = torch.softmax((keys.reshape(-1, d) @ q[b, h * G + gg].double()) * scale, 0)
                masses.append(w.view(full, P).sum(1))
            want = torch.stack(masses).mean(0)
            assert torch.allclose(got[b, h, :full].double(), want, atol=1e-5)
            assert torch.isinf(got[b, h, full:]).all()


def test_quest_bound_is_an_upper_bound_of_the_largest_logit():
    q, k, bt = paged(seed=1)
    B, Hq, d = q.shape
    H, G = k.shape[2], Hq // k.shape[2]
    bound = sel.quest_bounds(q, k, bt, 0.5)  # [B, H, G, J]
    kk = k[bt.long()]  # [B, J, P, H, d]
    logits = torch.einsum("bhgd,bjphd->bhgjp", q.view(B, H, G, d), kk) * 0.5
    assert (bound >= logits.amax(-1) - 1e-5).all()
    # tight when a page's keys are all equal
    k2 = k.clone()
    k2[:] = k2[:, :1]
    b2 = sel.quest_bounds(q, k2, bt, 0.5)
    l2 = torch.einsum("bhgd,bjphd->bhgjp", q.view(B, H, G, d), k2[bt.long()]) * 0.5
    assert torch.allclose(b2, l2.amax(-1), atol=1e-4)


@torch.inference_mode()
@pytest.mark.parametrize("selector", sel.SELECTORS)
def test_every_selector_generates_and_is_exact_when_the_budget_covers(tiny_llama, selector):
    from locks import hf

    ids = torch.randint(0, 256, (1, 300), generator=torch.Generator().manual_seed(1))
    want = tiny_llama.generate(ids, max_new_tokens=6, do_sample=False)
    try:
        hf.enable(tiny_llama, budget=1024, selector=selector, precision="fp32")
        assert torch.equal(tiny_llama.generate(ids, max_new_tokens=6, do_sample=False), want)
        hf.enable(tiny_llama, budget=64, selector=selector, precision="fp32")
        kw = hf.cache_kwarg(tiny_llama)
        cache = hf.LocksCache(tiny_llama.config, tiny_llama.locks_config)
        out = tiny_llama.generate(ids, max_new_tokens=6, do_sample=False, **{kw: cache})
        assert out.shape == want.shape
        counts = cache.layers[0].last_counts
        if selector == "fullkv":
            assert counts is None
        else:
            assert int(counts.max()) == 64 // 16  # budget 64 of 305 tokens: 4 pages
    finally:
        hf.disable(tiny_llama)
    with pytest.raises(ValueError, match="selector"):
        hf.enable(tiny_llama, budget=64, selector="shadow_kv")
