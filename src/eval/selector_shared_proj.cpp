// Shared-basis selector, simplest form (the preprint's Proposition 1 setting): every key is
// projected onto one rank-R basis of all prefix keys of its KV head, and page j scores
//   s_j = log sum_{i in j} exp(scale * (W^T q) . (W^T k_i)).
// Directions outside the basis are invisible to it: the blind spot LOCKS targets.
// Metadata: R projected coordinates per key in bf16, plus the basis (d x R bf16) amortised
// over the pages. The basis is taken from the scoring keys (layer{L}_k.npy), in which
// queries meet keys; see docs/capture_format.md on pre-RoPE keys.
#include <algorithm>
#include <cmath>
#include <limits>

#include "locks/error.h"
#include "score_rows.h"
#include "selectors.h"
#include "shared_basis.h"

namespace locks::eval {
namespace {

class SharedProj final : public PageSelector {
 public:
  explicit SharedProj(const SelectorParams& p) : p_(p) {}
  std::string name() const override { return "shared_proj"; }
  std::string description() const override {
    return "shared basis: keys projected on one rank-R SVD basis, page log-sum-exp";
  }
  void prepare(const LayerContext& ctx) override {
    const int d = ctx.head_dim;
    R_ = p_.basis_rank > 0 ? p_.basis_rank : d / 4;
    LOCKS_REQUIRE(R_ <= d, "basis rank ", R_, " exceeds head_dim ", d);
    const int64_t T = int64_t(ctx.num_full_pages) * ctx.page_size;
    basis_.assign(ctx.kv_heads, {});
    proj_.assign(ctx.kv_heads, {});
    for (int h = 0; h < ctx.kv_heads; ++h) {
      // All prefix keys of this head (the tail page too: it is part of the prefix).
      basis_[h] = shared_basis(ctx.key(0, h), ctx.tokens, int64_t(ctx.kv_heads) * d, d, R_);
      std::vector<float>& pr = proj_[h];
      pr.assign(size_t(T) * R_, 0.0f);
      const float* W = basis_[h].data();
#pragma omp parallel for schedule(static)
      for (int64_t t = 0; t < T; ++t) {
        const float* k = ctx.key(t, h);
        for (int r = 0; r < R_; ++r) {
          double acc = 0;
          for (int c = 0; c < d; ++c) acc += double(W[size_t(r) * d + c]) * k[c];
          pr[size_t(t) * R_ + r] = static_cast<float>(acc);
        }
      }
    }
  }
  void score(const LayerContext& ctx, const SelectConfig&, float* head_scores) override {
    const int d = ctx.head_dim, P = ctx.page_size;
    score_rows(ctx, head_scores, [&](const float* q, int kvh) {
      const float* W = basis_[kvh].data();
      std::vector<double> qp(R_);
      for (int r = 0; r < R_; ++r) {
        double acc = 0;
        for (int c = 0; c < d; ++c) acc += double(W[size_t(r) * d + c]) * q[c];
        qp[r] = acc * ctx.scale;
      }
      return [&, kvh, qp = std::move(qp)](int j) {
        double l[256];
        for (int i = 0; i < P; ++i) {
          const float* p = proj_[kvh].data() + (int64_t(j) * P + i) * R_;
          double acc = 0;
          for (int r = 0; r < R_; ++r) acc += qp[r] * p[r];
          l[i] = acc;
        }
        return log_sum_exp(l, P);
      };
    });
  }
  double metadata_bytes_per_page(const LayerContext& ctx) const override {
    const int R = p_.basis_rank > 0 ? p_.basis_rank : ctx.head_dim / 4;
    return ctx.page_size * R * 2.0 +
           double(ctx.head_dim) * R * 2.0 / std::max(1, ctx.num_full_pages);
  }
  double scoring_bytes_per_step(const LayerContext& ctx) const override {
    const int R = p_.basis_rank > 0 ? p_.basis_rank : ctx.head_dim / 4;
    return ctx.num_full_pages * ctx.page_size * R * 2.0 + double(ctx.head_dim) * R * 2.0;
  }

 private:
  SelectorParams p_;
  int R_ = 0;
  std::vector<std::vector<float>> basis_, proj_;  // per KV head
};

}  // namespace

std::unique_ptr<PageSelector> make_shared_proj(const SelectorParams& p) {
  return std::make_unique<SharedProj>(p);
}

}  // namespace locks::eval
