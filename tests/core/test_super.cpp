// Two-level LOCKS (super_summary.h) on the CPU: the super summary's stored invariants, the
// level-1 scores against the float64 reference, the kept-groups rule and its guards, the
// masked level-2 scoring, and the whole two-level selection on planted relevance.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "locks/error.h"
#include "locks/reference.h"
#include "locks/super_summary.h"
#include "test_util.h"

namespace locks::test {
namespace {

// Super summaries of every complete group of every sequence, slots in order, and the table.
struct Supers {
  std::unique_ptr<SuperStore> store;
  std::vector<int32_t> table;
  int max_groups = 0;
  SuperTableView view() const { return {table.data(), max_groups, max_groups}; }
};

Supers build_supers(const TestCache& t, int S, int R, bool extent) {
  Supers s;
  const int B = t.bv().batch_size, P = t.spec.page_size;
  s.max_groups = (t.max_blocks() + S - 1) / S;
  s.table.assign(size_t(B) * s.max_groups, -1);
  std::vector<int32_t> blocks, slots;
  for (int b = 0; b < B; ++b)
    for (int j = 0; j < t.bv().seq_lens[b] / P / S; ++j) {
      s.table[size_t(b) * s.max_groups + j] = int32_t(slots.size());
      slots.push_back(int32_t(slots.size()));
      for (int p = 0; p < S; ++p) blocks.push_back(t.block_of(b, j * S + p));
    }
  SuperLayout l;
  l.num_slots = std::max<int64_t>(1, int64_t(slots.size()));
  l.group_pages = S;
  l.page_size = P;
  l.num_kv_heads = t.spec.num_kv_heads;
  l.head_dim = t.spec.head_dim;
  l.rank = R;
  l.extent = extent;
  s.store = std::make_unique<SuperStore>(l);
  cpu::super_build(t.view(), blocks.data(), slots.data(), int64_t(slots.size()), s.store->view());
  return s;
}

CacheSpec long_spec(bool structured, uint64_t seed) {
  CacheSpec sp;
  sp.structured = structured;
  sp.seq_lens = {16 * 4 * 12 + 37, 16 * 4 * 9};  // 12 and 9 complete groups of S = 4
  sp.num_kv_heads = 2;
  sp.num_q_heads = 8;
  sp.head_dim = 32;
  sp.relevant_per_seq = 2;
  sp.seed = seed;
  return sp;
}

TEST(SuperLayout, BytesAtHeadDim128) {
  SuperLayout l;  // S 16, R 8, d 128, P 16
  l.group_pages = 16;
  l.extent = false;
  EXPECT_EQ(super_bytes_per_group(l), 128u + 4 + 512 + 32 + 128 + 32 + 16 + 4);
  l.extent = true;
  EXPECT_EQ(super_bytes_per_group(l), 856u + 256 + 32);
  // The point of level 1: at S 16 its bytes are under 1/15 of the page summaries it covers.
  l.extent = false;
  const SummaryLayout page = summary_layout_for({1, 16, 1, 128, DType::f32}, 8, Precision::quant);
  EXPECT_LT(super_bytes_per_page(l), summary_bytes_per_page(page) / 15.0);
  l.group_pages = 64;
  EXPECT_LT(super_bytes_per_page(l), summary_bytes_per_page(page) / 40.0);
}

TEST(SuperLayout, ByteModelAtOneMillionTokens) {
  // Per KV head at d 128 (Llama-3.1-8B and GLM-4-9B alike: the ratio does not depend on the
  // number of KV heads at batch 1): flat LOCKS is summary-bound under 10x; two levels are not.
  const SummaryLayout page = summary_layout_for({1, 16, 1, 128, DType::f32}, 8, Precision::quant);
  const SuperLayout super;   // S 32, R 8, extent
  const TwoLevelConfig cfg;  // alpha 32: one group per page slot
  const int64_t len = int64_t(1) << 20;
  for (int b : {512, 2048}) {
    const StepBytes s = two_level_step_bytes(super, page, cfg, {b, 0, 0}, len);
    EXPECT_DOUBLE_EQ(s.dense, double(len) * 512);
    EXPECT_DOUBLE_EQ(s.level1, 2048.0 * super_bytes_per_group(super));
    EXPECT_LT(s.dense / s.flat, 10.0);
    EXPECT_GT(s.dense / s.total(), 20.0) << "b " << b;
  }
  // Short context: the fallback reads every page summary and no super summary.
  const StepBytes fb = two_level_step_bytes(super, page, cfg, {512, 0, 0}, 4096);
  EXPECT_EQ(fb.level1, 0.0);
  EXPECT_DOUBLE_EQ(fb.level2 + fb.attended, fb.flat);
}

TEST(SuperLayout, RejectsBadLayoutsAndConfigs) {
  SuperLayout l;
  l.rank = 0;
  EXPECT_THROW(validate_super_layout(l), InvalidArgument);
  l.rank = 8;
  l.group_pages = 1;
  EXPECT_THROW(validate_super_layout(l), InvalidArgument);
  l.group_pages = 16;
  l.head_dim = 127;
  EXPECT_THROW(validate_super_layout(l), InvalidArgument);
  TwoLevelConfig c;
  c.alpha = 0.5;
  EXPECT_THROW(validate_two_level(c), InvalidArgument);
  c.alpha = std::nan("");
  EXPECT_THROW(validate_two_level(c), InvalidArgument);
  c.alpha = 2;
  c.min_groups = 0;
  EXPECT_THROW(validate_two_level(c), InvalidArgument);
  c.min_groups = 1;
  c.first_groups = -1;
  EXPECT_THROW(validate_two_level(c), InvalidArgument);
  c.first_groups = 0;
  c.min_groups = 1;
  c.gamma = -1;
  EXPECT_THROW(validate_two_level(c), InvalidArgument);
}

TEST(SuperRule, GroupsKeptAndFallbacks) {
  TwoLevelConfig c;
  c.alpha = 2;  // min 4, flat below 8 groups
  SelectConfig sel;
  sel.budget_tokens = 512;  // 32 page slots
  const int P = 16, S = 16;
  // 1M tokens: 4096 groups; m = max(4, ceil(2 * 32 / 16)) = 4.
  EXPECT_EQ(groups_kept(c, sel, P, S, 1 << 20), 4);
  sel.budget_tokens = 2048;  // 128 slots -> 16 groups
  EXPECT_EQ(groups_kept(c, sel, P, S, 1 << 20), 16);
  // Short context: 7 complete groups < flat_below_groups -> flat.
  EXPECT_EQ(groups_kept(c, sel, P, S, 7 * 256 + 100), -1);
  // m would cover every group -> flat.
  EXPECT_EQ(groups_kept(c, sel, P, S, 16 * 256), -1);
  // Budget >= length -> every page (the caller's selects_all case).
  EXPECT_EQ(groups_kept(c, sel, P, S, 2048), -1);
}

TEST(SuperBuild, StoredInvariants) {
  TestCache t = make_cache(long_spec(true, 3));
  for (bool extent : {false, true}) {
    Supers s = build_supers(t, 4, 3, extent);
    const SuperView v = s.store->view();
    for (int64_t slot = 0; slot < v.layout.num_slots; ++slot)
      for (int h = 0; h < v.layout.num_kv_heads; ++h) {
        const SuperGroupF g = super_dequantize(v, slot, h);
        const int64_t gh = slot * v.layout.num_kv_heads + h;
        for (int p = 0; p < 4; ++p) {
          EXPECT_GE(g.radius[p], 0.0f);
          if (!extent) continue;
          // The centroid's coordinate is the mean of its keys' coefficients, so it lies in
          // their (outward-rounded) range, up to its own rounding.
          for (int k = 0; k < 3; ++k) {
            const float half = 0.5f * v.coord_scale[gh * 3 + k] + 1e-5f;
            EXPECT_LE(g.lo[p * 3 + k], g.hi[p * 3 + k]);
            EXPECT_GE(g.coord[p * 3 + k], g.lo[p * 3 + k] - half);
            EXPECT_LE(g.coord[p * 3 + k], g.hi[p * 3 + k] + half);
          }
        }
      }
  }
}

TEST(SuperBuild, CentroidIsTheGroupMean) {
  TestCache t = make_cache(long_spec(false, 4));
  Supers s = build_supers(t, 4, 2, false);
  const SuperView v = s.store->view();
  const int d = t.spec.head_dim, H = t.spec.num_kv_heads, P = t.spec.page_size;
  const int64_t slot = s.table[1];  // sequence 0, group 1
  for (int h = 0; h < H; ++h) {
    const SuperGroupF g = super_dequantize(v, slot, h);
    for (int c = 0; c < d; ++c) {
      double mean = 0;
      for (int i = 4 * P; i < 8 * P; ++i) mean += t.keys[0][(size_t(i) * H + h) * d + c];
      mean /= 4 * P;
      EXPECT_NEAR(g.mu[c], mean, 0.5 * v.mu_scale[slot * H + h] + 1e-6) << "c " << c;
    }
  }
}

TEST(SuperBuild, RejectsBadInput) {
  TestCache t = make_cache(long_spec(false, 5));
  Supers s = build_supers(t, 4, 2, false);
  SuperView v = s.store->view();
  std::vector<int32_t> blocks{0, 1, 2, 3}, slot{0};
  std::vector<int32_t> bad_blocks{0, 1, 2, int32_t(t.layout().num_blocks)};
  EXPECT_THROW(cpu::super_build(t.view(), bad_blocks.data(), slot.data(), 1, v), InvalidArgument);
  std::vector<int32_t> bad_slot{int32_t(v.layout.num_slots)};
  EXPECT_THROW(cpu::super_build(t.view(), blocks.data(), bad_slot.data(), 1, v), InvalidArgument);
  SuperView wrong = v;
  wrong.layout.head_dim = 16;
  EXPECT_THROW(cpu::super_build(t.view(), blocks.data(), slot.data(), 1, wrong), InvalidArgument);
  // A NaN key is refused before anything is written.
  const std::vector<int8_t> before(v.mu_q, v.mu_q + t.spec.head_dim);
  static_cast<float*>(t.cache->k_data())[5] = std::nanf("");
  EXPECT_THROW(cpu::super_build(t.view(), blocks.data(), slot.data(), 1, v), InvalidArgument);
  EXPECT_TRUE(std::equal(before.begin(), before.end(), v.mu_q));
}

void check_scores_match(const TestCache& t, const Supers& s, const TwoLevelConfig& c) {
  const int B = t.bv().batch_size, Hq = t.spec.num_q_heads, MG = s.max_groups;
  std::vector<float> got(size_t(B) * Hq * MG, 123.0f);
  std::vector<double> want(got.size());
  cpu::super_score(s.store->view(), s.view(), t.bv(), t.qv(), t.scale(), c, got.data());
  ref::super_score(s.store->view(), s.view(), t.bv(), t.qv(), t.scale(), c, want.data());
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isinf(want[i])) {
      EXPECT_EQ(got[i], kNegInfF) << i;
    } else {
      EXPECT_NEAR(got[i], want[i], 1e-4 * (1 + std::fabs(want[i]))) << i;
    }
  }
}

