// Issue #12 on the GPU: untrusted device-side values (docs/bad_input.md, "Device-side values
// (CUDA)"). For each kernel: block ids outside [0, num_blocks) (too large, negative), lengths
// outside [1, max_blocks_per_seq * P], selected page indices outside the sequence, counts
// outside [0, capacity], slots out of range. Every case must run without a fault
// (cudaDeviceSynchronize succeeds), give NaN attention rows exactly where the rule says, and
// leave every other row bit-identical to a clean run of the same batch.
#include <gtest/gtest.h>

#include <climits>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "gpu_helpers.h"
#include "locks/contract.h"

namespace locks {
namespace {

using cuda_test::DevBuf;
using cuda_test::GpuCache;
using cuda_test::GpuSummaries;

constexpr int P = 16, Hkv = 2, G = 4, Hq = Hkv * G, d = 128, NB = 64, B = 3;

struct Fixture {
  CacheLayout L{NB, P, Hkv, d, DType::bf16};
  GpuCache gc{L};
  DecodePlan plan;
  DevBuf<uint8_t> ws;
  std::vector<float> q;
  DevBuf<float> dq;
  int M = 0;

  explicit Fixture(Precision prec = Precision::quant) {
    gc.add_structured({300, 200, 400}, 11);  // 19 + 13 + 25 pages of 64 blocks
    M = gc.batch.view.max_blocks_per_seq;
    DecodeParams p;
    p.cache = L;
    p.summary = summary_layout_for(L, 8, prec);
    p.num_q_heads = Hq;
    p.max_batch = B;
    p.max_blocks_per_seq = M;
    p.select = SelectConfig{128, 0, 0};
    plan = cuda::plan_decode(p);
    ws = DevBuf<uint8_t>(plan.workspace_bytes);
    q = cuda_test::random_queries(B, Hq, d, 1.0f, 5);
    dq = DevBuf<float>(q);
  }
  Workspace wsv() { return Workspace{ws.p, ws.n}; }
  std::vector<int32_t> bt() const { return gc.batch.block_table; }
  std::vector<int32_t> lens() const { return gc.batch.seq_lens; }
  int64_t stride() const { return gc.batch.view.block_table_stride; }
  int n_pages(int b) const { return (gc.batch.seq_lens[size_t(b)] + P - 1) / P; }
};

// A batch view over host block table / lengths uploaded to the device.
struct DevBatch {
  DevBuf<int32_t> bt, sl;
  BatchView v;
  DevBatch(const Fixture& f, const std::vector<int32_t>& bt_h, const std::vector<int32_t>& sl_h)
      : bt(bt_h), sl(sl_h) {
    v = f.gc.batch.view;
    v.block_table = bt.p;
    v.seq_lens = sl.p;
  }
};

struct Rows {
  std::vector<float> out, lse;
};

Rows attend(Fixture& f, const std::vector<int32_t>& bt, const std::vector<int32_t>& sl,
            const std::vector<int32_t>* pages = nullptr,
            const std::vector<int32_t>* counts = nullptr) {
  DevBatch db(f, bt, sl);
  DevBuf<float> out(size_t(B) * Hq * d), lse(size_t(B) * Hq);
  out.poison();
  lse.poison();
  if (pages) {
    DevBuf<int32_t> dp(*pages), dc(*counts);
    cuda::decode_attention_sparse(f.plan, f.wsv(), f.gc.dview(), db.v, QueryView{f.dq.p, Hq},
                                  Selection{dp.p, dc.p, f.plan.capacity},
                                  AttentionOutput{out.p, lse.p}, nullptr);
    CK(cudaDeviceSynchronize());  // no fault
  } else {
    cuda::decode_attention_dense(f.plan, f.wsv(), f.gc.dview(), db.v, QueryView{f.dq.p, Hq},
                                 AttentionOutput{out.p, lse.p}, nullptr);
    CK(cudaDeviceSynchronize());
  }
  return {out.download(), lse.download()};
}

bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }

// nan_row(b, hq): whether the rule makes row (b, hq) NaN; all other rows bit-equal to clean.
template <typename F>
void expect_rows(const Rows& got, const Rows& clean, F nan_row) {
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < Hq; ++h) {
      const size_t r = size_t(b) * Hq + h;
      if (nan_row(b, h)) {
        EXPECT_TRUE(std::isnan(got.lse[r])) << "lse b " << b << " head " << h;
        for (int e = 0; e < d; ++e)
          ASSERT_TRUE(std::isnan(got.out[r * d + e])) << "b " << b << " head " << h << " dim " << e;
      } else {
        EXPECT_TRUE(same_bits(got.lse[r], clean.lse[r])) << "lse b " << b << " head " << h;
        for (int e = 0; e < d; ++e)
          ASSERT_TRUE(same_bits(got.out[r * d + e], clean.out[r * d + e]))
              << "b " << b << " head " << h << " dim " << e;
      }
    }
}

