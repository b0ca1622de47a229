// Length buckets (locks/cuda/length_buckets.h): the step captured with decode_bucketed (and the
// selection with score_select_bucketed), replayed with the batch's longest row in each bucket,
// untrusted lengths included, equals the full plan's eager decode() bit for bit (output, LSE,
// selection); the replay ran the bucket the
// lengths ask for (its plan's own workspace regions hold the selection); outside capture it
// is the full plan's step; a bad call throws before it records or writes anything.
#include <gtest/gtest.h>

#include <cstring>
#include <tuple>

#include "gpu_helpers.h"
#include "locks/cuda/decoder.h"
#include "locks/cuda/length_buckets.h"
#include "locks/cuda/summary_builder.h"

namespace locks::cuda_test {
namespace {

constexpr int kP = 16, kD = 128, kStride = 1024;  // plan and block table: 1024 pages a row

// Bit patterns, so that NaN rows (untrusted lengths) compare equal to themselves.
template <typename T>
std::vector<uint32_t> bits(const std::vector<T>& v) {
  std::vector<uint32_t> b(v.size());
  std::memcpy(b.data(), v.data(), v.size() * 4);
  return b;
}

struct Fixture {
  int Hkv, G, Hq, B;
  CacheLayout L;
  GpuCache gc;
  SummaryLayout sl;
  GpuSummaries sums;
  DevBuf<int32_t> table, lens;
  DevBuf<float> dq;
  Fixture(int hkv, int g, const std::vector<int64_t>& actual)
      : Hkv(hkv),
        G(g),
        Hq(hkv * g),
        B(int(actual.size())),
        L{1700, kP, hkv, kD, DType::bf16},
        gc(L),
        sl(summary_layout_for(L, 8, Precision::quant)),
        sums(sl),
        table(size_t(B) * kStride),
        lens(size_t(B)),
        dq(random_queries(B, hkv * g, kD, 1.5f, 77)) {
    gc.add_structured(actual, 300);
    cuda::SummaryBuilder builder(L, sl, cuda::Solver::warp_jacobi, L.num_blocks);
    build_full_pages(builder, gc, sums);
    std::vector<int32_t> t(size_t(B) * kStride, 0);
    for (int s = 0; s < B; ++s) {
      const auto& bl = gc.host.blocks(s);
      std::copy(bl.begin(), bl.end(), t.begin() + int64_t(s) * kStride);
    }
    table.upload(t);
  }
  BatchView batch() const { return {table.p, kStride, lens.p, B, kStride}; }
  DecodeParams params(int budget) const {
    DecodeParams p;
    p.cache = L;
    p.summary = sl;
    p.num_q_heads = Hq;
    p.max_batch = B;
    p.max_blocks_per_seq = kStride;
    p.select = SelectConfig{budget, 1, 2};
    return p;
  }
};

struct Outputs {
  DevBuf<float> out, lse;
  DevBuf<int32_t> pages, counts;
  Outputs(const Fixture& f, int capacity)
      : out(size_t(f.B) * f.Hq * kD),
        lse(size_t(f.B) * f.Hq),
        pages(size_t(f.B) * f.Hkv * capacity),
        counts(size_t(f.B) * f.Hkv) {}
  void poison() { out.poison(), lse.poison(), pages.poison(), counts.poison(); }
  AttentionOutput ao() { return {out.p, lse.p}; }
  Selection sel(int capacity) { return {pages.p, counts.p, capacity}; }
};

// The selected pages [0, count) of each (row, KV head) and the counts.
void expect_same_selection(const Outputs& a, const Outputs& b, int rows, int capacity,
                           const char* what) {
  const auto ca = a.counts.download(), cb = b.counts.download();
  ASSERT_EQ(ca, cb) << what;
  const auto pa = a.pages.download(), pb = b.pages.download();
  for (int r = 0; r < rows; ++r)
    for (int j = 0; j < std::max(ca[size_t(r)], 0); ++j)
      ASSERT_EQ(pa[size_t(r) * capacity + j], pb[size_t(r) * capacity + j]) << what << " row " << r;
}

// (KV heads, GQA group): the G <= 4 and the G 9-16 scoring instances.
class LengthBuckets : public ::testing::TestWithParam<std::tuple<int, int>> {};

TEST_P(LengthBuckets, EveryBucketEqualsTheFullPlan) {
  SKIP_WITHOUT_GPU();
  const auto [Hkv, G] = GetParam();
  // The cache holds these tokens; each case's seq_lens views a prefix of them.
  Fixture f(Hkv, G, {16 * 1000 + 5, 16 * 300, 16 * 90 + 7, 40});
  const cuda::LengthBuckets bk = cuda::plan_length_buckets(f.params(512), 4, 1);
  ASSERT_EQ(bk.count, 4);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(bk.plans[i].params.max_blocks_per_seq, 128 << i);
  const int cap = bk.plans[3].capacity;
  for (int i = 0; i < 3; ++i)  // the observation below tells the buckets apart by these
    for (int j = i + 1; j < 4; ++j) ASSERT_NE(bk.plans[i].counts.offset, bk.plans[j].counts.offset);
  DevBuf<uint8_t> ws(bk.workspace_bytes);
  const Workspace w{ws.p, bk.workspace_bytes};
  Outputs eager(f, cap), graph(f, cap), scratch(f, cap), selected(f, cap);
  const QueryView qv{f.dq.p, f.Hq};

  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  // Every buffer allocated and the device idle before the first capture: compute-sanitizer has
  // reported reads, in conditional bodies, of buffers allocated just before the capture as out
  // of bounds (NVIDIA/warp#1406; docs/lab/gpu_results.md, 2026-12-07 22:28 UTC).
  CK(cudaDeviceSynchronize());
  // torch's capture mode (global): the bodies' own captures must not be refused by it.
  auto capture = [&](Outputs& o, bool with_selection) {
    cudaGraph_t g;
    cudaGraphExec_t e;
    const Selection s = o.sel(cap);
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    cuda::decode_bucketed(bk, w, f.gc.dview(), f.sums.view(), f.batch(), qv, o.ao(),
                          with_selection ? &s : nullptr, st);
    CK(cudaStreamEndCapture(st, &g));
    CK(cudaGraphInstantiate(&e, g, 0));
    CK(cudaGraphDestroy(g));
    return e;
  };
  cudaGraphExec_t with_sel = capture(graph, true), no_sel = capture(scratch, false);
  // score_select_bucketed: the selection alone (the torch op's and the vLLM plugin's path).
  cudaGraphExec_t sel_only;
  {
    cudaGraph_t g;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    cuda::score_select_bucketed(bk, w, f.sums.view(), f.batch(), qv, selected.sel(cap), st);
    CK(cudaStreamEndCapture(st, &g));
    CK(cudaGraphInstantiate(&sel_only, g, 0));
    CK(cudaGraphDestroy(g));
  }

  struct Case {
    std::vector<int32_t> lens;
    int bucket;
  };
  const std::vector<Case> cases = {
      {{16 * 120 + 3, 16 * 100, 16 * 90 + 7, 40}, 0},
      {{16 * 128, 17, 16 * 90 + 7, 40}, 0},  // exactly the bucket's rows
      {{16 * 128 + 1, 17, 16 * 90 + 7, 40}, 1},
      {{16 * 200, 16 * 300, 16 * 90 + 7, 40}, 2},
      {{16 * 999, 16 * 300, 16 * 90 + 7, 40}, 3},
      {{16 * 1000 + 5, 16 * 300, 16 * 90 + 7, 40}, 3},
      {{16 * 200 + 9, 16 * 100, 1, 40}, 1},
      // Untrusted lengths (0, negative, past the plan's rows) count as 0: NaN rows, bucket 0.
      {{16 * 1024 + 1, 0, 16 * 90 + 7, -5}, 0},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(testing::Message() << "lengths " << c.lens[0] << " " << c.lens[1] << " "
                                    << c.lens[2] << " " << c.lens[3]);
    f.lens.upload(c.lens);
    eager.poison(), graph.poison();
    const Selection es = eager.sel(cap);
    cuda::decode(bk.plans[3], w, f.gc.dview(), f.sums.view(), f.batch(), qv, eager.ao(), &es, st);
    CK(cudaGraphLaunch(with_sel, st));
    CK(cudaStreamSynchronize(st));
    ASSERT_EQ(bits(graph.out.download()), bits(eager.out.download()));
    ASSERT_EQ(bits(graph.lse.download()), bits(eager.lse.download()));
    expect_same_selection(graph, eager, f.B * f.Hkv, cap, "selection_out");
    selected.poison();
    CK(cudaGraphLaunch(sel_only, st));
    CK(cudaStreamSynchronize(st));
    expect_same_selection(selected, eager, f.B * f.Hkv, cap, "score_select_bucketed");

    // Which bucket ran: with no selection_out the step writes its selection into its own
    // plan's regions, which differ from bucket to bucket.
    ws.poison();
    CK(cudaGraphLaunch(no_sel, st));
    CK(cudaStreamSynchronize(st));
    const DecodePlan& ran = bk.plans[c.bucket];
    std::vector<int32_t> counts(size_t(f.B) * f.Hkv);
    CK(cudaMemcpy(counts.data(), ws.p + ran.counts.offset, counts.size() * 4,
                  cudaMemcpyDeviceToHost));
    EXPECT_EQ(counts, eager.counts.download()) << "bucket " << c.bucket;
    ASSERT_EQ(bits(scratch.out.download()), bits(eager.out.download()));
  }

  // Outside capture: the full plan's step.
  f.lens.upload(cases[0].lens);
  eager.poison(), graph.poison();
  const Selection es = eager.sel(cap), gs = graph.sel(cap);
  cuda::decode(bk.plans[3], w, f.gc.dview(), f.sums.view(), f.batch(), qv, eager.ao(), &es, st);
  cuda::decode_bucketed(bk, w, f.gc.dview(), f.sums.view(), f.batch(), qv, graph.ao(), &gs, st);
  CK(cudaStreamSynchronize(st));
  EXPECT_EQ(bits(graph.out.download()), bits(eager.out.download()));
  expect_same_selection(graph, eager, f.B * f.Hkv, cap, "eager");

  CK(cudaGraphExecDestroy(with_sel));
  CK(cudaGraphExecDestroy(no_sel));
  CK(cudaGraphExecDestroy(sel_only));
  CK(cudaStreamDestroy(st));
}

INSTANTIATE_TEST_SUITE_P(Groups, LengthBuckets,
                         ::testing::Values(std::make_tuple(2, 4), std::make_tuple(1, 16)));

TEST(LengthBucketsPlan, StopsWhereTheCapacityWouldShrink) {
  SKIP_WITHOUT_GPU();
  Fixture f(2, 4, {64});
  // Budget 2048 tokens = 128 pages: 1024, 512, 256, 128 pages a row, not 64.
  const cuda::LengthBuckets a = cuda::plan_length_buckets(f.params(2048), 8, 1);
  ASSERT_EQ(a.count, 4);
  EXPECT_EQ(a.plans[0].params.max_blocks_per_seq, 128);
  size_t most = 0;
  for (int i = 0; i < a.count; ++i) {
    EXPECT_EQ(a.plans[i].capacity, a.plans[a.count - 1].capacity);
    most = std::max(most, a.plans[i].workspace_bytes);
  }
  EXPECT_EQ(a.workspace_bytes, most);
  // min_pages and max_buckets bound it; one bucket is the plain plan.
  EXPECT_EQ(cuda::plan_length_buckets(f.params(512), 8, 300).count, 2);  // 1024, 512
  EXPECT_EQ(cuda::plan_length_buckets(f.params(512), 3, 1).count, 3);
  const cuda::LengthBuckets one = cuda::plan_length_buckets(f.params(512), 1, 1);
  ASSERT_EQ(one.count, 1);
  EXPECT_EQ(one.plans[0].workspace_bytes, cuda::plan_decode(f.params(512)).workspace_bytes);
  EXPECT_THROW(cuda::plan_length_buckets(f.params(512), 0, 1), InvalidArgument);
  EXPECT_THROW(cuda::plan_length_buckets(f.params(512), cuda::kMaxLengthBuckets + 1, 1),
               InvalidArgument);
  EXPECT_THROW(cuda::plan_length_buckets(f.params(512), 4, 0), InvalidArgument);
  DecodeParams two = f.params(512);
  two.two_level = true;
  EXPECT_THROW(cuda::plan_length_buckets(two, 4, 1), Unsupported);
}

TEST(LengthBucketsBadCall, ThrowsBeforeRecordingOrWriting) {
  SKIP_WITHOUT_GPU();
  Fixture f(2, 4, {16 * 300, 40});
  f.lens.upload(std::vector<int32_t>{16 * 300, 40});
  const cuda::LengthBuckets bk = cuda::plan_length_buckets(f.params(512), 3, 1);
  ASSERT_EQ(bk.count, 3);
  const int cap = bk.plans[2].capacity;
  DevBuf<uint8_t> ws(bk.workspace_bytes);
  Outputs o(f, cap);
  const QueryView qv{f.dq.p, f.Hq};
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  auto expect_refused = [&](const cuda::LengthBuckets& b, Workspace w, const Selection* sel,
                            const char* what) {
    SCOPED_TRACE(what);
    o.poison();
    const auto before = bits(o.out.download());
    cudaGraph_t g;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    EXPECT_THROW(
        cuda::decode_bucketed(b, w, f.gc.dview(), f.sums.view(), f.batch(), qv, o.ao(), sel, st),
        InvalidArgument);
    CK(cudaStreamEndCapture(st, &g));
    size_t nodes = 99;
    CK(cudaGraphGetNodes(g, nullptr, &nodes));
    EXPECT_EQ(nodes, 0u);  // nothing recorded
    CK(cudaGraphDestroy(g));
    EXPECT_THROW(
        cuda::decode_bucketed(b, w, f.gc.dview(), f.sums.view(), f.batch(), qv, o.ao(), sel, st),
        InvalidArgument);  // eager: nothing launched
    CK(cudaStreamSynchronize(st));
    EXPECT_EQ(bits(o.out.download()), before);
  };
  const Selection good = o.sel(cap);
  // A workspace that holds the full plan's but not the largest bucket's (or less).
  expect_refused(bk, {ws.p, bk.workspace_bytes - 256}, &good, "workspace too small");
  cuda::LengthBuckets swapped = bk;
  std::swap(swapped.plans[0], swapped.plans[1]);
  expect_refused(swapped, {ws.p, bk.workspace_bytes}, &good, "buckets out of order");
  cuda::LengthBuckets other = bk;
  other.plans[0] = cuda::plan_length_buckets(f.params(256), 3, 1).plans[0];
  expect_refused(other, {ws.p, bk.workspace_bytes}, &good, "another step's plan");
  cuda::LengthBuckets none = bk;
  none.count = 0;
  expect_refused(none, {ws.p, bk.workspace_bytes}, &good, "no bucket");
  const Selection small{o.pages.p, o.counts.p, cap - 1};
  expect_refused(bk, {ws.p, bk.workspace_bytes}, &small, "selection capacity");
  // score_select_bucketed checks every bucket the same way (here: the workspace).
  o.poison();
  const auto counts_before = o.counts.download();
  EXPECT_THROW(cuda::score_select_bucketed(bk, {ws.p, bk.workspace_bytes - 256}, f.sums.view(),
                                           f.batch(), qv, good, st),
               InvalidArgument);
  CK(cudaStreamSynchronize(st));
  EXPECT_EQ(o.counts.download(), counts_before);
  CK(cudaStreamDestroy(st));
}

}  // namespace
}  // namespace locks::cuda_test
