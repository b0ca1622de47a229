"""bench/peer_fa3.py without a GPU: the grid's rows, the joined report, the FA3 argument sets
checked against vLLM 0.26.0's own source (read, not run: its CUDA extensions do not load here),
and the driver end to end with a stand-in bench and a fake FA3 worker (timeouts, crashes)."""
import ast
import importlib.util
import inspect
import json
import os
import re
import subprocess
import sys

import pytest
import torch

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "bench"))

from peer import fa3_call, grid, report  # noqa: E402

ENTRY = os.path.join(ROOT, "bench", "peer_fa3.py")
HEADER = ("model,context,batch,dense_ms,locks_ms,time_ratio,dense_bytes,locks_bytes,bytes_ratio,"
          "floor_ms,floor_pct,dense_TBps,score_ms,score_TBps,aggregate_ms,select_ms,sparse_attn_ms,"
          "sparse_attn_TBps,launch_ms,build_step_ms,build_full_ms,build_none_ms")


def _csv_row(model, ctx, batch, dense, locks):
    return f"{model},{ctx},{batch},{dense},{locks}," + ",".join(["1.0"] * 17)


CSV = "\n".join([
    HEADER,
    _csv_row("Llama-3.1-8B", 131072, 1, 0.146, 0.0641),
    "Llama-3.1-8B,1048576,32,skipped: needs 131.0 GiB (K+V 128.0, summaries 1.3, workspace 1.7) "
    "of 139.0 GiB free (139.8 GiB device)",
    _csv_row("GLM-4-9B", 1048576, 1, 0.2900, 0.1188),
]) + "\n"


# -- the grid ---------------------------------------------------------------------------------
def test_models_match_the_cuda_bench():
    src = open(os.path.join(ROOT, "bench", "cuda", "bench_decode.cu")).read()
    table = src[src.index("const Model kModels[]"):]
    table = table[:table.index("};")]
    found = {m[0]: (int(m[1]), int(m[2]), int(m[3]))
             for m in re.findall(r'\{"([^"]+)",\s*(\d+),\s*(\d+),\s*(\d+)\}', table)}
    assert list(found.items()) == list(grid.MODELS.items())
    assert f"kP = {grid.PAGE}," in src


def test_reps_match_the_cuda_bench():
    src = open(os.path.join(ROOT, "bench", "cuda", "bench_decode.cu")).read()
    body = src[src.index("int reps_for("):]
    body = body[:body.index("\n}")]
    assert "> 16e9) return 3" in body and "> 4e9) return 5" in body and "quick ? 7 : 11" in body
    assert [grid.reps_for(b, q) for b, q in [(17e9, 0), (5e9, 0), (1e9, 1), (1e9, 0)]] == [3, 5, 7, 11]


def test_parse_rows():
    rows = grid.parse_rows("Llama 131072 1; GLM 1048576 1 ;Llama-3.1-70B 32768 4;")
    assert [r.key for r in rows] == [("Llama-3.1-8B", 131072, 1), ("GLM-4-9B", 1048576, 1),
                                     ("Llama-3.1-70B-TP8", 32768, 4)]
    for bad, msg in [("Mistral 1024 1", "no model name"), ("Llama 1000 1", "multiple of 16"),
                     ("Llama 1024 0", "batch"), ("Llama 1024", "MODEL CONTEXT BATCH"),
                     ("Llama x 1", "integers"), (" ; ", "no rows")]:
        with pytest.raises(ValueError, match=msg):
            grid.parse_rows(bad)


def test_parse_bench_csv_keeps_commas_of_skip_reasons():
    rows = grid.parse_bench_csv(CSV + CSV)  # two --only files concatenated: headers repeat
    assert len(rows) == 6
    assert rows[0].row.key == ("Llama-3.1-8B", 131072, 1) and rows[0].fields["locks_ms"] == 0.0641
    assert rows[1].skipped.startswith("needs 131.0 GiB (K+V 128.0, summaries 1.3, workspace 1.7)")
    with pytest.raises(ValueError, match="before the header"):
        grid.parse_bench_csv(_csv_row("GLM-4-9B", 1024, 1, 1, 1))
    with pytest.raises(ValueError, match="unknown model"):
        grid.parse_bench_csv(HEADER + "\n" + _csv_row("Mistral", 1024, 1, 1, 1))
    with pytest.raises(ValueError, match="fields"):
        grid.parse_bench_csv(HEADER + "\nGLM-4-9B,1024,1,0.1,0.2\n")


