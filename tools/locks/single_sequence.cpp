#include "single_sequence.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <string>
#include <tuple>
#include <utility>

#include "locks/attention.h"
#include "locks/error.h"
#include "locks/metrics.h"
#include "progress.h"

namespace locks::cli {

namespace {

CacheLayout layout_for(int64_t tokens, int num_kv_heads, int head_dim, int page_size, DType dtype) {
  CacheLayout l;
  l.num_blocks = std::max<int64_t>(1, (tokens + page_size - 1) / page_size);
  l.page_size = page_size;
  l.num_kv_heads = num_kv_heads;
  l.head_dim = head_dim;
  l.dtype = dtype;
  return l;
}

// Best of `reps` after a warm-up: on a shared machine the minimum is the least disturbed
// by other processes (a descheduled OpenMP thread stalls a whole parallel region).
// Best of `reps` timings of each of two steps, run alternately so that both see the same
// machine load (a shared machine otherwise skews whichever runs during a busy spell).
template <typename A, typename B>
std::pair<double, double> best_ms_interleaved(int reps, A&& a, B&& b) {
  a();  // warm-up: page in memory, size workspaces
  b();
  auto ms = [](auto& f) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  };
  double best_a = ms(a), best_b = ms(b);
  for (int i = 1; i < reps; ++i) {
    best_a = std::min(best_a, ms(a));
    best_b = std::min(best_b, ms(b));
  }
  return {best_a, best_b};
}

}  // namespace

SingleSequence::SingleSequence(const float* keys, const float* values, int64_t tokens,
                               int num_kv_heads, int head_dim, int page_size, DType dtype)
    : tokens_(tokens), cache_(layout_for(tokens, num_kv_heads, head_dim, page_size, dtype)) {
  LOCKS_REQUIRE(tokens >= 1, "the sequence is empty (0 tokens)");
  const int seq = cache_.add_sequence();
  cache_.append(seq, keys, values, tokens);
  batch_ = cache_.batch({seq});
  // The view points into the Batch's vectors; re-point it at the ones batch_ now owns.
  batch_.view.block_table = batch_.block_table.data();
  batch_.view.seq_lens = batch_.seq_lens.data();
}

std::unique_ptr<SummaryStore> SingleSequence::build_summaries(int rank, Precision precision,
                                                              const char* label) const {
  auto store = std::make_unique<SummaryStore>(summary_layout_for(cache_.layout(), rank, precision));
  const std::vector<int32_t>& blocks = cache_.blocks(0);
  const int64_t n = full_pages();
  // Chunks, so that progress can be reported; each chunk is still built in parallel.
  const int64_t chunk = 256;
  std::unique_ptr<Progress> progress;
  if (label) progress = std::make_unique<Progress>(label, n);
  for (int64_t i = 0; i < n; i += chunk) {
    cpu::summary_build(cache_.view(), blocks.data() + i, std::min(chunk, n - i), store->view());
    if (progress) progress->update(std::min(n, i + chunk));
  }
  if (progress) progress->finish();
  return store;
}

StepResult SingleSequence::step(SummaryStore& summaries, const float* q, int num_q_heads,
                                const SelectConfig& select) const {
  const CacheLayout& L = cache_.layout();
  const int d = L.head_dim, H = L.num_kv_heads, P = L.page_size;
  DecodeConfig cfg;
  cfg.select = select;
  cpu::Decoder decoder(L, num_q_heads, 1, batch_.view.max_blocks_per_seq, cfg);
  const float scale = 1.0f / std::sqrt(float(d));
  const QueryView qv{q, num_q_heads};

  StepResult r;
  r.num_q_heads = num_q_heads;
  r.head_dim = d;
  r.out_locks.resize(size_t(num_q_heads) * d);
  r.out_full.resize(r.out_locks.size());
  decoder.run(cache_.view(), summaries.view(), batch_.view, qv, {r.out_locks.data(), nullptr});
  cpu::decode_attention_dense(cache_.view(), batch_.view, qv, scale, {r.out_full.data(), nullptr});

  const Selection sel = decoder.selection();
  r.recall.resize(num_q_heads);
  attention_mass_recall(cache_.view(), batch_.view, qv, scale, sel, r.recall.data());
  for (int h = 0; h < num_q_heads; ++h)
    r.cosine.push_back(
        cosine_similarity(&r.out_locks[size_t(h) * d], &r.out_full[size_t(h) * d], d));
  for (int h = 0; h < H; ++h) {
    const int32_t* p = sel.pages + int64_t(h) * sel.capacity;
    r.pages.emplace_back(p, p + sel.counts[h]);
    int64_t tok = 0;
    for (int32_t j : r.pages.back()) tok += std::min<int64_t>(P, tokens_ - int64_t(j) * P);
    r.attended_tokens.push_back(tok);
  }
  return r;
}

StepBytes SingleSequence::bytes(const SummaryLayout& s, const StepResult& r) const {
  const CacheLayout& L = cache_.layout();
  const double kv_per_token_head = 2.0 * 2.0 * L.head_dim;  // K and V, bf16
  StepBytes b;
  b.summaries = double(summary_bytes_per_page(s)) * double(full_pages()) * L.num_kv_heads;
  for (int64_t t : r.attended_tokens) b.selected_kv += kv_per_token_head * double(t);
  b.full_kv = kv_per_token_head * double(tokens_) * L.num_kv_heads;
  return b;
}

SingleSequence::Timing SingleSequence::time_steps(SummaryStore& summaries, const float* q,
                                                  int num_q_heads, const SelectConfig& select,
                                                  int reps) const {
  const CacheLayout& L = cache_.layout();
  DecodeConfig cfg;
  cfg.select = select;
  cpu::Decoder decoder(L, num_q_heads, 1, batch_.view.max_blocks_per_seq, cfg);
  const QueryView qv{q, num_q_heads};
  std::vector<float> out(size_t(num_q_heads) * L.head_dim);
  const SummaryView sv = summaries.view();
  const float scale = 1.0f / std::sqrt(float(L.head_dim));
  Timing t;
  std::tie(t.locks_ms, t.dense_ms) = best_ms_interleaved(
      reps,
      [&] {
        decoder.run(cache_.view(), sv, batch_.view, qv, {out.data(), nullptr});
      },
      [&] {
        cpu::decode_attention_dense(cache_.view(), batch_.view, qv, scale, {out.data(), nullptr});
      });
  return t;
}

}  // namespace locks::cli
