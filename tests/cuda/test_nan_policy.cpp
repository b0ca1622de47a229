// NaN policy on the GPU (docs/bad_input.md): a NaN in the K cache propagates to the outputs
// of the query heads that attend to it, as on the CPU (tests/core/test_nan_policy.cpp).
// Issue #12: the last merge of the split-K attention skipped a warp whose splits had only
// NaN logits (its max stayed -inf), so a cache whose splits are NaN except one gave a finite
// output from that split alone.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "gpu_helpers.h"
#include "locks/cuda/decoder.h"

namespace locks {
namespace {

using cuda_test::DevBuf;
using cuda_test::GpuCache;

// bf16 quiet NaN, written straight into the device cache (the host cache refuses NaN).
void poison_keys(GpuCache& gc, int seq, int first_page, int last_page, int kv_head) {
  const CacheLayout& L = gc.host.layout();
  const std::vector<uint16_t> nan(size_t(L.head_dim), 0x7FC0);
  for (int j = first_page; j < last_page; ++j)
    for (int s = 0; s < L.page_size; ++s) {
      const int64_t off = L.offset(gc.host.blocks(seq)[size_t(j)], s, kv_head) * 2;
      CK(cudaMemcpy(gc.k.p + off, nan.data(), nan.size() * 2, cudaMemcpyHostToDevice));
    }
}

void run_case(int first_page, int last_page) {
  const int P = 16, Hkv = 2, G = 4, Hq = Hkv * G, d = 64;
  const int64_t len = 16 * 128;  // 128 pages: several splits, one merge warp each
  CacheLayout L{130, P, Hkv, d, DType::bf16};
  GpuCache gc(L);
  gc.add_structured({len}, 31);
  poison_keys(gc, 0, first_page, last_page, 0);
  const std::vector<float> q = cuda_test::random_queries(1, Hq, d, 1.5f, 3);
  DevBuf<float> dq(q);
  cuda::Plan plan{L, Hq, 1, 128, DecodeConfig{SelectConfig{512, 0, 0}, 0.0f}};
  cuda::Decoder dec(plan);
  DevBuf<float> out(size_t(Hq) * d), lse(static_cast<size_t>(Hq));
  dec.run_dense(gc.dview(), gc.dbatch(), QueryView{dq.p, Hq}, AttentionOutput{out.p, lse.p},
                nullptr);
  CK(cudaDeviceSynchronize());
  const auto o = out.download(), ls = lse.download();
  for (int h = 0; h < Hq; ++h) {
    const bool poisoned = h / G == 0;  // the query heads of KV head 0
    EXPECT_EQ(std::isnan(ls[size_t(h)]), poisoned) << "head " << h << " lse " << ls[size_t(h)];
    for (int e = 0; e < d; ++e)
      ASSERT_EQ(std::isnan(o[size_t(h) * d + e]), poisoned) << "head " << h << " dim " << e;
  }
}

TEST(NanPolicyCuda, OneNanPagePropagates) {
  SKIP_WITHOUT_GPU();
  run_case(40, 41);
}

// 128 pages plan as 8 dense splits of 16 pages (the minimum split, decoder.cu), one merge warp
// each: splits 0-6 all NaN, split 7 clean. Before the fix the merge kept split 7 alone.
TEST(NanPolicyCuda, WholeNanSplitsPropagate) {
  SKIP_WITHOUT_GPU();
  run_case(0, 112);
}

}  // namespace
}  // namespace locks
