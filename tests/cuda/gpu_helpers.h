// Test helpers: device buffers, a GPU mirror of a host paged cache and its summaries,
// structured random KV data.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "locks/cuda/check.h"
#include "locks/cuda/summary_builder.h"
#include "locks/kv_cache.h"
#include "locks/summary.h"

namespace locks::cuda_test {

// The project's one CUDA check (locks::CudaError), under the tests' short name.
#define CK(x) LOCKS_CUDA_CHECK(x)

inline bool has_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}
#define SKIP_WITHOUT_GPU() \
  if (!::locks::cuda_test::has_gpu()) GTEST_SKIP() << "no CUDA device"

// Owning device buffer.
template <typename T>
struct DevBuf {
  T* p = nullptr;
  size_t n = 0;
  DevBuf() = default;
  explicit DevBuf(size_t count) : n(count) {
    CK(cudaMalloc(reinterpret_cast<void**>(&p), std::max<size_t>(n, 1) * sizeof(T)));
  }
  explicit DevBuf(const std::vector<T>& h) : DevBuf(h.size()) { upload(h); }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  DevBuf(DevBuf&& o) noexcept : p(o.p), n(o.n) { o.p = nullptr; }
  DevBuf& operator=(DevBuf&& o) noexcept {
    std::swap(p, o.p);
    std::swap(n, o.n);
    return *this;
  }
  ~DevBuf() { cudaFree(p); }
  // The copies and fills wait for the device before returning: many tests launch on
  // non-blocking streams, which do not wait for the legacy stream's work, and cudaMemcpy from
  // pageable memory or cudaMemset may return with their transfer still in flight (the CUDA
  // runtime's "API synchronization behavior").
  void upload(const std::vector<T>& h) { upload(h.data(), h.size()); }
  void upload(const T* h, size_t count) {
    CK(cudaMemcpy(p, h, count * sizeof(T), cudaMemcpyHostToDevice));
    CK(cudaDeviceSynchronize());
  }
  std::vector<T> download(size_t count = 0) const {
    std::vector<T> h(count ? count : n);
    CK(cudaMemcpy(h.data(), p, h.size() * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
  }
  void poison() {
    CK(cudaMemset(p, 0xff, std::max<size_t>(n, 1) * sizeof(T)));
    CK(cudaDeviceSynchronize());
  }
};

// Keys with page-local structure: each page has its own centre and a random subspace of
// dimension `local_rank`, plus small noise; values Gaussian. Layout [tokens, H, d].
// Direction r of a page's subspace has amplitude 0.3 * decay^r (decay < 1: well separated
// singular values, so every backend must find the same top-r subspace).
inline void make_kv(int64_t tokens, int H, int d, int P, int local_rank, uint64_t seed,
                    std::vector<float>& k, std::vector<float>& v, float decay = 1.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> N(0.f, 1.f);
  k.assign(size_t(tokens) * H * d, 0.f);
  v.assign(size_t(tokens) * H * d, 0.f);
  for (auto& x : v) x = N(rng);
  std::vector<float> centre(d), basis(size_t(local_rank) * d);
  for (int64_t p0 = 0; p0 < tokens; p0 += P)
    for (int h = 0; h < H; ++h) {
      for (auto& x : centre) x = 0.5f * N(rng);
      for (auto& x : basis) x = N(rng);
      for (int64_t t = p0; t < std::min(tokens, p0 + P); ++t) {
        float* row = k.data() + (size_t(t) * H + h) * d;
        for (int e = 0; e < d; ++e) row[e] = centre[size_t(e)] + 0.05f * N(rng);
        for (int r = 0; r < local_rank; ++r) {
          const float a = N(rng);
          const float amp = 0.3f * std::pow(decay, float(r));
          for (int e = 0; e < d; ++e) row[e] += a * basis[size_t(r) * d + e] * amp;
        }
      }
    }
}

// A host PagedKvCache mirrored on the device, with its batch (all sequences).
struct GpuCache {
  PagedKvCache host;
  PagedKvCache::Batch batch;
  DevBuf<uint8_t> k, v;
  DevBuf<int32_t> block_table, seq_lens;

  explicit GpuCache(const CacheLayout& L) : host(L) {}
  void add(const std::vector<float>& kk, const std::vector<float>& vv, int64_t tokens) {
    const int s = host.add_sequence();
    host.append(s, kk.data(), vv.data(), tokens);
  }
  void sync() {
    const CacheLayout& L = host.layout();
    const size_t bytes = size_t(L.num_blocks) * size_t(L.block_elems()) * dtype_size(L.dtype);
    if (k.n != bytes) {
      k = DevBuf<uint8_t>(bytes);
      v = DevBuf<uint8_t>(bytes);
    }
    k.upload(static_cast<const uint8_t*>(host.view().k), bytes);
    v.upload(static_cast<const uint8_t*>(host.view().v), bytes);
    batch = host.batch();
    block_table = DevBuf<int32_t>(batch.block_table);
    seq_lens = DevBuf<int32_t>(batch.seq_lens);
  }
  // One sequence per length, keys from make_kv (local rank 6, seeds seed0, seed0 + 1, ...);
  // then sync().
  void add_structured(const std::vector<int64_t>& lens, uint64_t seed0) {
    const CacheLayout& L = host.layout();
    for (size_t s = 0; s < lens.size(); ++s) {
      std::vector<float> kk, vv;
      make_kv(lens[s], L.num_kv_heads, L.head_dim, L.page_size, 6, seed0 + s, kk, vv);
      add(kk, vv, lens[s]);
    }
    sync();
  }
  KvCacheView dview() const { return {k.p, v.p, host.layout()}; }
  BatchView dbatch() const {
    BatchView b = batch.view;
    b.block_table = block_table.p;
    b.seq_lens = seq_lens.p;
    return b;
  }
  // Physical ids of every full page of every sequence.
  std::vector<int32_t> full_blocks() const {
    std::vector<int32_t> ids;
    for (int s = 0; s < host.num_sequences(); ++s) {
      const int full = host.seq_len(s) / host.layout().page_size;
      for (int j = 0; j < full; ++j) ids.push_back(host.blocks(s)[size_t(j)]);
    }
    return ids;
  }
};

// Device summary arrays for a layout, with a view; download / upload of a host store.
struct GpuSummaries {
  SummaryLayout L;
  DevBuf<float> mu, basis, coeff, mu_scale, basis_scale, coeff_scale;
  DevBuf<int8_t> mu_q, coeff_q;
  DevBuf<uint8_t> basis_q;
  explicit GpuSummaries(const SummaryLayout& l) : L(l) {
    const size_t nb = size_t(L.num_blocks) * L.num_kv_heads, d = L.head_dim, r = L.rank,
                 P = L.page_size;
    if (L.precision == Precision::fp32) {
      mu = DevBuf<float>(nb * d);
      basis = DevBuf<float>(nb * r * d);
      coeff = DevBuf<float>(nb * P * r);
    } else {
      mu_q = DevBuf<int8_t>(nb * d);
      mu_scale = DevBuf<float>(nb);
      basis_q = DevBuf<uint8_t>(nb * r * d / 2);
      basis_scale = DevBuf<float>(nb * size_t(basis_scales_per_head(L)));
      coeff_q = DevBuf<int8_t>(nb * P * r);
      coeff_scale = DevBuf<float>(nb * r);
    }
  }
  SummaryView view() {
    SummaryView v;
    v.layout = L;
    v.mu = mu.p, v.basis = basis.p, v.coeff = coeff.p;
    v.mu_q = mu_q.p, v.mu_scale = mu_scale.p, v.basis_q = basis_q.p;
    v.basis_scale = basis_scale.p, v.coeff_q = coeff_q.p, v.coeff_scale = coeff_scale.p;
    return v;
  }
  void upload_from(SummaryStore& s) {
    const SummaryView h = s.view();
    const size_t nb = size_t(L.num_blocks) * L.num_kv_heads, d = L.head_dim, r = L.rank,
                 P = L.page_size;
    if (L.precision == Precision::fp32) {
      mu.upload(h.mu, nb * d);
      basis.upload(h.basis, nb * r * d);
      coeff.upload(h.coeff, nb * P * r);
    } else {
      mu_q.upload(h.mu_q, nb * d);
      mu_scale.upload(h.mu_scale, nb);
      basis_q.upload(h.basis_q, nb * r * d / 2);
      basis_scale.upload(h.basis_scale, nb * size_t(basis_scales_per_head(L)));
      coeff_q.upload(h.coeff_q, nb * P * r);
      coeff_scale.upload(h.coeff_scale, nb * r);
    }
  }
};

// The summaries of every full page of gc's sequences, built on the device by builder.
inline void build_full_pages(cuda::SummaryBuilder& builder, const GpuCache& gc,
                             GpuSummaries& sums) {
  const auto ids = gc.full_blocks();
  DevBuf<int32_t> dids(ids);
  builder.build(gc.dview(), dids.p, int64_t(ids.size()), sums.view(), nullptr);
  CK(cudaDeviceSynchronize());
}

inline std::vector<float> random_queries(int B, int Hq, int d, float amp, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> N(0.f, amp);
  std::vector<float> q(size_t(B) * Hq * d);
  for (auto& x : q) x = N(rng);
  return q;
}

}  // namespace locks::cuda_test
