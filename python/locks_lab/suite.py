"""The task suite (RULER style, #11): every task x context length x selector x budget as a
whole greedy generation through the drop-in, scored against the task's answers, with FullKV
(the model's own attention) as the reference.

  python -m locks_lab suite --model smollm2 --lengths 4000,8000 --budgets 64,256,1024 \\
      --selectors locks,oracle,quest --tasks all --seeds 2 --out suite-out

Per (task, length, seed) the prompt is prefilled once (all but its last token, dense, with
the summaries built); each selector x budget then decodes from a copy of that cache, the
last prompt token being its first decode step, so every method answers from the same
prefill. Writes suite.json (one row per generation), table.md (mean score per task x
method x budget, FullKV beside) and, with gnuplot, accuracy.png."""
from __future__ import annotations

import json
import os
import time
from collections import defaultdict

import torch

from locks import hf

from . import ruler, tasks
from .evaluate import _dense_impl, attn_implementation

# Task generators and how many tokens each answer needs.
GENERATORS = {
    "passkey": (tasks.passkey, 12), "needle": (tasks.needle, 24), "vt": (tasks.variable_tracking, 24),
    "mk_needle": (ruler.multikey_needle, 16), "mv_needle": (ruler.multivalue_needle, 40),
    "mq_needle": (ruler.multiquery_needle, 40), "cwe": (ruler.common_words, 60),
    "fwe": (ruler.frequent_words, 24), "manpage_qa": (ruler.manpage_qa, 24),
}


@torch.inference_mode()
def _generate(model, ids, cache, max_new_tokens, pad_id):
    kw = {hf.cache_kwarg(model): cache} if cache is not None else {}
    out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                         do_sample=False, pad_token_id=pad_id, **kw)
    return out[0, ids.shape[1]:]


@torch.inference_mode()
def run(model, tok, *, lengths, budgets, selectors, task_names, seeds, progress=print, locks_kwargs=None):
    locks_kwargs = locks_kwargs or {}
    rows = []
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    for name in task_names:
        gen, new_tokens = GENERATORS[name]
        for n in lengths:
            for seed in range(seeds):
                task = gen(tok, n, seed=seed)
                ids = tok(task.prompt, return_tensors="pt").input_ids.to(model.device)
                t0 = time.perf_counter()
                with attn_implementation(model, _dense_impl(model)):
                    full = tok.decode(_generate(model, ids, None, new_tokens, pad_id), skip_special_tokens=True)
                full_score = task.score(full)
                rows.append(dict(task=name, length=n, prompt_tokens=ids.shape[1], seed=seed, method="fullkv",
                                 budget=None, score=full_score, output=full, answers=task.answers))
                with attn_implementation(model, hf.ATTN_NAME):
                    base = hf.LocksCache(model.config, budget=None, **locks_kwargs)
                    model(input_ids=ids[:, :-1], use_cache=True, logits_to_keep=1, **{hf.cache_kwarg(model): base})
                    for sel in selectors:
                        for b in budgets:
                            cache = base.with_config(hf.LocksConfig(budget=b, selector=sel, **locks_kwargs))
                            out = tok.decode(_generate(model, ids, cache, new_tokens, pad_id), skip_special_tokens=True)
                            rows.append(dict(task=name, length=n, prompt_tokens=ids.shape[1], seed=seed, method=sel,
                                             budget=b, score=task.score(out), output=out, answers=task.answers,
                                             fullkv_score=full_score))
                progress(f"{name} {n} seed {seed}: FullKV {full_score:.2f}; "
                         + ", ".join(f"{r['method']}@{r['budget']} {r['score']:.2f}" for r in rows[-len(selectors) * len(budgets):])
                         + f" ({time.perf_counter() - t0:.0f} s)")
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
    plot(rows, os.path.join(out_dir, "accuracy.png"))
