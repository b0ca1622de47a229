"""Baseline page selectors for the HF drop-in (research: a whole generation with each selector,
so a task's accuracy can be compared per method; locks.hf's `selector=` option).

- "locks": the summaries (the product; ops.select_pages, not here);
- "oracle": each full page's exact attention mass (reads every key: the upper reference);
- "quest": Quest's bound (Tang et al., 2024): per page and channel the keys' min and max,
  page score scale * sum_c max(q_c min_c, q_c max_c), an upper bound of the page's largest logit;
- "fullkv": dense attention (no selection).

Every selector goes through the same budget path as LOCKS (docs/method.md, "Selection under a
budget", include/locks/rules.h): per query head a score per full page, softmax over the pages
and the mean over the GQA group (share-averaging), then per KV head the partial tail page, the
sink and recent pages, and the highest shares (ties to the lower index) up to floor(b / P)
slots; b >= the length selects every page. Output: the (pages, counts) that
DecodeWrapper.attend takes. Computed in float32 from the paged cache, vectorised over the batch;
the oracle and Quest read every key each step (Quest's min/max are recomputed rather than
stored: the same scores, without the metadata cache it would keep in a server).
"""
from __future__ import annotations

import torch

SELECTORS = ("locks", "oracle", "quest", "fullkv")


def _gathered_keys(k_pages: torch.Tensor, block_table: torch.Tensor) -> torch.Tensor:
    """[B, max_blocks, P, H, d] float32 keys of every block-table position."""
    return k_pages[block_table.long()].float()


def _full_page_mask(seq_lens: torch.Tensor, max_blocks: int, page_size: int) -> torch.Tensor:
    pos = torch.arange(max_blocks, device=seq_lens.device)
    return pos[None, :] < (seq_lens.long() // page_size)[:, None]  # [B, max_blocks]


def _shares(head_scores: torch.Tensor, full: torch.Tensor) -> torch.Tensor:
    """head_scores [B, H, G, max_blocks] -> share-averaged [B, H, max_blocks] over full pages
    (-inf elsewhere, and 0 shares when a sequence has no full page)."""
    s = head_scores.masked_fill(~full[:, None, None, :], float("-inf"))
    any_full = full.any(dim=1)[:, None, None, None]
    share = torch.where(any_full, torch.softmax(torch.where(any_full, s, 0.0), dim=-1), 0.0).mean(2)
    return share.masked_fill(~full[:, None, :], float("-inf"))


def page_lse(q, k_pages, block_table, scale: float) -> torch.Tensor:
    """log sum_i exp(scale q.k_i) over each block-table position's P keys: [B, H, G, max_blocks]."""
    B, Hq, d = q.shape
    H = k_pages.shape[2]
    k = _gathered_keys(k_pages, block_table)
    logits = torch.einsum("bhgd,bjphd->bhgjp", q.float().view(B, H, Hq // H, d), k) * scale
    return torch.logsumexp(logits, dim=-1)


def quest_bounds(q, k_pages, block_table, scale: float) -> torch.Tensor:
    """Quest's bound of each position's largest logit: [B, H, G, max_blocks]."""
    B, Hq, d = q.shape
    H = k_pages.shape[2]
    k = _gathered_keys(k_pages, block_table)
    kmin, kmax = k.amin(dim=2), k.amax(dim=2)  # [B, J, H, d]
    qg = q.float().view(B, H, Hq // H, 1, d)
    lo = qg * kmin.permute(0, 2, 1, 3)[:, :, None]  # [B, H, G, J, d]
    hi = qg * kmax.permute(0, 2, 1, 3)[:, :, None]
    return torch.maximum(lo, hi).sum(-1) * scale


def oracle_scores(q, k_pages, block_table, seq_lens, scale: float) -> torch.Tensor:
    """Share of each full page in the exact attention of each query head, averaged over the
    group: [B, H, max_blocks]."""
    full = _full_page_mask(seq_lens, block_table.shape[1], k_pages.shape[1])
    return _shares(page_lse(q, k_pages, block_table, scale), full)


def quest_scores(q, k_pages, block_table, seq_lens, scale: float) -> torch.Tensor:
    """Quest's per-page bound, share-averaged over the group: [B, H, max_blocks]."""
    full = _full_page_mask(seq_lens, block_table.shape[1], k_pages.shape[1])
    return _shares(quest_bounds(q, k_pages, block_table, scale), full)


def select_from_scores(shares: torch.Tensor, seq_lens: torch.Tensor, *, page_size: int,
                       budget: int, capacity: int, sink_pages: int = 0, recent_pages: int = 0):
    """The budget path over per-(sequence, KV head) page scores [B, H, max_blocks] (-inf: not
    a full page): (pages [B, H, capacity] int32 ascending, -1 padded; counts [B, H] int32)."""
    B, H, J = shares.shape
    dev = shares.device
    n = seq_lens.long()[:, None, None]
    full, npages = n // page_size, (n + page_size - 1) // page_size
    pos = torch.arange(J, device=dev)[None, None, :]
    tail = (pos == npages - 1) & (n % page_size != 0)
    sink = pos < torch.clamp(full, max=sink_pages)
    recent = (pos >= full - recent_pages) & (pos < full)
    forced = tail | sink | recent
    key = torch.where(forced, torch.tensor(float("inf"), device=dev), shares)
    k_slots = min(budget // page_size, J)
    order = torch.sort(key, dim=-1, descending=True, stable=True).indices[..., :k_slots]
    keep = key.gather(-1, order) > float("-inf")
    chosen = torch.zeros(B, H, J, dtype=torch.bool, device=dev)
    chosen.scatter_(-1, order, keep)
    chosen = torch.where(n <= budget, pos < npages, chosen)  # b >= length: every page
    counts = chosen.sum(-1)
    if int(counts.max()) > capacity:
        raise ValueError(f"locks.selectors: {int(counts.max())} pages selected for capacity {capacity}")
    idx = torch.where(chosen, pos.expand(B, H, J), J)  # unchosen sort last
    ordered = torch.sort(idx, dim=-1).values[..., :capacity]
    pages = torch.where(ordered < J, ordered, -1)
    if pages.shape[-1] < capacity:
        pages = torch.nn.functional.pad(pages, (0, capacity - pages.shape[-1]), value=-1)
    return pages.to(torch.int32), counts.to(torch.int32)


SCORERS = {"oracle": oracle_scores, "quest": quest_scores}


def select(selector: str, q, k_pages, block_table, seq_lens, *, scale: float, page_size: int,
           budget: int, capacity: int, sink_pages: int = 0, recent_pages: int = 0):
    """(pages, counts) of a baseline selector ("oracle" or "quest") under the budget path."""
    if selector not in SCORERS:
        raise ValueError(f"locks.selectors: selector must be one of {sorted(SCORERS)}, got {selector!r}")
    shares = SCORERS[selector](q, k_pages, block_table, seq_lens, scale)
    return select_from_scores(shares, seq_lens, page_size=page_size, budget=budget, capacity=capacity,
                              sink_pages=sink_pages, recent_pages=recent_pages)
