// The decode-step kernels op by op: scoring vs ref::score_pages (float64), GQA aggregation
// vs cpu::aggregate_gqa and selection vs cpu::select_pages on the GPU's own inputs (so the
// selection must match exactly), attention vs ref::decode_attention with the GPU's
// selection, and the whole step vs cpu::Decoder (page sets equal up to ties).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <set>
#include <string>

#include "cuda_arith.h"
#include "gpu_helpers.h"
#include "locks/cuda/decoder.h"
#include "locks/error.h"
#include "locks/reference.h"
#include "test_compare.h"

namespace locks::cuda_test {
namespace {

struct OpCase {
  int Hkv, G, d;
  Precision prec;
  DType dtype;
  std::vector<int64_t> lens;
  SelectConfig sel;
  int basis_group = 0;  // dims per int4 basis scale; 0 = summary_layout_for's default
};

std::string name(const OpCase& c) {
  return "Hkv" + std::to_string(c.Hkv) + "_G" + std::to_string(c.G) + "_d" + std::to_string(c.d) +
         "_" + precision_name(c.prec) + "_" + dtype_name(c.dtype) +
         (c.basis_group ? "_g" + std::to_string(c.basis_group) : "");
}

void PrintTo(const OpCase& c, std::ostream* os) { *os << name(c); }

class DecodeOpsTest : public ::testing::TestWithParam<OpCase> {};

TEST_P(DecodeOpsTest, EveryStageMatchesTheCpu) {
  SKIP_WITHOUT_GPU();
  const OpCase c = GetParam();
  SCOPED_TRACE(name(c));
  const int P = 16, r = 8, Hq = c.Hkv * c.G, d = c.d;
  int64_t blocks = 0;
  for (int64_t l : c.lens) blocks += (l + P - 1) / P;
  CacheLayout L{blocks + 4, P, c.Hkv, d, c.dtype};
  GpuCache gc(L);
  gc.add_structured(c.lens, 1000);
  const int B = int(c.lens.size()), M = gc.batch.view.max_blocks_per_seq;
  const std::vector<int32_t> ids = gc.full_blocks();
  SummaryLayout sl = summary_layout_for(L, r, c.prec, c.basis_group);
  SummaryStore store(sl);
  cpu::summary_build(gc.host.view(), ids.data(), int64_t(ids.size()), store.view());
  GpuSummaries gs(sl);
  gs.upload_from(store);

  const std::vector<float> q = random_queries(B, Hq, d, 1.5f, 42);
  DevBuf<float> dq(q);
  cuda::Plan plan{L, Hq, B, M, DecodeConfig{c.sel, 0.0f}};
  plan.precision = c.prec;
  plan.basis_group = c.basis_group;
  cuda::Decoder dec(plan);
  const float scale = dec.scale();
  const QueryView hq{q.data(), Hq}, dqv{dq.p, Hq};
  const BatchView hb = gc.batch.view, db = gc.dbatch();

  // 1. scores vs float64 reference.
  CK(cudaMemset(const_cast<float*>(dec.head_scores()), 0x7f, size_t(B) * Hq * M * 4));
  dec.score(gs.view(), db, dqv, nullptr);
  CK(cudaDeviceSynchronize());
  std::vector<float> hs(size_t(B) * Hq * M);
  CK(cudaMemcpy(hs.data(), dec.head_scores(), hs.size() * 4, cudaMemcpyDeviceToHost));
  std::vector<double> ref_hs(hs.size());
  const SummaryView hv = store.view();
  ref::score_pages(hv, hb, hq, scale, ref_hs.data());
  // Within the derived bound of test_compare.h under the CUDA kernels' rounding model.
  const test::ArithModel am = test::cuda_arith(c.dtype);
  double worst = 0;
  std::vector<double> stol(hs.size(), 0.0);  // each score's bound (step 5's near-tie test)
  for (size_t i = 0; i < hs.size(); ++i) {
    if (std::isinf(ref_hs[i])) {
      ASSERT_TRUE(std::isinf(hs[i]) && hs[i] < 0) << "score " << i << " = " << hs[i];
    } else {
      ASSERT_TRUE(std::isfinite(hs[i])) << "score " << i;
      const int bh = int(i / size_t(M)), j = int(i % size_t(M)), b = bh / Hq, hq = bh % Hq;
      const int32_t blk = hb.block_table[int64_t(b) * hb.block_table_stride + j];
      const double tol =
          test::score_tolerance(hv, blk, hq / c.G, q.data() + size_t(bh) * d, scale, ref_hs[i], am);
      ASSERT_NEAR(hs[i], ref_hs[i], tol) << "score " << i;
      stol[i] = tol;
      worst = std::max(worst, std::fabs(hs[i] - ref_hs[i]) / std::max(1.0, std::fabs(ref_hs[i])));
    }
  }
  RecordProperty("worst_relative_score_error", std::to_string(worst));

  // 2. aggregation vs cpu on the GPU's head scores.
  dec.aggregate(db, nullptr);
  CK(cudaDeviceSynchronize());
  std::vector<float> ga(size_t(B) * c.Hkv * M), ca(ga.size());
  CK(cudaMemcpy(ga.data(), dec.group_scores(), ga.size() * 4, cudaMemcpyDeviceToHost));
  cpu::aggregate_gqa(hs.data(), hb, Hq, c.Hkv, ca.data());
  for (size_t i = 0; i < ga.size(); ++i) {
    if (std::isinf(ca[i])) {
      ASSERT_EQ(ga[i], ca[i]) << i;
    } else {
      ASSERT_NEAR(ga[i], ca[i], 2e-5 * std::max(1.0f, std::fabs(ca[i]))) << i;
    }
  }

  // 2b. every scoring chunk size (the plan picks 128, 96, 64 or 32 pages a block from the
  // grid size): the same page scores bit for bit, and the aggregation from its partials.
  for (int cp : {32, 64, 96, 128}) {
    cuda::Plan forced = plan;
    forced.score_chunk_pages = cp;
    cuda::Decoder fd(forced);
    fd.score(gs.view(), db, dqv, nullptr);
    fd.aggregate(db, nullptr);
    CK(cudaDeviceSynchronize());
    std::vector<float> fhs(hs.size()), fga(ga.size());
    CK(cudaMemcpy(fhs.data(), fd.head_scores(), fhs.size() * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(fga.data(), fd.group_scores(), fga.size() * 4, cudaMemcpyDeviceToHost));
    for (int64_t row = 0; row < int64_t(B) * Hq; ++row)        // pages past a row's full pages
      for (int64_t j = 0; j < hb.seq_lens[row / Hq] / P; ++j)  // are not written
        ASSERT_EQ(fhs[size_t(row * M + j)], hs[size_t(row * M + j)]) << "chunk " << cp;
    for (size_t i = 0; i < fga.size(); ++i) {
      const int64_t b = int64_t(i) / (int64_t(c.Hkv) * M), j = int64_t(i) % M;
      if (j >= hb.seq_lens[b] / P) continue;
      ASSERT_NEAR(fga[i], ca[i], 2e-5 * std::max(1.0f, std::fabs(ca[i]))) << "chunk " << cp;
    }
  }

  // 3. selection vs cpu on the GPU's group scores: identical.
  dec.select(db, nullptr);
  CK(cudaDeviceSynchronize());
  const Selection gsel = dec.selection();
  const int cap = gsel.capacity;
  std::vector<int32_t> gp(size_t(B) * c.Hkv * cap), gcnt(size_t(B) * c.Hkv);
  CK(cudaMemcpy(gp.data(), gsel.pages, gp.size() * 4, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(gcnt.data(), gsel.counts, gcnt.size() * 4, cudaMemcpyDeviceToHost));
  std::vector<int32_t> cp(gp.size()), ccnt(gcnt.size());
  cpu::select_pages(ga.data(), hb, c.Hkv, P, c.sel, Selection{cp.data(), ccnt.data(), cap});
  EXPECT_EQ(gcnt, ccnt);
  EXPECT_EQ(gp, cp);
  // 3b. score + aggregate + select as the step runs them (Decoder::score_select: head scores
  // not written past the rows' full pages, the plan's fused or separate selection): the same.
  {
    cuda::Decoder sd(plan);
    sd.score_select(gs.view(), db, dqv, nullptr);
    CK(cudaDeviceSynchronize());
    const Selection ss = sd.selection();
    std::vector<int32_t> sp(gp.size()), scnt(gcnt.size());
    CK(cudaMemcpy(sp.data(), ss.pages, sp.size() * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(scnt.data(), ss.counts, scnt.size() * 4, cudaMemcpyDeviceToHost));
    EXPECT_EQ(scnt, gcnt);
    EXPECT_EQ(sp, gp);
  }

  // 4. sparse attention with the GPU selection, dense attention: vs float64 reference.
  const Selection hsel{gp.data(), gcnt.data(), cap};
  auto check_attention = [&](cuda::Decoder& ad, bool dense, const std::string& what) {
    DevBuf<float> out(size_t(B) * Hq * d), lse(size_t(B) * Hq);
    out.poison(), lse.poison();
    ad.attend(gc.dview(), db, dqv, dense ? nullptr : &gsel, AttentionOutput{out.p, lse.p}, nullptr);
    CK(cudaDeviceSynchronize());
    const auto o = out.download(), ls = lse.download();
    for (size_t i = 0; i < o.size(); ++i) ASSERT_TRUE(std::isfinite(o[i])) << what << " " << i;
    SCOPED_TRACE(what);
    test::expect_attention_within_bound(gc.host.view(), hb, hq, scale, dense ? nullptr : &hsel,
                                        o.data(), ls.data(), am);
  };
  check_attention(dec, false, "sparse");
  check_attention(dec, true, "dense");
  // 4b. forced sparse split lengths (DecodeParams::attn_pages_per_split): one page a warp,
  // an uneven split, several pages a warp, a split past a warp's 32-page block-id window.
  for (int pps : {4, 12, 32, 256}) {
    cuda::Plan forced = plan;
    forced.attn_pages_per_split = pps;
    cuda::Decoder fd(forced);
    ASSERT_EQ(fd.decode_plan().sparse_pages_per_split, pps);
    check_attention(fd, false, "sparse, " + std::to_string(pps) + " pages a split");
  }

  // 5. the whole step vs cpu::Decoder: same page sets except where group scores tie.
  DevBuf<float> out(size_t(B) * Hq * d);
  dec.run(gc.dview(), gs.view(), db, dqv, AttentionOutput{out.p, nullptr}, nullptr);
  CK(cudaDeviceSynchronize());
  cpu::Decoder cdec(L, Hq, B, M, DecodeConfig{c.sel, 0.0f});
  std::vector<float> co(size_t(B) * Hq * d);
  cdec.run(gc.host.view(), store.view(), hb, hq, AttentionOutput{co.data(), nullptr});
  const Selection cs = cdec.selection();
  CK(cudaMemcpy(gp.data(), gsel.pages, gp.size() * 4, cudaMemcpyDeviceToHost));
  const auto& cg = cdec.group_scores();
  int differing = 0;
  for (int row = 0; row < B * c.Hkv; ++row) {
    std::set<int> a(gp.begin() + int64_t(row) * cap,
                    gp.begin() + int64_t(row) * cap + gcnt[size_t(row)]);
    std::set<int> e(cs.pages + int64_t(row) * cs.capacity,
                    cs.pages + int64_t(row) * cs.capacity + cs.counts[row]);
    ASSERT_EQ(a.size(), e.size());
    std::vector<float> only_gpu, only_cpu;  // CPU group scores of the pages the two disagree on
    for (int j : a)
      if (!e.count(j)) only_gpu.push_back(cg[size_t(row) * M + j]);
    for (int j : e)
      if (!a.count(j)) only_cpu.push_back(cg[size_t(row) * M + j]);
    ASSERT_EQ(only_gpu.size(), only_cpu.size());
    // Two pages swap places only when their group scores lie within both scores' errors: the
    // largest head-score bound of the row, twice, plus the aggregation's.
    double row_tol = 1e-5;
    const int b = row / c.Hkv, kvh = row % c.Hkv;
    for (int g = 0; g < c.G; ++g)
      for (int j = 0; j < M; ++j)
        row_tol = std::max(row_tol, stol[(size_t(b) * Hq + size_t(kvh) * c.G + g) * M + j]);
    row_tol = 2 * row_tol + 2 * am.agg_abs;
    std::sort(only_gpu.begin(), only_gpu.end());
    std::sort(only_cpu.begin(), only_cpu.end());
    for (size_t i = 0; i < only_gpu.size(); ++i) {
      ++differing;
      EXPECT_NEAR(only_gpu[i], only_cpu[i],
                  std::max(row_tol, 1e-3 * std::max(1.0, std::fabs(double(only_cpu[i])))))
          << "row " << row << ": pages chosen differently are not a near-tie";
    }
  }
  RecordProperty("differing_pages", differing);
  if (differing == 0) {
    const auto o = out.download();
    double num = 0, den = 1e-30;
    for (size_t i = 0; i < co.size(); ++i) {
      num += (double(o[i]) - co[i]) * (double(o[i]) - co[i]);
      den += double(co[i]) * co[i];
    }
    EXPECT_LT(std::sqrt(num / den), 1e-2) << "whole-step output vs cpu::Decoder";
  }
}

const std::vector<int64_t> kRagged = {1, 15, 16 * 3, 16 * 50 + 7, 16 * 300, 16 * 1200 + 9};

INSTANTIATE_TEST_SUITE_P(
    Shapes, DecodeOpsTest,
    ::testing::Values(OpCase{4, 1, 64, Precision::quant, DType::bf16, kRagged, {512, 1, 2}},
                      OpCase{2, 4, 128, Precision::quant, DType::bf16, kRagged, {512, 1, 2}},
                      OpCase{1, 8, 64, Precision::quant, DType::f16, kRagged, {256, 0, 0}},
                      OpCase{2, 16, 128, Precision::quant, DType::bf16, kRagged, {2048, 1, 4}},
                      OpCase{2, 4, 128, Precision::fp32, DType::f16, kRagged, {512, 1, 2}},
                      OpCase{1, 16, 64, Precision::fp32, DType::bf16, kRagged, {100, 0, 1}},
                      // int4 basis scales per 32 dims at d 128 (the default there is one a row;
                      // the tensor-core kernel's grouped instances), and 32 at d 64 (CUDA cores)
                      OpCase{2, 4, 128, Precision::quant, DType::bf16, kRagged, {512, 1, 2}, 32},
                      OpCase{2, 16, 128, Precision::quant, DType::bf16, kRagged, {2048, 1, 4}, 32},
                      OpCase{4, 1, 64, Precision::quant, DType::bf16, kRagged, {512, 1, 2}, 32},
                      // more than one 4096-page selection chunk
                      OpCase{1,
                             4,
                             64,
                             Precision::quant,
                             DType::bf16,
                             {16 * 9000 + 5, 16 * 4097, 300},
                             {2048, 1, 2}}),
    [](const ::testing::TestParamInfo<OpCase>& i) {
      return name(i.param) + "_" + std::to_string(i.index);
    });

// head_dim 256 and GQA groups up to 32 (#14): Gemma-3 global layers (d 256, 4 q / 1 KV and
// 8 q / 4 KV), Qwen2.5 (G 7), SmolLM2 (G 3), GLM (G 16), 32 q / 1 KV (G 32) and d 256 groups
// that take several head slices (scoring: 4 heads a block at d 256, 16 below; attention: 8
// at d 256, 16 below); the CUDA-core scoring kernel at d 256 and G 32 (fp32 summaries).
INSTANTIATE_TEST_SUITE_P(
    WideShapes, DecodeOpsTest,
    ::testing::Values(OpCase{1, 4, 256, Precision::quant, DType::bf16, kRagged, {512, 1, 2}},
                      OpCase{4, 2, 256, Precision::quant, DType::f16, kRagged, {1024, 1, 2}},
                      OpCase{1, 8, 256, Precision::quant, DType::bf16, kRagged, {512, 0, 2}},
                      OpCase{1, 32, 256, Precision::quant, DType::bf16, kRagged, {512, 1, 2}},
                      OpCase{1, 4, 256, Precision::quant, DType::bf16, kRagged, {512, 1, 2}, 256},
                      OpCase{1, 32, 128, Precision::quant, DType::bf16, kRagged, {512, 1, 2}},
                      OpCase{2, 24, 128, Precision::quant, DType::f16, kRagged, {256, 0, 1}},
                      OpCase{4, 7, 128, Precision::quant, DType::bf16, kRagged, {512, 1, 2}},
                      OpCase{3, 3, 64, Precision::quant, DType::bf16, kRagged, {512, 1, 2}},
                      OpCase{1, 20, 64, Precision::quant, DType::f16, kRagged, {512, 1, 2}},
                      OpCase{1, 4, 256, Precision::fp32, DType::bf16, kRagged, {512, 1, 2}},
                      OpCase{1, 32, 128, Precision::fp32, DType::f16, kRagged, {512, 1, 2}}),
    [](const ::testing::TestParamInfo<OpCase>& i) {
      return name(i.param) + "_" + std::to_string(i.index);
    });

// Ties: many equal group scores must resolve to the lower index, exactly like the CPU.
TEST(DecodeSelect, TiesGoToTheLowerIndex) {
  SKIP_WITHOUT_GPU();
  const int P = 16, Hkv = 2, d = 64;
  const std::vector<int64_t> lens = {16 * 5000, 16 * 700 + 3, 16 * 9};
  int64_t blocks = 0;
  for (auto l : lens) blocks += (l + P - 1) / P;
  CacheLayout L{blocks, P, Hkv, d, DType::bf16};
  GpuCache gc(L);
  for (auto l : lens) {
    std::vector<float> k(size_t(l) * Hkv * d, 0.1f), v = k;
    gc.add(k, v, l);
  }
  gc.sync();
  const int B = 3, M = gc.batch.view.max_blocks_per_seq;
  const SelectConfig sc{1024, 2, 3};
  cuda::Decoder dec(cuda::Plan{L, 4 * Hkv, B, M, DecodeConfig{sc, 0.0f}});
  std::mt19937 rng(5);
  std::vector<float> g(size_t(B) * Hkv * M);
  for (auto& x : g) x = float(int(rng() % 4)) * 0.25f;  // four levels: massive ties
  CK(cudaMemcpy(const_cast<float*>(dec.group_scores()), g.data(), g.size() * 4,
                cudaMemcpyHostToDevice));
  dec.select(gc.dbatch(), nullptr);
  CK(cudaDeviceSynchronize());
  const Selection s = dec.selection();
  std::vector<int32_t> gp(size_t(B) * Hkv * s.capacity), gcnt(size_t(B) * Hkv);
  CK(cudaMemcpy(gp.data(), s.pages, gp.size() * 4, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(gcnt.data(), s.counts, gcnt.size() * 4, cudaMemcpyDeviceToHost));
  std::vector<int32_t> cp(gp.size()), cc(gcnt.size());
  cpu::select_pages(g.data(), gc.batch.view, Hkv, P, sc,
                    Selection{cp.data(), cc.data(), s.capacity});
  EXPECT_EQ(gcnt, cc);
  EXPECT_EQ(gp, cp);
}

// Massive exact ties in the group scores over sequences longer than one selection chunk
// (2048 and 4096 pages): ties go to the lower index across chunks, exactly like the CPU on
// the GPU's own group scores.
TEST(DecodeSelect, TiesAcrossChunks) {
  SKIP_WITHOUT_GPU();
  const int P = 16, r = 8, Hkv = 2, G = 4, Hq = Hkv * G, d = 64;
  const std::vector<int64_t> lens = {16 * 9000 + 5, 16 * 4097, 16 * 4096, 300};
  int64_t blocks = 0;
  for (auto l : lens) blocks += (l + P - 1) / P;
  CacheLayout L{blocks, P, Hkv, d, DType::bf16};
  GpuCache gc(L);
  gc.add_structured(lens, 77);
  const int B = int(lens.size()), M = gc.batch.view.max_blocks_per_seq;
  const std::vector<int32_t> ids = gc.full_blocks();
  SummaryLayout sl = summary_layout_for(L, r, Precision::quant);
  SummaryStore store(sl);
  cpu::summary_build(gc.host.view(), ids.data(), int64_t(ids.size()), store.view());
  GpuSummaries gs(sl);
  gs.upload_from(store);
  const std::vector<float> q = random_queries(B, Hq, d, 1.5f, 9);
  DevBuf<float> dq(q);
  const SelectConfig sc{1024, 2, 3};
  for (int chunk : {2048, 4096}) {
    SCOPED_TRACE(chunk);
    cuda::Plan plan{L, Hq, B, M, DecodeConfig{sc, 0.0f}};
    plan.select_chunk_pages = chunk;  // 9001 pages: 5 or 3 first-stage chunks
    cuda::Decoder dec(plan);
    const BatchView db = gc.dbatch();
    dec.score(gs.view(), db, QueryView{dq.p, Hq}, nullptr);  // chunk LSE partials
    // Head scores on four levels, the same for every head of a group: group scores tie
    // exactly (same inputs, same operations); -inf past the full pages, like scoring.
    std::mt19937 rng(11);
    std::vector<float> hs(size_t(B) * Hq * M, -std::numeric_limits<float>::infinity());
    for (int b = 0; b < B; ++b)
      for (int h = 0; h < Hkv; ++h)
        for (int64_t j = 0; j < lens[size_t(b)] / P; ++j) {
          const float x = float(int(rng() % 4)) * 0.25f - 9.0f;
          for (int g = 0; g < G; ++g) hs[(size_t(b) * Hq + h * G + g) * M + j] = x;
        }
    CK(cudaMemcpy(const_cast<float*>(dec.head_scores()), hs.data(), hs.size() * 4,
                  cudaMemcpyHostToDevice));
    dec.aggregate(db, nullptr);
    CK(cudaDeviceSynchronize());
    std::vector<float> ga(size_t(B) * Hkv * M);
    CK(cudaMemcpy(ga.data(), dec.group_scores(), ga.size() * 4, cudaMemcpyDeviceToHost));
    const Selection s = dec.selection();
    std::vector<int32_t> cp(size_t(B) * Hkv * s.capacity), cc(size_t(B) * Hkv);
    cpu::select_pages(ga.data(), gc.batch.view, Hkv, P, sc,
                      Selection{cp.data(), cc.data(), s.capacity});
    CK(cudaMemset(s.pages, 0x7f, cp.size() * 4));
    dec.select(db, nullptr);
    CK(cudaDeviceSynchronize());
    std::vector<int32_t> gp(cp.size()), gcnt(cc.size());
    CK(cudaMemcpy(gp.data(), s.pages, gp.size() * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(gcnt.data(), s.counts, gcnt.size() * 4, cudaMemcpyDeviceToHost));
    EXPECT_EQ(gcnt, cc);
    EXPECT_EQ(gp, cp);
  }
}

// Dense splits longer than 128 pages (planned contexts over 1M tokens: at most 512 splits
// a sequence) take the attention kernel's block-table reload path (32 pages a warp at a
// time); a plan for 70,000 pages over a 701-page sequence gives 137-page splits.
TEST(DecodeDense, LongSplitsMatchTheReference) {
  SKIP_WITHOUT_GPU();
  const int P = 16, Hkv = 2, G = 4, Hq = Hkv * G, d = 64;
  const std::vector<int64_t> lens = {16 * 700 + 3, 16 * 130};
  CacheLayout L{701 + 130 + 2, P, Hkv, d, DType::bf16};
  GpuCache gc(L);
  gc.add_structured(lens, 77);
  const int B = int(lens.size());
  const std::vector<float> q = random_queries(B, Hq, d, 1.5f, 5);
  DevBuf<float> dq(q);
  cuda::Plan plan{L, Hq, B, 70000, DecodeConfig{SelectConfig{512, 0, 0}, 0.0f}};
  cuda::Decoder dec(plan);
  DevBuf<float> out(size_t(B) * Hq * d), lse(size_t(B) * Hq);
  dec.run_dense(gc.dview(), gc.dbatch(), QueryView{dq.p, Hq}, AttentionOutput{out.p, lse.p},
                nullptr);
  CK(cudaDeviceSynchronize());
  const auto o = out.download(), ls = lse.download();
  test::expect_attention_within_bound(gc.host.view(), gc.batch.view, QueryView{q.data(), Hq},
                                      dec.scale(), nullptr, o.data(), ls.data(),
                                      test::cuda_arith(L.dtype));
}

TEST(DecodePlan, RejectsUnsupportedShapes) {
  SKIP_WITHOUT_GPU();
  auto make = [](CacheLayout L, int hq, int budget) {
    cuda::Plan p;
    p.cache = L;
    p.num_q_heads = hq;
    p.max_batch = 1;
    p.max_blocks_per_seq = 4;
    p.cfg.select.budget_tokens = budget;
    cuda::Decoder d(p);
  };
  EXPECT_THROW(make(CacheLayout{8, 8, 2, 128, DType::bf16}, 8, 512), Error);    // page size 8
  EXPECT_THROW(make(CacheLayout{8, 16, 2, 96, DType::bf16}, 8, 512), Error);    // head_dim 96
  EXPECT_THROW(make(CacheLayout{8, 16, 1, 128, DType::bf16}, 64, 512), Error);  // group 64
  EXPECT_THROW(make(CacheLayout{8, 16, 1, 512, DType::bf16}, 4, 512), Error);   // head_dim 512
  EXPECT_THROW(make(CacheLayout{8, 16, 2, 128, DType::bf16}, 8, 8), Error);     // budget < 1 page
}

// The scoring chunk rule (score_mma.cu, score_chunk_pages) on Llama-3.1-8B shapes: 64 where
// the grid holds two waves or more (long_grid_chunk of its G 4 instance), smaller than 128
// under half a wave, 96 where 128 leaves a partial second wave on the H200's 132 SMs; forced
// sizes outside the set are refused.
TEST(DecodePlan, ScoreChunkRule) {
  SKIP_WITHOUT_GPU();
  auto chunk = [](int B, int M, int forced) {
    const CacheLayout L{1 << 20, 16, 8, 128, DType::bf16};
    DecodeParams p;
    p.cache = L;
    p.summary = summary_layout_for(L, 8, Precision::quant);
    p.num_q_heads = 32, p.max_batch = B, p.max_blocks_per_seq = M;
    p.select = SelectConfig{2048, 1, 2};
    p.score_chunk_pages = forced;
    return cuda::plan_decode(p).score_chunk_pages;
  };
  EXPECT_EQ(chunk(1, 65536, 0), 64);  // 1M batch 1: 4096 blocks of 128, > 2 waves
  EXPECT_EQ(chunk(8, 8192, 0), 64);   // 128K batch 8
  EXPECT_LT(chunk(1, 512, 0), 128);   // 8K batch 1: 32 blocks of 128 would idle the GPU
  for (const int cp : {32, 64, 96, 128}) EXPECT_EQ(chunk(1, 8192, cp), cp);
  for (const int cp : {-1, 16, 48, 100, 256})
    EXPECT_THROW(chunk(1, 8192, cp), InvalidArgument) << cp;
  int dev = 0, sms = 0;
  CK(cudaGetDevice(&dev));
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  if (sms == 132) {                     // H200 / H100 SXM: 792 slots of 6 blocks
    EXPECT_EQ(chunk(1, 8192, 0), 128);  // 128K: 512 blocks, one wave
    EXPECT_EQ(chunk(1, 16384, 0), 96);  // 256K: 1024 blocks of 128 = 1.29 waves -> 1368 of 96
  }
}

// The forced attention split (DecodeParams::attn_pages_per_split): taken as given, carried by
// the plan vector, refused outside multiples of 4 in [4, 512] and where it would give a row
// more than 512 splits (a capacity raised by the minimum context).
TEST(DecodePlan, AttentionSplitKnob) {
  SKIP_WITHOUT_GPU();
  auto plan = [](int forced, int dense_below) {
    const CacheLayout L{1 << 16, 16, 8, 128, DType::bf16};
    DecodeParams p;
    p.cache = L;
    p.summary = summary_layout_for(L, 8, Precision::quant);
    p.num_q_heads = 32, p.max_batch = 1, p.max_blocks_per_seq = 8192;
    p.select = SelectConfig{2048, 1, 2};
    p.select.dense_below = dense_below;
    p.attn_pages_per_split = forced;
    return cuda::plan_decode(p);
  };
  const DecodePlan rule = plan(0, 0);
  EXPECT_GE(rule.sparse_pages_per_split, 4);
  EXPECT_EQ(rule.sparse_pages_per_split % 4, 0);
  for (const int pps : {4, 8, 12, 64, 512}) {
    const DecodePlan f = plan(pps, 0);
    EXPECT_EQ(f.sparse_pages_per_split, pps);
    EXPECT_EQ(f.sparse_splits, (f.capacity + pps - 1) / pps);
    EXPECT_EQ(f.dense_splits, rule.dense_splits);  // the dense path keeps its rule
    const DecodePlan back = DecodePlan::from_ints(f.to_ints());
    EXPECT_EQ(back.params.attn_pages_per_split, pps);
    EXPECT_EQ(back.to_ints(), f.to_ints());
  }
  for (const int pps : {-4, 2, 6, 516, 1024}) EXPECT_THROW(plan(pps, 0), InvalidArgument) << pps;
  // 128K tokens of minimum context: 8192 pages of capacity, 2048 splits of 4 pages.
  EXPECT_THROW(plan(4, 131072), InvalidArgument);
  EXPECT_EQ(plan(16, 131072).sparse_splits, 512);
}

}  // namespace
}  // namespace locks::cuda_test
