"""Issue #12 on the GPU: the bad-input matrix of the CUDA operators. Each case runs in its own
process (an illegal memory access would poison the CUDA context of every later test): the
bad call must raise the named error, or — for device-side values the host cannot see
without a sync (block ids, lengths) — must not fault: the context stays usable and a
following good call gives the right answer. For attention, such values must also give NaN
rows exactly where docs/bad_input.md says ("Device-side values (CUDA)") and leave the other
rows bit-identical; with validate=True the same values raise ValueError."""
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
    def bt_with(b, j, val):
        t = bt.clone(); t[b, j] = val; return t
    out.zero_(); lse.zero_()
    res = {}
    try:
        CALL
        res["raised"] = None
        torch.cuda.synchronize()
        res["row_nan"] = [bool(torch.isnan(out[b]).all() and torch.isnan(lse[b]).all()) for b in range(B)]
        res["row_same"] = [bool(torch.equal(out[b], ref_out[b]) and torch.equal(lse[b], ref_lse[b])) for b in range(B)]
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

# (id, statement, expected exception name or None for "device-side value: must not fault", message
# words[, NaN rows: for a dense attention call, the sequences whose whole out/lse rows must be
# NaN, every other row bit-identical to the clean dense run; "all": every row NaN])
CASES = [
    ("q_on_cpu", "sel(q=q.cpu())", "ValueError", "mixed devices|is on cpu"),
    ("k_cache_on_cpu", "att(k=k.cpu())", "ValueError", "mixed devices|is on cpu"),
    ("workspace_on_cpu", "sel(ws=ws.cpu())", "ValueError", "mixed devices|is on cpu"),
    ("summary_on_cpu", "sel(s=[s[0].cpu(), *s[1:]])", "ValueError", "mixed devices|is on cpu"),
    ("out_on_cpu", "att(out=out.cpu())", "ValueError", "mixed devices|is on cpu"),
    ("out_on_meta", "att(out=torch.empty(B, HQ, D, device='meta'))", "ValueError", "meta|mixed"),
    ("cpu_plan_on_cuda", "sel(plan=locks.DecodeWrapper.allocate(num_q_heads=HQ, num_kv_heads=H, head_dim=D, num_blocks=NB, max_batch=B, max_blocks_per_seq=MB, budget_tokens=48).plan_vector)", "ValueError", "cpu backend"),
    ("block_table_int64", "att(bt=bt.long())", "ValueError", "block_table"),
    ("q_float64", "att(q=q.double())", "ValueError", "q: dtype"),
    # (bf16 queries are served; the attention kernel reads them two elements at a time)
    ("q_odd_row_stride", "att(q=torch.empty(B * (HQ * D + 1), dtype=torch.bfloat16, device='cuda').as_strided(q.shape, (HQ * D + 1, D, 1)))", "ValueError", "even stride"),
    ("v_float32", "att(v=v.float())", "ValueError", "v_cache"),
    ("summaries_float16", "sel(s=[t.half() if t.is_floating_point() else t for t in s])", "ValueError", "summaries"),
    ("float32_cache_plan", "locks.DecodeWrapper.allocate(num_q_heads=HQ, num_kv_heads=H, head_dim=D, num_blocks=NB, max_batch=B, max_blocks_per_seq=MB, kv_dtype=torch.float32, device='cuda')", "NotImplementedError", "float32"),
    ("head_dim_96_plan", "locks.DecodeWrapper.allocate(num_q_heads=HQ, num_kv_heads=H, head_dim=96, num_blocks=NB, max_batch=B, max_blocks_per_seq=MB, device='cuda')", "NotImplementedError", "head_dim"),
    ("batch_past_plan", "att(q=torch.cat([q, q]), bt=torch.cat([bt, bt]), sl=torch.cat([sl, sl]), out=torch.cat([out, out]), lse=torch.cat([lse, lse]))", "ValueError", "batch"),
    ("pages_past_capacity", "att(pages=torch.zeros(B, H, w.capacity + 1, dtype=torch.int32, device='cuda'), counts=counts)", "ValueError", "capacity"),
    ("workspace_too_small", "sel(ws=ws[:256])", "ValueError", "workspace"),
    ("slot_mapping_int64", "L.summary_update(k, bt, sl, torch.tensor([15], device='cuda'), s)", "ValueError", "slot_mapping"),
    # block strides (kv_cache.h): the CUDA kernels' 16-byte loads need every block 16-byte
    # aligned (bf16: a stride that is a multiple of 8 elements); K and V disjoint
    ("block_stride_unaligned", "att(k=torch.empty(NB * (P*H*D + 4), dtype=torch.bfloat16, device='cuda').as_strided(k.shape, (P*H*D + 4, H*D, D, 1)), v=torch.empty(NB * (P*H*D + 4), dtype=torch.bfloat16, device='cuda').as_strided(k.shape, (P*H*D + 4, H*D, D, 1)))", "ValueError", "16 bytes"),
    ("build_block_stride_unaligned", "L.summary_build(torch.empty(NB * (P*H*D + 4), dtype=torch.bfloat16, device='cuda').as_strided(k.shape, (P*H*D + 4, H*D, D, 1)), torch.arange(NB, dtype=torch.int32, device='cuda'), s)", "ValueError", "16-byte aligned"),
    ("k_block_not_contiguous", "att(k=k.transpose(1, 2).contiguous().transpose(1, 2))", "ValueError", "k_cache: each block"),
    ("v_is_k", "att(v=k)", "ValueError", "overlap"),
    # device-side values (no host sync to check them): no fault, the context stays usable
    ("block_id_out_of_range", "att(bt=torch.full_like(bt, NB + 1000))", None, "", [0, 1]),
    ("block_id_negative", "att(bt=torch.full_like(bt, -5))", None, "", [0, 1]),
    ("block_id_one_sequence", "att(bt=bt_with(1, 2, NB))", None, "", [1]),
    ("block_id_unused_entry", "att(bt=bt_with(1, 5, 2**31 - 1))", None, "", []),  # seq 1 has 3 pages
    ("lens_past_capacity", "att(sl=torch.tensor([MB * P + 500, 37], dtype=torch.int32, device='cuda'))", None, "", [0]),
    ("lens_negative", "att(sl=torch.tensor([-7, 37], dtype=torch.int32, device='cuda'))", None, "", [0]),
    ("lens_zero", "att(sl=torch.tensor([100, 0], dtype=torch.int32, device='cuda'))", None, "", [1]),
    ("select_lens_past_capacity", "sel(sl=torch.tensor([MB * P + 500, 37], dtype=torch.int32, device='cuda'))", None, ""),
    ("selected_page_out_of_range", "att(pages=torch.full_like(pages, 10_000), counts=torch.full_like(counts, w.capacity))", None, "", "all"),
    ("selected_count_out_of_range", "att(pages=torch.zeros_like(pages), counts=torch.full_like(counts, w.capacity + 1))", None, "", "all"),
    ("run_sparse_lens_negative", "out[:], lse[:] = w.run(q, k, v, s, bt, torch.tensor([-7, 37], dtype=torch.int32, device='cuda'))", None, "", "first"),
    # validate=True: the same device-side values raise ValueError (one sync, eager only)
    ("validate_block_id", "w.run(q, k, v, s, bt_with(1, 2, NB), sl, validate=True)", "ValueError", r"block_table\[1, 2\] = 16"),
    ("validate_block_id_negative", "w.run(q, k, v, s, bt_with(0, 0, -5), sl, dense=True, validate=True)", "ValueError", r"block_table\[0, 0\] = -5"),
    ("validate_lens", "w.attend(q, k, v, bt, torch.tensor([MB * P + 1, 37], dtype=torch.int32, device='cuda'), validate=True)", "ValueError", r"seq_lens\[0\] = 129"),
    ("validate_select_lens", "w.select(q, s, bt, torch.tensor([100, -1], dtype=torch.int32, device='cuda'), validate=True)", "ValueError", r"seq_lens\[1\] = -1"),
    ("validate_page", "w.attend(q, k, v, bt, sl, pages=torch.full_like(pages, 10_000), counts=torch.full_like(counts, 1), validate=True)", "ValueError", r"pages\[0, 0, 0\] = 10000"),
    ("validate_count", "w.attend(q, k, v, bt, sl, pages=torch.zeros_like(pages), counts=torch.full_like(counts, w.capacity + 1), validate=True)", "ValueError", r"counts\[0, 0\]"),
    ("validate_slot", "ops.summary_update(k, bt, sl, s, slot_mapping=torch.tensor([15, NB * P + 15], dtype=torch.int32, device='cuda'), validate=True)", "ValueError", r"slot_mapping\[1\]"),
    ("validate_build_block", "ops.summary_build(k, torch.tensor([0, NB + 3], dtype=torch.int32, device='cuda'), s, validate=True)", "ValueError", r"block_ids\[1\] = 19"),
    ("update_slot_out_of_range", "L.summary_update(k, bt, sl, torch.tensor([NB * P * 4 + 15], dtype=torch.int32, device='cuda'), s)", None, ""),
    ("build_block_out_of_range", "ops.summary_build(k, torch.tensor([NB + 3], dtype=torch.int32, device='cuda'), s)", None, ""),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_cuda_bad_input(case):
    name, stmt, exc, words = case[:4]
    nan_rows = case[4] if len(case) > 4 else None
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
        if nan_rows is not None:
            assert res["raised"] is None, f"{name}: {res}"
            if nan_rows == "all":
                assert all(res["row_nan"]), f"{name}: every row must be NaN: {res}"
            elif nan_rows == "first":  # sparse run: seq 0 NaN, seq 1 finite (its own selection)
                assert res["row_nan"][0] and not res["row_nan"][1], f"{name}: {res}"
            else:
                for b in range(len(res["row_nan"])):
                    if b in nan_rows:
                        assert res["row_nan"][b], f"{name}: row {b} must be NaN: {res}"
                    else:
                        assert res["row_same"][b], f"{name}: row {b} must equal the clean run: {res}"
