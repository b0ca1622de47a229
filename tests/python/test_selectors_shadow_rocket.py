"""The drop-in's ShadowKV-style and RocketKV-style selectors (locks/selectors.py "shadowkv",
"rocketkv") against the harness's rules (src/eval/selector_shadowkv.cpp, selector_rocket.cpp)
restated here as plain loops in float64, one (sequence, KV head, query head) at a time; the
budget path on top; a whole generation through locks.hf with each; and the option errors."""
import math

import pytest
import torch

from locks import selectors as sel

P = 16


def paged(B=3, H=2, G=3, d=32, J=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    nb = B * J
    k = torch.randn(nb, P, H, d, generator=g)
    k[:, :, :, :4] += 2.0 * torch.randn(nb, 1, H, 4, generator=g)  # pages that differ in spread
    bt = torch.randperm(nb, generator=g).view(B, J).to(torch.int32)
    q = torch.randn(B, H * G, d, generator=g)
    return q, k, bt


def page_keys(k, bt, b, j, h):
    return k[int(bt[b, j]), :, h].double()  # [P, d]


def lse(xs):
    m = max(xs)
    return m + math.log(sum(math.exp(x - m) for x in xs))


# -- ShadowKV, restated ----------------------------------------------------------------------

def shadow_loop(q, k, bt, lens, scale, budget, chunk=8, share=1 / 64):
    """{(b, h): (group score per full page, set of outlier pages)} by the harness's rules."""
    B, Hq, d = q.shape
    H = k.shape[2]
    G = Hq // H
    out = {}
    for b in range(B):
        n = int(lens[b])
        full = n // P
        for h in range(H):
            per_head = []
            for g in range(G):
                qq = q[b, h * G + g].double()
                s = []
                for j in range(full):
                    keys = page_keys(k, bt, b, j, h)
                    marks = [keys[c * chunk:(c + 1) * chunk].mean(0) for c in range(P // chunk)]
                    s.append(math.log(chunk) + lse([float(qq @ m) * scale for m in marks]))
                total = lse(s)
                per_head.append([x - total for x in s])
            score = [max(per_head[g][j] for g in range(G)) for j in range(full)]
            cos = []
            for j in range(full):
                keys = page_keys(k, bt, b, j, h)
                worst = 1.0
                for c in range(P // chunk):
                    part = keys[c * chunk:(c + 1) * chunk]
                    m = part.mean(0)
                    for key in part:
                        kn, mn = float(key @ key), float(m @ m)
                        worst = min(worst, float(key @ m) / math.sqrt(kn * mn) if kn > 0 and mn > 0 else 1.0)
                cos.append(worst)
            n_out = min(math.ceil(share * full), (budget // P) // 4, full) if n > budget else 0
            outliers = set(sorted(range(full), key=lambda j: (cos[j], j))[:n_out])
            out[(b, h)] = (score, outliers)
    return out


@pytest.mark.parametrize("seed,budget,share", [(0, 128, 1 / 64), (1, 64, 0.3), (2, 160, 0.5)])
def test_shadowkv_scores_follow_the_harness_rules(seed, budget, share):
    q, k, bt = paged(seed=seed)
    lens = torch.tensor([190, 77, 150], dtype=torch.int32)
    scale = 1 / math.sqrt(q.shape[-1])
    got = sel.shadowkv_scores(q, k, bt, lens, scale, budget=budget, outlier_share=share)
    want = shadow_loop(q, k, bt, lens, scale, budget, share=share)
    big = torch.finfo(torch.float32).max
    n_forced = 0
    for (b, h), (score, outliers) in want.items():
        full = len(score)
        row = got[b, h]
        assert {j for j in range(full) if row[j] == big} == outliers, (b, h)
        n_forced += len(outliers)
        for j in range(full):
            if j not in outliers:
                assert abs(float(row[j]) - score[j]) < 1e-4, (b, h, j)
        assert torch.isinf(row[full:]).all() and (row[full:] < 0).all()
    if share > 0.1:
        assert n_forced > 0  # the outlier path is exercised


def test_shadowkv_landmark_score_is_the_page_mass_when_keys_repeat():
    """With every key of a chunk equal, the landmark estimate is the chunk's exact mass."""
    q, k, bt = paged(seed=3)
    k = k.view(k.shape[0], 2, 8, *k.shape[2:])[:, :, :1].expand(-1, -1, 8, -1, -1).reshape(k.shape)
    got = sel.shadowkv_head_scores(q, k, bt, 0.2)  # [B, H, G, J]
    exact = sel.page_lse(q, k, bt, 0.2)
    assert torch.allclose(got, exact, atol=1e-4)


# -- RocketKV, restated ----------------------------------------------------------------------

def rocket_bound_loop(qq, keys, scale, r):
    top = sorted(range(len(qq)), key=lambda c: (-abs(float(qq[c])), c))[:r]
    lo, hi = keys.min(0).values, keys.max(0).values
    return scale * sum(max(float(qq[c]) * float(hi[c]), float(qq[c]) * float(lo[c])) for c in top)


def snap_loop(q_obs, k, bt, T, scale, pool, b, h, G):
    """The harness's snap_prepare for one (sequence, KV head): page weights of the full pages."""
    keys = torch.cat([page_keys(k, bt, b, j, h) for j in range(bt.shape[1])])[:T]  # [T, d]
    w = [0.0] * T
    for o in range(q_obs.shape[1]):
        for g in range(G):
            logit = (keys @ q_obs[b, o, h * G + g].double()) * scale
            p = torch.softmax(logit, 0)
            for t in range(T):
                w[t] += float(p[t])
    half = pool // 2
    pooled = [max(w[max(0, t - half):min(T, t + half + 1)]) for t in range(T)]
    return [sum(pooled[j * P:(j + 1) * P]) for j in range(T // P)]


def rocket_loop(q, k, bt, lens, scale, budget, dims, q_obs, prompt_lens, pool, keep):
    B, Hq, d = q.shape
    H = k.shape[2]
    G = Hq // H
    r = dims or d // 4
    out = {}
    for b in range(B):
        full = int(lens[b]) // P
        T = int(prompt_lens[b])
        for h in range(H):
            shares = [0.0] * full
            for g in range(G):
                s = [rocket_bound_loop(q[b, h * G + g].double(), page_keys(k, bt, b, j, h), scale, r)
                     for j in range(full)]
                total = lse(s)
                for j in range(full):
                    shares[j] += math.exp(s[j] - total) / G
            evicted = set()
            if q_obs is not None and T > budget:
                weights = snap_loop(q_obs, k, bt, T, scale, pool, b, h, G)
                n_keep = min(len(weights), math.ceil(keep * budget / P))
                kept = set(sorted(range(len(weights)), key=lambda j: (-weights[j], j))[:n_keep])
                first_window = max(0, T - q_obs.shape[1]) // P
                evicted = {j for j in range(full) if j not in kept and j < first_window}
            out[(b, h)] = (shares, evicted)
    return out


def test_rocket_bound_uses_the_top_channels_and_bounds_them():
    q, k, bt = paged(seed=4)
    B, Hq, d = q.shape
    H, G = k.shape[2], Hq // k.shape[2]
    got = sel.rocket_bounds(q, k, bt, 0.3, dims=5)
    for b in range(B):
        for h in range(H):
            for g in range(G):
                for j in range(bt.shape[1]):
                    want = rocket_bound_loop(q[b, h * G + g].double(), page_keys(k, bt, b, j, h), 0.3, 5)
                    assert abs(float(got[b, h, g, j]) - want) < 1e-4
    # all channels: Quest's bound exactly
    assert torch.allclose(sel.rocket_bounds(q, k, bt, 0.3, dims=d), sel.quest_bounds(q, k, bt, 0.3), atol=1e-5)
    # ties in |q| go to the lower channel (the harness's stable sort)
    q2 = torch.ones(1, 1, 8)
    k2 = torch.zeros(1, P, 1, 8)
    k2[0, :, 0] = torch.arange(8.0)
    b2 = sel.rocket_bounds(q2, k2, torch.zeros(1, 1, dtype=torch.int32), 1.0, dims=2)
    assert float(b2) == 0.0 + 1.0


@pytest.mark.parametrize("seed,budget,pool,keep", [(0, 64, 7, 1.0), (1, 96, 3, 0.5), (2, 48, 0, 2.0)])
def test_rocketkv_scores_follow_the_harness_rules(seed, budget, pool, keep):
    q, k, bt = paged(seed=seed)
    B, Hq, d = q.shape
    g = torch.Generator().manual_seed(seed + 10)
    q_obs = torch.randn(B, 5, Hq, d, generator=g)
    prompt_lens = torch.tensor([180, 70, 150], dtype=torch.int32)
    lens = prompt_lens + torch.tensor([10, 3, 0], dtype=torch.int32)  # decode tokens since
    scale = 1 / math.sqrt(d)
    snap = sel.snapkv_weights(q_obs, k, bt, prompt_lens, scale, pool)
    for b in range(B):
        for h in range(k.shape[2]):
            w = snap_loop(q_obs, k, bt, int(prompt_lens[b]), scale, pool, b, h, Hq // k.shape[2])
            assert torch.allclose(snap[b, h, :len(w)].double(), torch.tensor(w, dtype=torch.float64), rtol=1e-4)
            assert torch.isinf(snap[b, h, len(w):]).all()
    got = sel.rocketkv_scores(q, k, bt, lens, scale, budget=budget, dims=0, snap=snap, prompt_lens=prompt_lens,
                              obs=5, keep=keep)
    want = rocket_loop(q, k, bt, lens, scale, budget, 0, q_obs, prompt_lens, pool, keep)
    n_evicted = 0
    for (b, h), (shares, evicted) in want.items():
        row = got[b, h]
        for j, s in enumerate(shares):
            if j in evicted:
                assert row[j] == float("-inf"), (b, h, j)
            else:
                assert abs(float(row[j]) - s) < 1e-5, (b, h, j)
        n_evicted += len(evicted)
        assert torch.isinf(row[len(shares):]).all()
    assert n_evicted > 0  # the eviction path is exercised


# -- the budget path on top, ragged batches ----------------------------------------------------

def options(name, q, k, bt, prompt_lens, obs=4):
    if name == "shadowkv":
        return dict(chunk=8, outlier_share=0.25)
    q_obs = torch.randn(q.shape[0], obs, q.shape[1], q.shape[2], generator=torch.Generator().manual_seed(5))
    return dict(dims=0, snap=sel.snapkv_weights(q_obs, k, bt, prompt_lens, 0.2, 7), prompt_lens=prompt_lens,
                obs=obs, keep=1.0)


@pytest.mark.parametrize("name", ["shadowkv", "rocketkv"])
def test_budget_path_ragged_batch(name):
    q, k, bt = paged(seed=6)
    B, H, J = bt.shape[0], k.shape[2], bt.shape[1]
    lens = torch.tensor([191, 40, 150], dtype=torch.int32)
    opts = options(name, q, k, bt, lens - 2)
    for budget in (48, 64, 112):
        cap = -(-budget // P)
        pages, counts = sel.select(name, q, k, bt, lens, scale=0.2, page_size=P, budget=budget, capacity=cap,
                                   sink_pages=1, recent_pages=1, **opts)
        assert pages.shape == (B, H, cap) and counts.shape == (B, H)
        assert pages.dtype == torch.int32 and counts.dtype == torch.int32
        shares = sel.SCORERS[name](q, k, bt, lens, 0.2, budget=budget, **opts)
        want_pages, want_counts = sel.select_from_scores(shares, lens, page_size=P, budget=budget, capacity=cap,
                                                         sink_pages=1, recent_pages=1)
        assert torch.equal(pages, want_pages) and torch.equal(counts, want_counts)
        for b in range(B):
            n = int(lens[b])
            for h in range(H):
                c = int(counts[b, h])
                row = pages[b, h, :c].tolist()
                assert row == sorted(set(row)) and all(0 <= j < -(-n // P) for j in row)
                assert (pages[b, h, c:] == -1).all()
                if n <= budget:
                    assert row == list(range(-(-n // P)))
                else:
                    assert c == min(budget // P, -(-n // P))
                    assert (-(-n // P) - 1) in row  # the tail page
                    assert 0 in row  # the sink page
        # each row is what it would be alone
        for b in range(B):
            solo = {kk: (v[b:b + 1] if isinstance(v, torch.Tensor) else v) for kk, v in opts.items()}
            p1, c1 = sel.select(name, q[b:b + 1], k, bt[b:b + 1], lens[b:b + 1], scale=0.2, page_size=P,
                                budget=budget, capacity=cap, sink_pages=1, recent_pages=1, **solo)
            assert torch.equal(p1[0], pages[b]) and torch.equal(c1[0], counts[b])


@pytest.mark.parametrize("name", ["shadowkv", "rocketkv"])
def test_budget_at_or_above_the_length_selects_every_page(name):
    q, k, bt = paged(seed=7)
    lens = torch.tensor([190, 77, 192], dtype=torch.int32)
    opts = options(name, q, k, bt, lens)
    cap = bt.shape[1]
    pages, counts = sel.select(name, q, k, bt, lens, scale=0.2, page_size=P, budget=192, capacity=cap, **opts)
    for b, n in enumerate(lens.tolist()):
        npages = -(-n // P)
        assert counts[b].tolist() == [npages] * k.shape[2]
        assert pages[b, :, :npages].tolist() == [list(range(npages))] * k.shape[2]


def test_bad_rocket_dims():
    q, k, bt = paged()
    with pytest.raises(ValueError, match="rocket_dims"):
        sel.rocket_bounds(q, k, bt, 0.2, dims=q.shape[-1] + 1)
    with pytest.raises(ValueError, match="shadow_chunk"):
        sel.shadowkv_head_scores(q, k, bt, 0.2, chunk=5)


# -- through the drop-in ------------------------------------------------------------------------

@torch.inference_mode()
@pytest.mark.parametrize("name", ["shadowkv", "rocketkv"])
def test_drop_in_ragged_batch_and_state(tiny_llama, name):
    from locks import hf

    g = torch.Generator().manual_seed(2)
    a, b = torch.randint(1, 256, (1, 300), generator=g), torch.randint(1, 256, (1, 230), generator=g)
    ids = torch.cat([a, torch.cat([torch.zeros(1, 70, dtype=torch.long), b], 1)])
    mask = torch.cat([torch.ones(1, 300, dtype=torch.long), torch.cat([torch.zeros(1, 70, dtype=torch.long),
                                                                      torch.ones(1, 230, dtype=torch.long)], 1)])
    kw = hf.cache_kwarg(tiny_llama)
    try:
        hf.enable(tiny_llama, budget=64, selector=name, precision="fp32", obs_window=8)
        cache = hf.LocksCache(tiny_llama.config, tiny_llama.locks_config)
        out = tiny_llama.generate(input_ids=ids, attention_mask=mask, max_new_tokens=5, do_sample=False,
                            pad_token_id=0, **{kw: cache})
        assert out.shape == (2, 305)
        layer = cache.layers[0]
        assert layer.q_obs.shape == (2, 8, 4, 32) and layer.prompt_lens.tolist() == [300, 230]
        assert int(layer.last_counts.max()) == 4
        if name == "rocketkv":
            snap = layer._snap[1]
            assert snap.shape == (2, 2, layer.max_blocks)
            assert torch.isfinite(snap[0, :, :300 // 16]).all() and torch.isinf(snap[0, :, 300 // 16:]).all()
            assert torch.isfinite(snap[1, :, :230 // 16]).all() and torch.isinf(snap[1, :, 230 // 16:]).all()
        # the rows decode as they would alone
        solo = tiny_llama.generate(input_ids=b, attention_mask=torch.ones_like(b), max_new_tokens=5, do_sample=False,
                             pad_token_id=0, **{kw: hf.LocksCache(tiny_llama.config, tiny_llama.locks_config)})
        assert torch.equal(out[1, 70:], solo[0])
    finally:
        hf.disable(tiny_llama)


@pytest.mark.parametrize("bad,err", [
    (dict(selector="shadow"), ValueError), (dict(shadow_chunk=5), ValueError), (dict(shadow_chunk=0), ValueError),
    (dict(shadow_chunk=8.0), TypeError), (dict(shadow_outlier_share=1.5), ValueError),
    (dict(shadow_outlier_share=float("nan")), ValueError), (dict(rocket_dims=-1), ValueError),
    (dict(snapkv_keep=0.0), ValueError), (dict(snapkv_keep=float("inf")), ValueError),
    (dict(snapkv_keep="4"), TypeError), (dict(snapkv_pool=-1), ValueError),
    (dict(selector="shadowkv", tau=0.9), ValueError)])
def test_bad_options(bad, err):
    from locks import hf

    with pytest.raises(err):
        hf.LocksConfig(budget=256, **bad).validate()


@torch.inference_mode()
def test_rocket_dims_beyond_head_dim_is_a_clear_error(tiny_llama):
    from locks import hf

    ids = torch.randint(0, 256, (1, 200), generator=torch.Generator().manual_seed(1))
    try:
        hf.enable(tiny_llama, budget=64, selector="rocketkv", rocket_dims=33)
        with pytest.raises(ValueError, match="rocket_dims"):
            tiny_llama.generate(ids, max_new_tokens=2, do_sample=False)
    finally:
        hf.disable(tiny_llama)


# -- against the C++ harness (locks eval) on a tiny_llama synthetic capture ---------------------------

def _locks_cli():
    import os
    import shutil

    for c in (os.environ.get("LOCKS_CLI"), shutil.which("locks"),
              os.path.join(os.path.dirname(__file__), "..", "..", "build", "tools", "locks")):
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    return None


def test_recall_equals_the_harness_on_a_tiny_capture(tmp_path):
    """`locks eval` (the C++ shadowkv / rocket_snapkv) and the drop-in's selectors select the
    same pages: per (step, query head) the same attention-mass recall. Skipped without the
    CLI (LOCKS_CLI=path, `locks` on PATH, or build/tools/locks)."""
    import csv
    import json
    import subprocess

    np = pytest.importorskip("numpy")
    cli = _locks_cli()
    if cli is None:
        pytest.skip("no locks CLI (set LOCKS_CLI or build build/tools/locks)")
    T, H, G, d, steps, obs = 200, 2, 3, 32, 3, 8
    g = torch.Generator().manual_seed(11)
    keys = torch.randn(T, H, d, generator=g)
    keys[:, :, :4] += 2.0 * torch.randn(T // 8 + 1, H, 4, generator=g).repeat_interleave(8, 0)[:T]  # chunks differ
    vals = torch.randn(T, H, d, generator=g)
    q = torch.randn(steps, H * G, d, generator=g)
    q_obs = torch.randn(obs, H * G, d, generator=g)
    cap = tmp_path / "cap"
    cap.mkdir()
    meta = dict(model="synthetic", num_layers=1, layers=[0], kv_heads=H, q_heads=H * G, head_dim=d,
                positional_encoding="none", keys="post_rope", tokens=T, steps=steps, dtype="float32")
    (cap / "meta.json").write_text(json.dumps(meta))
    for what, a in (("k", keys), ("v", vals), ("q", q), ("qobs", q_obs)):
        np.save(cap / f"layer0_{what}.npy", a.numpy().astype(np.float32))
    budgets = [48, 96, 160]
    res = tmp_path / "res"
    subprocess.run([cli, "eval", "--capture", str(cap), "--out", str(res), "--methods", "shadowkv,rocket_snapkv",
                    "--budgets", ",".join(map(str, budgets)), "--outlier-share", "0.25", "--snapkv-keep", "1",
                    "--sink", "1", "--per-query", "--no-plots"], check=True, capture_output=True, timeout=120)
    want = {}
    with open(res / "per_query.csv") as f:
        for r in csv.DictReader(f):
            want[(r["method"], int(r["budget"]), int(r["step"]), int(r["q_head"]))] = float(r["recall"])

    nb = -(-T // P)
    k_pages = torch.zeros(nb * P, H, d)
    k_pages[:T] = keys
    k_pages = k_pages.view(nb, P, H, d)
    bt = torch.arange(nb, dtype=torch.int32)[None]
    lens = torch.tensor([T], dtype=torch.int32)
    scale = 1 / math.sqrt(d)
    snap = sel.snapkv_weights(q_obs[None], k_pages, bt, lens, scale, 7)
    checked = 0
    for name, cname in (("shadowkv", "shadowkv"), ("rocketkv", "rocket_snapkv")):
        opts = (dict(chunk=8, outlier_share=0.25) if name == "shadowkv"
                else dict(dims=0, snap=snap, prompt_lens=lens, obs=obs, keep=1.0))
        for b in budgets:
            for s in range(steps):
                pages, counts = sel.select(name, q[s][None], k_pages, bt, lens, scale=scale, page_size=P, budget=b,
                                           capacity=nb, sink_pages=1, **opts)
                for qh in range(H * G):
                    h = qh // G
                    w = torch.softmax((keys[:, h].double() @ q[s, qh].double()) * scale, 0)
                    chosen = pages[0, h, :int(counts[0, h])].tolist()
                    recall = float(sum(w[j * P:(j + 1) * P].sum() for j in chosen))
                    assert abs(recall - want[(cname, b, s, qh)]) < 1e-5, (name, b, s, qh, recall)
                    checked += 1
    assert checked == 2 * len(budgets) * steps * H * G


@torch.inference_mode()
@pytest.mark.parametrize("name", ["shadowkv", "rocketkv"])
def test_kept_page_statistics_select_as_recomputed(tiny_llama, name, monkeypatch):
    """The drop-in keeps the full pages' landmarks / cosines / min-max until a page fills:
    the same selections as recomputing them from the keys every step (decode fills pages)."""
    from locks import hf

    ids = torch.randint(0, 256, (2, 290), generator=torch.Generator().manual_seed(3))
    kw = hf.cache_kwarg(tiny_llama)
    original_select, original_options = sel.select, hf.LocksLayer._selector_options

    def run(fresh: bool):
        got = []

        def recording(*a, **k):
            pages, counts = original_select(*a, **k)
            got.append((pages.clone(), counts.clone()))
            return pages, counts

        def options(self, sel_name, scaling):
            if fresh:
                self._page_stats = None  # recompute from the keys every step
            return original_options(self, sel_name, scaling)

        monkeypatch.setattr(sel, "select", recording)
        monkeypatch.setattr(hf.LocksLayer, "_selector_options", options)
        out = tiny_llama.generate(ids, max_new_tokens=24, do_sample=False,
                            **{kw: hf.LocksCache(tiny_llama.config, tiny_llama.locks_config)})
        return out, got

    try:
        hf.enable(tiny_llama, budget=64, selector=name, precision="fp32", shadow_outlier_share=0.25)
        kept, a = run(False)
        again, b = run(True)
    finally:
        hf.disable(tiny_llama)
    assert torch.equal(kept, again)
    assert len(a) == len(b) == 2 * 23  # both layers, every decode step (the first token: the prefill)
    for (p1, c1), (p2, c2) in zip(a, b):
        assert torch.equal(p1, p2) and torch.equal(c1, c2)
