// validate_cache and KvCacheView's block stride (include/locks/kv_cache.h): where element
// (block, slot, head) is, and which strides and K/V placements every backend refuses. The
// views here are never read: pointers are plain addresses.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <string>

#include "locks/error.h"
#include "locks/kv_cache.h"

namespace locks {
namespace {

const CacheLayout kL{10, 16, 2, 64, DType::bf16};  // a block: 2048 elements, 4096 bytes
constexpr int64_t kE = 16 * 2 * 64;
constexpr uintptr_t kBase = uintptr_t(1) << 32;

const void* at(int64_t bytes) { return reinterpret_cast<const void*>(kBase + bytes); }

KvCacheView view(int64_t v_minus_k_bytes, int64_t block_stride) {
  return {at(0), at(v_minus_k_bytes), kL, block_stride};
}

std::string error_of(const KvCacheView& c) {
  try {
    validate_cache(c);
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "";
}

TEST(CacheView, OffsetsFollowTheBlockStride) {
  KvCacheView c{at(0), at(1 << 30), kL};
  EXPECT_EQ(c.block_step(), kE);
  EXPECT_EQ(c.offset(3, 5, 1), kL.offset(3, 5, 1));  // dense: the layout's own offsets
  c.block_stride = 2 * kE;                           // vLLM's V1 runner: [N, 2, P, H, d]
  EXPECT_EQ(c.block_step(), 2 * kE);
  EXPECT_EQ(c.offset(3, 5, 1), 3 * 2 * kE + (5 * 2 + 1) * 64);
  EXPECT_EQ(c.offset(0, 15, 1), kE - 64);  // the inside of a block stays [P, H, d] contiguous
}

TEST(CacheView, DenseAndInterleavedLayoutsAreAccepted) {
  EXPECT_EQ(error_of(view(10 * kE * 2, 0)), "");   // two dense arrays back to back
  EXPECT_EQ(error_of(view(-10 * kE * 2, 0)), "");  // V first
  EXPECT_EQ(error_of(view(kE * 2, 2 * kE)), "");   // K = kv[:, 0], V = kv[:, 1]
  EXPECT_EQ(error_of(view(-kE * 2, 2 * kE)), "");  // V = kv[:, 0], K = kv[:, 1]
}

TEST(CacheView, StridesBelowOneBlockOrOverflowingAreRefused) {
  EXPECT_NE(error_of(view(1 << 30, kE - 1)).find("below one block"), std::string::npos);
  EXPECT_NE(error_of(view(1 << 30, -kE)).find("below one block"), std::string::npos);
  EXPECT_EQ(error_of(view(1 << 30, kE)), "");  // = dense
  KvCacheView big = view(1 << 30, std::numeric_limits<int64_t>::max() / 10);
  EXPECT_NE(error_of(big).find("overflows"), std::string::npos);
  big.v = nullptr;  // checked without V too
  EXPECT_NE(error_of(big).find("overflows"), std::string::npos);
}

TEST(CacheView, OverlappingKAndVAreRefused) {
  // V = K; V one block after K in dense arrays (K block 1 is V block 0); V half a block into
  // an interleaved block; V a byte off a block boundary; V inside K's last block.
  for (const auto& [dv, stride] : {std::pair<int64_t, int64_t>{0, 0},
                                   {kE * 2, 0},
                                   {kE, 2 * kE},
                                   {-kE, 2 * kE},
                                   {1, 2 * kE},
                                   {kE * 2 - 1, 2 * kE},
                                   {9 * kE * 2 + 2, 0},
                                   {-(9 * kE * 2 + 2), 0}}) {
    const std::string e = error_of(view(dv, stride));
    EXPECT_NE(e.find("overlap"), std::string::npos) << "v - k " << dv << " stride " << stride;
  }
  // No V (a summary build reads K only): nothing to overlap.
  KvCacheView k_only = view(0, 0);
  k_only.v = nullptr;
  EXPECT_EQ(error_of(k_only), "");
}

TEST(CacheView, OneBlockCachesNeedOnlyDisjointBlocks) {
  CacheLayout one = kL;
  one.num_blocks = 1;
  EXPECT_EQ(error_of({at(0), at(kE * 2), one}), "");
  EXPECT_NE(error_of({at(0), at(kE * 2 - 2), one}).find("overlap"), std::string::npos);
}

}  // namespace
}  // namespace locks
