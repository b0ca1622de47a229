// Random edits of plan vectors (tests/core and tests/cuda test_plan_vector_mutations: plan
// vectors are caller input).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <random>
#include <vector>

#include "locks/attention.h"
#include "locks/error.h"
#include "locks/kv_cache.h"
#include "locks/plan.h"
#include "locks/rules.h"
#include "locks/select.h"

namespace locks::test {

// One element edited: off by one, by a little, doubled, zero, -1 or a power of two, in wrapping
// arithmetic (the fields include the bits of floats and doubles, near any limit).
inline int64_t mutated_plan_element(int64_t x, std::mt19937_64& rng) {
  const uint64_t u = uint64_t(x);
  switch (rng() % 7) {
    case 0:
      return int64_t(u + 1);
    case 1:
      return int64_t(u - 1);
    case 2:
      return int64_t(u + rng() % 64 - 32);
    case 3:
      return int64_t(u << 1);
    case 4:
      return 0;
    case 5:
      return -1;
    default:
      return int64_t(1) << (rng() % 40);
  }
}

// v0 with one to three random elements edited, as DecodePlan::from_ints reads it; nullopt where
// from_ints refuses it.
inline std::optional<DecodePlan> edited_plan(const std::vector<int64_t>& v0, std::mt19937_64& rng) {
  std::vector<int64_t> v = v0;
  for (int k = 1 + int(rng() % 3); k > 0; --k) {
    const size_t i = rng() % v.size();
    v[i] = mutated_plan_element(v[i], rng);
  }
  try {
    return DecodePlan::from_ints(v);
  } catch (const InvalidArgument&) {
    return std::nullopt;
  }
}

// The caller's buffers for one CPU whole step with an accepted (maybe edited) plan: a 256-byte
// aligned workspace of plan.workspace_bytes, and outputs filled with sentinels so that a
// refused call can be checked to have written none of them (contract.h: outputs whole or not
// at all). fits(): whether the plan asks for no more than the tests allow (64 MB of workspace,
// 16 M selection entries); larger requests are skipped, not run.
struct StepBuffers {
  static bool fits(const DecodePlan& plan, int batch, int num_kv_heads) {
    return plan.workspace_bytes <= (size_t(64) << 20) && plan.capacity >= 1 &&
           int64_t(batch) * num_kv_heads * plan.capacity <= (int64_t(16) << 20);
  }
  StepBuffers(const DecodePlan& plan, int batch, int num_q_heads, int num_kv_heads, int head_dim)
      : mem(plan.workspace_bytes + 256),
        out(size_t(batch) * num_q_heads * head_dim, -3.0f),
        lse(size_t(batch) * num_q_heads, -3.0f),
        pages(size_t(batch) * num_kv_heads * plan.capacity, -7),
        counts(size_t(batch) * num_kv_heads, -7),
        sel{pages.data(), counts.data(), plan.capacity},
        ws{reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(mem.data()) + 255) &
                                   ~uintptr_t(255)),
           plan.workspace_bytes} {}
  AttentionOutput output() { return {out.data(), lse.data()}; }
  // After a refused call (use with ASSERT_NO_FATAL_FAILURE).
  void expect_untouched() const {
    for (float x : out) ASSERT_EQ(x, -3.0f) << "a refused call wrote out";
    for (float x : lse) ASSERT_EQ(x, -3.0f) << "a refused call wrote lse";
    for (int32_t x : counts) ASSERT_EQ(x, -7) << "a refused call wrote counts";
    for (int32_t x : pages) ASSERT_EQ(x, -7) << "a refused call wrote pages";
  }
  // After a call that ran: every (sequence, KV head) row selects 1 to capacity strictly
  // ascending real pages of its sequence.
  void expect_real_selection(const BatchView& batch, int num_kv_heads, int page_size) const {
    for (int64_t row = 0; row < int64_t(batch.batch_size) * num_kv_heads; ++row) {
      const int n = counts[size_t(row)];
      ASSERT_GE(n, 1);
      ASSERT_LE(n, sel.capacity);
      const int32_t* p = pages.data() + row * sel.capacity;
      ASSERT_TRUE(std::adjacent_find(p, p + n, std::greater_equal<int32_t>()) == p + n);
      ASSERT_GE(p[0], 0);
      ASSERT_LT(p[n - 1], rules::num_pages(batch.seq_lens[row / num_kv_heads], page_size));
    }
  }

  std::vector<std::byte> mem;
  std::vector<float> out, lse;
  std::vector<int32_t> pages, counts;
  Selection sel;
  Workspace ws;
};

}  // namespace locks::test
