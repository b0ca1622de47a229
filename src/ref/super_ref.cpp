// Float64 reference of the two-level ops (super_summary.h), straight from the formulas in the
// header: decoded codes (super_dequantize, shared with the backends like summary_dequantize),
// every product and exponential in double, no threading.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "checks.h"
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
  LOCKS_REQUIRE(q.dtype == DType::f32 || q.dtype == DType::f16 || q.dtype == DType::bf16,
                "q: unknown dtype");
  LOCKS_REQUIRE(q.stride == 0 || q.stride >= int64_t(q.num_q_heads) * l.head_dim,
                "q.stride below num_q_heads * head_dim");
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
        const std::vector<float> qrow = detail::to_float(q.q, q.dtype, q.offset(b, h, d), d);
        const float* qh = qrow.data();
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

namespace {

// The kept complete groups of (b, g) on a two-level step: forced ones, then m passes of
// "best not yet taken among the others by score, ties to the lower index".
std::vector<char> ref_kept(const double* group_head_scores, int b, int g, int num_q_heads, int G,
                           int MG, const ForcedGroups& f, int m) {
  const int64_t C = f.complete;
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
  std::vector<char> keep(C, 0), taken(C, 0);
  for (int64_t j = 0; j < C; ++j)
    if (j < f.first_end || j >= f.recent_begin) keep[j] = taken[j] = 1;
  for (int i = 0; i < m; ++i) {
    int64_t best = -1;
    for (int64_t j = 0; j < C; ++j)
      if (!taken[j] && (best < 0 || a[j] > a[best])) best = j;
    LOCKS_REQUIRE(best >= 0, "fewer other groups than m");
    taken[best] = 1;
    keep[best] = 1;
  }
  return keep;
}

}  // namespace

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
      const int64_t n_pages = (int64_t(len) + P - 1) / P;
      uint8_t* mask = page_mask + (int64_t(b) * num_kv_heads + g) * M;
      for (int j = 0; j < M; ++j) mask[j] = 0;
      const int m = groups_kept(cfg, sel, P, S, len);
      if (m < 0) {
        for (int64_t j = 0; j < n_pages; ++j) mask[j] = 1;
        continue;
      }
      const ForcedGroups f = forced_groups(cfg, sel, P, S, len);
      const std::vector<char> keep = ref_kept(group_head_scores, b, g, num_q_heads, G, MG, f, m);
      for (int64_t j = 0; j < f.complete; ++j)
        if (keep[j])
          for (int64_t p = j * S; p < (j + 1) * S; ++p) mask[p] = 1;
      for (int64_t p = int64_t(f.complete) * S; p < n_pages; ++p) mask[p] = 1;
    }
}

void select_groups_list(const double* group_head_scores, const SuperTableView& table,
                        const BatchView& batch, int num_q_heads, int num_kv_heads, int page_size,
                        int group_pages, const SelectConfig& sel, const TwoLevelConfig& cfg,
                        int list_cap, int32_t* page_map, int32_t* list_lens) {
  LOCKS_REQUIRE(group_head_scores != nullptr && page_map != nullptr && list_lens != nullptr,
                "null argument");
  // The list is the mask's pages in ascending order (the definition, restated).
  const int M = batch.max_blocks_per_seq, P = page_size;
  std::vector<uint8_t> mask(size_t(batch.batch_size) * num_kv_heads * M);
  select_groups(group_head_scores, table, batch, num_q_heads, num_kv_heads, page_size, group_pages,
                sel, cfg, mask.data());
  for (int b = 0; b < batch.batch_size; ++b) {
    const int64_t len = batch.seq_lens[b], n_pages = (len + P - 1) / P;
    int64_t listed = 0;
    for (int g = 0; g < num_kv_heads; ++g) {
      int32_t* map = page_map + (int64_t(b) * num_kv_heads + g) * list_cap;
      int64_t n = 0;
      for (int j = 0; j < M; ++j)
        if (mask[(size_t(b) * num_kv_heads + g) * M + j]) {
          LOCKS_REQUIRE(n < list_cap, "list longer than list_cap");
          map[n++] = j;
        }
      for (int64_t i = n; i < list_cap; ++i) map[i] = -1;
      LOCKS_REQUIRE(g == 0 || n == listed, "KV heads list different page counts");
      listed = n;
    }
    list_lens[b] = int32_t(len - (n_pages - listed) * P);
  }
}

}  // namespace locks::ref
