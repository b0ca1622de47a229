"""Two-level LOCKS in the vLLM backend (settings group_pages > 0), on CPU tensors: which groups a
step completed (the builder, no host sync), the super summaries the steps build into the slots
of the groups' last blocks (= one bulk build over the final cache), and the decode step through
the compiled two-level operator (= the one-shot operator over those supers)."""
import itertools
import random

import pytest
import torch

import locks.vllm.library as lib
from locks.vllm.builder import completed_groups
from locks.vllm.settings import flat_below_groups, parse_settings, two_level_plan

from test_backend_cpu import H, NB, P, dense_of, step, tables
import test_backend_cpu as tb

try:
    import locks

    HAVE_OPS = hasattr(locks, "two_level")
except ImportError:
    HAVE_OPS = False

needs_ops = pytest.mark.skipif(not HAVE_OPS, reason="the compiled locks operators are not installed")


@pytest.fixture(autouse=True)
def _reset_ops():
    yield
    lib.set_ops(None)


def test_completed_groups_match_a_brute_force_walk():
    """Every group whose last token is among a request's new tokens, once, with its S blocks and
    the slot of its last block; nothing else (chunks of any length, prefix hits, decodes)."""
    rng = random.Random(0)
    for S, trial in itertools.product((2, 3, 32), range(40)):
        GT = S * P
        n = rng.randint(1, 4)
        width = rng.randint(1, 6) * S + rng.randint(0, S - 1)
        seq = [rng.randint(1, width * P) for _ in range(n)]
        q = [rng.choice([1, rng.randint(1, s)]) for s in seq]
        qsl = torch.tensor([0] + list(itertools.accumulate(q)), dtype=torch.int32)
        bt = torch.randint(0, 10_000, (n, width), dtype=torch.int32)
        blocks, slots = completed_groups(qsl, torch.tensor(seq, dtype=torch.int32), bt, S, P, max(q))
        want = []
        for b in range(n):
            for t in range(seq[b] - q[b] + 1, seq[b] + 1):  # lengths reached this step
                if t % GT == 0:
                    j = t // GT - 1
                    want.append((bt[b, j * S:(j + 1) * S].tolist(), int(bt[b, j * S + S - 1])))
        assert [(r.tolist(), int(s)) for r, s in zip(blocks, slots)] == want, (S, trial)
        assert blocks.dtype == slots.dtype == torch.int32
        # The device form (no mask): every candidate kept, those that completed nothing at slot -1.
        cb, cs = completed_groups(qsl, torch.tensor(seq, dtype=torch.int32), bt, S, P, max(q), drop=False)
        assert cb.shape == (n * (max(q) // GT + 1), S) and cs.shape == (cb.shape[0],)
        assert [(r.tolist(), int(s)) for r, s in zip(cb, cs) if s >= 0] == want
        assert int((cs >= 0).sum()) == len(want)


@pytest.mark.parametrize("cfg,msg", [
    ({"group_pages": 1}, "group_pages"), ({"group_pages": 65}, "group_pages"),
    ({"group_pages": 32, "alpha": 0.5}, "alpha"), ({"group_pages": 32, "alpha": "many"}, "number"),
    ({"group_pages": 32, "alpha": float("nan")}, "finite"),
    ({"group_pages": 32, "min_groups": 0}, "min_groups"), ({"group_pages": 32, "min_groups": 2.5}, "min_groups"),
    ({"group_pages": 32, "budget": 512, "min_context": 4096}, "min_context"),
    ({"group_pages": 32, "two_level_min_context": -1}, "two_level_min_context"),
    ({"group_pages": 32, "two_level_min_context": 2**31}, "two_level_min_context"),
    ({"group_pages": 32, "two_level_min_context": "long"}, "two_level_min_context"),
])
def test_two_level_settings_refused_with_the_setting_named(cfg, msg):
    with pytest.raises(ValueError, match=msg):
        parse_settings({"locks": cfg}, environ={})


def test_two_level_settings_from_the_environment():
    s = parse_settings({"locks": {"group_pages": 16}},
                       environ={"LOCKS_GROUP_PAGES": "32", "LOCKS_ALPHA": "8", "LOCKS_MIN_GROUPS": "32"})
    assert (s.group_pages, s.alpha, s.min_groups) == (32, 8.0, 32)
    assert two_level_plan(s, 100)["min_groups"] == 32  # reaches the plan op
    assert parse_settings({}, environ={}).group_pages == 0  # flat LOCKS by default


@pytest.mark.parametrize("tokens,S,groups", [(None, 32, 8), (0, 32, 0), (1, 32, 1), (512, 32, 1),
                                             (513, 32, 2), (262144, 32, 512), (262145, 16, 1025)])
def test_two_level_min_context_in_whole_groups(tokens, S, groups):
    """two_level_min_context (tokens) reaches the plan as TwoLevelConfig::flat_below_groups,
    rounded up to whole groups of 16 S tokens: a sequence of L tokens has floor(L / (16 S))
    complete groups, so it takes level 1 exactly when L >= that many groups' tokens."""
    s = parse_settings({"locks": {"group_pages": S, "two_level_min_context": tokens}}, environ={})
    assert s.two_level_min_context == tokens
    assert flat_below_groups(s) == groups
    assert two_level_plan(s, 100)["flat_below_groups"] == groups
    if tokens is not None and groups:
        for L in (tokens - 1, tokens, groups * 16 * S - 1, groups * 16 * S):
            assert ((L // 16) // S >= groups) == (L >= groups * 16 * S)


def test_two_level_min_context_from_the_environment():
    env = parse_settings({"locks": {"group_pages": 32}}, environ={"LOCKS_TWO_LEVEL_MIN_CONTEXT": "1024"})
    assert flat_below_groups(env) == 2
    none = parse_settings({"locks": {"group_pages": 32, "two_level_min_context": 4096}},
                          environ={"LOCKS_TWO_LEVEL_MIN_CONTEXT": "none"})
    assert none.two_level_min_context is None


def _make(monkeypatch, cfg, **kw):
    return tb.make_setup(monkeypatch, cfg, ops=locks, **kw)


def bulk_supers(s, bt, lens, S):
    """One bulk build, over the final cache, of every complete group of every sequence (on the
    cache's device): the supers and the slots written."""
    want = locks.two_level.new_supers(NB, H, tb.D, group_pages=S, device=s.kv.device)
    rows = [(bt[b, j * S:(j + 1) * S], bt[b, j * S + S - 1]) for b, n in enumerate(lens)
            for j in range(n // (S * P))]
    if rows:
        locks.two_level.super_build(s.kv[0], torch.stack([r for r, _ in rows]).contiguous(),
                                    torch.stack([x for _, x in rows]).to(torch.int32), want)
    return want, sorted({int(x) for _, x in rows})


def step_matches_operator(s, md, q, out, bt, seq_lens, supers):
    """The backend's last step (selection in md.bufs, output `out` [B, HQ, D] bf16) against
    locks.two_level.two_level_decode over `supers` with the backend's own budget, alpha and
    min_groups (read from its settings, so that a changed default cannot split the two): the
    same pages, the output within one bf16 rounding of the operator's fp32 result. Returns
    that result."""
    B = q.shape[0]
    cfg = s.impl.settings
    budget, alpha, min_groups = cfg.budget, cfg.alpha, cfg.min_groups
    want, _, pages, counts = locks.two_level.two_level_decode(
        q.float(), s.kv[0], s.kv[1], s.impl.side.summaries(), supers, md.super_table[:B].contiguous(), bt,
        seq_lens, budget_tokens=budget, alpha=alpha, min_groups=min_groups,
        flat_below_groups=flat_below_groups(cfg), scale=1 / tb.D ** 0.5, return_selection=True)
    b = md.bufs
    assert torch.equal(b.counts[:B], counts)
    for i in range(B):
        for h in range(H):
            c = int(counts[i, h])
            assert torch.equal(b.pages[i, h, :c], pages[i, h, :c])
    o, w = out.double(), want.double()
    assert ((o - w).abs() <= w.abs() * 2 ** -8 + 1e-5).all()
    return want, pages, counts


def check_supers(s, bt, lens, S):
    want, slots = bulk_supers(s, bt, lens, S)
    got = s.impl.side.supers()
    assert slots  # the test builds some groups
    for g, w in zip(got, want):
        for x in slots:
            assert torch.equal(g[x], w[x])


@needs_ops
@pytest.mark.parametrize("runner", ["v2", "v1"])
def test_supers_built_as_groups_fill_equal_one_bulk_build(monkeypatch, runner):
    """Prefill chunks that complete several groups, a mixed step (a decode row and an extend),
    then decode steps that complete groups one token at a time: the slot of every complete
    group holds what one bulk build over the final cache writes there."""
    S = 2  # groups of 32 tokens, so the small test cache holds many
    s = _make(monkeypatch, {"precision": "int4", "budget": 64, "group_pages": S, "alpha": 1.0,
                            "min_groups": 4},
              runner=runner)
    bt, gen = tables(), torch.Generator().manual_seed(21)
    step(s, bt, [200, 90], [200, 90], gen)          # 6 + 2 groups (the second ends mid-group)
    check_supers(s, bt, [200, 90], S)
    sw = bt[[1, 0]]                                  # decodes first: request 1 decodes, 0 extends
    cm, md, _, _ = step(s, sw, [1, 150], [91, 350], gen)
    assert md.super_jobs is not None and not md.pure_decode
    check_supers(s, bt, [350, 91], S)
    lens = [350, 91]
    for _ in range(40):                              # 350 -> 390 crosses 352 and 384; 91 -> 131 crosses 96, 128
        lens = [n + 1 for n in lens]
        cm, md, q, out = step(s, bt, [1, 1], lens, gen)
        assert md.pure_decode and md.super_jobs is None
    check_supers(s, bt, lens, S)
    assert md.super_table[:2, :6].tolist() == bt[:, S - 1:12:S].tolist()


@needs_ops
def test_two_level_logs_its_settings_and_cost(monkeypatch, caplog):
    import locks.vllm.impl as im

    monkeypatch.setattr(im, "_logged_two_level", False)
    s = _make(monkeypatch, {"precision": "int4", "budget": 64, "group_pages": 2, "alpha": 1.0,
                            "min_groups": 4})
    bt, gen = tables(), torch.Generator().manual_seed(25)
    with caplog.at_level("INFO"):
        step(s, bt, [40, 20], [40, 20], gen)
        step(s, bt, [1, 1], [41, 21], gen)                    # the first decode plans
    msg = [r.getMessage() for r in caplog.records if "LOCKS two-level" in r.getMessage()]
    sup = s.impl.geom.super_bytes_per_block
    assert len(msg) == 1 and f"group_pages 2, alpha 1, budget 64, min_groups 4" in msg[0]
    assert "sequences under 256 tokens (8 complete groups) decode flat" in msg[0]  # the default floor
    assert f"{sup} B a block a layer" in msg[0]


@needs_ops
@pytest.mark.parametrize("runner", ["v2", "v1"])
def test_two_level_decode_equals_the_operator_over_bulk_built_supers(monkeypatch, runner):
    """The backend's step = locks.two_level.two_level_decode over the bulk-built supers (same
    selection, same output bits up to the bf16 store); really two-level (level 1 keeps fewer
    groups than there are) and really sparse."""
    S = 2
    s = _make(monkeypatch, {"precision": "int4", "budget": 64, "group_pages": S, "alpha": 1.0,
                            "min_groups": 4},
              runner=runner)
    bt, gen = tables(), torch.Generator().manual_seed(22)
    step(s, bt, [480, 300], [480, 300], gen)
    cm, md, q, out = step(s, bt, [1, 1], [481, 301], gen)
    want_sup, _ = bulk_supers(s, bt, [481, 301], S)
    sm = s.impl.side.summaries()
    want, pages, counts = step_matches_operator(s, md, q, out, bt, cm.seq_lens, want_sup)
    dense = dense_of(s, q, bt, cm.seq_lens)
    assert (want[0].double() - dense[0]).abs().max() > 1e-2     # really sparse
    # Really two-level: flat LOCKS over the same summaries selects other pages here.
    flat = locks.DecodeWrapper.allocate(num_q_heads=tb.HQ, num_kv_heads=H, head_dim=tb.D, num_blocks=NB,
                                        max_batch=2, max_blocks_per_seq=bt.shape[1], budget_tokens=64)
    fp, fc = flat.select(q.float(), sm, bt, cm.seq_lens)
    assert any(not torch.equal(fp[i, h, : int(fc[i, h])], pages[i, h, : int(counts[i, h])])
               for i in range(2) for h in range(H))


@needs_ops
@pytest.mark.parametrize("min_ctx,flat_rows", [(1024, [0, 1]), (400, [1])])
def test_two_level_min_context_decodes_shorter_rows_flat(monkeypatch, min_ctx, flat_rows):
    """Rows shorter than two_level_min_context select what flat LOCKS selects (the two-level
    step scores their every page), longer rows stay two-level; the step equals the operator
    planned with the same flat_below_groups. S 2: 481 tokens = 15 complete groups, 301 = 9;
    1024 tokens = 32 groups (both rows flat), 400 = 13 (row 1 flat)."""
    S = 2
    s = _make(monkeypatch, {"precision": "int4", "budget": 64, "group_pages": S, "alpha": 1.0,
                            "min_groups": 4, "two_level_min_context": min_ctx})
    bt, gen = tables(), torch.Generator().manual_seed(22)
    step(s, bt, [480, 300], [480, 300], gen)
    cm, md, q, out = step(s, bt, [1, 1], [481, 301], gen)
    want_sup, _ = bulk_supers(s, bt, [481, 301], S)
    _, pages, counts = step_matches_operator(s, md, q, out, bt, cm.seq_lens, want_sup)
    flat = locks.DecodeWrapper.allocate(num_q_heads=tb.HQ, num_kv_heads=H, head_dim=tb.D, num_blocks=NB,
                                        max_batch=2, max_blocks_per_seq=bt.shape[1], budget_tokens=64)
    fp, fc = flat.select(q.float(), s.impl.side.summaries(), bt, cm.seq_lens)
    same = [all(torch.equal(fp[i, h, : int(fc[i, h])], pages[i, h, : int(counts[i, h])]) for h in range(H))
            for i in range(2)]
    for i in flat_rows:
        assert same[i]
    if flat_rows == [1]:
        assert not same[0]  # row 0 (seed 22, as in the test above) is really two-level


@needs_ops
@pytest.mark.parametrize("graphs", [False, True])
def test_two_level_budget_at_least_context_is_dense(monkeypatch, graphs):
    """Eager: every sequence below the budget takes the dense kernel (md.dense); under full
    decode graphs the two-level step runs and selects every page (its fallback)."""
    from vllm.config.compilation import CUDAGraphMode

    mode = CUDAGraphMode.FULL_DECODE_ONLY if graphs else CUDAGraphMode.NONE
    s = _make(monkeypatch, {"precision": "int4", "budget": 512, "group_pages": 2, "alpha": 1.0,
                            "min_groups": 4},
              cudagraph_mode=mode)
    bt, gen = tables(), torch.Generator().manual_seed(23)
    step(s, bt, [300, 200], [300, 200], gen)
    cm, md, q, out = step(s, bt, [1, 1], [301, 201], gen)
    assert md.dense != graphs
    if graphs:
        assert md.bufs.counts[:2].tolist() == [[19, 19], [13, 13]]  # every page selected
    assert (out.double() - dense_of(s, q, bt, cm.seq_lens)).abs().max() < 2 ** -7


def test_two_level_needs_the_compiled_operators(monkeypatch):
    with pytest.raises(NotImplementedError, match="two-level"):
        tb.make_setup(monkeypatch, {"group_pages": 32})


def test_latency_backend_names():
    from locks.vllm.check import backend_settings

    assert backend_settings("CUSTOM", 2048, 32) == ("CUSTOM", {"additional_config": {"locks": {"budget": 2048}}})
    assert backend_settings("CUSTOM_H2", 1024, 16) == (
        "CUSTOM", {"additional_config": {"locks": {"budget": 1024, "group_pages": 16}}})
    assert backend_settings("FLASH_ATTN", 2048, 32) == ("FLASH_ATTN", {})


def test_side_cache_rows_carry_one_super_slot_each():
    """group_pages > 0: each block's side-cache row holds its page summary (836 B a KV head at
    d 128) and one super summary slot (1,544 B: the extent layout of S 32, rank 8), carved as
    the [num_blocks, ...] arrays locks.two_level.new_supers allocates, each aligned."""
    from locks.vllm.side_cache import SummaryGeometry, carve, field_align

    g = SummaryGeometry(num_kv_heads=2, head_dim=128, group_pages=32)
    flat = SummaryGeometry(num_kv_heads=2, head_dim=128)
    assert flat.super_fields() == [] and g.page_fields() == flat.page_fields()
    assert g.bytes_per_block == 2 * (836 + 1544) and g.super_bytes_per_block == 2 * 1544
    nb = 7
    raw = torch.zeros(nb, g.page_size, g.token_bytes, dtype=torch.uint8)
    views = carve(raw, g)
    sup = views[len(g.page_fields()):]
    shapes = [(nb, *shape) for _, _, shape in g.super_fields()]
    assert [tuple(v.shape) for v in sup] == shapes
    if HAVE_OPS:
        want = locks.two_level.new_supers(nb, 2, 128, group_pages=32)
        assert [(tuple(t.shape), t.dtype) for t in want] == [(tuple(v.shape), v.dtype) for v in sup]
    for v, (_, dt, _) in zip(views, g.fields()):
        assert v.data_ptr() % field_align(dt) == 0 and v.is_contiguous()


def test_two_level_byte_model_falls_back_like_the_step():
    """The latency table's two-level byte model: flat LOCKS's bytes wherever the step falls back
    (budget >= context, fewer than 8 complete groups, every group kept), fewer elsewhere, and
    more bytes for a larger budget (more kept groups and selected pages)."""
    from locks.vllm.check import bytes_per_step, bytes_per_step_h2

    for ctx, budget in ((4096, 8192), (3 * 512, 64), (131072, 2048)):  # 160 + 2 of 256 groups: kept
        if ctx == 131072:
            assert bytes_per_step_h2("glm", ctx, 1, budget) < bytes_per_step("glm", ctx, 1, budget, True)
            continue
        assert bytes_per_step_h2("glm", ctx, 1, budget) == bytes_per_step("glm", ctx, 1, budget, True)
    assert bytes_per_step_h2("llama", 8192, 1, 2048) == bytes_per_step("llama", 8192, 1, 2048, True)
    one_m = 1 << 20
    assert bytes_per_step_h2("glm", one_m, 1, 512) < bytes_per_step_h2("glm", one_m, 1, 2048) \
        < bytes_per_step("glm", one_m, 1, 2048, True)


@needs_ops
def test_prefix_hits_and_reused_blocks_keep_supers_right(monkeypatch):
    """A prefix-cache hit reads the supers of the shared groups from the shared blocks (built by
    the request that wrote them) and builds only the groups its own tokens complete; a block
    reused at another position (the first request gone) gets the super of the group it now
    ends. Both equal one bulk build over the requesting table, and the hit's step equals the
    operator over those supers."""
    S = 2
    s = _make(monkeypatch, {"precision": "int4", "budget": 64, "group_pages": S, "alpha": 1.0,
                            "min_groups": 4})
    bt, gen = tables(), torch.Generator().manual_seed(24)
    step(s, bt[:1], [400], [400], gen)                       # request A: 12 groups (25 pages)
    hit = 12                                                 # pages shared: A's groups 0-5
    b_table = torch.cat([bt[0, :hit], bt[1, : 32 - hit]])[None]
    cm, md, _, _ = step(s, b_table, [300 - hit * P], [300], gen)
    assert int(md.super_jobs[1].shape[0]) == 300 // (S * P) - hit // S   # only its own groups
    check_supers(s, b_table, [300], S)
    check_supers(s, bt[:1], [hit * P], S)                    # the shared groups untouched
    cm, md, q, out = step(s, b_table, [1], [301], gen)
    want_sup, _ = bulk_supers(s, b_table, [301], S)
    step_matches_operator(s, md, q, out, b_table, cm.seq_lens, want_sup)
    # Request A gone; C reuses A's blocks from page 12 on at positions 0.. with new tokens: C's
    # group j is A's group 6 + j's blocks and ends in the same block, whose slot holds A's stale
    # super until C's step completes the group and rebuilds it.
    c_table = torch.cat([bt[0, hit:], bt[1, 32 - hit:]])[None]
    step(s, c_table, [250], [250], gen)
    check_supers(s, c_table, [250], S)


def test_latency_table_with_the_two_level_backend(monkeypatch, tmp_path, capsys):
    """The latency mode's arithmetic on stand-in engine runs: time per output token from the
    faster of two long and of two short decodes (N = decode_tokens steps apart; one slow short
    run does not move it), speedups of flat and two-level LOCKS and of the two-launch write
    over FLASH_ATTN, the byte ratios, the engines' settings (CUSTOM_H2 = CUSTOM with
    group_pages, CUSTOM_SPLIT = CUSTOM with fused_write off, CUSTOM_LB = CUSTOM with
    length_buckets 4)."""
    import types

    import locks.vllm.check as chk

    per_token = {"flash_attn": 0.020, "custom": 0.010, "custom_h2": 0.008, "custom_split": 0.0125,
                 "custom_lb": 0.0160}  # s
    seen = {}
    N = 128

    def fake_run(tag, kw, runs, env, out, **_):
        seen[tag] = kw
        be = tag.split("-", 2)[2]
        t = {"warm": 1.0, "short": 0.5, "short2": 0.56, "long": 0.5 + N * per_token[be],
             "long2": 0.6 + N * per_token[be]}
        assert {r["max_tokens"] for r in runs if r["name"].endswith("long")} == {8 + N}
        return {"runs": [{"name": r["name"], "seconds": t[r["name"].split(":")[1]]} for r in runs]}

    monkeypatch.setattr(chk, "run_engine", fake_run)
    a = types.SimpleNamespace(rows="glm 1048576 1", skip_prefill=True, runner="1", glm_kv_groups=0, mem=0.9,
                              chunk=32768, backends="FLASH_ATTN,CUSTOM,CUSTOM_H2,CUSTOM_SPLIT,CUSTOM_LB", budget=2048,
                              group_pages=32, fa_splits=32, timeout=10, out=str(tmp_path), kernel_profile=False,
                              decode_tokens=N)
    assert chk.latency(a) == 0
    meta = __import__("json").load(open(tmp_path / "vllm_latency.json"))
    row = meta["rows"][0]
    assert meta["decode_tokens"] == N
    assert row["FLASH_ATTN"]["tpot_ms"] == pytest.approx(20.0)
    assert row["speedup"] == pytest.approx(2.0) and row["speedup_h2"] == pytest.approx(2.5)
    assert row["speedup_split"] == pytest.approx(1.6)
    assert row["speedup_lb"] == pytest.approx(1.25)
    assert row["bytes_ratio_h2"] > row["bytes_ratio"] > 1
    assert seen["lat-glm-custom_h2"]["attention_backend"] == "CUSTOM"
    assert seen["lat-glm-custom_h2"]["additional_config"] == {"locks": {"budget": 2048, "group_pages": 32}}
    assert seen["lat-glm-custom_split"]["additional_config"] == {"locks": {"budget": 2048, "fused_write": False}}
    out = capsys.readouterr().out
    assert "H2 speedup" in out and "two-launch write (CUSTOM_SPLIT)" in out
    assert seen["lat-glm-custom_lb"]["additional_config"] == {"locks": {"budget": 2048, "length_buckets": 4}}
    assert "4 length buckets (CUSTOM_LB)" in out


@needs_ops
@pytest.mark.parametrize("seed", range(8))
def test_supers_stay_right_under_random_schedules(monkeypatch, seed):
    """Random schedules of two requests (prompt chunks of 1-160 tokens, decodes, both in one
    step with the decode rows first, as vLLM orders them) under random settings (S, summary
    precision and rank, sink / recent pages, min_groups, model runner): after every step the
    slot of every complete group holds what one bulk build over the current cache writes; a
    last decode step equals the operator over those supers."""
    rng = random.Random(seed)
    S = rng.choice([2, 3, 4])
    cfg = {"precision": rng.choice(["int4", "fp32"]), "budget": 64, "group_pages": S, "alpha": 1.0,
           "sink_pages": rng.choice([0, 1]), "recent_pages": rng.choice([0, 1, 2]), "rank": rng.choice([4, 8]),
           "min_groups": rng.choice([1, 4, 32])}
    s = _make(monkeypatch, cfg, runner=rng.choice(["v1", "v2"]))
    bt, gen = tables(), torch.Generator().manual_seed(100 + seed)
    prompt = [rng.randint(40, 300), rng.randint(40, 300)]
    lens = [0, 0]
    for _ in range(24):
        rows = []
        for r in range(2):
            if lens[r] >= 500:
                continue
            q = 1 if lens[r] >= prompt[r] else min(rng.randint(1, 160), prompt[r] - lens[r])
            rows.append((q, r))
        if not rows:
            break
        rows.sort(key=lambda x: x[0] != 1)               # decodes first
        order = [r for _, r in rows]
        for q, r in rows:
            lens[r] += q
        step(s, bt[order], [q for q, _ in rows], [lens[r] for r in order], gen)
        done = [r for r in range(2) if lens[r] >= S * P]
        if done:
            check_supers(s, bt[done], [lens[r] for r in done], S)
    # Then a decode step of both: the backend's step = the operator over bulk-built supers.
    lens = [n + 1 for n in lens]
    cm, md, q, out = step(s, bt, [1, 1], lens, gen)
    sup, _ = bulk_supers(s, bt, lens, S)
    want, _, pages, counts = locks.two_level.two_level_decode(
        q.float(), s.kv[0], s.kv[1], s.impl.side.summaries(), sup, md.super_table[:2].contiguous(), bt,
        cm.seq_lens, budget_tokens=64, sink_pages=cfg["sink_pages"], recent_pages=cfg["recent_pages"],
        alpha=1.0, min_groups=cfg["min_groups"], scale=1 / tb.D ** 0.5, return_selection=True)
    assert torch.equal(md.bufs.counts[:2], counts)
    assert ((out.double() - want.double()).abs() <= want.double().abs() * 2 ** -8 + 1e-5).all()
