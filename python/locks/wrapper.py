"""`locks.DecodeWrapper`: plan once per batch shape (host side), run every step (graph-safe).

    ws = torch.empty(locks.workspace_bytes(**shape), dtype=torch.uint8, device="cuda")
    w = locks.DecodeWrapper(ws)
    w.plan(**shape)                      # once per shape: budget, page size, rank, heads, ...
    out, lse = w.run(q, k_cache, v_cache, summaries, block_table, seq_lens, out=out, lse=lse)

The workspace is the caller's (uint8, on the device the wrapper runs on); the plan is a
plain int list held by the wrapper. Nothing is cached anywhere else: dropping the wrapper
and the workspace frees everything. run() with caller-given out / lse / pages / counts
allocates nothing and syncs nothing, so it can be captured in a CUDA graph and replayed
with new queries, lengths, block tables and cache contents (same shapes as captured).
"""
from __future__ import annotations

import torch

from . import ops


def _device(d) -> torch.device:
    d = torch.device(d)
    if d.type == "cuda" and d.index is None:
        d = torch.device("cuda", torch.cuda.current_device())
    return d


class DecodeWrapper:
    def __init__(self, workspace: torch.Tensor):
        if not isinstance(workspace, torch.Tensor):
            raise TypeError(f"locks.DecodeWrapper: workspace must be a torch.Tensor, got {type(workspace).__name__}")
        if workspace.dtype != torch.uint8 or workspace.dim() != 1 or not workspace.is_contiguous():
            raise ValueError("locks.DecodeWrapper: workspace must be a contiguous 1-D uint8 tensor, got "
                             f"{workspace.dtype} of shape {tuple(workspace.shape)}")
        if workspace.device.type not in ops.BACKENDS:
            raise ValueError(f"locks.DecodeWrapper: workspace on {workspace.device}; cpu or cuda tensors only")
        self.workspace = workspace
        self._plan: list[int] | None = None
        self._buckets: list[int] | None = None
        self.params: dict = {}

    # -- host side ---------------------------------------------------------------------------
    def plan(self, *, num_q_heads: int, num_kv_heads: int, head_dim: int, num_blocks: int,
             max_batch: int, max_blocks_per_seq: int, page_size: int = 16, rank: int = 8,
             precision: str = "int4", kv_dtype: torch.dtype = torch.bfloat16,
             budget_tokens: int = 2048, sink_pages: int = 0, recent_pages: int = 0,
             scale: float | None = None, device=None, tau: float = 0.0,
             floor_pages: int = 1, dense_below: int = 0, group_pages: int = 0,
             super_slots: int = 0, super_rank: int = 8, alpha: float = 40.0,
             min_groups: int = 32, flat_below_groups: int = 8, length_buckets: int = 1,
             bucket_min_pages: int = 1) -> "DecodeWrapper":
        """Validate the shape and choose the kernels (once per batch shape; runs on the host,
        may query the GPU; never inside a graph capture). ValueError / NotImplementedError
        for a shape that is wrong / unsupported, ValueError when the workspace is too small.
        tau > 0 turns on the adaptive budget (locks.ops.plan): the selection's counts vary
        per step and KV head, its capacity (the budget's) does not. dense_below: sequences
        shorter than that many tokens attend every page (a minimum context, in-graph).
        group_pages > 0: a two-level plan (run_two_level; locks.two_level): super summaries of
        group_pages pages, super_slots of them stored, rank super_rank, alpha, min_groups,
        flat_below_groups (locks.ops.plan). length_buckets > 1 (CUDA, flat plans): select() runs
        over the plan's length buckets (locks.ops.length_buckets: the same step planned for
        max_blocks_per_seq, its half, quarter, ..., none below bucket_min_pages pages a row); a
        CUDA graph captured around it then runs, at each replay, the smallest bucket holding
        the batch's longest row, with the same results. The workspace must hold the largest
        bucket's plan (locks.workspace_bytes with the same arguments)."""
        dev = self.workspace.device if device is None else _device(device)
        if _device(dev) != _device(self.workspace.device):
            raise ValueError(f"locks.DecodeWrapper.plan: device {dev} differs from the workspace's "
                             f"{self.workspace.device}")
        params = dict(num_q_heads=num_q_heads, num_kv_heads=num_kv_heads, head_dim=head_dim,
                      num_blocks=num_blocks, max_batch=max_batch, max_blocks_per_seq=max_blocks_per_seq,
                      page_size=page_size, rank=rank, precision=precision, kv_dtype=kv_dtype,
                      budget_tokens=budget_tokens, sink_pages=sink_pages, recent_pages=recent_pages,
                      scale=scale, device=dev, tau=tau, floor_pages=floor_pages,
                      dense_below=dense_below)
        if group_pages:
            params.update(group_pages=group_pages, super_slots=super_slots, super_rank=super_rank,
                          alpha=alpha, min_groups=min_groups, flat_below_groups=flat_below_groups)
        p = ops.plan(**params)
        buckets = [p]
        if ops.check_int("length_buckets", length_buckets, lo=1) > 1:
            buckets = ops.length_buckets(p, length_buckets, bucket_min_pages, device=dev)
        need = max(ops.plan_workspace_bytes(v) for v in buckets)
        if self.workspace.numel() < need:
            raise ValueError(f"locks.DecodeWrapper.plan: the workspace has {self.workspace.numel()} bytes, "
                             f"this plan needs {need} (allocate locks.workspace_bytes(...) bytes)")
        self._plan, self.params = p, params
        # The buckets' plan vectors, concatenated (select_pages_bucketed); None for one.
        self._buckets = [x for v in buckets for x in v] if len(buckets) > 1 else None
        return self

    @classmethod
    def allocate(cls, **plan_kwargs) -> "DecodeWrapper":
        """A wrapper with a workspace of just the size the plan needs, planned."""
        dev = plan_kwargs.get("device") or "cpu"
        ws = torch.empty(ops.workspace_bytes(**plan_kwargs), dtype=torch.uint8, device=dev)
        return cls(ws).plan(**plan_kwargs)

    def _planned(self) -> list[int]:
        if self._plan is None:
            raise RuntimeError("locks.DecodeWrapper: call plan(...) before run(...)")
        return self._plan

    @property
    def capacity(self) -> int:
        """Page slots per (sequence, KV head) of a selection under this plan."""
        return ops.plan_capacity(self._planned())

    @property
    def plan_vector(self) -> list[int]:
        return list(self._planned())

    @property
    def length_buckets(self) -> list[list[int]]:
        """The plan vectors select() runs over (one: the plan itself)."""
        p = self._planned()
        if self._buckets is None:
            return [list(p)]
        return [self._buckets[i:i + len(p)] for i in range(0, len(self._buckets), len(p))]

    # -- run side (no allocation when outputs are given, no host sync) ------------------------
    def select(self, q, summaries, block_table, seq_lens, *, pages=None, counts=None,
               validate=False):
        """pages [B, H, capacity] (ascending block-table positions, -1 padded), counts [B, H].
        validate: check the device-side values first (validate_device_values: one host sync).
        q may be float32 or the model's float16 / bfloat16, out any of the three (default a new
        float32 tensor): an engine passes its own activations and output buffer, no copies."""
        p = self._planned()
        if validate:
            validate_device_values(block_table, seq_lens, page_size=self.params["page_size"],
                                   num_blocks=self.params["num_blocks"])
        B, H = q.shape[0], self.params["num_kv_heads"]
        if pages is None:
            pages = torch.empty(B, H, ops.plan_capacity(p), dtype=torch.int32, device=q.device)
        if counts is None:
            counts = torch.empty(B, H, dtype=torch.int32, device=q.device)
        if self._buckets is not None:
            torch.ops.locks.select_pages_bucketed(self.workspace, self._buckets, q, list(summaries),
                                                  block_table, seq_lens, pages, counts)
        else:
            torch.ops.locks.select_pages(self.workspace, p, q, list(summaries), block_table,
                                         seq_lens, pages, counts)
        return pages, counts

    def request_rows(self, req_pages, req_counts, req_seq_lens, seq_lens, tokens_per_request, *,
                     pages=None, counts=None):
        """A selection made once per request of tokens_per_request token rows (speculative
        verification) as each row's (ops.request_rows; the planned page size): for attend."""
        return ops.request_rows(req_pages, req_counts, req_seq_lens, seq_lens, tokens_per_request,
                                self.params["page_size"], pages=pages, counts=counts)

    def attend(self, q, k_cache, v_cache, block_table, seq_lens, *, pages=None, counts=None,
               out=None, lse=None, validate=False):
        """Exact attention over the selection (pages, counts) or, with neither, every page.
        validate: check the device-side values first (validate_device_values: one host sync)."""
        p = self._planned()
        if validate:
            validate_device_values(block_table, seq_lens, page_size=self.params["page_size"],
                                   num_blocks=self.params["num_blocks"], pages=pages, counts=counts,
                                   capacity=ops.plan_capacity(p))
        if out is None:
            out = torch.empty(q.shape, dtype=torch.float32, device=q.device)
        if lse is None:
            lse = torch.empty(q.shape[:2], dtype=torch.float32, device=q.device)
        torch.ops.locks.decode_attention(self.workspace, p, q, k_cache, v_cache, block_table,
                                         seq_lens, pages, counts, out, lse)
        return out, lse

    def run(self, q, k_cache, v_cache, summaries, block_table, seq_lens, *, out=None, lse=None,
            pages=None, counts=None, dense=False, check_finite=False, validate=False):
        """One decode step: select pages from the summaries under the planned budget, then
        exact attention over them (dense=True: over every page, summaries unused). Returns
        (out [B, Hq, d], float32 unless given, lse [B, Hq]). check_finite: raise ValueError when q or the
        caches hold NaN/Inf (a host sync and a pass over the caches: debugging, eager only).
        validate: raise ValueError naming the tensor and the first bad index when a block id of
        a used page, a length, a selected page or a count is out of range (one host sync per
        step; skipped while a CUDA graph is being captured). Without it the CUDA kernels
        never read out of bounds either, but write such rows as NaN (docs/bad_input.md)."""
        if check_finite:
            check_all_finite(q=q, k_cache=k_cache, v_cache=v_cache)
        if dense:
            return self.attend(q, k_cache, v_cache, block_table, seq_lens, out=out, lse=lse,
                               validate=validate)
        pages, counts = self.select(q, summaries, block_table, seq_lens, pages=pages, counts=counts,
                                    validate=validate)
        return self.attend(q, k_cache, v_cache, block_table, seq_lens, pages=pages, counts=counts,
                           out=out, lse=lse, validate=validate)


    def run_two_level(self, q, k_cache, v_cache, summaries, supers, super_table, block_table,
                      seq_lens, *, out=None, lse=None, pages=None, counts=None):
        """One two-level decode step under a two-level plan (group_pages > 0): level 1 over the
        super summaries, the kept groups' page summaries, selection, exact attention (the
        selection written to pages / counts when given). Returns (out, lse)."""
        p = self._planned()
        if not self.params.get("group_pages"):
            raise ValueError("locks.DecodeWrapper.run_two_level: plan with group_pages > 0 first")
        if out is None:
            out = torch.empty(q.shape, dtype=torch.float32, device=q.device)
        if lse is None:
            lse = torch.empty(q.shape[:2], dtype=torch.float32, device=q.device)
        torch.ops.locks.decode_two_level(self.workspace, p, q, k_cache, v_cache, list(summaries),
                                         list(supers), super_table, block_table, seq_lens, out,
                                         lse, pages, counts)
        return out, lse


