// The one-stage selection kernel (select_single: every sequence within one selection chunk,
// e.g. up to 32K tokens) against cpu::select_pages on massive exact ties: the same list,
// ties to the lower index, for budgets below, at and above the candidate count.
#include <gtest/gtest.h>

#include <random>

#include "gpu_helpers.h"
#include "locks/cuda/decoder.h"
#include "locks/select.h"

namespace locks::cuda_test {
namespace {

TEST(DecodeSelectSingle, TiesGoToTheLowerIndexInOneChunk) {
  SKIP_WITHOUT_GPU();
  const int P = 16, Hkv = 3, d = 64;
  const std::vector<int64_t> lens = {16 * 2000, 16 * 2048, 16 * 700 + 3, 16 * 9, 5, 16 * 130};
  int64_t blocks = 0;
  for (auto l : lens) blocks += (l + P - 1) / P;
  CacheLayout L{blocks, P, Hkv, d, DType::bf16};
  GpuCache gc(L);
  for (auto l : lens) {
    std::vector<float> k(size_t(l) * Hkv * d, 0.1f), v = k;
    gc.add(k, v, l);
  }
  gc.sync();
  const int B = int(lens.size()), M = gc.batch.view.max_blocks_per_seq;
  ASSERT_LE(M, 2048);  // one chunk of the planned 2048: the one-stage kernel
  for (const SelectConfig sc : {SelectConfig{1024, 2, 3}, SelectConfig{2048, 0, 0},
                                SelectConfig{16 * 140, 1, 1}, SelectConfig{48, 1, 1}}) {
    SCOPED_TRACE(sc.budget_tokens);
    cuda::Decoder dec(cuda::Plan{L, 2 * Hkv, B, M, DecodeConfig{sc, 0.0f}});
    std::mt19937 rng(uint32_t(sc.budget_tokens));
    std::vector<float> g(size_t(B) * Hkv * M);
    for (auto& x : g) x = float(int(rng() % 4)) * 0.25f;  // four levels: massive ties
    CK(cudaMemcpy(const_cast<float*>(dec.group_scores()), g.data(), g.size() * 4,
                  cudaMemcpyHostToDevice));
    const Selection s = dec.selection();
    CK(cudaMemset(s.pages, 0x7f, size_t(B) * Hkv * s.capacity * 4));
    dec.select(gc.dbatch(), nullptr);
    CK(cudaDeviceSynchronize());
    std::vector<int32_t> gp(size_t(B) * Hkv * s.capacity), gcnt(size_t(B) * Hkv);
    CK(cudaMemcpy(gp.data(), s.pages, gp.size() * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(gcnt.data(), s.counts, gcnt.size() * 4, cudaMemcpyDeviceToHost));
    std::vector<int32_t> cp(gp.size()), cc(gcnt.size());
    cpu::select_pages(g.data(), gc.batch.view, Hkv, P, sc,
                      Selection{cp.data(), cc.data(), s.capacity});
    EXPECT_EQ(gcnt, cc);
    EXPECT_EQ(gp, cp);
  }
}

}  // namespace
}  // namespace locks::cuda_test
