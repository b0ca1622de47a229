"""The rest of a RULER-style suite (Hsieh et al., 2024, "RULER: What's the real context size of
your long-context language models?"), beside tasks.py's passkey / needle / variable tracking:
multi-key, multi-value and multi-query needles, common- and frequent-words extraction, and
question answering over a real document (the machine's own manual pages). Deterministic from a
seed, sized in tokens of the model's tokenizer; each returns a tasks.Task (prompt, answers;
a completion scores by the share of answers it contains).

Templates follow RULER's (niah_multikey / niah_multivalue / niah_multiquery, cwe, fwe, qa)
with real text as haystack (Debian packages' documents through corpus.py) instead of Paul
Graham essays. QA: RULER draws SQuAD/HotpotQA; here the document is a run of real man pages
and the question asks for the one-line NAME description of one of them (extractive, the
answer is in the document once). Which items FullKV answers correctly is decided by the
evaluation (it keeps the tasks FullKV gets right as the reference set), not here.
"""
from __future__ import annotations

import gzip
import os
import random
import re

from . import tasks
from .tasks import INTRO, Task, _fill, _sentences

KEY_WORDS = ["amber", "falcon", "harbor", "lantern", "meadow", "quartz", "saffron", "willow", "cobalt",
             "juniper", "marble", "orchid", "pepper", "raven", "sierra", "tundra", "velvet", "zephyr"]


def _number(rng) -> str:
    return str(rng.randint(1000000, 9999999))


def _depths(rng, n):
    return sorted(rng.uniform(0.05, 0.95) for _ in range(n))


def multikey_needle(tokenizer, n_tokens: int, keys: int = 4, seed: int = 0, haystack: str = "info") -> Task:
    """Several needles with distinct keys; the question asks for one (RULER niah_multikey_1)."""
    rng = random.Random(seed)
    words = rng.sample(KEY_WORDS, keys)
    nums = [_number(rng) for _ in words]
    inserts = {d: f"One of the special magic numbers for {w} is: {n}. "
               for d, w, n in zip(_depths(rng, keys), words, nums)}
    ask = rng.randrange(keys)
    tail = (f"\nWhat is the special magic number for {words[ask]} mentioned in the provided text? "
            f"The special magic number for {words[ask]} mentioned in the provided text is")
    prompt = _fill(tokenizer, INTRO, _sentences(haystack) * 4, tail, n_tokens, inserts)
    return Task("multikey_needle", prompt, [nums[ask]])


def multivalue_needle(tokenizer, n_tokens: int, values: int = 4, seed: int = 0, haystack: str = "info") -> Task:
    """One key with several values, all asked for (RULER niah_multivalue)."""
    rng = random.Random(seed)
    word = rng.choice(KEY_WORDS)
    nums = [_number(rng) for _ in range(values)]
    inserts = {d: f"One of the special magic numbers for {word} is: {n}. " for d, n in zip(_depths(rng, values), nums)}
    tail = (f"\nWhat are all the special magic numbers for {word} mentioned in the provided text? "
            f"The special magic numbers for {word} mentioned in the provided text are")
    prompt = _fill(tokenizer, INTRO, _sentences(haystack) * 4, tail, n_tokens, inserts)
    return Task("multivalue_needle", prompt, nums)


def multiquery_needle(tokenizer, n_tokens: int, queries: int = 4, seed: int = 0, haystack: str = "info") -> Task:
    """Several keys, all asked for at once (RULER niah_multiquery)."""
    rng = random.Random(seed)
    words = rng.sample(KEY_WORDS, queries)
    nums = [_number(rng) for _ in words]
    inserts = {d: f"One of the special magic numbers for {w} is: {n}. "
               for d, w, n in zip(_depths(rng, queries), words, nums)}
    listed = ", ".join(words[:-1]) + f", and {words[-1]}"
    tail = (f"\nWhat are all the special magic numbers for {listed} mentioned in the provided text? "
            f"The special magic numbers for {listed} mentioned in the provided text are")
    prompt = _fill(tokenizer, INTRO, _sentences(haystack) * 4, tail, n_tokens, inserts)
    return Task("multiquery_needle", prompt, nums)


