// One shared rank-R basis of all prefix keys of a KV head (ShadowKV's SVD of the key
// matrix): the top-R right singular vectors of K [tokens, d], found as the top-R
// eigenvectors of the d x d Gram matrix K^T K (same subspace as the SVD; the d x d
// eigen-problem is far cheaper than an SVD of a tokens x d matrix). Uncentred, as in
// ShadowKV. Eigen's SelfAdjointEigenSolver, in double.
#pragma once

#include <cstdint>
#include <vector>

namespace locks::eval {

// keys: `tokens` rows of `d` floats, `stride` floats apart. Returns basis rows [R, d],
// ordered by decreasing eigenvalue.
std::vector<float> shared_basis(const float* keys, int64_t tokens, int64_t stride, int d, int R);

}  // namespace locks::eval
