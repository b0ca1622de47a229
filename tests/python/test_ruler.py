"""locks_lab.ruler: the RULER-style generators build prompts within the token budget, hide
their answers in the prompt the stated number of times, and are deterministic per seed.
A whitespace tokenizer keeps this fast (no model); the generators only count tokens."""
import re

import pytest

from locks_lab import ruler


class WsTokenizer:
    class _Out:
        def __init__(self, ids):
            self.input_ids = ids

    def __call__(self, text, add_special_tokens=False, **kw):
        return self._Out(text.split())


TOK = WsTokenizer()
N = 1500


@pytest.mark.parametrize("name", ["mk_needle", "mv_needle", "mq_needle"])
def test_needles_fit_and_hold_their_answers(name):
    t = ruler.TASKS[name](TOK, N, seed=3)
    assert len(TOK(t.prompt).input_ids) <= N
    assert t.answers and all(t.prompt.count(a) == 1 for a in t.answers)
    assert t.score(" ".join(t.answers)) == 1.0 and t.score("nothing") == 0.0
    assert ruler.TASKS[name](TOK, N, seed=3).prompt == t.prompt
    assert ruler.TASKS[name](TOK, N, seed=4).prompt != t.prompt


def test_multikey_asks_one_of_several_keys():
    t = ruler.multikey_needle(TOK, N, keys=4, seed=1)
    assert t.prompt.count("One of the special magic numbers for") == 4
    assert len(t.answers) == 1


def test_common_words_answer_is_the_most_frequent():
    t = ruler.common_words(TOK, N, top=5, common_freq=12, rare_freq=2, seed=0)
    assert len(TOK(t.prompt).input_ids) <= N
    items = re.findall(r"^\d+\. (\w+)$", t.prompt, flags=re.M)
    counts = {w: items.count(w) for w in set(items)}
    assert sorted(t.answers) == sorted(w for w, c in counts.items() if c == 12)
    assert max(c for w, c in counts.items() if w not in t.answers) == 2


def test_frequent_words_answer_is_the_top_of_the_counts():
    t = ruler.frequent_words(TOK, N, top=3, seed=0)
    assert len(TOK(t.prompt).input_ids) <= N
    body = t.prompt.split("coded words.\n", 1)[1].split("\nQuestion:")[0].split()
    counts = {}
    for w in body:
        if w != "....":
            counts[w] = counts.get(w, 0) + 1
    top = sorted(counts.values(), reverse=True)[:3]
    assert [counts[a] for a in t.answers] == top


def test_manpage_qa_answer_is_in_the_document_once_per_page():
    t = ruler.manpage_qa(TOK, 4000, seed=2)
    assert len(TOK(t.prompt).input_ids) <= 4000
    name = re.search(r"what does the command (\S+) do\?", t.prompt).group(1)
    assert name in t.prompt.split("Question:")[0]
    assert all(a in t.prompt.split("Question:")[0] for a in t.answers)
