// NaN/Inf policy of the raw-view attention ops (docs/bad_input.md): they do not scan the
// cache (PagedKvCache::append and the summary build refuse NaN/Inf where data enters), but a
// NaN or Inf that reaches them propagates: the affected query heads get NaN outputs and lse,
// as the exact softmax formula (ref::decode_attention) gives, never a silently dropped token.
// Issue #12: a NaN in K dropped that token (the running max skipped it, exp(NaN) became 0).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "locks/attention.h"
#include "locks/reference.h"

namespace locks {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

// Two sequences of 40 tokens (3 pages of 16) on 2 KV heads, 2 query heads each; filled with
// small finite values, then one element poisoned.
struct RawCache {
  CacheLayout L{6, 16, 2, 32, DType::f32};
  std::vector<float> k, v, q;
  std::vector<int32_t> table{0, 1, 2, 3, 4, 5}, lens{40, 40};
  RawCache() : k(size_t(L.num_blocks * L.block_elems())), v(k.size()), q(2 * 4 * 32) {
    for (size_t i = 0; i < k.size(); ++i) {
      k[i] = 0.01f * float(int(i * 37 % 101) - 50);
      v[i] = 0.02f * float(int(i * 53 % 89) - 44);
    }
    for (size_t i = 0; i < q.size(); ++i) q[i] = 0.05f * float(int(i * 29 % 61) - 30);
  }
  KvCacheView view() const { return {k.data(), v.data(), L}; }
  BatchView batch() const { return {table.data(), 3, lens.data(), 2, 3}; }
  QueryView qv() const { return {q.data(), 4}; }
  // Element `dim` of token `t` of sequence b, KV head g.
  size_t at(int b, int t, int g, int dim) const {
    return size_t(L.offset(table[size_t(b * 3 + t / 16)], t % 16, g) + dim);
  }
};

struct Out {
  std::vector<float> out = std::vector<float>(2 * 4 * 32), lse = std::vector<float>(2 * 4);
};

Out dense(const RawCache& c) {
  Out o;
  cpu::decode_attention_dense(c.view(), c.batch(), c.qv(), 0.2f, {o.out.data(), o.lse.data()});
  return o;
}

Out sparse_all(const RawCache& c) {
  std::vector<int32_t> pages{0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2}, counts{3, 3, 3, 3};
  Out o;
  cpu::decode_attention_sparse(c.view(), c.batch(), c.qv(), 0.2f, {pages.data(), counts.data(), 3},
                               {o.out.data(), o.lse.data()});
  return o;
}

// Query heads (b, h) whose KV head is (1, 0) are NaN (all 32 dims and lse); the rest finite.
void expect_only_seq1_kvhead0_nan(const Out& o) {
  for (int b = 0; b < 2; ++b)
    for (int h = 0; h < 4; ++h) {
      const bool poisoned = b == 1 && h / 2 == 0;
      EXPECT_EQ(std::isnan(o.lse[size_t(b * 4 + h)]), poisoned) << "b " << b << " h " << h;
      for (int e = 0; e < 32; ++e)
        ASSERT_EQ(std::isnan(o.out[size_t((b * 4 + h) * 32 + e)]), poisoned)
            << "b " << b << " h " << h << " dim " << e;
    }
}

TEST(NanPolicy, NanInKeysPropagates) {
  for (int t : {0, 17, 39}) {  // first token, mid-sequence, the partial tail page
    RawCache c;
    c.k[c.at(1, t, 0, 5)] = kNaN;
    expect_only_seq1_kvhead0_nan(dense(c));
    expect_only_seq1_kvhead0_nan(sparse_all(c));
  }
}

TEST(NanPolicy, InfInKeysPropagates) {
  RawCache c;
  for (int e = 0; e < 32; ++e) c.k[c.at(1, 20, 0, e)] = kInf;  // +inf or -inf logits: q mixes signs
  expect_only_seq1_kvhead0_nan(dense(c));
  expect_only_seq1_kvhead0_nan(sparse_all(c));
}

TEST(NanPolicy, NanInValuesPropagates) {
  RawCache c;
  c.v[c.at(1, 33, 0, 7)] = kNaN;
  const Out o = dense(c);
  for (int h = 0; h < 2; ++h) EXPECT_TRUE(std::isnan(o.out[size_t((4 + h) * 32 + 7)]));
  EXPECT_FALSE(std::isnan(o.out[size_t(4 * 32 + 6)]));
}

// The reference agrees: NaN in, NaN out, for the same heads.
TEST(NanPolicy, ReferenceAgrees) {
  RawCache c;
  c.k[c.at(1, 17, 0, 5)] = kNaN;
  std::vector<double> out(2 * 4 * 32), lse(2 * 4);
  ref::decode_attention(c.view(), c.batch(), c.qv(), 0.2f, nullptr, out.data(), lse.data());
  for (int h = 0; h < 4; ++h) EXPECT_EQ(std::isnan(lse[size_t(4 + h)]), h / 2 == 0) << h;
}

}  // namespace
}  // namespace locks
