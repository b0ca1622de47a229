// Length buckets (locks/cuda/length_buckets.h): the same step planned for M, M / 2, ... pages a
// row, and, under stream capture, a SWITCH conditional node whose value a one-block kernel sets
// at each replay from the batch's lengths.
#include <algorithm>
#include <string>

#include "decode_checks.h"
#include "length_bucket_rule.h"
#include "locks/cuda/check.h"
#include "locks/cuda/length_buckets.h"
#include "locks/error.h"
#include "locks/rules.h"
#include "plan_common.h"

namespace locks::cuda {
namespace {

constexpr int kChooseThreads = 256;

struct BucketTokens {  // by value into the kernel: each bucket's longest row, ascending
  int64_t tokens[kMaxLengthBuckets];
  int count;
};

// The bucket of the batch's longest trusted row. Lengths are device data: an untrusted one
// counts as 0 (the full plan's rule), so it never asks for a larger bucket.
__global__ void __launch_bounds__(kChooseThreads)
    choose_bucket_kernel(cudaGraphConditionalHandle handle, const int32_t* seq_lens, int batch,
                         int max_blocks, int page_size, BucketTokens bt) {
  int mx = 0;
  for (int i = threadIdx.x; i < batch; i += kChooseThreads)
    mx = max(mx, rules::trusted_len(seq_lens[i], max_blocks, page_size));
  mx = __reduce_max_sync(0xffffffffu, mx);
  __shared__ int warp_max[kChooseThreads / 32];
  if ((threadIdx.x & 31) == 0) warp_max[threadIdx.x >> 5] = mx;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kChooseThreads / 32; ++w) mx = max(mx, warp_max[w]);
    cudaGraphSetConditional(handle, unsigned(detail::length_bucket(mx, bt.tokens, bt.count)));
  }
}

// The same step but for max_blocks_per_seq: every field a bucket plan copies from params, but
// the layouts (bucket_rows checks them with the run checks, check_run_cache / _summary).
bool same_step(const DecodeParams& a, const DecodeParams& b) {
  const SelectConfig &x = a.select, &y = b.select;
  return a.num_q_heads == b.num_q_heads && a.max_batch == b.max_batch && a.scale == b.scale &&
         x.budget_tokens == y.budget_tokens && x.sink_pages == y.sink_pages &&
         x.recent_pages == y.recent_pages && x.tau == y.tau && x.floor_pages == y.floor_pages &&
         x.dense_below == y.dense_below && a.score_chunk_pages == b.score_chunk_pages &&
         a.select_chunk_pages == b.select_chunk_pages && a.select_cluster == b.select_cluster &&
         a.attn_pages_per_split == b.attn_pages_per_split && !a.two_level && !b.two_level;
}

// A stream of this call's own, capturing into a body graph; ended and destroyed on every path.
class BodyCapture {
 public:
  BodyCapture() { LOCKS_CUDA_CHECK(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking)); }
  ~BodyCapture() {
    end();
    cudaStreamDestroy(s_);
  }
  BodyCapture(const BodyCapture&) = delete;
  BodyCapture& operator=(const BodyCapture&) = delete;
  cudaStream_t begin(cudaGraph_t body) {
    // Relaxed: the body's capture must not be refused by the caller's (global) capture mode.
    LOCKS_CUDA_CHECK(
        cudaStreamBeginCaptureToGraph(s_, body, nullptr, nullptr, 0, cudaStreamCaptureModeRelaxed));
    capturing_ = true;
    return s_;
  }
  void end() {
    if (!capturing_) return;
    capturing_ = false;
    cudaGraph_t g = nullptr;  // the body graph itself, owned by the conditional node
    LOCKS_CUDA_CHECK(cudaStreamEndCapture(s_, &g));
  }

 private:
  cudaStream_t s_ = nullptr;
  bool capturing_ = false;
};

}  // namespace

