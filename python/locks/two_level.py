"""Two-level (super-page) LOCKS through the torch operators (include/locks/super_summary.h).

A super summary per group of S consecutive pages of a sequence (centroid, rank-R group basis,
per-page centroid coordinates, residual radii and key extents) lets a decode step score the
groups first and read page summaries only inside the best ones: at 1M tokens the step reads
~60x fewer bytes than dense instead of flat LOCKS's ~10x (docs/study_hierarchical.md).

Layouts (slots = super-page storage ids, H KV heads, d head_dim, S pages a group, R rank):
  supers        mu_q i8 [slots, H, d], mu_scale [slots, H], basis_q u8 [slots, H, R, d/2],
                basis_scale [slots, H, R], coord_q i8 [slots, H, S, R], coord_scale [slots, H, R],
                radius_q u8 [slots, H, S], radius_scale [slots, H], lo_q / hi_q i8 [slots, H, S, R],
                extent_scale [slots, H, R]   (the extent layout the plans use)
  super_table   [batch, max_groups] int32: the slot of group j of sequence b (complete groups)
Build them with super_build after a prefill (the complete groups) and super_update after each
decode step's K write (the group the last token completed); both run on the cache's device,
super_update without a host sync (graph-safe).
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from .ops import ALIGN, _check_devices, _ops, check_int, plan, precision_of


class SuperSummaries(NamedTuple):
    mu_q: torch.Tensor
    mu_scale: torch.Tensor
    basis_q: torch.Tensor
    basis_scale: torch.Tensor
    coord_q: torch.Tensor
    coord_scale: torch.Tensor
    radius_q: torch.Tensor
    radius_scale: torch.Tensor
    lo_q: torch.Tensor
    hi_q: torch.Tensor
    extent_scale: torch.Tensor


def new_supers(num_slots: int, num_kv_heads: int, head_dim: int, group_pages: int = 32,
               rank: int = 8, device: torch.device | str = "cpu") -> SuperSummaries:
    """Zeroed super summary storage (extent layout) for num_slots groups."""
    n = check_int("num_slots", num_slots, lo=1, hi=None)
    h, d = check_int("num_kv_heads", num_kv_heads, lo=1), check_int("head_dim", head_dim, lo=2)
    g, r = check_int("group_pages", group_pages, lo=2), check_int("rank", rank, lo=1)
    if d % 2:
        raise ValueError(f"locks: head_dim must be even, got {d}")
    z = lambda *s, dt=torch.float32: torch.zeros(*s, dtype=dt, device=device)  # noqa: E731
    i8, u8 = torch.int8, torch.uint8
    return SuperSummaries(z(n, h, d, dt=i8), z(n, h), z(n, h, r, d // 2, dt=u8), z(n, h, r),
                          z(n, h, g, r, dt=i8), z(n, h, r), z(n, h, g, dt=u8), z(n, h),
                          z(n, h, g, r, dt=i8), z(n, h, g, r, dt=i8), z(n, h, r))


def super_build(k_cache: torch.Tensor, group_blocks: torch.Tensor, slots: torch.Tensor,
                supers) -> None:
    """Build the super summaries of the groups group_blocks [n, S] (physical blocks, all full)
    into slots [n], every KV head, in place."""
    _ops.super_build(k_cache, group_blocks, slots, list(supers))


def super_update(k_cache: torch.Tensor, block_table: torch.Tensor, seq_lens: torch.Tensor,
                 super_table: torch.Tensor, supers) -> None:
    """After a decode step's K write (seq_lens after the append): build the group each
    sequence's last token completed into its slot of super_table. On the device, no host
    sync (graph-safe); the CPU refuses bad lengths, slots and block ids (ValueError)."""
    _ops.super_update(k_cache, block_table, seq_lens, super_table, list(supers))


def two_level_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, summaries,
                     supers, super_table: torch.Tensor, block_table: torch.Tensor,
                     seq_lens: torch.Tensor, budget_tokens: int = 2048, sink_pages: int = 0,
                     recent_pages: int = 0, alpha: float = 40.0, min_groups: int = 32,
                     flat_below_groups: int = 8, scale: float | None = None,
                     out: torch.Tensor | None = None, lse: torch.Tensor | None = None,
                     return_selection: bool = False):
    """The two-level step, one shot (plans and allocates its workspace per call): returns
    (out [B, Hq, d], lse [B, Hq]) and, with return_selection, (pages, counts) too."""
    if not isinstance(q, torch.Tensor) or q.dim() != 3:
        raise ValueError("q: expected [batch, num_q_heads, head_dim]")
    if not isinstance(k_cache, torch.Tensor) or k_cache.dim() != 4:
        raise ValueError("k_cache: expected [num_blocks, page_size, num_kv_heads, head_dim]")
    if not isinstance(block_table, torch.Tensor) or block_table.dim() != 2:
        raise ValueError("block_table: expected [batch, max_blocks_per_seq]")
    sup = list(supers)
    if len(sup) != 11:
        raise ValueError(f"supers: expected the 11 tensors of the extent layout, got {len(sup)}")
    prec = precision_of(summaries)
    coeff = summaries[4] if prec == "int4" else summaries[2]
    B, Hq, d = q.shape
    vec = plan(num_q_heads=Hq, num_kv_heads=k_cache.shape[2], head_dim=d,
               num_blocks=k_cache.shape[0], max_batch=max(1, B),
               max_blocks_per_seq=max(1, block_table.shape[1]), page_size=k_cache.shape[1],
               rank=coeff.shape[3], precision=prec, kv_dtype=k_cache.dtype,
               budget_tokens=budget_tokens, sink_pages=sink_pages, recent_pages=recent_pages,
               scale=scale, device=q.device, group_pages=sup[4].shape[2],
               super_slots=sup[0].shape[0], super_rank=sup[2].shape[2], alpha=alpha,
               min_groups=min_groups, flat_below_groups=flat_below_groups)
    ws = torch.empty(int(vec[0]) + ALIGN, dtype=torch.uint8, device=q.device)
    if out is None:
        out = torch.empty_like(q)
    if lse is None:
        lse = torch.empty(B, Hq, dtype=torch.float32, device=q.device)
    pages = counts = None
    if return_selection:
        H = k_cache.shape[2]
        pages = torch.empty(B, H, int(vec[1]), dtype=torch.int32, device=q.device)
        counts = torch.empty(B, H, dtype=torch.int32, device=q.device)
    _ops.decode_two_level(ws, vec, q, k_cache, v_cache, list(summaries), sup, super_table,
                          block_table, seq_lens, out, lse, pages, counts)
    return (out, lse, pages, counts) if return_selection else (out, lse)


@torch.library.register_fake("locks::super_build")
def _super_build_fake(k_cache, group_blocks, slots, supers):
    _check_devices("super_build", k_cache, group_blocks, slots, supers)


@torch.library.register_fake("locks::super_update")
def _super_update_fake(k_cache, block_table, seq_lens, super_table, supers):
    _check_devices("super_update", k_cache, block_table, seq_lens, super_table, supers)


@torch.library.register_fake("locks::decode_two_level")
def _decode_two_level_fake(workspace, plan, q, k_cache, v_cache, summaries, supers, super_table,
                           block_table, seq_lens, out, lse, pages=None, counts=None):
    _check_devices("decode_two_level", workspace, q, k_cache, v_cache, summaries, supers,
                   super_table, block_table, seq_lens, out, lse, pages, counts)
    torch._check(out.shape == q.shape)
