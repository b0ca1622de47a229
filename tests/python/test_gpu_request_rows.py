"""The CUDA request_rows operator (include/locks/request_rows.h) against the rule written out
in Python (request_rows_cases.py), entry for entry: valid verification batches, device values
outside the contract (which the CPU operator refuses and the kernel must survive: count -1 or
0 as the rule says), replay in a CUDA graph with new lengths, and torch.library.opcheck.
Run on the GPU machine: scripts/gpu_tests.sh python."""
import pytest
import torch

from gpu_util import DEV, needs_cuda
from locks import ops
from request_rows_cases import P, batch, rule

pytestmark = pytest.mark.gpu


def on_device(*ts):
    return [t.to(DEV) for t in ts]


@pytest.mark.parametrize("S,T,H,cap,max_len", [(5, 1, 2, 8, 600), (6, 4, 2, 8, 600),
                                               (3, 4, 8, 1, 100), (7, 4, 1, 40, 2000),
                                               (4, 16, 2, 40, 1000), (64, 4, 8, 128, 131072)])
def test_cuda_rows_follow_the_rule(S, T, H, cap, max_len):
    for seed in range(3):
        pages, counts, req_lens, row_lens = batch(S, T, H, cap, max_len, seed)
        for out_cap in (cap, cap + 3):
            want = rule(pages, counts, req_lens, row_lens, T, out_cap)
            out = torch.full((S * T, H, out_cap), 7, dtype=torch.int32, device=DEV)
            cnt = torch.full((S * T, H), 7, dtype=torch.int32, device=DEV)
            ops.request_rows(*on_device(pages, counts, req_lens, row_lens), T, P, pages=out,
                             counts=cnt)
            assert torch.equal(out.cpu(), want[0]) and torch.equal(cnt.cpu(), want[1])


def test_cuda_bad_device_values_follow_the_rule():
    pages, counts, req_lens, row_lens = batch(3, 4, 2, 4, 300, 11)
    cases = []
    for edit in ("count_high", "count_low", "row_zero", "page_past", "req_zero"):
        p, c, q, r = pages.clone(), counts.clone(), req_lens.clone(), row_lens.clone()
        if edit == "count_high":
            c[0, 1] = 5
        elif edit == "count_low":
            c[1, 0] = -2
        elif edit == "row_zero":
            r[5] = 0
        elif edit == "page_past":
            p[0, 0, 0] = 1000
        else:
            q[1] = 0
        cases.append((p, c, q, r, 4))
    # a request selected at a full page (32 tokens) whose full list (capacity 1) lacks page 1:
    # its 31-token row needs that partial page (invalid), its 32-token row does not
    i32 = lambda v: torch.tensor(v, dtype=torch.int32)  # noqa: E731
    cases.append((i32([[[0]]]), i32([[1]]), i32([32]), i32([31, 32]), 2))
    for p, c, q, r, T in cases:
        want = rule(p, c, q, r, T, p.shape[2])
        got = ops.request_rows(*on_device(p, c, q, r), T, P)
        assert torch.equal(got[0].cpu(), want[0]) and torch.equal(got[1].cpu(), want[1])
    assert want[1].view(-1).tolist() == [-1, 1]


@needs_cuda
def test_cuda_request_rows_replays_in_a_graph():
    pages, counts, req_lens, row_lens = on_device(*batch(8, 4, 2, 8, 4000, 3))
    out = torch.empty(32, 2, 8, dtype=torch.int32, device=DEV)
    cnt = torch.empty(32, 2, dtype=torch.int32, device=DEV)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        ops.request_rows(pages, counts, req_lens, row_lens, 4, P, pages=out, counts=cnt)
    for seed in (4, 5):
        new = batch(8, 4, 2, 8, 4000, seed)
        for dst, src in zip((pages, counts, req_lens, row_lens), new):
            dst.copy_(src)
        g.replay()
        want = rule(*new, 4, 8)
        assert torch.equal(out.cpu(), want[0]) and torch.equal(cnt.cpu(), want[1])


def test_cuda_request_rows_opcheck():
    pages, counts, req_lens, row_lens = on_device(*batch(3, 4, 2, 8, 600, 1))
    out = torch.empty(12, 2, 8, dtype=torch.int32, device=DEV)
    cnt = torch.empty(12, 2, dtype=torch.int32, device=DEV)
    torch.library.opcheck(torch.ops.locks.request_rows.default,
                          (pages, counts, req_lens, row_lens, 4, P, out, cnt))
