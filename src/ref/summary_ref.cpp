// Reference summary: eigen-decomposition of the centred P x P Gram matrix D D^T in float64.
// Deliberately a different algorithm from the core's SVD of D, so that a shared bug in one
// solver cannot hide. Basis row k = D^T u_k / sigma_k, re-orthonormalised (Gram-Schmidt)
// because eigenvectors of small eigenvalues lose accuracy in the Gram formulation.
#include <Eigen/Dense>
#include <cmath>

#include "checks.h"
#include "locks/error.h"
#include "locks/reference.h"

namespace locks::ref {

PageSummary64 summary_build_page(const KvCacheView& cache, int32_t block, int head, int rank) {
  detail::check_cache(cache);
  const CacheLayout& l = cache.layout;
  LOCKS_REQUIRE(block >= 0 && block < l.num_blocks, "block ", block, " out of range");
  LOCKS_REQUIRE(head >= 0 && head < l.num_kv_heads, "head ", head, " out of range");
  const int P = l.page_size, d = l.head_dim;
  LOCKS_REQUIRE(rank >= 1 && rank < P && rank <= d, "rank must be in [1, page_size - 1], got ",
                rank);

  Eigen::MatrixXd K(P, d);
  for (int i = 0; i < P; ++i) {
    const int64_t off = l.offset(block, i, head);
    for (int c = 0; c < d; ++c) {
      K(i, c) = load_as_float(cache.k, l.dtype, off + c);
      LOCKS_REQUIRE(std::isfinite(K(i, c)), "key has NaN or Inf");
    }
  }
  const Eigen::RowVectorXd mu = K.colwise().mean();
  const Eigen::MatrixXd D = K.rowwise() - mu;
  const Eigen::MatrixXd G = D * D.transpose();
  Eigen::SelfAdjointEigenSolver<Eigen::MatrixXd> es(G);
  LOCKS_REQUIRE(es.info() == Eigen::Success, "eigen-decomposition failed");
  const Eigen::VectorXd& lam = es.eigenvalues();  // ascending
  const double lam_max = std::max(lam(P - 1), 0.0);

  PageSummary64 out;
  out.mu.assign(mu.data(), mu.data() + d);
  out.sigma.resize(P);
  for (int k = 0; k < P; ++k) out.sigma[k] = std::sqrt(std::max(lam(P - 1 - k), 0.0));

  Eigen::MatrixXd V = Eigen::MatrixXd::Zero(rank, d);
  for (int k = 0; k < rank; ++k) {
    const double lk = lam(P - 1 - k);
    if (!(lk > 1e-12 * lam_max)) continue;  // sigma_k <= 1e-6 sigma_0: undetermined direction
    Eigen::RowVectorXd v = (D.transpose() * es.eigenvectors().col(P - 1 - k)).transpose();
    for (int m = 0; m < k; ++m) v -= v.dot(V.row(m)) * V.row(m);  // modified Gram-Schmidt
    const double n = v.norm();
    if (n > 0) V.row(k) = v / n;
  }
  const Eigen::MatrixXd C = D * V.transpose();  // [P, r]: coeff[i][k] = basis_k . (k_i - mu)
  out.basis.resize(size_t(rank) * d);
  out.coeff.resize(size_t(P) * rank);
  for (int k = 0; k < rank; ++k)
    for (int c = 0; c < d; ++c) out.basis[size_t(k) * d + c] = V(k, c);
  for (int i = 0; i < P; ++i)
    for (int k = 0; k < rank; ++k) out.coeff[size_t(i) * rank + k] = C(i, k);
  return out;
}

}  // namespace locks::ref
