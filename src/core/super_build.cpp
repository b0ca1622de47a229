// cpu::super_build and super_dequantize (super_summary.h): the level-1 summary of a group of
// S pages from its keys. The basis is taken from the covariance of all S*P keys (not only the
// page centroids) so that the extent variant can bound single keys in it too.
#include <Eigen/Dense>
#include <algorithm>
#include <cmath>
#include <vector>

#include "internal/row_convert.h"
#include "locks/error.h"
#include "locks/super_summary.h"
#include "super_group_edge.h"  // src/common

namespace locks {
namespace {

// Symmetric int8 codes of n values at stride (one scale); returns the scale.
float quant8(const double* x, int n, int stride, int8_t* out, int out_stride) {
  double m = 0;
  for (int i = 0; i < n; ++i) m = std::max(m, std::fabs(x[i * stride]));
  const double s = m / 127.0;
  for (int i = 0; i < n; ++i)
    out[i * out_stride] =
        s == 0 ? 0 : int8_t(std::clamp(std::nearbyint(x[i * stride] / s), -127.0, 127.0));
  return float(s);
}

int8_t outward(double x, double s, bool up) {
  if (s == 0) return 0;
  const double c = up ? std::ceil(x / s - 1e-9) : std::floor(x / s + 1e-9);
  return int8_t(std::clamp(c, -127.0, 127.0));
}

}  // namespace

SuperGroupF super_dequantize(const SuperView& s, int64_t slot, int head) {
  SuperGroupF g;
  super_dequantize_into(s, slot, head, g);
  return g;
}

void super_dequantize_into(const SuperView& s, int64_t slot, int head, SuperGroupF& g) {
  const SuperLayout& l = s.layout;
  validate_super_layout(l);
  LOCKS_REQUIRE(slot >= 0 && slot < l.num_slots, "super slot ", slot, " out of range [0, ",
                l.num_slots, ")");
  LOCKS_REQUIRE(head >= 0 && head < l.num_kv_heads, "head ", head, " out of range");
  LOCKS_REQUIRE(s.mu_q && s.mu_scale && s.basis_q && s.basis_scale && s.coord_q && s.coord_scale &&
                    s.radius_q && s.radius_scale,
                "super summary arrays are null");
  LOCKS_REQUIRE(!l.extent || (s.lo_q && s.hi_q && s.extent_scale), "extent arrays are null");
  const int d = l.head_dim, R = l.rank, S = l.group_pages;
  const int64_t gh = slot * l.num_kv_heads + head;
  g.mu.resize(d);
  for (int c = 0; c < d; ++c) g.mu[c] = s.mu_scale[gh] * float(s.mu_q[gh * d + c]);
  g.basis.resize(size_t(R) * d);
  for (int k = 0; k < R; ++k) {
    const uint8_t* codes = s.basis_q + (gh * R + k) * (d / 2);
    const float sc = s.basis_scale[gh * R + k];
    for (int e = 0; e < d / 2; ++e) {
      g.basis[size_t(k) * d + 2 * e] =
          sc * float(static_cast<int8_t>(static_cast<uint8_t>(codes[e] << 4)) >> 4);
      g.basis[size_t(k) * d + 2 * e + 1] = sc * float(static_cast<int8_t>(codes[e]) >> 4);
    }
  }
  g.coord.resize(size_t(S) * R);
  g.radius.resize(S);
  for (int p = 0; p < S; ++p) {
    for (int k = 0; k < R; ++k)
      g.coord[size_t(p) * R + k] =
          s.coord_scale[gh * R + k] * float(s.coord_q[(gh * S + p) * R + k]);
    g.radius[p] = s.radius_scale[gh] * float(s.radius_q[gh * S + p]);
  }
  if (l.extent) {
    g.lo.resize(size_t(S) * R);
    g.hi.resize(size_t(S) * R);
    for (int p = 0; p < S; ++p)
      for (int k = 0; k < R; ++k) {
        const float sc = s.extent_scale[gh * R + k];
        g.lo[size_t(p) * R + k] = sc * float(s.lo_q[(gh * S + p) * R + k]);
        g.hi[size_t(p) * R + k] = sc * float(s.hi_q[(gh * S + p) * R + k]);
      }
  } else {
    g.lo.clear();
    g.hi.clear();
  }
}

namespace cpu {

void super_build(const KvCacheView& cache, const int32_t* group_blocks, const int32_t* slots,
                 int64_t n, const SuperView& out) {
  const SuperLayout& l = out.layout;
  validate_super_layout(l);
  validate_cache(cache);
  LOCKS_REQUIRE(cache.k != nullptr, "cache.k is null");
  LOCKS_REQUIRE(cache.layout.page_size == l.page_size &&
                    cache.layout.num_kv_heads == l.num_kv_heads &&
                    cache.layout.head_dim == l.head_dim,
                "super layout (page_size ", l.page_size, ", kv heads ", l.num_kv_heads,
                ", head_dim ", l.head_dim, ") does not match the cache");
  LOCKS_REQUIRE(n >= 0, "n must be >= 0, got ", n);
  if (n == 0) return;
  LOCKS_REQUIRE(group_blocks != nullptr && slots != nullptr, "group_blocks / slots are null");
  LOCKS_REQUIRE(out.mu_q && out.mu_scale && out.basis_q && out.basis_scale && out.coord_q &&
                    out.coord_scale && out.radius_q && out.radius_scale,
                "super summary arrays are null");
  LOCKS_REQUIRE(!l.extent || (out.lo_q && out.hi_q && out.extent_scale), "extent arrays are null");
  const int S = l.group_pages, P = l.page_size, d = l.head_dim, R = l.rank;
  const int H = l.num_kv_heads;
  for (int64_t i = 0; i < n; ++i) {
    LOCKS_REQUIRE(slots[i] >= 0 && slots[i] < l.num_slots, "slot ", slots[i], " out of range [0, ",
                  l.num_slots, ")");
    for (int p = 0; p < S; ++p) {
      const int32_t b = group_blocks[i * S + p];
      LOCKS_REQUIRE(b >= 0 && b < cache.layout.num_blocks, "block ", b, " out of range [0, ",
                    cache.layout.num_blocks, ")");
    }
  }
  // Non-finite keys are refused before anything is written (outputs whole or not at all).
  {
    std::vector<float> row(d);
    for (int64_t i = 0; i < n * S; ++i)
      for (int t = 0; t < P; ++t)
        for (int h = 0; h < H; ++h) {
          detail::convert_row(cache.k, cache.layout.dtype, cache.offset(group_blocks[i], t, h), d,
                              row.data());
          for (int c = 0; c < d; ++c)
            LOCKS_REQUIRE(std::isfinite(row[c]), "non-finite key in block ", group_blocks[i]);
        }
  }

#pragma omp parallel for schedule(dynamic)
  for (int64_t item = 0; item < n * H; ++item) {
    const int64_t i = item / H;
    const int h = int(item % H);
    const int N = S * P;
    Eigen::MatrixXd K(N, d);
    std::vector<float> row(d);
    for (int p = 0; p < S; ++p)
      for (int t = 0; t < P; ++t) {
        detail::convert_row(cache.k, cache.layout.dtype,
                            cache.offset(group_blocks[i * S + p], t, h), d, row.data());
        for (int c = 0; c < d; ++c) K(p * P + t, c) = row[c];
      }
    const Eigen::RowVectorXd M = K.colwise().mean();
    Eigen::MatrixXd D = K.rowwise() - M;
    const Eigen::MatrixXd C = (D.transpose() * D) / double(N);
    Eigen::SelfAdjointEigenSolver<Eigen::MatrixXd> eig(C);
    // Eigenvalues ascend: the top R eigenvectors are the last R columns.
    Eigen::MatrixXd W(R, d);
    for (int k = 0; k < R; ++k) {
      W.row(k) = eig.eigenvectors().col(d - 1 - k).transpose();
      int at = 0;  // the first component of largest magnitude
      for (int c = 1; c < d; ++c)
        if (std::fabs(W(k, c)) > std::fabs(W(k, at))) at = c;
      if (W(k, at) < 0) W.row(k) *= -1.0;
    }

    const int64_t gh = int64_t(slots[i]) * H + h;
    std::vector<double> tmp(std::max(d, S * R));
    for (int c = 0; c < d; ++c) tmp[c] = M(c);
    out.mu_scale[gh] = quant8(tmp.data(), d, 1, out.mu_q + gh * d, 1);
    for (int k = 0; k < R; ++k) {
      double m = W.row(k).cwiseAbs().maxCoeff();
      const double s = m / 7.0;
      out.basis_scale[gh * R + k] = float(s);
      uint8_t* codes = out.basis_q + (gh * R + k) * (d / 2);
      for (int e = 0; e < d / 2; ++e) {
        auto q4 = [&](double x) {
          return s == 0 ? 0 : int(std::clamp(std::nearbyint(x / s), -7.0, 7.0));
        };
        const int lo = q4(W(k, 2 * e)), hi = q4(W(k, 2 * e + 1));
        codes[e] = uint8_t((lo & 0xF) | ((hi & 0xF) << 4));
      }
    }
    // Page centroids, their coordinates and residual radii.
    std::vector<double> coord(size_t(S) * R), radius(S);
    for (int p = 0; p < S; ++p) {
      const Eigen::RowVectorXd dev = D.middleRows(p * P, P).colwise().mean();
      const Eigen::VectorXd a = W * dev.transpose();
      for (int k = 0; k < R; ++k) coord[size_t(p) * R + k] = a(k);
      radius[p] = (dev.transpose() - W.transpose() * a).norm();
    }
    for (int k = 0; k < R; ++k)
      out.coord_scale[gh * R + k] = quant8(coord.data() + k, S, R, out.coord_q + gh * S * R + k, R);
    double rmax = 0;
    for (int p = 0; p < S; ++p) rmax = std::max(rmax, radius[p]);
    const double rs = rmax / 255.0;
    out.radius_scale[gh] = float(rs);
    for (int p = 0; p < S; ++p)
      out.radius_q[gh * S + p] =
          rs == 0 ? 0 : uint8_t(std::clamp(std::ceil(radius[p] / rs - 1e-9), 0.0, 255.0));
    if (l.extent) {
      const Eigen::MatrixXd Ck = D * W.transpose();  // [N, R]: every key in the group basis
      std::vector<double> lo(size_t(S) * R), hi(size_t(S) * R);
      for (int p = 0; p < S; ++p)
        for (int k = 0; k < R; ++k) {
          lo[size_t(p) * R + k] = Ck.block(p * P, k, P, 1).minCoeff();
          hi[size_t(p) * R + k] = Ck.block(p * P, k, P, 1).maxCoeff();
        }
      for (int k = 0; k < R; ++k) {
        double m = 0;
        for (int p = 0; p < S; ++p)
          m = std::max({m, std::fabs(lo[size_t(p) * R + k]), std::fabs(hi[size_t(p) * R + k])});
        const double s = m / 127.0;
        out.extent_scale[gh * R + k] = float(s);
        for (int p = 0; p < S; ++p) {
          out.lo_q[(gh * S + p) * R + k] = outward(lo[size_t(p) * R + k], s, false);
          out.hi_q[(gh * S + p) * R + k] = outward(hi[size_t(p) * R + k], s, true);
        }
      }
    }
  }
}

void super_build_filled(const KvCacheView& cache, const BatchView& batch, int appended,
                        const SuperTableView& table, const SuperView& out) {
  const SuperLayout& l = out.layout;
  validate_super_layout(l);
  const int S = l.group_pages, P = l.page_size;
  const int groups = detail::check_filled_args(l, batch, appended, table, __func__);
  // The host sees every value, so (unlike the kernel, which skips them) bad lengths, slots and
  // block ids are errors; the groups to build are gathered first and built in one call, so a
  // refusal writes nothing.
  validate_batch(cache.layout, batch);
  std::vector<int32_t> blocks, slots;
  for (int b = 0; b < batch.batch_size; ++b) {
    const int g = detail::completed_group(batch.seq_lens[b], appended, S * P,
                                          batch.max_blocks_per_seq, P, groups);
    if (g < 0) continue;
    slots.push_back(table.table[int64_t(b) * table.stride + g]);
    for (int p = 0; p < S; ++p)
      blocks.push_back(
          batch.block_table[int64_t(b) * batch.block_table_stride + int64_t(g) * S + p]);
  }
  super_build(cache, blocks.data(), slots.data(), int64_t(slots.size()), out);
}

}  // namespace cpu
}  // namespace locks
