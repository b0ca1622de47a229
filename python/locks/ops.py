"""Python face of the `locks` torch operators (python/csrc/ops_schema.cpp).

The operators are thin launchers over the C++ decode contract (include/locks/contract.h):
they write into caller-provided tensors, take their scratch memory from a caller-owned
workspace and their kernel choices from a plan vector (int[]) made once per batch shape,
and keep no state. `locks.DecodeWrapper` (wrapper.py) is the usual way to call them; the
functions here are the building blocks. Every operator has a fake implementation so that
torch.compile can trace a decode step that calls it.

Layouts (include/locks/kv_cache.h, summary.h):
  k_cache, v_cache  [num_blocks, page_size, num_kv_heads, head_dim]  float32/float16/bfloat16
  block_table       [batch, max_blocks_per_seq] int32,  seq_lens [batch] int32
  summaries (fp32)  mu [num_blocks, H, d], basis [num_blocks, H, r, d], coeff [num_blocks, H, P, r]
  summaries (int4)  mu_q i8 [N, H, d], mu_scale [N, H], basis_q u8 [N, H, r, d/2],
                    basis_scale [N, H, r, d/g], coeff_q i8 [N, H, P, r], coeff_scale [N, H, r]
                    (g: dims per int4 basis scale, default_basis_group(d): 32 at d >= 256,
                    d below; plans take the default)
  q                 [batch, num_q_heads, head_dim] float32, float16 or bfloat16 (read as float)
  out, lse          [batch, num_q_heads, head_dim] float32 / float16 / bfloat16 (rounded once
                    from the fp32 result), [batch, num_q_heads] float32
  pages, counts     [batch, H, capacity] int32 (ascending, -1 padded), [batch, H] int32
The summaries' precision is read from their dtypes.

Bad input: ValueError (wrong call), TypeError (wrong Python type), NotImplementedError
(a shape the backend lacks: supports() says which), RuntimeError (CUDA failure).
"""
from __future__ import annotations

import numbers
from typing import NamedTuple, Sequence

import torch

_ops = torch.ops.locks

INT_MAX = 2**31 - 1
BACKENDS = {"cpu": 0, "cuda": 1}
PRECISIONS = {"fp32": 0, "int4": 1}
KV_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
ALIGN = 256  # the contract's workspace alignment; workspace_bytes() includes this slack


class Summaries(NamedTuple):
    mu: torch.Tensor
    basis: torch.Tensor
    coeff: torch.Tensor


class QuantSummaries(NamedTuple):
    """int8 centroid, int4 basis (two a byte, low nibble = even dim; one scale per
    basis_group dims of a row), int8 coefficients."""
    mu_q: torch.Tensor
    mu_scale: torch.Tensor
    basis_q: torch.Tensor
    basis_scale: torch.Tensor
    coeff_q: torch.Tensor
    coeff_scale: torch.Tensor


