// LOCKS summary variants for the head_dim-256 study (docs/study_gemma3.md): one selector whose
// name spells the variant, so every lever is measured through the same harness path as the
// shipped `locks_fp32` / `locks_quant`. The summaries are built here (Eigen SVD in double),
// quantized and de-quantized here ("fake quant": the scores are those of the stored codes,
// computed in double), so no library code changes while a lever is only being measured.
//
// Name: "lx" followed by '-'-separated tokens (any order; defaults = the shipped int4 layout):
//   rN       rank N (default: --rank)
//   b32 | b8 | b4 | b4gN     basis fp32 / int8 per row / int4 per row (default) /
//                            int4 with one scale per N consecutive dims of a row
//   c32 | c8 | c8k | c4      coefficients fp32 / int8 per rank column (default) /
//                            int8 per key / int4 per rank column
//   m32 | m8 | m8gN | m8ch   centroid fp32 / int8 per vector (default) / int8 per N dims /
//                            int8 with per-channel scales shared by the layer's pages
//   wq       query-weighted basis: the SVD of the deviations scaled per channel by the RMS of
//            the observation-window queries (q_obs), i.e. the basis that minimises the
//            expected logit error under a diagonal query covariance; scoring divides q by
//            the same weights (an exact reformulation at full rank)
//   wqf      like wq, but the weights folded into the stored basis (rows V'_k / w, quantized
//            as such): scoring multiplies the raw query, i.e. the library's score_pages and
//            kernels unchanged; only the summary build differs
//   wqoN     the weights from the last N observation steps only (sensitivity to calibration)
//   res      residual-energy correction: per key the energy e_i = |k_i - mu - V^T c_i|^2
//            (stored int8, one scale per page); logit_i += scale^2 |q_perp|^2 e_i / (2 (d-r))
//            = E[exp(scale q.e)] for a residual isotropic in the basis' complement
//   max      GQA rule max-share instead of share-averaging
//   tauNN    adaptive budget: of the pages the budget selects, keep the fewest whose estimated
//            share of the group's mass (exp of the share-averaged group score) covers NN% of
//            the estimated total over all full pages; the budget is the ceiling
//   flN      floor of the adaptive budget: at least N full pages (default 1)
//   fp16s    count scales as fp16 (2 bytes) instead of fp32 in the metadata bytes
#include <Eigen/Dense>
#include <algorithm>
#include <cmath>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "locks/error.h"
#include "score_rows.h"
#include "selectors.h"

