// Two-level LOCKS (super_summary.h) on the CPU: the super summary's stored invariants, the
// level-1 scores against the float64 reference, the kept-groups rule and its guards, the
// masked level-2 scoring, and the whole two-level selection on planted relevance.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>

#include "locks/contract.h"
#include "locks/error.h"
#include "locks/reference.h"
#include "locks/super_summary.h"
#include "plan_mutation.h"
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
  const TwoLevelConfig cfg;  // alpha 40: 1.25 groups per page slot
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
  c.min_groups = 4;
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
  // m + forced >= C -> flat: 17 groups, m 16, first group forced.
  EXPECT_EQ(groups_kept(c, sel, P, S, 17 * 256), -1);
  c.first_groups = 0;
  EXPECT_EQ(groups_kept(c, sel, P, S, 17 * 256), 16);
  c.first_groups = 1;
  // Budget >= length -> every page (the caller's selects_all case).
  EXPECT_EQ(groups_kept(c, sel, P, S, 2048), -1);
}

TEST(SuperRule, ForcedGroupsAreTheUnionOfFirstSinkAndRecent) {
  TwoLevelConfig c;
  c.first_groups = 1;
  const int P = 16, S = 4;
  const int64_t len = 16 * 4 * 10 + 16 * 2 + 5;  // 42 full pages: 10 groups, open 2 + tail
  ForcedGroups f = forced_groups(c, {512, 0, 0}, P, S, len);
  EXPECT_EQ(f.complete, 10);
  EXPECT_EQ(f.first_end, 1);
  EXPECT_EQ(f.recent_begin, 10);
  EXPECT_EQ(f.count, 1);
  f = forced_groups(c, {512, 6, 0}, P, S, len);  // sink pages 0-5: groups 0, 1
  EXPECT_EQ(f.first_end, 2);
  EXPECT_EQ(f.count, 2);
  f = forced_groups(c, {512, 0, 2}, P, S, len);  // recent pages 40, 41: the open group
  EXPECT_EQ(f.recent_begin, 10);
  EXPECT_EQ(f.count, 1);
  f = forced_groups(c, {512, 0, 7}, P, S, len);  // recent 35-41: groups 8, 9
  EXPECT_EQ(f.recent_begin, 8);
  EXPECT_EQ(f.count, 3);
  c.first_groups = 9;  // overlapping ranges count once
  f = forced_groups(c, {512, 0, 7}, P, S, len);
  EXPECT_EQ(f.count, 10);
  for (int sink : {0, 1, 5, 9})
    for (int recent : {0, 1, 4, 5, 9})
      for (int first : {0, 1, 3}) {
        c.first_groups = first;
        int most = 0;
        for (int64_t l = 1; l < 16 * 4 * 12; l += 7)
          most = std::max(most, forced_groups(c, {512, sink, recent}, P, S, l).count);
        EXPECT_LE(most, forced_groups_max(c, {512, sink, recent}, S));
      }
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

// The decode-time update: with a batch whose lengths end on a group edge (sequence 1: 9
// complete groups of S 4 exactly) the group the last token completed is built into its table
// slot, equal to the bulk build; a sequence mid-group (sequence 0) writes nothing; a wider
// `appended` reaches back over sequence 0's last edge; bad lengths are refused.
TEST(SuperBuild, FilledBuildsTheCompletedGroup) {
  TestCache t = make_cache(long_spec(true, 6));
  Supers ref = build_supers(t, 4, 3, true);
  SuperStore out(ref.store->layout());
  SuperView ov = out.view();
  const size_t gh = size_t(ov.layout.num_slots) * ov.layout.num_kv_heads;
  std::fill(ov.mu_scale, ov.mu_scale + gh, -1.0f);  // "not written" marker
  const SuperTableView tv = ref.view();
  cpu::super_build_filled(t.view(), t.bv(), 1, tv, ov);
  const int H = t.spec.num_kv_heads, d = t.spec.head_dim;
  const SuperView rv = ref.store->view();
  for (int64_t slot = 0; slot < ov.layout.num_slots; ++slot) {
    const bool want = slot == ref.table[size_t(1) * ref.max_groups + 8];  // sequence 1, group 8
    for (int h = 0; h < H; ++h) {
      const int64_t i = slot * H + h;
      ASSERT_EQ(ov.mu_scale[i] != -1.0f, want) << "slot " << slot;
      if (!want) continue;
      EXPECT_EQ(ov.mu_scale[i], rv.mu_scale[i]);
      EXPECT_TRUE(std::equal(ov.mu_q + i * d, ov.mu_q + (i + 1) * d, rv.mu_q + i * d));
      EXPECT_TRUE(std::equal(ov.basis_q + i * 3 * d / 2, ov.basis_q + (i + 1) * 3 * d / 2,
                             rv.basis_q + i * 3 * d / 2));
      EXPECT_TRUE(std::equal(ov.hi_q + i * 4 * 3, ov.hi_q + (i + 1) * 4 * 3, rv.hi_q + i * 4 * 3));
    }
  }
  // Sequence 0 has 12 groups and 37 more tokens: appended 38 crosses the edge of group 11.
  cpu::super_build_filled(t.view(), t.bv(), 38, tv, ov);
  EXPECT_NE(ov.mu_scale[ref.table[11] * H], -1.0f);
  EXPECT_THROW(cpu::super_build_filled(t.view(), t.bv(), 0, tv, ov), InvalidArgument);
  EXPECT_THROW(cpu::super_build_filled(t.view(), t.bv(), 65, tv, ov), InvalidArgument);
  const SuperTableView narrow{tv.table, tv.stride, tv.max_groups_per_seq - 10};
  EXPECT_THROW(cpu::super_build_filled(t.view(), t.bv(), 1, narrow, ov), InvalidArgument);
  std::vector<int32_t> lens(t.bv().seq_lens, t.bv().seq_lens + t.bv().batch_size);
  lens[0] = 1 << 30;
  BatchView bad = t.bv();
  bad.seq_lens = lens.data();
  EXPECT_THROW(cpu::super_build_filled(t.view(), bad, 1, tv, ov), InvalidArgument);
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
              // The forced groups plus exactly m others: the same count on every KV head.
              EXPECT_EQ(kept, mk + forced_groups(c, sel, 16, 4, len).count);
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

// The list form of the group choice: the mask's pages in ascending order, one count per
// sequence, the tail kept partial in list_lens; cpu against the float64 reference.
TEST(SelectGroupsList, IsTheMaskAsAnAscendingList) {
  CacheSpec sp = long_spec(false, 21);
  sp.seq_lens = {16 * 4 * 12 + 37, 16 * 4 * 9, 16 * 5 + 3, 16 * 4 * 10 + 16};
  TestCache t = make_cache(sp);
  const int B = t.bv().batch_size, Hq = 8, Hkv = 2, MG = (t.max_blocks() + 3) / 4;
  const int M = t.max_blocks();
  Rng rng(22);
  std::vector<float> gs(size_t(B) * Hq * MG);
  for (auto& x : gs) x = 3.0f * rng.normal();
  for (int i = 0; i < 40; ++i) gs[size_t(rng.integer(0, int(gs.size()) - 1))] = 1.0f;  // ties
  std::vector<double> gs64(gs.begin(), gs.end());
  std::vector<int32_t> table(size_t(B) * MG, 0);
  const SuperTableView tv{table.data(), MG, MG};
  TwoLevelConfig c;
  c.min_groups = 2;
  c.alpha = 1.0;
  c.flat_below_groups = 3;
  for (int first : {0, 1, 2})
    for (int sink : {0, 1, 5})
      for (int recent : {0, 2, 6})
        for (int budget : {64, 128, 200, 4000}) {
          c.first_groups = first;
          const SelectConfig sel{budget, sink, recent};
          if (budget / 16 < sink + recent + 1) continue;
          const int L = two_level_list_capacity(c, sel, 16, 4, M);
          std::vector<uint8_t> mask(size_t(B) * Hkv * M);
          cpu::select_groups(gs.data(), tv, t.bv(), Hq, Hkv, 16, 4, sel, c, mask.data());
          std::vector<int32_t> map(size_t(B) * Hkv * L, 7), lens(B, 7), rmap(map.size(), 9),
              rlens(B, 9);
          cpu::select_groups_list(gs.data(), tv, t.bv(), Hq, Hkv, 16, 4, sel, c, L, map.data(),
                                  lens.data());
          ref::select_groups_list(gs64.data(), tv, t.bv(), Hq, Hkv, 16, 4, sel, c, L, rmap.data(),
                                  rlens.data());
          EXPECT_EQ(map, rmap) << first << " " << sink << " " << recent << " " << budget;
          EXPECT_EQ(lens, rlens);
          for (int b = 0; b < B; ++b) {
            const int len = t.bv().seq_lens[b], n_pages = (len + 15) / 16;
            int listed = -1;
            for (int g = 0; g < Hkv; ++g) {
              std::vector<int32_t> want;
              for (int j = 0; j < M; ++j)
                if (mask[(size_t(b) * Hkv + g) * M + j]) want.push_back(j);
              want.resize(size_t(L), -1);
              const int32_t* row = map.data() + (size_t(b) * Hkv + g) * L;
              EXPECT_EQ(std::vector<int32_t>(row, row + L), want);
              const int n = int(std::count_if(row, row + L, [](int32_t x) { return x >= 0; }));
              if (listed >= 0) EXPECT_EQ(n, listed) << "KV heads list the same count";
              listed = n;
            }
            EXPECT_EQ(lens[b], len - (n_pages - listed) * 16);
          }
        }
  // A list_cap too small for a sequence: refused before anything is written.
  const SelectConfig sel{64, 0, 0};
  std::vector<int32_t> map(size_t(B) * Hkv * 8, 5), lens(B, 5);
  EXPECT_THROW(cpu::select_groups_list(gs.data(), tv, t.bv(), Hq, Hkv, 16, 4, sel, c, 8, map.data(),
                                       lens.data()),
               InvalidArgument);
  EXPECT_EQ(lens, std::vector<int32_t>(B, 5));
}

// decode_two_level (list positions) selects what the mask path selects, and attends over it.
struct TwoLevelCase {
  TestCache t;
  Supers s;
  SummaryStore ps;
  explicit TwoLevelCase(const CacheSpec& sp)
      : t(make_cache(sp)),
        s(build_supers(t, 4, 4, true)),
        ps(build_summaries(t, 8, Precision::quant)) {}
};

DecodeParams two_level_params(const TwoLevelCase& k, const TwoLevelConfig& c,
                              const SelectConfig& sel) {
  DecodeParams p;
  p.cache = k.t.layout();
  p.summary = k.ps.layout();
  p.num_q_heads = k.t.spec.num_q_heads;
  p.max_batch = k.t.bv().batch_size;
  p.max_blocks_per_seq = k.t.max_blocks();
  p.select = sel;
  p.two_level = true;
  p.two = c;
  p.super = k.s.store->layout();
  return p;
}

void expect_decode_two_level_equals_mask_path(TwoLevelCase& k, const TwoLevelConfig& c,
                                              const SelectConfig& sel, const char* what) {
  const TestCache& t = k.t;
  const int B = t.bv().batch_size, Hq = t.spec.num_q_heads, Hkv = t.spec.num_kv_heads;
  const int M = t.max_blocks(), d = t.spec.head_dim;
  const DecodePlan plan = cpu::plan_decode(two_level_params(k, c, sel));
  // The mask path, op by op.
  std::vector<float> gh(size_t(B) * Hq * k.s.max_groups), hs(size_t(B) * Hq * M),
      agg(size_t(B) * Hkv * M);
  std::vector<uint8_t> mask(size_t(B) * Hkv * M);
  cpu::super_score(k.s.store->view(), k.s.view(), t.bv(), t.qv(), t.scale(), c, gh.data());
  cpu::select_groups(gh.data(), k.s.view(), t.bv(), Hq, Hkv, 16, k.s.store->layout().group_pages,
                     sel, c, mask.data());
  cpu::score_pages_masked(k.ps.view(), t.bv(), t.qv(), t.scale(), mask.data(), hs.data());
  cpu::aggregate_gqa(hs.data(), t.bv(), Hq, Hkv, agg.data());
  SelectionBuf want(B, Hkv, plan.capacity), got(B, Hkv, plan.capacity);
  cpu::select_pages(agg.data(), t.bv(), Hkv, 16, sel, want.sel);
  std::vector<std::byte> ws(plan.workspace_bytes + 256);
  void* base =
      reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(ws.data()) + 255) & ~uintptr_t(255));
  std::vector<float> out(size_t(B) * Hq * d), lse(size_t(B) * Hq), out2(out.size()),
      lse2(lse.size());
  cpu::decode_two_level(plan, {base, plan.workspace_bytes}, t.view(), k.ps.view(),
                        k.s.store->view(), k.s.view(), t.bv(), t.qv(), {out.data(), lse.data()},
                        &got.sel);
  EXPECT_EQ(got.counts, want.counts) << what;
  EXPECT_EQ(got.pages, want.pages) << what;
  // The attention is the sparse attention over that selection, bit for bit.
  cpu::decode_attention_sparse(t.view(), t.bv(), t.qv(), t.scale(), want.sel,
                               {out2.data(), lse2.data()});
  EXPECT_EQ(out, out2) << what;
  EXPECT_EQ(lse, lse2) << what;
}

