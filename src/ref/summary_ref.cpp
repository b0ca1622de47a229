// Reference summary: eigen-decomposition of the centred P x P Gram matrix D D^T in float64.
// Deliberately a different algorithm from the core's SVD of D, so that a shared bug in one
// solver cannot hide. Basis row k = D^T u_k / sigma_k, re-orthonormalised (Gram-Schmidt)
// because eigenvectors of small eigenvalues lose accuracy in the Gram formulation.
#include <Eigen/Dense>
#include <algorithm>
#include <cmath>
#include <vector>

#include "checks.h"
#include "locks/error.h"
#include "locks/reference.h"

namespace locks::ref {

PageSummary64 summary_build_page(const KvCacheView& cache, int32_t block, int head, int rank,
                                 const float* qweight) {
  detail::check_cache(cache);
  const CacheLayout& l = cache.layout;
  LOCKS_REQUIRE(block >= 0 && block < l.num_blocks, "block ", block, " out of range");
  LOCKS_REQUIRE(head >= 0 && head < l.num_kv_heads, "head ", head, " out of range");
  const int P = l.page_size, d = l.head_dim;
  LOCKS_REQUIRE(rank >= 1 && rank < P && rank <= d, "rank must be in [1, page_size - 1], got ",
                rank);

  // Plain loops for the products (no Eigen GEMM, which would go multi-threaded under
  // OpenMP); Eigen only for the symmetric eigen-solver.
  std::vector<double> D(size_t(P) * d), mu(size_t(d), 0.0);
  for (int i = 0; i < P; ++i) {
    const int64_t off = detail::element_offset(cache, block, i, head);
    for (int c = 0; c < d; ++c) {
      const double x = load_as_float(cache.k, l.dtype, off + c);
      LOCKS_REQUIRE(std::isfinite(x), "key has NaN or Inf");
      D[size_t(i) * d + c] = x;
      mu[size_t(c)] += x;
    }
  }
  for (int c = 0; c < d; ++c) mu[size_t(c)] /= P;
  // Query-weighted summaries (summary.h): the fit is that of the weighted deviations.
  const float* w = qweight ? qweight + int64_t(head) * d : nullptr;
  for (int i = 0; i < P; ++i)
    for (int c = 0; c < d; ++c)
      D[size_t(i) * d + c] = (D[size_t(i) * d + c] - mu[size_t(c)]) * (w ? double(w[c]) : 1.0);
  Eigen::MatrixXd G(P, P);  // centred Gram matrix D D^T
  for (int i = 0; i < P; ++i)
    for (int j = 0; j <= i; ++j) {
      double g = 0;
      for (int c = 0; c < d; ++c) g += D[size_t(i) * d + c] * D[size_t(j) * d + c];
      G(i, j) = G(j, i) = g;
    }
  Eigen::SelfAdjointEigenSolver<Eigen::MatrixXd> es(G);
  LOCKS_REQUIRE(es.info() == Eigen::Success, "eigen-decomposition failed");
  const Eigen::VectorXd& lam = es.eigenvalues();  // ascending
  const double lam_max = std::max(lam(P - 1), 0.0);

  PageSummary64 out;
  out.mu = mu;
  out.sigma.resize(size_t(P));
  for (int k = 0; k < P; ++k) out.sigma[size_t(k)] = std::sqrt(std::max(lam(P - 1 - k), 0.0));

  out.basis.assign(size_t(rank) * d, 0.0);
  for (int k = 0; k < rank; ++k) {
    const double lk = lam(P - 1 - k);
    if (!(lk > 1e-12 * lam_max)) continue;  // sigma_k <= 1e-6 sigma_0: undetermined direction
    std::vector<double> v(size_t(d), 0.0);  // D^T u_k
    for (int i = 0; i < P; ++i) {
      const double u = es.eigenvectors()(i, P - 1 - k);
      for (int c = 0; c < d; ++c) v[size_t(c)] += D[size_t(i) * d + c] * u;
    }
    for (int m = 0; m < k; ++m) {  // modified Gram-Schmidt against the rows above
      const double* row = out.basis.data() + size_t(m) * d;
      double dot = 0;
      for (int c = 0; c < d; ++c) dot += v[size_t(c)] * row[c];
      for (int c = 0; c < d; ++c) v[size_t(c)] -= dot * row[c];
    }
    double n = 0;
    for (double x : v) n += x * x;
    n = std::sqrt(n);
    if (n > 0)
      for (int c = 0; c < d; ++c) out.basis[size_t(k) * d + c] = v[size_t(c)] / n;
  }
  out.coeff.assign(size_t(P) * rank, 0.0);  // coeff[i][k] = basis_k . ((k_i - mu) * w)
  for (int i = 0; i < P; ++i)
    for (int k = 0; k < rank; ++k) {
      double x = 0;
      for (int c = 0; c < d; ++c) x += out.basis[size_t(k) * d + c] * D[size_t(i) * d + c];
      out.coeff[size_t(i) * rank + k] = x;
    }
  return out;
}

}  // namespace locks::ref