namespace locks::eval {
namespace {

struct VariantSpec {
  int rank = 0;
  int basis_bits = 4, basis_group = 0;  // group 0: one scale per row
  int coeff_bits = 8;
  bool coeff_per_key = false;
  int mu_bits = 8, mu_group = 0;
  bool mu_per_channel = false;
  bool query_weighted = false, fold_weights = false;
  int obs_used = 0;
  bool residual = false, max_rule = false, fp16_scales = false;
  double tau = 0;  // 0: fixed budget
  int floor_pages = 1;
};

int parse_int(const std::string& s, const std::string& name) {
  LOCKS_REQUIRE(!s.empty() && s.find_first_not_of("0123456789") == std::string::npos, "method ",
                name, ": bad number in token '", s, "'");
  return std::stoi(s);
}

VariantSpec parse(const std::string& name, const SelectorParams& p) {
  VariantSpec v;
  v.rank = p.rank;
  LOCKS_REQUIRE(name.rfind("lx", 0) == 0, "not a LOCKS variant name: ", name);
  std::stringstream ss(name.substr(2));
  std::string t;
  while (std::getline(ss, t, '-')) {
    if (t.empty()) continue;
    if (t[0] == 'r' && t.size() > 1 && t != "res")
      v.rank = parse_int(t.substr(1), name);
    else if (t == "b32")
      v.basis_bits = 32;
    else if (t == "b8")
      v.basis_bits = 8;
    else if (t == "b4")
      v.basis_bits = 4;
    else if (t.rfind("b4g", 0) == 0)
      v.basis_group = parse_int(t.substr(3), name);
    else if (t == "c32")
      v.coeff_bits = 32;
    else if (t == "c8")
      v.coeff_bits = 8;
    else if (t == "c8k")
      v.coeff_per_key = true;
    else if (t == "c4")
      v.coeff_bits = 4;
    else if (t == "m32")
      v.mu_bits = 32;
    else if (t == "m8")
      v.mu_bits = 8;
    else if (t.rfind("m8g", 0) == 0)
      v.mu_group = parse_int(t.substr(3), name);
    else if (t == "m8ch")
      v.mu_per_channel = true;
    else if (t == "wq")
      v.query_weighted = true;
    else if (t == "wqf")
      v.query_weighted = v.fold_weights = true;
    else if (t.rfind("wqo", 0) == 0)
      v.obs_used = parse_int(t.substr(3), name);
    else if (t == "res")
      v.residual = true;
    else if (t == "max")
      v.max_rule = true;
    else if (t == "fp16s")
      v.fp16_scales = true;
    else if (t.rfind("tau", 0) == 0)
      v.tau = parse_int(t.substr(3), name) / 100.0;
    else if (t.rfind("fl", 0) == 0)
      v.floor_pages = parse_int(t.substr(2), name);
    else
      LOCKS_REQUIRE(false, "method ", name, ": unknown token '", t,
                    "' (see selector_locks_variant.cpp)");
  }
  return v;
}

// Symmetric round-to-nearest to `bits` (8: [-127, 127], 4: [-7, 7]) of n values at stride,
// one scale for all of them; returns the de-quantized values in place.
void fake_quant(double* x, int n, int stride, int bits) {
  if (bits >= 32) return;
  const double lim = bits == 8 ? 127.0 : 7.0;
  double m = 0;
  for (int i = 0; i < n; ++i) m = std::max(m, std::fabs(x[i * stride]));
  const double s = m / lim;
  for (int i = 0; i < n; ++i) {
    double& y = x[i * stride];
    y = s == 0 ? 0.0 : std::clamp(std::nearbyint(y / s), -lim, lim) * s;
  }
}

class LocksVariant final : public PageSelector {
 public:
  LocksVariant(std::string name, const SelectorParams& p)
      : name_(std::move(name)), v_(parse(name_, p)) {}
  std::string name() const override { return name_; }
  std::string description() const override { return "LOCKS variant " + name_; }
  GqaRule gqa_rule() const override {
    return v_.max_rule ? GqaRule::max_share : GqaRule::share_average;
  }
  bool available(const LayerContext& ctx, std::string* why) const override {
    if (v_.rank < 1 || v_.rank >= ctx.page_size || v_.rank > ctx.head_dim) {
      *why = "rank " + std::to_string(v_.rank) + " outside [1, page_size)";
      return false;
    }
    if (v_.query_weighted && (ctx.q_obs == nullptr || ctx.obs_steps == 0)) {
      *why = "wq needs the observation-window queries (layer*_qobs.npy)";
      return false;
    }
    if (v_.basis_group > 0 && ctx.head_dim % v_.basis_group != 0) {
      *why = "basis group does not divide head_dim";
      return false;
    }
    if (v_.mu_group > 0 && ctx.head_dim % v_.mu_group != 0) {
      *why = "centroid group does not divide head_dim";
      return false;
    }
    return true;
  }

