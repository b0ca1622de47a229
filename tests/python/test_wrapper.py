"""locks.DecodeWrapper: plan once / run many over a caller-owned workspace; the same results
as the one-shot ops; memory flat over 1,000 plan/run cycles of varying shapes and budgets
(no state outside the caller's objects: issue #9)."""
import gc
import re
import resource
import shutil
import subprocess
import tracemalloc

import pytest
import torch

import locks
from locks import ops

P, H, D = 16, 2, 64


def setup(nb, lens, mb, precision="int4", dtype=torch.float32, seed=0, hq=3 * H):
    g = torch.Generator().manual_seed(seed)
    basis = torch.randn(nb, H, 3, D, generator=g)
    coef = torch.randn(nb, P, H, 3, generator=g) * 2
    k = (torch.einsum("bphr,bhrd->bphd", coef, basis) + 0.1 * torch.randn(nb, P, H, D, generator=g)).to(dtype).contiguous()
    v = torch.randn(nb, P, H, D, generator=g).to(dtype).contiguous()
    bt = torch.randperm(nb, generator=g)[: len(lens) * mb].to(torch.int32).view(len(lens), mb).contiguous()
    sl = torch.tensor(lens, dtype=torch.int32)
    q = torch.randn(len(lens), hq, D, generator=g)
    s = ops.new_summaries(nb, H, D, P, 8, precision=precision)
    ops.summary_build(k, torch.arange(nb, dtype=torch.int32), s)
    return k, v, bt, sl, q, s


def plan_kwargs(nb, mb, batch, budget=64, precision="int4", dtype=torch.float32, **kw):
    return dict(num_q_heads=3 * H, num_kv_heads=H, head_dim=D, num_blocks=nb, max_batch=batch,
                max_blocks_per_seq=mb, page_size=P, rank=8, precision=precision, kv_dtype=dtype,
                budget_tokens=budget, **kw)


@pytest.mark.parametrize("precision", ["fp32", "int4"])
def test_run_equals_select_then_attend_and_the_one_shot_ops(precision):
    nb, mb = 40, 20
    k, v, bt, sl, q, s = setup(nb, [300, 130], mb, precision)
    kw = plan_kwargs(nb, mb, 2, 64, precision)
    ws = torch.empty(locks.workspace_bytes(**kw), dtype=torch.uint8)
    w = locks.DecodeWrapper(ws).plan(**kw)
    assert w.capacity == ops.select_capacity(64, P, mb) == 4
    out, lse = w.run(q, k, v, s, bt, sl)
    pages, counts = ops.select_pages(q, s, bt, sl, 64)
    o2, l2 = ops.sparse_decode(q, k, v, bt, sl, pages, counts)
    assert torch.equal(out, o2) and torch.equal(lse, l2)
    # caller-given outputs are written in place and returned
    out3, lse3 = torch.empty_like(out), torch.empty_like(lse)
    pg, ct = torch.empty_like(pages), torch.empty_like(counts)
    r = w.run(q, k, v, s, bt, sl, out=out3, lse=lse3, pages=pg, counts=ct)
    assert r[0] is out3 and r[1] is lse3 and torch.equal(out3, out) and torch.equal(pg, pages)
    od, ld = w.run(q, k, v, s, bt, sl, dense=True)
    o4, l4 = ops.dense_decode(q, k, v, bt, sl)
    assert torch.equal(od, o4) and torch.equal(ld, l4)


def _rows(pages, counts):
    """The selected pages of every (sequence, KV head) row, as lists."""
    return [pages.view(-1, pages.shape[-1])[i, :n].tolist() for i, n in enumerate(counts.flatten().tolist())]


