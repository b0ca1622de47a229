"""Baseline page selectors for the HF drop-in (research: a whole generation with each selector,
so a task's accuracy can be compared per method; locks.hf's `selector=` option).

- "locks": the summaries (the product; ops.select_pages, not here);
- "oracle": each full page's exact attention mass (reads every key: the upper reference);
- "quest": Quest's bound (Tang et al., 2024): per page and channel the keys' min and max,
  page score scale * sum_c max(q_c min_c, q_c max_c), an upper bound of the page's largest logit;
- "shadowkv": ShadowKV-style (Sun et al., 2024), as the harness's `shadowkv`
  (src/eval/selector_shadowkv.cpp): per chunk of `chunk` (8) keys a landmark, the chunk's mean
  key as attention sees it (post-RoPE: the cache's keys); a page's score is the log of its
  estimated mass, log C + log sum_chunks exp(scale q . landmark); the GQA group takes the max
  of its heads' mass shares (ShadowKV's rule, not share-averaging); the pages whose keys are
  least like their landmark (lowest min cosine over the page's keys: ShadowKV's outlier
  chunks, kept exact) are forced in, ceil(outlier_share * full pages) of them, at most a
  quarter of the budget's slots, when the budget is below the length. The shared low-rank
  pre-RoPE key basis of ShadowKV compresses the keys it stores; attention here is exact over
  the selected pages, so the basis does not enter the scores (as in the harness);
- "rocketkv": RocketKV-style (Behnam et al., 2025), as the harness's `rocket_snapkv`
  (src/eval/selector_rocket.cpp): SnapKV prefill eviction + hybrid sparse decode. Decode:
  Quest's min/max bound restricted to each query head's top-r channels by |q_c| (r = `dims`,
  0: head_dim / 4), share-averaged over the group. Eviction: the prompt's last `obs` queries
  (SnapKV's observation window) attend over the prompt's keys (no causal mask inside the
  window, as the harness); each key's weight summed over the window and the group, max-pooled
  over `pool` (7) tokens, summed per page; only the top ceil(keep * b / P) prompt pages (keep
  = 4) by that weight, plus the pages from the window's first token on (every page filled
  during decode included), stay selectable, when the budget is below the prompt's length.
  Eviction is at page granularity (SnapKV evicts tokens), as in the harness;
- "fullkv": dense attention (no selection).

Every selector goes through the same budget path as LOCKS (docs/method.md, "Selection under a
budget", include/locks/rules.h): per query head a score per full page, softmax over the pages
and the mean over the GQA group (share-averaging), then per KV head the partial tail page, the
sink and recent pages, and the highest shares (ties to the lower index) up to floor(b / P)
slots; b >= the length selects every page. Output: the (pages, counts) that
DecodeWrapper.attend takes. Computed in float32 from the paged cache, vectorised over the batch;
the oracle and Quest read every key each step (Quest's min/max are recomputed rather than
stored: the same scores, without the metadata cache it would keep in a server). ShadowKV's
landmarks and page cosines and RocketKV's min/max are functions of the full pages' keys (the
state the harness builds in prepare(), on the cache as it stands at that step): locks.hf
keeps them and recomputes them when a page fills (the score functions compute them when not
given); RocketKV's SnapKV page weights need the prompt's
queries, so the drop-in keeps the observation window's queries at the prefill and computes
the weights from them and the prompt's keys at the first decode step (snapkv_weights).
"""
from __future__ import annotations

import math

import torch

# "locks_h2": two-level LOCKS (super-page summaries first; the drop-in runs it through
# locks.two_level's operator, not through select() below).
SELECTORS = ("locks", "locks_h2", "oracle", "quest", "shadowkv", "rocketkv", "fullkv")


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


# -- ShadowKV-style (src/eval/selector_shadowkv.cpp) -----------------------------------------