def test_parse_bench_stdout_and_ceiling():
    # The bench's printf formats (bench_decode.cu): the ceiling line and the table rows.
    log = ("read ceiling (16-byte streaming loads, 8 GiB): 4.38 TB/s; device copy 2.10 TB/s\n"
           "%-19s %8d %5d | %9.4f %9.4f %6.2f\n" % ("GLM-4-9B", 1048576, 1, 0.29, 0.1188, 2.44)
           + "  build_filled launch (1 x 2 KV heads): 22.0 us\n"
           + "%-19s %8d %5d | skipped: %s\n" % ("Llama-3.1-8B", 1048576, 32, "needs 1, 2"))
    assert grid.parse_ceiling(log) == 4.38 and grid.parse_ceiling("no ceiling") is None
    rows = grid.parse_bench_stdout(log)
    assert [r.row.key for r in rows] == [("GLM-4-9B", 1048576, 1), ("Llama-3.1-8B", 1048576, 32)]
    assert rows[0].fields == {"dense_ms": 0.29, "locks_ms": 0.1188} and rows[1].skipped == "needs 1, 2"
    merged = grid.merge_bench_rows(grid.parse_bench_csv(HEADER + "\n" + _csv_row(
        "GLM-4-9B", 1048576, 1, 0.3, 0.12) + "\n"), rows)
    assert [m.row.key for m in merged] == [r.row.key for r in rows]
    assert merged[0].fields["dense_ms"] == 0.3  # the CSV wins


def test_sizes_and_fit():
    r = grid.Row("Llama-3.1-8B", 131072, 8)
    s = grid.sizes(r)
    assert s.pages == 8192 and s.blocks == 65536 and s.kv_bytes == 2 * 65536 * 16 * 8 * 128 * 2
    assert grid.fit_reason(r, 140 << 30, 141 << 30) is None
    # FA3 needs no summaries: 1M x 32 (128 GiB of K+V) fits an H200 where the bench's row does not.
    big = grid.Row("Llama-3.1-8B", 1048576, 32)
    assert grid.fit_reason(big, 139 << 30, 140 << 30) is None
    why = grid.fit_reason(big, 120 << 30, 140 << 30)
    assert why.startswith("needs 128.") and "of 120.0 GiB free (140.0 GiB device)" in why


# -- the report -------------------------------------------------------------------------------
def test_join_ratios_and_notes():
    bench = grid.parse_bench_csv(CSV)
    fa3 = {("Llama-3.1-8B", 131072, 1): {"status": "ok", "fa3_free_ms": 0.12, "fa3_cap32_ms": 0.15,
                                         "fa3_free_ok": True, "fa3_cap32_ok": True},
           ("Llama-3.1-8B", 1048576, 32): {"status": "skipped", "reason": "needs 129 GiB"},
           ("GLM-4-9B", 1048576, 1): {"status": "ok", "fa3_free_ms": 0.25, "fa3_cap32_ms": 0.25,
                                      "fa3_free_ok": True, "fa3_cap32_ok": False,
                                      "fa3_cap32_err": 0.5}}
    j = report.join(bench, fa3, 4.0)
    assert [x["model"] for x in j] == ["Llama-3.1-8B", "Llama-3.1-8B", "GLM-4-9B"]
    a = j[0]
    assert a["locks_vs_dense"] == pytest.approx(0.146 / 0.0641)
    assert a["locks_vs_fa3_cap32"] == pytest.approx(0.15 / 0.0641)
    assert a["locks_vs_fa3_free"] == pytest.approx(0.12 / 0.0641)
    assert a["fa3_cap32_vs_dense"] == pytest.approx(0.146 / 0.15)
    assert a["fa3_free_pct"] == pytest.approx(100 * 2 * 8192 * 16 * 8 * 128 * 2 / 0.12e-3 / 1e12 / 4.0)
    assert a["fa3_check"] == "ok" and a["note"] == ""
    assert j[1]["dense_ms"] is None and "bench skipped: needs 131.0" in j[1]["note"]
    assert "FA3 skipped: needs 129 GiB" in j[1]["note"]
    assert j[2]["fa3_check"] == "FAILED" and "output check failed" in j[2]["note"]
    # Rows given explicitly keep their order, and a row the bench lacks says so.
    j2 = report.join(bench, {}, None, [grid.Row("SmolLM2-135M", 32768, 8), bench[0].row])
    assert j2[0]["note"].startswith("bench: no row; FA3 not run") and j2[1]["dense_pct"] is None
    table = report.format_table(j, 4.0, "given")
    assert "xfa3_32" in table and "FAILED" in table and "4.00 TB/s, given" in table
    assert len({len(line.split("|")[0]) for line in table.splitlines()[:4]}) == 1  # aligned


