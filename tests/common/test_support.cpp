// supports() (support.h): the capability table's answers and reasons, the error classes the
// contract throws, and the plans' int vectors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "locks/contract.h"
#include "locks/cuda/limits.h"
#include "locks/error.h"

namespace locks {
namespace {

DecodeShape shape(int d, int P, int G, DType t, int r, Precision p) { return {d, P, G, t, r, p}; }

TEST(Support, CpuAnswersWhatTheCoreImplements) {
  EXPECT_TRUE(supports(Backend::cpu, shape(128, 16, 4, DType::bf16, 8, Precision::quant)));
  EXPECT_TRUE(supports(Backend::cpu, shape(96, 8, 40, DType::f32, 4, Precision::fp32)));
  // Every even head_dim in [8, 512] (Phi-2's 80 too); odd or out of range: no, naming it.
  for (const int d : {8, 10, 48, 80, 200, 512})
    EXPECT_TRUE(supports(Backend::cpu, shape(d, 16, 1, DType::bf16, 8, Precision::quant))) << d;
  for (const int d : {0, 6, 47, 81, 514}) {
    const Support s = supports(Backend::cpu, shape(d, 16, 1, DType::bf16, 4, Precision::quant));
    EXPECT_FALSE(s.ok) << d;
    EXPECT_NE(s.reason.find("head_dim must be even and in [8, 512], got " + std::to_string(d)),
              std::string::npos)
        << s.reason;
  }
  EXPECT_FALSE(supports(Backend::cpu, shape(64, 16, 1, DType::bf16, 16, Precision::fp32)));
  EXPECT_FALSE(supports(Backend::cpu, shape(64, 1, 1, DType::bf16, 1, Precision::fp32)));
}

TEST(Support, CudaAnswersFromTheKernelTable) {
  for (const int d : cuda::limits::kHeadDims)
    EXPECT_TRUE(supports(Backend::cuda,
                         shape(d, 16, cuda::limits::kMaxGroup, DType::bf16, 8, Precision::quant)))
        << d;
  const struct {
    DecodeShape s;
    const char* word;
  } no[] = {
      {shape(128, 8, 1, DType::bf16, 4, Precision::quant), "page_size"},
      {shape(96, 16, 1, DType::bf16, 8, Precision::quant), "head_dim"},
      {shape(128, 16, cuda::limits::kMaxGroup + 1, DType::bf16, 8, Precision::quant), "group"},
      {shape(128, 16, 1, DType::f32, 8, Precision::quant), "float32"},
      {shape(128, 16, 1, DType::f16, 16, Precision::fp32), "rank"}};
  for (const auto& c : no) {
    const Support s = supports(Backend::cuda, c.s);
    EXPECT_FALSE(s.ok) << c.word;
    EXPECT_NE(s.reason.find(c.word), std::string::npos) << s.reason;
    EXPECT_THROW(require_supported(Backend::cuda, c.s), Unsupported);
  }
}

TEST(Support, ErrorClassesShareTheBase) {
  EXPECT_THROW(throw InvalidArgument("x"), Error);
  EXPECT_THROW(throw Unsupported("x"), Error);
  EXPECT_THROW(throw CudaError("x"), Error);
  EXPECT_THROW(LOCKS_REQUIRE(false, "bad"), InvalidArgument);
  EXPECT_THROW(LOCKS_SUPPORTED(false, "lacking"), Unsupported);
}

DecodeParams some_params() {
  DecodeParams p;
  p.cache = {40, 16, 2, 64, DType::bf16};
  p.summary = summary_layout_for(p.cache, 8, Precision::quant);
  p.num_q_heads = 8;
  p.max_batch = 3;
  p.max_blocks_per_seq = 12;
  p.select = {100, 1, 1};
  return p;
}

TEST(Plan, IntsRoundTripAndRejectForeignVectors) {
  const DecodePlan plan = cpu::plan_decode(some_params());
  const std::vector<int64_t> v = plan.to_ints();
  ASSERT_EQ(v.size(), DecodePlan::kNumInts);
  EXPECT_EQ(v[DecodePlan::kIntWorkspaceBytes], int64_t(plan.workspace_bytes));
  EXPECT_EQ(v[DecodePlan::kIntCapacity], plan.capacity);
  EXPECT_EQ(plan.capacity, 7);  // ceil(100 / 16)
  const DecodePlan back = DecodePlan::from_ints(v);
  EXPECT_EQ(back.to_ints(), v);
  EXPECT_EQ(back.params.scale, plan.params.scale);
  EXPECT_EQ(back.scratch.bytes, plan.scratch.bytes);
  EXPECT_THROW(DecodePlan::from_ints(v.data(), v.size() - 1), InvalidArgument);
  std::vector<int64_t> bad = v;
  bad[DecodePlan::kIntTag] = 1;
  EXPECT_THROW(DecodePlan::from_ints(bad), InvalidArgument);
  bad = v;
  bad[DecodePlan::kIntCapacity] = 3;
  EXPECT_THROW(DecodePlan::from_ints(bad), InvalidArgument);
  bad = v;
  bad[DecodePlan::kIntWorkspaceBytes] = 16;
  EXPECT_THROW(DecodePlan::from_ints(bad), InvalidArgument);
  // The elements after the last field are room for later versions: zero, or refused.
  EXPECT_EQ(v.back(), 0);
  bad = v;
  bad.back() = 1;
  EXPECT_THROW(DecodePlan::from_ints(bad), InvalidArgument);
}

TEST(Plan, IntsCarryTheAdaptiveBudget) {
  DecodeParams p = some_params();
  p.select.tau = 0.75f;
  p.select.floor_pages = 2;
  const DecodePlan plan = cpu::plan_decode(p);
  const std::vector<int64_t> v = plan.to_ints();
  const DecodePlan back = DecodePlan::from_ints(v);
  EXPECT_EQ(back.params.select.tau, 0.75f);
  EXPECT_EQ(back.params.select.floor_pages, 2);
  EXPECT_EQ(back.capacity, plan.capacity);  // the budget's, tau or not
  // A vector whose tau (stored as its float bits) was changed to 1.5, or floor to -1: refused.
  uint32_t bits = 0, bad_bits = 0;
  const float tau = 0.75f, bad_tau = 1.5f;
  std::memcpy(&bits, &tau, 4);
  std::memcpy(&bad_bits, &bad_tau, 4);
  const auto at = std::find(v.begin(), v.end(), int64_t(bits));
  ASSERT_NE(at, v.end());
  std::vector<int64_t> bad = v;
  bad[size_t(at - v.begin())] = int64_t(bad_bits);
  EXPECT_THROW(DecodePlan::from_ints(bad), InvalidArgument);
  bad = v;
  ASSERT_EQ(bad[size_t(at - v.begin()) + 1], 2) << "floor_pages follows tau";
  bad[size_t(at - v.begin()) + 1] = -1;
  EXPECT_THROW(DecodePlan::from_ints(bad), InvalidArgument);
}

TEST(Plan, IntsCarryTheMinimumContext) {
  DecodeParams p = some_params();
  p.select.dense_below = 150;  // 149 tokens: 10 pages, more than the budget's 7
  const DecodePlan plan = cpu::plan_decode(p);
  EXPECT_EQ(plan.capacity, 10);
  const std::vector<int64_t> v = plan.to_ints();
  const DecodePlan back = DecodePlan::from_ints(v);
  EXPECT_EQ(back.params.select.dense_below, 150);
  EXPECT_EQ(back.capacity, 10);
  EXPECT_EQ(back.to_ints(), v);
  // The last field: a changed value disagrees with the capacity (refused); a negative one is
  // refused by the selection rules.
  const auto at = std::find(v.rbegin(), v.rend(), int64_t(150));
  ASSERT_NE(at, v.rend());
  std::vector<int64_t> bad = v;
  bad[size_t(v.rend() - at - 1)] = 300;
  EXPECT_THROW(DecodePlan::from_ints(bad), InvalidArgument);
  bad[size_t(v.rend() - at - 1)] = -1;
  EXPECT_THROW(DecodePlan::from_ints(bad), InvalidArgument);
  p.select.dense_below = -5;
  EXPECT_THROW(cpu::plan_decode(p), InvalidArgument);
}

TEST(Plan, RejectsBadParamsWithTheRightClass) {
  DecodeParams p = some_params();
  p.select = {15, 0, 0};  // less than one page
  EXPECT_THROW(cpu::plan_decode(p), InvalidArgument);
  p = some_params();
  p.select.tau = std::nanf("");
  EXPECT_THROW(cpu::plan_decode(p), InvalidArgument);
  p = some_params();
  p.select.tau = 0.5f;
  p.select.floor_pages = 5;  // 100 tokens: 6 pages - sink - recent - tail = 3 scored slots
  EXPECT_THROW(cpu::plan_decode(p), InvalidArgument);
  p = some_params();
  p.num_q_heads = 7;
  EXPECT_THROW(cpu::plan_decode(p), InvalidArgument);
  p = some_params();
  p.summary.num_blocks = 41;
  EXPECT_THROW(cpu::plan_decode(p), InvalidArgument);
  p = some_params();
  p.cache.head_dim = 80;
  p.summary.head_dim = 80;
  EXPECT_THROW(cpu::plan_decode(p), InvalidArgument);  // validate_layout: not a usable cache
  p = some_params();
  p.scale = -1.0f;
  EXPECT_THROW(cpu::plan_decode(p), InvalidArgument);
}

}  // namespace
}  // namespace locks
