// The whole decode step (incremental summary build, score, aggregate, select, attend) for a
// ragged batch captured in one CUDA graph, replayed after new tokens are appended and new
// queries arrive; every replay must equal the eager run bit for bit.
#include <gtest/gtest.h>

#include <cmath>

#include "cuda_arith.h"
#include "gpu_helpers.h"
#include "locks/cuda/decoder.h"
#include "locks/cuda/summary_builder.h"

namespace locks::cuda_test {
namespace {

// tau: 0 = the fixed budget, 0.9 = the adaptive one (the counts vary per replay, the
// captured capacity does not).
class DecodeGraph : public ::testing::TestWithParam<float> {};

TEST_P(DecodeGraph, ReplayMatchesEagerAfterAppends) {
  SKIP_WITHOUT_GPU();
  const int P = 16, Hkv = 2, G = 4, Hq = Hkv * G, d = 128, r = 8, kStride = 320, kSteps = 3;
  const std::vector<int64_t> lens0 = {16 * 100 + 15, 16 * 40 + 3, 16 * 260, 9};
  const int B = int(lens0.size());
  CacheLayout L{1200, P, Hkv, d, DType::bf16};
  GpuCache gc(L);
  for (int s = 0; s < B; ++s) {
    std::vector<float> k, v;
    make_kv(lens0[size_t(s)], Hkv, d, P, 6, 50 + s, k, v);
    gc.add(k, v, lens0[size_t(s)]);
  }
  gc.sync();
  // Fixed-stride device block table (the graph's shapes may not change between replays).
  DevBuf<int32_t> table{size_t(B) * kStride}, lens{size_t(B)};
  auto upload_state = [&]() {
    std::vector<int32_t> t(size_t(B) * kStride, 0);
    std::vector<int32_t> l(static_cast<size_t>(B));
    for (int s = 0; s < B; ++s) {
      const auto& bl = gc.host.blocks(s);
      std::copy(bl.begin(), bl.end(), t.begin() + int64_t(s) * kStride);
      l[size_t(s)] = gc.host.seq_len(s);
    }
    table.upload(t);
    lens.upload(l);
    const size_t bytes = size_t(L.num_blocks) * L.block_elems() * 2;
    gc.k.upload(static_cast<const uint8_t*>(gc.host.view().k), bytes);
    gc.v.upload(static_cast<const uint8_t*>(gc.host.view().v), bytes);
  };
  upload_state();
  BatchView db{table.p, kStride, lens.p, B, kStride};

  SummaryLayout sl = summary_layout_for(L, r, Precision::quant);
  GpuSummaries sums(sl);
  cuda::SummaryBuilder builder(L, sl, cuda::Solver::warp_jacobi, L.num_blocks);
  build_full_pages(builder, gc, sums);
  const SelectConfig sc{512, 1, 2, GetParam(), 1};
  cuda::Decoder dec(cuda::Plan{L, Hq, B, kStride, DecodeConfig{sc, 0.0f}});
  DevBuf<float> dq(size_t(B) * Hq * d), out_graph(size_t(B) * Hq * d),
      out_eager(size_t(B) * Hq * d);
  DevBuf<float> lse_graph(size_t(B) * Hq), lse_eager(size_t(B) * Hq);
  const QueryView qv{dq.p, Hq};

  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
  builder.build_filled(gc.dview(), db, 1, sums.view(), st);
  dec.run(gc.dview(), sums.view(), db, qv, AttentionOutput{out_graph.p, lse_graph.p}, st);
  CK(cudaStreamEndCapture(st, &graph));
  CK(cudaGraphInstantiate(&exec, graph, 0));

  std::mt19937_64 rng(9);
  std::normal_distribution<float> N(0.f, 1.f);
  for (int step = 0; step < kSteps; ++step) {
    for (int s = 0; s < B; ++s) {  // one new token per sequence (some complete a page)
      std::vector<float> k(size_t(Hkv) * d), v(size_t(Hkv) * d);
      for (auto& x : k) x = 0.3f * N(rng);
      for (auto& x : v) x = N(rng);
      gc.host.append(s, k.data(), v.data(), 1);
    }
    upload_state();
    dq.upload(random_queries(B, Hq, d, 1.5f, 100 + step));
    out_graph.poison(), out_eager.poison();
    CK(cudaGraphLaunch(exec, st));
    CK(cudaStreamSynchronize(st));
    const auto og = out_graph.download(), lg = lse_graph.download();
    builder.build_filled(gc.dview(), db, 1, sums.view(), st);
    dec.run(gc.dview(), sums.view(), db, qv, AttentionOutput{out_eager.p, lse_eager.p}, st);
    CK(cudaStreamSynchronize(st));
    const auto oe = out_eager.download(), le = lse_eager.download();
    for (size_t i = 0; i < og.size(); ++i) {
      ASSERT_TRUE(std::isfinite(og[i])) << "step " << step << " element " << i;
      ASSERT_EQ(og[i], oe[i]) << "step " << step << " element " << i;
    }
    for (size_t i = 0; i < lg.size(); ++i) ASSERT_EQ(lg[i], le[i]);

    // The replay attended the new tokens: compare with the float64 reference over the
    // GPU's selection (which includes each sequence's last page).
    const Selection gs = dec.selection();
    std::vector<int32_t> pages(size_t(B) * Hkv * gs.capacity), counts(size_t(B) * Hkv);
    CK(cudaMemcpy(pages.data(), gs.pages, pages.size() * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(counts.data(), gs.counts, counts.size() * 4, cudaMemcpyDeviceToHost));
    const auto hbatch = gc.host.batch();
    std::vector<float> hq(size_t(B) * Hq * d);
    CK(cudaMemcpy(hq.data(), dq.p, hq.size() * 4, cudaMemcpyDeviceToHost));
    const Selection hsel{pages.data(), counts.data(), gs.capacity};
    SCOPED_TRACE(testing::Message() << "step " << step);
    test::expect_attention_within_bound(gc.host.view(), hbatch.view, QueryView{hq.data(), Hq},
                                        dec.scale(), &hsel, og.data(), lg.data(),
                                        test::cuda_arith(gc.host.view().layout.dtype));
  }
  CK(cudaGraphExecDestroy(exec));
  CK(cudaGraphDestroy(graph));
  CK(cudaStreamDestroy(st));
}

INSTANTIATE_TEST_SUITE_P(Tau, DecodeGraph, ::testing::Values(0.0f, 0.9f));

}  // namespace
}  // namespace locks::cuda_test