def test_adaptive_budget_keeps_the_capacity_and_trims_the_count():
    nb, mb, budget = 40, 20, 160  # 10 slots; lengths 300 / 200: 18 / 12 full pages + a tail
    k, v, bt, sl, q, s = setup(nb, [300, 200], mb, "fp32")
    fixed = locks.DecodeWrapper.allocate(**plan_kwargs(nb, mb, 2, budget, "fp32"))
    fp, fc = fixed.select(q, s, bt, sl)
    ws = torch.empty(locks.workspace_bytes(**plan_kwargs(nb, mb, 2, budget, "fp32", tau=0.5)), dtype=torch.uint8)
    w = locks.DecodeWrapper(ws)
    sels = {}
    for tau in (0.01, 0.5, 0.8, 0.95):
        w.plan(**plan_kwargs(nb, mb, 2, budget, "fp32", tau=tau, floor_pages=1))
        assert w.capacity == fixed.capacity == 10  # fixed capacity, variable count
        pages, counts = w.select(q, s, bt, sl)
        assert pages.shape == fp.shape
        for row, n in zip(pages.view(-1, 10), counts.flatten().tolist()):
            assert row[:n].tolist() == sorted(row[:n].tolist()) and (row[n:] == -1).all()
        sels[tau] = [set(r) for r in _rows(pages, counts)]
        # decode() with this plan attends exactly this selection
        out, lse = w.run(q, k, v, s, bt, sl)
        o2, l2 = ops.sparse_decode(q, k, v, bt, sl, pages, counts)
        assert torch.equal(out, o2) and torch.equal(lse, l2)
    rows_fixed = [set(r) for r in _rows(fp, fc)]
    # tau 0.01 with floor 1: the tail and the single best page, i.e. the fixed 2-page budget
    two = locks.DecodeWrapper.allocate(**plan_kwargs(nb, mb, 2, 32, "fp32"))
    assert sels[0.01] == [set(r) for r in _rows(*two.select(q, s, bt, sl))]
    # nested in tau, the fixed budget the ceiling; the counts differ between taus
    for lo, hi in ((0.01, 0.5), (0.5, 0.8), (0.8, 0.95)):
        assert all(a <= b for a, b in zip(sels[lo], sels[hi]))
    assert all(a <= b for a, b in zip(sels[0.95], rows_fixed))
    assert len({tuple(len(r) for r in sels[t]) for t in sels}) > 1
    # floor 3: at least the tail and the 3 best pages (the fixed 4-page budget's)
    w.plan(**plan_kwargs(nb, mb, 2, budget, "fp32", tau=0.01, floor_pages=3))
    four = locks.DecodeWrapper.allocate(**plan_kwargs(nb, mb, 2, 64, "fp32"))
    assert [set(r) for r in _rows(*w.select(q, s, bt, sl))] == [set(r) for r in _rows(*four.select(q, s, bt, sl))]
    # the one-shot op takes tau too
    p1, c1 = ops.select_pages(q, s, bt, sl, budget, tau=0.01)
    assert [set(r) for r in _rows(p1, c1)] == sels[0.01]


def test_plan_vector_carries_tau():
    kw = plan_kwargs(40, 20, 2, 160, tau=0.75, floor_pages=2)
    v = ops.plan(**kw)
    assert v != ops.plan(**plan_kwargs(40, 20, 2, 160))
    assert ops.plan_capacity(v) == ops.plan_capacity(ops.plan(**plan_kwargs(40, 20, 2, 160)))
    with pytest.raises(ValueError, match="tau"):
        ops.plan(**plan_kwargs(40, 20, 2, 160, tau=float("nan")))
    with pytest.raises(TypeError, match="tau"):
        locks.DecodeWrapper.allocate(**plan_kwargs(40, 20, 2, 160, tau="0.5"))
    with pytest.raises(ValueError, match="floor_pages"):
        ops.plan(**plan_kwargs(40, 20, 2, 160, tau=0.5, floor_pages=10))  # 9 scored slots


def test_smaller_batch_than_planned_and_replanning():
    nb, mb = 40, 20
    k, v, bt, sl, q, s = setup(nb, [300, 130], mb)
    w = locks.DecodeWrapper.allocate(**plan_kwargs(nb, mb, 4))  # room for 4 sequences
    o1, _ = w.run(q[:1], k, v, s, bt[:1], sl[:1])
    o2, _ = w.run(q, k, v, s, bt, sl)
    assert torch.equal(o1[0], o2[0])
    with pytest.raises(ValueError, match="batch"):
        w.run(torch.cat([q] * 3), k, v, s, torch.cat([bt] * 3), torch.cat([sl] * 3))
    with pytest.raises(ValueError, match="workspace has"):
        w.plan(**plan_kwargs(nb, mb, 6))  # same workspace, larger plan: does not fit
    w = locks.DecodeWrapper(torch.empty(locks.workspace_bytes(**plan_kwargs(nb, mb, 6)), dtype=torch.uint8))
    w.plan(**plan_kwargs(nb, mb, 6))
    w.run(torch.cat([q] * 3), k, v, s, torch.cat([bt] * 3), torch.cat([sl] * 3))


