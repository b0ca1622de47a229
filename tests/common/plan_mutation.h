// One random edit of a plan vector element (tests/core and tests/cuda test_plan_vector_mutations:
// plan vectors are caller input): off by one, by a little, doubled, zero, -1 or a power of two,
// in wrapping arithmetic (the fields include the bits of floats and doubles, near any limit).
#pragma once

#include <cstdint>
#include <random>

namespace locks::test {

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

}  // namespace locks::test
