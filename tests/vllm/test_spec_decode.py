"""Speculative decoding through the LOCKS step (method without draft attention layers): a
decode request's 1 + k query tokens are k + 1 rows of the step, each attending causally to its
own prefix, so a verification step gives the bits of the same tokens decoded one at a time.
CPU tensors; the torch reference and, where built, the compiled operators (flat and
two-level)."""
import pytest
import torch

from vllm.config.compilation import CUDAGraphMode

import locks.vllm.builder as bd
import locks.vllm.library as lib
from locks.vllm import reference as ref

from helpers import common_metadata, fake_spec
import test_backend_cpu as tb
from test_backend_cpu import D, H, HQ, LAYER, check_summaries, dense_of, flash_rows, full_blocks

try:
    import locks

    HAVE_OPS = hasattr(locks, "DecodeWrapper")
    HAVE_TWO_LEVEL = hasattr(locks, "two_level")
except ImportError:
    HAVE_OPS = HAVE_TWO_LEVEL = False

OPS = ["reference"] + (["compiled"] if HAVE_OPS else [])


@pytest.fixture(autouse=True)
def _reset_ops():
    yield
    lib.set_ops(None)


def _make(monkeypatch, cfg, ops, **kw):
    return tb.make_setup(monkeypatch, cfg, ops=locks if ops == "compiled" else None, **kw)


def run(s, bt, query_lens, seq_lens, q, k, v, pad_to=None):
    """One engine step with the given token rows (q [n, HQ, D], k / v [n, H, D]); pad_to: the
    token count of a padded graph batch (rows past the real tokens: padding, as vLLM sends)."""
    cm = common_metadata(query_lens, seq_lens, bt)
    n = cm.num_actual_tokens
    s.impl.do_kv_cache_update(LAYER, k, v, s.kv, cm.slot_mapping)
    md = s.builder.build(0, cm)
    m = pad_to or n
    if m > n:
        q = torch.cat([q, torch.zeros(m - n, HQ, D, dtype=q.dtype)])
    out = torch.zeros(m, HQ * D, dtype=torch.bfloat16)
    s.impl.forward(LAYER, q, k, v, s.kv, md, out)
    return cm, md, out.view(m, HQ, D)


def rand_rows(gen, n):
    f = lambda *shape: torch.randn(*shape, generator=gen).to(torch.bfloat16)  # noqa: E731
    return f(n, HQ, D), f(n, H, D), f(n, H, D)


def test_token_rows_map_each_token_to_its_request_and_causal_length():
    qsl = torch.tensor([0, 4, 5, 5, 8], dtype=torch.int32)        # request 2: graph padding (q 0)
    seq = torch.tensor([104, 41, 0, 20], dtype=torch.int32)
    req, rows = bd.token_rows(qsl, seq, 8)
    assert req.tolist() == [0, 0, 0, 0, 1, 3, 3, 3]
    assert rows.tolist() == [101, 102, 103, 104, 41, 18, 19, 20] and rows.dtype == torch.int32


def test_token_rows_match_a_brute_force_walk():
    """Random batches: query lengths 0-5 (0 = graph padding requests, anywhere among the real
    ones as far as the function is concerned), lengths from the query length up; every token
    maps to its request and the causal length of its own position."""
    rng = torch.Generator().manual_seed(5)
    for _ in range(200):
        n = int(torch.randint(1, 7, (1,), generator=rng))
        ql = torch.randint(0, 6, (n,), generator=rng)
        seq = ql + torch.randint(0, 300, (n,), generator=rng)
        qsl = torch.zeros(n + 1, dtype=torch.int32)
        qsl[1:] = torch.cumsum(ql, 0)
        T = int(qsl[-1])
        if T == 0:
            continue
        req, rows = bd.token_rows(qsl, seq.to(torch.int32), T)
        want_req = [r for r in range(n) for _ in range(int(ql[r]))]
        want_len = [int(seq[r]) - int(ql[r]) + 1 + i for r in range(n) for i in range(int(ql[r]))]
        assert req.tolist() == want_req and rows.tolist() == want_len