TEST(SuperScore, MatchesReferenceInEveryMode) {
  for (bool structured : {false, true}) {
    TestCache t = make_cache(long_spec(structured, 6));
    Supers plain = build_supers(t, 4, 3, false), ext = build_supers(t, 4, 3, true);
    TwoLevelConfig c;
    c.use_extent = false;
    check_scores_match(t, plain, c);
    c.agg = GroupAgg::max;
    c.gamma = 0.5;
    check_scores_match(t, plain, c);
    c.use_extent = true;
    check_scores_match(t, ext, c);
    c.mix = true;
    check_scores_match(t, ext, c);
    EXPECT_THROW(check_scores_match(t, plain, c), InvalidArgument);  // no extent stored
  }
}

TEST(SuperScore, PlantedGroupsScoreHighest) {
  // Structured data: the relevant pages' centroids are shifted along the query direction, so
  // their groups must have the best level-1 score for every query head.
  TestCache t = make_cache(long_spec(true, 7));
  Supers s = build_supers(t, 4, 4, false);
  const int B = t.bv().batch_size, Hq = t.spec.num_q_heads, MG = s.max_groups;
  std::vector<float> gs(size_t(B) * Hq * MG);
  TwoLevelConfig c;
  c.use_extent = false;
  cpu::super_score(s.store->view(), s.view(), t.bv(), t.qv(), t.scale(), c, gs.data());
  for (auto [b, page] : t.relevant) {
    const int grp = page / 4;
    if (grp >= t.bv().seq_lens[b] / 16 / 4) continue;  // in the open group
    for (int h = 0; h < Hq; ++h) {
      const float* row = gs.data() + (size_t(b) * Hq + h) * MG;
      int better = 0;
      for (int j = 0; j < MG; ++j) better += row[j] > row[grp];
      EXPECT_LT(better, 2) << "seq " << b << " head " << h;  // 2 planted pages per sequence
    }
  }
}

