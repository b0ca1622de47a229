// Plan vectors are untrusted input: the torch operators take them from Python as int[], so a
// caller can hand in any list. Random mutations of a valid CPU plan vector (one to three
// fields: off by a little, doubled, zero, -1, huge) are either refused by
// DecodePlan::from_ints or by the run's checks with a locks::Error, writing no output, or run
// cpu::decode within the caller's buffers, which this test sizes from what the accepted plan
// asks for (CI runs it in the ASan + UBSan build too, where a read or write outside them is a
// failure), selecting real pages.
#include <gtest/gtest.h>

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
    // The caller's buffers, as big as the accepted plan says; the run must stay inside them.
    if (!StepBuffers::fits(plan, B, H)) continue;
    StepBuffers buf(plan, B, Hq, H, d);
    try {
      cpu::decode(plan, buf.ws, t.view(), s.view(), t.bv(), t.qv(), buf.output(), &buf.sel);
      ++ran;
      ASSERT_NO_FATAL_FAILURE(buf.expect_real_selection(t.bv(), H, sp.page_size));
    } catch (const Error&) {
      ++refused_at_run;
      ASSERT_NO_FATAL_FAILURE(buf.expect_untouched());
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
