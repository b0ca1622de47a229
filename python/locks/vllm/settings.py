"""Settings of the LOCKS vLLM backend: `additional_config={"locks": {...}}` and/or
environment variables (the environment wins, so one `vllm serve` line can be varied per run).

vLLM has no per-backend options, so these ride on `additional_config` (a free-form dict every
process receives with the VllmConfig). Validation happens once, at start-up, with messages that
name the setting and what to do.
"""
from __future__ import annotations

import dataclasses
import math
import os
from typing import Any

PRECISIONS = ("int4", "fp32")
SPEC_SELECTIONS = ("token", "request")
SUPER_RANK = 8  # the two-level step's group basis rank (TwoLevelConfig's studied default)
FLAT_BELOW_GROUPS = 8  # TwoLevelConfig::flat_below_groups's default
LENGTH_BUCKETS_MAX = 8  # locks::cuda::kMaxLengthBuckets
BUCKET_MIN_PAGES = 2048  # the smallest length bucket's rows (32K tokens of 16): below, a step's
                         # grids are small whatever the plan


@dataclasses.dataclass(frozen=True)
class LocksSettings:
    budget: int = 2048        # tokens attended per (sequence, KV head) in a decode step
    rank: int = 8             # summary rank r (1 <= r < block size)
    precision: str = "int4"   # summary storage: int4 (836 B per page and head at d=128) or fp32
    sink_pages: int = 0       # first pages always attended
    recent_pages: int = 0     # last full pages always attended (the partial tail always is)
    # Decode stays dense (LOCKS dense kernel over every page) while the longest sequence of the
    # step is shorter than this. None = the budget: below the budget selection keeps every page
    # anyway, so that default costs nothing and changes nothing.
    min_context: int | None = None
    # Two-level LOCKS (include/locks/super_summary.h): 0 = off (flat LOCKS); S > 0 = a super
    # summary per group of S pages (S in [2, 64]; 32 is the studied default), built on the
    # device as groups fill, so that a step scores the groups first and reads page summaries
    # only inside the best ones. Pays at ~512K tokens and more (docs/vllm.md "Two-level").
    group_pages: int = 0
    alpha: float = 40.0       # level 1 keeps max(min_groups, ceil(alpha x budget pages / S)) groups
                              # besides the forced ones (TwoLevelConfig::alpha, >= 1)
    min_groups: int = 32      # TwoLevelConfig::min_groups (>= 1): the floor that keeps needles
                              # at budgets under ~400 tokens (docs/vllm.md "Two-level LOCKS")
    # Sequences shorter than this many tokens decode with flat LOCKS inside the two-level step
    # (every page summary scored; TwoLevelConfig::flat_below_groups = this / (block size x S),
    # rounded up to whole groups), where level 1 and the group choice would cost more than they
    # save. None = TwoLevelConfig's own floor (8 complete groups).
    two_level_min_context: int | None = None
    # Decode steps write K/V and rebuild the summaries of the blocks they complete in one launch
    # (locks.cache_write); False = vLLM's reshape_and_cache_flash, then a summary_update launch
    # (the two-launch path prefill steps always take; kept for A/B runs).
    fused_write: bool = True
    # Speculative decoding: how a verification step of 1 + k tokens a request selects pages.
    # "token": each token is a row that scores and selects on its own (the bits of the tokens
    # decoded one at a time; the summaries read 1 + k times). "request": one selection a request
    # from all its tokens' queries (share-averaged like a GQA group of G (1 + k) heads; the
    # summaries read once), each token attending over it with its own tail page; flat LOCKS on
    # uniform batches with G (1 + k) <= 32 and 1 + k <= the block size, "token" otherwise.
    spec_selection: str = "token"
    # Length buckets (flat LOCKS; include/locks/cuda/length_buckets.h): the decode step is planned
    # for max_model_len, its half, quarter, ... (this many plans, 1 = off; none below
    # BUCKET_MIN_PAGES pages a row), and each captured step runs the smallest plan that holds the
    # batch's longest row, so requests much shorter than max_model_len do not pay for its grids
    # (same results). Off by default: the CUDA-graph SWITCH node that picks the plan costs ~15 us
    # a layer on an H100, more than a long plan costs most rows (docs/vllm.md "Length buckets").
    length_buckets: int = 1

    @property
    def effective_min_context(self) -> int:
        return self.budget if self.min_context is None else self.min_context


