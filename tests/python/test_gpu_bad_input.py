"""Issue #12 on the GPU: the bad-input matrix of the CUDA operators. Each case runs in its own
process (an illegal memory access would poison the CUDA context of every later test): the
bad call must raise the named error, or — for device-side values the host cannot see
without a sync (block ids, lengths) — must not fault: the context stays usable and a
following good call gives the right answer."""
import json
import os
import subprocess
import sys
import textwrap

import pytest

from gpu_util import needs_cuda

pytestmark = [pytest.mark.gpu, needs_cuda]

PRELUDE = textwrap.dedent('''
    import json, sys, torch, locks
    from locks import ops
    L = torch.ops.locks
    P, H, HQ, D, B, MB = 16, 2, 8, 128, 2, 8
    NB = B * MB
    g = torch.Generator().manual_seed(0)
    k = torch.randn(NB, P, H, D, generator=g).to(torch.bfloat16).cuda()
    v = torch.randn(NB, P, H, D, generator=g).to(torch.bfloat16).cuda()
    bt = torch.arange(NB, dtype=torch.int32).view(B, MB).cuda()
    sl = torch.tensor([100, 37], dtype=torch.int32).cuda()
    q = torch.randn(B, HQ, D, generator=g).cuda()
    s = list(ops.new_summaries(NB, H, D, P, 8, "cuda", "int4"))
    ops.summary_build(k, torch.arange(NB, dtype=torch.int32, device="cuda"), s)
    w = locks.DecodeWrapper.allocate(num_q_heads=HQ, num_kv_heads=H, head_dim=D, num_blocks=NB,
                                     max_batch=B, max_blocks_per_seq=MB, budget_tokens=48, device="cuda")
    ws, plan = w.workspace, w.plan_vector
    pages = torch.empty(B, H, w.capacity, dtype=torch.int32, device="cuda")
    counts = torch.empty(B, H, dtype=torch.int32, device="cuda")
    out = torch.empty(B, HQ, D, device="cuda"); lse = torch.empty(B, HQ, device="cuda")
    def sel(**o):
        a = dict(ws=ws, plan=plan, q=q, s=s, bt=bt, sl=sl, pages=pages, counts=counts); a.update(o)
        L.select_pages(a["ws"], a["plan"], a["q"], a["s"], a["bt"], a["sl"], a["pages"], a["counts"])
    def att(**o):
        a = dict(ws=ws, plan=plan, q=q, k=k, v=v, bt=bt, sl=sl, pages=None, counts=None, out=out, lse=lse); a.update(o)
        L.decode_attention(a["ws"], a["plan"], a["q"], a["k"], a["v"], a["bt"], a["sl"], a["pages"], a["counts"], a["out"], a["lse"])
    ref_out, ref_lse = w.run(q, k, v, s, bt, sl, dense=True)
    torch.cuda.synchronize()
    ref_out, ref_lse = ref_out.clone(), ref_lse.clone()
    res = {}
    try:
        CALL
        res["raised"] = None
    except Exception as e:
        res["raised"], res["msg"] = type(e).__name__, str(e).split("\\n")[0][:300]
    try:
        torch.cuda.synchronize()
        o2, l2 = w.run(q, k, v, s, bt, sl, dense=True)
        torch.cuda.synchronize()
        res["context_ok"] = bool(torch.equal(o2, ref_out) and torch.equal(l2, ref_lse))
    except Exception as e:
        res["context_ok"], res["after"] = False, f"{type(e).__name__}: {e}"[:300]
    print("RESULT " + json.dumps(res))
''')

