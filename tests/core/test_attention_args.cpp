// Issue #12: attention on an empty batch reported "out.out is null" (the empty output buffer)
// instead of the cause.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "locks/attention.h"
#include "locks/error.h"

namespace locks {
namespace {

TEST(AttentionArgs, EmptyBatchIsNamed) {
  const CacheLayout L{2, 16, 1, 32, DType::f32};
  std::vector<float> kv(size_t(L.num_blocks * L.block_elems()), 0.0f);
  const KvCacheView cache{kv.data(), kv.data(), L};
  const BatchView batch{nullptr, 1, nullptr, 0, 1};  // batch 0: no tables, lengths, outputs
  const QueryView q{nullptr, 1};
  try {
    cpu::decode_attention_dense(cache, batch, q, 0.2f, {nullptr, nullptr});
    FAIL() << "no error on an empty batch";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("batch is empty (batch_size 0)"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace locks
