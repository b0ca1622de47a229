// cpu::Decoder (score -> aggregate -> select -> sparse attention in one call) against the
// float64 reference at every stage, with the decoder's own intermediate results: head scores
// vs ref::score_pages, group scores vs ref::aggregate_gqa of those head scores, selection ==
// ref::select_pages of those group scores (exact), output vs ref::decode_attention over that
// selection. Tolerances: test_compare.h.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "locks/decoder.h"
#include "locks/reference.h"
#include "test_compare.h"
#include "test_util.h"

namespace locks::test {
namespace {

void check_decoder(const TestCache& t, const SummaryView& sv, const SelectConfig& cfg,
                   int max_batch, int max_blocks) {
  const int B = t.bv().batch_size, Hq = t.spec.num_q_heads, H = t.spec.num_kv_heads;
  const int d = t.spec.head_dim, P = t.spec.page_size, M = t.max_blocks();
  // scale 0 means 1/sqrt(head_dim), which is what TestCache::scale() is.
  cpu::Decoder dec(t.layout(), Hq, max_batch, max_blocks, {cfg, 0.0f});
  std::vector<float> out(size_t(B) * Hq * d, 777.0f), lse(size_t(B) * Hq, 777.0f);
  dec.run(t.view(), sv, t.bv(), t.qv(), {out.data(), lse.data()});

  ASSERT_GE(dec.head_scores().size(), size_t(B) * Hq * M);
  ASSERT_GE(dec.group_scores().size(), size_t(B) * H * M);
  const std::vector<float> hs(dec.head_scores().begin(), dec.head_scores().begin() + B * Hq * M);
  expect_scores_match(t, sv, hs.data());
  expect_aggregate_match(hs, t.bv(), Hq, H, dec.group_scores().data());

  const Selection sel = dec.selection();
  EXPECT_EQ(sel.capacity, select_capacity(cfg, P, max_blocks));
  SelectionBuf r(B, H, sel.capacity);
  const std::vector<double> gd(dec.group_scores().begin(), dec.group_scores().begin() + B * H * M);
  ref::select_pages(gd.data(), t.bv(), H, P, cfg, r.sel);
  for (int b = 0; b < B; ++b)
    for (int g = 0; g < H; ++g) {
      const int64_t row = int64_t(b) * H + g;
      ASSERT_EQ(sel.counts[row], r.counts[size_t(row)]) << "seq " << b << " head " << g;
      for (int i = 0; i < sel.counts[row]; ++i)
        EXPECT_EQ(sel.pages[row * sel.capacity + i], r.pages[size_t(row * sel.capacity + i)]);
    }
  expect_attention_match(t, &sel, out.data(), lse.data());
}

TEST(Decoder, MatchesReferenceAtEveryStage) {
  for (DType dt : {DType::f32, DType::bf16})
    for (Precision prec : {Precision::fp32, Precision::quant}) {
      CacheSpec sp;
      sp.dtype = dt;
      sp.structured = true;
      sp.num_q_heads = 8;
      sp.seq_lens = {16 * 9 + 3, 16 * 6, 11};
      TestCache t = make_cache(sp);
      SummaryStore store = build_summaries(t, 8, prec);
      SCOPED_TRACE(testing::Message() << dtype_name(dt) << " " << precision_name(prec));
      check_decoder(t, store.view(), {64, 1, 1}, 3, t.max_blocks());
      // Planned for more than this batch: a larger max_batch and longer block rows.
      check_decoder(t, store.view(), {48, 0, 1}, 5, t.max_blocks() + 4);
      // Budget covering every sequence: full attention through the decoder.
      check_decoder(t, store.view(), {16 * 10, 1, 1}, 3, t.max_blocks());
    }
}

TEST(Decoder, FullBudgetEqualsDenseBitwise) {
  CacheSpec sp;
  sp.structured = true;
  sp.seq_lens = {77, 128, 5};
  TestCache t = make_cache(sp);
  SummaryStore store = build_summaries(t, 8, Precision::fp32);
  const int B = 3, Hq = sp.num_q_heads, d = sp.head_dim;
  cpu::Decoder dec(t.layout(), Hq, B, t.max_blocks(), {{128, 1, 1}, 0.0f});
  std::vector<float> o1(size_t(B) * Hq * d), l1(size_t(B) * Hq), o2(o1.size()), l2(l1.size());
  dec.run(t.view(), store.view(), t.bv(), t.qv(), {o1.data(), l1.data()});
  cpu::decode_attention_dense(t.view(), t.bv(), t.qv(), t.scale(), {o2.data(), l2.data()});
  EXPECT_EQ(std::memcmp(o1.data(), o2.data(), o1.size() * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(l1.data(), l2.data(), l1.size() * sizeof(float)), 0);
}

}  // namespace
}  // namespace locks::test
