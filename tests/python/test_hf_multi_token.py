"""Several tokens a step after the prefill in the transformers drop-in (assisted / prompt-lookup
decoding's verification, and its rollback of rejected drafts with crop): each token is a row
with its own causal length, so a verification step gives the bits of the same tokens decoded
one at a time; crop forgets the rejected tokens without leaving a stale summary behind."""
import copy

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="locks.hf needs transformers (scripts/python_tests.sh installs it)")

import locks.hf as lhf  # noqa: E402
from locks_lab import corpus  # noqa: E402

H, HQ, D = 2, 8, 64
SCALE = D ** -0.5


def prefilled(selector="locks", budget=64, lens=(300, 211), seed=0, reserve=256):
    """A LocksLayer after a left-padded prefill of two sequences (random bf16 keys)."""
    g = torch.Generator().manual_seed(seed)
    layer = lhf.LocksLayer(lhf.LocksConfig(budget=budget, selector=selector, group_pages=4, min_groups=2,
                                           flat_below_groups=0, reserve_tokens=reserve))
    S = max(lens)
    k, v = (torch.randn(2, H, S, D, generator=g).to(torch.bfloat16) for _ in range(2))
    layer.update(k, v)
    layer.commit_prefill([S - n for n in lens], HQ, SCALE)
    return layer, g


def step(layer, g, T):
    k, v = (torch.randn(2, H, T, D, generator=g).to(torch.bfloat16) for _ in range(2))
    q = torch.randn(2, HQ, T, D, generator=g).to(torch.bfloat16)
    return q, k, v


@pytest.mark.parametrize("selector", ["locks", "locks_h2", "fullkv"])
@pytest.mark.parametrize("lens,T,reserve", [((300, 211), 4, 256), ((316, 211), 6, 256),
                                            ((316, 221), 6, 0)])
def test_verification_step_equals_one_token_steps(selector, lens, T, reserve):
    """T tokens a sequence in one step (300 -> 304: the last token completes page 18; 316 ->
    322: the fifth completes page 19 and, for locks_h2, super group 4 of 64 tokens; with no
    reserve the storage grows in that step, and sequence 1 (221 -> 227) completes page 13 too) = the same tokens appended and decoded one step at
    a time: the same output bits, summaries, super summaries and lengths."""
    a, g = prefilled(selector, lens=lens, reserve=reserve)
    b = copy.deepcopy(a)
    q, k, v = step(a, g, T)
    a.update(k, v)
    out = a.decode(q, SCALE)
    assert out.shape == (2, T, HQ, D) and a.lens == [n + T for n in lens] and a.seen == max(lens) + T
    for t in range(T):
        b.update(k[:, :, t: t + 1], v[:, :, t: t + 1])
        assert torch.equal(out[:, t], b.decode(q[:, :, t: t + 1], SCALE)[:, 0]), t
    for x, y in zip(a.summary_list(), b.summary_list()):
        assert torch.equal(x, y)
    if selector == "locks_h2":
        for x, y in zip(a.supers, b.supers):
            assert torch.equal(x, y)
    if selector == "locks":  # really sparse: 304 tokens over a budget of 64
        assert int(a.last_counts.max()) <= 4


def test_crop_forgets_rejected_drafts():
    """A step of 4 tokens, 3 of them rejected (crop(-3), and the older API's absolute length),
    then 4 new tokens: the same outputs and summaries as a layer that only ever saw the
    accepted token and the new ones; the rejected draft had completed a page (304)."""
    for absolute in (False, True):
        a, g = prefilled()
        b = copy.deepcopy(a)
        q, k, v = step(a, g, 4)
        a.update(k, v)
        a.decode(q, SCALE)
        a.crop(a.seen - 3 if absolute else -3)
        assert a.lens == [301, 212] and a.seen == 301
        b.update(k[:, :, :1], v[:, :, :1])
        q2, k2, v2 = step(a, g, 4)
        a.update(k2, v2)
        b.update(k2, v2)
        assert torch.equal(a.decode(q2, SCALE), b.decode(q2, SCALE))
        for x, y in zip(a.summary_list(), b.summary_list()):
            assert torch.equal(x, y)
        with pytest.raises(ValueError, match="empty a sequence"):
            a.crop(-1000)


def test_baseline_selectors_keep_one_token_a_step():
    layer, g = prefilled("quest")
    _, k, v = step(layer, g, 2)
    with pytest.raises(NotImplementedError, match="'quest' takes one token"):
        layer.update(k, v)


def test_prompt_lookup_decoding_runs_through_locks():
    """transformers' prompt-lookup decoding (drafts from the prompt's n-grams, verified several
    tokens a step, rejected ones cropped) with the drop-in: at a budget above the context the
    same greedy text as plain decoding, and the verification steps really ran (a layer saw
    steps of several tokens)."""
    from locks.model import load_smollm2

    model, tok = load_smollm2()
    ids = corpus.token_ids(tok, "gpl3", 400)
    ids = torch.cat([ids, ids[:, :200]], dim=1)  # a repeat the n-grams find
    try:
        lhf.enable(model, budget=8192)
        plain = model.generate(ids, max_new_tokens=24, do_sample=False)
        seen = []
        orig = lhf.LocksLayer.update

        def spy(self, k, v, *a, **kw):
            if self.k_pages is not None:  # after the prefill
                seen.append(k.shape[2])
            return orig(self, k, v, *a, **kw)

        lhf.LocksLayer.update = spy
        try:
            fast = model.generate(ids, max_new_tokens=24, do_sample=False, prompt_lookup_num_tokens=4)
        finally:
            lhf.LocksLayer.update = orig
    finally:
        lhf.disable(model)
    assert max(seen) > 1  # after the prefill, steps of several tokens
    assert torch.equal(plain, fast), (tok.decode(plain[0, 600:]), tok.decode(fast[0, 600:]))


def test_a_non_finite_value_in_a_verification_step_propagates_as_in_one_token_steps():
    """The drop-in's NaN policy does not depend on the tokens a step: a NaN value of one draft
    token (check_finite off) is written, not refused, and shows as NaN only in the outputs of
    the rows that attend it (sequence 0 from that token on), as in one-token steps."""
    a, g = prefilled()
    b = copy.deepcopy(a)
    q, k, v = step(a, g, 4)
    v[0, 0, 2, 5] = float("nan")
    a.update(k, v)
    out = a.decode(q, SCALE)
    for t in range(4):
        b.update(k[:, :, t: t + 1], v[:, :, t: t + 1])
        one = b.decode(q[:, :, t: t + 1], SCALE)[:, 0]
        assert torch.equal(out[:, t].nan_to_num(7.0), one.nan_to_num(7.0)), t  # NaN where it is
    assert not torch.isnan(out[1]).any() and not torch.isnan(out[0, :2]).any()
    assert torch.isnan(out[0, 2:]).any()
