// Checks of the float64 reference itself on cases small enough to know the answer (the
// yardstick the backends are compared with must not itself be wrong).
// The reference attention (src/ref/attention_ref.cpp) against a closed form.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <vector>

#include "locks/error.h"
#include "locks/reference.h"
#include "test_util.h"

namespace locks::test {
namespace {

TEST(RefSelfCheck, AttentionOverEqualLogitsIsTheMeanOfValues) {
  CacheLayout l{2, 4, 1, 32, DType::f32};
  std::vector<float> k(size_t(l.num_blocks * l.block_elems()), 0.5f), v(k.size());
  Rng rng(3);
  for (auto& x : v) x = rng.normal();
  std::vector<float> q(32, 0.0f);  // q = 0: every logit is 0
  const int32_t len = 6;
  std::vector<int32_t> table{1, 0};  // page 0 lives in block 1
  BatchView bv{table.data(), 2, &len, 1, 2};
  std::vector<double> out(32), lse(1);
  ref::decode_attention({k.data(), v.data(), l}, bv, {q.data(), 1}, 0.2f, nullptr, out.data(),
                        lse.data());
  EXPECT_NEAR(lse[0], std::log(6.0), 1e-14);
  for (int c = 0; c < 32; ++c) {
    double m = 0;
    for (int s = 0; s < 4; ++s) m += v[size_t(l.offset(1, s, 0) + c)];
    for (int s = 0; s < 2; ++s) m += v[size_t(l.offset(0, s, 0) + c)];
    EXPECT_NEAR(out[size_t(c)], m / 6, 1e-12);
  }
}

// A block stride (kv_cache.h) moves where the reference reads, not what: K/V interleaved per
// block ([N, 2, P, H, d], vLLM's V1 runner) give the dense cache's results bit for bit; a
// stride below one block is refused.
TEST(RefSelfCheck, StridedCacheReadsTheSameElements) {
  CacheSpec sp;
  sp.dtype = DType::bf16;
  sp.page_size = 16;
  sp.num_kv_heads = 2;
  sp.num_q_heads = 4;
  sp.head_dim = 32;
  sp.seq_lens = {40, 17};
  const TestCache t = make_cache(sp);
  const CacheLayout& L = t.layout();
  const int64_t E = L.block_elems();
  const size_t eb = size_t(E) * 2;
  std::vector<uint8_t> kv(size_t(L.num_blocks) * 2 * eb);
  scatter_blocks(kv.data(), t.view().k, L.num_blocks, eb, 2 * eb);
  scatter_blocks(kv.data() + eb, t.view().v, L.num_blocks, eb, 2 * eb);
  const KvCacheView strided{kv.data(), kv.data() + eb, L, 2 * E};
  const size_t n = size_t(t.bv().batch_size) * sp.num_q_heads;
  std::vector<double> o1(n * 32), l1(n), o2(n * 32), l2(n);
  ref::decode_attention(t.view(), t.bv(), t.qv(), t.scale(), nullptr, o1.data(), l1.data());
  ref::decode_attention(strided, t.bv(), t.qv(), t.scale(), nullptr, o2.data(), l2.data());
  EXPECT_EQ(o1, o2);
  EXPECT_EQ(l1, l2);
  for (const int32_t blk : t.full_blocks()) {
    EXPECT_EQ(ref::summary_build_page(t.view(), blk, 1, 4).basis,
              ref::summary_build_page(strided, blk, 1, 4).basis);
    EXPECT_EQ(ref::exact_log_mass(t.view(), blk, 1, 16, t.q.data(), 0.2f),
              ref::exact_log_mass(strided, blk, 1, 16, t.q.data(), 0.2f));
  }
  KvCacheView bad = strided;
  bad.block_stride = E - 1;
  EXPECT_THROW(ref::decode_attention(bad, t.bv(), t.qv(), t.scale(), nullptr, o2.data(), l2.data()),
               InvalidArgument);
}

}  // namespace
}  // namespace locks::test
