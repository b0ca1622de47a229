// PagedKvCache: an owning host block pool with per-sequence block lists.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "locks/error.h"
#include "locks/kv_cache.h"

namespace locks {

namespace {

// Converts n floats to dtype t into out; returns the index of the first element that is
// not finite once stored (NaN/Inf, or a finite float beyond fp16/bf16 range), else -1.
// One loop per dtype (no per-element switch); the check is a flag, located only on failure.
int64_t convert_checked(const float* x, int64_t n, DType t, uint8_t* out) {
  bool ok = true;
  if (t == DType::f32) {
    std::memcpy(out, x, size_t(n) * 4);
    for (int64_t i = 0; i < n; ++i) ok &= std::isfinite(x[i]);
  } else {
    uint16_t* o = reinterpret_cast<uint16_t*>(out);
    const uint16_t exp_mask = t == DType::f16 ? 0x7C00u : 0x7F80u;  // all ones: Inf/NaN
    if (t == DType::f16) {
      for (int64_t i = 0; i < n; ++i) o[i] = float_to_half(x[i]);
    } else {
      for (int64_t i = 0; i < n; ++i) o[i] = float_to_bf16(x[i]);
    }
    for (int64_t i = 0; i < n; ++i) ok &= (o[i] & exp_mask) != exp_mask;
  }
  if (ok) return -1;
  for (int64_t i = 0; i < n; ++i)
    if (!std::isfinite(load_as_float(out, t, i))) return i;
  return -1;  // unreachable
}

}  // namespace

PagedKvCache::PagedKvCache(const CacheLayout& layout) : layout_(layout) {
  validate_layout(layout_);
  const size_t bytes = size_t(layout_.num_blocks) * size_t(layout_.block_elems()) *
                       size_t(dtype_size(layout_.dtype));
  k_.assign(bytes, 0);
  v_.assign(bytes, 0);
  // Stack of free ids, popped from the back: blocks are handed out as 0, 1, 2, ...
  free_.resize(size_t(layout_.num_blocks));
  for (int64_t i = 0; i < layout_.num_blocks; ++i)
    free_[size_t(i)] = static_cast<int32_t>(layout_.num_blocks - 1 - i);
}

int PagedKvCache::add_sequence() {
  blocks_.emplace_back();
  lens_.push_back(0);
  return static_cast<int>(blocks_.size()) - 1;
}

int32_t PagedKvCache::seq_len(int seq) const {
  LOCKS_REQUIRE(seq >= 0 && seq < num_sequences(), "no sequence ", seq);
  return lens_[size_t(seq)];
}

const std::vector<int32_t>& PagedKvCache::blocks(int seq) const {
  LOCKS_REQUIRE(seq >= 0 && seq < num_sequences(), "no sequence ", seq);
  return blocks_[size_t(seq)];
}

std::vector<int32_t> PagedKvCache::append(int seq, const float* k, const float* v,
                                          int64_t n_tokens) {
  LOCKS_REQUIRE(seq >= 0 && seq < num_sequences(), "no sequence ", seq);
  LOCKS_REQUIRE(n_tokens >= 0, "n_tokens must be >= 0, got ", n_tokens);
  if (n_tokens == 0) return {};
  LOCKS_REQUIRE(k != nullptr && v != nullptr, "k and v must be non-null");
  const int64_t row = int64_t(layout_.num_kv_heads) * layout_.head_dim;
  const int64_t n = n_tokens * row;
  // Convert to the storage dtype first and check the stored values: a float that is finite
  // but overflows fp16/bf16 would put Inf in the cache, which the per-step kernels rely on
  // never seeing. Everything is checked before anything changes: a rejected call leaves
  // the cache as it was.
  const int es = dtype_size(layout_.dtype);
  std::vector<uint8_t> ks(size_t(n) * es), vs(size_t(n) * es);
  for (int which = 0; which < 2; ++which) {
    const float* src = which == 0 ? k : v;
    const int64_t bad = convert_checked(src, n, layout_.dtype, which == 0 ? ks.data() : vs.data());
    LOCKS_REQUIRE(bad < 0, which == 0 ? "key" : "value", " at token ", bad / row, " (element ", bad,
                  ") is ", src[bad < 0 ? 0 : bad], ": not finite in ", dtype_name(layout_.dtype));
  }
  std::vector<int32_t>& mine = blocks_[size_t(seq)];
  const int P = layout_.page_size;
  const int64_t len = lens_[size_t(seq)];
  const int64_t new_len = len + n_tokens;
  LOCKS_REQUIRE(new_len <= INT32_MAX, "sequence length ", new_len, " overflows int32");
  const int64_t need = (new_len + P - 1) / P - int64_t(mine.size());
  LOCKS_REQUIRE(need <= int64_t(free_.size()), "out of blocks: sequence ", seq, " needs ", need,
                " more, ", free_.size(), " free");
  for (int64_t i = 0; i < need; ++i) {
    mine.push_back(free_.back());
    free_.pop_back();
  }
  std::vector<int32_t> filled;
  for (int64_t t = 0; t < n_tokens; ++t) {
    const int64_t pos = len + t;
    const int32_t block = mine[size_t(pos / P)];
    const int slot = static_cast<int>(pos % P);
    const size_t off = size_t(layout_.offset(block, slot, 0)) * es;  // heads are contiguous
    std::memcpy(k_.data() + off, ks.data() + size_t(t * row) * es, size_t(row) * es);
    std::memcpy(v_.data() + off, vs.data() + size_t(t * row) * es, size_t(row) * es);
    if (slot == P - 1) filled.push_back(block);
  }
  lens_[size_t(seq)] = static_cast<int32_t>(new_len);
  return filled;
}

PagedKvCache::Batch PagedKvCache::batch(const std::vector<int>& seqs) const {
  std::vector<int> ids = seqs;
  if (ids.empty()) {
    ids.resize(size_t(num_sequences()));
    for (int i = 0; i < num_sequences(); ++i) ids[size_t(i)] = i;
  }
  int width = 1;
  for (int s : ids) {
    LOCKS_REQUIRE(s >= 0 && s < num_sequences(), "no sequence ", s);
    width = std::max(width, static_cast<int>(blocks_[size_t(s)].size()));
  }
  Batch out;
  out.block_table.assign(ids.size() * size_t(width), -1);  // unused entries are -1
  out.seq_lens.resize(ids.size());
  for (size_t b = 0; b < ids.size(); ++b) {
    const auto& bl = blocks_[size_t(ids[b])];
    std::copy(bl.begin(), bl.end(), out.block_table.begin() + int64_t(b) * width);
    out.seq_lens[b] = lens_[size_t(ids[b])];
  }
  out.view.block_table = out.block_table.data();
  out.view.block_table_stride = width;
  out.view.seq_lens = out.seq_lens.data();
  out.view.batch_size = static_cast<int>(ids.size());
  out.view.max_blocks_per_seq = width;
  return out;
}

}  // namespace locks
