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
  const int B = int(lens.size()), M = 96;
  CacheLayout L{256, P, Hkv, d, DType::bf16};
  GpuCache gc(L);
  for (int s = 0; s < B; ++s) {
    std::vector<float> k, v;
    make_kv(lens[size_t(s)], Hkv, d, P, 4, 70 + s, k, v);
    gc.add(k, v, lens[size_t(s)]);
  }
  gc.sync();
  std::vector<int32_t> t(size_t(B) * M, 0), l(static_cast<size_t>(B));
  for (int s = 0; s < B; ++s) {
    const auto& bl = gc.host.blocks(s);
    std::copy(bl.begin(), bl.end(), t.begin() + int64_t(s) * M);
    l[size_t(s)] = gc.host.seq_len(s);
  }
  DevBuf<int32_t> table(t), dlens(l);
  const BatchView db{table.p, M, dlens.p, B, M};
  const SummaryLayout sl = summary_layout_for(L, 8, Precision::quant);
  GpuSummaries sums(sl);
  {
    cuda::SummaryBuilder builder(L, sl, cuda::Solver::warp_jacobi, L.num_blocks);
    const auto ids = gc.full_blocks();
    DevBuf<int32_t> dids(ids);
    builder.build(gc.dview(), dids.p, int64_t(ids.size()), sums.view(), nullptr);
    CK(cudaDeviceSynchronize());
  }
  DevBuf<float> dq(size_t(B) * Hq * d), out(size_t(B) * Hq * d), lse(size_t(B) * Hq);
  std::vector<float> hq(size_t(B) * Hq * d);
  std::mt19937_64 qrng(3);
  std::normal_distribution<float> N(0.f, 1.f);
  for (float& x : hq) x = N(qrng);
  dq.upload(hq);

  DecodeParams p;
  p.cache = L;
  p.summary = sl;
  p.num_q_heads = Hq, p.max_batch = B, p.max_blocks_per_seq = M;
  p.select = SelectConfig{256, 1, 1};
  const std::vector<int64_t> v0 = cuda::plan_decode(p).to_ints();

  std::mt19937_64 rng(2024);
  int accepted = 0, ran = 0, refused_at_run = 0;
  for (int it = 0; it < 3000; ++it) {
    std::vector<int64_t> v = v0;
    for (int k = 1 + int(rng() % 3); k > 0; --k) {
      const size_t i = rng() % v.size();
      v[i] = test::mutated_plan_element(v[i], rng);
    }
    DecodePlan plan;
    try {
      plan = DecodePlan::from_ints(v);
    } catch (const InvalidArgument&) {
      continue;
    }
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
