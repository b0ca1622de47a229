// Hand-made group-score rows and a selection session over the ops backend of the binary
// (tests/ops: CPU; tests/cuda: CUDA), shared by the selection tests of tests/ops: B
// sequences x H KV heads of M pages, one plan, its workspace and output buffers, and the
// float64 reference's selection of the same rows.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "backend.h"
#include "locks/reference.h"
#include "locks/rules.h"
#include "test_util.h"

namespace locks::test {

enum class Kind { random, hot, ties, neg_inf };

// B sequences over M pages of P tokens, H KV heads, group scores of one kind.
struct Rows {
  int B = 4, H = 2, M = 0, P = 16;
  std::vector<int32_t> lens, table;
  std::vector<float> scores;  // [B, H, M]

  Rows(int max_pages, Kind kind, uint64_t seed) : M(max_pages) {
    lens = {M * P, (M / 2) * P + 5, 37, 20 * P};
    table.resize(size_t(B) * M);
    for (size_t i = 0; i < table.size(); ++i) table[i] = int32_t(i);
    Rng rng(seed);
    scores.resize(size_t(B) * H * M);
    for (size_t row = 0; row < size_t(B) * H; ++row) {
      float* s = &scores[row * size_t(M)];
      for (int j = 0; j < M; ++j) {
        switch (kind) {
          case Kind::random:
            s[j] = 2.0f * rng.normal();
            break;
          case Kind::hot:
            s[j] = -10.0f + 0.5f * rng.normal();
            break;
          case Kind::ties:
            s[j] = float(-rng.integer(0, 3));
            break;  // 4 values: many ties
          case Kind::neg_inf:
            s[j] = row == 1 || rng.integer(0, 3) == 0 ? kNegInfF : rng.normal();
            break;
        }
      }
      if (kind == Kind::hot)  // 1 to 6 hot pages per row: the counts vary per row
        for (int h = rng.integer(1, 6); h > 0; --h) s[rng.integer(0, M - 1)] = rng.normal();
    }
  }
  BatchView bv() const {
    BatchView b;
    b.block_table = table.data();
    b.block_table_stride = M;
    b.seq_lens = lens.data();
    b.batch_size = B;
    b.max_blocks_per_seq = M;
    return b;
  }
  DecodeParams params(const SelectConfig& sc) const {
    DecodeParams p;
    p.cache = CacheLayout{int64_t(B) * M, P, H, 64, DType::bf16};
    p.summary = summary_layout_for(p.cache, 4, Precision::fp32);
    p.num_q_heads = H;
    p.max_batch = B;
    p.max_blocks_per_seq = M;
    p.select = sc;
    return p;
  }
};

// A selection's output in host memory.
struct SelRun {
  std::vector<int32_t> pages, counts;
  int capacity = 0;
};

// One plan, its workspace and the output buffers for one shape of Rows; run() uploads a
// step's lengths, table and scores into the same buffers (as a replayed graph would).
class Session {
 public:
  Session(OpsBackend* be, const Rows& shape, const SelectConfig& sc)
      : be_(be), plan_(be->plan(shape.params(sc))), n_rows_(size_t(shape.B) * shape.H) {
    ws_ = be->alloc(plan_.workspace_bytes);
    table_ = be->alloc(shape.table.size() * 4);
    lens_ = be->alloc(shape.lens.size() * 4);
    gs_ = be->alloc(shape.scores.size() * 4);
    pages_ = be->alloc(n_rows_ * plan_.capacity * 4);
    counts_ = be->alloc(n_rows_ * 4);
  }
  ~Session() {
    for (void* p : {ws_, table_, lens_, gs_, pages_, counts_}) be_->free(p);
  }
  Session(const Session&) = delete;
  const DecodePlan& plan() const { return plan_; }

  SelRun run(const Rows& rows) {
    be_->put(table_, rows.table.data(), rows.table.size() * 4);
    be_->put(lens_, rows.lens.data(), rows.lens.size() * 4);
    be_->put(gs_, rows.scores.data(), rows.scores.size() * 4);
    BatchView b = rows.bv();
    b.block_table = static_cast<int32_t*>(table_);
    b.seq_lens = static_cast<int32_t*>(lens_);
    const Selection out{static_cast<int32_t*>(pages_), static_cast<int32_t*>(counts_),
                        plan_.capacity};
    be_->select_pages(plan_, {ws_, plan_.workspace_bytes}, b, static_cast<float*>(gs_), out);
    be_->finish();
    SelRun r;
    r.capacity = plan_.capacity;
    r.pages.resize(n_rows_ * plan_.capacity);
    r.counts.resize(n_rows_);
    be_->get(r.pages.data(), pages_, r.pages.size() * 4);
    be_->get(r.counts.data(), counts_, r.counts.size() * 4);
    return r;
  }

 private:
  OpsBackend* be_;
  DecodePlan plan_;
  size_t n_rows_;
  void *ws_, *table_, *lens_, *gs_, *pages_, *counts_;
};

inline SelRun run_select(OpsBackend* be, const Rows& rows, const SelectConfig& sc) {
  return Session(be, rows, sc).run(rows);
}

inline SelectionBuf reference(const Rows& rows, SelectConfig sc, double tau, int cap) {
  sc.tau = float(tau);
  SelectionBuf s(rows.B, rows.H, cap);
  const std::vector<double> gd(rows.scores.begin(), rows.scores.end());
  ref::select_pages(gd.data(), rows.bv(), rows.H, rows.P, sc, s.sel);
  return s;
}

// The fixed-budget rule of select.h for one sequence of len tokens, written out for tests
// that place scores where the rule must look: full pages, the candidates [sink_end,
// recent_start) and the slots left for the best of them (the budget's pages minus the tail,
// the sinks and the recent pages; may exceed the candidates, when every one is taken).
struct SeqRule {
  int full, sink_end, recent_start, slots;
};
inline SeqRule seq_rule(int64_t len, int P, const SelectConfig& sc) {
  SeqRule r;
  r.full = rules::full_pages(len, P);
  const int has_tail = r.full < rules::num_pages(len, P);
  r.sink_end = std::min(sc.sink_pages, r.full);
  r.recent_start = std::max(r.full - sc.recent_pages, r.sink_end);
  r.slots = int(rules::budget_pages(sc.budget_tokens, P)) - has_tail - r.sink_end -
            (r.full - r.recent_start);
  return r;
}

// A test over the backend of this binary, skipped where it is unavailable (no GPU).
class SelectOnBackend : public ::testing::Test {
 protected:
  void SetUp() override {
    be_ = make_backend();
    const std::string why = be_->unavailable();
    if (!why.empty()) GTEST_SKIP() << why;
  }
  std::unique_ptr<OpsBackend> be_;
};

}  // namespace locks::test