ENV = {  # setting -> environment variable
    "budget": "LOCKS_BUDGET",
    "rank": "LOCKS_RANK",
    "precision": "LOCKS_PRECISION",
    "sink_pages": "LOCKS_SINK_PAGES",
    "recent_pages": "LOCKS_RECENT_PAGES",
    "min_context": "LOCKS_MIN_CONTEXT",
    "group_pages": "LOCKS_GROUP_PAGES",
    "alpha": "LOCKS_ALPHA",
    "min_groups": "LOCKS_MIN_GROUPS",
    "two_level_min_context": "LOCKS_TWO_LEVEL_MIN_CONTEXT",
    "fused_write": "LOCKS_FUSED_WRITE",
    "spec_selection": "LOCKS_SPEC_SELECTION",
    "length_buckets": "LOCKS_LENGTH_BUCKETS",
}


def _as_int(name: str, v: Any, source: str) -> int:
    if isinstance(v, bool):
        raise ValueError(f"locks setting {name!r} ({source}) must be an integer, got {v!r}")
    try:
        i = int(v)
    except (TypeError, ValueError):
        raise ValueError(f"locks setting {name!r} ({source}) must be an integer, got {v!r}") from None
    if isinstance(v, float) and v != i:
        raise ValueError(f"locks setting {name!r} ({source}) must be an integer, got {v!r}")
    return i


def _as_bool(name: str, v: Any, source: str) -> bool:
    if isinstance(v, bool):
        return v
    if isinstance(v, int) and v in (0, 1):
        return bool(v)
    if isinstance(v, str) and v.strip().lower() in ("1", "true", "0", "false"):
        return v.strip().lower() in ("1", "true")
    raise ValueError(f"locks setting {name!r} ({source}) must be true or false (or 1 / 0), got {v!r}")


def _as_float(name: str, v: Any, source: str) -> float:
    if isinstance(v, bool):
        raise ValueError(f"locks setting {name!r} ({source}) must be a number, got {v!r}")
    try:
        f = float(v)
    except (TypeError, ValueError):
        raise ValueError(f"locks setting {name!r} ({source}) must be a number, got {v!r}") from None
    if not math.isfinite(f):
        raise ValueError(f"locks setting {name!r} ({source}) must be finite, got {v!r}")
    return f