def test_the_builder_takes_the_speculative_tokens_as_decodes(monkeypatch):
    s = _make(monkeypatch, {"precision": "fp32", "budget": 64}, "reference", spec=fake_spec(k=3))
    assert s.builder.reorder_batch_threshold == s.builder.decode_threshold == 4
    assert s.builder.max_batch == 4 * 4                               # max_num_seqs x (1 + k) rows
    s = _make(monkeypatch, {"precision": "fp32"}, "reference", spec=fake_spec(k=2, parallel_drafting=True))
    assert s.builder.decode_threshold == 5
    s = _make(monkeypatch, {"precision": "fp32"}, "reference")
    assert s.builder.decode_threshold == 1 and s.builder.max_batch == 4


@pytest.mark.parametrize("ops", OPS)
@pytest.mark.parametrize("runner", ["v2", "v1"])
def test_verification_step_equals_one_token_steps(monkeypatch, ops, runner):
    """Two requests verify 1 + 3 tokens each; request 0's tokens complete a page (positions
    94-97 cross 95). Against the same tokens decoded one step at a time on a second backend:
    the same output bits, the same summaries, really sparse."""
    cfg = {"precision": "fp32" if ops == "reference" else "int4", "budget": 64}
    a = _make(monkeypatch, cfg, ops, runner=runner, spec=fake_spec(k=3))
    b = _make(monkeypatch, cfg, ops, runner=runner)
    bt, gen = tb.tables(), torch.Generator().manual_seed(31)
    q, k, v = rand_rows(gen, 131)
    for s in (a, b):
        run(s, bt, [94, 37], [94, 37], q, k, v)
    q, k, v = rand_rows(gen, 8)                                       # request-major: 0,0,0,0,1,1,1,1
    cm, md, out = run(a, bt, [4, 4], [98, 41], q, k, v)
    assert md.pure_decode and md.num_decodes == 2 and md.num_decode_tokens == 8
    assert md.seq_lens[:8].tolist() == [95, 96, 97, 98, 38, 39, 40, 41] and (md.seq_lens[8:] == 1).all()
    assert torch.equal(md.block_table[:8], bt[[0, 0, 0, 0, 1, 1, 1, 1]])
    for i in range(4):
        idx = [i, 4 + i]
        _, mdb, outb = run(b, bt, [1, 1], [95 + i, 38 + i], q[idx], k[idx], v[idx])
        assert mdb.num_decode_tokens == 2
        assert torch.equal(out[idx], outb), i
    for s in (a, b):
        if ops == "reference":
            check_summaries(s, full_blocks(bt, [98, 41]))
    for x, y in zip(a.impl.side.summaries(), b.impl.side.summaries()):
        assert torch.equal(x, y)
    dense = dense_of(a, q[3:4], bt[:1], cm.seq_lens[:1])
    assert (out[3].double() - dense[0]).abs().max() > 1e-2           # row 3 (98 tokens) is sparse


