"""FullKV vs LOCKS on a real model: next-token agreement and KL while decoding real text
(teacher-forced, so both see the same tokens), and side-by-side greedy generation."""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from locks import hf


@contextlib.contextmanager
def attn_implementation(model, name: str):
    old = model.config._attn_implementation
    if name == hf.ATTN_NAME:
        hf.register()
    model.set_attn_implementation(name)
    try:
        yield model
    finally:
        model.set_attn_implementation(old)


def _dense_impl(model) -> str:
    impl = getattr(model, "_locks_dense_impl", None) or model.config._attn_implementation
    return "sdpa" if impl == hf.ATTN_NAME else impl


def _attended_tokens(cache) -> list[float]:
    """Mean tokens the last decode step attended per (sequence, KV head), one value per LOCKS
    layer of the cache (the selection's pages; the partial tail page counts its own tokens)."""
    out = []
    for layer in getattr(cache, "layers", []):
        counts = getattr(layer, "last_counts", None)
        if counts is None:
            continue
        P = layer.cfg.page_size
        lens = torch.tensor(layer.lens, dtype=torch.float64).view(-1, 1)
        short = (P - lens % P) % P  # the tail page's missing tokens (0: no tail)
        out.append(float((counts.double().cpu() * P - short).mean()))
    return out


@torch.inference_mode()
def _forced_logprobs(model, ids: torch.Tensor, prefill: int, cache, kw: str, first=None,
                     attended: list | None = None):
    """Log-probs of the next token at each decode step, teacher-forced on ids[:, prefill:].
    Returns (list of [B, V] float32 log-prob tensors, seconds spent decoding). attended: if a
    list, gets each step's _attended_tokens (a host sync per step: measurement only)."""
    if first is None:
        # logits_to_keep=1: the prefill's logits are not used (Gemma-3: 262K vocabulary x 8K+ positions)
        out = model(input_ids=ids[:, :prefill], use_cache=True, logits_to_keep=1, **{kw: cache})
    steps = ids.shape[1] - prefill
    res = []
    t0 = time.perf_counter()
    for t in range(steps):
        out = model(input_ids=ids[:, prefill + t:prefill + t + 1], use_cache=True, **{kw: cache})
        res.append(F.log_softmax(out.logits[:, -1].float(), dim=-1))
        if attended is not None:
            attended.append(_attended_tokens(cache))
    return res, time.perf_counter() - t0


@dataclass
class Agreement:
    budget: int | None
    steps: int
    top1_agreement: float  # share of decode steps whose argmax equals FullKV's
    mean_kl: float  # mean over steps of KL(FullKV || LOCKS), nats
    max_kl: float
    decode_s: float
    per_step_kl: list[float] = field(default_factory=list)
    selector: str = "locks"
    # tokens attended per (step, sequence, KV head): the mean, and the mean per LOCKS layer
    attended_mean: float = 0.0
    attended_per_layer: list[float] = field(default_factory=list)
    tau: float = 0.0  # the adaptive budget's tau (0: fixed budget)


@torch.inference_mode()
def teacher_forced(model, ids: torch.Tensor, prefill: int, budgets: list[int | None],
                   selectors=("locks",), taus=(0.0,), **locks_kwargs) -> tuple[list[Agreement], float]:
    """Decode ids[:, prefill:] teacher-forced with FullKV (the model's own dense attention and
    DynamicCache) and with each selector (locks.hf's selector=) at each budget and each tau
    (0 = fixed budget; one shared prefill, copied per run). Returns (one Agreement per
    tau x selector x budget, FullKV decode seconds)."""
    from transformers import DynamicCache

    kw = hf.cache_kwarg(model)
    with attn_implementation(model, _dense_impl(model)):
        ref, ref_s = _forced_logprobs(model, ids, prefill, DynamicCache(config=model.config), kw)
    results = []
    with attn_implementation(model, hf.ATTN_NAME):
        # the shared prefill is dense: no budget, so no adaptive budget either
        dense_kw = {k: v for k, v in locks_kwargs.items() if k != "floor_pages"}
        base = hf.LocksCache(model.config, budget=None, **dense_kw)
        model(input_ids=ids[:, :prefill], use_cache=True, logits_to_keep=1, **{kw: base})
        for tau, sel, b in [(t, sel, b) for t in taus for sel in selectors for b in budgets]:
            cache = base.with_config(hf.LocksConfig(budget=b, selector=sel, tau=tau, **locks_kwargs))
            att: list[list[float]] = []
            got, s = _forced_logprobs(model, ids, prefill, cache, kw, first=True, attended=att)
            per_layer = [sum(col) / len(col) for col in zip(*att)] if att and att[0] else []
            kls = [float(F.kl_div(g, r, log_target=True, reduction="sum")) / r.shape[0]
                   for g, r in zip(got, ref)]
            agree = [bool((g.argmax(-1) == r.argmax(-1)).all()) for g, r in zip(got, ref)]
            results.append(Agreement(b, len(kls), sum(agree) / len(agree), sum(kls) / len(kls),
                                     max(kls), s, kls, sel,
                                     sum(per_layer) / len(per_layer) if per_layer else 0.0, per_layer, tau))
    return results, ref_s