# -- argument checks --------------------------------------------------------------------------
def check_int(name: str, value, lo: int | None = None, hi: int | None = INT_MAX,
              where: str = "locks", why: str | None = None) -> int:
    """An int argument: TypeError unless a Python/numpy integer (bool, float and str are
    refused: 16.0 and '16' are not page sizes), ValueError outside [lo, hi]; every int ends
    in a C++ int, so hi defaults to 2^31 - 1 (the operators re-check with a checked
    conversion)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{where}: {name} must be an int, got {type(value).__name__} {value!r}")
    v = int(value)
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        rng = f"[{lo if lo is not None else '-inf'}, {hi if hi is not None else 'inf'}]"
        raise ValueError(f"{where}: {why or name + ' must be in ' + rng}, got {v}")
    return v


def check_tau(tau, where: str = "locks") -> float:
    """The adaptive budget's mass share: 0 (fixed budget) or a real in (0, 1]; NaN, bool
    and str are refused (the plan re-checks in C++: include/locks/rules.h tau_valid)."""
    if isinstance(tau, bool) or not isinstance(tau, numbers.Real):
        raise TypeError(f"{where}: tau must be a float, got {type(tau).__name__} {tau!r}")
    t = float(tau)
    if not (t == 0.0 or 0.0 < t <= 1.0):
        raise ValueError(f"{where}: tau must be 0 (fixed budget) or in (0, 1], got {t}")
    return t


def _alpha(a) -> float:
    if isinstance(a, bool) or not isinstance(a, numbers.Real):
        raise TypeError(f"locks: alpha must be a float, got {type(a).__name__}")
    if not (a >= 1.0 and a != float("inf")):
        raise ValueError(f"locks: alpha must be finite and >= 1, got {a}")
    return float(a)


def _backend(b) -> str:
    """'cpu' / 'cuda' from a backend name or a device."""
    try:
        name = b if b in BACKENDS else torch.device(b).type
    except (TypeError, RuntimeError):
        name = None
    if name not in BACKENDS:
        raise ValueError(f"locks: backend must be 'cpu' or 'cuda' (or a device), got {b!r}")
    return name


def _precision(p: str) -> int:
    if not isinstance(p, str) or p not in PRECISIONS:
        raise ValueError(f"locks: precision must be one of {tuple(PRECISIONS)}, got {p!r}")
    return PRECISIONS[p]


def _kv_dtype(t) -> torch.dtype:
    if t not in KV_DTYPES:
        raise ValueError(f"locks: kv_dtype must be one of {KV_DTYPES}, got {t!r}")
    return t


def precision_of(summaries: Sequence[torch.Tensor]) -> str:
    """'fp32' or 'int4', from the number and dtypes of the summary tensors (either list may end
    with the query weights of query-weighted summaries: 4 or 7 tensors)."""
    n = len(summaries)
    if n in (3, 4) and summaries[0].dtype == torch.float32:
        return "fp32"
    if n in (6, 7) and summaries[0].dtype == torch.int8:
        return "int4"
    raise ValueError("locks: summaries must be 3 float32 tensors (mu, basis, coeff) or 6 int4-mode "
                     "tensors (mu_q, mu_scale, basis_q, basis_scale, coeff_q, coeff_scale), "
                     "optionally followed by the query weights [num_kv_heads, head_dim]")


def qweight_from_queries(q_obs: torch.Tensor, num_kv_heads: int, floor: float = 1e-2) -> torch.Tensor:
    """Query weights of query-weighted summaries (include/locks/summary.h, docs/method.md) from
    observed queries q_obs [n, num_q_heads, head_dim] (e.g. a prompt's last 32 positions): per KV
    head and channel the RMS over its group's queries, floored at `floor` x the mean power.
    Host work (the C++ definition, locks::qweight_from_queries); returns float32 [num_kv_heads,
    head_dim] on q_obs's device. Append it to the summaries list to use it."""
    check_int("num_kv_heads", num_kv_heads, lo=1)
    if not isinstance(q_obs, torch.Tensor) or q_obs.dim() != 3:
        raise ValueError("locks: q_obs must be a [n, num_q_heads, head_dim] tensor")
    w = _ops.qweight_from_queries(q_obs.detach().float().cpu().contiguous(), num_kv_heads, float(floor))
    return w.to(q_obs.device)


def with_qweight(summaries, qweight: torch.Tensor | None) -> list:
    """The summaries list for the ops, ending with the query weights when given."""
    s = list(summaries)
    return s if qweight is None else s + [qweight]


# -- capability, plan, workspace --------------------------------------------------------------
def supports(backend, *, head_dim: int, page_size: int = 16, group: int = 1,
             kv_dtype: torch.dtype = torch.bfloat16, rank: int = 8,
             precision: str = "int4") -> tuple[bool, str]:
    """Can `backend` ('cpu' / 'cuda' or a device) run the decode step on this shape?
    (ok, reason): the C++ capability query (include/locks/support.h), also answered by
    builds without CUDA."""
    reason = _ops.supports(BACKENDS[_backend(backend)],
                           check_int("head_dim", head_dim), check_int("page_size", page_size),
                           check_int("group", group), _kv_dtype(kv_dtype),
                           check_int("rank", rank), _precision(precision))
    return (reason == "", reason)


def plan(*, num_q_heads: int, num_kv_heads: int, head_dim: int, num_blocks: int, max_batch: int,
         max_blocks_per_seq: int, page_size: int = 16, rank: int = 8, precision: str = "int4",
         kv_dtype: torch.dtype = torch.bfloat16, budget_tokens: int = 2048, sink_pages: int = 0,
         recent_pages: int = 0, scale: float | None = None, device="cpu", tau: float = 0.0,
         floor_pages: int = 1, dense_below: int = 0, group_pages: int = 0, super_slots: int = 0,
         super_rank: int = 8, alpha: float = 40.0, min_groups: int = 32,
         flat_below_groups: int = 8) -> list[int]:
    """The plan vector for one batch shape (host side; on CUDA it queries `device` once).
    Element 0 is the workspace size the backend needs, element 1 the selection capacity.
    tau > 0: the adaptive budget (include/locks/select.h): of the budget's scored pages, the
    fewest (at least floor_pages) whose estimated mass covers tau of the estimated total.
    dense_below > 0: a minimum context; sequences shorter than that many tokens attend every
    page inside the same step (and graph), longer ones select (the capacity grows to hold the
    short ones' pages: select_capacity).
    group_pages > 0: a two-level plan for decode_two_level (locks.two_level): S pages a super-page,
    super_slots super summaries stored, super_rank their rank, alpha the kept groups' share,
    min_groups the fewest groups level 1 keeps (TwoLevelConfig; the default 32 keeps needles at
    budgets under ~400 tokens: docs/study_hierarchical.md "On a task suite"), flat_below_groups:
    sequences with fewer complete groups score every page inside the same kernels (TwoLevelConfig;
    the level-2 list grows to hold their pages), where level 1 would cost more than it saves."""
    backend = _backend(device)
    if scale is None:
        scale = 0.0  # the plan resolves 0 to 1/sqrt(head_dim)
    elif isinstance(scale, bool) or not isinstance(scale, numbers.Real):
        raise TypeError(f"locks: scale must be a float or None, got {type(scale).__name__}")
    args = (BACKENDS[backend], check_int("num_blocks", num_blocks, lo=1, hi=None),
            check_int("page_size", page_size, lo=1), check_int("num_kv_heads", num_kv_heads, lo=1),
            check_int("head_dim", head_dim, lo=1), _kv_dtype(kv_dtype), check_int("rank", rank, lo=1),
            _precision(precision), check_int("num_q_heads", num_q_heads, lo=1),
            check_int("max_batch", max_batch, lo=1),
            check_int("max_blocks_per_seq", max_blocks_per_seq, lo=1),
            check_int("budget_tokens", budget_tokens, lo=0), check_int("sink_pages", sink_pages, lo=0),
            check_int("recent_pages", recent_pages, lo=0), float(scale), check_tau(tau),
            check_int("floor_pages", floor_pages, lo=0), check_int("dense_below", dense_below, lo=0),
            check_int("group_pages", group_pages, lo=0), check_int("super_slots", super_slots, lo=0),
            check_int("super_rank", super_rank, lo=1), _alpha(alpha),
            check_int("min_groups", min_groups, lo=1),
            check_int("flat_below_groups", flat_below_groups, lo=0))
    if backend == "cuda":
        with torch.cuda.device(torch.device(device)):
            return list(_ops.plan(*args))
    return list(_ops.plan(*args))


def length_buckets(plan_vector: Sequence[int], max_buckets: int, min_pages: int = 1,
                   device=None) -> list[list[int]]:
    """The length buckets of a plan (include/locks/cuda/length_buckets.h): the plan vectors of
    the same step for max_blocks_per_seq M, M / 2, M / 4, ... pages a row (ascending, at most
    max_buckets, none below min_pages, the given plan last; halving stops where the selection
    capacity would shrink). A step run through them under CUDA graph capture
    (DecodeWrapper.plan(length_buckets=...)) costs what the batch's longest row needs, not what
    the plan's max_blocks_per_seq allows; the results are the same bits. A CPU plan is its own
    one bucket. device: the CUDA device the plan was made for (its SM count and occupancy)."""
    v = [int(x) for x in plan_vector]
    k, m = check_int("max_buckets", max_buckets, lo=1), check_int("min_pages", min_pages, lo=1)
    if device is not None and torch.device(device).type == "cuda":
        with torch.cuda.device(torch.device(device)):
            flat = list(_ops.length_buckets(v, k, m))
    else:
        flat = list(_ops.length_buckets(v, k, m))
    n = len(v)
    return [flat[i:i + n] for i in range(0, len(flat), n)]


_plan_buckets = length_buckets  # (workspace_bytes' argument of the same name hides it)


def workspace_bytes(*, length_buckets: int = 1, bucket_min_pages: int = 1, **plan_kwargs) -> int:
    """Bytes of workspace a DecodeWrapper planned with these arguments needs (the plan's
    own size plus ALIGN bytes of slack: the operators align the start to 256 bytes); with
    length_buckets > 1 the largest bucket's (one workspace serves every bucket)."""
    p = plan(**plan_kwargs)
    if check_int("length_buckets", length_buckets, lo=1) == 1:
        return p[0] + ALIGN
    plans = _plan_buckets(p, length_buckets, bucket_min_pages, device=plan_kwargs.get("device"))
    return max(v[0] for v in plans) + ALIGN


def plan_capacity(plan_vector: Sequence[int]) -> int:
    return int(plan_vector[1])


def plan_workspace_bytes(plan_vector: Sequence[int]) -> int:
    return int(plan_vector[0]) + ALIGN


def select_capacity(budget_tokens: int, page_size: int, max_blocks_per_seq: int,
                    sink_pages: int = 0, recent_pages: int = 0, dense_below: int = 0) -> int:
    """Page slots per (sequence, KV head) for a budget: include/locks/rules.h's select_capacity
    (plain Python so that torch.compile traces it; the plan computes the same in C++): the
    budget's ceil(b / P), or every page of a sequence of dense_below - 1 tokens if more."""
    check_int("budget_tokens", budget_tokens, lo=0)
    check_int("sink_pages", sink_pages, lo=0)
    check_int("recent_pages", recent_pages, lo=0)
    if budget_tokens // page_size < sink_pages + recent_pages + 1:
        raise ValueError(
            f"locks: budget of {budget_tokens} tokens gives {budget_tokens // page_size} pages of "
            f"{page_size}, fewer than sink ({sink_pages}) + recent ({recent_pages}) + 1 tail page")
    check_int("dense_below", dense_below, lo=0)
    by_dense = -(-(dense_below - 1) // page_size) if dense_below > 1 else 0
    return min(max(-(-budget_tokens // page_size), by_dense), max_blocks_per_seq)


# -- summaries --------------------------------------------------------------------------------
def default_basis_group(head_dim: int) -> int:
    """Dims per int4 basis scale of the library's layout (include/locks/summary.h
    default_basis_group, which the plans use): 32 at head_dim >= 256, one scale a row below
    (at 128 group scales cost the scorer ~19% for no measured recall gain)."""
    d = check_int("head_dim", head_dim, lo=1)
    return 32 if d >= 256 and d % 32 == 0 else d


def new_summaries(num_blocks: int, num_kv_heads: int, head_dim: int, page_size: int = 16,
                  rank: int = 8, device: torch.device | str = "cpu",
                  precision: str = "fp32", basis_group: int | None = None) -> Summaries | QuantSummaries:
    """Zeroed summary storage for a cache of num_blocks pages; precision "fp32" or "int4".
    basis_group (int4): dims per basis scale, an even divisor of head_dim; None = the default
    (default_basis_group), the only one the plans (DecodeWrapper) take."""
    check_int("page_size", page_size, lo=2)
    check_int("rank", rank, lo=1, hi=page_size - 1, why=f"rank must be in [1, page_size) = [1, {page_size})")
    n, h = check_int("num_blocks", num_blocks, lo=1, hi=None), check_int("num_kv_heads", num_kv_heads, lo=1)
    d = check_int("head_dim", head_dim, lo=1)
    _precision(precision)
    g = default_basis_group(d) if basis_group is None else check_int("basis_group", basis_group, lo=2)
    if d % g or g % 2:
        raise ValueError(f"locks: basis_group must be an even divisor of head_dim {d}, got {g}")
    z = lambda *s, dt=torch.float32: torch.zeros(*s, dtype=dt, device=device)  # noqa: E731
    if precision == "fp32":
        return Summaries(z(n, h, d), z(n, h, rank, d), z(n, h, page_size, rank))
    return QuantSummaries(z(n, h, d, dt=torch.int8), z(n, h),
                          z(n, h, rank, d // 2, dt=torch.uint8), z(n, h, rank, d // g),
                          z(n, h, page_size, rank, dt=torch.int8), z(n, h, rank))


def summary_build(k_cache: torch.Tensor, block_ids: torch.Tensor, summaries, *,
                  validate: bool = False) -> None:
    """Build the summaries of the given (full) physical blocks, every KV head, in place.
    Non-finite keys are refused (ValueError on CPU; docs/python.md, NaN policy).
    validate: ValueError for a block id outside [0, num_blocks) (one host sync; without it
    the CUDA build skips such ids, docs/bad_input.md)."""
    if validate and isinstance(block_ids, torch.Tensor) and isinstance(k_cache, torch.Tensor):
        from .wrapper import validate_device_values

        validate_device_values(None, None, page_size=k_cache.shape[1], num_blocks=k_cache.shape[0],
                               block_ids=block_ids)
    _ops.summary_build(k_cache, block_ids, list(summaries))


def summary_update(k_cache: torch.Tensor, block_table: torch.Tensor, seq_lens: torch.Tensor,
                   summaries, slot_mapping: torch.Tensor | None = None, *,
                   validate: bool = False) -> None:
    """After this step's K writes: rebuild the summary of each page that just filled. With
    slot_mapping (int32 slots written this step, block * P + offset, -1 = padding): every
    block whose last slot was written; without: the page each sequence's last token
    completed (seq_lens after the append). On the device, no host sync: graph-safe.
    validate: ValueError for a bad length, block id of a used page or slot (one host sync;
    without it the CUDA build skips them, docs/bad_input.md)."""
    if validate and isinstance(k_cache, torch.Tensor) and k_cache.dim() == 4:
        from .wrapper import validate_device_values

        validate_device_values(None if slot_mapping is not None else block_table,
                               None if slot_mapping is not None else seq_lens,
                               page_size=k_cache.shape[1], num_blocks=k_cache.shape[0],
                               slot_mapping=slot_mapping)
    _ops.summary_update(k_cache, block_table, seq_lens, slot_mapping, list(summaries))


def cache_write(key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor,
                v_cache: torch.Tensor, slot_mapping: torch.Tensor, summaries=None, *,
                validate: bool = False) -> None:
    """A step's cache write and summary update in one op: token i's key / value rows
    ([n, num_kv_heads, head_dim] in the cache's dtype, head dim contiguous; views into a fused
    QKV output are fine) go to slot slot_mapping[i] (int32, block * P + offset, -1 = padding;
    where several tokens name one slot the last one stays), then, with summaries, every block
    whose last slot was named is rebuilt from the cache after the writes: the same bits as the
    writes followed by summary_update(..., slot_mapping=slot_mapping). CUDA: one launch, no
    host sync (graph-safe), made for decode steps (each (token, KV head) block reads the n
    slots: O(n^2)); slots outside the cache are skipped there (the CPU refuses them).
    validate: ValueError for such a slot on any device (one host sync)."""
    if validate and isinstance(k_cache, torch.Tensor) and k_cache.dim() == 4:
        from .wrapper import validate_device_values

        validate_device_values(None, None, page_size=k_cache.shape[1], num_blocks=k_cache.shape[0],
                               slot_mapping=slot_mapping)
    _ops.cache_write(key, value, k_cache, v_cache, slot_mapping,
                     list(summaries) if summaries is not None else [])


# -- one-shot helpers (plan per call: eager use and tests; loops and graphs: DecodeWrapper) ---
def _one_shot(q, block_table, **kw):
    from .wrapper import DecodeWrapper

    if not isinstance(q, torch.Tensor) or q.dim() != 3:
        raise ValueError("q: expected [batch, num_q_heads, head_dim]")
    if not isinstance(block_table, torch.Tensor) or block_table.dim() != 2:
        raise ValueError("block_table: expected [batch, max_blocks_per_seq]")
    return DecodeWrapper.allocate(num_q_heads=q.shape[1], head_dim=q.shape[2],
                                  max_batch=max(1, q.shape[0]),
                                  max_blocks_per_seq=max(1, block_table.shape[1]),
                                  device=q.device, **kw)


def select_pages(q: torch.Tensor, s, block_table: torch.Tensor, seq_lens: torch.Tensor,
                 budget_tokens: int, sink_pages: int = 0, recent_pages: int = 0,
                 scale: float | None = None, pages: torch.Tensor | None = None,
                 counts: torch.Tensor | None = None,
                 kv_dtype: torch.dtype = torch.bfloat16, tau: float = 0.0,
                 floor_pages: int = 1, dense_below: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Score pages from summaries, share-average over GQA groups, select under the budget
    (plans and allocates a workspace per call); sequences shorter than dense_below tokens
    keep every page."""
    prec = precision_of(s)
    coeff = s[4] if prec == "int4" else s[2]  # [N, H, P, r]
    w = _one_shot(q, block_table, num_kv_heads=coeff.shape[1], page_size=coeff.shape[2],
                  rank=coeff.shape[3], precision=prec, kv_dtype=kv_dtype, num_blocks=coeff.shape[0],
                  budget_tokens=budget_tokens, sink_pages=sink_pages, recent_pages=recent_pages,
                  scale=scale, tau=tau, floor_pages=floor_pages, dense_below=dense_below)
    return w.select(q, s, block_table, seq_lens, pages=pages, counts=counts)


def request_rows(req_pages: torch.Tensor, req_counts: torch.Tensor, req_seq_lens: torch.Tensor,
                 seq_lens: torch.Tensor, tokens_per_request: int, page_size: int = 16,
                 pages: torch.Tensor | None = None,
                 counts: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Speculative verification with one selection a request (include/locks/request_rows.h):
    the selection req_pages [S, H, C] / req_counts [S, H], made at req_seq_lens [S] tokens, as
    the lists of the S x tokens_per_request token rows of lengths seq_lens (row s T + t of
    request s): each keeps the request's pages up to its own last page, and that page.
    pages [S T, H, C' >= C] / counts [S T, H] (new tensors when not given)."""
    n, (S, H, C) = seq_lens.shape[0], req_pages.shape
    if pages is None:
        pages = torch.empty(n, H, C, dtype=torch.int32, device=req_pages.device)
    if counts is None:
        counts = torch.empty(n, H, dtype=torch.int32, device=req_pages.device)
    torch.ops.locks.request_rows(req_pages, req_counts, req_seq_lens, seq_lens,
                                 tokens_per_request, page_size, pages, counts)
    return pages, counts


def _attention(q, k_cache, v_cache, block_table, seq_lens, pages, counts, scale, out, lse):
    if not isinstance(k_cache, torch.Tensor) or k_cache.dim() != 4:
        raise ValueError("k_cache: expected [num_blocks, page_size, num_kv_heads, head_dim]")
    P = k_cache.shape[1]
    cap = pages.shape[2] if pages is not None else block_table.shape[1]
    # Attention needs no summaries: rank 1 fp32 is any valid layout; the budget is the one
    # whose capacity is the selection's.
    w = _one_shot(q, block_table, num_kv_heads=k_cache.shape[2], page_size=P, rank=1,
                  precision="fp32", kv_dtype=k_cache.dtype, num_blocks=k_cache.shape[0],
                  budget_tokens=max(cap, 1) * P, scale=scale)
    return w.attend(q, k_cache, v_cache, block_table, seq_lens, pages=pages, counts=counts,
                    out=out, lse=lse)


def sparse_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                  block_table: torch.Tensor, seq_lens: torch.Tensor, pages: torch.Tensor,
                  counts: torch.Tensor, scale: float | None = None, out: torch.Tensor | None = None,
                  lse: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact attention over the selected pages; returns (out [B, Hq, d], lse [B, Hq])."""
    if pages is None or counts is None:
        raise ValueError("sparse_decode: pages and counts are required (dense_decode for all pages)")
    return _attention(q, k_cache, v_cache, block_table, seq_lens, pages, counts, scale, out, lse)


def dense_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 block_table: torch.Tensor, seq_lens: torch.Tensor, scale: float | None = None,
                 out: torch.Tensor | None = None,
                 lse: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact attention over every page (FullKV on the paged cache)."""
    return _attention(q, k_cache, v_cache, block_table, seq_lens, None, None, scale, out, lse)


# -- fake implementations ---------------------------------------------------------------------
# The ops only mutate their out tensors, so there is nothing to compute; shapes are those the
# caller allocated. They also keep the C++ rule for real (non-fake) tensors: a call mixing
# meta tensors with real ones, or on real meta tensors, is a ValueError, not a no-op that
# leaves uninitialised outputs.
def _check_devices(op: str, *tensors) -> None:
    from torch._subclasses.fake_tensor import FakeTensor

    flat = []
    for t in tensors:
        if isinstance(t, (list, tuple)):
            flat += [x for x in t if isinstance(x, torch.Tensor)]
        elif isinstance(t, torch.Tensor):
            flat.append(t)
    devices = {t.device for t in flat}
    if len(devices) > 1:
        raise ValueError(f"locks.{op}: tensors on mixed devices {sorted(map(str, devices))}")
    if any(t.device.type == "meta" and not isinstance(t, FakeTensor) for t in flat):
        raise ValueError(f"locks.{op}: tensors on the meta device have no data; pass real tensors "
                         "(tracing uses fake tensors)")


@torch.library.register_fake("locks::summary_build")
def _summary_build_fake(k_cache, block_ids, summaries):
    _check_devices("summary_build", k_cache, block_ids, summaries)


@torch.library.register_fake("locks::summary_update")
def _summary_update_fake(k_cache, block_table, seq_lens, slot_mapping, summaries):
    _check_devices("summary_update", k_cache, block_table, seq_lens, slot_mapping, summaries)


@torch.library.register_fake("locks::cache_write")
def _cache_write_fake(key, value, k_cache, v_cache, slot_mapping, summaries):
    _check_devices("cache_write", key, value, k_cache, v_cache, slot_mapping, summaries)


@torch.library.register_fake("locks::select_pages")
def _select_pages_fake(workspace, plan, q, summaries, block_table, seq_lens, pages, counts):
    _check_devices("select_pages", workspace, q, summaries, block_table, seq_lens, pages, counts)
    torch._check(pages.shape[0] == q.shape[0] and counts.shape[0] == q.shape[0])


@torch.library.register_fake("locks::select_pages_bucketed")
def _select_pages_bucketed_fake(workspace, plans, q, summaries, block_table, seq_lens, pages,
                                counts):
    _check_devices("select_pages_bucketed", workspace, q, summaries, block_table, seq_lens, pages,
                   counts)
    torch._check(pages.shape[0] == q.shape[0] and counts.shape[0] == q.shape[0])


@torch.library.register_fake("locks::request_rows")
def _request_rows_fake(req_pages, req_counts, req_seq_lens, seq_lens, tokens_per_request,
                       page_size, pages, counts):
    _check_devices("request_rows", req_pages, req_counts, req_seq_lens, seq_lens, pages, counts)
    torch._check(pages.shape[0] == seq_lens.shape[0] and counts.shape[0] == seq_lens.shape[0])


@torch.library.register_fake("locks::decode_attention")
def _decode_attention_fake(workspace, plan, q, k_cache, v_cache, block_table, seq_lens, pages,
                           counts, out, lse):
    _check_devices("decode_attention", workspace, q, k_cache, v_cache, block_table, seq_lens,
                   pages, counts, out, lse)
    torch._check(out.shape == q.shape)
