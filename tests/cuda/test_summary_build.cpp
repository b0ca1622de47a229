// GPU summary build (warp Jacobi and cuSOLVER bulk builds, the build_filled latency kernel)
// against cpu::summary_build (Eigen SVD in double) and the host quantizer.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <tuple>
#include <vector>

#include "gpu_helpers.h"
#include "locks/contract.h"
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

// Host copy of device fp32 summaries.
void download_fp32(GpuSummaries& g, SummaryStore& host) {
  const SummaryLayout& L = g.L;
  const size_t nb = size_t(L.num_blocks) * L.num_kv_heads;
  SummaryView hv = host.view();
  CK(cudaMemcpy(hv.mu, g.mu.p, nb * L.head_dim * 4, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(hv.basis, g.basis.p, nb * L.rank * L.head_dim * 4, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(hv.coeff, g.coeff.p, nb * L.page_size * L.rank * 4, cudaMemcpyDeviceToHost));
}

// GPU fp32 summaries of `ids` against the CPU's (Eigen SVD in double): centroid, captured
// energy (independent of the subspace's basis) and, when the spectrum is separated, the
// reconstruction (same subspace).
void expect_matches_cpu(const SummaryView& gv, const SummaryView& cv,
                        const std::vector<int32_t>& ids, bool separated) {
  const int H = gv.layout.num_kv_heads, d = gv.layout.head_dim;
  double worst_mu = 0, worst_recon = 0, worst_energy = 0;
  for (int32_t id : ids)
    for (int h = 0; h < H; ++h) {
      const int64_t bh = int64_t(id) * H + h;
      double mu_scale = 1e-6;
      for (int e = 0; e < d; ++e)
        mu_scale = std::max(mu_scale, double(std::fabs(cv.mu[bh * d + e])));
      for (int e = 0; e < d; ++e) {
        ASSERT_TRUE(std::isfinite(gv.mu[bh * d + e]));
        worst_mu =
            std::max(worst_mu, std::fabs(double(gv.mu[bh * d + e]) - cv.mu[bh * d + e]) / mu_scale);
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
  EXPECT_LT(worst_energy, 1e-4);
  if (separated) EXPECT_LT(worst_recon, 2e-3);
}

// The fused quantizer (gq) equals the host quantizer applied to the fp32 build (gv).
void expect_quant_matches_host(const SummaryView& gv, GpuSummaries& gq,
                               const std::vector<int32_t>& ids) {
  const int H = gv.layout.num_kv_heads, d = gv.layout.head_dim, r = gv.layout.rank,
            P = gv.layout.page_size;
  const auto mu_q = gq.mu_q.download(), coeff_q = gq.coeff_q.download();
  const auto basis_q = gq.basis_q.download();
  const auto mu_s = gq.mu_scale.download(), bs = gq.basis_scale.download(),
             cs = gq.coeff_scale.download();
  int64_t codes = 0, off_by_one = 0;
  std::vector<int8_t> hm(d), hc(P * r);
  std::vector<uint8_t> hb(r * d / 2);
  // the quant build's scale groups (gq.L), one a row or per basis_group dims
  const int g = gq.L.basis_group, nv = int(basis_scales_per_head(gq.L));
  std::vector<float> hbs(nv), hcs(r);
  float hms = 0;
  for (int32_t id : ids)
    for (int h = 0; h < H; ++h) {
      const int64_t bh = int64_t(id) * H + h;
      summary_quantize(gv.mu + bh * d, gv.basis + bh * r * d, gv.coeff + bh * P * r, d, P, r, g,
                       hm.data(), &hms, hb.data(), hbs.data(), hc.data(), hcs.data());
      EXPECT_FLOAT_EQ(hms, mu_s[size_t(bh)]);
      for (int k = 0; k < nv; ++k) EXPECT_FLOAT_EQ(hbs[k], bs[size_t(bh * nv + k)]);
      for (int k = 0; k < r; ++k) EXPECT_FLOAT_EQ(hcs[k], cs[size_t(bh * r + k)]);
      auto cmp = [&](int a, int b) {
        ++codes;
        ASSERT_LE(std::abs(a - b), 1) << "block " << id << " head " << h;
        off_by_one += a != b;
      };
      for (int e = 0; e < d; ++e) cmp(hm[e], mu_q[size_t(bh * d + e)]);
      for (int e = 0; e < P * r; ++e) cmp(hc[e], coeff_q[size_t(bh * P * r + e)]);
      for (int e = 0; e < r * d / 2; ++e) {
        const uint8_t x = hb[e], y = basis_q[size_t(bh * r * d / 2 + e)];
        cmp(int8_t(x << 4) >> 4, int8_t(y << 4) >> 4);
        cmp(int8_t(x) >> 4, int8_t(y) >> 4);
      }
    }
  EXPECT_LE(double(off_by_one), 1e-3 * double(codes));
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
  download_fp32(g, gpu_store);
  const SummaryView gv = gpu_store.view();
  expect_matches_cpu(gv, cpu_store.view(), ids, c.decay < 1.0f);

  // int4 basis scales one a row, per 32 dims (the default at d >= 256) and per 16 dims
  for (int g : {c.d, 32, 16}) {
    SCOPED_TRACE(testing::Message() << "basis_group " << g);
    SummaryLayout ql = summary_layout_for(L, r, Precision::quant, g);
    GpuSummaries gq(ql);
    gq.mu_q.poison(), gq.basis_q.poison(), gq.coeff_q.poison(), gq.basis_scale.poison();
    cuda::SummaryBuilder qb(L, ql, c.solver, n);
    qb.build(gc.dview(), dids.p, n, gq.view(), nullptr);
    CK(cudaDeviceSynchronize());
    expect_quant_matches_host(gv, gq, ids);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Cases, SummaryBuildTest,
    ::testing::Values(BuildCase{DType::bf16, 128, cuda::Solver::warp_jacobi, 0.8f},
                      BuildCase{DType::bf16, 64, cuda::Solver::warp_jacobi, 0.8f},
                      BuildCase{DType::f16, 128, cuda::Solver::warp_jacobi, 1.0f},
                      BuildCase{DType::f32, 64, cuda::Solver::warp_jacobi, 1.0f},
                      BuildCase{DType::bf16, 128, cuda::Solver::cusolver, 0.8f},
                      BuildCase{DType::f16, 64, cuda::Solver::cusolver, 1.0f},
                      // head_dim 256 (Gemma-3 global layers)
                      BuildCase{DType::bf16, 256, cuda::Solver::warp_jacobi, 0.8f},
                      BuildCase{DType::f32, 256, cuda::Solver::warp_jacobi, 1.0f},
                      BuildCase{DType::f16, 256, cuda::Solver::cusolver, 0.8f}));

// A cache with a block stride (kv_cache.h; vLLM's V1 runner interleaves K and V per block)
// builds the same summaries bit for bit as its dense copy, with both bulk solvers (the
// cuSOLVER path's Gram and from-eigenvector stages read the keys too) and build_filled.
TEST(SummaryBuildStrided, InterleavedCacheBuildsTheSameBits) {
  SKIP_WITHOUT_GPU();
  const int H = 2, P = 16, d = 128, r = 8;
  const CacheLayout L{64, P, H, d, DType::bf16};
  GpuCache gc(L);
  gc.add_structured({16 * 20 + 3, 16 * 7, 16 * 15}, 500);
  const size_t eb = size_t(L.block_elems()) * 2;
  std::vector<uint8_t> h(size_t(L.num_blocks) * 2 * eb);
  for (int64_t b = 0; b < L.num_blocks; ++b) {
    std::memcpy(h.data() + size_t(b) * 2 * eb,
                static_cast<const uint8_t*>(gc.host.view().k) + b * eb, eb);
    std::memcpy(h.data() + size_t(b) * 2 * eb + eb,
                static_cast<const uint8_t*>(gc.host.view().v) + b * eb, eb);
  }
  DevBuf<uint8_t> kv(h);
  const KvCacheView strided{kv.p, kv.p + eb, L, 2 * L.block_elems()};
  const std::vector<int32_t> ids = gc.full_blocks();
  DevBuf<int32_t> dids(ids);
  const int64_t n = int64_t(ids.size());
  const SummaryLayout sl = summary_layout_for(L, r, Precision::fp32);
  // Bitwise (the blocks no page fills keep the NaN poison, which == would call unequal).
  auto bits = [](const std::vector<float>& x, const std::vector<float>& y) {
    return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * 4) == 0;
  };
  auto same = [&](const GpuSummaries& a, const GpuSummaries& b, const char* what) {
    EXPECT_TRUE(bits(a.mu.download(), b.mu.download())) << what;
    EXPECT_TRUE(bits(a.basis.download(), b.basis.download())) << what;
    EXPECT_TRUE(bits(a.coeff.download(), b.coeff.download())) << what;
  };
  // cuSOLVER's batched Jacobi is not bit-reproducible from call to call (its sweeps run
  // concurrently), so its two builds are compared on the key reconstructions mu + c B
  // (sign-free), within float rounding of the keys' scale.
  auto close = [&](const GpuSummaries& a, const GpuSummaries& b, const char* what) {
    EXPECT_TRUE(bits(a.mu.download(), b.mu.download())) << what;
    const auto ba = a.basis.download(), bb = b.basis.download();
    const auto ca = a.coeff.download(), cb = b.coeff.download();
    for (int64_t i = 0; i < n; ++i)
      for (int h = 0; h < H; ++h) {
        const size_t bh = size_t(ids[size_t(i)]) * H + h;
        for (int t = 0; t < P; ++t)
          for (int c = 0; c < d; ++c) {
            double ra = 0, rb = 0;
            for (int k = 0; k < r; ++k) {
              ra += double(ca[(bh * P + t) * r + k]) * ba[(bh * r + k) * d + c];
              rb += double(cb[(bh * P + t) * r + k]) * bb[(bh * r + k) * d + c];
            }
            ASSERT_NEAR(ra, rb, 1e-3) << what << " block " << ids[size_t(i)] << " head " << h;
          }
      }
  };
  for (const cuda::Solver solver : {cuda::Solver::warp_jacobi, cuda::Solver::cusolver}) {
    cuda::SummaryBuilder builder(L, sl, solver, n);
    GpuSummaries dense(sl), str(sl);
    for (GpuSummaries* g : {&dense, &str}) g->mu.poison(), g->basis.poison(), g->coeff.poison();
    builder.build(gc.dview(), dids.p, n, dense.view(), nullptr);
    builder.build(strided, dids.p, n, str.view(), nullptr);
    CK(cudaDeviceSynchronize());
    if (solver == cuda::Solver::cusolver)
      close(dense, str, "cusolver");
    else
      same(dense, str, "warp_jacobi");
  }
  GpuSummaries dense(sl), str(sl);
  for (GpuSummaries* g : {&dense, &str}) g->mu.poison(), g->basis.poison(), g->coeff.poison();
  cuda::summary_build_filled(gc.dview(), gc.dbatch(), P, dense.view(), nullptr);
  cuda::summary_build_filled(strided, gc.dbatch(), P, str.view(), nullptr);
  CK(cudaDeviceSynchronize());
  same(dense, str, "build_filled");
}

// build_filled (the latency kernel) builds exactly the pages that the last `appended` tokens
// completed, with the same accuracy as the bulk build; every other block stays untouched.
struct FilledCase {
  DType dtype;
  int d;
  int H;
  int n_seq;
  int appended;
  int local_rank;  // 10: low-rank pages plus noise; 0: random keys (noise around a centre)
  float decay;     // < 1: separated singular values (the subspace is unique)
};

void PrintTo(const FilledCase& c, std::ostream* os) {
  *os << dtype_name(c.dtype) << " d" << c.d << " H" << c.H << " seqs " << c.n_seq << " appended "
      << c.appended << " local_rank " << c.local_rank << " decay " << c.decay;
}

class SummaryBuildFilledTest : public ::testing::TestWithParam<FilledCase> {};

// Every byte of the blocks not in `built` still holds the 0xff poison.
template <typename T>
void expect_untouched(const DevBuf<T>& buf, size_t per_block, const std::vector<char>& built,
                      const char* what) {
  const auto h = buf.download();
  const auto* bytes = reinterpret_cast<const uint8_t*>(h.data());
  const size_t block_bytes = per_block * sizeof(T);
  for (size_t blk = 0; blk < built.size(); ++blk) {
    if (built[blk]) continue;
    for (size_t x = 0; x < block_bytes; ++x)
      ASSERT_EQ(bytes[blk * block_bytes + x], 0xff) << what << ": block " << blk << " written";
  }
}

// Quant summaries: poison every array; every array of the blocks not in `built` untouched.
void poison_quant(GpuSummaries& g) {
  g.mu_q.poison(), g.mu_scale.poison(), g.basis_q.poison();
  g.basis_scale.poison(), g.coeff_q.poison(), g.coeff_scale.poison();
}
void expect_quant_untouched(GpuSummaries& g, int H, int r, int d, int P,
                            const std::vector<char>& built) {
  const size_t nv = size_t(basis_scales_per_head(g.L));
  expect_untouched(g.mu_q, size_t(H) * d, built, "mu_q");
  expect_untouched(g.mu_scale, size_t(H), built, "mu_scale");
  expect_untouched(g.basis_q, size_t(H) * r * d / 2, built, "basis_q");
  expect_untouched(g.basis_scale, size_t(H) * nv, built, "basis_scale");
  expect_untouched(g.coeff_q, size_t(H) * P * r, built, "coeff_q");
  expect_untouched(g.coeff_scale, size_t(H) * r, built, "coeff_scale");
}

TEST_P(SummaryBuildFilledTest, MatchesCpuOnlyCompletedPages) {
  SKIP_WITHOUT_GPU();
  const FilledCase c = GetParam();
  const int P = 16, r = 8, H = c.H, d = c.d;
  // Ragged lengths: some sequences end exactly on (or just past) a page, others do not;
  // some are shorter than a page.
  const int offs[8] = {0, 3, 0, 9, 1, 7, 2, 15};
  std::vector<int64_t> lens(size_t(c.n_seq));
  int64_t pages = 0;
  for (int s = 0; s < c.n_seq; ++s) {
    lens[size_t(s)] = s % 8 == 5 ? 7 : 16 * (1 + s % 4) + offs[s % 8];
    pages += (lens[size_t(s)] + P - 1) / P;
  }
  CacheLayout L{pages + 4, P, H, d, c.dtype};
  GpuCache gc(L);
  for (int s = 0; s < c.n_seq; ++s) {
    std::vector<float> k, v;
    make_kv(lens[size_t(s)], H, d, P, c.local_rank, 500 + uint64_t(s), k, v, c.decay);
    gc.add(k, v, lens[size_t(s)]);
  }
  gc.sync();
  std::vector<int32_t> ids;  // the pages the last `appended` tokens completed
  std::vector<char> built(size_t(L.num_blocks), 0);
  for (int s = 0; s < c.n_seq; ++s) {
    const int64_t len = lens[size_t(s)];
    if (len >= P && len % P < c.appended) {
      ids.push_back(gc.host.blocks(s)[size_t(len / P - 1)]);
      built[size_t(ids.back())] = 1;
    }
  }
  ASSERT_FALSE(ids.empty());
  ASSERT_LT(ids.size(), size_t(c.n_seq));  // ragged: some sequences complete nothing

  SummaryLayout sl = summary_layout_for(L, r, Precision::fp32);
  SummaryStore cpu_store(sl);
  cpu::summary_build(gc.host.view(), ids.data(), int64_t(ids.size()), cpu_store.view());

  cuda::SummaryBuilder fb(L, sl, cuda::Solver::warp_jacobi, 1);
  GpuSummaries g(sl);
  g.mu.poison(), g.basis.poison(), g.coeff.poison();
  fb.build_filled(gc.dview(), gc.dbatch(), c.appended, g.view(), nullptr);
  CK(cudaDeviceSynchronize());
  SummaryStore gpu_store(sl);
  download_fp32(g, gpu_store);
  const SummaryView gv = gpu_store.view();
  expect_matches_cpu(gv, cpu_store.view(), ids, c.decay < 1.0f);
  expect_untouched(g.mu, size_t(H) * d, built, "mu");
  expect_untouched(g.basis, size_t(H) * r * d, built, "basis");
  expect_untouched(g.coeff, size_t(H) * P * r, built, "coeff");

  SummaryLayout ql = summary_layout_for(L, r, Precision::quant);
  GpuSummaries gq(ql);
  poison_quant(gq);
  cuda::SummaryBuilder qb(L, ql, cuda::Solver::warp_jacobi, 1);
  qb.build_filled(gc.dview(), gc.dbatch(), c.appended, gq.view(), nullptr);
  CK(cudaDeviceSynchronize());
  expect_quant_matches_host(gv, gq, ids);
  expect_quant_untouched(gq, H, r, d, P, built);
}

// Prefix SummaryBuildFilled: the sanitizer runs filter on SummaryBuildFilled*.
INSTANTIATE_TEST_SUITE_P(
    SummaryBuildFilled, SummaryBuildFilledTest,
    ::testing::Values(FilledCase{DType::bf16, 128, 8, 8, 1, 10, 0.8f},  // the serving shape
                      FilledCase{DType::bf16, 64, 2, 6, 3, 10, 0.8f},
                      FilledCase{DType::f16, 128, 2, 7, 1, 0, 1.0f},
                      FilledCase{DType::f32, 64, 4, 5, 2, 10, 1.0f},
                      FilledCase{DType::f32, 128, 2, 6, 16, 0, 1.0f},
                      FilledCase{DType::bf16, 128, 8, 96, 3, 10, 0.8f},  // many blocks
                      FilledCase{DType::f16, 64, 8, 64, 1, 0, 1.0f},
                      FilledCase{DType::bf16, 256, 4, 6, 1, 10, 0.8f},  // d 256
                      FilledCase{DType::f32, 256, 1, 5, 3, 0, 1.0f}));

// A step where no sequence completes a page writes nothing.
TEST(SummaryBuildFilled, NoCompletedPageWritesNothing) {
  SKIP_WITHOUT_GPU();
  const int H = 2, P = 16, r = 8, d = 128;
  CacheLayout L{16, P, H, d, DType::bf16};
  GpuCache gc(L);
  for (int64_t len : {16 * 2 + 5, 7, 16 + 1}) {
    std::vector<float> k, v;
    make_kv(len, H, d, P, 10, 3 + uint64_t(len), k, v, 0.8f);
    gc.add(k, v, len);
  }
  gc.sync();
  SummaryLayout sl = summary_layout_for(L, r, Precision::quant);
  cuda::SummaryBuilder b(L, sl, cuda::Solver::warp_jacobi, 1);
  GpuSummaries g(sl);
  poison_quant(g);
  b.build_filled(gc.dview(), gc.dbatch(), 1, g.view(), nullptr);
  CK(cudaDeviceSynchronize());
  const std::vector<char> none(size_t(L.num_blocks), 0);
  expect_quant_untouched(g, H, r, d, P, none);
}

}  // namespace
}  // namespace locks::cuda_test
