// cpu::summary_build: per (block, KV head) centroid, top-r right singular vectors of the
// centred P x d key matrix (its columns scaled by the query weights, when given), and each
// key's coefficients in that basis.
//
// Computed in double (keys are read from fp32/fp16/bf16 and widened), then rounded to
// float: P x d is tiny, and double keeps the basis accurate when singular values are
// close. The SVD is Eigen's JacobiSVD (one-sided Jacobi: accurate singular vectors even
// for close singular values). For the usual P <= d the wide P x d matrix D is first reduced
// by a Householder QR of D^T = Q R, so Jacobi runs on the P x P R^T = U S W^T and
// V = Q W: measured 62 us against 96 us for JacobiSVD's own (column-pivoting) QR path on a
// 16 x 128 page. Eigen 3.4's BDCSVD was faster still but lost accuracy in the basis
// (projector errors up to 3e-4 against the float64 reference), so it is not used. The
// eigen-decomposition of the P x P Gram matrix squares the condition number and is what the
// float64 reference does, so the two stay independent checks.
#include <Eigen/Dense>
#include <atomic>
#include <cmath>
#include <vector>

#include "internal/check.h"
#include "locks/error.h"
#include "locks/summary.h"

namespace locks::cpu {

void summary_build(const KvCacheView& cache, const int32_t* block_ids, int64_t n_blocks,
                   const SummaryView& out) {
  const CacheLayout& cl = cache.layout;
  const SummaryLayout& sl = out.layout;
  validate_cache(cache);
  validate_summary_layout(sl);
  LOCKS_REQUIRE(sl.num_blocks == cl.num_blocks && sl.page_size == cl.page_size &&
                    sl.num_kv_heads == cl.num_kv_heads && sl.head_dim == cl.head_dim,
                "summary layout (blocks ", sl.num_blocks, ", P ", sl.page_size, ", heads ",
                sl.num_kv_heads, ", d ", sl.head_dim, ") does not match the cache (blocks ",
                cl.num_blocks, ", P ", cl.page_size, ", heads ", cl.num_kv_heads, ", d ",
                cl.head_dim, ")");
  LOCKS_REQUIRE(n_blocks >= 0, "n_blocks must be >= 0, got ", n_blocks);
  // Checked even when no page is built (a filled-page update with none complete), so that
  // bad weights are refused on every call, not only on the steps that fill a page.
  validate_qweight(out.qweight, cl.num_kv_heads, cl.head_dim);
  if (n_blocks == 0) return;
  LOCKS_REQUIRE(block_ids != nullptr, "block_ids is null");
  LOCKS_REQUIRE(cache.k != nullptr, "cache.k is null");
  detail::check_summary_arrays(out, __func__);
  for (int64_t i = 0; i < n_blocks; ++i) {
    LOCKS_REQUIRE(block_ids[i] >= 0 && block_ids[i] < cl.num_blocks, "block_ids[", i,
                  "] = ", block_ids[i], " outside [0, ", cl.num_blocks, ")");
  }

  const int P = cl.page_size, H = cl.num_kv_heads, d = cl.head_dim, r = sl.rank;
  const int64_t items = n_blocks * H;
  std::atomic<int64_t> bad_item{-1};  // a page with non-finite keys or summary, reported after

#pragma omp parallel if (items >= 4)  // one SVD is ~60 us: worth a thread from a few
  {
    Eigen::MatrixXd D(P, d), Rt(P, P), V(d, r);
    Eigen::HouseholderQR<Eigen::MatrixXd> qr(d, P);
    Eigen::JacobiSVD<Eigen::MatrixXd, Eigen::NoQRPreconditioner> svd_sq(P, P, Eigen::ComputeFullV);
    Eigen::JacobiSVD<Eigen::MatrixXd> svd_wide;
    std::vector<float> mu(static_cast<size_t>(d)), basis(static_cast<size_t>(r) * d),
        coeff(static_cast<size_t>(P) * r);
#pragma omp for schedule(dynamic, 4)
    for (int64_t item = 0; item < items; ++item) {
      const int32_t block = block_ids[item / H];
      const int h = static_cast<int>(item % H);
      bool finite = true;
      for (int s = 0; s < P; ++s) {
        const int64_t off = cache.offset(block, s, h);
        for (int e = 0; e < d; ++e) {
          const double x = load_as_float(cache.k, cl.dtype, off + e);
          finite = finite && std::isfinite(x);
          D(s, e) = x;
        }
      }
      if (!finite) {
        int64_t expected = -1;
        bad_item.compare_exchange_strong(expected, item);
        continue;
      }
      const Eigen::RowVectorXd mean = D.colwise().mean();
      D.rowwise() -= mean;
      if (out.qweight)  // query-weighted summaries (summary.h): fit the weighted deviations
        for (int e = 0; e < d; ++e) D.col(e) *= double(out.qweight[int64_t(h) * d + e]);
      if (P <= d) {
        qr.compute(D.transpose());  // D^T = Q R, R: P x P upper triangular
        Rt = qr.matrixQR().topRows(P).triangularView<Eigen::Upper>().transpose();
        svd_sq.compute(Rt, Eigen::ComputeFullV);  // R^T = U S W^T
        V.setZero(d, r);
        V.topRows(P) = svd_sq.matrixV().leftCols(r);
        V.applyOnTheLeft(qr.householderQ());  // top-r right singular vectors of D: Q W_r
      } else {
        svd_wide.compute(D, Eigen::ComputeThinV);
        V = svd_wide.matrixV().leftCols(r);
      }
      const Eigen::MatrixXd C = D * V;  // P x r coefficients
      for (int e = 0; e < d; ++e) mu[size_t(e)] = float(mean(e));
      for (int k = 0; k < r; ++k)
        for (int e = 0; e < d; ++e) basis[size_t(k) * d + e] = float(V(e, k));
      for (int s = 0; s < P; ++s)
        for (int k = 0; k < r; ++k) coeff[size_t(s) * r + k] = float(C(s, k));

      const int64_t bh = int64_t(block) * H + h;
      if (sl.precision == Precision::fp32) {
        std::copy(mu.begin(), mu.end(), out.mu + bh * d);
        std::copy(basis.begin(), basis.end(), out.basis + bh * r * d);
        std::copy(coeff.begin(), coeff.end(), out.coeff + bh * P * r);
      } else {
        try {  // throws on a non-finite summary (keys near float's range): report after
          summary_quantize(mu.data(), basis.data(), coeff.data(), d, P, r, out.layout.basis_group,
                           out.mu_q + bh * d, out.mu_scale + bh, out.basis_q + bh * r * (d / 2),
                           out.basis_scale + bh * basis_scales_per_head(out.layout),
                           out.coeff_q + bh * P * r, out.coeff_scale + bh * r);
        } catch (const Error&) {
          int64_t expected = -1;
          bad_item.compare_exchange_strong(expected, item);
        }
      }
    }
  }
  const int64_t bad = bad_item.load();
  LOCKS_REQUIRE(bad < 0, "block ", block_ids[bad / H], ", KV head ", bad % H,
                " has a non-finite key (or a summary beyond float range)");
}

}  // namespace locks::cpu
