// Shared test helpers: deterministic random and structured paged caches, queries, summary
// building, and small numeric utilities. Header-only so any test target can include it
// (tests/cuda reuses it).
//
// Structured caches model the method's premise: every (page, KV head) has keys in its own
// random low-rank subspace around its own centroid (locally low-rank, globally high-rank),
// plus a little isotropic noise; a few "relevant" pages per sequence have their centroid
// aligned with the query direction of their KV head, so they carry most of the attention.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <utility>
#include <vector>

#include "locks/kv_cache.h"
#include "locks/reference.h"
#include "locks/score.h"
#include "locks/select.h"
#include "locks/summary.h"

namespace locks::test {

inline constexpr float kNegInfF = -std::numeric_limits<float>::infinity();
inline constexpr double kNegInf = -std::numeric_limits<double>::infinity();

class Rng {
 public:
  explicit Rng(uint64_t seed) : g_(seed) {}
  float normal() { return n_(g_); }
  float uniform(float a, float b) { return std::uniform_real_distribution<float>(a, b)(g_); }
  int integer(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(g_); }
  std::vector<float> normals(size_t n, float sd = 1.0f) {
    std::vector<float> v(n);
    for (auto& x : v) x = sd * normal();
    return v;
  }
  // A random unit vector of dimension d.
  std::vector<float> unit(int d) {
    std::vector<float> v = normals(size_t(d));
    double n = 0;
    for (float x : v) n += double(x) * x;
    const float inv = float(1.0 / std::sqrt(n));
    for (auto& x : v) x *= inv;
    return v;
  }
  std::mt19937_64& engine() { return g_; }

 private:
  std::mt19937_64 g_;
  std::normal_distribution<float> n_{0.0f, 1.0f};
};

struct CacheSpec {
  DType dtype = DType::f32;
  int page_size = 16;
  int num_kv_heads = 2;
  int num_q_heads = 4;
  int head_dim = 64;
  std::vector<int32_t> seq_lens{40, 64};
  bool structured = false;
  int relevant_per_seq = 2;  // structured only: pages aligned with the query
  int spare_blocks = 3;      // blocks in the pool that no sequence uses
  uint64_t seed = 1;
};

// A filled paged cache with its batch view and one decode query per sequence.
struct TestCache {
  CacheSpec spec;
  std::unique_ptr<PagedKvCache> cache;
  PagedKvCache::Batch batch;
  std::vector<float> q;                          // [batch, num_q_heads, head_dim]
  std::vector<std::pair<int, int>> relevant;     // (sequence, logical page) planted as relevant
  std::vector<std::vector<float>> keys, values;  // per sequence, fp32 [len, H, d] as appended