TEST(SelectGroups, MatchesReferenceAndKeepsGuards) {
  TestCache t = make_cache(long_spec(false, 8));
  const int B = t.bv().batch_size, Hq = 8, Hkv = 2, MG = (t.max_blocks() + 3) / 4;
  const int M = t.max_blocks();
  Rng rng(9);
  std::vector<float> gs(size_t(B) * Hq * MG);
  for (auto& x : gs) x = 3.0f * rng.normal();
  std::vector<double> gs64(gs.begin(), gs.end());
  std::vector<int32_t> table(size_t(B) * MG, 0);
  const SuperTableView tv{table.data(), MG, MG};
  TwoLevelConfig c;
  c.min_groups = 2;
  c.alpha = 1.0;
  c.flat_below_groups = 3;
  for (int first : {0, 2})
    for (int sink : {0, 1})
      for (int recent : {0, 2})
        for (int budget : {64, 128, 200}) {
          c.first_groups = first;
          SelectConfig sel{budget, sink, recent};
          std::vector<uint8_t> got(size_t(B) * Hkv * M, 7), want(got.size(), 9);
          cpu::select_groups(gs.data(), tv, t.bv(), Hq, Hkv, 16, 4, sel, c, got.data());
          ref::select_groups(gs64.data(), tv, t.bv(), Hq, Hkv, 16, 4, sel, c, want.data());
          EXPECT_EQ(got, want) << sink << " " << recent << " " << budget;
          for (int b = 0; b < B; ++b)
            for (int g = 0; g < Hkv; ++g) {
              const uint8_t* m = got.data() + (size_t(b) * Hkv + g) * M;
              const int len = t.bv().seq_lens[b], full = len / 16, C = full / 4;
              const int n_pages = (len + 15) / 16;
              for (int j = C * 4; j < n_pages; ++j) EXPECT_EQ(m[j], 1) << "open group / tail";
              for (int j = n_pages; j < M; ++j) EXPECT_EQ(m[j], 0);
              for (int j = 0; j < sink; ++j) EXPECT_EQ(m[j], 1) << "sink";
              for (int j = 0; j < first * 4; ++j) EXPECT_EQ(m[j], 1) << "first groups";
              for (int j = full - recent; j < full; ++j) EXPECT_EQ(m[j], 1) << "recent";
              int kept = 0;
              for (int j = 0; j < C; ++j) kept += m[j * 4];
              const int mk = groups_kept(c, sel, 16, 4, len);
              ASSERT_GT(mk, 0);
              EXPECT_GE(kept, mk);
              EXPECT_LE(kept, mk + first + (sink > 0) + (recent > 0 ? 1 : 0));
            }
        }
}