# (id, statement, expected exception name or None for "device-side value: must not fault", message words)
CASES = [
    ("q_on_cpu", "sel(q=q.cpu())", "ValueError", "mixed devices|is on cpu"),
    ("k_cache_on_cpu", "att(k=k.cpu())", "ValueError", "mixed devices|is on cpu"),
    ("workspace_on_cpu", "sel(ws=ws.cpu())", "ValueError", "mixed devices|is on cpu"),
    ("summary_on_cpu", "sel(s=[s[0].cpu(), *s[1:]])", "ValueError", "mixed devices|is on cpu"),
    ("out_on_cpu", "att(out=out.cpu())", "ValueError", "mixed devices|is on cpu"),
    ("out_on_meta", "att(out=torch.empty(B, HQ, D, device='meta'))", "ValueError", "meta|mixed"),
    ("cpu_plan_on_cuda", "sel(plan=locks.DecodeWrapper.allocate(num_q_heads=HQ, num_kv_heads=H, head_dim=D, num_blocks=NB, max_batch=B, max_blocks_per_seq=MB, budget_tokens=48).plan_vector)", "ValueError", "cpu backend"),
    ("block_table_int64", "att(bt=bt.long())", "ValueError", "block_table"),
    ("q_bfloat16", "att(q=q.bfloat16())", "ValueError", "q"),
    ("v_float32", "att(v=v.float())", "ValueError", "v_cache"),
    ("summaries_float16", "sel(s=[t.half() if t.is_floating_point() else t for t in s])", "ValueError", "summaries"),
    ("float32_cache_plan", "locks.DecodeWrapper.allocate(num_q_heads=HQ, num_kv_heads=H, head_dim=D, num_blocks=NB, max_batch=B, max_blocks_per_seq=MB, kv_dtype=torch.float32, device='cuda')", "NotImplementedError", "float32"),
    ("head_dim_96_plan", "locks.DecodeWrapper.allocate(num_q_heads=HQ, num_kv_heads=H, head_dim=96, num_blocks=NB, max_batch=B, max_blocks_per_seq=MB, device='cuda')", "NotImplementedError", "head_dim"),
    ("batch_past_plan", "att(q=torch.cat([q, q]), bt=torch.cat([bt, bt]), sl=torch.cat([sl, sl]), out=torch.cat([out, out]), lse=torch.cat([lse, lse]))", "ValueError", "batch"),
    ("pages_past_capacity", "att(pages=torch.zeros(B, H, w.capacity + 1, dtype=torch.int32, device='cuda'), counts=counts)", "ValueError", "capacity"),
    ("workspace_too_small", "sel(ws=ws[:256])", "ValueError", "workspace"),
    ("slot_mapping_int64", "L.summary_update(k, bt, sl, torch.tensor([15], device='cuda'), s)", "ValueError", "slot_mapping"),
    # device-side values (no host sync to check them): no fault, the context stays usable
    ("block_id_out_of_range", "att(bt=torch.full_like(bt, NB + 1000))", None, ""),
    ("block_id_negative", "att(bt=torch.full_like(bt, -5))", None, ""),
    ("lens_past_capacity", "att(sl=torch.tensor([MB * P + 500, 37], dtype=torch.int32, device='cuda'))", None, ""),
    ("lens_negative", "att(sl=torch.tensor([-7, 37], dtype=torch.int32, device='cuda'))", None, ""),
    ("select_lens_past_capacity", "sel(sl=torch.tensor([MB * P + 500, 37], dtype=torch.int32, device='cuda'))", None, ""),
    ("selected_page_out_of_range", "att(pages=torch.full_like(pages, 10_000), counts=torch.full_like(counts, w.capacity))", None, ""),
    ("update_slot_out_of_range", "L.summary_update(k, bt, sl, torch.tensor([NB * P * 4 + 15], dtype=torch.int32, device='cuda'), s)", None, ""),
    ("build_block_out_of_range", "ops.summary_build(k, torch.tensor([NB + 3], dtype=torch.int32, device='cuda'), s)", None, ""),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_cuda_bad_input(case):
    name, stmt, exc, words = case
    code = PRELUDE.replace("CALL", stmt)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "CUDA_LAUNCH_BLOCKING": "0"})
    lines = [x for x in r.stdout.splitlines() if x.startswith("RESULT ")]
    assert r.returncode == 0 and lines, f"{name}: the process died (rc {r.returncode}): {r.stderr[-2000:]}"
    res = json.loads(lines[-1][7:])
    print(name, res)
    assert res["context_ok"], f"{name}: the CUDA context did not survive: {res}"
    if exc is not None:
        assert res["raised"] == exc, f"{name}: expected {exc}, got {res}"
        import re

        assert re.search(words, res["msg"]), f"{name}: message {res['msg']!r} lacks {words!r}"
    else:
        # a host-checkable error is fine too; a CUDA fault is not (caught by context_ok)
        assert res["raised"] in (None, "ValueError"), f"{name}: {res}"
