"""The task suite (RULER style, #11): every task x context length x selector x budget as a
whole greedy generation through the drop-in, scored against the task's answers, with FullKV
(the model's own attention) as the reference.

  python -m locks_lab suite --model smollm2 --lengths 4000,8000 --budgets 64,256,1024 \\
      --selectors locks,locks-tau0.95,oracle,quest,shadowkv,rocketkv --tasks all --seeds 2 --out suite-out

Selectors: the drop-in's (locks.hf selector=: locks, oracle, quest, shadowkv, rocketkv), and
`locks-tau<T>` (e.g. locks-tau0.95): LOCKS with the adaptive budget at tau T, the budget its
ceiling, floor_pages the library's default (1) unless given. `fullkv` is the reference (the
model's own attention), run once per prompt whether listed or not. Every generation records
the tokens it attended per decode step (mean over steps, sequences and KV heads, per LOCKS
layer and their mean; the partial tail page counts its own tokens), so that the adaptive
budget can be compared with the fixed ones at equal mean tokens.

Per (task, length, seed) the prompt is prefilled once (all but its last token, dense, with
the summaries built); each selector x budget then decodes from a copy of that cache, the
last prompt token being its first decode step, so every method answers from the same
prefill. Writes suite.json (one row per generation), table.md (mean score per task x
method x budget, FullKV beside) and, with gnuplot, accuracy.png.

The prompts come from this machine's files (Debian documents, man pages, the Python
sources), which another machine may not have or hold in other versions: `--write-prompts F`
writes every (task, length, seed) prompt with its answers to a JSON file, and `--prompts F`
runs from such a file, so a GPU machine answers exactly the prompts generated here."""
from __future__ import annotations

import json
import os
import time
from collections import defaultdict

import torch

from locks import hf

from . import ruler, tasks
from .evaluate import _attended_tokens, _dense_impl, attn_implementation

# Task generators and how many tokens each answer needs.
GENERATORS = {
    "passkey": (tasks.passkey, 12), "needle": (tasks.needle, 24), "vt": (tasks.variable_tracking, 30),
    "mk_needle": (ruler.multikey_needle, 16), "mv_needle": (ruler.multivalue_needle, 40),
    "mq_needle": (ruler.multiquery_needle, 40), "cwe": (ruler.common_words, 60),
    "fwe": (ruler.frequent_words, 24), "manpage_qa": (ruler.manpage_qa, 24),
}


def parse_method(name: str) -> tuple[str, float]:
    """A --selectors entry -> (drop-in selector, tau): "quest" -> ("quest", 0.0),
    "locks-tau0.95" -> ("locks", 0.95); ValueError for anything else."""
    if not isinstance(name, str):
        raise ValueError(f"locks_lab suite: a selector name must be a string, got {name!r}")
    if name in hf.SELECTORS:
        return name, 0.0
    if name.startswith("locks-tau"):
        try:
            tau = float(name[len("locks-tau"):])
        except ValueError:
            tau = float("nan")
        if 0.0 < tau <= 1.0:
            return "locks", tau
        raise ValueError(f"locks_lab suite: {name!r}: tau must be a number in (0, 1], e.g. locks-tau0.95")
    raise ValueError(f"locks_lab suite: unknown selector {name!r} (known: {', '.join(hf.SELECTORS)}, "
                     "or locks-tau<T> for the adaptive budget, e.g. locks-tau0.95)")


class _Attended:
    """A logits processor that records, after each decode step, the tokens the step attended
    per LOCKS layer (evaluate._attended_tokens: a host sync per step, measurement only)."""

    def __init__(self, cache):
        self.cache, self.steps = cache, []

    def __call__(self, input_ids, scores):
        per_layer = _attended_tokens(self.cache)
        if per_layer:
            self.steps.append(per_layer)
        return scores

    def per_layer(self) -> list[float]:
        return [sum(col) / len(col) for col in zip(*self.steps)] if self.steps else []


@torch.inference_mode()
def _generate(model, ids, cache, max_new_tokens, pad_id, processors=()):
    from transformers import LogitsProcessorList

    kw = {hf.cache_kwarg(model): cache} if cache is not None else {}
    out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                         do_sample=False, pad_token_id=pad_id, logits_processor=LogitsProcessorList(processors),
                         **kw)
    return out[0, ids.shape[1]:]


def check_tasks(task_names) -> None:
    """ValueError naming the tasks that are not in GENERATORS."""
    unknown = [t for t in task_names if t not in GENERATORS]
    if unknown:
        raise ValueError(f"locks_lab suite: unknown task(s) {unknown} (known: {', '.join(GENERATORS)})")