def test_plan_errors():
    with pytest.raises(ValueError, match="workspace has 16 bytes"):
        locks.DecodeWrapper(torch.empty(16, dtype=torch.uint8)).plan(**plan_kwargs(40, 20, 2))
    with pytest.raises(ValueError, match="uint8"):
        locks.DecodeWrapper(torch.empty(16, dtype=torch.float32))
    with pytest.raises(TypeError):
        locks.DecodeWrapper(bytearray(16))
    with pytest.raises(RuntimeError, match="plan"):
        locks.DecodeWrapper(torch.empty(16, dtype=torch.uint8)).run(None, None, None, None, None, None)
    with pytest.raises(ValueError, match="budget"):
        locks.workspace_bytes(**plan_kwargs(40, 20, 2, budget=8))
    with pytest.raises(NotImplementedError, match="head_dim"):
        locks.workspace_bytes(**{**plan_kwargs(40, 20, 2), "head_dim": 47})
    with pytest.raises(ValueError, match="differs from the workspace"):
        locks.DecodeWrapper(torch.empty(16, dtype=torch.uint8)).plan(**plan_kwargs(40, 20, 2), device="meta")


def test_plan_vector_is_checked():
    nb, mb = 40, 20
    k, v, bt, sl, q, s = setup(nb, [300, 130], mb)
    w = locks.DecodeWrapper.allocate(**plan_kwargs(nb, mb, 2))
    pages, counts = w.select(q, s, bt, sl)
    bad = w.plan_vector
    bad[2] += 1  # the version tag
    with pytest.raises(ValueError, match="plan"):
        torch.ops.locks.select_pages(w.workspace, bad, q, list(s), bt, sl, pages, counts)
    with pytest.raises(ValueError):
        torch.ops.locks.select_pages(w.workspace, w.plan_vector[:10], q, list(s), bt, sl, pages, counts)
    with pytest.raises(ValueError, match="workspace"):
        torch.ops.locks.select_pages(w.workspace[:64], w.plan_vector, q, list(s), bt, sl, pages, counts)


def test_supports_is_the_cpp_answer():
    assert locks.supports("cpu", head_dim=64) == (True, "")
    ok, why = locks.supports("cuda", head_dim=48, page_size=16, group=4, kv_dtype=torch.bfloat16)
    assert not ok and "head_dim" in why
    ok, why = locks.supports("cuda", head_dim=128, kv_dtype=torch.float32)
    assert not ok and "float32" in why
    ok, why = locks.supports(torch.device("cpu"), head_dim=64, page_size=16, rank=16)
    assert not ok and "rank" in why
    with pytest.raises(ValueError, match="backend"):
        locks.supports("tpu", head_dim=64)
    with pytest.raises(TypeError):
        locks.supports("cpu", head_dim=64.0)


def test_messages_format_numbers_with_torchs_libstdcxx():
    """The extension shares the libstdc++ torch loaded (python/shared_libstdcxx.cmake). With a
    static copy inside liblocks_torch.so the copy's locale is never initialised: numbers vanish
    from every message ("head_dim must be one of , got ") or the first one segfaults."""
    ok, why = locks.supports("cuda", head_dim=48, page_size=16)
    assert not ok and why.endswith("got 48") and "64, 128, 256" in why
    # raised inside the C++ library (require_supported), translated at the binding
    with pytest.raises(NotImplementedError, match="got 33$"):
        ops.plan(num_q_heads=4, num_kv_heads=1, head_dim=33, num_blocks=4, max_batch=1,
                 max_blocks_per_seq=4, budget_tokens=64, device="cpu")
    readelf = shutil.which("readelf")
    if readelf is None:
        pytest.skip("readelf not installed")
    dyn = subprocess.run([readelf, "-d", locks._LIB], capture_output=True, text=True, check=True).stdout
    assert re.search(r"NEEDED.*libstdc\+\+\.so", dyn), dyn