  void prepare(const LayerContext& ctx) override {
    const int d = ctx.head_dim, P = ctx.page_size, r = v_.rank, H = ctx.kv_heads;
    const int np = ctx.num_full_pages;
    weight_.assign(size_t(H) * d, 1.0);
    if (v_.query_weighted) {  // per KV head: RMS over the group's observation-window queries
      for (int g = 0; g < H; ++g) {
        std::vector<double> acc(d, 0.0);
        int n = 0;
        const int s0 = v_.obs_used > 0 ? std::max(0, ctx.obs_steps - v_.obs_used) : 0;
        for (int s = s0; s < ctx.obs_steps; ++s)
          for (int i = 0; i < ctx.group(); ++i, ++n) {
            const float* q = ctx.q_obs + (int64_t(s) * ctx.q_heads + g * ctx.group() + i) * d;
            for (int c = 0; c < d; ++c) acc[c] += double(q[c]) * q[c];
          }
        double mean = 0;
        for (int c = 0; c < d; ++c) mean += acc[c] / n;
        mean /= d;
        // Floor at 1% of the mean power: channels no observed query used still count a little.
        for (int c = 0; c < d; ++c)
          weight_[size_t(g) * d + c] = std::sqrt(std::max(acc[c] / n, 1e-2 * mean));
      }
    }
    mu_.assign(size_t(np) * H * d, 0.0);
    basis_.assign(size_t(np) * H * r * d, 0.0);
    coeff_.assign(size_t(np) * H * P * r, 0.0);
    resid_.assign(v_.residual ? size_t(np) * H * P : 0, 0.0);
#pragma omp parallel for schedule(dynamic, 16)
    for (int64_t item = 0; item < int64_t(np) * H; ++item) {
      const int j = int(item / H), g = int(item % H);
      Eigen::MatrixXd D(P, d);
      double* mu = &mu_[size_t(item) * d];
      for (int i = 0; i < P; ++i) {
        const float* k = ctx.key(int64_t(j) * P + i, g);
        for (int c = 0; c < d; ++c) D(i, c) = k[c];
      }
      for (int c = 0; c < d; ++c) mu[c] = D.col(c).mean();
      const double* w = &weight_[size_t(g) * d];
      for (int i = 0; i < P; ++i)
        for (int c = 0; c < d; ++c) D(i, c) = (D(i, c) - mu[c]) * w[c];  // weighted deviations
      Eigen::JacobiSVD<Eigen::MatrixXd> svd(D, Eigen::ComputeThinV);
      const Eigen::MatrixXd& V = svd.matrixV();  // d x min(P, d)
      double* B = &basis_[size_t(item) * r * d];
      for (int k = 0; k < r; ++k)
        for (int c = 0; c < d; ++c) B[k * d + c] = V(c, k);
      // Basis quantization first: the coefficients are taken in the stored basis, as
      // summary_build does (coefficients of the fp32 basis; the de-quantized basis rows are
      // what scoring multiplies them with).
      double* C = &coeff_[size_t(item) * P * r];
      for (int i = 0; i < P; ++i)
        for (int k = 0; k < r; ++k) {
          double s = 0;
          for (int c = 0; c < d; ++c) s += B[k * d + c] * D(i, c);
          C[i * r + k] = s;
        }
      if (v_.residual) {
        for (int i = 0; i < P; ++i) {
          double e = D.row(i).squaredNorm();
          for (int k = 0; k < r; ++k) e -= C[i * r + k] * C[i * r + k];
          resid_[size_t(item) * P + i] = std::max(e, 0.0);
        }
        fake_quant(&resid_[size_t(item) * P], P, 1, 8);
      }
      if (v_.fold_weights)  // stored rows V'_k / w: score = (V'_k / w) . q, the raw query
        for (int k = 0; k < r; ++k)
          for (int c = 0; c < d; ++c) B[k * d + c] /= w[c];
      for (int k = 0; k < r; ++k) {
        if (v_.basis_bits < 32 && v_.basis_group > 0) {
          for (int c0 = 0; c0 < d; c0 += v_.basis_group)
            fake_quant(B + k * d + c0, v_.basis_group, 1, 4);
        } else {
          fake_quant(B + k * d, d, 1, v_.basis_bits);
        }
      }
      if (v_.coeff_per_key) {
        for (int i = 0; i < P; ++i) fake_quant(C + i * r, r, 1, 8);
      } else {
        for (int k = 0; k < r; ++k) fake_quant(C + k, P, r, v_.coeff_bits);
      }
      if (!v_.mu_per_channel) {
        if (v_.mu_group > 0) {
          for (int c0 = 0; c0 < d; c0 += v_.mu_group) fake_quant(mu + c0, v_.mu_group, 1, 8);
        } else {
          fake_quant(mu, d, 1, v_.mu_bits);
        }
      }
    }
    if (v_.mu_per_channel) {  // one scale per (KV head, channel), max over the layer's pages
      for (int g = 0; g < H; ++g)
        for (int c = 0; c < d; ++c) {
          double m = 0;
          for (int j = 0; j < np; ++j) m = std::max(m, std::fabs(mu_[(size_t(j) * H + g) * d + c]));
          const double s = m / 127.0;
          for (int j = 0; j < np; ++j) {
            double& y = mu_[(size_t(j) * H + g) * d + c];
            y = s == 0 ? 0.0 : std::clamp(std::nearbyint(y / s), -127.0, 127.0) * s;
          }
        }
    }
  }