@pytest.mark.parametrize("ops", OPS)
def test_mixed_step_speculative_decodes_then_a_prompt(monkeypatch, ops):
    """Decode requests of 3 and 2 tokens, then a new prompt of 50: the 5 decode tokens take the
    LOCKS step (each row against the reference over its own prefix), the prompt
    FlashAttention over its own rows (its tokens start after the decode tokens, its request
    after the decode requests)."""
    cfg = {"precision": "fp32", "budget": 64}
    s = _make(monkeypatch, cfg, ops, spec=fake_spec(k=2))
    bt, gen = tb.tables3(), torch.Generator().manual_seed(32)
    q, k, v = rand_rows(gen, 131)
    run(s, bt[:2], [94, 37], [94, 37], q, k, v)
    q, k, v = rand_rows(gen, 55)
    cm, md, out = run(s, bt, [3, 2, 50], [97, 39, 50], q, k, v)
    assert not md.pure_decode and md.mixed_decodes and (md.num_decodes, md.num_decode_tokens) == (2, 5)
    rows_bt, rows_len = bt[[0, 0, 0, 1, 1]], torch.tensor([95, 96, 97, 38, 39], dtype=torch.int32)
    if ops == "reference":
        want, _ = ref.decode(q[:5].float(), s.kv[0], s.kv[1], s.impl.side.summaries(), rows_bt, rows_len,
                             budget=64)
        assert (out[:5].double() - want).abs().max() < 2 ** -7
    else:
        bufs = md.bufs
        pages = [[[int(x) for x in bufs.pages[i, h, : int(bufs.counts[i, h])]] for h in range(H)]
                 for i in range(5)]
        want, _ = ref.attend(q[:5].float(), s.kv[0], s.kv[1], rows_bt, rows_len, pages)
        assert ((out[:5].double() - want).abs() <= want.abs() * 2 ** -8 + 1e-5).all()
    assert torch.equal(out[5:], flash_rows(s, q, bt, cm, range(2, 3)))
    check_summaries(s, full_blocks(bt, [97, 39, 50]))
    # The benchmark-only mode (prefill arithmetic skipped) zeroes the prompt's rows, not the
    # decode tokens' (they start at token 5, not at request 2).
    monkeypatch.setenv("LOCKS_BENCH_SKIP_PREFILL_ATTENTION", "1")
    s2 = _make(monkeypatch, cfg, ops, spec=fake_spec(k=2))
    s2.kv.copy_(s.kv)
    for x, y in zip(s2.impl.side.summaries(), s.impl.side.summaries()):
        x.copy_(y)
    _, _, out2 = run(s2, bt, [3, 2, 50], [97, 39, 50], q, k, v)
    assert torch.equal(out2[:5], out[:5]) and not out2[5:].any()


@pytest.mark.parametrize("ops", OPS)
def test_padded_uniform_graph_batch(monkeypatch, ops):
    """A full-graph replay of a uniform batch (1 + k = 4 tokens a request) padded to 3 requests
    / 12 tokens: the padding request owns no token, padded rows read one valid token, and the
    real rows equal the unpadded step's."""
    cfg = {"precision": "fp32", "budget": 64}
    a = _make(monkeypatch, cfg, ops, spec=fake_spec(k=3), cudagraph_mode=CUDAGraphMode.FULL_DECODE_ONLY)
    b = _make(monkeypatch, cfg, ops, spec=fake_spec(k=3), cudagraph_mode=CUDAGraphMode.FULL_DECODE_ONLY)
    bt, gen = tb.tables(), torch.Generator().manual_seed(33)
    q, k, v = rand_rows(gen, 131)
    for s in (a, b):
        run(s, bt, [94, 37], [94, 37], q, k, v)
    q, k, v = rand_rows(gen, 8)
    bt3 = torch.cat([bt, bt[:1]])
    _, md, out = run(a, bt3, [4, 4, 0], [98, 41, 0], q, k, v, pad_to=12)
    assert md.pure_decode and md.num_decode_tokens == 8 and (md.seq_lens[8:] == 1).all()
    _, _, want = run(b, bt, [4, 4], [98, 41], q, k, v)
    assert torch.equal(out[:8], want)


@pytest.mark.skipif(not HAVE_TWO_LEVEL, reason="the compiled locks operators are not installed")
def test_two_level_verification_step_equals_one_token_steps(monkeypatch):
    """Two-level LOCKS (groups of 2 pages = 32 tokens): request 0's last token completes a group
    (416 = 13 x 32) inside the verification step; every row equals the one-token steps, supers
    included."""
    cfg = {"precision": "int4", "budget": 64, "group_pages": 2, "alpha": 1.0, "min_groups": 4,
           "two_level_min_context": 0}
    a = _make(monkeypatch, cfg, "compiled", spec=fake_spec(k=3))
    b = _make(monkeypatch, cfg, "compiled")
    bt, gen = tb.tables(), torch.Generator().manual_seed(34)
    q, k, v = rand_rows(gen, 470)
    for s in (a, b):
        run(s, bt, [412, 58], [412, 58], q, k, v)
    q, k, v = rand_rows(gen, 8)
    _, md, out = run(a, bt, [4, 4], [416, 62], q, k, v)
    assert md.num_decode_tokens == 8
    assert torch.equal(md.super_table[:8, :4], bt[[0, 0, 0, 0, 1, 1, 1, 1]][:, 1:8:2])
    for i in range(4):
        idx = [i, 4 + i]
        _, _, outb = run(b, bt, [1, 1], [413 + i, 59 + i], q[idx], k[idx], v[idx])
        assert torch.equal(out[idx], outb), i
    for x, y in zip(a.impl.side.supers(), b.impl.side.supers()):
        assert torch.equal(x, y)


