# One prefill of a suite prompt, then locks_h2 decodes at the given budget for several alphas
# (kept groups m = max(min_groups 4, ceil(alpha k / S))), plus flat LOCKS; FullKV's answer is
# the suite's row (not regenerated).
import json, sys, time, torch
from locks import hf
from locks.gemma3 import load_gemma3
from locks_lab import suite
from locks_lab.suite import GENERATORS, _generate
from locks_lab.evaluate import attn_implementation
task_name, length, budget, alphas, out_path = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
prompts = suite.load_prompts("/tmp/h2suite/prompts.json")
task = prompts[(task_name, length, 0)]
_, new_tokens = GENERATORS[task_name]
model, tok = load_gemma3(device="cpu", dtype=torch.float32)
pad_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
ids = tok(task.prompt, return_tensors="pt").input_ids
rows = []
t0 = time.perf_counter()
with torch.no_grad(), attn_implementation(model, hf.ATTN_NAME):
    base = hf.LocksCache(model.config, budget=None)
    model(input_ids=ids[:, :-1], use_cache=True, logits_to_keep=1, **{hf.cache_kwarg(model): base})
    print(f"prefill {ids.shape[1]} tokens {time.perf_counter() - t0:.0f} s", flush=True)
    runs = [("locks", None)] + [("locks_h2", float(a)) for a in alphas.split(",")]
    for sel, alpha in runs:
        cfg = hf.LocksConfig(budget=budget, selector=sel, **({} if alpha is None else {"alpha": alpha}))
        out = tok.decode(_generate(model, ids, base.with_config(cfg), new_tokens, pad_id), skip_special_tokens=True)
        rows.append(dict(task=task_name, length=length, budget=budget, selector=sel, alpha=alpha,
                         score=task.score(out), output=out, answers=task.answers))
        print(sel, alpha, task.score(out), repr(out[:80]), f"{time.perf_counter() - t0:.0f} s", flush=True)
        json.dump(rows, open(out_path, "w"))
