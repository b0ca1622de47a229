// Sparse attention merged in place by a thread-block cluster (attention.cu, the plan's
// attn_cluster) against the float64 reference and against the split-partials + merge-kernel
// form, on selections long enough for 16 splits a row; and the plan's rule and refusals.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <string>

#include "gpu_helpers.h"
#include "locks/contract.h"
#include "locks/cuda/decoder.h"
#include "locks/error.h"
#include "locks/reference.h"

namespace locks::cuda_test {
namespace {

DecodeParams llama_params(int B, int M, int forced) {
  const CacheLayout L{1 << 20, 16, 8, 128, DType::bf16};
  DecodeParams p;
  p.cache = L;
  p.summary = summary_layout_for(L, 8, Precision::quant);
  p.num_q_heads = 32, p.max_batch = B, p.max_blocks_per_seq = M;
  p.select = SelectConfig{2048, 1, 2};
  p.attn_cluster = forced;
  return p;
}

TEST(AttnClusterPlan, RuleAndRefusals) {
  SKIP_WITHOUT_GPU();
  auto plan = [](int B, int M, int forced) {
    return cuda::plan_decode(llama_params(B, M, forced));
  };
  // 128K batch 1: 32 one-wave splits of 4 pages become a cluster of 16 splits of 8 pages
  // (or 8 of 16 where the device cannot co-schedule 16).
  const DecodePlan b1 = plan(1, 8192, 0);
  EXPECT_TRUE(b1.attn_cluster == 16 || b1.attn_cluster == 8) << b1.attn_cluster;
  EXPECT_EQ(b1.sparse_pages_per_split * b1.attn_cluster, b1.capacity);
  EXPECT_EQ(plan(1, 8192, -1).attn_cluster, 0);  // never
  EXPECT_EQ(plan(8, 8192, 0).attn_cluster, 0);   // 64 rows x 8: over one wave
  const DecodePlan f4 = plan(8, 8192, 4);        // forced
  EXPECT_EQ(f4.attn_cluster, 4);
  EXPECT_EQ(f4.sparse_pages_per_split, 32);
  EXPECT_THROW(plan(1, 8192, 3), InvalidArgument);   // not a power of two
  EXPECT_THROW(plan(1, 8192, 32), InvalidArgument);  // over 16
  EXPECT_THROW(plan(1, 8192, -2), InvalidArgument);

  // A plan whose cluster cannot hold its splits (edited after planning, as a plan vector
  // from elsewhere could be) is refused at run, before any launch: no page goes unread.
  const CacheLayout Ls{64, 16, 8, 128, DType::bf16};
  DecodeParams ps = llama_params(1, 64, 2);
  ps.cache = Ls;
  ps.summary = summary_layout_for(Ls, 8, Precision::quant);
  ps.select = SelectConfig{512, 0, 0};  // 32 slots: 2 splits of 16 pages
  DecodePlan bad = cuda::plan_decode(ps);
  ASSERT_EQ(bad.attn_cluster, 2);
  ASSERT_EQ(bad.sparse_pages_per_split, 16);
  bad.attn_cluster = 1;
  DevBuf<uint8_t> ws(bad.workspace_bytes), kv(size_t(Ls.num_blocks) * Ls.block_elems() * 2 * 2);
  DevBuf<int32_t> pages(8 * size_t(bad.capacity)), counts(8), lens(std::vector<int32_t>{1024});
  DevBuf<int32_t> bt(std::vector<int32_t>(64, 0));
  DevBuf<float> q(32 * 128), out(32 * 128);
  const KvCacheView cache{kv.p, kv.p + kv.n / 2, Ls, 0};
  const BatchView batch{bt.p, 64, lens.p, 1, 64};
  try {
    cuda::decode_attention_sparse(bad, Workspace{ws.p, ws.n}, cache, batch, QueryView{q.p, 32},
                                  Selection{pages.p, counts.p, bad.capacity},
                                  AttentionOutput{out.p, nullptr}, nullptr);
    ADD_FAILURE() << "a cluster of 1 for 2 splits ran";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("attention cluster of 1 blocks for 2 splits"),
              std::string::npos)
        << e.what();
  }
}

struct LongCase {
  int Hkv, G, d;
  DType dtype;
};

class AttnClusterLong : public ::testing::TestWithParam<LongCase> {};

// Two sequences (4000 and 2600 tokens, the second ending in a partial page), a budget of
// 2048 tokens (128 slots), random sorted selections of 1, 37 and 128 pages plus the tail.
TEST_P(AttnClusterLong, EveryClusterSizeMatchesTheReference) {
  SKIP_WITHOUT_GPU();
  const LongCase c = GetParam();
  const int P = 16, Hq = c.Hkv * c.G, d = c.d, B = 2;
  const std::vector<int64_t> lens{4000, 2600};
  CacheLayout L{256 + 168, P, c.Hkv, d, c.dtype};
  GpuCache gc(L);
  gc.add_structured(lens, 77);
  const int M = gc.batch.view.max_blocks_per_seq;
  const std::vector<float> q = random_queries(B, Hq, d, 2.0f, 9);
  DevBuf<float> dq(q);
  const BatchView hb = gc.batch.view, db = gc.dbatch();

  DecodeParams p;
  p.cache = L;
  p.summary = summary_layout_for(L, 8, Precision::quant);
  p.num_q_heads = Hq, p.max_batch = B, p.max_blocks_per_seq = M;
  p.select = SelectConfig{2048, 0, 0};
  const int cap = cuda::plan_decode(p).capacity;
  ASSERT_EQ(cap, 128);
  // Selections: row (b, h) takes n of the sequence's pages, ascending, the last page included.
  std::mt19937 rng(5);
  std::vector<int32_t> pages(size_t(B) * c.Hkv * cap, -1), counts(size_t(B) * c.Hkv);
  const int sizes[] = {1, 37, 128, 90};
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < c.Hkv; ++h) {
      const int np = int((lens[size_t(b)] + P - 1) / P);
      std::vector<int32_t> all(size_t(np - 1));
      std::iota(all.begin(), all.end(), 0);
      std::shuffle(all.begin(), all.end(), rng);
      const int n = std::min(sizes[(b * c.Hkv + h) % 4], np);
      std::vector<int32_t> pick(all.begin(), all.begin() + (n - 1));
      pick.push_back(np - 1);
      std::sort(pick.begin(), pick.end());
      std::copy(pick.begin(), pick.end(), pages.begin() + (size_t(b) * c.Hkv + h) * cap);
      counts[size_t(b) * c.Hkv + h] = n;
    }
  const Selection hsel{pages.data(), counts.data(), cap};
  std::vector<double> ro(size_t(B) * Hq * d), rl(size_t(B) * Hq);
  ref::decode_attention(gc.host.view(), hb, QueryView{q.data(), Hq},
                        cuda::plan_decode(p).params.scale, &hsel, ro.data(), rl.data());
  DevBuf<int32_t> dp(pages), dc(counts);