def make_prompts(tok, *, lengths, task_names, seeds) -> list[dict]:
    """Every (task, length, seed) prompt with its answers, as JSON-ready dicts."""
    check_tasks(task_names)
    out = []
    for name in task_names:
        for n in lengths:
            for seed in range(seeds):
                t = GENERATORS[name][0](tok, n, seed=seed)
                out.append(dict(task=name, length=n, seed=seed, name=t.name, prompt=t.prompt, answers=t.answers))
    return out


def load_prompts(path: str) -> dict:
    """{(task, length, seed): tasks.Task} from a make_prompts file; ValueError if malformed."""
    with open(path, encoding="utf-8") as f:
        items = json.load(f)
    keys = ("task", "length", "seed", "name", "prompt", "answers")
    if not isinstance(items, list) or not all(isinstance(x, dict) and all(k in x for k in keys) for x in items):
        raise ValueError(f"locks_lab suite: {path} is not a prompts file (a list of {{{', '.join(keys)}}})")
    return {(x["task"], int(x["length"]), int(x["seed"])): tasks.Task(x["name"], x["prompt"], list(x["answers"]))
            for x in items}


@torch.inference_mode()
def run(model, tok, *, lengths, budgets, selectors, task_names, seeds, progress=print, locks_kwargs=None,
        checkpoint: str | None = None, prompts: dict | None = None):
    """One row per generation: FullKV once per (task, length, seed), then every selector x
    budget from a copy of one shared prefill. selectors: names as parse_method takes them
    ("fullkv" is skipped: the reference row is always there). checkpoint: a path where the
    rows so far are written (JSON) after each prompt, so a long run that stops keeps them."""
    locks_kwargs = dict(locks_kwargs or {})
    check_tasks(task_names)
    if prompts is not None:
        missing = [(t, n, s) for t in task_names for n in lengths for s in range(seeds) if (t, n, s) not in prompts]
        if missing:
            raise ValueError(f"locks_lab suite: the prompts file has no prompt for {missing[:3]}"
                             f"{' ...' if len(missing) > 3 else ''} (task, length, seed)")
    methods = [(m, *parse_method(m)) for m in selectors]
    methods = [m for m in methods if m[1] != "fullkv"]
    configs = {(m, b): hf.LocksConfig(budget=b, selector=sel, tau=tau, **locks_kwargs)
               for m, sel, tau in methods for b in budgets}
    for c in configs.values():  # every option checked before the first generation
        c.validate()
    base_kwargs = {k: v for k, v in locks_kwargs.items() if k != "floor_pages"}
    rows = []
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    for name in task_names:
        gen, new_tokens = GENERATORS[name]
        for n in lengths:
            for seed in range(seeds):
                task = prompts[(name, n, seed)] if prompts is not None else gen(tok, n, seed=seed)
                ids = tok(task.prompt, return_tensors="pt").input_ids.to(model.device)
                t0 = time.perf_counter()
                with attn_implementation(model, _dense_impl(model)):
                    full = tok.decode(_generate(model, ids, None, new_tokens, pad_id), skip_special_tokens=True)
                full_score = task.score(full)
                rows.append(dict(task=name, length=n, prompt_tokens=ids.shape[1], seed=seed, method="fullkv",
                                 budget=None, tau=0.0, score=full_score, output=full, answers=task.answers))
                first = len(rows)
                with attn_implementation(model, hf.ATTN_NAME):
                    base = hf.LocksCache(model.config, budget=None, **base_kwargs)
                    model(input_ids=ids[:, :-1], use_cache=True, logits_to_keep=1, **{hf.cache_kwarg(model): base})
                    for m, sel, tau in methods:
                        for b in budgets:
                            cache = base.with_config(configs[(m, b)])
                            att = _Attended(cache)
                            out = tok.decode(_generate(model, ids, cache, new_tokens, pad_id, [att]),
                                             skip_special_tokens=True)
                            per_layer = att.per_layer()
                            rows.append(dict(task=name, length=n, prompt_tokens=ids.shape[1], seed=seed, method=m,
                                             selector=sel, budget=b, tau=tau, score=task.score(out), output=out,
                                             answers=task.answers, fullkv_score=full_score,
                                             attended_mean=sum(per_layer) / len(per_layer) if per_layer else None,
                                             attended_per_layer=per_layer))
                progress(f"{name} {n} seed {seed}: FullKV {full_score:.2f}; "
                         + ", ".join(f"{r['method']}@{r['budget']} {r['score']:.2f}" for r in rows[first:])
                         + f" ({time.perf_counter() - t0:.0f} s)")
                if checkpoint:
                    with open(checkpoint, "w") as f:
                        json.dump(rows, f)
    return rows


