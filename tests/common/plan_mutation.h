// Random edits of plan vectors (tests/core and tests/cuda test_plan_vector_mutations: plan
// vectors are caller input).
#pragma once

#include <cstdint>
#include <optional>
#include <random>
#include <vector>

#include "locks/error.h"
#include "locks/plan.h"

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

}  // namespace locks::test
