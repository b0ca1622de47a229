// The scoring chunk rule (src/cuda/score_chunk_rule.h) as a pure function: no GPU needed, so
// it runs in the CPU CI too. The shapes are the H200's (132 SMs): 6 blocks a SM for G <= 8
// (792 slots), 4 for G 16 before v23 (528).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>

#include "../../src/cuda/score_chunk_rule.h"

namespace locks::cuda_test {
namespace {

using locks::cuda::detail::long_grid_chunk;
using locks::cuda::detail::score_chunk_rule;

TEST(ScoreChunkRule, ModelShapes) {
  const int g4 = long_grid_chunk(128, 4);  // Llama-3.1-8B's instance: 64 over two waves
  EXPECT_EQ(g4, 64);
  EXPECT_EQ(score_chunk_rule(8, 8192, 792, g4), 128);  // Llama 128K b1: 512 blocks, one wave
  EXPECT_EQ(score_chunk_rule(8, 16384, 792, g4), 96);  // Llama 256K b1: 1.29 waves -> 1368 of 96
  EXPECT_EQ(score_chunk_rule(8, 65536, 792, g4), 64);  // Llama 1M b1: > 2 waves
  EXPECT_EQ(score_chunk_rule(64, 8192, 792, g4), 64);  // Llama 128K b8
  EXPECT_EQ(score_chunk_rule(8, 65536, 792), 128);     // another instance over two waves
  EXPECT_EQ(long_grid_chunk(128, 8), 128);             // G 5-8 (Qwen2.5-7B, Llama-3.1-70B TP8)
  EXPECT_EQ(long_grid_chunk(128, 16), 128);            // GLM-4-9B
  EXPECT_EQ(long_grid_chunk(256, 2), 128);             // Gemma-3 (d 256)
  EXPECT_EQ(long_grid_chunk(64, 3), 128);              // SmolLM2 (d 64): not measured
  EXPECT_EQ(score_chunk_rule(8, 2048, 792), 32);       // Llama 32K b1: 128 -> 64 -> 32
  EXPECT_EQ(score_chunk_rule(4, 8192, 792), 64);       // Qwen2.5-7B 128K b1: 256 blocks of 128
  EXPECT_EQ(score_chunk_rule(2, 65536, 528), 128);     // GLM 1M b1: 1.94 waves, 64 ties, keep 128
  EXPECT_EQ(score_chunk_rule(2, 8192, 528), 32);       // GLM 128K b1
  EXPECT_EQ(score_chunk_rule(2, 16384, 528), 64);      // GLM 256K b1
  EXPECT_EQ(score_chunk_rule(1, 1, 792), 32);          // one page
}

// Properties on random grids (a third each under one wave, between one and two, over two, of
// 128-page blocks): a size of the set; under a wave no 96 and a size below 128 only where the
// larger one filled under half the wave; over two waves the long-grid size it is given (128
// or 64); between one and two never more whole-wave pages than 128's.
TEST(ScoreChunkRule, Properties) {
  std::mt19937_64 rng(3);
  std::uniform_real_distribution<double> waves(0.0, 3.0);  // of 128-page blocks
  int regimes[3] = {0, 0, 0};
  for (int it = 0; it < 20000; ++it) {
    const int64_t slots = 66 + int64_t(rng() % 1200), rows = 1 + int64_t(rng() % 512);
    const int64_t pages = std::max<int64_t>(1, int64_t(waves(rng) * double(slots) * 128 / rows));
    const int long_grid = it % 2 ? 64 : 128;
    const int cp = score_chunk_rule(rows, pages, slots, long_grid);
    ASSERT_TRUE(cp == 32 || cp == 64 || cp == 96 || cp == 128) << cp;
    auto blocks = [&](int c) { return rows * ((pages + c - 1) / c); };
    if (blocks(128) > 2 * slots) ASSERT_EQ(cp, long_grid);
    if (blocks(128) <= slots) {
      ASSERT_NE(cp, 96);
      if (cp > 32) ASSERT_GE(2 * blocks(cp), slots) << rows << " " << pages << " " << slots;
    }
    ++regimes[blocks(128) <= slots ? 0 : blocks(128) <= 2 * slots ? 1 : 2];
    if (blocks(128) > slots && blocks(128) <= 2 * slots) {
      auto cost = [&](int c) { return (blocks(c) + slots - 1) / slots * c; };
      ASSERT_LE(cost(cp), cost(128));
    }
  }
  for (int r : regimes) EXPECT_GT(r, 4000);  // every regime sampled
}

}  // namespace
}  // namespace locks::cuda_test