@dataclass
class SideBySide:
    full_text: list[str]
    locks_text: list[str]
    agreement: float  # share of generated positions where LOCKS's token equals FullKV's
    first_divergence: list[int]  # per prompt, index of the first differing token (-1: none)
    full_s: float
    locks_s: float
    new_tokens: int
    full_prefill_s: float = 0.0
    locks_prefill_s: float = 0.0

    def decode_tok_s(self, which: str) -> float:
        """Decode speed, tokens per second per sequence, prefill excluded."""
        total, pre = (self.full_s, self.full_prefill_s) if which == "full" else (self.locks_s, self.locks_prefill_s)
        return (self.new_tokens - 1) / max(total - pre, 1e-9)


class _Clock:
    """A logits processor that only records when each generation step's logits are ready."""

    def __init__(self):
        self.times = []

    def __call__(self, input_ids, scores):
        if scores.is_cuda:
            torch.cuda.synchronize()
        self.times.append(time.perf_counter())
        return scores


def _greedy(model, tokenizer, prompts: list[str], max_new_tokens: int, cache):
    """Greedy generation of exactly max_new_tokens on the left-padded batch of prompts, with
    `cache` (None: the model's own): (new tokens, seconds, seconds to the first logits)."""
    from transformers import LogitsProcessorList

    tokenizer.padding_side = "left"
    enc = tokenizer(prompts, return_tensors="pt", padding=True).to(model.device)
    n = enc.input_ids.shape[1]
    gen = dict(max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens, do_sample=False,
               pad_token_id=tokenizer.pad_token_id or tokenizer.eos_token_id)
    kw = {hf.cache_kwarg(model): cache} if cache is not None else {}
    clock = _Clock()
    t0 = time.perf_counter()
    out = model.generate(**enc, **gen, **kw, logits_processor=LogitsProcessorList([clock]))
    if out.is_cuda:
        torch.cuda.synchronize()
    return out[:, n:], time.perf_counter() - t0, clock.times[0] - t0


def _decode(tokenizer, rows) -> list[str]:
    return [tokenizer.decode(r, skip_special_tokens=True) for r in rows]


def _locks_greedy(model, tokenizer, prompts, max_new_tokens, budget, **locks_kwargs):
    with attn_implementation(model, hf.ATTN_NAME):
        return _greedy(model, tokenizer, prompts, max_new_tokens,
                       hf.LocksCache(model.config, budget=budget, **locks_kwargs))


@torch.inference_mode()
def locks_generate(model, tokenizer, prompts: list[str], max_new_tokens: int, budget: int | None,
                   **locks_kwargs) -> list[str]:
    """side_by_side's LOCKS half alone (the same batch, cache and decoding): the texts, for
    comparing two LOCKS configurations without generating FullKV's twice."""
    mine, _, _ = _locks_greedy(model, tokenizer, prompts, max_new_tokens, budget, **locks_kwargs)
    return _decode(tokenizer, mine)


@torch.inference_mode()
def side_by_side(model, tokenizer, prompts: list[str], max_new_tokens: int, budget: int | None,
                 **locks_kwargs) -> SideBySide:
    """Greedy generation with FullKV and with LOCKS on the same prompts (left-padded batch)."""
    with attn_implementation(model, _dense_impl(model)):
        full, full_s, full_pre = _greedy(model, tokenizer, prompts, max_new_tokens, None)
    mine, locks_s, locks_pre = _locks_greedy(model, tokenizer, prompts, max_new_tokens, budget,
                                             **locks_kwargs)
    same = full == mine
    first = [int((~row).nonzero()[0]) if (~row).any() else -1 for row in same]
    return SideBySide(_decode(tokenizer, full), _decode(tokenizer, mine), float(same.float().mean()),
                      first, full_s, locks_s, max_new_tokens, full_pre, locks_pre)
