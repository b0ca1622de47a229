"""CUDA graphs over the wrapper: a decode step of several layers (append K/V, summary update,
select, attend) captured once and replayed == eager bit for bit; and the #12 soak: 10,000
replays of the captured step with lengths growing (pages filling), block tables and lengths
replaced every 1,000 steps, checked against eager every 100 steps, device memory flat."""
import pytest
import torch

import locks
from locks import ops

from gpu_util import full_blocks, needs_cuda, paged

pytestmark = [pytest.mark.gpu, needs_cuda]
P, H, HQ, D = 16, 2, 8, 128


class Layer:
    """One layer's paged state on the GPU and its planned wrapper (caller-owned everything)."""

    def __init__(self, nb, mb, B, budget, seed, tau=0.0):
        k, v, bt, sl, _ = paged(B=B, lens=(300,) * B, H=H, Hq=HQ, d=D, seed=seed, spare_blocks=mb - 19)
        self.k, self.v, self.bt, self.sl = k.cuda(), v.cuda(), bt.cuda(), sl.cuda()
        self.s = list(ops.new_summaries(self.k.shape[0], H, D, P, 8, "cuda", "int4"))
        self.w = locks.DecodeWrapper.allocate(num_q_heads=HQ, num_kv_heads=H, head_dim=D,
                                              num_blocks=self.k.shape[0], max_batch=B,
                                              max_blocks_per_seq=self.bt.shape[1], budget_tokens=budget,
                                              device="cuda", tau=tau)
        self.out = torch.empty(B, HQ, D, device="cuda")
        self.lse = torch.empty(B, HQ, device="cuda")
        self.pages = torch.empty(B, H, self.w.capacity, dtype=torch.int32, device="cuda")
        self.counts = torch.empty(B, H, dtype=torch.int32, device="cuda")

    def reset(self, bt, sl):
        """New block table and lengths (outside any graph): copy into the captured tensors
        and rebuild the summaries of every full page."""
        self.bt.copy_(bt)
        self.sl.copy_(sl)
        for t in self.s:
            t.zero_()
        ops.summary_build(self.k, full_blocks(self.bt.cpu(), self.sl.cpu()).cuda(), self.s)

    def step(self, q, kv):
        B = q.shape[0]
        rows = torch.arange(B, device="cuda")
        blk = self.bt[rows, (self.sl // P).long()].long()  # device-side: no host sync
        slot = (self.sl % P).long()
        self.k[blk, slot] = kv[0]
        self.v[blk, slot] = kv[1]
        self.sl += 1
        ops.summary_update(self.k, self.bt, self.sl, self.s)
        self.w.run(q, self.k, self.v, self.s, self.bt, self.sl, out=self.out, lse=self.lse,
                   pages=self.pages, counts=self.counts)

    def state(self):
        return [self.k, self.v, self.sl, *self.s, self.out, self.lse, self.pages, self.counts]


def capture(fn):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()  # warm-up (cuBLAS handles, lazy module loading)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return g


@pytest.mark.parametrize("tau", [0.0, 0.9])  # 0.9: the adaptive budget, counts vary per replay
def test_multi_layer_step_replay_equals_eager(tau):
    B, layers, steps = 4, 8, 24
    eager = [Layer(4 * 60, 60, B, 512, seed=i, tau=tau) for i in range(layers)]
    graph = [Layer(4 * 60, 60, B, 512, seed=i, tau=tau) for i in range(layers)]
    for e, g in zip(eager, graph):
        lens = torch.tensor([300, 517, 700, 911], dtype=torch.int32)
        e.reset(e.bt, lens)
        g.reset(g.bt, lens)
    q_in = torch.zeros(layers, B, HQ, D, device="cuda")
    kv_in = torch.zeros(layers, 2, B, H, D, device="cuda", dtype=torch.bfloat16)
    # the warm-up inside capture() advances the graph layers by one token: do the same to eager
    for i, e in enumerate(eager):
        e.step(q_in[i], kv_in[i])
    g = capture(lambda: [layer.step(q_in[i], kv_in[i]) for i, layer in enumerate(graph)])
    torch.manual_seed(0)
    for t in range(steps):
        q_in.copy_(torch.randn_like(q_in))
        kv_in.copy_(torch.randn_like(kv_in, dtype=torch.float32).to(torch.bfloat16))
        for i, e in enumerate(eager):
            e.step(q_in[i], kv_in[i])
        g.replay()
        for i, (e, gl) in enumerate(zip(eager, graph)):
            for a, b in zip(e.state(), gl.state()):
                assert torch.equal(a, b), f"step {t} layer {i}"


def test_soak_10000_replays_checked_every_100_memory_flat():
    B, steps, every, reset_every = 4, 10_000, 100, 1_000
    mb = -(-(1200 + reset_every + 2) // P)
    layer = Layer(B * mb, mb, B, 512, seed=7)
    twin = Layer(B * mb, mb, B, 512, seed=7)  # the eager copy, synced at each check
    gen = torch.Generator().manual_seed(1)

    def new_table():
        perm = torch.randperm(layer.k.shape[0], generator=gen).to(torch.int32).view(B, mb)
        lens = torch.randint(17, 1200, (B,), generator=gen, dtype=torch.int32)
        return perm, lens

    layer.reset(*new_table())
    q_in = torch.zeros(B, HQ, D, device="cuda")
    kv_in = torch.zeros(2, B, H, D, device="cuda", dtype=torch.bfloat16)
    g = capture(lambda: layer.step(q_in, kv_in))
    torch.cuda.synchronize()
    mem0 = torch.cuda.memory_allocated()
    checks = 0
    for t in range(1, steps + 1):
        if t % reset_every == 0:
            layer.reset(*new_table())
        q_in.normal_()
        kv_in.copy_(torch.randn(2, B, H, D, device="cuda").to(torch.bfloat16))
        if t % every == 0:
            for a, b in zip(twin.state(), layer.state()):
                a.copy_(b)
            twin.bt.copy_(layer.bt)
            twin.step(q_in, kv_in)
            g.replay()
            for a, b in zip(twin.state(), layer.state()):
                assert torch.equal(a, b), f"replay {t} differs from eager"
            checks += 1
        else:
            g.replay()
    torch.cuda.synchronize()
    assert checks == steps // every
    assert torch.cuda.memory_allocated() == mem0, "device memory grew over the soak"


def test_length_buckets_in_a_torch_graph_equal_the_full_plan():
    """DecodeWrapper.plan(length_buckets=4): select() captured in a torch CUDA graph (its global
    capture mode) records the bucket choice and a SWITCH node; every replay, with the longest row
    in each bucket and an untrusted length, selects what the plain full plan selects eagerly."""
    B, mb = 3, 512
    k, v, bt, sl, q = paged(B=B, lens=(16 * 500 + 3, 16 * 200, 40), H=H, Hq=HQ, d=D, seed=5,
                            spare_blocks=mb - 501)
    k, v, bt, q = k.cuda(), v.cuda(), bt.cuda(), q.cuda()
    s = list(ops.new_summaries(k.shape[0], H, D, P, 8, "cuda", "int4"))
    ops.summary_build(k, full_blocks(bt.cpu(), sl).cuda(), s)
    kw = dict(num_q_heads=HQ, num_kv_heads=H, head_dim=D, num_blocks=k.shape[0], max_batch=B,
              max_blocks_per_seq=mb, budget_tokens=512, device="cuda")
    plain = locks.DecodeWrapper.allocate(**kw)
    w = locks.DecodeWrapper.allocate(**kw, length_buckets=4)
    assert [ops.plan_capacity(p) for p in w.length_buckets] == [plain.capacity] * 4
    assert [p == plain.plan_vector for p in w.length_buckets] == [False, False, False, True]
    lens = torch.tensor([40, 40, 40], dtype=torch.int32, device="cuda")
    pages = torch.empty(B, H, w.capacity, dtype=torch.int32, device="cuda")
    counts = torch.empty(B, H, dtype=torch.int32, device="cuda")
    g = capture(lambda: w.select(q, s, bt, lens, pages=pages, counts=counts))
    for case in ([16 * 60, 17, 40], [16 * 64 + 1, 17, 40], [16 * 200, 16 * 130, 40],
                 [16 * 500 + 3, 16 * 200, 40], [16 * 512 + 1, 0, 40]):  # the last: untrusted
        lens.copy_(torch.tensor(case, dtype=torch.int32))
        pages.fill_(-7), counts.fill_(-7)
        g.replay()
        rp, rc = plain.select(q, s, bt, lens)
        torch.cuda.synchronize()
        assert torch.equal(counts, rc), case
        for r in range(B * H):
            n = int(rc.view(-1)[r])
            assert torch.equal(pages.view(-1, w.capacity)[r, :n], rp.view(-1, w.capacity)[r, :n]), case