def _vocabulary(source: str = "info") -> list[str]:
    """Distinct plain lower-case words (4-10 letters) of a real text, in first-seen order."""
    seen, out = set(), []
    for w in re.findall(r"\b[a-z]{4,10}\b", tasks.corpus.text(source)):
        if w not in seen:
            seen.add(w)
            out.append(w)
    return out


def common_words(tokenizer, n_tokens: int, top: int = 10, common_freq: int = 30, rare_freq: int = 3,
                 seed: int = 0, source: str = "info") -> Task:
    """A numbered list of words: `top` words appear `common_freq` times each, many others
    `rare_freq` times; the answer is the `top` common ones (RULER cwe). When the common words
    alone overflow n_tokens (short contexts), common_freq drops so they take about half."""
    rng = random.Random(seed)
    vocab = _vocabulary(source)
    picked = rng.sample(vocab, min(len(vocab), 4000))
    common, rare = picked[:top], picked[top:]
    head = ("Below is a numbered list of words. In these words, some appear more often than others. "
            "Memorize the ones that appear most often.\n")
    tail = (f"\nQuestion: What are the {top} most common words in the above list? "
            f"Answer: The top {top} words that appear most often in the list are:")

    def words(n_rare):
        w = common * common_freq + rare[:n_rare] * rare_freq
        random.Random(seed + 1).shuffle(w)
        return [f"{i + 1}. {x}\n" for i, x in enumerate(w)]

    n_common = len(tokenizer(head + "".join(words(0)) + tail, add_special_tokens=False).input_ids)
    if n_common > n_tokens:  # short contexts: fewer repeats, the common words about half the prompt
        common_freq = max(rare_freq + 1, int(common_freq * 0.5 * n_tokens / n_common))
    lo, hi = 0, len(rare)
    while lo < hi:  # most rare words whose list fits
        mid = (lo + hi + 1) // 2
        if len(tokenizer(head + "".join(words(mid)) + tail, add_special_tokens=False).input_ids) <= n_tokens:
            lo = mid
        else:
            hi = mid - 1
    return Task("common_words", head + "".join(words(lo)) + tail, common)


def frequent_words(tokenizer, n_tokens: int, top: int = 3, alpha: float = 2.0, seed: int = 0) -> Task:
    """Coded words drawn from a Zipf distribution (rank k with weight k^-alpha); the answer is
    the `top` most frequent (RULER fwe; its words are random letter strings too)."""
    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyz"
    vocab = sorted({"".join(rng.choice(letters) for _ in range(6)) for _ in range(800)})
    rng.shuffle(vocab)
    weights = [(k + 1) ** -alpha for k in range(len(vocab))]
    head = ("Read the following coded text and track the frequency of each coded word. Find the "
            f"{top} most frequently appearing coded words.\n")
    tail = (f"\nQuestion: Do not provide any explanation. Please ignore the dots '....'. What are the "
            f"{top} most frequently appeared words in the above coded text? Answer: According to "
            f"the coded text above, the {top} most frequently appeared words are:")
    stream = random.Random(seed + 1).choices(vocab, weights=weights, k=max(64, n_tokens))
    units = [w + " .... " if (i + 1) % 10 == 0 else w + " " for i, w in enumerate(stream)]
    prompt = _fill(tokenizer, head, units, tail, n_tokens, {})
    body = prompt[len(head):len(prompt) - len(tail)].split()
    counts = {}
    for w in body:
        if w != "....":
            counts[w] = counts.get(w, 0) + 1
    ranked = sorted(counts, key=lambda w: (-counts[w], w))
    return Task("frequent_words", prompt, ranked[:top])