TEST(ScorePagesMasked, EqualsFlatScoresOnTheMask) {
  TestCache t = make_cache(long_spec(true, 10));
  SummaryStore ps = build_summaries(t, 8, Precision::quant);
  const int B = t.bv().batch_size, Hq = 8, Hkv = 2, M = t.max_blocks(), G = Hq / Hkv;
  std::vector<float> flat(size_t(B) * Hq * M), masked(flat.size());
  cpu::score_pages(ps.view(), t.bv(), t.qv(), t.scale(), flat.data());
  std::vector<uint8_t> mask(size_t(B) * Hkv * M);
  Rng rng(11);
  for (auto& m : mask) m = uint8_t(rng.integer(0, 1));
  cpu::score_pages_masked(ps.view(), t.bv(), t.qv(), t.scale(), mask.data(), masked.data());
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < Hq; ++h)
      for (int j = 0; j < M; ++j) {
        const size_t i = (size_t(b) * Hq + h) * M + j;
        if (mask[(size_t(b) * Hkv + h / G) * M + j])
          EXPECT_EQ(masked[i], flat[i]);
        else
          EXPECT_EQ(masked[i], kNegInfF);
      }
  EXPECT_THROW(
      cpu::score_pages_masked(ps.view(), t.bv(), t.qv(), t.scale(), nullptr, masked.data()),
      InvalidArgument);
}

