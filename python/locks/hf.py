"""Hugging Face transformers drop-in: `locks.hf.enable(model, budget=2048)` makes
`model.generate` decode with LOCKS.

- `LocksCache` (a transformers `Cache`) keeps each layer's K/V in the paged layout of
  include/locks/kv_cache.h ([num_blocks, page_size, num_kv_heads, head_dim], a block table
  and lengths per sequence) and the fp32 page summaries beside it, built in bulk after the
  prefill and for each page as it fills during decode. There is no second full copy of the
  cache: the paged tensors are the cache.
- The attention function registered as attn_implementation="locks" runs the prefill densely
  (transformers' SDPA path) and every decode step with LOCKS: select pages from the
  summaries under the token budget, exact attention over the selected pages (torch ops of
  locks.ops over the C++ core).
- Left-padded batches (generate's batching) are stored without their padding: each
  sequence's pages hold only its real tokens.

Supported: decoder-only models whose attention modules call `cache.update(...)` and then the
configured attention function with (module, query, key, value, attention_mask, scaling=...),
with RoPE applied before caching (Llama, Mistral without sliding window, Qwen2/3, OLMo-2, Granite,
Phi-3, Gemma, SmolLM2, ...: each checked exact at full budget in tests/python/test_hf_architectures.py), head_dim, GQA group, dtype as `locks.supports(device, ...)` answers for the device. transformers >= 5.0, < 6 (tested: see docs/python.md).
Hybrid models (config.layer_types mixing "full_attention" and "sliding_attention", e.g.
Gemma-3): LOCKS serves the full-attention layers; the sliding-window layers keep
transformers' own cache layer (DynamicSlidingWindowLayer) and attention (SDPA under the
model's sliding-window mask), exactly as without LOCKS: a window of 512 tokens is already
cheap to read, and selecting inside it would only lose accuracy.
Refused with a clear error (ValueError; NotImplementedError for a shape the backend lacks):
models whose every layer is sliding-window (no layer_types, sliding_window set), any other
layer type (linear attention, SSM, chunked attention), encoder-decoder models, budgets below
(sink + recent + 1) pages, and attention that is not plain softmax attention over the cached
keys — logit soft-capping (Gemma-2), learned attention sinks (gpt-oss), additive position
biases (ALiBi), named in the config or declared by the model class (`_supports_sdpa = False`:
Gemma-2 / -4, gpt-oss, ...) at enable(), or passed to the attention call (at the first call of a
LOCKS layer, before anything is cached). Attention calls without a LocksCache
(a plain forward, a DynamicCache passed explicitly) fall back to dense SDPA with a warning.
"""
from __future__ import annotations

import copy
import functools
import inspect
import numbers
import warnings
from dataclasses import dataclass

import torch

from . import ops, selectors, two_level
from .selectors import SELECTORS
from .wrapper import DecodeWrapper, check_all_finite

try:
    from transformers.cache_utils import Cache, CacheLayerMixin, DynamicSlidingWindowLayer
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
except ImportError as e:  # pragma: no cover - exercised only without transformers
    raise ImportError(f"locks.hf needs transformers >= 5.0, < 6 ({e})") from e

ATTN_NAME = "locks"
# Selectors that decode several tokens a step after the prefill (assisted / prompt-lookup
# decoding: each token a row of its own); the baselines keep one token a step.
MULTI_TOKEN_SELECTORS = ("locks", "locks_h2", "fullkv")
PRECISIONS = ("int4", "fp32")