MAN_DIR = "/usr/share/man/man1"
_ROFF = re.compile(r"\\f[BIRP0-9]|\\f\(..|\\[&,/]|\\\(em|\\-")


def _man_text(path: str):
    """(name, one-line description, plain text) of a man page, or None when it has no NAME line."""
    try:
        raw = gzip.open(path, "rt", encoding="utf-8", errors="replace").read()
    except OSError:
        return None
    lines, name, desc, in_name = [], None, None, False
    for ln in raw.splitlines():
        if ln.startswith(".SH"):
            in_name = "NAME" in ln.upper()
            lines.append(ln[3:].strip().strip('"') + "\n")
            continue
        if ln.startswith(".\\\"") or ln.startswith("'\\\""):
            continue
        if ln.startswith("."):
            ln = ln.split(" ", 1)[1] if " " in ln else ""
        ln = _ROFF.sub(lambda m: "-" if m.group(0) == "\\-" else "", ln).replace("\\", "")
        if in_name and name is None and " - " in ln:
            name, desc = [s.strip() for s in ln.split(" - ", 1)]
            if not _usable(name, desc):
                return None  # (the rest of the page cannot change that: skip parsing it)
        if ln.strip():
            lines.append(ln + "\n")
    if name is None:  # no NAME line (a name found above has passed _usable)
        return None
    return name, desc, "".join(lines)


def _usable(name: str, desc: str) -> bool:
    """One-word command names only: multi-word ones (gcloud's thousands of sub-command pages)
    make near-duplicate documents and questions."""
    return (bool(name) and bool(desc) and re.fullmatch(r"[\w.+-]+", name) is not None
            and len(desc.split()) >= 3)


def manpage_qa(tokenizer, n_tokens: int, seed: int = 0, depth: float | None = None) -> Task:
    """QA over a real document: a run of the machine's man pages (section 1, sorted, from a
    seeded start); the question asks what one of them (at `depth`) does; the answer is its
    NAME description, which the document holds once. Scored on the description's words."""
    rng = random.Random(seed)
    files = sorted(f for f in os.listdir(MAN_DIR) if f.endswith(".1.gz"))
    if not files:
        raise FileNotFoundError(f"no man pages under {MAN_DIR}")
    start = rng.randrange(len(files))
    # Pages in order from the start; one that does not fit is skipped (not the end of the
    # document), until the document is within 2% of its room or 200 pages were skipped.
    pages, used, skipped, room = [], 0, 0, n_tokens - 96
    for f in files[start:] + files[:start]:
        m = _man_text(os.path.join(MAN_DIR, f))
        if m is None:
            continue
        n = len(tokenizer(f"Manual page {len(pages) + 1}:\n{m[2]}\n", add_special_tokens=False).input_ids)
        if used + n > room:
            skipped += 1
            if skipped > 200:
                break
            continue
        pages.append(m)
        used += n
        if used >= 0.98 * room:
            break
    d = rng.random() if depth is None else depth
    head = "Answer the question based on the given documents, a set of manual pages.\n\n"
    while True:
        name, desc, _ = pages[min(len(pages) - 1, int(d * len(pages)))]
        doc = "".join(f"Manual page {i + 1}:\n{p[2]}\n" for i, p in enumerate(pages))
        tail = (f"\nAnswer the question based on the given documents. Only give me the answer.\n"
                f"Question: According to its manual page, what does the command {name} do?\nAnswer:")
        if len(pages) == 1 or len(tokenizer(head + doc + tail, add_special_tokens=False).input_ids) <= n_tokens:
            break
        pages.pop()  # the pieces tokenized apart came out shorter than together
    answers = [w for w in re.findall(r"[A-Za-z]{4,}", desc)][:4] or [desc]
    return Task("manpage_qa", head + doc + tail, answers)


TASKS = {"mk_needle": multikey_needle, "mv_needle": multivalue_needle, "mq_needle": multiquery_needle,
         "cwe": common_words, "fwe": frequent_words, "qa": manpage_qa}
