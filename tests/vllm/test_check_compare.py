"""compare_greedy (locks.vllm.check): the pass rule of the H200 correctness run, token identity
or, at each sequence's first divergence, a numerical tie of the reference's top two tokens."""
from locks.vllm.check import (TIE_NATS, compare_greedy, config_noise_floor, noise_floor,
                              within_noise_floor)


def run(tokens, logprobs=None):
    r = {"tokens": tokens}
    if logprobs is not None:
        r["logprobs"] = logprobs
    return r


def test_identical_runs_pass():
    c = compare_greedy(run([[1, 2, 3], [4, 5]]), run([[1, 2, 3], [4, 5]]))
    assert c["identical"] == 2 and c["first_divergence"] == [None, None]
    assert c["all_divergences_are_ties"] and c["margins_at_divergence"] == []


def test_divergence_at_a_tie_passes_and_a_clear_lead_fails():
    lp_tie = [[{"1": -0.1}, {"2": -0.70, "9": -0.72}, {"3": -0.1}]]
    c = compare_greedy(run([[1, 2, 3]], lp_tie), run([[1, 9, 3]]))
    assert c["identical"] == 0 and c["first_divergence"] == [1]
    assert abs(c["margins_at_divergence"][0] - 0.02) < 1e-9 and c["all_divergences_are_ties"]
    lp_lead = [[{"1": -0.1}, {"2": -0.1, "9": -0.1 - 2 * TIE_NATS}, {"3": -0.1}]]
    assert not compare_greedy(run([[1, 2, 3]], lp_lead), run([[1, 9, 3]]))["all_divergences_are_ties"]


def test_a_token_outside_the_reference_top_is_no_tie():
    lp = [[{"1": -0.1}, {"2": -0.5, "7": -0.9}]]
    c = compare_greedy(run([[1, 2]], lp), run([[1, 9]]))
    assert c["margins_at_divergence"] == [None] and not c["all_divergences_are_ties"]
    # without logprobs a divergence cannot be shown to be a tie
    assert not compare_greedy(run([[1, 2]]), run([[1, 9]]))["all_divergences_are_ties"]


def test_noise_floor_is_the_widest_triton_margin_and_bounds_the_pass():
    # TRITON_ATTN parted from FLASH_ATTN at margins 0.125 and 0.25 (and once outside the top-5)
    floor_cmp = {"margins_at_divergence": [0.125, None, 0.25]}
    assert noise_floor(floor_cmp) == 0.25
    assert noise_floor(None) == TIE_NATS and noise_floor({"margins_at_divergence": []}) == TIE_NATS
    assert noise_floor({"margins_at_divergence": [0.01]}) == TIE_NATS
    lp = [[{"1": -0.1}, {"2": -0.5, "9": -0.75, "7": -0.9}]]
    c = compare_greedy(run([[1, 2]], lp), run([[1, 9]]))  # margin 0.25
    assert not c["all_divergences_are_ties"]
    assert within_noise_floor(c, 0.25) and not within_noise_floor(c, 0.125)
    outside = compare_greedy(run([[1, 2]], lp), run([[1, 5]]))  # not in the top-5: never a tie
    assert not within_noise_floor(outside, 10.0)
    assert within_noise_floor(compare_greedy(run([[1, 2]]), run([[1, 2]])), TIE_NATS)


def test_a_configuration_floor_is_the_widest_over_its_runs():
    # 2026-12-02 on the H200: TRITON_ATTN parted from FLASH_ATTN at 0.125 on the first pass of
    # the ragged prompts and at 0.25 on their prefix-cache pass: 0.25 bounds both passes.
    first, again = {"margins_at_divergence": [0.125, 0.125]}, {"margins_at_divergence": [0.0, 0.25]}
    assert config_noise_floor([first, again]) == 0.25 == config_noise_floor([again, first])
    assert config_noise_floor([first]) == 0.125
    assert config_noise_floor([]) == TIE_NATS  # no run, no measured noise: the tie rule alone
    assert config_noise_floor([{"margins_at_divergence": [None, 0.05]}]) == TIE_NATS