TEST(DecodeTwoLevel, SelectionEqualsTheMaskPath) {
  for (bool structured : {false, true}) {
    CacheSpec sp = long_spec(structured, 30);
    // Ragged: two-level sequences, a short one (flat fallback), one ending on a page edge.
    sp.seq_lens = {16 * 4 * 12 + 37, 16 * 4 * 9, 16 * 3 + 5, 16 * 4 * 10 + 16};
    TwoLevelCase k(sp);
    TwoLevelConfig c;
    c.min_groups = 2;
    c.alpha = 1.0;
    c.flat_below_groups = 3;
    for (int first : {0, 1})
      for (int sink : {0, 1, 5})
        for (int recent : {0, 2, 6})
          for (int budget : {96, 160, 4000}) {
            c.first_groups = first;
            const SelectConfig sel{budget, sink, recent};
            const int k_slots = budget / 16;
            if (k_slots < sink + recent + 1) continue;
            if (first == 0 && sink == 0 && std::max(2, (k_slots + 3) / 4) * 4 <= k_slots)
              continue;  // refused by the plan (tested below)
            const std::string what = std::to_string(structured) + " f" + std::to_string(first) +
                                     " s" + std::to_string(sink) + " r" + std::to_string(recent) +
                                     " b" + std::to_string(budget);
            expect_decode_two_level_equals_mask_path(k, c, sel, what.c_str());
          }
    // Every mode of level 1.
    c.first_groups = 1;
    for (int mode = 0; mode < 3; ++mode) {
      c.use_extent = mode != 0;
      c.mix = mode == 2;
      c.agg = mode == 1 ? GroupAgg::max : GroupAgg::lse;
      expect_decode_two_level_equals_mask_path(k, c, {128, 1, 2}, "modes");
    }
  }
}