def _rss_kib() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def test_memory_flat_over_1000_plan_run_cycles():
    """1,000 cycles of plan + run over varying batch shapes and budgets. Shapes repeat, so any
    per-shape cache (what ops_cuda.cpp's g_decoders was) would keep growing; with the
    caller owning everything, Python allocations and RSS stay flat."""
    nb, mb = 96, 24
    k, v, bt, sl, q, s = setup(nb, [360, 200, 90, 17], mb)
    shapes = [(b, budget) for b in (1, 2, 3, 4) for budget in (16, 48, 64, 160, 384)]

    def cycle(i):
        b, budget = shapes[i % len(shapes)]
        w = locks.DecodeWrapper.allocate(**plan_kwargs(nb, mb, b, budget))
        w.run(q[:b], k, v, s, bt[:b], sl[:b])

    for i in range(100):  # warm-up: allocator pools, dispatcher caches
        cycle(i)
    gc.collect()
    tracemalloc.start()
    base_py = tracemalloc.get_traced_memory()[0]
    base_rss = _rss_kib()
    for i in range(1000):
        cycle(i)
    gc.collect()
    grown_py = tracemalloc.get_traced_memory()[0] - base_py
    tracemalloc.stop()
    grown_rss = _rss_kib() - base_rss
    # One cycle's workspace is a few hundred KiB; a leak of one per cycle would be >= 100 MiB.
    assert grown_py < 256 * 1024, f"Python allocations grew {grown_py} bytes over 1,000 cycles"
    assert grown_rss < 16 * 1024, f"RSS grew {grown_rss} KiB over 1,000 cycles"


def test_hf_layer_grow_keeps_one_wrapper_per_shape():
    """LocksLayer._grow re-plans; the cache keeps only wrappers a layer still uses."""
    hf = pytest.importorskip("locks.hf")
    cfg = hf.LocksConfig(budget=64, reserve_tokens=1, precision="fp32")
    plans = hf._Plans()
    layers = [hf.LocksLayer(cfg, plans) for _ in range(3)]
    B, Hq, S = 2, 3 * H, 40
    for layer in layers:
        key = torch.randn(B, H, S, D)
        layer.lazy_initialization(key, key)
        layer.pending = (key, torch.randn(B, H, S, D))
        layer.commit_prefill([0, 5], Hq, D ** -0.5)
    for step in range(60):  # grows several times (reserve 1 token)
        for layer in layers:
            layer._append(torch.randn(B, H, 1, D), torch.randn(B, H, 1, D))  # one token
            layer.decode(torch.randn(B, Hq, 1, D), D ** -0.5)
        assert len(plans.wrappers) == 1, f"step {step}: {len(plans.wrappers)} wrappers alive"


def test_length_buckets_on_the_cpu_are_the_plan_itself():
    """A CPU plan is its own one bucket (no graphs there); the bucketed op then equals
    select_pages, and it refuses several CPU plans or a malformed plan list."""
    nb, mb = 40, 20
    k, v, bt, sl, q, s = setup(nb, [300, 130], mb, "int4")
    kw = plan_kwargs(nb, mb, 2, 64)
    p = ops.plan(**kw)
    assert ops.length_buckets(p, 4) == [p]
    assert locks.workspace_bytes(**kw, length_buckets=4) == locks.workspace_bytes(**kw)
    w = locks.DecodeWrapper.allocate(**kw, length_buckets=4)
    assert w.length_buckets == [p]
    pages, counts = w.select(q, s, bt, sl)
    ref_p, ref_c = ops.select_pages(q, s, bt, sl, 64)
    assert torch.equal(pages, ref_p) and torch.equal(counts, ref_c)
    pg, ct = torch.full_like(pages, -7), torch.full_like(counts, -7)
    torch.ops.locks.select_pages_bucketed(w.workspace, p, q, list(s), bt, sl, pg, ct)
    assert torch.equal(pg, ref_p) and torch.equal(ct, ref_c)
    pg.fill_(-7), ct.fill_(-7)
    with pytest.raises(ValueError, match="one bucket"):
        torch.ops.locks.select_pages_bucketed(w.workspace, p + p, q, list(s), bt, sl, pg, ct)
    with pytest.raises(ValueError, match="whole number"):
        torch.ops.locks.select_pages_bucketed(w.workspace, p[:-1], q, list(s), bt, sl, pg, ct)
    assert bool((pg == -7).all()) and bool((ct == -7).all())  # refused: nothing written
    with pytest.raises(ValueError):
        ops.length_buckets(p, 0)
    with pytest.raises(ValueError):
        ops.length_buckets(p[:5], 2)  # not a plan vector
