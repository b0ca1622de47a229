"""locks.ops.request_rows (include/locks/request_rows.h) on the CPU operators: a request's
selection as each of its token rows' lists, against the rule written out in Python
(request_rows_cases.py), and the refusals of bad calls."""
import pytest
import torch

from locks import ops
from request_rows_cases import P, batch, rule

HAVE_OPS = hasattr(torch.ops, "locks") and hasattr(torch.ops.locks, "request_rows")
pytestmark = pytest.mark.skipif(not HAVE_OPS, reason="the compiled locks operators are not installed")


@pytest.mark.parametrize("S,T,H,cap,max_len", [(5, 1, 2, 8, 600), (6, 4, 2, 8, 600),
                                               (3, 4, 8, 1, 100), (4, 16, 2, 40, 1000)])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_rows_follow_the_rule(S, T, H, cap, max_len, seed):
    pages, counts, req_lens, row_lens = batch(S, T, H, cap, max_len, seed)
    for out_cap in (cap, cap + 2):
        out = torch.full((S * T, H, out_cap), 7, dtype=torch.int32)
        cnt = torch.full((S * T, H), 7, dtype=torch.int32)
        got = ops.request_rows(pages, counts, req_lens, row_lens, T, P, pages=out, counts=cnt)
        want = rule(pages, counts, req_lens, row_lens, T, out_cap)
        assert got[0] is out and got[1] is cnt
        assert torch.equal(out, want[0]) and torch.equal(cnt, want[1])


def test_straddling_rows_take_their_own_last_page():
    """Request of 34 tokens (page 2 partial), T 4: rows of 31 and 32 tokens end on page 1."""
    pages = torch.tensor([[[1, 2, -1]], [[2, -1, -1]]], dtype=torch.int32)   # [2, 1, 3]
    counts = torch.tensor([[2], [1]], dtype=torch.int32)
    req_lens = torch.tensor([34, 34], dtype=torch.int32)
    rows = torch.tensor([31, 32, 33, 34, 31, 32, 33, 34], dtype=torch.int32)
    out, cnt = ops.request_rows(pages, counts, req_lens, rows, 4, P)
    lists = [out[r, 0, : int(cnt[r, 0])].tolist() for r in range(8)]
    assert lists == [[1], [1], [1, 2], [1, 2], [1], [1], [2], [2]]


def test_bad_calls_are_refused_and_write_nothing():
    pages, counts, req_lens, row_lens = batch(2, 4, 2, 4, 300, 9)
    out = torch.full((8, 2, 4), 7, dtype=torch.int32)
    cnt = torch.full((8, 2), 7, dtype=torch.int32)

    def call(**kw):
        a = dict(req_pages=pages, req_counts=counts, req_seq_lens=req_lens, seq_lens=row_lens,
                 tokens_per_request=4, page_size=P, pages=out, counts=cnt)
        a.update(kw)
        torch.ops.locks.request_rows(*a.values())

    with pytest.raises(ValueError, match="seq_lens"):
        call(tokens_per_request=3)                                   # 8 rows != 2 x 3
    with pytest.raises(ValueError, match="capacity"):
        call(pages=torch.zeros(8, 2, 3, dtype=torch.int32))          # below the requests' 4
    store = torch.zeros(100, dtype=torch.int32)                     # rows written over the
    shared = store[:16].view(2, 2, 4)                                # requests' own lists
    shared.copy_(pages)
    with pytest.raises(ValueError, match="overlaps"):
        call(req_pages=shared, pages=store[8:72].view(8, 2, 4))
    late = row_lens.clone()
    late[-1] = int(req_lens[-1]) + P                                 # ends past its request
    with pytest.raises(ValueError, match="past the last page"):
        call(seq_lens=late)
    bad = counts.clone()
    bad[0, 0] = 9
    with pytest.raises(ValueError, match="count"):
        call(req_counts=bad)
    assert (out == 7).all() and (cnt == 7).all()