def test_report_files(tmp_path):
    j = report.join(grid.parse_bench_csv(CSV), {}, 4.0)
    report.write_csv(str(tmp_path / "a.csv"), j)
    lines = (tmp_path / "a.csv").read_text().splitlines()
    assert lines[0] == ",".join(report.COLUMNS) and len(lines) == 4
    report.write_json(str(tmp_path / "a.json"), {"date": "x"}, j, {("GLM-4-9B", 1, 1): {"status": "ok"}})
    d = json.loads((tmp_path / "a.json").read_text())
    assert d["meta"]["date"] == "x" and d["fa3_raw"][0]["model"] == "GLM-4-9B" and len(d["rows"]) == 3


# -- FA3 arguments vs vLLM 0.26.0's source ------------------------------------------------------
def _vllm_file(rel):
    spec = importlib.util.find_spec("vllm")  # locates the package without importing it
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("vLLM is not installed (scripts/vllm_tests.sh installs 0.26.0 with --no-deps)")
    path = os.path.join(list(spec.submodule_search_locations)[0], rel)
    if not os.path.exists(path):
        pytest.skip(f"{rel} not in this vLLM")
    return path


def _vllm_version():
    import importlib.metadata

    try:
        return importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        return None


def _call_keywords(path, func_name, callee, must_have):
    """Keyword names of the call to `callee` inside `func_name` that passes all of must_have."""
    tree = ast.parse(open(path).read())
    for fn in ast.walk(tree):
        if isinstance(fn, ast.FunctionDef) and fn.name == func_name:
            for node in ast.walk(fn):
                if isinstance(node, ast.Call) and getattr(node.func, "id", None) == callee:
                    kws = {k.arg for k in node.keywords}
                    if must_have <= kws:
                        return kws
    raise AssertionError(f"no {callee}(...) call with {must_have} in {func_name} of {path}")