@pytest.mark.parametrize("seed", range(6))
def test_rejected_drafts_never_leave_stale_summaries(monkeypatch, seed):
    """Random verification schedules (1 + 3 tokens a request, 1-4 of them accepted, the next
    step overwriting the rejected drafts' slots, as vLLM rolls back): after every step the
    summary of every page complete within the step's rows equals a fresh build from the cache,
    and every row's output equals the reference decode over those fresh summaries, so a
    summary built from a rejected draft is never read."""
    s = _make(monkeypatch, {"precision": "fp32", "budget": 64}, "reference", spec=fake_spec(k=3))
    bt, gen = tb.tables(), torch.Generator().manual_seed(100 + seed)
    rng = torch.Generator().manual_seed(seed)
    lens = [int(x) for x in torch.randint(20, 90, (2,), generator=rng)]
    q, k, v = rand_rows(gen, sum(lens))
    run(s, bt, lens, lens, q, k, v)
    for _ in range(25):
        new = [n + 4 for n in lens]
        q, k, v = rand_rows(gen, 8)
        cm, md, out = run(s, bt, [4, 4], new, q, k, v)
        rows_len = torch.tensor([lens[r] + 1 + i for r in range(2) for i in range(4)], dtype=torch.int32)
        assert md.seq_lens[:8].tolist() == rows_len.tolist()
        fresh = tuple(torch.zeros_like(t) for t in s.impl.side.summaries())
        blocks = full_blocks(bt, new)
        ref.build_summaries(s.kv[0], torch.tensor(blocks), fresh, 8)
        for got, want in zip(s.impl.side.summaries(), fresh):
            assert torch.equal(got[blocks], want[blocks])
        rows_bt = bt[[0, 0, 0, 0, 1, 1, 1, 1]]
        want, _ = ref.decode(q.float(), s.kv[0], s.kv[1], fresh, rows_bt, rows_len, budget=64)
        assert torch.equal(out, want.to(torch.bfloat16))
        lens = [n + int(torch.randint(1, 5, (1,), generator=rng)) for n in lens]  # accepted