  void score(const LayerContext& ctx, const SelectConfig&, float* head_scores) override {
    const int d = ctx.head_dim, P = ctx.page_size, r = v_.rank, H = ctx.kv_heads;
    const double scale = ctx.scale;
    score_rows(ctx, head_scores, [&](const float* q, int g) {
      std::vector<double> qw(d);  // q / w: the query in the weighted space of the basis
      double qn2 = 0;
      for (int c = 0; c < d; ++c) {
        qw[c] = v_.fold_weights ? double(q[c]) : double(q[c]) / weight_[size_t(g) * d + c];
        qn2 += qw[c] * qw[c];
      }
      return [this, q, d, P, r, H, scale, qw = std::move(qw), qn2, g](int j) {
        const size_t item = size_t(j) * H + g;
        const double* mu = &mu_[item * d];
        const double* B = &basis_[item * r * d];
        const double* C = &coeff_[item * P * r];
        double qmu = 0;
        for (int c = 0; c < d; ++c) qmu += double(q[c]) * mu[c];
        double wk[16], logits[64];
        double wn2 = 0;
        for (int k = 0; k < r; ++k) {
          double s = 0;
          for (int c = 0; c < d; ++c) s += B[k * d + c] * qw[c];
          wk[k] = s;
          wn2 += s * s;
        }
        const double perp = std::max(qn2 - wn2, 0.0) / double(std::max(1, d - r));
        for (int i = 0; i < P; ++i) {
          double l = qmu;
          for (int k = 0; k < r; ++k) l += wk[k] * C[i * r + k];
          l *= scale;
          if (v_.residual) l += 0.5 * scale * scale * perp * resid_[item * P + i];
          logits[i] = l;
        }
        return log_sum_exp(logits, P);
      };
    });
  }

  void adjust_selection(const LayerContext& ctx, const SelectConfig& cfg, const float* group_scores,
                        const Selection& sel) override {
    if (v_.tau <= 0 || cfg.budget_tokens >= ctx.tokens) return;
    const int n = ctx.num_pages;
    for (int64_t row = 0; row < int64_t(ctx.steps) * ctx.kv_heads; ++row) {
      const float* s = group_scores + row * n;
      double total = 0;
      for (int j = 0; j < ctx.num_full_pages; ++j) total += std::exp(double(s[j]));
      int32_t* pages = sel.pages + row * sel.capacity;
      std::vector<int32_t> full, keep;
      for (int i = 0; i < sel.counts[row]; ++i)
        (pages[i] < ctx.num_full_pages ? full : keep).push_back(pages[i]);  // tail always kept
      std::stable_sort(full.begin(), full.end(), [s](int32_t a, int32_t b) { return s[a] > s[b]; });
      double covered = 0;
      for (size_t i = 0; i < full.size(); ++i) {
        if (int(i) >= v_.floor_pages && covered >= v_.tau * total) break;
        covered += std::exp(double(s[full[i]]));
        keep.push_back(full[i]);
      }
      std::sort(keep.begin(), keep.end());
      for (int i = 0; i < sel.capacity; ++i) pages[i] = i < int(keep.size()) ? keep[i] : -1;
      sel.counts[row] = int32_t(keep.size());
    }
  }

  double metadata_bytes_per_page(const LayerContext& ctx) const override {
    const int d = ctx.head_dim, P = ctx.page_size, r = v_.rank;
    const double sc = v_.fp16_scales ? 2.0 : 4.0;
    double b = 0;
    // centroid
    if (v_.mu_per_channel)
      b += d;  // shared per-channel scales amortised over the pages
    else if (v_.mu_bits >= 32)
      b += 4.0 * d;
    else
      b += d + sc * (v_.mu_group > 0 ? d / v_.mu_group : 1);
    // basis
    if (v_.basis_bits >= 32)
      b += 4.0 * r * d;
    else if (v_.basis_bits == 8)
      b += double(r) * d + sc * r;
    else
      b += r * d / 2.0 + sc * r * (v_.basis_group > 0 ? d / v_.basis_group : 1);
    // coefficients
    if (v_.coeff_per_key)
      b += double(P) * r + sc * P;
    else if (v_.coeff_bits >= 32)
      b += 4.0 * P * r;
    else
      b += (v_.coeff_bits == 8 ? double(P) * r : P * r / 2.0) + sc * r;
    if (v_.residual) b += P + sc;
    return b;
  }
  double scoring_bytes_per_step(const LayerContext& ctx) const override {
    return ctx.num_full_pages * metadata_bytes_per_page(ctx);
  }

 private:
  std::string name_;
  VariantSpec v_;
  std::vector<double> weight_, mu_, basis_, coeff_, resid_;
};

}  // namespace

std::unique_ptr<PageSelector> make_locks_variant(const std::string& name, const SelectorParams& p) {
  return std::make_unique<LocksVariant>(name, p);
}

}  // namespace locks::eval
