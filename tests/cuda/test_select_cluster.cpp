// The one-launch aggregation + selection (select_cluster.cu) against the separate
// aggregation and two-stage selection on the same head scores and scoring partials: the
// same group scores bit for bit, the same page lists and counts, for every cluster size
// that can hold the sequences, on exact ties (four score levels), continuous scores, top
// pages in a key bin of their own (the radix passes stop early), rows whose first radix
// pass settles on a bin of exactly 256 or 257 keys (the gather's cap: the keys gathered
// into every block, or the passes exchanged),
// budgets below / at / above the candidates, budgets that leave no slot, sequences longer
// than one selection chunk, the 16 x 4096-page maximum and untrusted lengths.
#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <memory>
#include <random>

#include "gpu_helpers.h"
#include "locks/cuda/decoder.h"
#include "locks/error.h"
#include "locks/select.h"
#include "select_rows.h"

namespace locks::cuda_test {
namespace {

struct ClusterCase {
  int Hkv, G;
  std::vector<int64_t> lens;  // -1: an untrusted length past the block-table row (M P + 3)
  SelectConfig sel;
  enum Scores {
    cont,
    ties,
    bands,
    narrow,
    cap256,
    cap257
  } scores;  // continuous; four levels (massive exact ties);
             // each row's top `slots` pages in a bin of their
             // own at the key's first or second digit (the
             // radix passes stop early, Threshold::bound);
             // head scores within 2^-16 of -9, so the group
             // scores differ only in their low bits (the radix
             // starts from the row's key range, v29);
             // capN: a third of the slots hot, N keys in the
             // first pass's boundary bin (distinct low bits),
             // the rest lower (the gather's cap, v36)
};

// The keys' order (common.cuh's float_key on the host).
uint32_t host_key(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// How many of the keys share the first radix pass's bin with the m-th largest (the pass
// from the keys' range, select_common.cuh's radix_start); 0 when every key is equal.
int first_pass_bin(const std::vector<uint32_t>& keys, int m) {
  uint32_t lo = ~0u, hi = 0u;
  for (uint32_t k : keys) lo = std::min(lo, k), hi = std::max(hi, k);
  if (lo == hi) return 0;
  int top = 31;
  while (!(((lo ^ hi) >> top) & 1u)) --top;
  const int shift = std::max(top - 7, 0);
  std::vector<int> bins(256, 0);
  for (uint32_t k : keys) ++bins[(k >> shift) & 255u];
  for (int b = 255, acc = 0; b >= 0; --b)
    if ((acc += bins[size_t(b)]) >= m) return bins[size_t(b)];
  return 0;
}

std::string name(const ClusterCase& c) {
  return "Hkv" + std::to_string(c.Hkv) + "_G" + std::to_string(c.G) + "_b" +
         std::to_string(c.sel.budget_tokens) +
         (c.sel.dense_below ? "_dense" + std::to_string(c.sel.dense_below) : "") +
         (c.scores == ClusterCase::ties     ? "_ties"
          : c.scores == ClusterCase::bands  ? "_bands"
          : c.scores == ClusterCase::narrow ? "_narrow"
          : c.scores == ClusterCase::cap256 ? "_cap256"
          : c.scores == ClusterCase::cap257 ? "_cap257"
                                            : "_cont");
}

struct Outputs {
  std::vector<float> gs;
  std::vector<int32_t> pages, counts;
};

Outputs download(const cuda::Decoder& dec, int B, int Hkv, int M) {
  Outputs o;
  const Selection s = dec.selection();
  o.gs.resize(size_t(B) * Hkv * M);
  o.pages.resize(size_t(B) * Hkv * s.capacity);
  o.counts.resize(size_t(B) * Hkv);
  CK(cudaMemcpy(o.gs.data(), dec.group_scores(), o.gs.size() * 4, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(o.pages.data(), s.pages, o.pages.size() * 4, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(o.counts.data(), s.counts, o.counts.size() * 4, cudaMemcpyDeviceToHost));
  return o;
}

class SelectClusterTest : public ::testing::TestWithParam<ClusterCase> {};

TEST_P(SelectClusterTest, MatchesSeparateLaunches) {
  SKIP_WITHOUT_GPU();
  const ClusterCase c = GetParam();
  const int P = 16, d = 64, Hq = c.Hkv * c.G, B = int(c.lens.size());
  int64_t M = 1;
  for (int64_t l : c.lens) M = std::max<int64_t>(M, (l + P - 1) / P);
  std::vector<int64_t> len64 = c.lens;
  for (auto& l : len64)
    if (l < 0) l = M * P + 3;
  // Block table: sequence b's page j at physical block b * M + j. Zero summaries (scoring
  // only provides the LSE partials; the head scores are then overwritten).
  const CacheLayout L{int64_t(B) * M, P, c.Hkv, d, DType::bf16};
  std::vector<int32_t> bt(size_t(B) * M), lens(static_cast<size_t>(B));
  for (size_t i = 0; i < bt.size(); ++i) bt[i] = int32_t(i);
  for (int b = 0; b < B; ++b) lens[size_t(b)] = int32_t(len64[size_t(b)]);
  DevBuf<int32_t> dbt(bt), dlens(lens);
  const BatchView db{dbt.p, M, dlens.p, B, int(M)};
  BatchView hb = db;
  hb.block_table = bt.data(), hb.seq_lens = lens.data();
  GpuSummaries summ(summary_layout_for(L, 8, Precision::quant));
  auto zero = [](auto& buf) {
    if (buf.n) CK(cudaMemset(buf.p, 0, buf.n * sizeof(*buf.p)));
  };
  zero(summ.mu_q), zero(summ.mu_scale), zero(summ.basis_q), zero(summ.basis_scale);
  zero(summ.coeff_q), zero(summ.coeff_scale);
  DevBuf<float> dq(random_queries(B, Hq, d, 1.0f, 3));

  // Head scores: -inf past each sequence's full pages, like scoring; equal across a group's
  // heads at the tie levels (so group scores tie exactly), independent otherwise.
  std::mt19937 rng(uint32_t(c.lens[0] + c.G));
  std::uniform_real_distribution<float> U(-12.0f, 2.0f);
  std::vector<float> hs(size_t(B) * Hq * M, -std::numeric_limits<float>::infinity());
  std::uniform_real_distribution<float> low(1.0f, 1.2f), high(1.5f, 1.503f);
  std::uniform_real_distribution<float> near(-9.0f, -9.0f + 1.0f / 65536);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < c.Hkv; ++h) {
      const int64_t full = std::min(M, len64[size_t(b)] / P);
      // bands: the rule's candidates and slots for this sequence (seq_rule), `slots` of the
      // candidates hot, in [64, 127) over [-12, 2) (first digit) or in [1.5, 1.503) over
      // [1, 1.2) (second digit), alternating by row; equal across the group's heads.
      const test::SeqRule r = test::seq_rule(len64[size_t(b)], P, c.sel);
      const bool first = (b + h) % 2 == 0;
      for (int64_t j = 0; j < full; ++j) {
        const bool hot = j >= r.sink_end && j < r.recent_start && int(j - r.sink_end) % 3 == 0 &&
                         int(j - r.sink_end) / 3 < r.slots;
        const float tie = float(int(rng() % 4)) * 0.25f - 9.0f;
        const float band = first ? (hot ? 64.0f + 63.0f * (U(rng) + 12.0f) / 14.0f : U(rng))
                                 : (hot ? high(rng) : low(rng));
        // capN: candidates i < slots / 3 at 2, the next N at -2 + i 2^-18, the rest at
        // -6 - i 2^-18: the N keys differ only in low bits, under the first pass's window
        // (the 8 bits below the highest bit where the row's keys differ; checked below).
        const int n_cap = c.scores == ClusterCase::cap256 ? 256 : 257;
        const int i_cand = int(j - r.sink_end), hot_n = r.slots / 3;
        const float cap = i_cand < 0 || j >= r.recent_start ? -6.0f
                          : i_cand < hot_n                  ? 2.0f
                          : i_cand < hot_n + n_cap ? -2.0f + float(i_cand - hot_n) / 262144.0f
                                                   : -6.0f - float(i_cand) / 262144.0f;
        const bool capped = c.scores == ClusterCase::cap256 || c.scores == ClusterCase::cap257;
        for (int g = 0; g < c.G; ++g)
          hs[(size_t(b) * Hq + h * c.G + g) * M + j] = c.scores == ClusterCase::ties     ? tie
                                                       : c.scores == ClusterCase::bands  ? band
                                                       : c.scores == ClusterCase::narrow ? near(rng)
                                                       : capped                          ? cap
                                                                                         : U(rng);
      }
    }

  auto run = [&](int cluster, bool fused) {
    cuda::Plan plan{L, Hq, B, int(M), DecodeConfig{c.sel, 0.0f}};
    plan.select_cluster = cluster;
    auto dec = std::make_unique<cuda::Decoder>(plan);
    dec->score(summ.view(), db, QueryView{dq.p, Hq}, nullptr);  // the LSE partials
    CK(cudaMemcpy(const_cast<float*>(dec->head_scores()), hs.data(), hs.size() * 4,
                  cudaMemcpyHostToDevice));
    const Selection s = dec->selection();
    CK(cudaMemset(s.pages, 0x7f, size_t(B) * c.Hkv * s.capacity * 4));
    CK(cudaMemset(const_cast<float*>(dec->group_scores()), 0x7f, hs.size() / c.G * 4));
    if (fused)
      dec->aggregate_select(db, nullptr);
    else
      dec->aggregate(db, nullptr), dec->select(db, nullptr);
    CK(cudaDeviceSynchronize());
    EXPECT_EQ(dec->select_cluster(), fused ? cluster : 0);
    return download(*dec, B, c.Hkv, int(M));
  };
  const Outputs ref = run(-1, false);
  // The separate path agrees with the CPU selection on its own group scores, sequence by
  // sequence (the CPU refuses untrusted lengths; the GPU gives those rows no page).
  const int cap = int(ref.pages.size() / ref.counts.size());
  for (int b = 0; b < B; ++b) {
    const size_t row = size_t(b) * c.Hkv;
    if (len64[size_t(b)] < 1 || len64[size_t(b)] > M * P) {
      for (int h = 0; h < c.Hkv; ++h) {
        EXPECT_EQ(ref.counts[row + h], 0) << "untrusted length, sequence " << b;
        for (int i = 0; i < cap; ++i) EXPECT_EQ(ref.pages[(row + h) * cap + i], -1);
      }
      continue;
    }
    BatchView one = hb;
    one.block_table = bt.data() + size_t(b) * M, one.seq_lens = lens.data() + b;
    one.batch_size = 1;
    std::vector<int32_t> cp(size_t(c.Hkv) * cap), cc(size_t(c.Hkv));
    cpu::select_pages(ref.gs.data() + row * M, one, c.Hkv, P, c.sel,
                      Selection{cp.data(), cc.data(), cap});
    ASSERT_EQ(std::vector<int32_t>(ref.counts.begin() + row, ref.counts.begin() + row + c.Hkv), cc)
        << "sequence " << b;
    ASSERT_EQ(std::vector<int32_t>(ref.pages.begin() + row * cap,
                                   ref.pages.begin() + (row + c.Hkv) * cap),
              cp)
        << "sequence " << b;
  }
  // capN: the rows long enough for the pattern put exactly N keys in the first pass's bin.
  if (c.scores == ClusterCase::cap256 || c.scores == ClusterCase::cap257) {
    const int n_cap = c.scores == ClusterCase::cap256 ? 256 : 257;
    int patterned = 0;
    for (int b = 0; b < B; ++b) {
      const test::SeqRule r = test::seq_rule(len64[size_t(b)], P, c.sel);
      if (len64[size_t(b)] > M * P || r.recent_start - r.sink_end < r.slots / 3 + n_cap + 8)
        continue;
      for (int h = 0; h < c.Hkv; ++h) {
        std::vector<uint32_t> keys;
        for (int j = r.sink_end; j < r.recent_start; ++j)
          keys.push_back(host_key(ref.gs[(size_t(b) * c.Hkv + h) * M + size_t(j)]));
        EXPECT_EQ(first_pass_bin(keys, r.slots), n_cap) << "sequence " << b << " head " << h;
        ++patterned;
      }
    }
    EXPECT_GT(patterned, 0);
  }
  int tried = 0;
  for (int cs = 1; cs <= 16; cs *= 2) {
    if (int64_t(cs) * 4096 < M) continue;
    SCOPED_TRACE("cluster " + std::to_string(cs));
    const Outputs got = run(cs, true);
    ASSERT_EQ(0, std::memcmp(got.gs.data(), ref.gs.data(), got.gs.size() * 4))
        << "group scores differ";
    EXPECT_EQ(got.counts, ref.counts);
    EXPECT_EQ(got.pages, ref.pages);
    ++tried;
  }
  EXPECT_GT(tried, 0);
}

const std::vector<int64_t> kShort = {16 * 1200 + 9, 16 * 300, 1, 15,
                                     16 * 50 + 7,   0,        -1};  // 0, -1: untrusted
const std::vector<int64_t> kLong = {16 * 9000 + 5, 16 * 4097, 16 * 4096, 300};

INSTANTIATE_TEST_SUITE_P(
    Shapes, SelectClusterTest,
    ::testing::Values(
        ClusterCase{2, 4, kLong, {1024, 2, 3}, ClusterCase::ties},
        ClusterCase{2, 4, kLong, {1024, 2, 3}, ClusterCase::cont},
        ClusterCase{2, 4, kLong, {1024, 2, 3}, ClusterCase::bands},
        ClusterCase{1, 16, kShort, {512, 1, 2}, ClusterCase::ties},
        ClusterCase{1, 16, kShort, {512, 1, 2}, ClusterCase::cont},
        ClusterCase{1, 16, kShort, {512, 1, 2}, ClusterCase::bands},
        ClusterCase{1, 16, kShort, {512, 1, 2}, ClusterCase::narrow},
        ClusterCase{2, 4, kLong, {1024, 2, 3}, ClusterCase::narrow},
        ClusterCase{2, 4, kLong, {1024, 2, 3}, ClusterCase::cap256},
        ClusterCase{2, 4, kLong, {1024, 2, 3}, ClusterCase::cap257},
        ClusterCase{1, 16, kLong, {4096, 1, 2}, ClusterCase::cap256},
        ClusterCase{4, 1, kShort, {2048, 0, 0}, ClusterCase::cont},
        ClusterCase{1, 32, kShort, {16 * 140, 1, 1}, ClusterCase::ties},
        ClusterCase{3, 7, kShort, {48, 1, 1}, ClusterCase::cont},         // no slot left
        ClusterCase{2, 3, kShort, {16 * 4000, 1, 2}, ClusterCase::cont},  // all
        ClusterCase{1, 8, {16 * 65536, 16 * 3000 + 1}, {2048, 1, 2}, ClusterCase::ties},
        ClusterCase{1, 8, {16 * 65536 - 5}, {2048, 1, 2}, ClusterCase::cont},
        ClusterCase{1, 8, {16 * 65536 - 5, 16 * 3000}, {2048, 1, 2}, ClusterCase::bands},
        // dense_below: the rows shorter than 16 * 1200 + 9 tokens keep every page, the
        // longest selects (a minimum context above the budget, capacity 1201 pages)
        ClusterCase{2, 4, kShort, {512, 1, 2, 0.0f, 1, 16 * 1200 + 9}, ClusterCase::cont},
        ClusterCase{1, 8, kLong, {2048, 1, 2, 0.0f, 1, 16 * 4097}, ClusterCase::bands}),
    [](const ::testing::TestParamInfo<ClusterCase>& i) {
      return name(i.param) + "_" + std::to_string(i.index);
    });

// The plan's rule and its checks: clusters only where they hold the sequences and fit, never
// with the adaptive budget; forced sizes that cannot work are refused with a clear error.
TEST(SelectClusterPlan, RuleAndRefusals) {
  SKIP_WITHOUT_GPU();
  const CacheLayout L{1 << 20, 16, 8, 128, DType::bf16};
  auto plan = [&](int B, int M, int forced, float tau) {
    DecodeParams p;
    p.cache = L;
    p.summary = summary_layout_for(L, 8, Precision::quant);
    p.num_q_heads = 32, p.max_batch = B, p.max_blocks_per_seq = M;
    p.select = SelectConfig{2048, 1, 2};
    p.select.tau = tau;
    p.select_cluster = forced;
    return cuda::plan_decode(p);
  };
  EXPECT_GT(plan(1, 8192, 0, 0.0f).select_cluster, 0);      // 128K batch 1
  EXPECT_EQ(plan(1, 8192, -1, 0.0f).select_cluster, 0);     // never
  EXPECT_EQ(plan(1, 8192, 0, 0.9f).select_cluster, 0);      // adaptive: two stages
  EXPECT_EQ(plan(1, 65536, 0, 0.0f).select_cluster, 16);    // 1M: 16 blocks (not fused)
  EXPECT_EQ(plan(8, 65536, 0, 0.0f).select_cluster, 0);     // 64 rows x 16: two stages
  EXPECT_THROW(plan(1, 65537, 16, 0.0f), InvalidArgument);  // over 16 x 4096 pages
  EXPECT_EQ(plan(32, 8192, 0, 0.0f).select_cluster, 0);     // 256 rows: a large grid
  EXPECT_EQ(plan(1, 8192, 4, 0.0f).select_cluster, 4);      // forced
  EXPECT_THROW(plan(1, 8192, 1, 0.0f), InvalidArgument);    // 1 x 4096 < 8192 pages
  EXPECT_THROW(plan(1, 8192, 3, 0.0f), InvalidArgument);    // not a power of two
  EXPECT_THROW(plan(1, 8192, 32, 0.0f), InvalidArgument);   // over 16
  EXPECT_THROW(plan(1, 8192, 4, 0.5f), InvalidArgument);    // forced with tau
  // 16 blocks past 8 (v31) where a block of 8 would hold >= 4096 pages (within a wave), or
  // >= 2048 at G >= 8 (within half a wave).
  int dev = 0, sms = 0;
  CK(cudaGetDevice(&dev));
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  auto plan_g = [&](int kv_heads, int B, int M) {  // 32 query heads: G = 32 / kv_heads
    const CacheLayout Lg{1 << 20, 16, kv_heads, 128, DType::bf16};
    DecodeParams p;
    p.cache = Lg;
    p.summary = summary_layout_for(Lg, 8, Precision::quant);
    p.num_q_heads = 32, p.max_batch = B, p.max_blocks_per_seq = M;
    p.select = SelectConfig{2048, 1, 2};
    return cuda::plan_decode(p).select_cluster;
  };
  if (sms >= 128) {                      // (the H200's 132)
    EXPECT_EQ(plan_g(8, 1, 16384), 8);   // G 4, 256K: 2048 pages a block
    EXPECT_EQ(plan_g(8, 1, 32768), 16);  // G 4, 512K: 4096 pages a block, 8 rows
    EXPECT_EQ(plan_g(8, 2, 32768), 8);   // 16 rows x 16 blocks: more than a wave
    EXPECT_EQ(plan_g(2, 1, 16384), 16);  // G 16 (GLM-4-9B), 256K
    EXPECT_EQ(plan_g(2, 1, 8192), 8);    // G 16, 128K: 1024 pages a block
    EXPECT_EQ(plan_g(4, 1, 16384), 16);  // G 8, 256K, 4 rows
    EXPECT_EQ(plan_g(4, 2, 16384), 8);   // G 8, 256K, 8 rows: more than half a wave
  }
}

}  // namespace
}  // namespace locks::cuda_test