@dataclass(frozen=True)
class LocksConfig:
    """budget: tokens attended per decode step (None: dense decode over the paged cache).
    sink_pages / recent_pages: first / last full pages always kept, inside the budget.
    tau / floor_pages: the adaptive budget (include/locks/select.h): tau > 0 attends, per step
    and KV head, only the fewest best-scored pages (at least floor_pages) whose estimated mass
    covers tau of the estimated total; the budget is the ceiling. LOCKS selector only.
    check_finite: check each decode step's new K/V and query for NaN/Inf and raise instead of
    decoding (a host sync per step: eager only, off by default; docs/python.md, NaN policy)."""

    budget: int | None = 2048
    page_size: int = 16
    rank: int = 8
    precision: str = "int4"  # summaries: "int4" (int8 centroid, int4 basis, int8 coeff) or "fp32"
    sink_pages: int = 0
    recent_pages: int = 0
    tau: float = 0.0  # 0: fixed budget
    floor_pages: int = 1
    reserve_tokens: int = 256  # decode room allocated after the prefill (grows as needed)
    check_finite: bool = False
    # which pages to attend: "locks" (the summaries), or a baseline for research through the
    # same budget path: "oracle", "quest", "shadowkv", "rocketkv", "fullkv" (locks/selectors.py)
    selector: str = "locks"
    # the baselines' options, as the harness's (src/eval, SelectorParams; docs/python.md):
    shadow_chunk: int = 8  # shadowkv: tokens per landmark (must divide page_size)
    shadow_outlier_share: float = 1.0 / 64  # shadowkv: share of full pages forced in as outliers
    rocket_dims: int = 0  # rocketkv: query channels scored per head (0: head_dim / 4)
    snapkv_keep: float = 4.0  # rocketkv: SnapKV keeps ceil(keep * budget / page_size) prompt pages
    snapkv_pool: int = 7  # rocketkv: SnapKV's max-pool kernel (tokens; pool // 2 each side)
    # query-weighted summaries (docs/method.md): each layer's page bases fit the key deviations
    # in the metric of its queries, calibrated from the prompt's last `obs_window` queries at
    # prefill (per KV head and channel: their RMS); False: the plain summaries. None (auto): on
    # at head_dim 256, where it was measured to close most of the gap to the oracle (Gemma-3's
    # global layers at 32K: 0.044 -> 0.028 mean recall at b >= 512), off at head_dim <= 128,
    # where it cost recall at small budgets (SmolLM2 8K: -0.016 at b 128, -0.007 at b 512).
    query_weighted: bool | None = None
    obs_window: int = 32
    # selector "locks_h2" (two-level LOCKS, docs/study_hierarchical.md): a super summary per
    # group_pages pages (rank 8, extent layout), the best groups' pages scored from their page
    # summaries; alpha: kept groups cover alpha x the budget's page slots; min_groups: the
    # fewest kept groups (TwoLevelConfig; the default 32 keeps needles at budgets under ~400
    # tokens, where alpha alone keeps fewer: docs/study_hierarchical.md "On a task suite");
    # flat_below_groups: sequences with fewer complete groups score every page (flat LOCKS
    # inside the same step), where level 1 would cost more than it saves.
    group_pages: int = 32
    alpha: float = 40.0
    min_groups: int = 32
    flat_below_groups: int = 8

    def weighted_for(self, head_dim: int) -> bool:
        """Whether a layer of this head_dim builds query-weighted summaries."""
        return head_dim >= 256 if self.query_weighted is None else self.query_weighted

    def validate(self) -> None:
        """TypeError for a wrong type (bool is not an int, 16.0 is not an int), ValueError for a
        value out of range; called by enable() and LocksCache() before anything else."""
        from .ops import check_int, check_tau

        check_int("page_size", self.page_size, lo=2, hi=256, where="locks")
        check_int("rank", self.rank, lo=1, hi=self.page_size - 1, where="locks",
                  why="rank must be in [1, page_size)")
        check_int("sink_pages", self.sink_pages, lo=0, where="locks")
        check_int("recent_pages", self.recent_pages, lo=0, where="locks")
        check_int("reserve_tokens", self.reserve_tokens, lo=0, where="locks")
        check_tau(self.tau, where="locks")
        check_int("floor_pages", self.floor_pages, lo=0, where="locks")
        if not isinstance(self.precision, str) or self.precision not in PRECISIONS:
            raise ValueError(f"locks: precision must be one of {PRECISIONS}, got {self.precision!r}")
        if not isinstance(self.selector, str) or self.selector not in SELECTORS:
            raise ValueError(f"locks: selector must be one of {SELECTORS}, got {self.selector!r}")
        check_int("shadow_chunk", self.shadow_chunk, lo=1, hi=self.page_size, where="locks")
        if self.page_size % self.shadow_chunk:
            raise ValueError(f"locks: shadow_chunk must divide page_size {self.page_size}, got {self.shadow_chunk}")
        check_int("rocket_dims", self.rocket_dims, lo=0, where="locks",
                  why="rocket_dims must be >= 0 (0: head_dim / 4)")
        check_int("snapkv_pool", self.snapkv_pool, lo=0, where="locks")
        for name, ok, rng in (("shadow_outlier_share", lambda v: 0 <= v <= 1, "[0, 1]"),
                              ("snapkv_keep", lambda v: 0 < v < float("inf"), "(0, inf)")):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, numbers.Real):
                raise TypeError(f"locks: {name} must be a float, got {type(v).__name__} {v!r}")
            if not ok(float(v)):  # NaN fails too
                raise ValueError(f"locks: {name} must be in {rng}, got {v}")
        if not isinstance(self.check_finite, bool):
            raise TypeError(f"locks: check_finite must be a bool, got {type(self.check_finite).__name__}")
        if self.query_weighted is not None and not isinstance(self.query_weighted, bool):
            raise TypeError(f"locks: query_weighted must be a bool or None (auto), got "
                            f"{type(self.query_weighted).__name__}")
        check_int("obs_window", self.obs_window, lo=1, where="locks")
        check_int("group_pages", self.group_pages, lo=2, hi=256, where="locks")
        if isinstance(self.alpha, bool) or not isinstance(self.alpha, numbers.Real):
            raise TypeError(f"locks: alpha must be a float, got {type(self.alpha).__name__}")
        if not 1.0 <= float(self.alpha) < float("inf"):
            raise ValueError(f"locks: alpha must be finite and >= 1, got {self.alpha}")
        check_int("min_groups", self.min_groups, lo=1, where="locks")
        check_int("flat_below_groups", self.flat_below_groups, lo=0, where="locks")
        if self.budget is not None:
            check_int("budget", self.budget, lo=1, where="locks")
            need = (self.sink_pages + self.recent_pages + 1) * self.page_size
            if self.budget < need:
                raise ValueError(
                    f"locks: budget {self.budget} is too small: it must hold sink_pages "
                    f"({self.sink_pages}) + recent_pages ({self.recent_pages}) + the tail page, "
                    f"i.e. at least {need} tokens with page_size {self.page_size}")
        if self.tau > 0:
            if self.budget is None or self.selector != "locks":
                raise ValueError("locks: tau > 0 (the adaptive budget) needs a budget and the "
                                 f"'locks' selector, got budget {self.budget}, selector {self.selector!r}")
            slots = self.budget // self.page_size - self.sink_pages - self.recent_pages - 1
            if self.floor_pages > slots:
                raise ValueError(f"locks: floor_pages must be in [0, {slots}] (the budget's pages "
                                 f"beyond sink + recent + tail), got {self.floor_pages}")


