"""Verification batches for the request_rows operator (include/locks/request_rows.h), shared by
the CPU and GPU tests: requests whose last token ends at a random length, each selected at that
length (less one where it completes a page, as the vLLM plugin does) as an ascending random
subset of its pages holding its partial last page, and T token rows a request ending at its
last token; plus the rule in plain Python, independent of the operators."""
import random

import torch

P = 16


def batch(S, T, H, cap, max_len, seed):
    rng = random.Random(seed)
    req_lens, row_lens = [], []
    pages = torch.full((S, H, cap), -1, dtype=torch.int32)
    counts = torch.zeros(S, H, dtype=torch.int32)
    for s in range(S):
        last = rng.randint(T + 1, max_len)
        req = last - 1 if last % P == 0 else last
        req_lens.append(req)
        row_lens += [last - (T - 1 - t) for t in range(T)]
        tail = (req - 1) // P
        for h in range(H):
            pick = sorted(rng.sample(range(tail), min(tail, rng.randint(0, cap - 1)))) + [tail]
            pages[s, h, : len(pick)] = torch.tensor(pick, dtype=torch.int32)
            counts[s, h] = len(pick)
    i32 = lambda v: torch.tensor(v, dtype=torch.int32)  # noqa: E731
    return pages, counts, i32(req_lens), i32(row_lens)


def rule(pages, counts, req_lens, row_lens, T, cap):
    """Each row's list: its request's pages up to the row's last page, then that page where the
    list lacks it and has room, then any page past the request's last (invalid values passed on);
    count -1 for an invalid request count or a partial last page without room, 0 for a row of
    length < 1."""
    n, H = row_lens.shape[0], pages.shape[1]
    out = torch.full((n, H, cap), -1, dtype=torch.int32)
    cnt = torch.zeros(n, H, dtype=torch.int32)
    for r in range(n):
        s, ln = r // T, int(row_lens[r])
        if ln < 1:
            continue
        own, req_len = (ln - 1) // P, int(req_lens[s])
        req_last = (req_len - 1) // P if req_len >= 1 else -1
        for h in range(H):
            c = int(counts[s, h])
            if not 0 <= c <= pages.shape[2]:
                cnt[r, h] = -1
                continue
            listed = pages[s, h, :c].tolist()
            row = [p for p in listed if p <= own]
            after = [p for p in listed if p > own and p > req_last]
            if own not in listed:
                if len(row) + len(after) < cap:
                    row.append(own)
                elif ln % P:
                    cnt[r, h] = -1
                    continue
            row += after
            out[r, h, : len(row)] = torch.tensor(row, dtype=torch.int32)
            cnt[r, h] = len(row)
    return out, cnt