def table(rows) -> str:
    """Mean score per task x length x method x budget (FullKV beside), markdown."""
    acc = defaultdict(list)
    for r in rows:
        acc[(r["task"], r["length"], r["method"], r["budget"])].append(r["score"])
    budgets = sorted({r["budget"] for r in rows if r["budget"] is not None})
    methods = [m for m in dict.fromkeys(r["method"] for r in rows) if m != "fullkv"]
    head = "| task | length | FullKV | " + " | ".join(f"{m} b={b}" for m in methods for b in budgets) + " |"
    lines = [head, "|" + "---|" * (3 + len(methods) * len(budgets))]
    for task, length in dict.fromkeys((r["task"], r["length"]) for r in rows):
        mean = lambda k: sum(acc[k]) / len(acc[k]) if acc[k] else float("nan")  # noqa: E731
        cells = [f"{mean((task, length, m, b)):.2f}" for m in methods for b in budgets]
        lines.append(f"| {task} | {length} | {mean((task, length, 'fullkv', None)):.2f} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def attended_table(rows) -> str:
    """Mean tokens attended per decode step (over tasks, lengths, seeds, steps, layers and KV
    heads) per method x budget, markdown; "-" where not recorded."""
    budgets = sorted({r["budget"] for r in rows if r["budget"] is not None})
    methods = [m for m in dict.fromkeys(r["method"] for r in rows) if m != "fullkv"]
    lines = ["| method | " + " | ".join(f"b={b}" for b in budgets) + " |", "|" + "---|" * (1 + len(budgets))]
    for m in methods:
        cells = []
        for b in budgets:
            v = [r["attended_mean"] for r in rows if r["method"] == m and r["budget"] == b
                 and r.get("attended_mean") is not None]
            cells.append(f"{sum(v) / len(v):.0f}" if v else "-")
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def curves(rows):
    """(budgets, {method: mean score per budget}, FullKV mean) over every task and length."""
    budgets = sorted({r["budget"] for r in rows if r["budget"] is not None})
    full = [r["score"] for r in rows if r["method"] == "fullkv"]
    out = {}
    for m in dict.fromkeys(r["method"] for r in rows if r["method"] != "fullkv"):
        out[m] = [sum(r["score"] for r in rows if r["method"] == m and r["budget"] == b) /
                  max(1, sum(1 for r in rows if r["method"] == m and r["budget"] == b)) for b in budgets]
    return budgets, out, sum(full) / max(1, len(full))


def plot(rows, png: str) -> bool:
    """Mean task score vs budget per method (FullKV dashed), with gnuplot run on a written
    script by argument vector (no shell), as `locks eval` plots; False without gnuplot."""
    import shutil
    import subprocess

    gp = shutil.which("gnuplot")
    if gp is None:
        return False
    budgets, ys, full = curves(rows)
    folder, name = os.path.split(os.path.abspath(png))
    with open(os.path.join(folder, "accuracy.dat"), "w") as f:
        f.write("# budget " + " ".join(ys) + "\n")
        for i, b in enumerate(budgets):
            f.write(f"{b} " + " ".join(f"{ys[m][i]:.4f}" for m in ys) + "\n")
    series = ", ".join(f"'accuracy.dat' using 1:{i + 2} with linespoints title '{m}'" for i, m in enumerate(ys))
    with open(os.path.join(folder, "accuracy.gp"), "w") as f:
        f.write(f"set terminal pngcairo size 720,480\nset output '{name}'\nset logscale x 2\n"
                "set xlabel 'budget (tokens)'\nset ylabel 'mean task score'\nset yrange [0:1.05]\n"
                f"plot {series}, {full:.4f} with lines dashtype 2 title 'FullKV'\n")
    r = subprocess.run([gp, "accuracy.gp"], cwd=folder, capture_output=True, timeout=60)
    return r.returncode == 0


def write(rows, out_dir: str, meta: dict) -> None:
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "suite.json"), "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)
    with open(os.path.join(out_dir, "table.md"), "w") as f:
        f.write(table(rows))
        f.write("\nMean tokens attended per decode step (per layer, sequence and KV head):\n\n")
        f.write(attended_table(rows))
    plot(rows, os.path.join(out_dir, "accuracy.png"))