TEST(DecodeTwoLevel, PlanChecksAndIntsRoundTrip) {
  CacheSpec sp = long_spec(false, 31);
  TwoLevelCase k(sp);
  TwoLevelConfig c;
  c.min_groups = 2;
  c.alpha = 1.0;
  const SelectConfig sel{128, 1, 2};
  DecodeParams p = two_level_params(k, c, sel);
  const DecodePlan plan = cpu::plan_decode(p);
  EXPECT_EQ(plan.list_cap,
            std::min(k.t.max_blocks(), (std::max(2 + forced_groups_max(c, sel, 4), 8) + 1) * 4));
  EXPECT_EQ(plan.max_groups, (k.t.max_blocks() + 3) / 4);
  const std::vector<int64_t> v = plan.to_ints();
  ASSERT_EQ(v.size(), DecodePlan::kNumInts);
  const DecodePlan back = DecodePlan::from_ints(v);
  EXPECT_EQ(back.to_ints(), v);
  EXPECT_TRUE(back.params.two_level);
  EXPECT_EQ(back.params.two.alpha, 1.0);
  EXPECT_EQ(back.page_map.offset, plan.page_map.offset);
  // A vector whose list_cap was changed is refused.
  bool changed = false;
  std::vector<int64_t> bad = v;
  for (size_t i = 4; i < bad.size() && !changed; ++i)
    if (bad[i] == plan.list_cap && bad[i + 1] == plan.max_groups) bad[i] += 1, changed = true;
  ASSERT_TRUE(changed);
  EXPECT_THROW(DecodePlan::from_ints(bad), InvalidArgument);
  // The adaptive budget is refused with two levels, and says why.
  DecodeParams q = p;
  q.select.tau = 0.5f;
  try {
    cpu::plan_decode(q);
    ADD_FAILURE() << "tau > 0 accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("tau"), std::string::npos) << e.what();
  }
  // A minimum context above the budget too (its short sequences would need every page in
  // the list); at the budget it changes nothing and is accepted.
  q = p;
  q.select.dense_below = q.select.budget_tokens + 1;
  try {
    cpu::plan_decode(q);
    ADD_FAILURE() << "dense_below > budget accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("dense_below"), std::string::npos) << e.what();
  }
  q.select.dense_below = q.select.budget_tokens;
  EXPECT_EQ(cpu::plan_decode(q).capacity, plan.capacity);
  q = p;
  q.super.head_dim = 64;
  EXPECT_THROW(cpu::plan_decode(q), InvalidArgument);
  q = p;
  q.two.first_groups = 0;
  q.select.sink_pages = 0;
  q.select.budget_tokens = 16 * 8;  // k 8, m = max(2, 2) = 2 groups = 8 pages: not > k
  EXPECT_THROW(cpu::plan_decode(q), InvalidArgument);
  // Run-time checks: a short super table, a plan without two levels.
  std::vector<std::byte> ws(plan.workspace_bytes + 256);
  void* base =
      reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(ws.data()) + 255) & ~uintptr_t(255));
  const Workspace w{base, plan.workspace_bytes};
  std::vector<float> out(size_t(2) * 8 * 32);
  SuperTableView short_table = k.s.view();
  short_table.max_groups_per_seq = plan.max_groups - 1;
  EXPECT_THROW(
      cpu::decode_two_level(plan, w, k.t.view(), k.ps.view(), k.s.store->view(), short_table,
                            k.t.bv(), k.t.qv(), {out.data(), nullptr}, nullptr),
      InvalidArgument);
  q = p;
  q.two_level = false;
  const DecodePlan flat = cpu::plan_decode(q);
  EXPECT_THROW(
      cpu::decode_two_level(flat, w, k.t.view(), k.ps.view(), k.s.store->view(), k.s.view(),
                            k.t.bv(), k.t.qv(), {out.data(), nullptr}, nullptr),
      InvalidArgument);
}

