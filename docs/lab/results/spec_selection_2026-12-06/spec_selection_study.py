"""What a draft token loses under spec_selection "request" (docs/vllm.md, "Speculative
decoding"), on a real capture (python -m locks_lab capture): windows of T consecutive decode
queries of one layer, each token's own LOCKS selection ("token") against one selection from the
T queries together as G T heads of one row ("request", the plugin's request rows), both with
the library's compiled CPU operators over int4 summaries of the captured keys, scored by each
query's exact attention-mass recall over the prompt (the captured keys: the window's own newer
keys are not in a capture, so every query of a window attends over the same prompt).

  python3 spec_selection_study.py CAPTURE_DIR OUT.json [T,...] [BUDGETS]
"""
import json
import math
import sys

import numpy as np
import torch

import locks

P = 16


def main():
    cap, out = sys.argv[1], sys.argv[2]
    Ts = [int(x) for x in (sys.argv[3] if len(sys.argv) > 3 else "2,4").split(",")]
    budgets = [int(x) for x in (sys.argv[4] if len(sys.argv) > 4 else "256,512,1024,2048").split(",")]
    meta = json.load(open(f"{cap}/meta.json"))
    layers = meta.get("layers") or meta.get("num_layers")
    layers = range(layers) if isinstance(layers, int) else layers
    res = {"capture": cap, "rows": []}
    for L in layers:
        k = torch.from_numpy(np.load(f"{cap}/layer{L}_k.npy"))            # [tokens, H, d]
        q = torch.from_numpy(np.load(f"{cap}/layer{L}_q.npy"))            # [steps, Hq, d]
        n, H, d = k.shape
        full = n // P
        k = k[: full * P]
        n = full * P
        Hq = q.shape[1]
        G = Hq // H
        cache = k.reshape(full, P, H, d).to(torch.bfloat16).contiguous()
        s = locks.new_summaries(full, H, d, P, rank=8, precision="int4")
        locks.summary_build(cache, torch.arange(full, dtype=torch.int32), s)
        bt = torch.arange(full, dtype=torch.int32)[None]
        # exact attention probabilities of every query over the prompt: [steps, Hq, n]
        kk = k.double().repeat_interleave(G, dim=1)                          # [n, Hq, d]
        probs = torch.softmax(torch.einsum("shd,nhd->shn", q.double(), kk) / math.sqrt(d), -1)
        page_mass = probs.view(q.shape[0], Hq, full, P).sum(-1)              # [steps, Hq, pages]
        for T in Ts:
            if G * T > 32:
                continue
            for b in budgets:
                rec = {"token": [], "request": []}
                for t0 in range(0, q.shape[0] - T + 1, T):
                    qt = q[t0: t0 + T].contiguous()
                    lens = torch.full((T,), n, dtype=torch.int32)
                    pt, ct = locks.ops.select_pages(qt, s, bt.expand(T, -1).contiguous(), lens, b)
                    qr = qt.view(T, H, G, d).permute(1, 2, 0, 3).reshape(1, H * G * T, d).contiguous()
                    pr, cr = locks.ops.select_pages(qr, s, bt, lens[:1], b)
                    for i in range(T):
                        for h in range(Hq):
                            kv = h // G
                            own = pt[i, kv, : int(ct[i, kv])].long()
                            shared = pr[0, kv, : int(cr[0, kv])].long()
                            rec["token"].append(float(page_mass[t0 + i, h, own].sum()))
                            rec["request"].append(float(page_mass[t0 + i, h, shared].sum()))
                row = {"layer": int(L), "T": T, "budget": b, "n": len(rec["token"]),
                       "recall_token": float(np.mean(rec["token"])),
                       "recall_request": float(np.mean(rec["request"])),
                       "p10_token": float(np.percentile(rec["token"], 10)),
                       "p10_request": float(np.percentile(rec["request"], 10))}
                res["rows"].append(row)
                print(json.dumps(row), flush=True)
    # means over layers
    summary = {}
    for T in Ts:
        for b in budgets:
            rs = [r for r in res["rows"] if r["T"] == T and r["budget"] == b]
            if rs:
                summary[f"T{T}_b{b}"] = {k: float(np.mean([r[k] for r in rs])) for k in
                                         ("recall_token", "recall_request", "p10_token", "p10_request")}
    res["summary"] = summary
    print(json.dumps(summary, indent=1))
    json.dump(res, open(out, "w"), indent=1)


if __name__ == "__main__":
    main()