def parse_settings(additional_config: dict | None, environ: dict | None = None,
                   block_size: int = 16) -> LocksSettings:
    """Merge additional_config["locks"] and LOCKS_* environment variables; raise ValueError
    naming the setting on anything unknown or out of range."""
    environ = os.environ if environ is None else environ
    raw: dict[str, tuple[Any, str]] = {}
    cfg = (additional_config or {}).get("locks", {})
    if cfg is None:
        cfg = {}
    if not isinstance(cfg, dict):
        raise ValueError(f'additional_config["locks"] must be a dict of settings, got {type(cfg).__name__}')
    fields = {f.name for f in dataclasses.fields(LocksSettings)}
    for k, v in cfg.items():
        if k not in fields:
            raise ValueError(f'unknown locks setting {k!r} in additional_config["locks"]; '
                             f"known: {sorted(fields)}")
        raw[k] = (v, f'additional_config["locks"]["{k}"]')
    for k, var in ENV.items():
        if var in environ and environ[var] != "":
            raw[k] = (environ[var], f"environment {var}")
    vals: dict[str, Any] = {}
    for k, (v, src) in raw.items():
        if k == "precision":
            if v not in PRECISIONS:
                raise ValueError(f"locks setting 'precision' ({src}) must be one of {PRECISIONS}, got {v!r}")
            vals[k] = v
        elif k in ("min_context", "two_level_min_context") and (
                v is None or (isinstance(v, str) and v.lower() == "none")):
            vals[k] = None
        elif k == "alpha":
            vals[k] = _as_float(k, v, src)
        elif k == "fused_write":
            vals[k] = _as_bool(k, v, src)
        elif k == "spec_selection":
            if v not in SPEC_SELECTIONS:
                raise ValueError(f"locks setting 'spec_selection' ({src}) must be one of {SPEC_SELECTIONS}, "
                                 f"got {v!r}")
            vals[k] = v
        else:
            vals[k] = _as_int(k, v, src)
    s = LocksSettings(**vals)
    P = block_size
    if not 1 <= s.rank < P:
        raise ValueError(f"locks setting 'rank' must be in [1, block_size) = [1, {P}), got {s.rank}")
    if s.sink_pages < 0 or s.recent_pages < 0:
        raise ValueError(f"locks settings 'sink_pages'/'recent_pages' must be >= 0, got "
                         f"{s.sink_pages}/{s.recent_pages}")
    if s.budget // P < s.sink_pages + s.recent_pages + 1:
        raise ValueError(
            f"locks setting 'budget' = {s.budget} tokens gives {s.budget // P} pages of {P}: fewer than "
            f"sink_pages ({s.sink_pages}) + recent_pages ({s.recent_pages}) + 1 tail page; raise the "
            f"budget to at least {(s.sink_pages + s.recent_pages + 1) * P}")
    if not 1 <= s.length_buckets <= LENGTH_BUCKETS_MAX:
        raise ValueError(f"locks setting 'length_buckets' must be in [1, {LENGTH_BUCKETS_MAX}] (plans of "
                         f"max_model_len, its half, ...; 1 = off), got {s.length_buckets}")
    if s.min_context is not None and s.min_context < 0:
        raise ValueError(f"locks setting 'min_context' must be >= 0 or None, got {s.min_context}")
    if s.group_pages:
        if not 2 <= s.group_pages <= 64:
            raise ValueError(f"locks setting 'group_pages' must be 0 (flat LOCKS) or in [2, 64] (pages a "
                             f"super summary covers; the CUDA super build takes at most 64), got {s.group_pages}")
        if s.alpha < 1.0:
            raise ValueError(f"locks setting 'alpha' must be >= 1 (the kept groups must hold the budget), "
                             f"got {s.alpha}")
        if s.min_groups < 1:
            raise ValueError(f"locks setting 'min_groups' must be >= 1 (groups level 1 keeps at least), "
                             f"got {s.min_groups}")
        if s.two_level_min_context is not None and not 0 <= s.two_level_min_context < 2**31:
            raise ValueError(f"locks setting 'two_level_min_context' must be None or in [0, 2^31) tokens, "
                             f"got {s.two_level_min_context}")
        if s.effective_min_context > s.budget:
            raise ValueError(f"locks setting 'min_context' = {s.min_context} > budget {s.budget} with "
                             "group_pages > 0: the two-level step keeps a minimum context only up to the "
                             "budget; lower min_context or set group_pages to 0")
    return s


def flat_below_groups(s: LocksSettings, block_size: int = 16) -> int:
    """TwoLevelConfig::flat_below_groups for settings s: two_level_min_context in whole groups
    of block_size x group_pages tokens, rounded up (a sequence of L tokens has floor(L / (P S))
    complete groups, so it takes level 1 exactly when L >= that many groups' tokens); the
    config's default without the setting (or without two-level LOCKS)."""
    if not s.group_pages or s.two_level_min_context is None:
        return FLAT_BELOW_GROUPS
    return -(-s.two_level_min_context // (block_size * s.group_pages))


def two_level_plan(s: LocksSettings, num_blocks: int, block_size: int = 16) -> dict:
    """The two-level arguments of a plan under settings s (none for flat LOCKS): one super
    summary slot a KV-cache block (side_cache.SummaryGeometry)."""
    if not s.group_pages:
        return {}
    return dict(group_pages=s.group_pages, super_slots=num_blocks, super_rank=SUPER_RANK, alpha=s.alpha,
                min_groups=s.min_groups, flat_below_groups=flat_below_groups(s, block_size))


def length_bucket_plan(s: LocksSettings) -> dict:
    """The length-bucket arguments of a plan under settings s (none when off or with two-level
    LOCKS, whose step has no buckets)."""
    if s.group_pages or s.length_buckets == 1:
        return {}
    return dict(length_buckets=s.length_buckets, bucket_min_pages=BUCKET_MIN_PAGES)
