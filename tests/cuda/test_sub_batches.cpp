// The step over sub-batches (#14's overlap experiment, `locks_bench_cuda --pipeline`; the bench's
// own code, bench/cuda/sub_batch_step.h): the batch's rows split into parts, each part its own
// plan (planned for its size) and workspace, the parts' scorings one after another on one stream
// and each part's aggregation + selection + attention on a second stream after its scoring, all
// in one CUDA graph. A part is the batch's rows seen through offset views (block table, lengths,
// query, output), so it must select exactly what the whole batch selects for those rows, and
// attend to the same result: bit for bit where both plans split the attention the same way
// (forced pages a split), within the float64 reference's bound where each plan chooses its own
// splits.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "cuda_arith.h"
#include "gpu_helpers.h"
#include "locks/cuda/decoder.h"
#include "locks/cuda/summary_builder.h"
#include "sub_batch_step.h"

namespace locks::cuda_test {
namespace {

struct SubCase {
  int G, d;
};

class DecodeSubBatches : public ::testing::TestWithParam<SubCase> {};

// Runs the bench's step over the parts of `sizes` (sub_batch_step.h) in one graph, into out
// (the whole batch's rows).
void run_parts(cuda_bench::SubBatchStep& step, const GpuCache& gc, GpuSummaries& sums,
               const float* dq, int Hq, float* dout) {
  cudaStream_t st, lo, hi;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  CK(cudaStreamCreateWithFlags(&lo, cudaStreamNonBlocking));
  CK(cudaStreamCreateWithFlags(&hi, cudaStreamNonBlocking));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
  step.run(gc.dview(), sums.view(), gc.dbatch(), dq, Hq, dout, st, lo, hi);
  CK(cudaStreamEndCapture(st, &graph));
  CK(cudaGraphInstantiate(&exec, graph, 0));
  CK(cudaGraphLaunch(exec, st));
  CK(cudaStreamSynchronize(st));
  CK(cudaGraphExecDestroy(exec));
  CK(cudaGraphDestroy(graph));
  for (cudaStream_t s : {st, lo, hi}) CK(cudaStreamDestroy(s));
}

TEST_P(DecodeSubBatches, PartsSelectAndAttendAsTheWholeBatch) {
  SKIP_WITHOUT_GPU();
  const SubCase c = GetParam();
  const int P = 16, Hkv = 2, Hq = Hkv * c.G, d = c.d, r = 8;
  // Ragged: partial last pages, a sequence under the budget (all its pages), a long one.
  const std::vector<int64_t> lens = {16 * 300 + 5, 16 * 70, 16 * 512 + 9, 16 * 20 + 3, 16 * 140};
  const int B = int(lens.size());
  int64_t blocks = 0;
  for (int64_t n : lens) blocks += (n + P - 1) / P;
  CacheLayout L{blocks, P, Hkv, d, DType::bf16};
  GpuCache gc(L);
  gc.add_structured(lens, 70);
  const SummaryLayout sl = summary_layout_for(L, r, Precision::quant);
  GpuSummaries sums(sl);
  cuda::SummaryBuilder builder(L, sl, cuda::Solver::warp_jacobi, L.num_blocks);
  build_full_pages(builder, gc, sums);
  const BatchView db = gc.dbatch();
  const int M = db.max_blocks_per_seq;
  const std::vector<float> hq = random_queries(B, Hq, d, 1.5f, 11);
  DevBuf<float> dq(hq), out_all(size_t(B) * Hq * d), out_parts(size_t(B) * Hq * d);
  const QueryView qv{dq.p, Hq};

  for (int pps : {8, 0}) {  // forced pages a split (both plans alike), then each plan's own
    cuda::Plan plan{L, Hq, B, M, DecodeConfig{SelectConfig{512, 1, 2}, 0.0f}};
    plan.attn_pages_per_split = pps;
    cuda::Decoder whole(plan);
    out_all.poison();
    whole.run(gc.dview(), sums.view(), db, qv, AttentionOutput{out_all.p, nullptr}, nullptr);
    CK(cudaDeviceSynchronize());
    const Selection ws = whole.selection();
    const int cap = ws.capacity;
    std::vector<int32_t> wp(size_t(B) * Hkv * cap), wc(size_t(B) * Hkv);
    CK(cudaMemcpy(wp.data(), ws.pages, wp.size() * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(wc.data(), ws.counts, wc.size() * 4, cudaMemcpyDeviceToHost));
    const auto oa = out_all.download();

    for (const std::vector<int>& sizes :
         {std::vector<int>{2, 3}, std::vector<int>{4, 1}, std::vector<int>{1, 1, 1, 1, 1}}) {
      const std::string what = "pps " + std::to_string(pps) + ", parts of " +
                               std::to_string(sizes.front()) + ".." + std::to_string(sizes.back());
      cuda_bench::SubBatchStep step(plan, sizes);
      out_parts.poison();
      run_parts(step, gc, sums, dq.p, Hq, out_parts.p);
      // Each part's selection rows = the whole batch's rows (same capacity: same budget).
      int b0 = 0;
      for (size_t i = 0; i < sizes.size(); ++i) {
        ASSERT_EQ(step.first(i), b0) << what;
        const Selection ps = step.decoder(i).selection();
        ASSERT_EQ(ps.capacity, cap) << what;
        std::vector<int32_t> pp(size_t(sizes[i]) * Hkv * cap), pc(size_t(sizes[i]) * Hkv);
        CK(cudaMemcpy(pp.data(), ps.pages, pp.size() * 4, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(pc.data(), ps.counts, pc.size() * 4, cudaMemcpyDeviceToHost));
        for (int row = 0; row < sizes[i] * Hkv; ++row) {
          const int wrow = b0 * Hkv + row;
          ASSERT_EQ(pc[size_t(row)], wc[size_t(wrow)]) << what << " row " << wrow;
          for (int j = 0; j < pc[size_t(row)]; ++j)
            ASSERT_EQ(pp[size_t(row) * cap + j], wp[size_t(wrow) * cap + j]) << what;
        }
        b0 += sizes[i];
      }
      const auto op = out_parts.download();
      if (pps > 0) {  // the same splits: the same bits
        for (size_t i = 0; i < op.size(); ++i) ASSERT_EQ(op[i], oa[i]) << what << " element " << i;
      } else {  // each plan's own splits: both within the reference's bound on that selection
        const auto hb = gc.host.batch();
        const Selection hsel{wp.data(), wc.data(), cap};
        for (size_t i = 0; i < op.size(); ++i)
          ASSERT_TRUE(std::isfinite(op[i])) << what << " " << i;
        SCOPED_TRACE(what);
        test::expect_attention_within_bound(gc.host.view(), hb.view, QueryView{hq.data(), Hq},
                                            whole.scale(), &hsel, op.data(), nullptr,
                                            test::cuda_arith(gc.host.view().layout.dtype));
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, DecodeSubBatches,
                         ::testing::Values(SubCase{4, 128}, SubCase{16, 128}, SubCase{8, 256},
                                           SubCase{3, 64}),
                         [](const auto& info) {
                           return "G" + std::to_string(info.param.G) + "_d" +
                                  std::to_string(info.param.d);
                         });

}  // namespace
}  // namespace locks::cuda_test
