// GPU summary build (warp Jacobi and cuSOLVER) against cpu::summary_build (Eigen SVD in
// double) and the host quantizer.
#include <gtest/gtest.h>

#include <cmath>
#include <tuple>

#include "gpu_helpers.h"
#include "locks/cuda/summary_builder.h"

namespace locks::cuda_test {
namespace {

struct BuildCase {
  DType dtype;
  int d;
  cuda::Solver solver;
  float decay;  // < 1: structured pages with separated singular values; 1: flat
};

void PrintTo(const BuildCase& c, std::ostream* os) {
  *os << dtype_name(c.dtype) << " d" << c.d
      << (c.solver == cuda::Solver::warp_jacobi ? " warp_jacobi" : " cusolver") << " decay "
      << c.decay;
}

class SummaryBuildTest : public ::testing::TestWithParam<BuildCase> {};

// Reconstruction of the centred keys from a summary: sum_k c_ik basis_k (float64).
std::vector<double> recon(const SummaryView& s, int64_t bh) {
  const int d = s.layout.head_dim, r = s.layout.rank, P = s.layout.page_size;
  std::vector<double> out(size_t(P) * d, 0.0);
  for (int i = 0; i < P; ++i)
    for (int k = 0; k < r; ++k)
      for (int e = 0; e < d; ++e)
        out[size_t(i) * d + e] +=
            double(s.coeff[(bh * P + i) * r + k]) * s.basis[(bh * r + k) * d + e];
  return out;
}

TEST_P(SummaryBuildTest, MatchesCpuAndQuantizer) {
  SKIP_WITHOUT_GPU();
  const BuildCase c = GetParam();
  const int H = 2, P = 16, r = 8;
  CacheLayout L{400, P, H, c.d, c.dtype};
  GpuCache gc(L);
  const std::vector<int64_t> lens = {16 * 20 + 3, 16 * 7, 16 * 33, 5};
  for (size_t s = 0; s < lens.size(); ++s) {
    std::vector<float> k, v;
    make_kv(lens[s], H, c.d, P, 10, 100 + s, k, v, c.decay);
    gc.add(k, v, lens[s]);
  }
  gc.sync();
  const std::vector<int32_t> ids = gc.full_blocks();
  DevBuf<int32_t> dids(ids);
  const int64_t n = int64_t(ids.size());

  SummaryLayout sl = summary_layout_for(L, r, Precision::fp32);
  SummaryStore cpu_store(sl);
  cpu::summary_build(gc.host.view(), ids.data(), n, cpu_store.view());

  cuda::SummaryBuilder builder(L, sl, c.solver, n);
  GpuSummaries g(sl);
  g.mu.poison(), g.basis.poison(), g.coeff.poison();
  builder.build(gc.dview(), dids.p, n, g.view(), nullptr);
  CK(cudaDeviceSynchronize());
  SummaryStore gpu_store(sl);
  SummaryView gv = gpu_store.view();
  const size_t nb = size_t(L.num_blocks) * H;
  CK(cudaMemcpy(gv.mu, g.mu.p, nb * c.d * 4, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(gv.basis, g.basis.p, nb * r * c.d * 4, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(gv.coeff, g.coeff.p, nb * P * r * 4, cudaMemcpyDeviceToHost));
  const SummaryView cv = cpu_store.view();

  double worst_mu = 0, worst_recon = 0, worst_energy = 0;
  for (int64_t i = 0; i < n; ++i)
    for (int h = 0; h < H; ++h) {
      const int64_t bh = int64_t(ids[size_t(i)]) * H + h;
      double mu_scale = 1e-6;
      for (int e = 0; e < c.d; ++e)
        mu_scale = std::max(mu_scale, double(std::fabs(cv.mu[bh * c.d + e])));
      for (int e = 0; e < c.d; ++e) {
        ASSERT_TRUE(std::isfinite(gv.mu[bh * c.d + e]));
        worst_mu = std::max(
            worst_mu, std::fabs(double(gv.mu[bh * c.d + e]) - cv.mu[bh * c.d + e]) / mu_scale);
      }
      const auto rg = recon(gv, bh), rc = recon(cv, bh);
      double num = 0, den = 1e-30, eg = 0, ec = 0;
      for (size_t e = 0; e < rg.size(); ++e) {
        ASSERT_TRUE(std::isfinite(rg[e]));
        num += (rg[e] - rc[e]) * (rg[e] - rc[e]);
        den += rc[e] * rc[e];
        eg += rg[e] * rg[e];
        ec += rc[e] * rc[e];
      }
      worst_recon = std::max(worst_recon, std::sqrt(num / den));
      worst_energy = std::max(worst_energy, std::fabs(eg - ec) / (ec + 1e-30));
    }
  EXPECT_LT(worst_mu, 1e-5);
  // Captured energy (sum of the top-r sigma^2) does not depend on the subspace's basis.
  EXPECT_LT(worst_energy, 1e-4);
  if (c.decay < 1.0f) EXPECT_LT(worst_recon, 2e-3);  // separated spectrum: same subspace

  // Quant mode: the fused quantizer equals the host quantizer applied to the fp32 build.
  SummaryLayout ql = summary_layout_for(L, r, Precision::quant);
  GpuSummaries gq(ql);
  gq.mu_q.poison(), gq.basis_q.poison(), gq.coeff_q.poison();
  cuda::SummaryBuilder qb(L, ql, c.solver, n);
  qb.build(gc.dview(), dids.p, n, gq.view(), nullptr);
  CK(cudaDeviceSynchronize());
  const auto mu_q = gq.mu_q.download(), coeff_q = gq.coeff_q.download();
  const auto basis_q = gq.basis_q.download();
  const auto mu_s = gq.mu_scale.download(), bs = gq.basis_scale.download(),
             cs = gq.coeff_scale.download();
  int64_t codes = 0, off_by_one = 0;
  std::vector<int8_t> hm(c.d), hc(P * r);
  std::vector<uint8_t> hb(r * c.d / 2);
  std::vector<float> hbs(r), hcs(r);
  float hms = 0;
  for (int64_t i = 0; i < n; ++i)
    for (int h = 0; h < H; ++h) {
      const int64_t bh = int64_t(ids[size_t(i)]) * H + h;
      summary_quantize(gv.mu + bh * c.d, gv.basis + bh * r * c.d, gv.coeff + bh * P * r, c.d, P, r,
                       hm.data(), &hms, hb.data(), hbs.data(), hc.data(), hcs.data());
      EXPECT_FLOAT_EQ(hms, mu_s[size_t(bh)]);
      for (int k = 0; k < r; ++k) {
        EXPECT_FLOAT_EQ(hbs[k], bs[size_t(bh * r + k)]);
        EXPECT_FLOAT_EQ(hcs[k], cs[size_t(bh * r + k)]);
      }
      auto cmp = [&](int a, int b) {
        ++codes;
        ASSERT_LE(std::abs(a - b), 1) << "block " << ids[size_t(i)] << " head " << h;
        off_by_one += a != b;
      };
      for (int e = 0; e < c.d; ++e) cmp(hm[e], mu_q[size_t(bh * c.d + e)]);
      for (int e = 0; e < P * r; ++e) cmp(hc[e], coeff_q[size_t(bh * P * r + e)]);
      for (int e = 0; e < r * c.d / 2; ++e) {
        const uint8_t x = hb[e], y = basis_q[size_t(bh * r * c.d / 2 + e)];
        cmp(int8_t(x << 4) >> 4, int8_t(y << 4) >> 4);
        cmp(int8_t(x) >> 4, int8_t(y) >> 4);
      }
    }
  EXPECT_LE(double(off_by_one), 1e-3 * double(codes));
}

INSTANTIATE_TEST_SUITE_P(
    Cases, SummaryBuildTest,
    ::testing::Values(BuildCase{DType::bf16, 128, cuda::Solver::warp_jacobi, 0.8f},
                      BuildCase{DType::bf16, 64, cuda::Solver::warp_jacobi, 0.8f},
                      BuildCase{DType::f16, 128, cuda::Solver::warp_jacobi, 1.0f},
                      BuildCase{DType::f32, 64, cuda::Solver::warp_jacobi, 1.0f},
                      BuildCase{DType::bf16, 128, cuda::Solver::cusolver, 0.8f},
                      BuildCase{DType::f16, 64, cuda::Solver::cusolver, 1.0f}));

// build_filled builds exactly the pages completed by the last appended tokens.
TEST(SummaryBuildFilled, BuildsOnlyCompletedPages) {
  SKIP_WITHOUT_GPU();
  const int H = 2, P = 16, r = 8, d = 128;
  CacheLayout L{64, P, H, d, DType::bf16};
  GpuCache gc(L);
  const std::vector<int64_t> lens = {16 * 3, 16 * 2 + 5, 16,
                                     7};  // pages just completed: 3, -, 1, -
  for (size_t s = 0; s < lens.size(); ++s) {
    std::vector<float> k, v;
    make_kv(lens[s], H, d, P, 10, 7 + s, k, v, 0.8f);
    gc.add(k, v, lens[s]);
  }
  gc.sync();
  SummaryLayout sl = summary_layout_for(L, r, Precision::quant);
  cuda::SummaryBuilder b(L, sl, cuda::Solver::warp_jacobi, 64);
  GpuSummaries inc(sl), bulk(sl);
  inc.mu_scale.poison();
  b.build_filled(gc.dview(), gc.dbatch(), 1, inc.view(), nullptr);
  const std::vector<int32_t> ids = {gc.host.blocks(0)[2], gc.host.blocks(2)[0]};
  DevBuf<int32_t> dids(ids);
  b.build(gc.dview(), dids.p, 2, bulk.view(), nullptr);
  CK(cudaDeviceSynchronize());
  const auto a = inc.mu_scale.download(), e = bulk.mu_scale.download();
  const auto aq = inc.basis_q.download(), eq = bulk.basis_q.download();
  std::vector<char> built(size_t(L.num_blocks), 0);
  for (int32_t id : ids) built[size_t(id)] = 1;
  for (int64_t blk = 0; blk < L.num_blocks; ++blk)
    for (int h = 0; h < H; ++h) {
      const size_t bh = size_t(blk * H + h);
      uint32_t bits;
      std::memcpy(&bits, &a[bh], 4);
      if (built[size_t(blk)]) {
        EXPECT_EQ(a[bh], e[bh]);
        for (int x = 0; x < r * d / 2; ++x)
          ASSERT_EQ(aq[bh * r * d / 2 + x], eq[bh * r * d / 2 + x]);
      } else {
        EXPECT_EQ(bits, 0xffffffffu) << "block " << blk << " was written";
      }
    }
}

}  // namespace
}  // namespace locks::cuda_test
