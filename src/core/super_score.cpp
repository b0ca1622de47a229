// cpu::super_score (super_summary.h): the level-1 score of every complete group of S pages,
// from the super summaries only. One work item is (sequence, KV head, group): the group is
// decoded once and scored for the G query heads of the KV head.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "internal/check.h"
#include "internal/row_convert.h"
#include "locks/error.h"
#include "locks/rules.h"
#include "locks/super_summary.h"

namespace locks::cpu {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

void check_table(const SuperTableView& t, const BatchView& batch, int S, const char* where) {
  LOCKS_REQUIRE(t.table != nullptr, where, ": super table is null");
  LOCKS_REQUIRE(t.max_groups_per_seq >= (batch.max_blocks_per_seq + S - 1) / S &&
                    t.stride >= t.max_groups_per_seq,
                where, ": super table holds ", t.max_groups_per_seq, " groups (stride ", t.stride,
                "), need ceil(max_blocks_per_seq / S) = ", (batch.max_blocks_per_seq + S - 1) / S);
}

int complete_groups(int32_t len, int P, int S) { return rules::full_pages(len, P) / S; }

}  // namespace

void super_score(const SuperView& supers, const SuperTableView& table, const BatchView& batch,
                 const QueryView& q, float scale, const TwoLevelConfig& cfg,
                 float* group_head_scores) {
  const SuperLayout& l = supers.layout;
  validate_super_layout(l);
  validate_two_level(cfg);
  LOCKS_REQUIRE(!cfg.use_extent || l.extent, "use_extent needs a super layout with extent");
  detail::check_batch_shape(batch, l.page_size, __func__);
  detail::check_query(q, batch.batch_size, l.num_kv_heads, l.head_dim, __func__);
  detail::check_scale(scale, __func__);
  LOCKS_REQUIRE(group_head_scores != nullptr, "group_head_scores is null");
  const int S = l.group_pages, P = l.page_size, d = l.head_dim, R = l.rank;
  const int Hkv = l.num_kv_heads, Hq = q.num_q_heads, G = Hq / Hkv;
  check_table(table, batch, S, __func__);
  const int MG = table.max_groups_per_seq;
  for (int b = 0; b < batch.batch_size; ++b)
    for (int j = 0; j < complete_groups(batch.seq_lens[b], P, S); ++j) {
      const int32_t slot = table.table[int64_t(b) * table.stride + j];
      LOCKS_REQUIRE(slot >= 0 && slot < l.num_slots, "super table entry (", b, ", ", j,
                    ") = ", slot, " out of range [0, ", l.num_slots, ")");
    }
  const float logP = std::log(float(P));
  const int64_t items = int64_t(batch.batch_size) * Hkv * MG;
  // Each thread decodes its groups into one SuperGroupF and scores with one set of rows, so
  // the step allocates per thread, not per (sequence, group, KV head).
#pragma omp parallel if (items >= 64)
  {
    SuperGroupF sg;
    std::vector<float> w(R), est(S), qrow(static_cast<size_t>(d));
#pragma omp for schedule(dynamic, 16)
    for (int64_t item = 0; item < items; ++item) {
      const int g = int(item % Hkv);
      const int j = int((item / Hkv) % MG);
      const int b = int(item / (int64_t(MG) * Hkv));
      float* dst = group_head_scores + (int64_t(b) * Hq + int64_t(g) * G) * MG + j;
      if (j >= complete_groups(batch.seq_lens[b], P, S)) {
        for (int h = 0; h < G; ++h) dst[int64_t(h) * MG] = kNegInf;
        continue;
      }
      super_dequantize_into(supers, table.table[int64_t(b) * table.stride + j], g, sg);
      for (int h = 0; h < G; ++h) {
        const float* qh =
            detail::load_row(q.q, q.dtype, q.offset(b, int64_t(g) * G + h, d), d, qrow.data());
        const float qM = detail::dot(qh, sg.mu.data(), d);
        float w2 = 0.0f;
        for (int k = 0; k < R; ++k) {
          w[k] = detail::dot(qh, sg.basis.data() + int64_t(k) * d, d);
          w2 += w[k] * w[k];
        }
        const float qperp = std::sqrt(std::max(detail::dot(qh, qh, d) - w2, 0.0f));
        float m = kNegInf;
        for (int p = 0; p < S; ++p) {
          const float base = qM + float(cfg.gamma) * qperp * sg.radius[p];
          float cen = base, ext = base;
          for (int k = 0; k < R; ++k) cen += w[k] * sg.coord[size_t(p) * R + k];
          if (cfg.use_extent)
            for (int k = 0; k < R; ++k)
              ext += std::max(w[k] * sg.hi[size_t(p) * R + k], w[k] * sg.lo[size_t(p) * R + k]);
          if (!cfg.use_extent) {
            est[p] = logP + scale * cen;
          } else if (!cfg.mix) {
            est[p] = logP + scale * ext;
          } else {  // log(P e^{scale cen} + e^{scale ext}), shifted by the larger term
            const float a = logP + scale * cen, b = scale * ext, hi = std::max(a, b);
            est[p] = hi + std::log(std::exp(a - hi) + std::exp(b - hi));
          }
          m = std::max(m, est[p]);
        }
        float score = m;
        if (cfg.agg == GroupAgg::lse) {
          float s = 0.0f;
          for (int p = 0; p < S; ++p) s += std::exp(est[p] - m);
          score = m + std::log(s);
        }
        dst[int64_t(h) * MG] = score;
      }
    }
  }
}

}  // namespace locks::cpu
