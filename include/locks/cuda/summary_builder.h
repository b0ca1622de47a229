// GPU summary build (H100/H200, sm_90a): per (page, KV head) centroid, top-r eigenvectors of
// the 16x16 centred Gram matrix (basis = D^T u / sigma, coeff = sigma * u), quantization
// fused. Same storage as include/locks/summary.h; all pointers are device pointers.
//
// Two solvers for the 16x16 symmetric eigenproblem:
//   warp_jacobi: our own cyclic Jacobi, one half-warp per matrix, all in registers;
//   cusolver:    cusolverDnSsyevjBatched on the Gram matrices (Gram kernel, solver,
//                epilogue kernel). Kept to compare against; not graph-capturable here.
//
// This class lives in the comparison library locks_cuda_compare (tests and benchmarks link
// it; it carries the cuSOLVER dependency). The library API is the contract's free functions
// cuda::summary_build / summary_build_filled / summary_build_slots (locks/contract.h), which
// the warp_jacobi path forwards to.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "locks/kv_cache.h"
#include "locks/summary.h"

namespace locks::cuda {

enum class Solver : int { warp_jacobi = 0, cusolver = 1 };

class SummaryBuilder {
 public:
  // max_pages_per_call bounds n_blocks of build() (sizes the cuSOLVER workspace only).
  SummaryBuilder(const CacheLayout& cache, const SummaryLayout& summary, Solver solver,
                 int64_t max_pages_per_call);
  ~SummaryBuilder();
  SummaryBuilder(const SummaryBuilder&) = delete;
  SummaryBuilder& operator=(const SummaryBuilder&) = delete;

  // Bulk: the summaries of block_ids[0..n_blocks) (device array of full physical blocks),
  // every KV head. No host sync (warp_jacobi).
  void build(const KvCacheView& cache, const int32_t* block_ids, int64_t n_blocks,
             const SummaryView& out, cudaStream_t stream);

  // Incremental, graph-safe (warp_jacobi only): for each sequence of the batch (device
  // block_table / seq_lens), if the last `appended` tokens (1 <= appended <= page size)
  // completed a page, build that page's summary. The grid depends on batch_size only.
  void build_filled(const KvCacheView& cache, const BatchView& batch, int appended,
                    const SummaryView& out, cudaStream_t stream);

  Solver solver() const { return solver_; }

 private:
  CacheLayout cache_;
  SummaryLayout summary_;
  Solver solver_;
  int64_t max_pages_;
  void* solver_state_ = nullptr;  // cuSOLVER handle, params and workspace (cusolver only)
};

}  // namespace locks::cuda