def check_all_finite(**tensors: torch.Tensor) -> None:
    """ValueError naming the first tensor holding NaN or Inf (syncs with the device)."""
    for name, t in tensors.items():
        if t is not None and t.is_floating_point() and not bool(torch.isfinite(t).all()):
            raise ValueError(f"locks: {name} holds NaN or Inf (check_finite)")


def _capturing(*tensors) -> bool:
    return any(t is not None and t.is_cuda for t in tensors) and torch.cuda.is_current_stream_capturing()


def _first_bad(name: str, bad: torch.Tensor, values: torch.Tensor, what: str) -> ValueError:
    idx = tuple(int(i) for i in torch.nonzero(bad)[0].tolist())  # failure path only: a second sync
    at = ", ".join(str(i) for i in idx)
    return ValueError(f"locks (validate): {name}[{at}] = {int(values[idx])} {what}")


def validate_device_values(block_table: torch.Tensor, seq_lens: torch.Tensor, *, page_size: int,
                           num_blocks: int, pages: torch.Tensor | None = None,
                           counts: torch.Tensor | None = None, capacity: int | None = None,
                           slot_mapping: torch.Tensor | None = None,
                           block_ids: torch.Tensor | None = None) -> None:
    """Eager check of the values the kernels read on the device (validate=True): seq_lens in
    [1, block_table.size(1) * page_size], the block ids of every used page (ceil(len / P)
    per sequence) in [0, num_blocks), counts in [0, capacity], the first counts entries of
    pages in [0, pages of that sequence), slot_mapping -1 or in [0, num_blocks * P), the
    block_ids of a bulk summary build in [0, num_blocks). Torch
    ops and one host sync; ValueError naming the tensor and the first bad index. A no-op
    while the current CUDA stream is capturing a graph (a sync is illegal there)."""
    if _capturing(block_table, seq_lens, pages, counts, slot_mapping, block_ids):
        return
    checks = []  # (name, bad mask, values, what)
    if block_table is not None and seq_lens is not None:
        mb = block_table.shape[1]
        lens = seq_lens.to(torch.int64)
        checks.append(("seq_lens", (lens < 1) | (lens > mb * page_size), seq_lens,
                       f"is outside [1, {mb * page_size}] (max_blocks_per_seq {mb} x page_size {page_size})"))
        n_pages = (lens.clamp(0, mb * page_size) + page_size - 1) // page_size  # [B]
        pos = torch.arange(mb, device=block_table.device)
        used = pos[None, :] < n_pages[:, None]
        bt = block_table.to(torch.int64)
        checks.append(("block_table", used & ((bt < 0) | (bt >= num_blocks)), block_table,
                       f"(a used page) is outside [0, {num_blocks})"))
        if counts is not None:
            cap = pages.shape[-1] if capacity is None and pages is not None else capacity
            c = counts.to(torch.int64)
            checks.append(("counts", (c < 0) | (c > cap), counts, f"is outside [0, {cap}]"))
            if pages is not None:
                k = torch.arange(pages.shape[-1], device=pages.device)
                live = k[None, None, :] < c.clamp(0, cap)[:, :, None]
                pg = pages.to(torch.int64)
                checks.append(("pages", live & ((pg < 0) | (pg >= n_pages[:, None, None])), pages,
                               "(a counted entry) is outside [0, pages of its sequence)"))
    if slot_mapping is not None:
        sm = slot_mapping.to(torch.int64)
        checks.append(("slot_mapping", (sm < -1) | (sm >= num_blocks * page_size), slot_mapping,
                       f"is neither -1 nor in [0, {num_blocks * page_size})"))
    if block_ids is not None:
        ids = block_ids.to(torch.int64)
        checks.append(("block_ids", (ids < 0) | (ids >= num_blocks), block_ids,
                       f"is outside [0, {num_blocks})"))
    if not checks:
        return
    flags = torch.stack([c[1].any() for c in checks]).tolist()  # the one sync
    for (name, bad, values, what), f in zip(checks, flags):
        if f:
            raise _first_bad(name, bad, values, what)