  const CacheLayout& layout() const { return cache->layout(); }
  KvCacheView view() const { return cache->view(); }
  const BatchView& bv() const { return batch.view; }
  QueryView qv() const { return {q.data(), spec.num_q_heads}; }
  float scale() const { return 1.0f / std::sqrt(float(spec.head_dim)); }
  int max_blocks() const { return batch.view.max_blocks_per_seq; }
  // Physical ids of every full page of every sequence (the pages that have summaries).
  std::vector<int32_t> full_blocks() const {
    std::vector<int32_t> ids;
    for (int s = 0; s < cache->num_sequences(); ++s) {
      const auto& bl = cache->blocks(s);
      for (int j = 0; j < cache->seq_len(s) / spec.page_size; ++j) ids.push_back(bl[size_t(j)]);
    }
    return ids;
  }
  int32_t block_of(int seq, int page) const {
    return batch.view.block_table[seq * batch.view.block_table_stride + page];
  }
};

inline int64_t pages_of(int64_t len, int page_size) { return (len + page_size - 1) / page_size; }

// A dense K or V array (num_blocks blocks of block_bytes) copied into dst with its blocks
// stride_bytes apart (KvCacheView::block_stride in bytes); dst's other bytes are kept.
inline void scatter_blocks(void* dst, const void* src, int64_t num_blocks, size_t block_bytes,
                           size_t stride_bytes) {
  for (int64_t b = 0; b < num_blocks; ++b)
    std::memcpy(static_cast<char*>(dst) + size_t(b) * stride_bytes,
                static_cast<const char*>(src) + size_t(b) * block_bytes, block_bytes);
}

// Keys/values of one sequence, [len, H, d].
inline void fill_sequence(const CacheSpec& sp, Rng& rng, int32_t len,
                          const std::vector<std::vector<float>>& qdir, std::vector<int>& rel_pages,
                          std::vector<float>& k, std::vector<float>& v) {
  const int H = sp.num_kv_heads, d = sp.head_dim, P = sp.page_size;
  k.assign(size_t(len) * H * d, 0.0f);
  v = rng.normals(size_t(len) * H * d);
  if (!sp.structured) {
    k = rng.normals(size_t(len) * H * d);
    return;
  }
  const int n_pages = int(pages_of(len, P));
  rel_pages.clear();
  if (n_pages > 2) {
    // Relevant pages: distinct, avoiding page 0 and the last page so that sink/recent/tail
    // rules do not pick them up by themselves.
    std::vector<int> pool;
    for (int j = 1; j < n_pages - 1; ++j) pool.push_back(j);
    std::shuffle(pool.begin(), pool.end(), rng.engine());
    for (int i = 0; i < std::min<int>(sp.relevant_per_seq, int(pool.size())); ++i)
      rel_pages.push_back(pool[size_t(i)]);
  }
  for (int j = 0; j < n_pages; ++j) {
    const bool rel = std::find(rel_pages.begin(), rel_pages.end(), j) != rel_pages.end();
    for (int h = 0; h < H; ++h) {
      const int m = rng.integer(2, 4);  // the page's own subspace dimension
      std::vector<std::vector<float>> basis;
      for (int b = 0; b < m; ++b) basis.push_back(rng.unit(d));
      std::vector<float> centre = rng.normals(size_t(d), 0.5f);
      if (rel)
        for (int c = 0; c < d; ++c) centre[size_t(c)] += 4.0f * qdir[size_t(h)][size_t(c)];
      for (int i = j * P; i < std::min(len, (j + 1) * P); ++i) {
        float* row = k.data() + (size_t(i) * H + h) * d;
        for (int c = 0; c < d; ++c) row[c] = centre[size_t(c)] + 0.05f * rng.normal();
        for (int b = 0; b < m; ++b) {
          const float a = (3.0f / float(b + 1)) * rng.normal();
          for (int c = 0; c < d; ++c) row[c] += a * basis[size_t(b)][size_t(c)];
        }
      }
    }
  }
}

// Builds the cache. Sequences are appended in interleaved chunks of random size, so their
// physical blocks are interleaved (block table indirection is exercised).
inline TestCache make_cache(const CacheSpec& sp) {
  TestCache t;
  t.spec = sp;
  Rng rng(sp.seed);
  const int H = sp.num_kv_heads, d = sp.head_dim, P = sp.page_size;
  int64_t blocks = sp.spare_blocks;
  for (int32_t len : sp.seq_lens) blocks += pages_of(len, P);
  CacheLayout l;
  l.num_blocks = std::max<int64_t>(blocks, 1);
  l.page_size = P;
  l.num_kv_heads = H;
  l.head_dim = d;
  l.dtype = sp.dtype;
  t.cache = std::make_unique<PagedKvCache>(l);

  const int B = int(sp.seq_lens.size());
  std::vector<std::vector<float>> qdir;  // one query direction per KV head
  for (int h = 0; h < H; ++h) qdir.push_back(rng.unit(d));
  t.keys.resize(size_t(B));
  t.values.resize(size_t(B));
  for (int s = 0; s < B; ++s) {
    std::vector<int> rel;
    fill_sequence(sp, rng, sp.seq_lens[size_t(s)], qdir, rel, t.keys[size_t(s)],
                  t.values[size_t(s)]);
    for (int j : rel) t.relevant.emplace_back(s, j);
    t.cache->add_sequence();
  }
  std::vector<int32_t> done(size_t(B), 0);
  for (bool more = true; more;) {
    more = false;
    for (int s = 0; s < B; ++s) {
      const int32_t len = sp.seq_lens[size_t(s)];
      if (done[size_t(s)] >= len) continue;
      const int32_t n = std::min(len - done[size_t(s)], rng.integer(1, 2 * P));
      const size_t off = size_t(done[size_t(s)]) * H * d;
      t.cache->append(s, t.keys[size_t(s)].data() + off, t.values[size_t(s)].data() + off, n);
      done[size_t(s)] += n;
      more = true;
    }
  }
  t.batch = t.cache->batch();

  // Queries: for structured data, head h of KV group g points along qdir[g] (plus noise), so
  // the group's relevant pages matter to every head of the group.
  const int Hq = sp.num_q_heads, G = Hq / H;
  t.q.resize(size_t(B) * Hq * d);
  for (int s = 0; s < B; ++s)
    for (int h = 0; h < Hq; ++h) {
      float* qv = t.q.data() + (size_t(s) * Hq + h) * d;
      for (int c = 0; c < d; ++c) {
        qv[c] = sp.structured ? 3.0f * qdir[size_t(h / G)][size_t(c)] + 0.3f * rng.normal()
                              : rng.normal();
      }
    }
  return t;
}

// Summaries of every full page, built by the CPU backend (basis_group 0: the default).
inline SummaryStore build_summaries(const TestCache& t, int rank, Precision prec,
                                    int basis_group = 0) {
  SummaryStore store(summary_layout_for(t.layout(), rank, prec, basis_group));
  const std::vector<int32_t> ids = t.full_blocks();
  cpu::summary_build(t.view(), ids.data(), int64_t(ids.size()), store.view());
  return store;
}

// Sum over i of |a_i| (||.||_1) and the Euclidean norm, in double.
inline double norm1(const float* x, int n) {
  double s = 0;
  for (int i = 0; i < n; ++i) s += std::fabs(double(x[i]));
  return s;
}
inline double norm2(const double* x, int n) {
  double s = 0;
  for (int i = 0; i < n; ++i) s += x[i] * x[i];
  return std::sqrt(s);
}

// Selection storage sized for a config.
struct SelectionBuf {
  std::vector<int32_t> pages, counts;
  Selection sel;
  SelectionBuf(int batch, int kv_heads, int capacity)
      : pages(size_t(batch) * kv_heads * capacity, -7), counts(size_t(batch) * kv_heads, -7) {
    sel = {pages.data(), counts.data(), capacity};
  }
  // The selected logical pages of (sequence b, KV head g).
  std::vector<int32_t> of(int b, int g, int kv_heads) const {
    const int64_t row = int64_t(b) * kv_heads + g;
    const int n = counts[size_t(row)];
    return {pages.begin() + row * sel.capacity, pages.begin() + row * sel.capacity + n};
  }
};

// Exact per-head log page masses in score_pages' layout [batch, Hq, M]: every full page's
// log sum_i exp(q.k_i * scale), -inf for the tail page and beyond the sequence.
inline std::vector<double> exact_head_scores(const TestCache& t) {
  const int B = t.bv().batch_size, Hq = t.spec.num_q_heads, M = t.max_blocks();
  const int G = Hq / t.spec.num_kv_heads, d = t.spec.head_dim, P = t.spec.page_size;
  std::vector<double> s(size_t(B) * Hq * M, kNegInf);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < Hq; ++h)
      for (int j = 0; j < t.bv().seq_lens[b] / P; ++j)
        s[(size_t(b) * Hq + h) * M + j] = ref::exact_log_mass(
            t.view(), t.block_of(b, j), h / G, P, t.q.data() + (size_t(b) * Hq + h) * d, t.scale());
  return s;
}

}  // namespace locks::test
