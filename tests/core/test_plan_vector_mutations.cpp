// Plan vectors are untrusted input: the torch operators take them from Python as int[], so a
// caller can hand in any list. Random mutations of a valid CPU plan vector (one to three
// fields: off by a little, doubled, zero, -1, huge) are either refused by
// DecodePlan::from_ints or by the run's checks with a locks::Error, writing no output, or run
// cpu::decode within the caller's buffers, which this test sizes from what the accepted plan
// asks for (CI runs it in the ASan + UBSan build too, where a read or write outside them is a
// failure), selecting real pages.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "locks/contract.h"
#include "locks/error.h"
#include "plan_mutation.h"
#include "test_util.h"

namespace locks::test {
namespace {

TEST(PlanVectorMutations, AreRefusedOrRunInsideTheCallersBuffers) {
  CacheSpec sp;
  sp.num_kv_heads = 2;
  sp.num_q_heads = 4;
  sp.head_dim = 32;
  sp.seq_lens = {40, 100};
  const TestCache t = make_cache(sp);
  SummaryStore s = build_summaries(t, 4, Precision::quant);
  const int B = t.bv().batch_size, Hq = sp.num_q_heads, H = sp.num_kv_heads, d = sp.head_dim;
  DecodeParams p;
  p.cache = t.layout();
  p.summary = s.layout();
  p.num_q_heads = Hq;
  p.max_batch = B;
  p.max_blocks_per_seq = t.max_blocks();
  p.select = {48, 1, 0};
  const std::vector<int64_t> v0 = cpu::plan_decode(p).to_ints();

  std::mt19937_64 rng(12345);
  int accepted = 0, ran = 0, refused_at_run = 0;
  for (int it = 0; it < 4000; ++it) {
    const std::optional<DecodePlan> edited = edited_plan(v0, rng);
    if (!edited) continue;
    const DecodePlan& plan = *edited;
    ++accepted;
    // The caller's buffers, as big as the accepted plan says (within 64 MB: larger requests
    // are skipped, not run, to keep the test small); the run must stay inside them.
    const size_t ws_bytes = plan.workspace_bytes;
    const int64_t sel_n = int64_t(B) * H * plan.capacity;
    if (ws_bytes > (size_t(64) << 20) || plan.capacity < 1 || sel_n > (int64_t(16) << 20)) continue;
    std::vector<std::byte> ws_mem(ws_bytes + 256);
    void* base = reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(ws_mem.data()) + 255) &
                                         ~uintptr_t(255));
    std::vector<float> out(size_t(B) * Hq * d, -3.0f), lse(size_t(B) * Hq, -3.0f);
    std::vector<int32_t> pages(static_cast<size_t>(sel_n), -7), counts(size_t(B) * H, -7);
    const Selection sel{pages.data(), counts.data(), plan.capacity};
    try {
      cpu::decode(plan, {base, ws_bytes}, t.view(), s.view(), t.bv(), t.qv(),
                  {out.data(), lse.data()}, &sel);
      ++ran;
      for (int64_t row = 0; row < int64_t(B) * H; ++row) {  // a selection of real pages
        const int n = counts[size_t(row)];
        ASSERT_GE(n, 1);
        ASSERT_LE(n, plan.capacity);
        const int32_t* p = pages.data() + row * plan.capacity;
        ASSERT_TRUE(std::is_sorted(p, p + n));
        ASSERT_GE(p[0], 0);
        ASSERT_LT(p[n - 1], (sp.seq_lens[size_t(row / H)] + 15) / 16);
      }
    } catch (const Error&) {
      ++refused_at_run;  // and wrote nothing (contract.h: outputs whole or not at all)
      for (float x : out) ASSERT_EQ(x, -3.0f) << "a refused call wrote out";
      for (float x : lse) ASSERT_EQ(x, -3.0f) << "a refused call wrote lse";
      for (int32_t x : counts) ASSERT_EQ(x, -7) << "a refused call wrote counts";
      for (int32_t x : pages) ASSERT_EQ(x, -7) << "a refused call wrote pages";
    }
  }
  // Some mutations leave a consistent plan (fields the CPU ignores, or changes the checks
  // cannot tell from a real plan): those must run; others pass from_ints and meet the run's
  // checks of the call against the plan.
  std::printf("plan vector mutations: %d accepted by from_ints, %d ran, %d refused by the run\n",
              accepted, ran, refused_at_run);
  EXPECT_GT(accepted, 100);
  EXPECT_GT(ran, 10);
  EXPECT_GT(refused_at_run, 0);
}

}  // namespace
}  // namespace locks::test