# The attention function needs the cache that update() was just called on; transformers calls
# cache.update(...) and then the attention function for the same layer, in order, so the cache
# records itself here (eager decoding, one generate at a time per thread).
_ACTIVE: dict = {}


class _Plans:
    """The DecodeWrappers of one LocksCache, one per distinct layer shape (layers of the same
    shape share it and its workspace: they run one after another on the same stream). Owned
    by the cache, never global: a wrapper no layer uses any more (after a _grow) is dropped,
    so memory is bounded by the shapes in use now."""

    def __init__(self):
        self.wrappers: dict = {}
        self.key_of: dict = {}
        self.slots = 0

    def new_slot(self) -> int:
        self.slots += 1
        return self.slots

    def wrapper(self, layer: int, params: dict) -> DecodeWrapper:
        key = tuple(sorted((k, str(v)) for k, v in params.items()))
        self.key_of[layer] = key
        if key not in self.wrappers:
            self.wrappers[key] = DecodeWrapper.allocate(**params)
        live = set(self.key_of.values())
        for k in [k for k in self.wrappers if k not in live]:
            del self.wrappers[k]
        return self.wrappers[key]


class LocksLayer(CacheLayerMixin):
    """One attention layer's paged K/V and page summaries."""

    is_sliding = False
    is_compileable = False
    is_croppable = True  # assisted / prompt-lookup decoding roll back rejected drafts (crop)

    def __init__(self, cfg: LocksConfig, plans: _Plans | None = None):
        super().__init__()
        self.cfg = cfg
        self._plans = plans if plans is not None else _Plans()
        self._slot = self._plans.new_slot()
        self._wrapper = None
        self._plan_params = None
        self.seen = 0  # positions processed, padding included (what transformers counts)
        self.pending = None  # prefill K/V, stored once the attention function knows the padding
        self.k_pages = self.v_pages = None
        self.summaries = None
        self.supers = self.super_table = None  # selector "locks_h2": super summaries, slots
        self.qweight = None  # [H, d] query weights (query-weighted summaries), set at prefill
        self.block_table = self.seq_lens = None
        self.lens: list[int] = []
        self.max_blocks = 0
        self.last_counts = None  # pages selected per (sequence, KV head) at the last decode step
        # the prompt's last obs_window queries [B, w, Hq, d] and lengths, kept at the prefill
        # (rocketkv's SnapKV eviction; about w * group / (2 * length) of the cache's bytes)
        self.q_obs = None
        self.prompt_lens = None
        self._snap = None  # rocketkv: (key, SnapKV page weights [B, H, blocks]), first decode step
        self._page_stats = None  # (key, shadowkv landmarks + cosines / rocketkv min-max of the pages)

    # -- transformers' layer API ---------------------------------------------------------
    def lazy_initialization(self, key_states, value_states):
        self.device, self.dtype = key_states.device, key_states.dtype
        self.is_initialized = True

    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        q_len = key_states.shape[2]
        if self.k_pages is None:
            if self.pending is not None:
                raise RuntimeError(
                    "locks: the prefill K/V were never stored: the model must run with "
                    "attn_implementation='locks' (use locks.hf.enable(model, ...))")
            self.pending = (key_states, value_states)
            self.seen += q_len
            return key_states, value_states
        if q_len != 1 and self.cfg.selector not in MULTI_TOKEN_SELECTORS:
            raise NotImplementedError(
                f"locks: after the prefill, selector {self.cfg.selector!r} takes one token per "
                f"sequence and step (got {q_len}); assisted / prompt-lookup decoding runs with "
                f"{', '.join(MULTI_TOKEN_SELECTORS)}")
        # Several tokens a step (assisted / prompt-lookup decoding's verification): one write of
        # all of them and one rebuild of every page they complete; decode() gives each token its
        # own causal row.
        self._append(key_states, value_states)
        self.seen += q_len
        return key_states, value_states

    def crop(self, tokens_to_remove: int) -> None:
        """Roll back the last tokens (assisted / prompt-lookup decoding's rejected drafts): a
        negative count removes that many (transformers >= 5.2x), a positive value is the older
        API's absolute length. The rows' lengths shrink; the rolled-back slots are overwritten
        by the next tokens, and a page's (super) summary is rebuilt whenever a token completes
        it again, so a summary built from a rejected draft is never read (a page is scored only
        once complete within a row's length)."""
        n = -tokens_to_remove if tokens_to_remove <= 0 else self.seen - tokens_to_remove
        if n <= 0:
            return
        if self.k_pages is None:  # before the prefill was stored
            if self.pending is not None:
                k, v = self.pending
                self.pending = (k[:, :, : k.shape[2] - n], v[:, :, : v.shape[2] - n])
            self.seen = max(self.seen - n, 0)
            return
        if n >= min(self.lens):
            raise ValueError(f"locks: crop of {n} tokens would empty a sequence (lengths {self.lens})")
        self.lens = [x - n for x in self.lens]
        self.seq_lens -= n
        self.seen -= n
        self._page_stats = None

    def get_mask_sizes(self, query_length) -> tuple[int, int]:
        if isinstance(query_length, torch.Tensor):  # transformers 5.0-5.x passed cache_position
            query_length = query_length.shape[0]
        return self.seen + query_length, 0

    def get_seq_length(self) -> int:
        return self.seen

    def get_max_length(self) -> int:
        return -1

    get_max_cache_shape = get_max_length  # name in transformers 5.0

    def reset(self) -> None:
        plans, slot = self._plans, self._slot
        self.__init__(self.cfg, plans)
        self._slot = slot

    def reorder_cache(self, beam_idx):
        raise NotImplementedError("locks: beam search is not supported by LocksCache")

    # -- paged storage -------------------------------------------------------------------
    def _allocate(self, batch: int, heads: int, head_dim: int, max_tokens: int) -> None:
        P = self.cfg.page_size
        self.max_blocks = max(1, -(-max_tokens // P))
        n = batch * self.max_blocks
        dev = self.device
        self.k_pages = torch.zeros(n, P, heads, head_dim, dtype=self.dtype, device=dev)
        self.v_pages = torch.zeros_like(self.k_pages)
        self.summaries = ops.new_summaries(n, heads, head_dim, P, self.cfg.rank, dev, self.cfg.precision)
        # sequence b owns blocks [b * max_blocks, (b + 1) * max_blocks)
        self.block_table = torch.arange(n, dtype=torch.int32, device=dev).view(batch, self.max_blocks)
        self.supers = self.super_table = None
        if self.cfg.selector == "locks_h2":
            self._allocate_supers()

    def _allocate_supers(self) -> None:
        """Zeroed super summaries for the storage (selector "locks_h2"): group j of sequence b in
        slot b * groups + j."""
        B, groups = self.block_table.shape[0], -(-self.max_blocks // self.cfg.group_pages)
        _, _, H, d = self.k_pages.shape
        self.supers = two_level.new_supers(B * groups, H, d, self.cfg.group_pages, 8, self.device)
        self.super_table = torch.arange(B * groups, dtype=torch.int32, device=self.device).view(B, groups)

    def _build_supers(self) -> None:
        """The super summaries of every complete group (after a prefill, or a change of config)."""
        S, P, groups = self.cfg.group_pages, self.cfg.page_size, self.super_table.shape[1]
        done = [(b, j) for b, n in enumerate(self.lens) for j in range(n // P // S)]
        if done:
            blocks = torch.stack([self.block_table[b, j * S:(j + 1) * S] for b, j in done])
            slots = torch.tensor([b * groups + j for b, j in done], dtype=torch.int32, device=self.device)
            two_level.super_build(self.k_pages, blocks.contiguous(), slots, self.supers)

    def use_config(self, cfg: LocksConfig) -> None:
        """Decode under cfg from now on (LocksCache.with_config): super summaries built or
        dropped to match its selector."""
        self.cfg = cfg
        self._plan_params = None
        if self.k_pages is None:
            return
        if cfg.selector != "locks_h2":
            self.supers = self.super_table = None
        elif self.supers is None or self.supers.coord_q.shape[2] != cfg.group_pages:
            self._allocate_supers()
            self._build_supers()

    def _grow(self, max_tokens: int) -> None:
        """Re-allocate with room for max_tokens per sequence, keeping contents (eager only)."""
        B, old = len(self.lens), self.max_blocks
        k, v, s, sup = self.k_pages, self.v_pages, self.summaries, self.supers
        self._allocate(B, k.shape[2], k.shape[3], max(max_tokens, 2 * old * self.cfg.page_size))
        for new_t, old_t in [(self.k_pages, k), (self.v_pages, v), *zip(self.summaries, s)]:
            new_t.view(B, self.max_blocks, *new_t.shape[1:])[:, :old] = old_t.view(B, old, *old_t.shape[1:])
        if sup is not None:
            g_old, g_new = sup[0].shape[0] // B, self.supers[0].shape[0] // B
            for new_t, old_t in zip(self.supers, sup):
                new_t.view(B, g_new, *new_t.shape[1:])[:, :g_old] = old_t.view(B, g_old, *old_t.shape[1:])

    def summary_list(self) -> list:
        """The summaries as the ops take them: the storage tensors, then the query weights."""
        return ops.with_qweight(self.summaries, self.qweight)

    def _calibrate(self, query: torch.Tensor, H: int) -> None:
        """Query weights from the prompt's last obs_window positions (query [B, Hq, S, d]; rows
        are left-padded, so the last min(lens) positions are real tokens of every row)."""
        w = min(self.cfg.obs_window, min(self.lens))
        if w < 1:
            return
        B, Hq, S, d = query.shape
        q_obs = query[:, :, S - w:].permute(0, 2, 1, 3).reshape(B * w, Hq, d)
        self.qweight = ops.qweight_from_queries(q_obs, H)

    def commit_prefill(self, first_valid: list[int], num_q_heads: int, scaling: float,
                       query: torch.Tensor | None = None) -> None:
        """Store the prefill's K/V (row b's real tokens start at first_valid[b]), calibrate the
        query weights from `query` (query-weighted summaries), build the summaries of every full
        page and plan the decode step (host work done here, so that a later decode step can be
        captured in a CUDA graph)."""
        key, value = self.pending
        self.pending = None
        B, H, S, d = key.shape
        if num_q_heads % H:
            raise ValueError(f"locks: {num_q_heads} query heads are not a multiple of {H} KV heads")
        require_supported(key.device, head_dim=d, page_size=self.cfg.page_size, group=num_q_heads // H,
                          kv_dtype=key.dtype, rank=self.cfg.rank, precision=self.cfg.precision)
        if self.cfg.check_finite:
            check_all_finite(prefill_keys=key, prefill_values=value)
        self.lens = [S - f for f in first_valid]
        self._allocate(B, H, d, max(self.lens) + self.cfg.reserve_tokens)
        P = self.cfg.page_size
        kt = self.k_pages.view(B, -1, H, d)
        vt = self.v_pages.view(B, -1, H, d)
        full = []
        for b, f in enumerate(first_valid):
            n = S - f
            kt[b, :n] = key[b, :, f:].transpose(0, 1)
            vt[b, :n] = value[b, :, f:].transpose(0, 1)
            full += [b * self.max_blocks + j for j in range(n // P)]
        self.seq_lens = torch.tensor(self.lens, dtype=torch.int32, device=self.device)
        self.prompt_lens = self.seq_lens.clone()
        w = min(self.cfg.obs_window, min(self.lens))
        if query is not None and w >= 1:  # rows are left-padded: the last w positions are real
            self.q_obs = query[:, :, query.shape[2] - w:].transpose(1, 2).contiguous()
        summarised = self.cfg.selector in ("locks", "locks_h2")
        if summarised and self.cfg.weighted_for(d) and query is not None:
            self._calibrate(query, H)
        if full and summarised:
            ops.summary_build(self.k_pages, torch.tensor(full, dtype=torch.int32, device=self.device),
                              self.summary_list())
        if self.supers is not None:
            self._build_supers()
        self._planned(num_q_heads, scaling)

    def _append(self, k: torch.Tensor, v: torch.Tensor) -> None:
        """T new tokens per sequence (k, v: [B, H, T, d]; T > 1: assisted / prompt-lookup
        verification) at positions seq_lens .. seq_lens + T - 1 (on the device: no host sync),
        one write each for K and V; then the summaries of the pages they complete: by lengths
        for one token, else by the slots written (every page whose last slot is among them: the
        bits of T one-token appends, the same filled-page build). Super summaries (two level)
        are updated per token, each with the lengths after that token, since super_update builds
        only the group a sequence's last token completed."""
        B, H, T, d = k.shape
        if max(self.lens) + T > self.max_blocks * self.cfg.page_size:
            self._grow(max(self.lens) + T + self.cfg.reserve_tokens)
        if self.cfg.check_finite:
            check_all_finite(new_key=k, new_value=v)
        rows = torch.arange(B, device=self.device)[:, None]
        pos = self.seq_lens.long()[:, None] + torch.arange(T, device=self.device)  # [B, T]
        self.k_pages.view(B, -1, H, d)[rows, pos] = k.transpose(1, 2).to(self.dtype)
        self.v_pages.view(B, -1, H, d)[rows, pos] = v.transpose(1, 2).to(self.dtype)
        self.seq_lens += T
        self.lens = [n + T for n in self.lens]
        if self.cfg.selector in ("locks", "locks_h2"):  # the baselines read the keys, not summaries
            # sequence b owns blocks [b * max_blocks, (b + 1) * max_blocks): its token i is slot
            # b * max_blocks * P + i
            slots = None if T == 1 else (
                (rows * (self.max_blocks * self.cfg.page_size) + pos).view(-1).to(torch.int32))
            ops.summary_update(self.k_pages, self.block_table, self.seq_lens, self.summary_list(),
                               slot_mapping=slots)
        if self.supers is not None:
            for t in range(T):
                two_level.super_update(self.k_pages, self.block_table, self.seq_lens - (T - 1 - t),
                                       self.super_table, self.supers)

    # -- decode attention ----------------------------------------------------------------
    def _planned(self, num_q_heads: int, scaling: float, rows: int | None = None) -> DecodeWrapper:
        """The wrapper planned for the current storage shape (re-planned after a _grow;
        planning is host work, done eagerly before any graph capture of a decode step)."""
        P = self.cfg.page_size
        n, _, H, d = self.k_pages.shape
        budget = self.cfg.budget if self.cfg.budget is not None else self.max_blocks * P
        params = dict(num_q_heads=num_q_heads, num_kv_heads=H, head_dim=d, num_blocks=n,
                      max_batch=rows or len(self.lens), max_blocks_per_seq=self.max_blocks, page_size=P,
                      rank=self.cfg.rank, precision=self.cfg.precision, kv_dtype=self.dtype,
                      budget_tokens=budget, sink_pages=self.cfg.sink_pages,
                      recent_pages=self.cfg.recent_pages, scale=float(scaling), device=self.device,
                      tau=self.cfg.tau, floor_pages=self.cfg.floor_pages)
        if self.supers is not None and self.cfg.budget is not None:
            params.update(group_pages=self.cfg.group_pages, super_slots=self.supers[0].shape[0],
                          super_rank=self.supers.basis_q.shape[2], alpha=float(self.cfg.alpha),
                          min_groups=self.cfg.min_groups,
                          flat_below_groups=self.cfg.flat_below_groups)
        if params != self._plan_params:
            self._wrapper = self._plans.wrapper(self._slot, params)
            self._plan_params = params
        return self._wrapper

    def _selector_options(self, sel: str, scaling: float) -> dict:
        """The options of a baseline selector (selectors.select), its state built here."""
        if sel not in ("shadowkv", "rocketkv"):
            return {}
        # Per-page statistics of the full pages' keys (a full page's keys never change): kept
        # until a page fills or the storage grows, so a step reads them instead of every key.
        P = self.cfg.page_size
        key = (sel, self.cfg.shadow_chunk, self.max_blocks, tuple(n // P for n in self.lens))
        if self._page_stats is None or self._page_stats[0] != key:
            if sel == "shadowkv":
                stats = dict(landmarks=selectors.shadowkv_landmarks(self.k_pages, self.block_table, key[1]),
                             cosine=selectors.shadowkv_page_cosine(self.k_pages, self.block_table, key[1]))
            else:
                stats = dict(minmax=selectors.page_minmax(self.k_pages, self.block_table))
            self._page_stats = (key, stats)
        if sel == "shadowkv":
            return dict(chunk=self.cfg.shadow_chunk, outlier_share=self.cfg.shadow_outlier_share,
                        **self._page_stats[1])
        opts = dict(dims=self.cfg.rocket_dims, keep=self.cfg.snapkv_keep, **self._page_stats[1])
        if self.q_obs is None:  # no prompt queries (an empty window): no eviction
            return opts
        key = (self.cfg.snapkv_pool, scaling)
        if self._snap is None or self._snap[0] != key:  # the first decode step
            self._snap = (key, selectors.snapkv_weights(self.q_obs, self.k_pages, self.block_table,
                                                        self.prompt_lens, scaling, self.cfg.snapkv_pool))
        snap = self._snap[1]
        if snap.shape[-1] < self.max_blocks:  # grown since: the new blocks hold no prompt page
            snap = torch.nn.functional.pad(snap, (0, self.max_blocks - snap.shape[-1]), value=float("-inf"))
        return dict(opts, snap=snap, prompt_lens=self.prompt_lens, obs=self.q_obs.shape[1])

    def decode(self, query: torch.Tensor, scaling: float) -> torch.Tensor:
        """query [B, Hq, T, d] -> attention output [B, T, Hq, d] in query's dtype. T > 1
        (assisted / prompt-lookup verification, the T tokens already appended): token t of
        sequence b is a row of its own, with b's pages and the causal length L_b - (T - 1 - t),
        so each gives the bits it would give decoded alone."""
        B, _, T, _ = query.shape
        if T > 1:
            q = query.transpose(1, 2).reshape(B * T, query.shape[1], query.shape[3])
            back = (T - 1 - torch.arange(T, device=self.device, dtype=torch.int32)).repeat(B)
            rows = (self.block_table.repeat_interleave(T, 0), self.seq_lens.repeat_interleave(T, 0) - back,
                    None if self.super_table is None else self.super_table.repeat_interleave(T, 0))
            return self._decode_rows(q, query.dtype, scaling, *rows).view(B, T, *q.shape[1:])
        # The ops read the model's dtype and a strided query (each row's [Hq, d] contiguous)
        # and write the output in it: no conversion copies.
        q = query[:, :, 0]
        if q.stride(-1) != 1 or q.stride(-2) != q.shape[-1]:
            q = q.contiguous()
        return self._decode_rows(q, query.dtype, scaling, self.block_table, self.seq_lens,
                                 self.super_table).unsqueeze(1)

    def _decode_rows(self, q, dtype, scaling, block_table, seq_lens, super_table) -> torch.Tensor:
        """The decode step over rows q [R, Hq, d] (a sequence's row, or a token's under
        verification) with their tables and lengths -> [R, Hq, d]."""
        if self.cfg.check_finite:
            check_all_finite(query=q)
        w = self._planned(q.shape[1], scaling, rows=q.shape[0])
        out = torch.empty(q.shape, dtype=dtype, device=q.device)
        sel = self.cfg.selector
        if self.cfg.budget is None or sel == "fullkv":
            out, _ = w.run(q, self.k_pages, self.v_pages, None, block_table, seq_lens, out=out, dense=True)
        elif sel == "locks_h2":
            R, H = q.shape[0], self.k_pages.shape[2]
            pages = torch.empty(R, H, w.capacity, dtype=torch.int32, device=q.device)
            counts = torch.empty(R, H, dtype=torch.int32, device=q.device)
            out, _ = w.run_two_level(q, self.k_pages, self.v_pages, self.summary_list(), self.supers,
                                     super_table, block_table, seq_lens, out=out, pages=pages, counts=counts)
            self.last_counts = counts
        else:
            if sel == "locks":
                pages, counts = w.select(q, self.summary_list(), block_table, seq_lens)
            else:
                pages, counts = selectors.select(
                    sel, q, self.k_pages, block_table, seq_lens, scale=float(scaling),
                    page_size=self.cfg.page_size, budget=self.cfg.budget, capacity=w.capacity,
                    sink_pages=self.cfg.sink_pages, recent_pages=self.cfg.recent_pages,
                    **self._selector_options(sel, float(scaling)))
            self.last_counts = counts
            out, _ = w.attend(q, self.k_pages, self.v_pages, block_table, seq_lens, pages=pages,
                              counts=counts, out=out)
        return out


class LocksCache(Cache):
    """A transformers Cache whose layers are LocksLayer (paged K/V + summaries)."""

    def __init__(self, config, locks_config: LocksConfig | None = None, **kwargs):
        cfg = locks_config or LocksConfig(**kwargs)
        cfg.validate()
        check_model_config(config)
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        plans = _Plans()
        super().__init__(layers=[LocksLayer(cfg, plans) if kind == "full_attention"
                                 else DynamicSlidingWindowLayer(sliding_window=text.sliding_window)
                                 for kind in layer_kinds(text)])
        self.locks_config = cfg

    def with_config(self, cfg: LocksConfig) -> "LocksCache":
        """A copy of this (prefilled) cache whose LOCKS layers decode under cfg (another budget
        or selector; the sliding-window layers are transformers' and keep theirs): one prefill,
        many decodes (the lab's studies)."""
        cfg.validate()
        cache = copy.deepcopy(self)
        cache.locks_config = cfg
        for layer in cache.layers:
            if isinstance(layer, LocksLayer):
                layer.use_config(cfg)
        return cache

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        _ACTIVE["cache"], _ACTIVE["layer"] = self, layer_idx
        return self.layers[layer_idx].update(key_states, value_states)


def require_supported(device, **shape) -> None:
    """NotImplementedError with the C++ capability query's reason unless the backend of
    `device` runs the decode step on this shape (ops.supports: one answer for every layer)."""
    ok, why = ops.supports(device, **shape)
    if not ok:
        raise NotImplementedError(f"locks: {why} (backend {torch.device(device).type}, {shape})")


def check_model_config(config, device=None, dtype=None, cfg: LocksConfig | None = None) -> None:
    """Raise a clear error for models LOCKS cannot serve: ValueError for a model kind it
    does not handle, NotImplementedError for a shape the backend of `device` lacks (asked of
    ops.supports; skipped while the device is unknown, then asked at the prefill)."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    if getattr(config, "is_encoder_decoder", False):
        raise ValueError("locks: encoder-decoder models are not supported (decoder-only only)")
    layer_types = getattr(text, "layer_types", None) or []
    other = sorted({t for t in layer_types if t not in SERVED_LAYER_TYPES})
    if other:
        raise ValueError(
            f"locks: model_type {text.model_type!r} has layers of type {other}; LOCKS serves "
            "full-attention layers and leaves sliding-window layers to transformers "
            f"({', '.join(SERVED_LAYER_TYPES)}); other layer types are not supported")
    if layer_types:
        if "full_attention" not in layer_types:
            raise ValueError(f"locks: model_type {text.model_type!r} has no full-attention layer: "
                             "nothing for LOCKS to serve")
        if "sliding_attention" in layer_types and not getattr(text, "sliding_window", None):
            raise ValueError(f"locks: model_type {text.model_type!r} has sliding-attention layers "
                             "but no sliding_window in its config")
    elif getattr(text, "sliding_window", None) and getattr(text, "use_sliding_window", True):
        raise ValueError(f"locks: model_type {text.model_type!r} uses sliding-window attention in "
                         f"every layer (sliding_window={text.sliding_window}); nothing for LOCKS to serve")
    for field, what in CONFIG_FEATURES_NOT_SERVED:
        if getattr(text, field, None):
            raise ValueError(f"locks: model_type {text.model_type!r} uses {what} ({field}="
                             f"{getattr(text, field)!r}); LOCKS's decode computes plain softmax "
                             "attention, so it would silently change the model's outputs")
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    kv = getattr(text, "num_key_value_heads", None) or text.num_attention_heads
    if text.num_attention_heads % kv:
        raise ValueError("locks: num_attention_heads must be a multiple of num_key_value_heads")
    if device is not None:
        cfg = cfg or LocksConfig()
        require_supported(device, head_dim=head_dim, page_size=cfg.page_size,
                          group=text.num_attention_heads // kv, kv_dtype=dtype or torch.bfloat16,
                          rank=cfg.rank, precision=cfg.precision)


SERVED_LAYER_TYPES = ("full_attention", "sliding_attention")

# Attention that is not softmax(q k^T * scaling) v over the cached keys: LOCKS's decode (and
# its page scores) would drop the extra term silently, so such models are refused. Config
# fields (checked by enable()) and the attention-call arguments that carry them at run time
# (checked on every LOCKS layer's call, for models whose config does not name them).
CONFIG_FEATURES_NOT_SERVED = (("attn_logit_softcapping", "attention-logit soft-capping"),
                              ("alibi", "ALiBi position biases"))
CALL_FEATURES_NOT_SERVED = {"softcap": "attention-logit soft-capping",
                            "s_aux": "learned attention sinks", "sinks": "learned attention sinks",
                            "position_bias": "an additive position bias",
                            "sliding_window": "a sliding window on a layer LOCKS serves"}


# The ones transformers' SDPA function ignores (it raises on softcap itself and applies
# position_bias): the sliding-window layers LOCKS hands to it must not carry them either.
SDPA_IGNORES = ("s_aux", "sinks")


def unserved_attention_features(kwargs: dict, keys=tuple(CALL_FEATURES_NOT_SERVED)) -> list[str]:
    """The attention-call arguments among `keys` (CALL_FEATURES_NOT_SERVED) set in `kwargs`."""
    return [f"{k} ({CALL_FEATURES_NOT_SERVED[k]})" for k in keys if kwargs.get(k) is not None]


def _refuse(layer_idx: int, module, unserved: list[str]) -> None:
    raise NotImplementedError(
        f"locks: layer {layer_idx} ({type(module).__name__}) calls attention with "
        f"{', '.join(unserved)}; under locks.hf.enable it would run as plain softmax attention "
        "and silently change the outputs. Run this model without locks.hf.enable")


def layer_kinds(text_config) -> list[str]:
    """Each layer's type: config.layer_types, or "full_attention" for every layer."""
    types = getattr(text_config, "layer_types", None)
    return list(types) if types else ["full_attention"] * text_config.num_hidden_layers


def _first_valid(attention_mask, batch: int, q_len: int) -> list[int]:
    """Index of each row's first real token, from the prefill's 4-D mask (left padding)."""
    if attention_mask is None:
        return [0] * batch
    last = attention_mask[:, 0, -1, :q_len]  # what the last query attends to
    valid = last if last.dtype == torch.bool else last == 0
    firsts = []
    for b in range(batch):
        n = int(valid[b].sum())
        if n == 0 or not bool(valid[b, q_len - n:].all()):
            raise ValueError("locks: the prefill mask is not a left-padded causal mask; use "
                             "tokenizer.padding_side='left' for batched generation")
        firsts.append(q_len - n)
    return firsts


_warned_fallback = False


def locks_attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """The attention function registered as attn_implementation='locks'."""
    global _warned_fallback
    cache, layer_idx = _ACTIVE.get("cache"), _ACTIVE.get("layer")
    _ACTIVE.clear()
    if scaling is None:
        scaling = query.shape[-1] ** -0.5
    if cache is None or layer_idx != getattr(module, "layer_idx", None):
        if not _warned_fallback:
            warnings.warn("locks: attention called without a LocksCache (no cache, or another Cache "
                          "type): running dense SDPA for this call and any like it", stacklevel=2)
            _warned_fallback = True
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, **kwargs)
    layer = cache.layers[layer_idx]
    if not isinstance(layer, LocksLayer):  # a sliding-window layer: the model's own attention
        unserved = unserved_attention_features(kwargs, SDPA_IGNORES)
        if unserved:
            _refuse(layer_idx, module, unserved)
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, **kwargs)
    unserved = unserved_attention_features(kwargs)
    if unserved:  # before the prefill stores anything
        _refuse(layer_idx, module, unserved)
    if layer.pending is not None:  # prefill: dense, then store the real tokens in pages
        out = sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                     scaling=scaling, **kwargs)
        layer.commit_prefill(_first_valid(attention_mask, query.shape[0], key.shape[2]), query.shape[1],
                             scaling, query=query)
        return out
    return layer.decode(query, scaling), None


def register() -> None:
    """Register attn_implementation='locks' (attention + its mask, the SDPA one) with transformers."""
    ALL_ATTENTION_FUNCTIONS.register(ATTN_NAME, locks_attention_forward)
    ALL_MASK_ATTENTION_FUNCTIONS.register(ATTN_NAME, sdpa_mask)


def cache_kwarg(model) -> str:
    """Name of the cache argument of model.forward / generate: `cache` from transformers 5.2x on,
    `past_key_values` before (still accepted, deprecated, by later versions)."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def enable(model, budget: int | None = 2048, **kwargs):
    """Make `model.generate` decode with LOCKS: sets attn_implementation='locks' and gives every
    generate call a fresh LocksCache unless one is passed as past_key_values. Returns model."""
    cfg = LocksConfig(budget=budget, **kwargs)
    cfg.validate()
    check_model_config(model.config, model.device, model.dtype, cfg)
    if getattr(model, "_supports_sdpa", True) is False:
        # The prefill and the sliding-window layers run transformers' SDPA, and LOCKS's decode is
        # plain softmax attention: a model whose authors declare SDPA wrong for it is not served.
        raise ValueError(f"locks: {type(model).__name__} does not support SDPA attention "
                         "(_supports_sdpa = False: its attention is not plain softmax attention), "
                         "which LOCKS's prefill and decode assume")
    register()
    if not hasattr(model, "_locks_dense_impl"):
        model._locks_dense_impl = model.config._attn_implementation
        model._locks_generate = model.generate
    model.set_attn_implementation(ATTN_NAME)
    model.locks_config = cfg
    original = model._locks_generate

    kw = cache_kwarg(model)

    @functools.wraps(original)
    def generate(*args, **gen_kwargs):
        if gen_kwargs.get("past_key_values") is None and gen_kwargs.get("cache") is None:
            gen_kwargs[kw] = LocksCache(model.config, model.locks_config)
        if gen_kwargs.get("num_beams", 1) != 1:
            raise ValueError("locks: beam search is not supported")
        return original(*args, **gen_kwargs)

    model.generate = generate
    return model


def disable(model):
    """Undo enable(): the model's previous attention implementation and plain generate."""
    if hasattr(model, "_locks_dense_impl"):
        model.set_attn_implementation(model._locks_dense_impl)
        model.generate = model._locks_generate
        del model._locks_dense_impl, model._locks_generate, model.locks_config
    return model
