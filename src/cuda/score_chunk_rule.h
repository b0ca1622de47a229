// Pages per scoring block: the sizes (kScoreChunk, kScoreChunkMin, the set the tensor-core
// kernel is instantiated for) and the plan's rule from the grid size, as a pure host function (the
// occupancy query that gives `slots` stays in score_mma_fp32.cu), so that it is unit-tested without
// a GPU (tests/cuda/test_score_chunk_rule.cpp).
#pragma once

#include <cstdint>

namespace locks::cuda::detail {

constexpr int kScoreChunk = 128;    // most pages per scoring block (CUDA-core path: always)
constexpr int kScoreChunkMin = 32;  // fewest (tensor-core path, small grids)

// The pages per block the tensor-core kernel is instantiated for (launch_mma_cp).
constexpr bool score_chunk_supported(int cp) {
  return cp == 32 || cp == 64 || cp == 96 || cp == 128;
}

// The size on grids over two waves: 128, but 64 for the kernel instance of d 128 with at most
// 4 heads a block (Llama-3.1-8B's G 4). There, halving the blocks halves the last wave's tail,
// and the instance's per-block query work is small: on an H100 (2026-12-07, each row twice, six
// Llama-3.1-8B rows of 5-21 waves) the step was 0.7-2.0% faster at 64 (128K b8 0.2367 -> 0.2319
// ms). The other instances lost or split at 64 (G 5-8: Qwen2.5-7B +0.8%, Llama-3.1-70B TP8
// -0.7%; Gemma-3-4B, d 256: +1.8%; GLM-4-9B, G 16, whose two n-tiles of query fragments double
// that work: +13.6%), or were not measured (d 64).
constexpr int long_grid_chunk(int head_dim, int heads_per_block) {
  return head_dim == 128 && heads_per_block <= 4 ? 64 : kScoreChunk;
}

// rows: blocks per chunk of pages (sequences x KV heads x head slices); max_pages: pages a
// sequence; slots: resident blocks on the whole GPU; long_grid: the size over two waves
// (long_grid_chunk). Returns 128, 96, 64 or 32.
inline int score_chunk_rule(int64_t rows, int64_t max_pages, int64_t slots,
                            int long_grid = kScoreChunk) {
  constexpr int kMax = kScoreChunk, kMin = kScoreChunkMin;
  auto blocks = [&](int cp) { return rows * ((max_pages + cp - 1) / cp); };
  // Under a wave: halve while the grid would fill less than half of it (v13: at 128K batch 1,
  // 512 blocks of 128 pages on 792 slots beat 1024 of 64; v22: beat 688 of 96 too, and 256 of
  // 128 beat 684 of 48 at Qwen2.5-7B 128K batch 1: below a wave, a SM's share of the work,
  // not the blocks' chains, sets the time).
  if (blocks(kMax) <= slots) {
    int cp = kMax;
    while (cp > kMin && 2 * blocks(cp) < slots) cp /= 2;
    return cp;
  }
  // Up to two waves the second, partial one costs a whole block time: the size with the fewest
  // (whole waves x pages a block) wins, ties to the larger (v22: Llama-3.1-8B 256K batch 1,
  // 1024 blocks of 128 on 792 slots -> 1368 of 96: scoring 52.5 -> 48.2 us). Longer grids keep
  // the long-grid size (blocks finish at staggered times; the tail is about half a block).
  if (blocks(kMax) > 2 * slots) return long_grid;
  int best = kMax;
  int64_t best_cost = 0;
  for (int cp : {kMax, 96, 64}) {
    const int64_t cost = (blocks(cp) + slots - 1) / slots * cp;
    if (cp == kMax || cost < best_cost) best = cp, best_cost = cost;
  }
  return best;
}

}  // namespace locks::cuda::detail
