// ref::filled_blocks / slot_blocks and the float64 filled-page builds (reference.h): the
// contract's rules written out as plain loops over the host arrays.
#include "locks/error.h"
#include "locks/reference.h"

namespace locks::ref {

std::vector<int32_t> filled_blocks(const CacheLayout& cache, const BatchView& batch, int appended) {
  const int P = cache.page_size;
  LOCKS_REQUIRE(appended >= 1 && appended <= P, "appended must be in [1, ", P, "], got ", appended);
  std::vector<int32_t> blocks;
  for (int b = 0; b < batch.batch_size; ++b) {
    const int64_t len = batch.seq_lens[b];
    const int64_t before = len > appended ? len - appended : 0;
    // Pages complete before and after the append; at most one more for appended <= P.
    for (int64_t j = before / P; j < len / P; ++j)
      blocks.push_back(batch.block_table[int64_t(b) * batch.block_table_stride + j]);
  }
  for (const int32_t blk : blocks)
    LOCKS_REQUIRE(blk >= 0 && blk < cache.num_blocks, "block ", blk, " out of range");
  return blocks;
}

std::vector<int32_t> slot_blocks(const CacheLayout& cache, const int32_t* slot_mapping,
                                 int64_t n_slots) {
  std::vector<int32_t> blocks;
  for (int64_t i = 0; i < n_slots; ++i) {
    const int64_t s = slot_mapping[i];
    if (s == -1) continue;  // padding
    LOCKS_REQUIRE(s >= 0 && s < cache.num_blocks * cache.page_size, "slot ", s, " out of range");
    const int64_t block = s / cache.page_size, offset = s % cache.page_size;
    if (offset == cache.page_size - 1) blocks.push_back(int32_t(block));
  }
  return blocks;
}

namespace {
std::vector<BlockSummary64> build_all(const KvCacheView& cache, const std::vector<int32_t>& blocks,
                                      int rank, const float* qweight) {
  std::vector<BlockSummary64> out;
  for (const int32_t blk : blocks)
    for (int h = 0; h < cache.layout.num_kv_heads; ++h)
      out.push_back({blk, h, summary_build_page(cache, blk, h, rank, qweight)});
  return out;
}
}  // namespace

std::vector<BlockSummary64> summary_build_filled(const KvCacheView& cache, const BatchView& batch,
                                                 int appended, int rank, const float* qweight) {
  return build_all(cache, filled_blocks(cache.layout, batch, appended), rank, qweight);
}

std::vector<BlockSummary64> summary_build_slots(const KvCacheView& cache,
                                                const int32_t* slot_mapping, int64_t n_slots,
                                                int rank, const float* qweight) {
  return build_all(cache, slot_blocks(cache.layout, slot_mapping, n_slots), rank, qweight);
}

}  // namespace locks::ref