def request_reference(s, q, bt, req_lens, T, budget):
    """spec_selection "request" written out on the reference: one selection a request from its
    T tokens' queries as G T heads, copied to the token rows, a straddling row's tail swapped
    for its own; then the reference attention of each token over its row's pages."""
    S = len(req_lens)
    qr = q.view(S, T, H, HQ // H, D).permute(0, 2, 3, 1, 4).reshape(S, HQ * T, D)
    # at the last token's length, less one where it completes a page (that page is then the
    # selection's tail, which the request's other rows hold partly)
    lens = torch.tensor([n - (n % tb.P == 0) for n in req_lens], dtype=torch.int32)
    req = ref.select(qr.float(), s.impl.side.summaries(), bt, lens, budget)
    rows, row_lens = [], []
    for r in range(S):
        for i in range(T):
            n = req_lens[r] - (T - 1 - i)
            own, last = (n - 1) // tb.P, (req_lens[r] - 1) // tb.P
            heads = []
            for h in range(H):
                pg = list(req[r][h])
                if own < last:
                    pg = [p for p in pg if p != last]
                    pg = pg if own in pg else pg + [own]
                heads.append(pg)
            rows.append(heads)
            row_lens.append(n)
    rows_bt = bt.repeat_interleave(T, 0)
    out, _ = ref.attend(q.float(), s.kv[0], s.kv[1], rows_bt, torch.tensor(row_lens), rows)
    return out.to(torch.bfloat16), rows


@pytest.mark.parametrize("budget", [64, 16384])
def test_request_selection_one_selection_a_request(monkeypatch, budget):
    """spec_selection "request": request 0's tokens straddle a page end (lengths 95-98), request
    1's do not (38-41); the outputs are the reference's request selection with each row's own
    tail, bit for bit; with the budget above the context every row is exactly dense."""
    cfg = {"precision": "fp32", "budget": budget, "spec_selection": "request", "min_context": 0}
    s = _make(monkeypatch, cfg, "reference", spec=fake_spec(k=3))  # min_context 0: select even
    bt, gen = tb.tables(), torch.Generator().manual_seed(35)        # when the budget holds it all
    q, k, v = rand_rows(gen, 131)
    run(s, bt, [94, 37], [94, 37], q, k, v)
    q, k, v = rand_rows(gen, 8)
    cm, md, out = run(s, bt, [4, 4], [98, 41], q, k, v)
    assert md.request_tokens == 4 and s.impl.req_wrappers
    wr = next(w for mb, w in s.impl.req_wrappers if mb >= 2)
    assert wr.runs[-1] == (2, "select")                                  # one row a request
    want, rows = request_reference(s, q, bt, [98, 41], 4, budget)
    assert torch.equal(out, want)
    b = md.bufs  # the impl's own page lists: the request's, with each row's own tail
    assert [[sorted(int(x) for x in b.pages[i, h, : int(b.counts[i, h])]) for h in range(H)]
            for i in range(8)] == [[sorted(p) for p in r] for r in rows]
    if budget > 98:
        assert (out.double() - dense_of(s, q, bt.repeat_interleave(4, 0), md.seq_lens[:8])).abs().max() < 2 ** -7
    else:
        assert rows[0][0][-1] == 5 and rows[2][0][-1] == 6 and 6 not in rows[0][0]   # own tails
        dense = dense_of(s, q[3:4], bt[:1], cm.seq_lens[:1])
        assert (out[3].double() - dense[0]).abs().max() > 1e-2                  # really sparse


@pytest.mark.parametrize("ops", ["reference", "compiled"])
def test_request_selection_complete_last_page(monkeypatch, ops):
    """spec_selection "request" where the request's last token completes a page (rows 93-96):
    the request selects at length 95, so page 5, which rows 93-95 hold partly, is its tail and
    in every row's list (at length 96 it would be a scored page: with a budget of two pages,
    left out for some head here). Outputs equal the reference's request selection bit for bit
    (reference operators), and every row with a partial page attends it (both)."""
    cfg = {"precision": "fp32" if ops == "reference" else "int4", "budget": 32,
           "spec_selection": "request", "min_context": 0}
    s = _make(monkeypatch, cfg, ops, spec=fake_spec(k=3))
    bt, gen = tb.tables(), torch.Generator().manual_seed(36)
    q, k, v = rand_rows(gen, 129)
    run(s, bt, [92, 37], [92, 37], q, k, v)
    q, k, v = rand_rows(gen, 8)
    cm, md, out = run(s, bt, [4, 4], [96, 41], q, k, v)
    b = md.bufs
    assert b.req_seq_lens[:2].tolist() == [95, 41]
    req0 = [set(b.req_pages[0, h, : int(b.req_counts[0, h])].tolist()) for h in range(H)]
    for i, n in enumerate(md.seq_lens[:8].tolist()):
        for h in range(H):
            lst = b.pages[i, h, : int(b.counts[i, h])].tolist()
            assert lst == sorted(lst) and len(set(lst)) == len(lst)
            if n % tb.P:
                assert (n - 1) // tb.P in lst, (i, n, h, lst)
            if i == 3:                                          # row 96: the request's own list
                assert set(lst) == req0[h]
    if ops == "reference":
        want, rows = request_reference(s, q, bt, [96, 41], 4, 32)
        assert torch.equal(out, want)
        assert [[sorted(int(x) for x in b.pages[i, h, : int(b.counts[i, h])]) for h in range(H)]
                for i in range(8)] == [[sorted(p) for p in r] for r in rows]


def test_request_selection_is_logged_in_vllms_log(monkeypatch):
    """The plugin logs through a child of vLLM's "vllm" logger, the one vLLM gives a handler
    and its INFO level (a `locks.*` logger's INFO lines never reached an engine's log): the
    request-selection line arrives there once."""
    import logging

    import locks.vllm.impl as im

    monkeypatch.setattr(im, "_logged_request_on", False)
    got: list = []
    h = logging.Handler(logging.DEBUG)
    h.emit = got.append
    vl = logging.getLogger("vllm")
    vl.addHandler(h)
    try:
        cfg = {"precision": "fp32", "budget": 32, "spec_selection": "request", "min_context": 0}
        s = _make(monkeypatch, cfg, "reference", spec=fake_spec(k=3))
        bt, gen = tb.tables(), torch.Generator().manual_seed(37)
        run(s, bt, [60, 37], [60, 37], *rand_rows(gen, 97))
        for _ in range(2):
            run(s, bt, [4, 4], [64, 41], *rand_rows(gen, 8))
    finally:
        vl.removeHandler(h)
    assert im.plugin_logger().name.startswith("vllm.")
    msgs = [r.getMessage() for r in got if "spec_selection 'request'" in r.getMessage()]
    assert len(msgs) == 1 and "4 tokens" in msgs[0], msgs


def test_request_selection_falls_back_to_token_rows(monkeypatch):
    """A verification batch that is not uniform (4 and 2 tokens) and a group the kernels do not
    take (G 4 x 9 tokens = 36 heads > 32) decode one row a token: the one-token bits."""
    cfg = {"precision": "fp32", "budget": 64, "spec_selection": "request"}
    for spec, qlens in ((fake_spec(k=3), [4, 2]), (fake_spec(k=8), [9, 9])):
        a = _make(monkeypatch, cfg, "reference", spec=spec)
        b = _make(monkeypatch, dict(cfg, spec_selection="token"), "reference", spec=spec)
        bt, gen = tb.tables(), torch.Generator().manual_seed(36)
        q, k, v = rand_rows(gen, 131)
        for s in (a, b):
            run(s, bt, [94, 37], [94, 37], q, k, v)
        q, k, v = rand_rows(gen, sum(qlens))
        lens = [94 + qlens[0], 37 + qlens[1]]
        _, md, out = run(a, bt, qlens, lens, q, k, v)
        _, _, want = run(b, bt, qlens, lens, q, k, v)
        assert torch.equal(out, want)
        assert md.request_tokens == (0 if qlens[0] != qlens[1] else 9) and not a.impl.req_wrappers == (
            qlens[0] != qlens[1])


@pytest.mark.skipif(not HAVE_OPS, reason="the compiled locks operators are not installed")
def test_request_selection_on_the_compiled_operators(monkeypatch):
    """The compiled operators in "request" mode (int4): every row's pages ascend and end at its
    own tail page, none past it, the request's two rows on one side of the page end share their
    list, and the output is the reference attention over those pages."""
    cfg = {"precision": "int4", "budget": 64, "spec_selection": "request"}
    s = _make(monkeypatch, cfg, "compiled", spec=fake_spec(k=3))
    bt, gen = tb.tables(), torch.Generator().manual_seed(37)
    q, k, v = rand_rows(gen, 131)
    run(s, bt, [94, 37], [94, 37], q, k, v)
    q, k, v = rand_rows(gen, 8)
    _, md, out = run(s, bt, [4, 4], [98, 41], q, k, v)
    assert md.request_tokens == 4
    b = md.bufs
    rows = [[[int(x) for x in b.pages[i, h, : int(b.counts[i, h])]] for h in range(H)] for i in range(8)]
    lens = md.seq_lens[:8].tolist()
    for i in range(8):
        for h in range(H):
            pg = rows[i][h]
            assert pg == sorted(set(pg)) and pg[-1] == (lens[i] - 1) // tb.P, (i, h, pg)
    assert rows[0] == rows[1] and rows[2] == rows[3] and rows[4] == rows[7]
    want, _ = ref.attend(q.float(), s.kv[0], s.kv[1], bt.repeat_interleave(4, 0), md.seq_lens[:8], rows)
    assert ((out.double() - want).abs() <= want.abs() * 2 ** -8 + 1e-5).all()