LengthBuckets plan_length_buckets(const DecodeParams& params, int max_buckets, int min_pages) {
  LOCKS_REQUIRE(max_buckets >= 1 && max_buckets <= kMaxLengthBuckets, "max_buckets must be in [1, ",
                kMaxLengthBuckets, "], got ", max_buckets);
  LOCKS_REQUIRE(min_pages >= 1, "min_pages must be >= 1, got ", min_pages);
  LOCKS_SUPPORTED(!params.two_level,
                  "plan_length_buckets: the two-level step has no length buckets");
  const DecodePlan full = plan_decode(params);
  const int M = params.max_blocks_per_seq, P = params.cache.page_size;
  // Smaller plans, largest first.
  DecodePlan smaller[kMaxLengthBuckets];
  int n = 0;
  int prev = M;
  for (int k = 1; k < max_buckets; ++k) {
    const int m = detail::bucket_pages(M, k + 1, 0);  // ceil(M / 2^k)
    if (m < min_pages || m == prev) break;
    if (rules::select_capacity(params.select.budget_tokens, P, m, params.select.dense_below) !=
        full.capacity)
      break;
    DecodeParams pk = params;
    pk.max_blocks_per_seq = m;
    try {
      smaller[n] = plan_decode(pk);
    } catch (const InvalidArgument&) {  // a forced knob that does not plan for m pages
      break;
    }
    ++n, prev = m;
  }
  LengthBuckets b;
  b.count = n + 1;
  for (int i = 0; i < n; ++i) b.plans[i] = smaller[n - 1 - i];
  b.plans[n] = full;
  for (int i = 0; i < b.count; ++i)
    b.workspace_bytes = std::max(b.workspace_bytes, b.plans[i].workspace_bytes);
  return b;
}

