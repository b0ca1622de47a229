// CUDA plan vectors are untrusted input (the torch operators take them from Python as int[]):
// random edits of one to three fields of a real plan vector are refused by
// DecodePlan::from_ints or by the run's checks (check_plan_fields: chunk, cluster and split
// choices from plan_decode's sets, counts that follow from them, regions that hold what the
// kernels index and do not overlap), or the whole step runs inside the caller's workspace: the
// device must report no error after every accepted run (an out-of-bounds access would leave
// the context with a sticky error). The tests/core version does the same on the CPU.
#include <gtest/gtest.h>

#include <cstdio>
#include <random>
#include <vector>

#include "gpu_helpers.h"
#include "locks/contract.h"
#include "locks/cuda/summary_builder.h"
#include "locks/error.h"
#include "plan_mutation.h"

namespace locks::cuda_test {
namespace {

TEST(CudaPlanVectorMutations, AreRefusedOrRunInsideTheWorkspace) {
  SKIP_WITHOUT_GPU();
  const int P = 16, Hkv = 2, G = 4, Hq = Hkv * G, d = 64;
  const std::vector<int64_t> lens = {16 * 40 + 5, 16 * 90};
  const int B = int(lens.size());
  CacheLayout L{256, P, Hkv, d, DType::bf16};
  GpuCache gc(L);
  gc.add_structured(lens, 70);
  const BatchView db = gc.dbatch();
  const SummaryLayout sl = summary_layout_for(L, 8, Precision::quant);
  GpuSummaries sums(sl);
  {
    cuda::SummaryBuilder builder(L, sl, cuda::Solver::warp_jacobi, L.num_blocks);
    build_full_pages(builder, gc, sums);
  }
  DevBuf<float> dq(random_queries(B, Hq, d, 1.0f, 3)), out(size_t(B) * Hq * d), lse(size_t(B) * Hq);

  DecodeParams p;
  p.cache = L;
  p.summary = sl;
  p.num_q_heads = Hq, p.max_batch = B, p.max_blocks_per_seq = db.max_blocks_per_seq;
  p.select = SelectConfig{256, 1, 1};
  const std::vector<int64_t> v0 = cuda::plan_decode(p).to_ints();

  std::mt19937_64 rng(2024);
  int accepted = 0, ran = 0, refused_at_run = 0;
  for (int it = 0; it < 3000; ++it) {
    const std::optional<DecodePlan> edited = test::edited_plan(v0, rng);
    if (!edited) continue;
    const DecodePlan& plan = *edited;
    ++accepted;
    if (plan.workspace_bytes > (size_t(64) << 20) || plan.capacity < 1) continue;
    DevBuf<uint8_t> ws(plan.workspace_bytes + 256);
    DevBuf<int32_t> pages(size_t(B) * Hkv * size_t(plan.capacity)), counts(size_t(B) * Hkv);
    const Selection sel{pages.p, counts.p, plan.capacity};
    try {
      cuda::decode(plan, {ws.p, plan.workspace_bytes}, gc.dview(), sums.view(), db,
                   QueryView{dq.p, Hq}, AttentionOutput{out.p, lse.p}, &sel, nullptr);
      ++ran;
    } catch (const Error&) {
      ++refused_at_run;
    }
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << "mutation " << it;
  }
  std::printf(
      "CUDA plan vector mutations: %d accepted by from_ints, %d ran, %d refused by the "
      "run\n",
      accepted, ran, refused_at_run);
  EXPECT_GT(accepted, 100);
  EXPECT_GT(ran, 10);
  EXPECT_GT(refused_at_run, 10);
}

// Each derived CUDA field alone, pushed off plan_decode's value: refused by the run's check.
TEST(CudaPlanVectorMutations, EditedDerivedFieldsAreRefused) {
  SKIP_WITHOUT_GPU();
  const CacheLayout L{4096, 16, 8, 128, DType::bf16};
  DecodeParams p;
  p.cache = L;
  p.summary = summary_layout_for(L, 8, Precision::quant);
  p.num_q_heads = 32, p.max_batch = 2, p.max_blocks_per_seq = 1024;
  p.select = SelectConfig{2048, 1, 2};
  const DecodePlan good = cuda::plan_decode(p);
  DevBuf<uint8_t> ws(good.workspace_bytes + 256);
  const BatchView none{};  // never reached: the plan check comes first
  auto refused = [&](DecodePlan bad) {
    try {
      cuda::score_pages(bad, {ws.p, ws.n}, SummaryView{}, none, QueryView{}, nullptr, nullptr);
    } catch (const InvalidArgument& e) {
      return std::string(e.what()).find("plan") != std::string::npos;
    }
    return false;
  };
  auto edit = [&](auto f) {
    DecodePlan b = good;
    f(b);
    return refused(b);
  };
  EXPECT_TRUE(edit([](DecodePlan& b) { b.score_chunk_pages = 48; }));
  EXPECT_TRUE(edit([](DecodePlan& b) { b.score_chunks -= 1; }));
  EXPECT_TRUE(edit([](DecodePlan& b) { b.select_chunk_pages = 1024; }));
  EXPECT_TRUE(edit([](DecodePlan& b) { b.select_chunks = 0; }));
  EXPECT_TRUE(edit([](DecodePlan& b) { b.select_cluster = 3; }));
  EXPECT_TRUE(edit([](DecodePlan& b) { b.sparse_pages_per_split = 0; }));
  EXPECT_TRUE(edit([](DecodePlan& b) { b.sparse_splits -= 1; }));
  EXPECT_TRUE(edit([](DecodePlan& b) { b.sparse_splits = 1000; }));
  EXPECT_TRUE(edit([](DecodePlan& b) { b.dense_splits = 513; }));
  EXPECT_TRUE(edit([](DecodePlan& b) { b.part_o.bytes -= 4; }));
  EXPECT_TRUE(edit([](DecodePlan& b) { b.head_scores.offset = b.part_ml.offset; }));
  EXPECT_TRUE(edit([](DecodePlan& b) { b.params.select.tau = 0.5f, b.select_cluster = 8; }));
  EXPECT_FALSE(refused(good));
}

}  // namespace
}  // namespace locks::cuda_test