  std::vector<float> merged;  // the merge-kernel form's output
  for (const int acl : {-1, 0, 1, 2, 4, 8, 16}) {
    SCOPED_TRACE(testing::Message() << "attn_cluster " << acl);
    p.attn_cluster = acl;
    DecodePlan plan;
    try {
      plan = cuda::plan_decode(p);
    } catch (const InvalidArgument&) {
      ASSERT_EQ(acl, 16) << "only the non-portable 16 may not fit the device";
      continue;
    }
    if (acl > 0) ASSERT_EQ(plan.attn_cluster, acl);
    DevBuf<uint8_t> ws(plan.workspace_bytes);
    DevBuf<float> out(size_t(B) * Hq * d), lse(size_t(B) * Hq);
    out.poison(), lse.poison();
    cuda::decode_attention_sparse(plan, Workspace{ws.p, ws.n}, gc.dview(), db, QueryView{dq.p, Hq},
                                  Selection{dp.p, dc.p, cap}, AttentionOutput{out.p, lse.p},
                                  nullptr);
    CK(cudaDeviceSynchronize());
    const std::vector<float> o = out.download(), l = lse.download();
    for (int i = 0; i < B * Hq; ++i) {
      double num = 0, den = 1e-30;
      for (int e = 0; e < d; ++e) {
        const double x = o[size_t(i) * d + e], y = ro[size_t(i) * d + e];
        ASSERT_TRUE(std::isfinite(x)) << "row " << i << " dim " << e;
        num += (x - y) * (x - y);
        den += y * y;
      }
      // bf16 / fp16 K and V against float64 (test_decode_ops' bound), the LSE to 1e-3.
      EXPECT_LT(std::sqrt(num / den), 1e-2) << "row " << i;
      EXPECT_NEAR(l[size_t(i)], rl[size_t(i)], 1e-3) << "row " << i;
    }
    if (acl == -1) {
      merged = o;
    } else {
      // P enters P V in the cache dtype, relative to its split's running max, so other split
      // boundaries round each weight differently (2^-9 relative for bf16, 2^-12 for fp16):
      // the two forms differ by ~1e-4 here (measured 6e-5), a split left unread by ~1e-2.
      for (size_t i = 0; i < o.size(); ++i)
        ASSERT_NEAR(o[i], merged[i], 1e-3 * (1.0 + std::fabs(merged[i]))) << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, AttnClusterLong,
                         ::testing::Values(LongCase{2, 4, 128, DType::bf16},
                                           LongCase{1, 16, 128, DType::bf16},
                                           LongCase{2, 32, 64, DType::f16},
                                           LongCase{1, 4, 256, DType::bf16}));

}  // namespace
}  // namespace locks::cuda_test