def _interface_module():
    """vllm/vllm_flash_attn/flash_attn_interface.py loaded on its own: its CUDA extensions fail to
    import here, which it tolerates (FA3_AVAILABLE False); the signatures are what we check."""
    path = _vllm_file("vllm_flash_attn/flash_attn_interface.py")
    spec = importlib.util.spec_from_file_location("_peer_fa_interface", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _cpu_tensors(batch=2, ctx=64, hq=8, hkv=2, d=64):
    pages = ctx // grid.PAGE
    raw, k, v = fa3_call.packed_cache(torch, batch * pages, hkv, d, "cpu")
    seq = torch.full((batch,), ctx, dtype=torch.int32)
    cu = torch.arange(batch + 1, dtype=torch.int32)
    q = torch.zeros((batch, hq, d), dtype=torch.bfloat16)
    bt = fa3_call.block_table(torch, batch, pages, "perm", 1, "cpu")
    return dict(raw=raw, k=k, v=v, seq=seq, cu=cu, q=q, bt=bt)


def test_fa3_arguments_are_vllms():
    if _vllm_version() != "0.26.0":
        pytest.skip(f"vLLM {_vllm_version()} installed; the arguments are vLLM 0.26.0's")
    backend = _vllm_file("v1/attention/backends/flash_attn.py")
    t = _cpu_tensors()
    vk = fa3_call.varlen_kwargs(q=t["q"], k_cache=t["k"], v_cache=t["v"], out=t["q"],
                                cu_seqlens_q=t["cu"], seq_lens=t["seq"], context=64,
                                block_table=t["bt"], softmax_scale=0.125, scheduler_metadata=None,
                                descale=None, num_splits=32)
    sk = fa3_call.scheduler_kwargs(batch=2, context=64, hq=8, hkv=2, d=64, seq_lens=t["seq"],
                                   cu_seqlens_q=t["cu"], qkv_dtype=torch.bfloat16, num_splits=32)
    # The same keyword set as the decode call in FlashAttentionImpl.forward and the metadata
    # call in the builder's schedule(): nothing vLLM passes is left to a default here.
    assert set(vk) == _call_keywords(backend, "forward", "flash_attn_varlen_func",
                                     {"block_table", "scheduler_metadata", "num_splits"})
    assert set(sk) == _call_keywords(backend, "schedule", "get_scheduler_metadata",
                                     {"page_size", "num_splits"})
    mod = _interface_module()
    inspect.signature(mod.flash_attn_varlen_func).bind(**vk)
    inspect.signature(mod.get_scheduler_metadata).bind(**sk)
    # The values vLLM's decode path implies that are not plain pass-throughs.
    assert vk["fa_version"] == 3 and vk["causal"] is True and vk["max_seqlen_q"] == 1
    assert vk["window_size"] is None and vk["softcap"] == 0.0 and vk["s_aux"] is None
    assert sk["window_size"] == (-1, -1) and sk["page_size"] == 16 and sk["causal"] is True


def test_graph_split_cap_is_vllms_default():
    path = _vllm_file("config/attention.py")
    tree = ast.parse(open(path).read())
    for node in ast.walk(tree):
        if (isinstance(node, ast.AnnAssign) and getattr(node.target, "id", "")
                == "flash_attn_max_num_splits_for_cuda_graph"):
            assert node.value.value == fa3_call.VLLM_GRAPH_MAX_SPLITS
            return
    raise AssertionError("flash_attn_max_num_splits_for_cuda_graph not found")


def test_packed_cache_is_vllms_layout():
    """K and V views equal what FlashAttentionImpl.forward makes of a cache laid out by the
    backend's get_kv_cache_shape and stride order (the way vLLM allocates it)."""
    if _vllm_version() != "0.26.0":
        pytest.skip(f"vLLM {_vllm_version()} installed; the layout is vLLM 0.26.0's")
    try:
        from vllm.config import DeviceConfig, VllmConfig, set_current_vllm_config
        from vllm.v1.attention.backends.flash_attn import FlashAttentionBackend
    except Exception as e:  # the backend's imports need vLLM's pure-Python dependencies
        pytest.skip(f"vLLM's FLASH_ATTN backend does not import here: {type(e).__name__}")
    n, hkv, d = 6, 3, 64
    shape = FlashAttentionBackend.get_kv_cache_shape(n, grid.PAGE, hkv, d)
    with set_current_vllm_config(VllmConfig(device_config=DeviceConfig(device="cpu"))):
        order = FlashAttentionBackend.get_kv_cache_stride_order()
    phys = torch.arange(n * grid.PAGE * hkv * 2 * d, dtype=torch.float32).view(
        [shape[i] for i in order])
    inv = [order.index(i) for i in range(len(order))]
    kv_cache = phys.permute(*inv)  # logical view over the physical allocation
    key_cache, value_cache = kv_cache.transpose(1, 2).split(d, dim=-1)  # forward's split
    raw, k, v = fa3_call.packed_cache(torch, n, hkv, d, "cpu")
    assert raw.shape == phys.shape
    assert k.shape == key_cache.shape and k.stride() == key_cache.stride()
    assert v.shape == value_cache.shape and v.stride() == value_cache.stride()
    assert v.storage_offset() == value_cache.storage_offset()


def test_block_tables():
    perm = fa3_call.block_table(torch, 4, 8, "perm", 3, "cpu")
    assert perm.dtype == torch.int32 and perm.shape == (4, 8) and perm.is_contiguous()
    assert sorted(perm.flatten().tolist()) == list(range(32))
    inter = fa3_call.block_table(torch, 4, 8, "interleaved", 0, "cpu")
    assert all(inter[b, j] == j * 4 + b for b in range(4) for j in range(8))  # the bench's table
    cont = fa3_call.block_table(torch, 4, 8, "contiguous", 0, "cpu")
    assert cont[1].tolist() == list(range(8, 16))
    with pytest.raises(ValueError):
        fa3_call.block_table(torch, 1, 1, "x", 0, "cpu")
    assert fa3_call.metadata_buffer_len(1) == 17 and fa3_call.metadata_buffer_len(5) == 33


# -- the driver end to end (stand-in bench, fake FA3 worker) -----------------------------------
FAKE_BENCH = r'''#!/usr/bin/env python3
# Stand-in for locks_bench_cuda: the same CSV and stdout shapes.
import sys
csv, args = sys.argv[1], sys.argv[2:]
HEADER = %r
rows = [("Llama-3.1-8B", 131072, 1), ("GLM-4-9B", 1048576, 1), ("Llama-3.1-8B", 1048576, 32)]
if "--only" in args:
    i = args.index("--only")
    rows = [(args[i + 1], int(args[i + 2]), int(args[i + 3]))]
else:
    print("read ceiling (16-byte streaming loads, 8 GiB): 4.25 TB/s; device copy 2.1 TB/s")
with open(csv, "w") as f:
    f.write(HEADER + "\n")
    for m, c, b in rows:
        if b == 32:
            print("%%-19s %%8d %%5d | skipped: needs 140 GiB, of 139" %% (m, c, b))
            f.write("%%s,%%d,%%d,skipped: needs 140 GiB, of 139\n" %% (m, c, b))
        else:
            print("%%-19s %%8d %%5d | %%9.4f %%9.4f" %% (m, c, b, 0.3, 0.1))
            f.write("%%s,%%d,%%d,0.3,0.1," %% (m, c, b) + ",".join(["1"] * 17) + "\n")
''' % HEADER


def _run(args, tmp_path, env=None):
    bench = tmp_path / "bench"
    bench.write_text(FAKE_BENCH)
    bench.chmod(0o755)
    e = dict(os.environ, **(env or {}))
    r = subprocess.run([sys.executable, ENTRY, "--bench", str(bench), "--out", str(tmp_path / "o"),
                        "--fake", "--row-timeout", "3", *args], capture_output=True, text=True,
                       timeout=120, env=e)
    d = json.loads((tmp_path / "o" / "peer_fa3.json").read_text()) if r.returncode in (0, 1) else None
    return r, d


def test_driver_grid_with_a_hanging_row(tmp_path):
    r, d = _run([], tmp_path, {"LOCKS_PEER_FAKE_HANG": "GLM-4-9B 1048576 1"})
    assert r.returncode == 1, r.stdout + r.stderr  # a row without a result fails the run
    assert d["meta"]["ceiling_TBps"] == 4.25 and "this run" in d["meta"]["ceiling_source"]
    rows = {(x["model"], x["context"], x["batch"]): x for x in d["rows"]}
    assert len(rows) == 3
    ok = rows[("Llama-3.1-8B", 131072, 1)]
    assert ok["dense_ms"] == 0.3 and ok["locks_vs_fa3_cap32"] == pytest.approx(ok["fa3_cap32_ms"] / 0.1)
    assert "FA3 timeout: no result after 3 s" in rows[("GLM-4-9B", 1048576, 1)]["note"]
    # The row after the hang ran in a restarted worker.
    assert "bench skipped: needs 140 GiB, of 139" in rows[("Llama-3.1-8B", 1048576, 32)]["note"]
    assert "FA3 skipped" in rows[("Llama-3.1-8B", 1048576, 32)]["note"]
    assert (tmp_path / "o" / "bench.csv").read_text().startswith("model,context,batch,")


def test_driver_rows_with_a_crashing_row(tmp_path):
    r, d = _run(["--rows", "GLM 262144 1;Llama 131072 4"], tmp_path,
                {"LOCKS_PEER_FAKE_CRASH": "GLM-4-9B 262144 1"})
    assert r.returncode == 1, r.stdout + r.stderr
    assert d["meta"]["ceiling_source"].startswith("assumed") and d["meta"]["ceiling_TBps"] == 4.4
    assert len(d["meta"]["bench"]["commands"]) == 2  # one --only run per row
    glm, llama = d["rows"]
    assert glm["note"] == "FA3 crashed: worker exited with rc 3" and glm["dense_ms"] == 0.3
    assert llama["fa3_check"] == "ok" and llama["locks_ms"] == 0.1


def test_driver_all_rows_measured(tmp_path):
    r, d = _run(["--quick"], tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr  # measured or skipped (does not fit): success
    assert [x["fa3_check"] for x in d["rows"]] == ["ok", "ok", None]


def test_driver_refuses_clearly(tmp_path):
    r = subprocess.run([sys.executable, ENTRY, "--bench", str(tmp_path / "none"), "--out",
                        str(tmp_path / "o")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "no runnable bench binary" in r.stderr
    r = subprocess.run([sys.executable, ENTRY, "--rows", "Mistral 1024 1", "--dry-run", "--out",
                        str(tmp_path / "o")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "no model name starts with 'Mistral'" in r.stderr


def test_dry_run_plans_without_a_gpu(tmp_path):
    (tmp_path / "b.csv").write_text(CSV)
    r = subprocess.run([sys.executable, ENTRY, "--bench-csv", str(tmp_path / "b.csv"), "--dry-run",
                        "--out", str(tmp_path / "o")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "cache [65536, 16, 2, 256] bf16 (K|V packed)" in r.stdout  # GLM 1M: 2 KV heads, 2 x 128
    assert "num_splits=32" in r.stdout and "FA3 not run: dry run" in r.stdout