TEST(BadDeviceValues, DenseBlockIds) {
  SKIP_WITHOUT_GPU();
  Fixture f;
  const Rows clean = attend(f, f.bt(), f.lens());
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < Hq; ++h) ASSERT_FALSE(std::isnan(clean.lse[size_t(b) * Hq + h]));
  std::vector<int32_t> bt = f.bt();
  bt[size_t(1 * f.stride() + 4)] = NB + 1000;          // a used page of seq 1
  bt[size_t(2 * f.stride() + f.n_pages(2) - 1)] = -5;  // seq 2's last page
  for (int64_t j = f.n_pages(0); j < f.stride(); ++j)  // unused entries of seq 0: never read
    bt[size_t(j)] = INT_MAX;
  expect_rows(attend(f, bt, f.lens()), clean, [](int b, int) { return b == 1 || b == 2; });
}

TEST(BadDeviceValues, DenseLengths) {
  SKIP_WITHOUT_GPU();
  Fixture f;
  const Rows clean = attend(f, f.bt(), f.lens());
  for (int bad : {f.M * P + 1, f.M * P + 500, 0, -7, INT_MIN, INT_MAX}) {
    std::vector<int32_t> sl = f.lens();
    sl[1] = bad;
    expect_rows(attend(f, f.bt(), sl), clean, [](int b, int) { return b == 1; });
  }
  std::vector<int32_t> sl = f.lens();
  sl[2] = f.M * P;  // at capacity: valid (not NaN)
  const Rows full = attend(f, f.bt(), sl);
  for (int h = 0; h < Hq; ++h) EXPECT_FALSE(std::isnan(full.lse[size_t(2) * Hq + h]));
}

// Selection: head 0 takes pages 0..5, head 1 pages 6..11 of each sequence.
void make_selection(const Fixture& f, std::vector<int32_t>& pages, std::vector<int32_t>& counts) {
  const int cap = f.plan.capacity;
  ASSERT_GE(cap, 6);
  pages.assign(size_t(B) * Hkv * cap, -1);
  counts.assign(size_t(B) * Hkv, 6);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < Hkv; ++h)
      for (int i = 0; i < 6; ++i) pages[(size_t(b) * Hkv + h) * cap + i] = h * 6 + i;
}

TEST(BadDeviceValues, SparsePagesCountsBlocks) {
  SKIP_WITHOUT_GPU();
  Fixture f;
  const int cap = f.plan.capacity;
  std::vector<int32_t> pages, counts;
  make_selection(f, pages, counts);
  const Rows clean = attend(f, f.bt(), f.lens(), &pages, &counts);
  auto at = [&](int b, int h, int i) -> int32_t& {
    return pages[(size_t(b) * Hkv + h) * cap + size_t(i)];
  };
  {  // page index past the sequence (within and past the block-table row), negative
    std::vector<int32_t> p = pages;
    std::swap(p, pages);
    at(0, 1, 2) = 10'000;
    at(1, 0, 5) = f.n_pages(1);  // 13: inside the row (M 25) but not a page of seq 1
    at(2, 1, 0) = -3;
    const Rows got = attend(f, f.bt(), f.lens(), &pages, &counts);
    std::swap(p, pages);
    expect_rows(got, clean, [](int b, int h) {
      const int kv = h / G;
      return (b == 0 && kv == 1) || (b == 1 && kv == 0) || (b == 2 && kv == 1);
    });
  }
  {  // counts outside [0, capacity]
    std::vector<int32_t> c = counts;
    c[0 * Hkv + 0] = cap + 1;
    c[2 * Hkv + 1] = -1;
    c[1 * Hkv + 1] = INT_MAX;
    expect_rows(attend(f, f.bt(), f.lens(), &pages, &c), clean, [](int b, int h) {
      const int kv = h / G;
      return (b == 0 && kv == 0) || (b == 2 && kv == 1) || (b == 1 && kv == 1);
    });
  }
  {  // a bad block id only head 0 of seq 1 attends (page 3); seq 2: a page nobody selected
    std::vector<int32_t> bt = f.bt();
    bt[size_t(1 * f.stride() + 3)] = NB;
    bt[size_t(2 * f.stride() + 20)] = -1;
    expect_rows(attend(f, bt, f.lens(), &pages, &counts), clean,
                [](int b, int h) { return b == 1 && h / G == 0; });
  }
  {  // an invalid length: the whole row
    std::vector<int32_t> sl = f.lens();
    sl[0] = f.M * P + 1;
    expect_rows(attend(f, f.bt(), sl, &pages, &counts), clean, [](int b, int) { return b == 0; });
  }
}