// The whole two-level step: level 1, group choice, level 2, share-averaging, selection.
std::vector<int32_t> two_level_select(const TestCache& t, const Supers& s, const SummaryStore& ps,
                                      const TwoLevelConfig& c, const SelectConfig& sel,
                                      SelectionBuf& out) {
  const int B = t.bv().batch_size, Hq = 8, Hkv = 2, M = t.max_blocks();
  std::vector<float> gs(size_t(B) * Hq * s.max_groups), hs(size_t(B) * Hq * M),
      agg(size_t(B) * Hkv * M);
  std::vector<uint8_t> mask(size_t(B) * Hkv * M);
  SummaryStore& pages = const_cast<SummaryStore&>(ps);
  cpu::super_score(s.store->view(), s.view(), t.bv(), t.qv(), t.scale(), c, gs.data());
  cpu::select_groups(gs.data(), s.view(), t.bv(), Hq, Hkv, 16, 4, sel, c, mask.data());
  cpu::score_pages_masked(pages.view(), t.bv(), t.qv(), t.scale(), mask.data(), hs.data());
  cpu::aggregate_gqa(hs.data(), t.bv(), Hq, Hkv, agg.data());
  cpu::select_pages(agg.data(), t.bv(), Hkv, 16, sel, out.sel);
  return out.pages;
}

TEST(TwoLevel, FindsPlantedPagesAndFallsBackToFlat) {
  TestCache t = make_cache(long_spec(true, 12));
  Supers s = build_supers(t, 4, 4, false);
  SummaryStore ps = build_summaries(t, 8, Precision::quant);
  const int B = t.bv().batch_size, Hkv = 2;
  TwoLevelConfig c;
  c.alpha = 2;
  c.use_extent = false;
  c.first_groups = 0;
  c.min_groups = 2;
  c.flat_below_groups = 4;
  SelectConfig sel{64, 0, 0};  // 4 slots: 2 groups kept of 9-12
  const int cap = select_capacity(sel, 16, t.max_blocks());
  SelectionBuf two(B, Hkv, cap);
  two_level_select(t, s, ps, c, sel, two);
  for (auto [b, page] : t.relevant)
    for (int g = 0; g < Hkv; ++g) {
      const auto got = two.of(b, g, Hkv);
      EXPECT_NE(std::find(got.begin(), got.end(), page), got.end())
          << "seq " << b << " relevant page " << page << " kv head " << g;
    }
  // With flat_below_groups above every sequence's group count the step is flat LOCKS exactly.
  c.flat_below_groups = 100;
  SelectionBuf fb(B, Hkv, cap), flat(B, Hkv, cap);
  two_level_select(t, s, ps, c, sel, fb);
  const int M = t.max_blocks();
  std::vector<float> hs(size_t(B) * 8 * M), agg(size_t(B) * Hkv * M);
  SummaryStore& pages = ps;
  cpu::score_pages(pages.view(), t.bv(), t.qv(), t.scale(), hs.data());
  cpu::aggregate_gqa(hs.data(), t.bv(), 8, Hkv, agg.data());
  cpu::select_pages(agg.data(), t.bv(), Hkv, 16, sel, flat.sel);
  EXPECT_EQ(fb.pages, flat.pages);
  EXPECT_EQ(fb.counts, flat.counts);
}

}  // namespace
}  // namespace locks::test