// Two-level plan vectors and super tables are caller input too (the torch operator
// decode_two_level takes both from Python): random edits of a valid two-level plan vector (one
// to three fields) and of the super table's slots are refused by from_ints or the run's checks
// with a locks::Error, leaving every output as it was, or run inside the caller's buffers,
// sized from what the accepted plan asks for (ASan + UBSan in CI: any access outside them
// fails), with a selection of ascending pages inside each sequence.
TEST(DecodeTwoLevel, PlanVectorAndTableMutationsAreRefusedOrRunInsideTheCallersBuffers) {
  TwoLevelCase k(long_spec(false, 32));
  TwoLevelConfig c;
  c.min_groups = 2;
  c.alpha = 1.0;
  const SelectConfig sel{128, 1, 2};
  const std::vector<int64_t> v0 = cpu::plan_decode(two_level_params(k, c, sel)).to_ints();
  const TestCache& t = k.t;
  const int B = t.bv().batch_size, Hq = t.spec.num_q_heads, H = t.spec.num_kv_heads;
  const int d = t.spec.head_dim;
  const int64_t slots = k.s.store->layout().num_slots;
  std::mt19937_64 rng(2024);
  int accepted = 0, ran = 0, refused_at_run = 0;
  for (int it = 0; it < 3000; ++it) {
    std::optional<DecodePlan> edited;
    std::vector<int32_t> table = k.s.table;
    if (it % 3 == 2) {  // the plan as planned, one slot of the super table edited
      edited = DecodePlan::from_ints(v0);
      int32_t& x = table[rng() % table.size()];
      const int64_t choices[] = {-2, -1, slots, slots + 1, int64_t(1) << 31 >> 1, x + 1};
      x = int32_t(choices[rng() % 6]);
    } else {
      edited = edited_plan(v0, rng);
    }
    if (!edited) continue;
    const DecodePlan& plan = *edited;
    ++accepted;
    if (!StepBuffers::fits(plan, B, H)) continue;
    StepBuffers buf(plan, B, Hq, H, d);
    const SuperTableView tv{table.data(), k.s.max_groups, k.s.max_groups};
    try {
      cpu::decode_two_level(plan, buf.ws, t.view(), k.ps.view(), k.s.store->view(), tv, t.bv(),
                            t.qv(), buf.output(), &buf.sel);
      ++ran;
      ASSERT_NO_FATAL_FAILURE(buf.expect_real_selection(t.bv(), H, t.spec.page_size));
      for (float x : buf.lse) ASSERT_TRUE(std::isfinite(x));
    } catch (const Error& e) {
      ++refused_at_run;
      SCOPED_TRACE(std::string("it ") + std::to_string(it) + ": " + e.what());
      ASSERT_NO_FATAL_FAILURE(buf.expect_untouched());
    }
  }
  std::printf(
      "two-level plan / table mutations: %d accepted by from_ints, %d ran, %d refused by "
      "the run\n",
      accepted, ran, refused_at_run);
  EXPECT_GT(accepted, 1000);
  EXPECT_GT(ran, 100);
  EXPECT_GT(refused_at_run, 100);
}

}  // namespace
}  // namespace locks::test
