"""Pure-torch reference of the decode step the plugin runs (docs/method.md), float64 inside:
fp32 summary build, scoring from summaries, GQA share-averaging, budgeted selection with the
tail page always attended, exact attention over the selected pages, and the slot rule of
summary updates. It lets the plugin be tested on CPU without the compiled operators, and it
is what the compiled `locks.DecodeWrapper` must agree with (tests/vllm).

Layouts are the library's (python/locks/ops.py): k/v [num_blocks, P, H, d], block_table
[B, max_blocks] int32, seq_lens [B] int32, q [B, Hq, d]; fp32 summaries mu [N, H, d],
basis [N, H, r, d], coeff [N, H, P, r].
"""
from __future__ import annotations

import math

import torch


def filled_blocks(slot_mapping: torch.Tensor, page_size: int) -> torch.Tensor:
    """Physical blocks whose last slot this step wrote (slot = block * P + offset, -1 =
    padding): the blocks whose summary must be (re)built. Sorted, unique."""
    s = slot_mapping.reshape(-1).to(torch.int64)
    s = s[s >= 0]
    return torch.unique(s[s % page_size == page_size - 1] // page_size)


def build_summaries(k_cache: torch.Tensor, block_ids: torch.Tensor, summaries, rank: int) -> None:
    """fp32 summaries of the given full blocks: centroid, top-r right singular vectors of the
    deviations, coefficients (docs/method.md)."""
    mu, basis, coeff = summaries
    for b in block_ids.tolist():
        k = k_cache[b].to(torch.float64)                 # [P, H, d]
        for h in range(k.shape[1]):
            kh = k[:, h, :]
            m = kh.mean(0)
            dev = kh - m
            _, _, vh = torch.linalg.svd(dev, full_matrices=False)
            v = vh[:rank]                                # [r, d]
            mu[b, h] = m.to(mu.dtype)
            basis[b, h] = v.to(basis.dtype)
            coeff[b, h] = (dev @ v.T).to(coeff.dtype)    # [P, r]


def summary_update(k_cache, summaries, slot_mapping, rank: int) -> None:
    build_summaries(k_cache, filled_blocks(slot_mapping, k_cache.shape[1]), summaries, rank)


def write_slots(key, value, k_cache, v_cache, slot_mapping) -> None:
    """Token i's key / value rows [n, H, d] into slot slot_mapping[i] (-1 = padding), in token
    order (the last of several tokens naming one slot stays)."""
    P = k_cache.shape[1]
    for i, s in enumerate(slot_mapping.reshape(-1).tolist()):
        if s >= 0:
            k_cache[s // P, s % P] = key[i].to(k_cache.dtype)
            v_cache[s // P, s % P] = value[i].to(v_cache.dtype)


def _num_pages(n: int, P: int) -> int:
    return -(-n // P)


def select(q, summaries, block_table, seq_lens, budget: int, sink_pages: int = 0,
           recent_pages: int = 0, scale: float | None = None, dense_below: int = 0):
    """Logical page indices selected per (sequence, KV head): a list over the batch of
    [H] lists of sorted page indices. A sequence within the budget or shorter than
    dense_below tokens (the minimum context) keeps every page."""
    mu, basis, coeff = (t.to(torch.float64) for t in summaries)
    B, Hq, d = q.shape
    H, P = mu.shape[1], coeff.shape[2]
    G = Hq // H
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    k_slots = budget // P
    out = []
    for b in range(B):
        n = int(seq_lens[b])
        npages = _num_pages(n, P)
        full = n // P
        tail = [npages - 1] if n % P else []
        per_head = []
        for h in range(H):
            if n <= budget or n < dense_below:
                per_head.append(list(range(npages)))
                continue
            forced = set(tail)
            forced.update(range(min(sink_pages, full)))
            forced.update(range(max(0, full - recent_pages), full))
            blocks = block_table[b, :full].to(torch.int64)
            qh = q[b, h * G:(h + 1) * G].to(torch.float64)           # [G, d]
            # s_j = log sum_i exp((q.mu_j + (V_j q).c_i) * scale), per query head
            qm = qh @ mu[blocks, h].T                                  # [G, full]
            vq = torch.einsum("jrd,gd->gjr", basis[blocks, h], qh)    # [G, full, r]
            e = qm[:, :, None] + torch.einsum("gjr,jpr->gjp", vq, coeff[blocks, h])
            s = torch.logsumexp(e * scale, dim=-1)                    # [G, full]
            share = torch.softmax(s, dim=-1).mean(0)                   # share-averaging
            order = sorted(range(full), key=lambda j: (-float(share[j]), j))
            chosen = set(forced)
            for j in order:
                if len(chosen) >= k_slots:
                    break
                chosen.add(j)
            per_head.append(sorted(chosen))
        out.append(per_head)
    return out


def attend(q, k_cache, v_cache, block_table, seq_lens, pages=None, scale: float | None = None):
    """Exact attention of q [B, Hq, d] over the given logical pages (None: all of them).
    Returns (out [B, Hq, d], lse [B, Hq]) in float64."""
    B, Hq, d = q.shape
    P, H = k_cache.shape[1], k_cache.shape[2]
    G = Hq // H
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    out = torch.zeros(B, Hq, d, dtype=torch.float64)
    lse = torch.zeros(B, Hq, dtype=torch.float64)
    for b in range(B):
        n = int(seq_lens[b])
        for h in range(H):
            pg = list(range(_num_pages(n, P))) if pages is None else pages[b][h]
            tok = torch.tensor([p * P + i for p in pg for i in range(P) if p * P + i < n])
            blk = block_table[b].to(torch.int64)[tok // P]
            k = k_cache[blk, tok % P, h].to(torch.float64)      # [T, d]
            v = v_cache[blk, tok % P, h].to(torch.float64)
            for g in range(G):
                qh = q[b, h * G + g].to(torch.float64)
                logits = (k @ qh) * scale
                lse[b, h * G + g] = torch.logsumexp(logits, 0)
                out[b, h * G + g] = torch.softmax(logits, 0) @ v
    return out, lse


def decode(q, k_cache, v_cache, summaries, block_table, seq_lens, budget, sink_pages=0,
           recent_pages=0, scale=None, dense=False, dense_below=0):
    pages = None if dense else select(q, summaries, block_table, seq_lens, budget, sink_pages,
                                      recent_pages, scale, dense_below)
    return attend(q, k_cache, v_cache, block_table, seq_lens, pages, scale)


def _into(q, o, l, out, lse):
    """The wrappers' outputs: o and l copied into the caller's out / lse (fp32 buffers made
    when None), as the compiled DecodeWrapper writes them."""
    out = torch.empty(q.shape, dtype=torch.float32) if out is None else out
    lse = torch.empty(q.shape[:2], dtype=torch.float32) if lse is None else lse
    out.copy_(o)
    lse.copy_(l)
    return out, lse


class ReferenceWrapper:
    """The `locks.DecodeWrapper` interface (SPEC.md) over this reference, fp32 summaries:
    what the plugin's CPU tests plug in instead of the compiled operators."""

    def __init__(self, workspace: torch.Tensor):
        self.workspace = workspace
        self.capacity = 0
        self.runs = []  # (batch, dense) of every run: lets tests see which path ran

    def plan(self, *, num_q_heads, num_kv_heads, head_dim, page_size=16, rank=8, precision="fp32",
             kv_dtype=torch.bfloat16, num_blocks, max_batch, max_blocks_per_seq,
             budget_tokens=2048, sink_pages=0, recent_pages=0, scale=None, device="cpu",
             dense_below=0, length_buckets=1, bucket_min_pages=1):
        # length_buckets: no graphs here, one plan (as the library's CPU plans)
        self.budget, self.sink, self.recent, self.scale = budget_tokens, sink_pages, recent_pages, scale
        self.max_batch, self.page_size = max_batch, page_size
        self.rank, self.dense_below = rank, dense_below
        self.capacity = ReferenceOps.select_capacity(budget_tokens, page_size, max_blocks_per_seq,
                                                     dense_below)

    def run(self, q, k_cache, v_cache, summaries, block_table, seq_lens, *, out=None, lse=None,
            pages=None, counts=None, dense=False):
        self.runs.append((q.shape[0], dense))
        o, l = decode(q, k_cache, v_cache, summaries, block_table, seq_lens, self.budget,
                      self.sink, self.recent, self.scale, dense, self.dense_below)
        return _into(q, o, l, out, lse)

    def select(self, q, summaries, block_table, seq_lens, *, pages=None, counts=None):
        """DecodeWrapper.select: pages [B, H, capacity] ascending, -1 padded; counts [B, H]."""
        self.runs.append((q.shape[0], "select"))
        lists = select(q, summaries, block_table, seq_lens, self.budget, self.sink, self.recent,
                       self.scale, self.dense_below)
        B, H = q.shape[0], len(lists[0])
        pages = torch.empty(B, H, self.capacity, dtype=torch.int32) if pages is None else pages
        counts = torch.empty(B, H, dtype=torch.int32) if counts is None else counts
        pages.fill_(-1)
        for b in range(B):
            for h in range(H):
                pages[b, h, : len(lists[b][h])] = torch.tensor(lists[b][h], dtype=torch.int32)
                counts[b, h] = len(lists[b][h])
        return pages, counts

    def request_rows(self, req_pages, req_counts, req_seq_lens, seq_lens, tokens_per_request, *,
                     pages=None, counts=None):
        """DecodeWrapper.request_rows: include/locks/request_rows.h's rule on lists (valid
        selections): each token row keeps its request's pages up to its own last page, and that
        page (where the list lacks it and has room)."""
        P, T = self.page_size, tokens_per_request
        n, H, cap = seq_lens.shape[0], req_pages.shape[1], req_pages.shape[2]
        pages = torch.empty(n, H, cap, dtype=torch.int32) if pages is None else pages
        counts = torch.empty(n, H, dtype=torch.int32) if counts is None else counts
        pages.fill_(-1)
        for r in range(n):
            s, own = r // T, (int(seq_lens[r]) - 1) // P
            for h in range(H):
                listed = [int(x) for x in req_pages[s, h, : int(req_counts[s, h])]]
                row = [p for p in listed if p <= own]
                if own not in listed:
                    if len(row) >= pages.shape[2]:
                        raise ValueError(f"request_rows: row {r} has no room for its last page")
                    row.append(own)
                pages[r, h, : len(row)] = torch.tensor(row, dtype=torch.int32)
                counts[r, h] = len(row)
        return pages, counts

    def attend(self, q, k_cache, v_cache, block_table, seq_lens, *, pages=None, counts=None,
               out=None, lse=None):
        """DecodeWrapper.attend: exact attention over (pages, counts), or every page."""
        self.runs.append((q.shape[0], "attend"))
        lists = None if pages is None else [
            [[int(x) for x in pages[b, h, : int(counts[b, h])]] for h in range(pages.shape[1])]
            for b in range(pages.shape[0])]
        o, l = attend(q, k_cache, v_cache, block_table, seq_lens, lists, self.scale)
        return _into(q, o, l, out, lse)


class ReferenceOps:
    """The `locks` functions the plugin calls, over this reference (CPU tests)."""

    def __init__(self, rank: int):
        self.rank = rank
        self.updates = 0

    DecodeWrapper = ReferenceWrapper

    @staticmethod
    def select_capacity(budget_tokens, page_size, max_blocks_per_seq, dense_below=0):
        """rules.h's select_capacity, written out: ceil(b / P) slots, or every page of a
        sequence of dense_below - 1 tokens if more, at most max_blocks_per_seq."""
        by_dense = _num_pages(dense_below - 1, page_size) if dense_below > 1 else 0
        return min(max(_num_pages(budget_tokens, page_size), by_dense), max_blocks_per_seq)

    def summary_update(self, k_cache, block_table, seq_lens, summaries, slot_mapping=None):
        self.updates += 1
        summary_update(k_cache, summaries, slot_mapping, self.rank)

    def cache_write(self, key, value, k_cache, v_cache, slot_mapping, summaries=None):
        """locks.cache_write: the writes, then the summary update over the same slots."""
        write_slots(key, value, k_cache, v_cache, slot_mapping)
        if summaries is not None:
            summary_update(k_cache, summaries, slot_mapping, self.rank)

    @staticmethod
    def supports(backend, *, head_dim, page_size=16, group=1, kv_dtype=torch.bfloat16, rank=8,
                 precision="int4"):
        if head_dim not in (64, 128, 256):
            return False, f"head_dim {head_dim} not in (64, 128, 256)"
        if group > 32:
            return False, f"GQA group {group} > 32"
        return True, ""
