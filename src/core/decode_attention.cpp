// cpu::decode_attention_dense / _sparse: exact attention over a list of pages with an
// online softmax in fp32.
//
// Work is split flash-decoding style: each (sequence, KV head) page list is cut into
// chunks of kChunkPages pages; every chunk yields a partial softmax state (max m, sum l,
// unnormalised output acc) for each query head of the group, and the chunks' states are
// merged in order. The cut depends only on the page list, never on the thread count, so
// results are reproducible run to run, and dense (the same code over every page) equals
// sparse with every page selected bit for bit. A long single sequence thus spreads over
// all cores. A work item is one chunk index of one sequence across all its KV heads, pages
// visited position-major, so dense reads each block front to back; a page's K/V rows are
// converted to float once and reused by the whole query-head group.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "internal/check.h"
#include "internal/fast_exp.h"
#include "internal/ops.h"
#include "internal/row_convert.h"
#include "internal/simd_clones.h"
#include "locks/attention.h"
#include "locks/error.h"

namespace locks::cpu {
namespace {

constexpr int kChunkPages = 16;
constexpr int kAhead = 1;  // pages prefetched ahead (2 measured no better)
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr float kPosInf = std::numeric_limits<float>::infinity();

// A page's rows of one head are P runs of d elements, num_kv_heads * d apart: too
// scattered for the hardware prefetcher, so the next page is requested while this one is
// computed (measured: about 3x faster on a bf16 cache).
void prefetch_page(const KvCacheView& cache, int32_t block, int g) {
  const CacheLayout& L = cache.layout;
  const int64_t row_bytes = int64_t(L.head_dim) * dtype_size(L.dtype);
  for (int s = 0; s < L.page_size; ++s) {
    const int64_t off = cache.offset(block, s, g) * dtype_size(L.dtype);
    const char* k = static_cast<const char*>(cache.k) + off;
    const char* v = static_cast<const char*>(cache.v) + off;
    for (int64_t c = 0; c < row_bytes; c += 64) {
      __builtin_prefetch(k + c);
      __builtin_prefetch(v + c);
    }
  }
}

struct Scratch {
  float* kbuf;
  float* vbuf;
  float* logits;
  const float** krow;
  const float** vrow;
  float* qg;    // [G * d]: a group's query rows as float (q in fp16 / bf16)
  float* orow;  // [d]: an output row before its rounding (out in fp16 / bf16)
};

// One page of one KV head folded into the online-softmax states of its G query heads;
// state per head: [m, l, acc[d]] at st + h * (d + 2).
// always_inline: the callers are SIMD clones; an out-of-line copy would be baseline x86-64.
[[gnu::always_inline]] inline void attend_page(const KvCacheView& cache, int32_t block, int n,
                                               int g, const float* qg, int G, float scale,
                                               float* st, const Scratch& w) {
  const CacheLayout& L = cache.layout;
  const int d = L.head_dim;
  const int64_t stride = d + 2;
  for (int s = 0; s < n; ++s) {
    const int64_t off = cache.offset(block, s, g);
    w.krow[s] = detail::load_row(cache.k, L.dtype, off, d, w.kbuf + s * d);
    w.vrow[s] = detail::load_row(cache.v, L.dtype, off, d, w.vbuf + s * d);
  }
  for (int h = 0; h < G; ++h) {
    const float* qh = qg + int64_t(h) * d;
    float* sh = st + h * stride;
    float* acc = sh + 2;
    float mx = kNegInf;
    bool bad = false;
    for (int s = 0; s < n; ++s) {
      const float x = detail::dot(qh, w.krow[s], d) * scale;
      w.logits[s] = x;
      mx = x > mx ? x : mx;
      bad |= !(x < kPosInf);  // NaN or +inf (a NaN or Inf in K, or q.k overflowing float)
    }
    if (bad) {
      // The exact softmax of a NaN or +inf logit is NaN. Without this the token would be
      // dropped silently (the max skips NaN, exp_nonpos(NaN) is 0): poison the state instead
      // so the head's output and lse are NaN (docs/bad_input.md, NaN policy).
      sh[1] = std::numeric_limits<float>::quiet_NaN();
      std::fill(acc, acc + d, std::numeric_limits<float>::quiet_NaN());
      continue;
    }
    if (mx > sh[0]) {  // new running max: rescale what was accumulated so far
      const float corr = std::exp(sh[0] - mx);
      sh[1] *= corr;
      for (int e = 0; e < d; ++e) acc[e] *= corr;
      sh[0] = mx;
    }
    const float m = sh[0];
    float l = sh[1];
    for (int s = 0; s < n; ++s) w.logits[s] = detail::exp_nonpos(w.logits[s] - m);
    for (int s = 0; s < n; ++s) l += w.logits[s];
    sh[1] = l;
    // acc += sum_s p_s v_s, 16 output dims at a time kept in registers over the page; the
    // dims past the last 16 (head dims that are no multiple of 16) one at a time, in the same
    // order over s.
    constexpr int B = 16;
    const int d16 = d - d % B;
    for (int e0 = 0; e0 < d16; e0 += B) {
      float t[B];
      for (int e = 0; e < B; ++e) t[e] = acc[e0 + e];
      for (int s = 0; s < n; ++s) {
        const float p = w.logits[s];
        const float* v = w.vrow[s] + e0;
        for (int e = 0; e < B; ++e) t[e] += p * v[e];
      }
      for (int e = 0; e < B; ++e) acc[e0 + e] = t[e];
    }
    for (int e = d16; e < d; ++e) {
      float t = acc[e];
      for (int s = 0; s < n; ++s) t += w.logits[s] * w.vrow[s][e];
      acc[e] = t;
    }
  }
}

// Chunk c of every KV head of sequence b: list positions [c K, (c + 1) K) of each head's page
// list (pages == nullptr: every page in order). Pages are visited position-major across the
// heads, so that with the same page for every head (dense) a block is read front to back.
LOCKS_SIMD_CLONES
void attend_chunk(const KvCacheView& cache, const BatchView& batch, const QueryView& q, float scale,
                  const int32_t* pages, int capacity, const int32_t* n_sel, const int64_t* first,
                  int b, int c, float* part, const Scratch& w) {
  const CacheLayout& L = cache.layout;
  const int P = L.page_size, Hkv = L.num_kv_heads, d = L.head_dim;
  const int Hq = q.num_q_heads, G = Hq / Hkv;
  const int64_t stride = d + 2;
  const int32_t len = batch.seq_lens[b];
  const int32_t* table = batch.block_table + int64_t(b) * batch.block_table_stride;
  const int i0 = c * kChunkPages;
  for (int g = 0; g < Hkv; ++g) {
    const int64_t bg = int64_t(b) * Hkv + g;
    if (i0 >= n_sel[bg]) continue;
    float* st = part + (first[bg] + c) * G * stride;
    for (int h = 0; h < G; ++h) {
      float* sh = st + h * stride;
      sh[0] = kNegInf;
      sh[1] = 0.0f;
      std::fill(sh + 2, sh + stride, 0.0f);
    }
  }
  for (int i = i0; i < i0 + kChunkPages; ++i) {
    for (int g = 0; g < Hkv; ++g) {
      const int64_t bg = int64_t(b) * Hkv + g;
      const int i1 = n_sel[bg];
      if (i >= i1) continue;
      const int32_t* list = pages ? pages + bg * capacity : nullptr;
      const int j = list ? list[i] : i;
      if (i + kAhead < std::min(i1, i0 + kChunkPages))
        prefetch_page(cache, table[list ? list[i + kAhead] : i + kAhead], g);
      // (converted once a page and head: G d elements against the page's 2 P G d products)
      const float* qg = detail::load_row(q.q, q.dtype, q.offset(b, int64_t(g) * G, d), G * d, w.qg);
      attend_page(cache, table[j], std::min(P, len - j * P), g, qg, G, scale,
                  part + (first[bg] + c) * G * stride, w);
    }
  }
}

struct Item {
  int b, c;
};

// pages == nullptr means every page of every sequence, in order (dense). shared: the chunk
// bookkeeping and states (attention_shared_bytes), or nullptr to allocate what this
// selection needs.
void attend(const KvCacheView& cache, const BatchView& batch, const QueryView& q, float scale,
            const int32_t* pages, const int32_t* counts, int capacity, const AttentionOutput& out,
            const detail::ThreadScratch& sc, std::byte* shared, size_t shared_bytes) {
  const CacheLayout& L = cache.layout;
  const int P = L.page_size, Hkv = L.num_kv_heads, d = L.head_dim;
  const int Hq = q.num_q_heads, G = Hq / Hkv;
  const int64_t groups = int64_t(batch.batch_size) * Hkv;
  const int M = batch.max_blocks_per_seq;
  const int max_chunks = (M + kChunkPages - 1) / kChunkPages;
  LOCKS_REQUIRE(sc.per_thread >= impl::attention_scratch_bytes(P, d, G), "scratch too small");

  // Chunks per (sequence, KV head), the offset of each one's first chunk state, and the
  // work items: (sequence, chunk index) up to the most chunks of any head of the sequence.
  std::vector<std::byte> owned;
  const size_t head = impl::attention_shared_bytes(batch.batch_size, Hkv, 0, M, d);
  if (shared == nullptr) {
    shared_bytes = head;
    owned.resize(shared_bytes);
    shared = owned.data();
  }
  LOCKS_REQUIRE(head <= shared_bytes, "attention workspace too small");  // before carving it
  detail::Carver carver(shared);
  int32_t* n_sel = carver.take<int32_t>(size_t(groups));
  int64_t* first = carver.take<int64_t>(size_t(groups) + 1);
  Item* items = carver.take<Item>(size_t(batch.batch_size) * max_chunks);
  first[0] = 0;
  int64_t n_items = 0;
  int64_t work = 0;  // page x query-head units, ~1 us each at d = 128
  for (int b = 0; b < batch.batch_size; ++b) {
    int most = 0;
    for (int g = 0; g < Hkv; ++g) {
      const int64_t bg = int64_t(b) * Hkv + g;
      const int32_t n = pages ? counts[bg] : detail::num_pages(batch.seq_lens[b], P);
      n_sel[size_t(bg)] = n;
      const int chunks = (n + kChunkPages - 1) / kChunkPages;
      first[size_t(bg) + 1] = first[size_t(bg)] + chunks;
      most = std::max(most, chunks);
      work += int64_t(n) * G;
    }
    for (int c = 0; c < most; ++c) items[n_items++] = {b, c};
  }
  // Partial state per (sequence, KV head, chunk, query head of the group): [m, l, acc[d]].
  const int64_t stride = d + 2;
  const size_t n_part = size_t(first[size_t(groups)] * G * stride);
  std::vector<float> owned_part;
  float* part;
  if (!owned.empty()) {
    owned_part.resize(n_part);
    part = owned_part.data();
  } else {
    LOCKS_REQUIRE(head + n_part * sizeof(float) <= shared_bytes, "attention workspace too small");
    part = reinterpret_cast<float*>(shared + head);
  }

  // Threads only pay off beyond a few dozen page x head units (fork/join costs microseconds).
#pragma omp parallel num_threads(sc.threads) if (n_items > 1 && work >= 32)
  {
    detail::Carver c(sc.slice(omp_get_thread_num()));
    float* kbuf = c.take<float>(size_t(P) * d);
    float* vbuf = c.take<float>(size_t(P) * d);
    float* logits = c.take<float>(size_t(P));
    const float** krow = c.take<const float*>(size_t(P));
    const float** vrow = c.take<const float*>(size_t(P));
    float* qg = c.take<float>(size_t(G) * d);
    float* orow = c.take<float>(size_t(d));
    Scratch scratch{kbuf, vbuf, logits, krow, vrow, qg, orow};
#pragma omp for schedule(dynamic, 1)
    for (int64_t it = 0; it < n_items; ++it) {
      attend_chunk(cache, batch, q, scale, pages, capacity, n_sel, first, items[size_t(it)].b,
                   items[size_t(it)].c, part, scratch);
    }

    // Merge each query head's chunk states in chunk order.
#pragma omp for schedule(static)
    for (int64_t bh = 0; bh < int64_t(batch.batch_size) * Hq; ++bh) {
      const int b = static_cast<int>(bh / Hq), h = static_cast<int>(bh % Hq);
      const int64_t bg = int64_t(b) * Hkv + h / G;
      const int hg = h % G;
      const int64_t c0 = first[size_t(bg)], c1 = first[size_t(bg) + 1];
      float m = kNegInf;
      for (int64_t c = c0; c < c1; ++c) m = std::max(m, part[size_t((c * G + hg) * stride)]);
      float l = 0.0f;
      // fp32 output: accumulated in place; fp16 / bf16: in the row buffer, rounded once below
      float* o = out.dtype == DType::f32 ? static_cast<float*>(out.out) + bh * d : orow;
      std::fill(o, o + d, 0.0f);
      for (int64_t c = c0; c < c1; ++c) {
        const float* sh = part + (c * G + hg) * stride;
        const float w = std::exp(sh[0] - m);
        l += sh[1] * w;
        for (int e = 0; e < d; ++e) o[e] += sh[2 + e] * w;
      }
      const float inv = 1.0f / l;
      for (int e = 0; e < d; ++e) o[e] *= inv;
      if (out.dtype != DType::f32) detail::store_row(o, d, out.out, out.dtype, bh * d);
      if (out.lse) out.lse[bh] = m + std::log(l);
    }
  }
}

void check_common(const KvCacheView& cache, const BatchView& batch, const QueryView& q, float scale,
                  const AttentionOutput& out, const char* where) {
  validate_layout(cache.layout);
  // The batch first: an empty batch has empty (null) buffers, and "batch is empty" says why.
  detail::check_batch_blocks(batch, cache.layout.num_blocks, cache.layout.page_size, where);
  if (cache.k == nullptr || cache.v == nullptr) detail::fail(where, "cache.k or cache.v is null");
  validate_cache(cache);
  if (out.out == nullptr) detail::fail(where, "out.out is null");
  if (!dtype_known(out.dtype))
    detail::fail(where, "out: unknown dtype code ", static_cast<int>(out.dtype));
  detail::check_query(q, batch.batch_size, cache.layout.num_kv_heads, cache.layout.head_dim, where);
  detail::check_scale(scale, where);
}

// G of the scratch size, before the arguments are checked (0 when they cannot give one).
int attention_group(const KvCacheView& cache, const QueryView& q) {
  return cache.layout.num_kv_heads >= 1 ? q.num_q_heads / cache.layout.num_kv_heads : 0;
}

}  // namespace

size_t impl::attention_scratch_bytes(int P, int d, int G) {
  using detail::carve_bytes;
  return 2 * carve_bytes<float>(size_t(P) * d) + carve_bytes<float>(size_t(P)) +
         2 * carve_bytes<const float*>(size_t(P)) + carve_bytes<float>(size_t(G) * d) +
         carve_bytes<float>(size_t(d));
}

// num_q_heads 0: the bookkeeping only (the chunk states follow it).
size_t impl::attention_shared_bytes(int B, int Hkv, int Hq, int M, int d) {
  using detail::carve_bytes;
  const size_t groups = size_t(B) * Hkv, chunks = size_t((M + kChunkPages - 1) / kChunkPages);
  return carve_bytes<int32_t>(groups) + carve_bytes<int64_t>(groups + 1) +
         carve_bytes<Item>(size_t(B) * chunks) +
         carve_bytes<float>(size_t(B) * Hq * chunks * size_t(d + 2));
}

void impl::decode_attention(const KvCacheView& cache, const BatchView& batch, const QueryView& q,
                            float scale, const Selection* sel, const AttentionOutput& out,
                            const detail::ThreadScratch& sc, std::byte* shared,
                            size_t shared_bytes) {
  const char* where = sel ? "decode_attention_sparse" : "decode_attention_dense";
  check_common(cache, batch, q, scale, out, where);
  if (sel) {
    detail::check_selection(*sel, batch, cache.layout.num_kv_heads, cache.layout.page_size, where);
    attend(cache, batch, q, scale, sel->pages, sel->counts, sel->capacity, out, sc, shared,
           shared_bytes);
  } else {
    attend(cache, batch, q, scale, nullptr, nullptr, 0, out, sc, shared, shared_bytes);
  }
}

void decode_attention_dense(const KvCacheView& cache, const BatchView& batch, const QueryView& q,
                            float scale, const AttentionOutput& out) {
  const detail::OwnedScratch sc(detail::checked_bytes(impl::attention_scratch_bytes,
                                                      cache.layout.page_size, cache.layout.head_dim,
                                                      attention_group(cache, q)));
  impl::decode_attention(cache, batch, q, scale, nullptr, out, sc.view(), nullptr, 0);
}

void decode_attention_sparse(const KvCacheView& cache, const BatchView& batch, const QueryView& q,
                             float scale, const Selection& sel, const AttentionOutput& out) {
  const detail::OwnedScratch sc(detail::checked_bytes(impl::attention_scratch_bytes,
                                                      cache.layout.page_size, cache.layout.head_dim,
                                                      attention_group(cache, q)));
  impl::decode_attention(cache, batch, q, scale, &sel, out, sc.view(), nullptr, 0);
}

}  // namespace locks::cpu