namespace {

// Every bucket's plan checked against the last's, each bucket's batch (rows of at most its
// plan's pages), and the longest row a bucket holds, for the choice kernel.
void bucket_rows(const LengthBuckets& buckets, const BatchView& batch, int page_size,
                 BatchView (&rows)[kMaxLengthBuckets], BucketTokens& bt, const char* where) {
  const int n = buckets.count;
  if (n < 1 || n > kMaxLengthBuckets)
    locks::detail::fail(where, "buckets.count ", n, " outside [1, ", kMaxLengthBuckets, "]");
  const DecodePlan& full = buckets.plans[n - 1];
  bt.count = n;
  for (int i = 0; i < n; ++i) {
    const DecodePlan& p = buckets.plans[i];
    locks::detail::check_run_cache(full, p.params.cache, where);
    locks::detail::check_run_summary(full, p.params.summary, where);
    if (!same_step(p.params, full.params) || p.capacity != full.capacity)
      locks::detail::fail(where, "bucket ", i, " plans another step than the last bucket's");
    if (i > 0 && p.params.max_blocks_per_seq <= buckets.plans[i - 1].params.max_blocks_per_seq)
      locks::detail::fail(where, "bucket ", i, "'s max_blocks_per_seq ",
                          p.params.max_blocks_per_seq, " does not exceed bucket ", i - 1, "'s");
    if (buckets.workspace_bytes < p.workspace_bytes)
      locks::detail::fail(where, "buckets.workspace_bytes ", buckets.workspace_bytes,
                          " is below bucket ", i, "'s ", p.workspace_bytes);
    rows[i] = batch;
    rows[i].max_blocks_per_seq = std::min(batch.max_blocks_per_seq, p.params.max_blocks_per_seq);
    bt.tokens[i] = int64_t(rows[i].max_blocks_per_seq) * page_size;
  }
}

// run(i, rows, stream): bucket i's launches. Under capture: the choice kernel and a SWITCH node
// whose body i is run(i, ...) captured on a stream of this call's own; otherwise the last.
template <class Run>
void record_buckets(const LengthBuckets& buckets, const BatchView& batch, int page_size,
                    const BatchView (&rows)[kMaxLengthBuckets], const BucketTokens& bt,
                    cudaStream_t stream, Run run) {
  const int n = buckets.count;
  cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
  LOCKS_CUDA_CHECK(cudaStreamIsCapturing(stream, &cs));
  if (n == 1 || cs != cudaStreamCaptureStatusActive) {
    run(n - 1, rows[n - 1], stream);
    return;
  }
  cudaGraph_t graph = nullptr;
  const cudaGraphNode_t* deps = nullptr;
  const cudaGraphEdgeData* edges = nullptr;
  size_t n_deps = 0;
  LOCKS_CUDA_CHECK(
      cudaStreamGetCaptureInfo(stream, &cs, nullptr, &graph, nullptr, nullptr, nullptr));
  // A replay that skipped the choice would run the full plan (correct for any lengths).
  cudaGraphConditionalHandle handle;
  LOCKS_CUDA_CHECK(cudaGraphConditionalHandleCreate(&handle, graph, unsigned(n - 1),
                                                    cudaGraphCondAssignDefault));
  choose_bucket_kernel<<<1, kChooseThreads, 0, stream>>>(handle, batch.seq_lens, batch.batch_size,
                                                         batch.max_blocks_per_seq, page_size, bt);
  LOCKS_CUDA_CHECK(cudaGetLastError());
  LOCKS_CUDA_CHECK(cudaStreamGetCaptureInfo(stream, &cs, nullptr, &graph, &deps, &edges, &n_deps));
  cudaGraphNodeParams np{};
  np.type = cudaGraphNodeTypeConditional;
  np.conditional.handle = handle;
  np.conditional.type = cudaGraphCondTypeSwitch;
  np.conditional.size = unsigned(n);
  cudaGraphNode_t node = nullptr;
  LOCKS_CUDA_CHECK(cudaGraphAddNode(&node, graph, deps, edges, n_deps, &np));
  {
    BodyCapture body;
    for (int i = 0; i < n; ++i) {
      run(i, rows[i], body.begin(np.conditional.phGraph_out[i]));
      body.end();
    }
  }
  LOCKS_CUDA_CHECK(cudaStreamUpdateCaptureDependencies(stream, &node, nullptr, 1,
                                                       cudaStreamSetCaptureDependencies));
}

// A bucketed op: check(plan, rows) for every bucket before anything is recorded or launched, then
// run(plan, rows, stream) under record_buckets.
template <class Check, class Run>
void bucketed(const LengthBuckets& buckets, const BatchView& batch, int page_size,
              cudaStream_t stream, const char* where, Check check, Run run) {
  BatchView rows[kMaxLengthBuckets];
  BucketTokens bt{};
  bucket_rows(buckets, batch, page_size, rows, bt, where);
  for (int i = 0; i < buckets.count; ++i) check(buckets.plans[i], rows[i]);
  record_buckets(buckets, batch, page_size, rows, bt, stream,
                 [&](int i, const BatchView& b, cudaStream_t st) { run(buckets.plans[i], b, st); });
}

}  // namespace

void decode_bucketed(const LengthBuckets& buckets, Workspace ws, const KvCacheView& cache,
                     const SummaryView& summaries, const BatchView& batch, const QueryView& q,
                     const AttentionOutput& out, const Selection* selection_out,
                     cudaStream_t stream) {
  const char* where = "cuda::decode_bucketed";
  bucketed(
      buckets, batch, cache.layout.page_size, stream, where,
      [&](const DecodePlan& p, const BatchView& b) {
        detail::check_decode(p, ws, cache, summaries, b, q, out, selection_out, where);
      },
      [&](const DecodePlan& p, const BatchView& b, cudaStream_t st) {
        decode(p, ws, cache, summaries, b, q, out, selection_out, st);
      });
}

void score_select_bucketed(const LengthBuckets& buckets, Workspace ws, const SummaryView& summaries,
                           const BatchView& batch, const QueryView& q, const Selection& out,
                           cudaStream_t stream) {
  const char* where = "cuda::score_select_bucketed";
  bucketed(
      buckets, batch, summaries.layout.page_size, stream, where,
      [&](const DecodePlan& p, const BatchView& b) {
        detail::check_score_select(p, ws, summaries, b, q, out, where);
      },
      [&](const DecodePlan& p, const BatchView& b, cudaStream_t st) {
        score_select(p, ws, summaries, b, q, out, st);
      });
}

}  // namespace locks::cuda