def _chunk_keys(k_pages, block_table, chunk: int) -> torch.Tensor:
    """[B, H, max_blocks, P / chunk, chunk, d] float32 keys, split into landmark chunks."""
    k = _gathered_keys(k_pages, block_table)  # [B, J, P, H, d]
    B, J, P, H, d = k.shape
    if chunk < 1 or P % chunk:
        raise ValueError(f"locks.selectors: shadow_chunk must divide page_size {P}, got {chunk}")
    return k.permute(0, 3, 1, 2, 4).reshape(B, H, J, P // chunk, chunk, d)


def shadowkv_landmarks(k_pages, block_table, chunk: int = 8) -> torch.Tensor:
    """Each chunk's mean key: [B, H, max_blocks, P / chunk, d]."""
    return _chunk_keys(k_pages, block_table, chunk).mean(-2)


def shadowkv_page_cosine(k_pages, block_table, chunk: int = 8) -> torch.Tensor:
    """ShadowKV's outlier statistic: per page the lowest cosine of any of its keys with its
    chunk's landmark (1 when a key or the landmark is zero; capped at 1): [B, H, max_blocks]."""
    k = _chunk_keys(k_pages, block_table, chunk)
    m = k.mean(-2, keepdim=True)
    dot = (k * m).sum(-1)
    kn, mn = (k * k).sum(-1), (m * m).sum(-1)
    ok = (kn > 0) & (mn > 0)
    cos = torch.where(ok, dot / torch.sqrt(torch.where(ok, kn * mn, 1.0)), 1.0)
    return torch.clamp(cos.flatten(-2).amin(-1), max=1.0)


def shadowkv_head_scores(q, k_pages, block_table, scale: float, chunk: int = 8,
                         landmarks: torch.Tensor | None = None) -> torch.Tensor:
    """log of each position's estimated mass, log C + log sum_chunks exp(scale q . landmark):
    [B, H, G, max_blocks]. landmarks: shadowkv_landmarks, when kept from an earlier step."""
    B, Hq, d = q.shape
    H = k_pages.shape[2]
    lm = shadowkv_landmarks(k_pages, block_table, chunk) if landmarks is None else landmarks
    logits = torch.einsum("bhgd,bhjcd->bhgjc", q.float().view(B, H, Hq // H, d), lm) * scale
    return torch.logsumexp(logits, dim=-1) + math.log(chunk)


def _max_shares(head_scores: torch.Tensor, full: torch.Tensor) -> torch.Tensor:
    """The GQA group's max mass share, in logs (the harness's max-share rule: max over the
    group of s - LSE(s) of each head): [B, H, max_blocks], -inf where not a full page."""
    s = head_scores.masked_fill(~full[:, None, None, :], float("-inf"))
    lse = torch.logsumexp(s, dim=-1, keepdim=True)
    shares = torch.where(torch.isfinite(lse), s - torch.where(torch.isfinite(lse), lse, 0.0), float("-inf"))
    return shares.amax(2).masked_fill(~full[:, None, :], float("-inf"))


def _forced_first(scores, stat, count, full, descending: bool) -> torch.Tensor:
    """Per (sequence, KV head), a [B, H, J] mask of the first count[b] full pages ordered by stat
    (stable: ties to the lower index)."""
    fill = float("-inf") if descending else float("inf")
    order = torch.sort(stat.masked_fill(~full[:, None, :], fill), dim=-1, descending=descending,
                       stable=True).indices
    rank = torch.empty_like(order)
    rank.scatter_(-1, order, torch.arange(order.shape[-1], device=order.device).expand_as(order))
    return (rank < count[:, None, None]) & full[:, None, :]


def shadowkv_scores(q, k_pages, block_table, seq_lens, scale: float, *, budget: int, chunk: int = 8,
                    outlier_share: float = 1.0 / 64, landmarks=None, cosine=None) -> torch.Tensor:
    """ShadowKV-style group scores [B, H, max_blocks]: the log max-share of the landmark
    estimates, outlier pages set to the largest float (forced in, ties by index).
    landmarks / cosine: shadowkv_landmarks / shadowkv_page_cosine kept from an earlier step
    with the same full pages (they depend on full pages' keys only), else computed here."""
    P = k_pages.shape[1]
    full = _full_page_mask(seq_lens, block_table.shape[1], P)
    shares = _max_shares(shadowkv_head_scores(q, k_pages, block_table, scale, chunk, landmarks), full)
    n_full = full.sum(1)
    want = torch.ceil(outlier_share * n_full.double()).long()
    n_out = torch.minimum(torch.minimum(want, torch.full_like(want, (budget // P) // 4)), n_full)
    n_out = torch.where(seq_lens.long() > budget, n_out, 0)
    if cosine is None:
        cosine = shadowkv_page_cosine(k_pages, block_table, chunk)
    out = _forced_first(shares, cosine, n_out, full, descending=False)
    return shares.masked_fill(out, torch.finfo(torch.float32).max)


# -- RocketKV-style (src/eval/selector_rocket.cpp, rocket_snapkv) -------------------------------

def page_minmax(k_pages, block_table) -> tuple[torch.Tensor, torch.Tensor]:
    """Per block-table position and channel the keys' min and max: ([B, J, H, d], [B, J, H, d])."""
    k = _gathered_keys(k_pages, block_table)
    return k.amin(dim=2), k.amax(dim=2)


def rocket_bounds(q, k_pages, block_table, scale: float, dims: int = 0, minmax=None) -> torch.Tensor:
    """Quest's bound on each query head's top-`dims` channels by |q_c| (ties: lower channel;
    0: head_dim / 4): scale * sum_{c in top} max(q_c max_c, q_c min_c). [B, H, G, max_blocks].
    minmax: page_minmax, when kept from an earlier step with the same full pages."""
    B, Hq, d = q.shape
    H = k_pages.shape[2]
    r = d // 4 if dims == 0 else dims
    if not 1 <= r <= d:
        raise ValueError(f"locks.selectors: rocket_dims must be in [0, head_dim {d}] (0: head_dim / 4), "
                         f"got {dims}")
    qf = q.float()
    top = torch.sort(qf.abs(), dim=-1, descending=True, stable=True).indices[..., :r]
    qm = torch.zeros_like(qf).scatter_(-1, top, qf.gather(-1, top))  # q on its top channels, 0 elsewhere
    kmin, kmax = page_minmax(k_pages, block_table) if minmax is None else minmax  # [B, J, H, d]
    qg = qm.view(B, H, Hq // H, 1, d)
    lo = qg * kmin.permute(0, 2, 1, 3)[:, :, None]
    hi = qg * kmax.permute(0, 2, 1, 3)[:, :, None]
    return torch.maximum(lo, hi).sum(-1) * scale


def snapkv_weights(q_obs, k_pages, block_table, prompt_lens, scale: float, pool: int = 7) -> torch.Tensor:
    """SnapKV's page weights [B, H, max_blocks] (-inf beyond each prompt's full pages): the
    observation queries q_obs [B, w, Hq, d] (the prompt's last w) attend over the prompt's
    keys (prompt_lens [B] tokens, no causal mask inside the window, as the harness); each key's
    weights summed over the window and the group, max-pooled over `pool` tokens (half = pool //
    2 each side, inside the prompt), summed over each page."""
    B, w, Hq, d = q_obs.shape
    H = k_pages.shape[2]
    k = _gathered_keys(k_pages, block_table)  # [B, J, P, H, d]
    _, J, P, _, _ = k.shape
    T = prompt_lens.long().to(k.device)
    keys = k.reshape(B, J * P, H, d)
    qo = q_obs.float().view(B, w, H, Hq // H, d)
    logits = torch.einsum("bwhgd,bthd->bhwgt", qo, keys) * scale
    inside = torch.arange(J * P, device=k.device)[None, :] < T[:, None]  # [B, J*P]
    logits = logits.masked_fill(~inside[:, None, None, None, :], float("-inf"))
    wt = torch.softmax(logits, dim=-1).sum((2, 3))  # [B, H, J*P]
    wt = wt.masked_fill(~inside[:, None, :], 0.0)  # weights >= 0: 0 outside = clipped window
    half = max(0, pool // 2)
    if half:
        wt = torch.nn.functional.max_pool1d(wt.reshape(B * H, 1, J * P), 2 * half + 1, stride=1,
                                            padding=half).view(B, H, J * P)
    page = wt.view(B, H, J, P).sum(-1)
    return page.masked_fill(~_full_page_mask(T, J, P)[:, None, :], float("-inf"))


def rocketkv_scores(q, k_pages, block_table, seq_lens, scale: float, *, budget: int, dims: int = 0,
                    snap: torch.Tensor | None = None, prompt_lens=None, obs: int = 0,
                    keep: float = 4.0, minmax=None) -> torch.Tensor:
    """RocketKV-style shares [B, H, max_blocks]: the top-r channel bound, share-averaged; with
    snap (snapkv_weights) the SnapKV eviction: when the budget is below the prompt's length,
    only the top min(prompt's full pages, ceil(keep * b / P)) prompt pages by weight and the
    pages from the window's first token on stay selectable (-inf the rest)."""
    P = k_pages.shape[1]
    full = _full_page_mask(seq_lens, block_table.shape[1], P)
    shares = _shares(rocket_bounds(q, k_pages, block_table, scale, dims, minmax), full)
    if snap is None:
        return shares
    T = prompt_lens.long().to(shares.device)
    prompt_full = _full_page_mask(T, block_table.shape[1], P)
    n_keep = torch.clamp(prompt_full.sum(1), max=math.ceil(keep * budget / P))
    kept = _forced_first(snap, snap, n_keep, prompt_full, descending=True)
    first_window_page = torch.clamp(T - obs, min=0) // P
    pos = torch.arange(block_table.shape[1], device=shares.device)
    kept |= (pos[None, :] >= first_window_page[:, None])[:, None, :]
    evict = (T > budget)[:, None, None] & ~kept
    return shares.masked_fill(evict, float("-inf"))


SCORERS = {"oracle": oracle_scores, "quest": quest_scores, "shadowkv": shadowkv_scores,
           "rocketkv": rocketkv_scores}


def select(selector: str, q, k_pages, block_table, seq_lens, *, scale: float, page_size: int,
           budget: int, capacity: int, sink_pages: int = 0, recent_pages: int = 0, **options):
    """(pages, counts) of a baseline selector ("oracle", "quest", "shadowkv", "rocketkv") under
    the budget path. options: shadowkv: chunk, outlier_share; rocketkv: dims, snap,
    prompt_lens, obs, keep (see their score functions)."""
    if selector not in SCORERS:
        raise ValueError(f"locks.selectors: selector must be one of {sorted(SCORERS)}, got {selector!r}")
    if selector in ("shadowkv", "rocketkv"):
        shares = SCORERS[selector](q, k_pages, block_table, seq_lens, scale, budget=budget, **options)
    else:
        shares = SCORERS[selector](q, k_pages, block_table, seq_lens, scale)
    return select_from_scores(shares, seq_lens, page_size=page_size, budget=budget, capacity=capacity,
                              sink_pages=sink_pages, recent_pages=recent_pages)
