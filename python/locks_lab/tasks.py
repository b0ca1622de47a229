"""Synthetic retrieval tasks in the style of RULER (passkey, needle in a haystack, variable
tracking), generated here deterministically from a seed, sized in tokens of the model's
tokenizer. Each task returns (prompt, answers); a completion scores by containing answers."""
from __future__ import annotations

import random
from dataclasses import dataclass

from . import corpus

PASSKEY_FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
INTRO = ("There is an important info hidden inside a lot of irrelevant text. Find it and memorize it. "
         "I will quiz you about the important information there.\n\n")


@dataclass
class Task:
    name: str
    prompt: str
    answers: list[str]

    def score(self, completion: str) -> float:
        """Share of the answers found in the completion (1.0 or 0.0 for single-answer tasks)."""
        return sum(a in completion for a in self.answers) / len(self.answers)


def _fill(tokenizer, head: str, units: list[str], tail: str, n_tokens: int, insert: dict[float, str]) -> str:
    """head + as many filler units as fit in n_tokens (inserts placed at relative depths) + tail.
    When the next unit would overshoot and the prompt is more than 2% short (a long unit: the
    info manuals hold tables of thousands of characters with no sentence end), the first
    words of that unit that fit are added, so the prompt has the requested length."""
    def build(k, extra=""):
        body = list(units[:k]) + ([extra] if extra else [])
        for depth, s in sorted(insert.items()):
            body.insert(int(round(depth * len(body))), s)
        return head + "".join(body) + tail

    def count(text):
        return len(tokenizer(text, add_special_tokens=False).input_ids)

    # Every unit is at least one token and BPE does not merge across our units' spaces, so no
    # more than n_tokens units fit; the cap (with a margin) only spares tokenizing megabytes of
    # haystack in the first probes (the info manuals: ~8 s a prompt), the result is the same.
    lo, hi = 0, min(len(units), 2 * n_tokens + 64)
    while lo < hi:  # largest k whose prompt fits
        mid = (lo + hi + 1) // 2
        if count(build(mid)) <= n_tokens:
            lo = mid
        else:
            hi = mid - 1
    prompt = build(lo)
    if lo < len(units) and count(prompt) < 0.98 * n_tokens:
        words = units[lo].split(" ")
        a, b = 0, len(words)
        while a < b:  # most words of the next unit that fit
            mid = (a + b + 1) // 2
            if count(build(lo, " ".join(words[:mid]) + " ")) <= n_tokens:
                a = mid
            else:
                b = mid - 1
        if a:
            prompt = build(lo, " ".join(words[:a]) + " ")
    return prompt


def passkey(tokenizer, n_tokens: int, depth: float = 0.5, seed: int = 0) -> Task:
    rng = random.Random(seed)
    key = str(rng.randint(10000, 99999))
    needle = f"The pass key is {key}. Remember it. {key} is the pass key. "
    units = [PASSKEY_FILLER] * (n_tokens // 10 + 10)
    prompt = _fill(tokenizer, INTRO, units, "\nWhat is the pass key? The pass key is", n_tokens, {depth: needle})
    return Task("passkey", prompt, [key])


def _sentences(source: str) -> list[str]:
    txt = " ".join(corpus.text(source).split())
    return [s + ". " for s in txt.split(". ") if s]


def needle(tokenizer, n_tokens: int, depth: float = 0.5, seed: int = 0, haystack: str = "gpl3") -> Task:
    rng = random.Random(seed)
    word = rng.choice(["amber", "falcon", "harbor", "lantern", "meadow", "quartz", "saffron", "willow"])
    number = str(rng.randint(1000000, 9999999))
    sentence = f"One of the special magic numbers for {word} is: {number}. "
    units = _sentences(haystack) * 4
    tail = (f"\nWhat is the special magic number for {word} mentioned in the provided text? "
            f"The special magic number for {word} mentioned in the provided text is")
    prompt = _fill(tokenizer, INTRO, units, tail, n_tokens, {depth: sentence})
    return Task("needle", prompt, [number])


def variable_tracking(tokenizer, n_tokens: int, hops: int = 4, seed: int = 0) -> Task:
    rng = random.Random(seed)
    letters = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
    names = ["".join(rng.choice(letters) for _ in range(5)) for _ in range(hops + 1)]
    value = str(rng.randint(10000, 99999))
    chain = [f"VAR {names[0]} = {value}. "] + [f"VAR {names[i + 1]} = {names[i]}. " for i in range(hops)]
    units = [PASSKEY_FILLER] * (n_tokens // 10 + 10)
    inserts = {(i + 1) / (len(chain) + 1): c for i, c in enumerate(chain)}
    tail = (f"\nQuestion: Find all variables that are assigned the value {value} in the text above. "
            f"Answer: According to the chain(s) of variable assignment in the text above, {hops + 1} "
            "variables are assigned the value {value}, they are:").replace("{value}", value)
    prompt = _fill(tokenizer, "Memorize and track the chain(s) of variable assignment hidden in the "
                   "following text.\n\n", units, tail, n_tokens, inserts)
    return Task("variable_tracking", prompt, names)


TASKS = {"passkey": passkey, "needle": needle, "vt": variable_tracking}
