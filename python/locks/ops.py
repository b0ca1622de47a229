"""Python face of the `locks` torch operators (python/csrc/ops_*.cpp).

The operators write into caller-provided tensors (out-tensor schemas); the helpers here
allocate those tensors when the caller does not pass them. Each operator has a fake
(meta) implementation so that torch.compile can trace a decode step that calls it.

Layouts (include/locks/kv_cache.h, summary.h):
  k_cache, v_cache  [num_blocks, page_size, num_kv_heads, head_dim]  float32/float16/bfloat16
  block_table       [batch, max_blocks_per_seq] int32,  seq_lens [batch] int32
  summaries (fp32)  mu [num_blocks, H, d], basis [num_blocks, H, r, d], coeff [num_blocks, H, P, r]
  summaries (int4)  mu_q i8 [N, H, d], mu_scale [N, H], basis_q u8 [N, H, r, d/2], basis_scale [N, H, r],
                    coeff_q i8 [N, H, P, r], coeff_scale [N, H, r]   (the *_quant operators)
  q                 [batch, num_q_heads, head_dim] float32
  pages, counts     [batch, H, capacity] int32 (ascending, -1 padded), [batch, H] int32
"""
from __future__ import annotations

import math
from typing import NamedTuple

import torch

_ops = torch.ops.locks


class Summaries(NamedTuple):
    mu: torch.Tensor
    basis: torch.Tensor
    coeff: torch.Tensor


class QuantSummaries(NamedTuple):
    """int8 centroid, int4 basis (two a byte, low nibble = even dim), int8 coefficients."""
    mu_q: torch.Tensor
    mu_scale: torch.Tensor
    basis_q: torch.Tensor
    basis_scale: torch.Tensor
    coeff_q: torch.Tensor
    coeff_scale: torch.Tensor


