// cpu::summary_build_filled / summary_build_slots (contract.h): find the blocks that the
// step completed (rules.h: filled_page, slot_filled_block) and build them with the bulk
// cpu::summary_build. The block list is small (at most one block a sequence or a slot).
#include <vector>

#include "internal/check.h"
#include "locks/contract.h"
#include "locks/error.h"
#include "locks/rules.h"

namespace locks::cpu {

void summary_build_filled(const KvCacheView& cache, const BatchView& batch, int appended,
                          const SummaryView& out) {
  const CacheLayout& L = cache.layout;
  validate_cache(cache);
  LOCKS_REQUIRE(appended >= 1 && appended <= L.page_size,
                "appended must be in [1, page_size = ", L.page_size, "], got ", appended);
  detail::check_batch_blocks(batch, L.num_blocks, L.page_size, __func__);
  std::vector<int32_t> blocks;
  for (int b = 0; b < batch.batch_size; ++b) {
    const int j = rules::filled_page(batch.seq_lens[b], appended, L.page_size);
    if (j >= 0) blocks.push_back(batch.block_table[int64_t(b) * batch.block_table_stride + j]);
  }
  summary_build(cache, blocks.data(), int64_t(blocks.size()), out);
}

void summary_build_slots(const KvCacheView& cache, const int32_t* slot_mapping, int64_t n_slots,
                         const SummaryView& out) {
  const CacheLayout& L = cache.layout;
  validate_cache(cache);
  LOCKS_REQUIRE(n_slots >= 0, "n_slots must be >= 0, got ", n_slots);
  LOCKS_REQUIRE(n_slots == 0 || slot_mapping != nullptr, "slot_mapping is null");
  std::vector<int32_t> blocks;
  for (int64_t i = 0; i < n_slots; ++i) {
    const int32_t s = slot_mapping[i];
    LOCKS_REQUIRE(s >= -1 && s / L.page_size < L.num_blocks, "slot_mapping[", i, "] = ", s,
                  " outside [-1 (padding), num_blocks * page_size = ", L.num_blocks * L.page_size,
                  ")");
    const int64_t blk = rules::slot_filled_block(s, L.page_size);
    if (blk >= 0) blocks.push_back(int32_t(blk));
  }
  summary_build(cache, blocks.data(), int64_t(blocks.size()), out);
}

}  // namespace locks::cpu