// Scoring: an invalid block id scores -inf for that page (every query head), an invalid length
// scores no page; everything else bit-identical.
void scoring_case(Precision prec) {
  Fixture f(prec);
  GpuSummaries gs(f.plan.params.summary);
  const std::vector<int32_t> ids = f.gc.full_blocks();
  DevBuf<int32_t> dids(ids);
  cuda::summary_build(f.gc.dview(), dids.p, int64_t(ids.size()), gs.view(), nullptr);
  auto score = [&](const std::vector<int32_t>& bt, const std::vector<int32_t>& sl) {
    DevBatch db(f, bt, sl);
    DevBuf<float> hs(size_t(B) * Hq * f.M);
    hs.poison();
    cuda::score_pages(f.plan, f.wsv(), gs.view(), db.v, QueryView{f.dq.p, Hq}, hs.p, nullptr);
    CK(cudaDeviceSynchronize());
    return hs.download();
  };
  const std::vector<float> clean = score(f.bt(), f.lens());
  std::vector<int32_t> bt = f.bt(), sl = f.lens();
  bt[size_t(1 * f.stride() + 2)] = NB + 7;
  bt[size_t(2 * f.stride() + 9)] = -2;
  sl[0] = f.M * P + 16;
  const std::vector<float> got = score(bt, sl);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < Hq; ++h)
      for (int j = 0; j < f.M; ++j) {
        const size_t i = (size_t(b) * Hq + h) * f.M + j;
        const bool neg = b == 0 || (b == 1 && j == 2) || (b == 2 && j == 9);
        if (neg)
          ASSERT_EQ(got[i], -INFINITY) << "b " << b << " head " << h << " page " << j;
        else
          ASSERT_TRUE(same_bits(got[i], clean[i])) << "b " << b << " head " << h << " page " << j;
      }
}

TEST(BadDeviceValues, ScoringQuant) {
  SKIP_WITHOUT_GPU();
  scoring_case(Precision::quant);
}

TEST(BadDeviceValues, ScoringFp32) {
  SKIP_WITHOUT_GPU();
  scoring_case(Precision::fp32);
}

// The whole step: an invalid length gives count 0 and NaN rows; an invalid block id is never
// selected (its score is -inf) and the sequence's output stays finite; other rows unchanged.
TEST(BadDeviceValues, DecodeStep) {
  SKIP_WITHOUT_GPU();
  Fixture f;
  GpuSummaries gs(f.plan.params.summary);
  const std::vector<int32_t> ids = f.gc.full_blocks();
  DevBuf<int32_t> dids(ids);
  cuda::summary_build(f.gc.dview(), dids.p, int64_t(ids.size()), gs.view(), nullptr);
  const int cap = f.plan.capacity;
  auto step = [&](const std::vector<int32_t>& bt, const std::vector<int32_t>& sl,
                  std::vector<int32_t>& pages, std::vector<int32_t>& counts) {
    DevBatch db(f, bt, sl);
    DevBuf<float> out(size_t(B) * Hq * d), lse(size_t(B) * Hq);
    DevBuf<int32_t> dp(size_t(B) * Hkv * cap), dc(size_t(B) * Hkv);
    const Selection sel{dp.p, dc.p, cap};
    cuda::decode(f.plan, f.wsv(), f.gc.dview(), gs.view(), db.v, QueryView{f.dq.p, Hq},
                 AttentionOutput{out.p, lse.p}, &sel, nullptr);
    CK(cudaDeviceSynchronize());
    pages = dp.download();
    counts = dc.download();
    return Rows{out.download(), lse.download()};
  };
  std::vector<int32_t> cp, cc, p, c;
  const Rows clean = step(f.bt(), f.lens(), cp, cc);
  std::vector<int32_t> bt = f.bt(), sl = f.lens();
  sl[0] = -1;
  const int bad_page = 5;
  bt[size_t(2 * f.stride() + bad_page)] = NB + 3;
  const Rows got = step(bt, sl, p, c);
  for (int h = 0; h < Hkv; ++h) {
    EXPECT_EQ(c[size_t(0 * Hkv + h)], 0);
    const int n = c[size_t(2 * Hkv + h)];
    ASSERT_GT(n, 0);
    for (int i = 0; i < n; ++i) EXPECT_NE(p[(size_t(2) * Hkv + h) * cap + i], bad_page);
  }
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < Hq; ++h) {
      const size_t r = size_t(b) * Hq + h;
      if (b == 0)
        EXPECT_TRUE(std::isnan(got.lse[r]));
      else if (b == 1)
        EXPECT_TRUE(same_bits(got.lse[r], clean.lse[r]));
      else
        EXPECT_TRUE(std::isfinite(got.lse[r]));
    }
  for (int e = 0; e < Hq * d; ++e) {
    ASSERT_TRUE(std::isnan(got.out[size_t(e)]));
    ASSERT_TRUE(same_bits(got.out[size_t(Hq) * d + e], clean.out[size_t(Hq) * d + e]));
  }
}

