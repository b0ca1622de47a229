// Paged KV cache in vLLM's layout, as plain views over raw memory.
//
// K and V are two arrays of blocks, each block [page_size, num_kv_heads, head_dim]
// (contiguous, row-major), consecutive blocks block_stride elements apart: element
// (block, slot, head, dim) lives at
//   block * block_stride + (slot * num_kv_heads + head) * head_dim + dim.
// Dense ([num_blocks, page_size, num_kv_heads, head_dim] contiguous, PagedKvCache's own
// memory, vLLM's V2 model runner): block_stride = page_size * num_kv_heads * head_dim.
// vLLM's V1 model runner interleaves K and V per block ([num_blocks, 2, P, H, d] physically,
// K = kv[:, 0], V = kv[:, 1]): block_stride = 2 * page_size * num_kv_heads * head_dim.
// A sequence owns a list of physical blocks (its row of the block table); its
// token t sits in block block_table[t / page_size], slot t % page_size. A view
// says nothing about where the memory lives (host or device): the backend that
// receives it decides.
#pragma once

#include <cstdint>
#include <vector>

#include "locks/dtype.h"

namespace locks {

struct CacheLayout {
  int64_t num_blocks = 0;
  int page_size = 16;
  int num_kv_heads = 1;
  int head_dim = 128;
  DType dtype = DType::f32;

  int64_t block_elems() const { return int64_t(page_size) * num_kv_heads * head_dim; }
  // Offset in a dense cache (block_stride = block_elems()); a view's offset() follows its
  // block stride.
  int64_t offset(int64_t block, int slot, int head) const {
    return ((block * page_size + slot) * num_kv_heads + head) * int64_t(head_dim);
  }
};

// The block stride is the view's, not the layout's: it says where the memory is (like the
// pointers), not what the cache holds, so a plan made from a CacheLayout serves dense and
// strided caches alike, and each call may pass either.
struct KvCacheView {
  const void* k = nullptr;
  const void* v = nullptr;
  CacheLayout layout;
  // Elements from block b to block b + 1, the same for K and V; 0 = dense (block_elems()).
  // Otherwise >= block_elems() (validate_cache); the CUDA backend also needs it a multiple
  // of 16 bytes (its 16-byte loads).
  int64_t block_stride = 0;

  int64_t block_step() const { return block_stride != 0 ? block_stride : layout.block_elems(); }
  int64_t offset(int64_t block, int slot, int head) const {
    return block * block_step() + (int64_t(slot) * layout.num_kv_heads + head) * layout.head_dim;
  }
};

// A batch of sequences over one cache: block_table is [batch_size, block_table_stride]
// (row b lists the physical blocks of sequence b, first max_blocks_per_seq used),
// seq_lens is [batch_size]. Sequence b has ceil(seq_lens[b] / page_size) pages.
struct BatchView {
  const int32_t* block_table = nullptr;
  int64_t block_table_stride = 0;
  const int32_t* seq_lens = nullptr;
  int batch_size = 0;
  int max_blocks_per_seq = 0;
};

// A cache's head_dim: even (the int4 summaries pack two dims a byte) and in [8, 512] (every
// model's, with room: 64-256 in the common ones, 80 in Phi-2 and StableLM, 96 in Phi-3). What
// each backend runs of that: locks/support.h (the CUDA kernels: 64, 128, 256).
inline constexpr int kMinHeadDim = 8, kMaxHeadDim = 512;
constexpr bool head_dim_valid(int d) { return d >= kMinHeadDim && d <= kMaxHeadDim && d % 2 == 0; }

// Throws locks::Error unless layout describes a usable cache:
// num_blocks >= 1, page_size in [2, 256], num_kv_heads >= 1, head_dim_valid(head_dim).
void validate_layout(const CacheLayout& layout);
// Throws locks::Error unless cache is usable: validate_layout(cache.layout); block_stride 0 or
// in [block_elems(), INT64_MAX / num_blocks] (blocks may not overlap each other; offsets must
// not overflow); and, where both k and v are given, no K block overlaps a V block (e.g. V =
// K + block_elems() in an interleaved [N, 2, P, H, d] cache is fine, V = K is not). Pointers
// are not checked for null here (a summary build passes no v); the ops say which they need.
void validate_cache(const KvCacheView& cache);
// Throws unless every seq_len is in [1, max_blocks_per_seq * page_size] and every used
// block id is in [0, num_blocks). Reads the (host) arrays.
void validate_batch(const CacheLayout& layout, const BatchView& batch);

// Owning host-side paged cache: a pool of blocks, sequences that take blocks as they grow.
// K/V are stored in layout.dtype; inputs are float32 [tokens, num_kv_heads, head_dim].
// NaN/Inf keys or values are rejected here, when data enters the cache, so that the
// per-step kernels need not re-scan the cache.
class PagedKvCache {
 public:
  explicit PagedKvCache(const CacheLayout& layout);

  // New empty sequence; returns its id (0, 1, 2, ...).
  int add_sequence();
  // Append n tokens (prefill when n > 1, decode when n == 1) to sequence seq.
  // Returns the physical ids of the blocks that became full during this call, in order.
  // Throws (leaving the cache unchanged) on NaN/Inf input or when the pool runs out of blocks.
  std::vector<int32_t> append(int seq, const float* k, const float* v, int64_t n_tokens);

  int num_sequences() const { return static_cast<int>(blocks_.size()); }
  int32_t seq_len(int seq) const;
  const std::vector<int32_t>& blocks(int seq) const;
  const CacheLayout& layout() const { return layout_; }
  int64_t free_blocks() const { return static_cast<int64_t>(free_.size()); }

  KvCacheView view() const { return {k_.data(), v_.data(), layout_}; }
  void* k_data() { return k_.data(); }
  void* v_data() { return v_.data(); }

  // Flattened block table and lengths for the given sequences (all when empty), stride =
  // max_blocks_per_seq = the most blocks any of them holds (at least 1), unused entries -1.
  // view points into this Batch's own vectors: keep the Batch alive, do not copy it.
  struct Batch {
    std::vector<int32_t> block_table;
    std::vector<int32_t> seq_lens;
    BatchView view;
  };
  Batch batch(const std::vector<int>& seqs = {}) const;

 private:
  CacheLayout layout_;
  std::vector<uint8_t> k_, v_;
  std::vector<int32_t> free_;  // stack of free block ids
  std::vector<std::vector<int32_t>> blocks_;
  std::vector<int32_t> lens_;
};

}  // namespace locks
