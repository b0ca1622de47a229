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
    """head + as many filler units as fit in n_tokens (inserts placed at relative depths) + tail."""
    def build(k):
        body = list(units[:k])
        for depth, s in sorted(insert.items()):
            body.insert(int(round(depth * len(body))), s)
        return head + "".join(body) + tail

    lo, hi = 0, len(units)
    while lo < hi:  # largest k whose prompt fits
        mid = (lo + hi + 1) // 2
        if len(tokenizer(build(mid), add_special_tokens=False).input_ids) <= n_tokens:
            lo = mid
        else:
            hi = mid - 1
    return build(lo)


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
