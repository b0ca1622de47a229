// cuda::SummaryBuilder (locks/cuda/summary_builder.h), library locks_cuda_compare: the warp
// Jacobi path forwards to the contract's summary builds; the cuSOLVER path runs the bulk
// kernel's Gram stage, cusolverDnSsyevjBatched and the epilogue stage (a comparison for
// tests and benchmarks; it owns cuSOLVER state and workspace, so it is not in locks_cuda).
#include <cusolverDn.h>

#include <string>

#include "locks/contract.h"
#include "locks/cuda/check.h"
#include "locks/cuda/summary_builder.h"
#include "locks/error.h"
#include "summary_stages.h"

namespace locks::cuda {

// cuSOLVER statuses through the one check macro (locks/cuda/check.h).
inline void check(cusolverStatus_t st, const char* what, const char* file, int line) {
  if (st != CUSOLVER_STATUS_SUCCESS)
    cuda_fail("cuSOLVER status " + std::to_string(int(st)), what, file, line);
}

namespace {
struct CusolverState {
  cusolverDnHandle_t handle = nullptr;
  syevjInfo_t params = nullptr;
  float* gram = nullptr;
  float* eig = nullptr;
  float* work = nullptr;
  int* info = nullptr;
  int lwork = 0;
};
}  // namespace

SummaryBuilder::SummaryBuilder(const CacheLayout& cache, const SummaryLayout& summary,
                               Solver solver, int64_t max_pages_per_call)
    : cache_(cache), summary_(summary), solver_(solver), max_pages_(max_pages_per_call) {
  detail::check_summary_layouts(cache, summary, "SummaryBuilder");
  LOCKS_REQUIRE(max_pages_per_call >= 1, "max_pages_per_call must be >= 1, got ",
                max_pages_per_call);
  if (solver != Solver::cusolver) return;
  auto* s = new CusolverState;
  solver_state_ = s;
  const int64_t n = max_pages_per_call * cache.num_kv_heads;
  LOCKS_REQUIRE(n < (int64_t(1) << 31) / 256, "max_pages_per_call too large for cuSOLVER");
  LOCKS_CUDA_CHECK(cusolverDnCreate(&s->handle));
  LOCKS_CUDA_CHECK(cusolverDnCreateSyevjInfo(&s->params));
  LOCKS_CUDA_CHECK(cusolverDnXsyevjSetTolerance(s->params, 1e-7));
  LOCKS_CUDA_CHECK(cusolverDnXsyevjSetMaxSweeps(s->params, 15));
  // Pad the batch to whole blocks of the Gram kernel so it can write every slot.
  const int64_t n_pad = (n + 3) / 4 * 4 + 4;
  LOCKS_CUDA_CHECK(cudaMalloc(&s->gram, size_t(n_pad) * 256 * sizeof(float)));
  LOCKS_CUDA_CHECK(cudaMalloc(&s->eig, size_t(n_pad) * 16 * sizeof(float)));
  LOCKS_CUDA_CHECK(cudaMalloc(&s->info, size_t(n_pad) * sizeof(int)));
  LOCKS_CUDA_CHECK(cusolverDnSsyevjBatched_bufferSize(s->handle, CUSOLVER_EIG_MODE_VECTOR,
                                                      CUBLAS_FILL_MODE_LOWER, 16, s->gram, 16,
                                                      s->eig, &s->lwork, s->params, int(n)));
  LOCKS_CUDA_CHECK(cudaMalloc(&s->work, size_t(s->lwork) * sizeof(float)));
}

SummaryBuilder::~SummaryBuilder() {
  if (auto* s = static_cast<CusolverState*>(solver_state_)) {
    cudaFree(s->gram);
    cudaFree(s->eig);
    cudaFree(s->work);
    cudaFree(s->info);
    cusolverDnDestroySyevjInfo(s->params);
    cusolverDnDestroy(s->handle);
    delete s;
  }
}

namespace {
void check_same(const CacheLayout& cl, const SummaryLayout& sl, const KvCacheView& cache,
                const SummaryView& out) {
  LOCKS_REQUIRE(cache.layout.num_blocks == cl.num_blocks &&
                    cache.layout.page_size == cl.page_size &&
                    cache.layout.num_kv_heads == cl.num_kv_heads &&
                    cache.layout.head_dim == cl.head_dim && cache.layout.dtype == cl.dtype,
                "cache layout differs from the planned one");
  LOCKS_REQUIRE(out.layout.num_blocks == sl.num_blocks && out.layout.rank == sl.rank &&
                    out.layout.precision == sl.precision && out.layout.head_dim == sl.head_dim &&
                    out.layout.num_kv_heads == sl.num_kv_heads &&
                    out.layout.basis_group == sl.basis_group,
                "summary layout differs from the planned one");
}
}  // namespace

void SummaryBuilder::build(const KvCacheView& cache, const int32_t* block_ids, int64_t n_blocks,
                           const SummaryView& out, cudaStream_t stream) {
  check_same(cache_, summary_, cache, out);
  LOCKS_REQUIRE(n_blocks >= 0 && n_blocks <= max_pages_, "n_blocks ", n_blocks,
                " outside [0, max_pages_per_call = ", max_pages_, "]");
  if (solver_ == Solver::warp_jacobi) {
    summary_build(cache, block_ids, n_blocks, out, stream);
    return;
  }
  detail::check_summary_views(cache, out, "SummaryBuilder::build");
  if (n_blocks == 0) return;
  LOCKS_REQUIRE(block_ids != nullptr, "block_ids is null");
  auto* s = static_cast<CusolverState*>(solver_state_);
  const int64_t problems = n_blocks * cache_.num_kv_heads;
  detail::launch_summary_gram(cache, block_ids, n_blocks, out, s->gram, stream);
  LOCKS_CUDA_CHECK(cusolverDnSetStream(s->handle, stream));
  LOCKS_CUDA_CHECK(cusolverDnSsyevjBatched(s->handle, CUSOLVER_EIG_MODE_VECTOR,
                                           CUBLAS_FILL_MODE_LOWER, 16, s->gram, 16, s->eig, s->work,
                                           s->lwork, s->info, s->params, int(problems)));
  detail::launch_summary_from_eig(cache, block_ids, n_blocks, out, s->gram, s->eig, stream);
}

void SummaryBuilder::build_filled(const KvCacheView& cache, const BatchView& batch, int appended,
                                  const SummaryView& out, cudaStream_t stream) {
  check_same(cache_, summary_, cache, out);
  LOCKS_REQUIRE(solver_ == Solver::warp_jacobi, "build_filled needs the warp_jacobi solver");
  summary_build_filled(cache, batch, appended, out, stream);
}

}  // namespace locks::cuda