def new_summaries(num_blocks: int, num_kv_heads: int, head_dim: int, page_size: int = 16,
                  rank: int = 8, device: torch.device | str = "cpu",
                  precision: str = "fp32") -> Summaries | QuantSummaries:
    """Zeroed summary storage for a cache of num_blocks pages; precision "fp32" or "int4"."""
    if not 1 <= rank < page_size:
        raise ValueError(f"rank must be in [1, page_size) = [1, {page_size}), got {rank}")
    n, h = num_blocks, num_kv_heads
    z = lambda *s, dt=torch.float32: torch.zeros(*s, dtype=dt, device=device)  # noqa: E731
    if precision == "fp32":
        return Summaries(z(n, h, head_dim), z(n, h, rank, head_dim), z(n, h, page_size, rank))
    if precision == "int4":
        return QuantSummaries(z(n, h, head_dim, dt=torch.int8), z(n, h),
                              z(n, h, rank, head_dim // 2, dt=torch.uint8), z(n, h, rank),
                              z(n, h, page_size, rank, dt=torch.int8), z(n, h, rank))
    raise ValueError(f"precision must be 'fp32' or 'int4', got {precision!r}")


def select_capacity(budget_tokens: int, page_size: int, max_blocks_per_seq: int,
                    sink_pages: int = 0, recent_pages: int = 0) -> int:
    """Page slots per (sequence, KV head) for a budget: include/locks/select.h's select_capacity
    (plain Python so that torch.compile traces it; the operator re-checks the capacity)."""
    if sink_pages < 0 or recent_pages < 0:
        raise ValueError(f"sink_pages and recent_pages must be >= 0, got {sink_pages}, {recent_pages}")
    if budget_tokens // page_size < sink_pages + recent_pages + 1:
        raise ValueError(
            f"budget of {budget_tokens} tokens gives {budget_tokens // page_size} pages of {page_size}, "
            f"fewer than sink ({sink_pages}) + recent ({recent_pages}) + 1 tail page")
    return min(-(-budget_tokens // page_size), max_blocks_per_seq)


def summary_build(k_cache: torch.Tensor, block_ids: torch.Tensor, s: Summaries) -> None:
    """Build the summaries of the given (full) physical blocks, every KV head, in place."""
    if isinstance(s, QuantSummaries):
        _ops.summary_build_quant(k_cache, block_ids, *s)
    else:
        _ops.summary_build(k_cache, block_ids, *s)


def summary_update(k_cache: torch.Tensor, block_table: torch.Tensor, seq_lens: torch.Tensor,
                   s: Summaries) -> None:
    """After appending one token per sequence: rebuild the summary of each page that just filled."""
    if isinstance(s, QuantSummaries):
        _ops.summary_update_quant(k_cache, block_table, seq_lens, *s)
    else:
        _ops.summary_update(k_cache, block_table, seq_lens, *s)


def _scale(scale: float | None, head_dim: int) -> float:
    return 1.0 / math.sqrt(head_dim) if scale is None else float(scale)


def select_pages(q: torch.Tensor, s: Summaries, block_table: torch.Tensor, seq_lens: torch.Tensor,
                 budget_tokens: int, sink_pages: int = 0, recent_pages: int = 0,
                 scale: float | None = None, pages: torch.Tensor | None = None,
                 counts: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Score pages from summaries, share-average over GQA groups, select under the budget."""
    coeff = s.coeff_q if isinstance(s, QuantSummaries) else s.coeff  # [N, H, P, r]
    batch, heads, page_size = q.shape[0], coeff.shape[1], coeff.shape[2]
    if pages is None:
        cap = select_capacity(budget_tokens, page_size, block_table.shape[1], sink_pages, recent_pages)
        pages = torch.empty(batch, heads, cap, dtype=torch.int32, device=q.device)
    if counts is None:
        counts = torch.empty(batch, heads, dtype=torch.int32, device=q.device)
    op = _ops.select_pages_quant if isinstance(s, QuantSummaries) else _ops.select_pages
    op(q, *s, block_table, seq_lens, budget_tokens, sink_pages, recent_pages,
       _scale(scale, q.shape[-1]), pages, counts)
    return pages, counts


def _outs(q, out, lse):
    if out is None:
        out = torch.empty(q.shape, dtype=torch.float32, device=q.device)
    if lse is None:
        lse = torch.empty(q.shape[:2], dtype=torch.float32, device=q.device)
    return out, lse


def sparse_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                  block_table: torch.Tensor, seq_lens: torch.Tensor, pages: torch.Tensor,
                  counts: torch.Tensor, scale: float | None = None, out: torch.Tensor | None = None,
                  lse: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact attention over the selected pages; returns (out [B, Hq, d], lse [B, Hq])."""
    out, lse = _outs(q, out, lse)
    _ops.sparse_decode(q, k_cache, v_cache, block_table, seq_lens, pages, counts,
                       _scale(scale, q.shape[-1]), out, lse)
    return out, lse


def dense_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 block_table: torch.Tensor, seq_lens: torch.Tensor, scale: float | None = None,
                 out: torch.Tensor | None = None,
                 lse: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact attention over every page (FullKV on the paged cache)."""
    out, lse = _outs(q, out, lse)
    _ops.dense_decode(q, k_cache, v_cache, block_table, seq_lens, _scale(scale, q.shape[-1]), out, lse)
    return out, lse


# Fake implementations: the ops only mutate their out tensors, so there is nothing to compute;
# shapes are those the caller allocated.
@torch.library.register_fake("locks::summary_build")
def _summary_build_fake(k_cache, block_ids, mu, basis, coeff):
    return None


@torch.library.register_fake("locks::summary_update")
def _summary_update_fake(k_cache, block_table, seq_lens, mu, basis, coeff):
    return None


@torch.library.register_fake("locks::select_pages")
def _select_pages_fake(q, mu, basis, coeff, block_table, seq_lens, budget_tokens, sink_pages,
                       recent_pages, scale, pages, counts):
    torch._check(pages.shape[0] == q.shape[0] and counts.shape[0] == q.shape[0])
    return None


@torch.library.register_fake("locks::summary_build_quant")
def _summary_build_quant_fake(k_cache, block_ids, mu_q, mu_scale, basis_q, basis_scale, coeff_q, coeff_scale):
    return None


@torch.library.register_fake("locks::summary_update_quant")
def _summary_update_quant_fake(k_cache, block_table, seq_lens, mu_q, mu_scale, basis_q, basis_scale,
                               coeff_q, coeff_scale):
    return None


@torch.library.register_fake("locks::select_pages_quant")
def _select_pages_quant_fake(q, mu_q, mu_scale, basis_q, basis_scale, coeff_q, coeff_scale, block_table,
                             seq_lens, budget_tokens, sink_pages, recent_pages, scale, pages, counts):
    torch._check(pages.shape[0] == q.shape[0] and counts.shape[0] == q.shape[0])
    return None


@torch.library.register_fake("locks::sparse_decode")
def _sparse_decode_fake(q, k_cache, v_cache, block_table, seq_lens, pages, counts, scale, out, lse):
    torch._check(out.shape == q.shape)
    return None


@torch.library.register_fake("locks::dense_decode")
def _dense_decode_fake(q, k_cache, v_cache, block_table, seq_lens, scale, out, lse):
    torch._check(out.shape == q.shape)
    return None
