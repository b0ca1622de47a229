"""The GPU checks (run on the H200; results in docs/python_gpu_results.md).

  python -m locks_lab.gpu_check ops   --out DIR   CUDA ops vs CPU ops, opcheck, op-level CUDA graph
  python -m locks_lab.gpu_check model --out DIR   SmolLM2 (bf16) with the CUDA ops: a batch of 4
                                              prompts of different lengths, FullKV vs LOCKS, and
                                              the decode step captured in a CUDA graph and
                                              replayed against eager

Every section runs in its own try block and records its error instead of stopping the run."""
from __future__ import annotations

import copy
import json
import os
import sys
import time
import traceback

import torch

from locks import ops

R: dict = {}
OUT = {"dir": "."}


def _dump(what):
    os.makedirs(OUT["dir"], exist_ok=True)
    with open(os.path.join(OUT["dir"], f"gpu_{what}.json"), "w") as f:
        json.dump(R, f, indent=2, default=str)


def section(name):
    def deco(fn):
        def run(*a, **k):
            t0 = time.perf_counter()
            try:
                R[name] = fn(*a, **k)
            except Exception as e:  # noqa: BLE001 - recorded, the run goes on
                R[name] = {"error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()[-2000:]}
            R[name] = {**R[name], "seconds": round(time.perf_counter() - t0, 2)} if isinstance(R[name], dict) else R[name]
            print(name, json.dumps(R[name], default=str)[:1500], flush=True)
            _dump(OUT.get("what", "run"))
        return run
    return deco


def _paged(B=4, lens=(700, 1500, 2300, 4000), H=3, Hq=9, d=64, P=16, dtype=torch.bfloat16, seed=0):
    g = torch.Generator().manual_seed(seed)
    mb = -(-max(lens) // P) + 4
    nb = B * mb
    basis = torch.randn(nb, H, 4, d, generator=g)
    coef = torch.randn(nb, P, H, 4, generator=g) * 2
    k = (torch.einsum("bphr,bhrd->bphd", coef, basis) + 0.2 * torch.randn(nb, P, H, d, generator=g)).contiguous()
    v = torch.randn(nb, P, H, d, generator=g)
    bt = torch.randperm(nb, generator=g).to(torch.int32).view(B, mb).contiguous()
    sl = torch.tensor(lens, dtype=torch.int32)
    q = torch.randn(B, Hq, d, generator=g)
    return k.to(dtype), v.to(dtype), bt, sl, q


@section("ops_vs_cpu")
def ops_vs_cpu():
    k, v, bt, sl, q = _paged()
    dev = "cuda"
    P, H, d = 16, 3, 64
    nb = k.shape[0]
    full = torch.cat([bt[b, : int(sl[b]) // P] for b in range(bt.shape[0])]).contiguous()
    sc, sg = ops.new_summaries(nb, H, d, P, 8), ops.new_summaries(nb, H, d, P, 8, dev)
    ops.summary_build(k, full, sc)
    ops.summary_build(k.to(dev), full.to(dev), sg)
    # bases' signs are the solver's: compare the reconstructions mu + coeff @ basis
    rec = lambda s: (s.mu[:, None] + torch.einsum("bhpr,bhrd->bphd", s.coeff, s.basis))[full.long()].cpu()  # noqa: E731
    rec_err = float((rec(sg) - rec(sc)).abs().max())
    out = {"summary_reconstruction_max_abs_diff": rec_err}
    for budget in (128, 512):
        pc, cc = ops.select_pages(q, sc, bt, sl, budget)
        pg, cg = ops.select_pages(q.to(dev), sg, bt.to(dev), sl.to(dev), budget)
        same = float((pg.cpu() == pc).float().mean())
        oc, lc = ops.sparse_decode(q, k, v, bt, sl, pc, cc)
        og, lg = ops.sparse_decode(q.to(dev), k.to(dev), v.to(dev), bt.to(dev), sl.to(dev), pc.to(dev), cc.to(dev))
        out[f"b{budget}_selection_equal_share"] = same
        out[f"b{budget}_sparse_out_max_abs_diff"] = float((og.cpu() - oc).abs().max())
        out[f"b{budget}_sparse_lse_max_abs_diff"] = float((lg.cpu() - lc).abs().max())
    qc, qg = ops.new_summaries(nb, H, d, P, 8, precision="int4"), ops.new_summaries(nb, H, d, P, 8, dev, "int4")
    ops.summary_build(k, full, qc)
    ops.summary_build(k.to(dev), full.to(dev), qg)
    for budget in (128, 512):
        pc, _ = ops.select_pages(q, qc, bt, sl, budget)
        pg, _ = ops.select_pages(q.to(dev), qg, bt.to(dev), sl.to(dev), budget)
        out[f"int4_b{budget}_selection_equal_share"] = float((pg.cpu() == pc).float().mean())
    od, _ = ops.dense_decode(q, k, v, bt, sl)
    og, _ = ops.dense_decode(q.to(dev), k.to(dev), v.to(dev), bt.to(dev), sl.to(dev))
    out["dense_out_max_abs_diff"] = float((og.cpu() - od).abs().max())
    return out


@section("opcheck_cuda")
def opcheck_cuda():
    k, v, bt, sl, q = [t.cuda() for t in _paged(B=2, lens=(70, 33))]
    P, H, d = 16, 3, 64
    s = ops.new_summaries(k.shape[0], H, d, P, 8, "cuda")
    ops.summary_build(k, torch.arange(k.shape[0], dtype=torch.int32, device="cuda"), s)
    cap = ops.select_capacity(48, P, bt.shape[1])
    pages = torch.empty(2, H, cap, dtype=torch.int32, device="cuda")
    counts = torch.empty(2, H, dtype=torch.int32, device="cuda")
    ops.select_pages(q, s, bt, sl, 48, pages=pages, counts=counts)
    out, lse = torch.empty_like(q), torch.empty(2, 9, device="cuda")
    s2 = ops.new_summaries(k.shape[0], H, d, P, 8, "cuda")
    L = torch.ops.locks
    cases = {
        "summary_build": (L.summary_build.default, (k, torch.arange(k.shape[0], dtype=torch.int32, device="cuda"), *s2)),
        "summary_update": (L.summary_update.default, (k, bt, torch.tensor([64, 33], dtype=torch.int32, device="cuda"), *s2)),
        "select_pages": (L.select_pages.default, (q, *s, bt, sl, 48, 0, 0, 0.125, pages.clone(), counts.clone())),
        "sparse_decode": (L.sparse_decode.default, (q, k, v, bt, sl, pages, counts, 0.125, out, lse)),
        "dense_decode": (L.dense_decode.default, (q, k, v, bt, sl, 0.125, out.clone(), lse.clone())),
    }
    sq = ops.new_summaries(k.shape[0], H, d, P, 8, "cuda", "int4")
    ops.summary_build(k, torch.arange(k.shape[0], dtype=torch.int32, device="cuda"), sq)
    cases["select_pages_quant"] = (L.select_pages_quant.default, (q, *sq, bt, sl, 48, 0, 0, 0.125, pages.clone(), counts.clone()))
    cases["summary_update_quant"] = (L.summary_update_quant.default, (k, bt, torch.tensor([64, 33], dtype=torch.int32, device="cuda"), *ops.new_summaries(k.shape[0], H, d, P, 8, "cuda", "int4")))
    res = {}
    for name, (op, args) in cases.items():
        try:
            torch.library.opcheck(op, args)
            res[name] = "pass"
        except Exception as e:  # noqa: BLE001
            res[name] = f"FAIL {type(e).__name__}: {str(e)[:300]}"
    return res


@section("op_level_cuda_graph")
def op_level_graph(layers=30, steps=8):
    """A decode step of `layers` layers built from the ops (append K/V, summary update, select,
    sparse attention), captured once and replayed; outputs compared with eager."""
    P, H, d, B = 16, 3, 64, 4
    base = [_paged(seed=i) for i in range(layers)]
    def state():
        return [dict(k=k.cuda(), v=v.cuda(), bt=bt.cuda(), sl=sl.cuda(),
                     s=ops.new_summaries(k.shape[0], H, d, P, 8, "cuda")) for k, v, bt, sl, _ in base]
    qs = torch.randn(steps, layers, B, 9, d, device="cuda")
    kv_new = torch.randn(steps, layers, 2, B, H, d, device="cuda").to(torch.bfloat16)
    q_in = torch.zeros(layers, B, 9, d, device="cuda")
    kv_in = torch.zeros(layers, 2, B, H, d, device="cuda", dtype=torch.bfloat16)

    def step(st, outs):
        for i, c in enumerate(st):
            rows = torch.arange(B, device="cuda")
            blk = c["bt"][rows, (c["sl"] // P).long()].long()
            slot = (c["sl"] % P).long()
            c["k"][blk, slot] = kv_in[i, 0]
            c["v"][blk, slot] = kv_in[i, 1]
            c["sl"] += 1
            ops.summary_update(c["k"], c["bt"], c["sl"], c["s"])
            pages, counts = ops.select_pages(q_in[i], c["s"], c["bt"], c["sl"], 512)
            ops.sparse_decode(q_in[i], c["k"], c["v"], c["bt"], c["sl"], pages, counts, out=outs[i][0], lse=outs[i][1])

    def init(st):
        for c in st:
            full = torch.cat([c["bt"][b, : int(c["sl"][b]) // P] for b in range(B)]).contiguous()
            ops.summary_build(c["k"], full, c["s"])

    eager_st, graph_st = state(), state()
    init(eager_st); init(graph_st)
    outs_e = [(torch.empty(B, 9, d, device="cuda"), torch.empty(B, 9, device="cuda")) for _ in range(layers)]
    outs_g = [(torch.empty(B, 9, d, device="cuda"), torch.empty(B, 9, device="cuda")) for _ in range(layers)]
    warm = state(); init(warm)
    q_in.copy_(qs[0]); kv_in.copy_(kv_new[0])
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        step(warm, outs_g)  # plans every decoder / builder for these shapes
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step(graph_st, outs_g)
    max_diff, equal = 0.0, True
    te = tg = 0.0
    for t in range(steps):
        q_in.copy_(qs[t]); kv_in.copy_(kv_new[t])
        torch.cuda.synchronize(); t0 = time.perf_counter()
        step(eager_st, outs_e)
        torch.cuda.synchronize(); t1 = time.perf_counter()
        graph.replay()
        torch.cuda.synchronize(); t2 = time.perf_counter()
        if t > 0:
            te += t1 - t0; tg += t2 - t1
        for (oe, le), (og, lg) in zip(outs_e, outs_g):
            max_diff = max(max_diff, float((oe - og).abs().max()), float((le - lg).abs().max()))
            equal = equal and torch.equal(oe, og) and torch.equal(le, lg)
    return {"layers": layers, "batch_lens": [700, 1500, 2300, 4000], "steps": steps, "budget": 512,
            "replay_bitwise_equal_eager": equal, "max_abs_diff": max_diff,
            "eager_ms_per_step": 1e3 * te / (steps - 1), "graph_ms_per_step": 1e3 * tg / (steps - 1)}


def _model():
    from locks.model import load_smollm2

    return load_smollm2(device="cuda", dtype=torch.bfloat16)


@section("model_batch4")
def model_batch4(model, tok, budget=512):
    from . import evaluate, tasks

    ts = [tasks.passkey(tok, n, depth=0.3 + 0.1 * i, seed=i) for i, n in enumerate((1000, 2000, 3000, 4000))]
    r = evaluate.side_by_side(model, tok, [t.prompt for t in ts], max_new_tokens=16, budget=budget)
    return {"prompt_tokens": [len(tok(t.prompt).input_ids) for t in ts], "budget": budget,
            "full": r.full_text, "locks": r.locks_text, "generated_agreement": r.agreement,
            "first_divergence": r.first_divergence,
            "passkey_full": [t.score(x) for t, x in zip(ts, r.full_text)],
            "passkey_locks": [t.score(x) for t, x in zip(ts, r.locks_text)],
            "full_decode_tok_s": r.decode_tok_s("full"), "locks_decode_tok_s": r.decode_tok_s("locks"),
            "full_prefill_s": r.full_prefill_s, "locks_prefill_s": r.locks_prefill_s}


@section("model_teacher_forced")
def model_teacher_forced(model, tok):
    from . import corpus, evaluate

    ids = corpus.token_ids(tok, "python", 4096 + 64).cuda()
    res, _ = evaluate.teacher_forced(model, ids, 4096, [128, 256, 512, 1024])
    return {f"b{r.budget}": {"top1": r.top1_agreement, "mean_kl": r.mean_kl, "max_kl": r.max_kl} for r in res}


@section("model_cuda_graph")
def model_cuda_graph(model, tok, budget=512, steps=16):
    """Prefill a left-padded batch of 4 eagerly, then capture the model's one-token decode
    step (LocksCache + CUDA ops) in a CUDA graph and replay it against eager decoding."""
    from locks import hf

    from . import tasks

    hf.register()
    model.set_attn_implementation(hf.ATTN_NAME)
    kw = hf.cache_kwarg(model)
    tok.padding_side = "left"
    prompts = [tasks.passkey(tok, n, seed=i).prompt for i, n in enumerate((1000, 2000, 3000, 4000))]
    enc = tok(prompts, return_tensors="pt", padding=True).to("cuda")
    cfg = hf.LocksConfig(budget=budget, reserve_tokens=steps + 64)
    cache = hf.LocksCache(model.config, cfg)
    with torch.inference_mode():  # positions as generate makes them: real tokens only
        pos0 = (enc.attention_mask.long().cumsum(-1) - 1).clamp(min=0)
        out = model(**enc, position_ids=pos0, use_cache=True, **{kw: cache})
    first = out.logits[:, -1].argmax(-1, keepdim=True)
    eager_c, graph_c, warm_c = copy.deepcopy(cache), copy.deepcopy(cache), copy.deepcopy(cache)
    layer0 = lambda c: c.layers[0]  # noqa: E731

    def fwd(c, ids):
        pos = layer0(c).seq_lens.long().unsqueeze(1)  # real-token position of the new token
        return model(input_ids=ids, position_ids=pos, use_cache=True, **{kw: c}).logits[:, -1]

    static_ids = first.clone()
    with torch.inference_mode():
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            fwd(warm_c, static_ids)  # plan decoders, warm cuBLAS
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_logits = fwd(graph_c, static_ids)
        ids_e = first.clone()
        max_diff, same_tokens, equal = 0.0, True, True
        te = tg = 0.0
        for t in range(steps):
            torch.cuda.synchronize(); t0 = time.perf_counter()
            le = fwd(eager_c, ids_e)
            torch.cuda.synchronize(); t1 = time.perf_counter()
            graph.replay()
            torch.cuda.synchronize(); t2 = time.perf_counter()
            if t > 0:
                te += t1 - t0; tg += t2 - t1
            max_diff = max(max_diff, float((le.float() - static_logits.float()).abs().max()))
            equal = equal and torch.equal(le, static_logits)
            ne, ng = le.argmax(-1, keepdim=True), static_logits.argmax(-1, keepdim=True)
            same_tokens = same_tokens and torch.equal(ne, ng)
            ids_e = ne
            static_ids.copy_(ng)
    return {"batch_prompt_tokens": enc.attention_mask.sum(1).tolist(), "budget": budget, "steps": steps,
            "replay_logits_bitwise_equal_eager": equal, "max_abs_logit_diff": max_diff,
            "greedy_tokens_equal": same_tokens,
            "eager_ms_per_step": 1e3 * te / (steps - 1), "graph_ms_per_step": 1e3 * tg / (steps - 1)}


def main(argv=None):
    argv = argv or sys.argv[1:]
    what, out = argv[0], argv[argv.index("--out") + 1] if "--out" in argv else "."
    OUT.update(dir=out, what=what)
    R["env"] = {"torch": torch.__version__, "cuda": torch.version.cuda,
                "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None}
    try:
        import transformers

        R["env"]["transformers"] = transformers.__version__
    except ImportError:
        pass
    if what == "ops":
        ops_vs_cpu(); opcheck_cuda(); op_level_graph()
    else:
        model, tok = _model()
        model_batch4(model, tok)
        model_cuda_graph(model, tok)
        model_teacher_forced(model, tok)
    _dump(what)


if __name__ == "__main__":
    main()
