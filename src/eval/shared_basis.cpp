#include "shared_basis.h"

#include <Eigen/Dense>

#include "locks/error.h"

namespace locks::eval {

std::vector<float> shared_basis(const float* keys, int64_t tokens, int64_t stride, int d, int R) {
  LOCKS_REQUIRE(R >= 1 && R <= d, "shared basis rank must be in [1, head_dim = ", d, "], got ", R);
  Eigen::MatrixXd gram = Eigen::MatrixXd::Zero(d, d);
  // Accumulate in blocks of rows (a rank-k update per block keeps this BLAS-3 shaped).
  const int64_t blk = 256;
  Eigen::MatrixXd rows(blk, d);
  for (int64_t t0 = 0; t0 < tokens; t0 += blk) {
    const int64_t n = std::min(blk, tokens - t0);
    for (int64_t i = 0; i < n; ++i)
      for (int c = 0; c < d; ++c) rows(i, c) = keys[(t0 + i) * stride + c];
    gram.selfadjointView<Eigen::Lower>().rankUpdate(rows.topRows(n).transpose());
  }
  Eigen::SelfAdjointEigenSolver<Eigen::MatrixXd> es(gram.selfadjointView<Eigen::Lower>());
  LOCKS_REQUIRE(es.info() == Eigen::Success, "eigen-decomposition of the key Gram matrix failed");
  std::vector<float> basis(size_t(R) * d);
  for (int r = 0; r < R; ++r)  // eigenvalues ascending: take from the end
    for (int c = 0; c < d; ++c) basis[size_t(r) * d + c] = float(es.eigenvectors()(c, d - 1 - r));
  return basis;
}

}  // namespace locks::eval
