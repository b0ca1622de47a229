// GoogleTest parameter sets shared by the core tests: every cache dtype x head_dim x page size.
#pragma once

#include <gtest/gtest.h>

#include <ostream>
#include <string>
#include <vector>

#include "locks/dtype.h"
#include "test_util.h"

namespace locks::test {

struct Combo {
  DType dtype;
  int head_dim;
  int page_size;
};

inline std::vector<Combo> all_combos() {
  std::vector<Combo> c;
  for (DType t : {DType::f32, DType::f16, DType::bf16})
    for (int d : {64, 128})
      for (int p : {8, 16, 32}) c.push_back({t, d, p});
  return c;
}

inline std::string to_string(const Combo& c) {
  return std::string(dtype_name(c.dtype)) + "_d" + std::to_string(c.head_dim) + "_P" +
         std::to_string(c.page_size);
}
inline std::string combo_name(const testing::TestParamInfo<Combo>& info) {
  return to_string(info.param);
}
// Readable parameter in test output (found by argument-dependent lookup).
inline void PrintTo(const Combo& c, std::ostream* os) { *os << to_string(c); }

// A ragged batch for page size P: lengths that are and are not multiples of P, one shorter
// than a page (no full page, only a tail), and physical blocks interleaved.
inline CacheSpec spec_for(const Combo& c, bool structured, uint64_t seed) {
  CacheSpec sp;
  sp.dtype = c.dtype;
  sp.head_dim = c.head_dim;
  sp.page_size = c.page_size;
  sp.num_kv_heads = 2;
  sp.num_q_heads = 8;
  const int P = c.page_size;
  sp.seq_lens = {2 * P + 5, P - 1, 3 * P};
  sp.structured = structured;
  sp.seed = seed;
  return sp;
}

// Rank used with page size P in the parameterised tests (8 at the default P = 16).
inline int rank_for(int page_size) { return page_size / 2; }

}  // namespace locks::test