// Summary builds: invalid block ids / lengths / slots are skipped (nothing written); the result
// equals a build of the valid items alone, starting from the same (poisoned) arrays.
std::vector<uint8_t> dump(const GpuSummaries& s) {
  std::vector<uint8_t> all;
  auto add = [&](const auto& buf) {
    if (!buf.p) return;
    const auto h = buf.download();
    const auto* bytes = reinterpret_cast<const uint8_t*>(h.data());
    all.insert(all.end(), bytes, bytes + h.size() * sizeof(h[0]));
  };
  add(s.mu), add(s.basis), add(s.coeff), add(s.mu_q), add(s.mu_scale), add(s.basis_q);
  add(s.basis_scale), add(s.coeff_q), add(s.coeff_scale);
  return all;
}

void poison_all(GpuSummaries& s) {
  auto p = [](auto& buf) {
    if (buf.p) buf.poison();
  };
  p(s.mu), p(s.basis), p(s.coeff), p(s.mu_q), p(s.mu_scale), p(s.basis_q), p(s.basis_scale);
  p(s.coeff_q), p(s.coeff_scale);
}

TEST(BadDeviceValues, SummaryBuilds) {
  SKIP_WITHOUT_GPU();
  for (Precision prec : {Precision::quant, Precision::fp32}) {
    Fixture f(prec);
    const SummaryLayout SL = f.plan.params.summary;
    GpuSummaries a(SL), b(SL);
    const int32_t x = f.gc.batch.block_table[0], y = f.gc.batch.block_table[1];
    auto bulk = [&](GpuSummaries& s, const std::vector<int32_t>& ids) {
      DevBuf<int32_t> d_ids(ids);
      cuda::summary_build(f.gc.dview(), d_ids.p, int64_t(ids.size()), s.view(), nullptr);
      CK(cudaDeviceSynchronize());
    };
    poison_all(a), poison_all(b);
    bulk(a, {x, NB, -1, INT_MAX, INT_MIN, y, NB + 100});
    bulk(b, {x, y});
    EXPECT_EQ(dump(a), dump(b)) << "bulk build";

    auto slots = [&](GpuSummaries& s, const std::vector<int32_t>& sm) {
      DevBuf<int32_t> d_sm(sm);
      cuda::summary_build_slots(f.gc.dview(), d_sm.p, int64_t(sm.size()), s.view(), nullptr);
      CK(cudaDeviceSynchronize());
    };
    poison_all(a), poison_all(b);
    slots(a, {x * P + P - 1, NB * P + P - 1, -1, -7, INT_MAX, INT_MIN, y * P + P - 1});
    slots(b, {x * P + P - 1, -1, y * P + P - 1});
    EXPECT_EQ(dump(a), dump(b)) << "slots build";

    auto filled = [&](GpuSummaries& s, const std::vector<int32_t>& bt,
                      const std::vector<int32_t>& sl) {
      DevBatch db(f, bt, sl);
      cuda::summary_build_filled(f.gc.dview(), db.v, 1, s.view(), nullptr);
      CK(cudaDeviceSynchronize());
    };
    // seq 0: 288 tokens completes page 17 (valid); seq 1: a length past capacity or negative;
    // seq 2: 208 tokens completes page 12, whose block id is out of range.
    std::vector<int32_t> bt = f.bt();
    bt[size_t(2 * f.stride() + 12)] = NB + 9;
    for (int bad_len : {f.M * P + 1, -5, INT_MAX}) {
      poison_all(a), poison_all(b);
      filled(a, bt, {288, bad_len, 208});
      filled(b, bt, {288, 17, 209});  // 17 / 209 complete no page
      EXPECT_EQ(dump(a), dump(b)) << "filled build, bad length " << bad_len;
    }
  }
}

}  // namespace
}  // namespace locks
