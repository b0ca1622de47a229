"""The torch reference of select-then-attend (what the plugin's decode computes)."""
import torch

from locks.vllm import reference as ref


def make_cache(num_blocks=40, P=16, H=2, d=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(num_blocks, P, H, d, generator=g)
    v = torch.randn(num_blocks, P, H, d, generator=g)
    return k, v


def summaries_for(k, rank=8, dtype=torch.float32):
    N, P, H, d = k.shape
    s = tuple(torch.zeros(*shape, dtype=dtype) for shape in ((N, H, d), (N, H, rank, d), (N, H, P, rank)))
    ref.build_summaries(k, torch.arange(N), s, rank)
    return s


def dense_softmax(q, k, v, block_table, seq_lens):
    """Independent dense reference: gather the sequence, one softmax per query head."""
    B, Hq, d = q.shape
    P, H = k.shape[1], k.shape[2]
    G = Hq // H
    out = torch.zeros(B, Hq, d, dtype=torch.float64)
    for b in range(B):
        n = int(seq_lens[b])
        blocks = block_table[b, : -(-n // P)].long()
        kk = k[blocks].reshape(-1, H, d)[:n].double()
        vv = v[blocks].reshape(-1, H, d)[:n].double()
        for h in range(Hq):
            w = torch.softmax(kk[:, h // G] @ q[b, h].double() / d ** 0.5, 0)
            out[b, h] = w @ vv[:, h // G]
    return out


def batch(seed=1):
    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(40, generator=g).to(torch.int32)
    block_table = torch.stack([perm[:12], perm[12:24], perm[24:36]])
    seq_lens = torch.tensor([185, 16, 97], dtype=torch.int32)  # ragged, one page-aligned
    q = torch.randn(3, 8, 64, generator=g)
    return q, block_table, seq_lens


def test_budget_at_least_context_equals_dense_softmax():
    k, v = make_cache()
    s = summaries_for(k)
    q, bt, sl = batch()
    out, _ = ref.decode(q, k, v, s, bt, sl, budget=192)
    assert torch.allclose(out, dense_softmax(q, k, v, bt, sl), atol=1e-12, rtol=0)


def test_small_budget_keeps_tail_and_finds_the_planted_page():
    k, v = make_cache()
    q, bt, sl = batch()
    # Plant: sequence 0, logical page 3, keys aligned with q of KV head 0 -> dominant mass.
    blk = int(bt[0, 3])
    k[blk, :, 0, :] = 8.0 * q[0, 0] / q[0, 0].norm()
    s = summaries_for(k)
    pages = ref.select(q, s, bt, sl, budget=64)  # 4 page slots
    assert pages[0][0][-1] == 11 and 3 in pages[0][0]       # tail page 11 (185 = 11*16 + 9)
    assert all(len(p) == 4 for p in pages[0])
    assert pages[1] == [[0], [0]]                              # 16 tokens <= budget: everything
    out, _ = ref.decode(q, k, v, s, bt, sl, budget=64)
    dense = dense_softmax(q, k, v, bt, sl)
    assert torch.allclose(out[1], dense[1], atol=1e-12)
    assert not torch.allclose(out[0], dense[0], atol=1e-6)    # it did drop pages
    # Head 0's attention is dominated by the planted page: the sparse output stays close.
    assert (out[0, 0] - dense[0, 0]).abs().max() < 0.05


def test_rank_p_minus_1_scores_are_exact_log_masses():
    k, v = make_cache(P=16)
    s = summaries_for(k, rank=15, dtype=torch.float64)  # float64: only the arithmetic's rounding is left
    q, bt, sl = batch()
    mu, basis, coeff = (t.double() for t in s)
    b, h, j = 0, 0, 2
    blk = int(bt[b, j])
    qq = q[b, h].double()
    est = torch.logsumexp((qq @ mu[blk, 0] + coeff[blk, 0] @ (basis[blk, 0] @ qq)) / 8.0, 0)
    exact = torch.logsumexp(k[blk, :, 0].double() @ qq / 8.0, 0)
    assert abs(float(est - exact)) < 1e-9


def test_filled_blocks_from_slot_mapping():
    P = 16
    slots = torch.tensor([5 * P + 15, 5 * P + 14, -1, 7 * P + 15, 2 * P + 0, 7 * P + 15, 9 * P + 15, -1])
    assert ref.filled_blocks(slots, P).tolist() == [5, 7, 9]
    # A chunked prefill of 40 tokens from position 0 over blocks [3, 8, 1]: blocks 3 and 8 fill.
    bt = [3, 8, 1]
    s = torch.tensor([bt[t // P] * P + t % P for t in range(40)])
    assert ref.filled_blocks(s, P).tolist() == [3, 8]
    assert ref.filled_blocks(torch.full((4,), -1), P).numel() == 0


def test_reference_request_rows_equals_the_compiled_operator():
    """The reference wrapper's request_rows (the plugin's CPU tests run it) and the compiled
    operator (include/locks/request_rows.h) give the same rows on random verification batches:
    T 4 rows a request ending at its last token, each request selected at that length (less one
    where it completes a page) as a random subset of its pages holding its last one; capacities
    of 1-5 pages, so that straddling rows both drop the request's last page for their own and
    add their own where the list lacked it."""
    import pytest

    locks = pytest.importorskip("locks")
    if not hasattr(torch.ops, "locks") or not hasattr(torch.ops.locks, "request_rows"):
        pytest.skip("the compiled locks operators are not installed")
    g, P, T, H = torch.Generator().manual_seed(7), 16, 4, 3
    added = 0
    for trial in range(40):
        S, cap = 3, 1 + trial % 5
        last = torch.randint(T + 1, 200, (S,), generator=g)
        req_lens = (last - (last % P == 0).long()).to(torch.int32)
        row_lens = torch.stack([last - (T - 1 - t) for t in range(T)], 1).reshape(-1).to(torch.int32)
        pages = torch.full((S, H, cap), -1, dtype=torch.int32)
        counts = torch.zeros(S, H, dtype=torch.int32)
        for s in range(S):
            tail = (int(req_lens[s]) - 1) // P
            for h in range(H):
                k = min(tail, int(torch.randint(0, cap, (1,), generator=g)))
                pick = sorted(torch.randperm(tail, generator=g)[:k].tolist()) + [tail]
                pages[s, h, : len(pick)] = torch.tensor(pick, dtype=torch.int32)
                counts[s, h] = len(pick)
        w = ref.ReferenceWrapper(torch.empty(0))
        w.page_size = P
        want = w.request_rows(pages, counts, req_lens, row_lens, T)
        got = locks.ops.request_rows(pages, counts, req_lens, row_lens, T, P)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
        for r in range(S * T):
            own = (int(row_lens[r]) - 1) // P
            added += sum(own not in pages[r // T, h, : int(counts[r // T, h])].tolist()
                         for h in range(H))
    assert added > 0  # the rows that add their own last page were exercised
