# Two-level LOCKS's kept-group floor (min_groups) on task-suite prompts, Gemma-3-270M fp32 on
# the CPU. Per (task, length, seed): one prefill into a LocksCache, then FullKV (budget None on
# the same cache), flat LOCKS and locks_h2 at each min_groups, at each budget.
#   python3 min_groups_sweep.py OUT.json TASKS LENGTHS SEEDS BUDGETS MIN_GROUPS
#   e.g. min_groups_sweep.py out.json needle,mq_needle 16000 1 64,128,256 4,16,32,64
# SEEDS: the seeds to run (comma list; the H200 suite ran seed 0).
import json, sys, time
import torch
from locks import hf
from locks.gemma3 import load_gemma3
from locks_lab.suite import GENERATORS, _generate
from locks_lab.evaluate import attn_implementation

out_path, tasks, lengths, seeds, budgets, mgs = sys.argv[1:7]
ints = lambda s: [int(x) for x in s.split(",")]
model, tok = load_gemma3(device="cpu", dtype=torch.float32)
pad_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
rows = []
for name in tasks.split(","):
    gen, new_tokens = GENERATORS[name]
    for n in ints(lengths):
        for seed in ints(seeds):
            task = gen(tok, n, seed=seed)
            ids = tok(task.prompt, return_tensors="pt").input_ids
            t0 = time.perf_counter()
            with torch.inference_mode(), attn_implementation(model, hf.ATTN_NAME):
                base = hf.LocksCache(model.config, budget=None)
                model(input_ids=ids[:, :-1], use_cache=True, logits_to_keep=1, **{hf.cache_kwarg(model): base})
                runs = [("fullkv", None, None)] + [("locks", b, None) for b in ints(budgets)]
                runs += [("locks_h2", b, m) for b in ints(budgets) for m in ints(mgs)]
                for sel, b, m in runs:
                    if sel == "fullkv":
                        cfg = hf.LocksConfig(budget=None)
                    else:
                        cfg = hf.LocksConfig(budget=b, selector=sel, **({} if m is None else {"min_groups": m}))
                    out = tok.decode(_generate(model, ids, base.with_config(cfg), new_tokens, pad_id),
                                     skip_special_tokens=True)
                    rows.append(dict(task=name, length=n, seed=seed, prompt_tokens=ids.shape[1], selector=sel,
                                     budget=b, min_groups=m, score=task.score(out), output=out,
                                     answers=task.answers))
                    print(name, n, seed, sel, b, m, task.score(out), repr(out[:60]),
                          f"{time.perf_counter() - t0:.0f} s", flush=True)
                    json.dump(rows, open(out_path, "w"), indent=0)
