"""compare_greedy (locks.vllm.check): the pass rule of the H200 correctness run, token identity
or, at each sequence's first divergence, a numerical tie of the reference's top two tokens."""
from locks.vllm.check import TIE_NATS, compare_greedy, logprob_quantum


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
    # fp32-like logits (gaps 0.03 and 0.2 share no spacing): the fixed TIE_NATS applies
    lp_lead = [[{"1": -0.1, "4": -0.13}, {"2": -0.1, "9": -0.1 - 2 * TIE_NATS}, {"3": -0.1}]]
    assert not compare_greedy(run([[1, 2, 3]], lp_lead), run([[1, 9, 3]]))["all_divergences_are_ties"]


def test_a_token_outside_the_reference_top_is_no_tie():
    lp = [[{"1": -0.1}, {"2": -0.5, "7": -0.9}]]
    c = compare_greedy(run([[1, 2]], lp), run([[1, 9]]))
    assert c["margins_at_divergence"] == [None] and not c["all_divergences_are_ties"]
    # without logprobs a divergence cannot be shown to be a tie
    assert not compare_greedy(run([[1, 2]]), run([[1, 9]]))["all_divergences_are_ties"]


def test_tie_is_one_step_of_the_reference_logit_resolution():
    # bf16 logits in [16, 32): every logprob of a step is a multiple of 0.125 apart.
    q = 0.125
    lp = [[{"1": -0.5, "4": -0.5 - 3 * q}, {"2": -0.75, "9": -0.75 - q, "5": -0.75 - 4 * q}],
          [{"3": -0.25, "6": -0.25 - 2 * q}, {"7": -1.0, "8": -1.0 - 2 * q}]]
    assert logprob_quantum(lp) == q
    one_ulp = compare_greedy(run([[1, 2], [3, 7]], lp), run([[1, 9], [3, 7]]))
    assert one_ulp["margins_at_divergence"] == [q] and one_ulp["all_divergences_are_ties"]
    assert abs(one_ulp["tie_nats"] - q) < 1e-6
    two_ulps = compare_greedy(run([[1, 2], [3, 7]], lp), run([[1, 2], [3, 8]]))
    assert two_ulps["margins_at_divergence"] == [2 * q]
    assert not two_ulps["all_divergences_are_ties"]


def test_quantum_needs_two_distinct_values_and_floors_at_tie_nats():
    assert logprob_quantum(None) is None
    assert logprob_quantum([[{"1": -0.1}], [{"2": -0.3, "3": -0.3}]]) is None
    fine = [[{"1": -0.1, "4": -0.11}, {"2": -0.70, "9": -0.72}]]  # quantum 0.01 < TIE_NATS
    c = compare_greedy(run([[1, 2]], fine), run([[1, 9]]))
    assert c["tie_nats"] == TIE_NATS and c["all_divergences_are_ties"]


def test_unquantized_gaps_give_no_quantum():
    assert logprob_quantum([[{"1": -0.1, "2": -0.13, "3": -0.33}]]) is None  # 0.03 and 0.2
