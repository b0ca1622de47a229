// Float64 reference of the two-level ops (super_summary.h), straight from the formulas in the
// header: decoded codes (super_dequantize, shared with the backends like summary_dequantize),
// every product and exponential in double, no threading.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "locks/error.h"
#include "locks/super_summary.h"

namespace locks::ref {
namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

int64_t complete_groups(int32_t len, int P, int S) { return (int64_t(len) / P) / S; }

}  // namespace

double super_page_estimate(const SuperView& s, int32_t slot, int head, int page, const float* q,
                           float scale, const TwoLevelConfig& cfg) {
  const SuperLayout& l = s.layout;
  LOCKS_REQUIRE(q != nullptr, "q must not be null");
  LOCKS_REQUIRE(page >= 0 && page < l.group_pages, "page ", page, " out of range");
  LOCKS_REQUIRE(!cfg.use_extent || l.extent, "use_extent needs a super layout with extent");
  const SuperGroupF g = super_dequantize(s, slot, head);
  const int d = l.head_dim, R = l.rank;
  double qM = 0, q2 = 0, w2 = 0;
  for (int c = 0; c < d; ++c) {
    qM += double(q[c]) * g.mu[c];
    q2 += double(q[c]) * q[c];
  }
  double cen = qM, ext = qM;
  for (int k = 0; k < R; ++k) {
    double w = 0;
    for (int c = 0; c < d; ++c) w += double(q[c]) * g.basis[size_t(k) * d + c];
    w2 += w * w;
    const size_t i = size_t(page) * R + k;
    cen += w * g.coord[i];
    if (cfg.use_extent) ext += std::max(w * g.hi[i], w * g.lo[i]);
  }
  const double rad = cfg.gamma * std::sqrt(std::max(q2 - w2, 0.0)) * g.radius[page];
  const double logP = std::log(double(l.page_size));
  if (!cfg.use_extent) return logP + double(scale) * (cen + rad);
  if (!cfg.mix) return logP + double(scale) * (ext + rad);
  return std::log(l.page_size * std::exp(double(scale) * (cen + rad)) +
                  std::exp(double(scale) * (ext + rad)));
}

void super_score(const SuperView& supers, const SuperTableView& table, const BatchView& batch,
                 const QueryView& q, float scale, const TwoLevelConfig& cfg,
                 double* group_head_scores) {
  const SuperLayout& l = supers.layout;
  validate_super_layout(l);
  LOCKS_REQUIRE(group_head_scores != nullptr && table.table != nullptr && q.q != nullptr,
                "null argument");
  const int S = l.group_pages, P = l.page_size, d = l.head_dim;
  const int Hq = q.num_q_heads, G = Hq / l.num_kv_heads, MG = table.max_groups_per_seq;
  for (int b = 0; b < batch.batch_size; ++b)
    for (int h = 0; h < Hq; ++h)
      for (int j = 0; j < MG; ++j) {
        double& out = group_head_scores[(int64_t(b) * Hq + h) * MG + j];
        if (j >= complete_groups(batch.seq_lens[b], P, S)) {
          out = kNegInf;
          continue;
        }
        const int32_t slot = table.table[int64_t(b) * table.stride + j];
        const float* qh = q.q + (int64_t(b) * Hq + h) * d;
        std::vector<double> e(S);
        double m = kNegInf;
        for (int p = 0; p < S; ++p) {
          e[p] = super_page_estimate(supers, slot, h / G, p, qh, scale, cfg);
          m = std::max(m, e[p]);
        }
        if (cfg.agg == GroupAgg::max) {
          out = m;
        } else {
          double s = 0;
          for (double v : e) s += std::exp(v - m);
          out = m + std::log(s);
        }
      }
}

void select_groups(const double* group_head_scores, const SuperTableView& table,
                   const BatchView& batch, int num_q_heads, int num_kv_heads, int page_size,
                   int group_pages, const SelectConfig& sel, const TwoLevelConfig& cfg,
                   uint8_t* page_mask) {
  LOCKS_REQUIRE(group_head_scores != nullptr && page_mask != nullptr, "null argument");
  const int S = group_pages, P = page_size, M = batch.max_blocks_per_seq;
  const int MG = table.max_groups_per_seq, G = num_q_heads / num_kv_heads;
  for (int b = 0; b < batch.batch_size; ++b)
    for (int g = 0; g < num_kv_heads; ++g) {
      const int32_t len = batch.seq_lens[b];
      const int64_t n_pages = (int64_t(len) + P - 1) / P, full = len / P;
      const int64_t C = complete_groups(len, P, S);
      uint8_t* mask = page_mask + (int64_t(b) * num_kv_heads + g) * M;
      for (int j = 0; j < M; ++j) mask[j] = 0;
      const int m = groups_kept(cfg, sel, P, S, len);
      if (m < 0) {
        for (int64_t j = 0; j < n_pages; ++j) mask[j] = 1;
        continue;
      }
      // Group score: log of the mean over the G heads of each head's share (log domain).
      std::vector<double> a(C, kNegInf);
      for (int64_t j = 0; j < C; ++j) {
        std::vector<double> t;
        for (int h = 0; h < G; ++h) {
          const double* s = group_head_scores + (int64_t(b) * num_q_heads + g * G + h) * MG;
          double mx = kNegInf;
          for (int64_t i = 0; i < C; ++i) mx = std::max(mx, s[i]);
          if (mx == kNegInf) continue;
          double tot = 0;
          for (int64_t i = 0; i < C; ++i) tot += std::exp(s[i] - mx);
          t.push_back(s[j] - (mx + std::log(tot)));
        }
        double mx = kNegInf;
        for (double v : t) mx = std::max(mx, v);
        if (mx == kNegInf) continue;
        double tot = 0;
        for (double v : t) tot += std::exp(v - mx);
        a[j] = mx + std::log(tot / G);
      }
      std::vector<char> keep(C, 0);
      for (int64_t j = 0; j < std::min<int64_t>(cfg.first_groups, C); ++j) keep[j] = 1;
      for (int64_t p = 0; p < std::min<int64_t>(sel.sink_pages, full); ++p)
        if (p < C * S) keep[p / S] = 1;
      for (int64_t p = std::max<int64_t>(0, full - sel.recent_pages); p < full; ++p)
        if (p < C * S) keep[p / S] = 1;
      // m passes of "best not yet taken by score, ties to the lower index".
      std::vector<char> taken(C, 0);
      for (int i = 0; i < m; ++i) {
        int64_t best = -1;
        for (int64_t j = 0; j < C; ++j)
          if (!taken[j] && (best < 0 || a[j] > a[best])) best = j;
        taken[best] = 1;
        keep[best] = 1;
      }
      for (int64_t j = 0; j < C; ++j)
        if (keep[j])
          for (int64_t p = j * S; p < (j + 1) * S; ++p) mask[p] = 1;
      for (int64_t p = C * S; p < n_pages; ++p) mask[p] = 1;
    }
}

}  // namespace locks::ref
