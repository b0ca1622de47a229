// locks_bench_cuda: the LOCKS decode step vs our dense (FullKV) kernel on one GPU.
// For each model shape, context and batch: median time per step (CUDA-graph replays, L2
// flushed before each), bytes read, the ratios, the step against its byte floor (summaries
// + selected pages at the read ceiling measured here), each stage's time and bandwidth, and
// the summary build (incremental per step, bulk). Rows that cannot run (device memory) print
// why.
// Usage: locks_bench_cuda [csv_path] [--quick] [--only MODEL_PREFIX CONTEXT BATCH]
//                         [--score-chunk 32|64|96|128] [--select-chunk 2048|4096] [--tau T]
//                         [--select-cluster -1|1|2|4|8|16] [--attn-pps 4|8|...|512]
//                         [--ceiling TB_PER_S] [--pipeline K | --pipeline B1,B2,...]
//                         [--tokens-per-seq T] [--row-tokens N] [--buckets K]
//   An unknown option, a missing or malformed value, or a CSV path that cannot be written: exit
//   2 with the reason, before any device call (bench_args.h).
//   --ceiling: the read ceiling the floor% and bandwidth columns divide by (default: measured
//   here, 8 GiB of streaming loads, ~0.2 s; every row, --only included).
//   --only runs one row, any context (tokens; the last page may be partial) and batch (the
//   first model whose name starts with
//   MODEL_PREFIX: "Llama" is Llama-3.1-8B, "Llama-3.1-70B" the TP-8 shard). The knobs force
//   a plan choice (DecodeParams); --attn-pps: selected pages per sparse attention block.
//   --pipeline K (flat rows): also the step over K equal sub-batches (or sub-batches of the
//   listed sizes, summing to the batch), each one's selection and attention beside the next
//   one's scoring (two streams in one graph; equal priorities, then the second stream first),
//   against the plain step before and after it in the same run.
//       locks_bench_cuda [csv_path] --two-level [--S 32] [--alpha 40] [--group-cluster 0|1|2|4|8]
//                        [--flat-below GROUPS] [--only M CONTEXT BATCH]
//   --two-level: the two-level (super-page) step (decode_two_level) against flat LOCKS and
//   dense in the same run, per stage, at budgets 512 and 2048 (rows: Llama-3.1-8B 1M b1,
//   GLM-4-9B 1M b1, Llama-3.1-8B 128K b8). The super summaries are built on the device from
//   the row's random K (cuda::super_build, timed: every group, and one group a sequence), as
//   the page summaries are. --flat-below: TwoLevelConfig::flat_below_groups (rows with fewer
//   complete groups score every page inside the two-level kernels; the level-2 list grows to
//   hold them).
//   --row-tokens N (flat rows named with --only, N <= CONTEXT): every row holds N tokens while the
//   cache, block table and plan are sized for CONTEXT, as in a vLLM engine whose max_model_len is
//   CONTEXT serving shorter requests (the plan's max_blocks_per_seq comes from max_model_len).
//   dense_ms is the dense kernel over the same N-token rows, and score_ms the step's scorer
//   (score + aggregate + select less the latter two: score_pages alone writes whole rows). The
//   CSV's row_tokens column holds N (CONTEXT without the option).
//   --buckets K (flat rows, one row a sequence): also the step over K length buckets
//   (locks/cuda/length_buckets.h: plans for the row's max_blocks_per_seq M, M / 2, ..., and a
//   SWITCH node that runs the smallest holding the batch's longest row), captured and timed
//   beside the plain step before and after it, and its output compared with the plain step's
//   bit for bit. With --row-tokens it shows what the buckets save rows shorter than the plan.
//   --tokens-per-seq T (flat rows): speculative-decoding verification steps. The BATCH rows are
//   BATCH / T sequences x T tokens: the T rows of a sequence share its block table and end at
//   context - T + 1 ... context (each token attends causally, as the vLLM plugin runs them), so
//   they read the same summaries and pages. dense_ms is the dense kernel over the same rows
//   (each sequence's cache read T times, less what L2 shares); the extra line times it over
//   one row a sequence (each cache read once, as a verification kernel with T queries reads
//   it) and compares LOCKS with that; where G T <= 32 a third line times the vLLM plugin's
//   spec_selection "request" (one selection a sequence from its T queries, handed to its rows by
//   cuda::request_rows, as the plugin runs it).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench_args.h"
#include "bench_timing.cuh"
#include "locks/contract.h"
#include "locks/cuda/decoder.h"
#include "locks/cuda/length_buckets.h"
#include "locks/cuda/summary_builder.h"
#include "sub_batch_step.h"

using namespace locks;
using bench::flush_l2;
using bench::g_flush;
using bench::kFlushBytes;
using bench::median_ms;
using bench::read_kernel;

namespace {

__global__ void fill_bf16(uint16_t* p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    uint32_t x = uint32_t(i) * 2654435761u ^ seed ^ uint32_t(i >> 32) * 40503u;
    x ^= x >> 15, x *= 2246822519u, x ^= x >> 13;
    const float f = (float(x & 0xffffu) / 65535.0f - 0.5f) * 3.0f;
    p[i] = uint16_t(__float_as_uint(f) >> 16);
  }
}
__global__ void fill_f32(float* p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    uint32_t x = uint32_t(i) * 2654435761u ^ seed;
    x ^= x >> 15, x *= 2246822519u, x ^= x >> 13;
    p[i] = (float(x & 0xffffu) / 65535.0f - 0.5f) * 2.0f;
  }
}
struct Graph {
  cudaGraphExec_t exec = nullptr;
  template <typename F>
  Graph(F fn, cudaStream_t st, unsigned long long flags = 0) {
    cudaGraph_t g;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    fn();
    CK(cudaStreamEndCapture(st, &g));
    CK(cudaGraphInstantiate(&exec, g, flags));
    CK(cudaGraphDestroy(g));
  }
  ~Graph() { cudaGraphExecDestroy(exec); }
  void launch(cudaStream_t st) { CK(cudaGraphLaunch(exec, st)); }
};

double measure_read_ceiling(cudaStream_t st) {
  const size_t bytes = size_t(8) << 30;
  void* p;
  unsigned* sink;
  CK(cudaMalloc(&p, bytes));
  CK(cudaMalloc(&sink, 4));
  CK(cudaMemset(p, 1, bytes));
  int sms;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  double best = 0;
  for (int blocks_per_sm : {4, 8, 16}) {
    const double ms = median_ms(
        [&] {
          read_kernel<<<sms * blocks_per_sm, 512, 0, st>>>((const uint4*)p, bytes / 16, sink);
        },
        st, 5);
    best = std::max(best, bytes / (ms * 1e-3) / 1e12);
  }
  const double copy_ms = median_ms(
      [&] {
        CK(cudaMemcpyAsync((char*)p + bytes / 2, p, bytes / 2, cudaMemcpyDeviceToDevice, st));
      },
      st, 5);
  std::printf(
      "read ceiling (16-byte streaming loads, 8 GiB): %.2f TB/s; device copy %.2f TB/s "
      "(read+write)\n",
      best, double(bytes) / (copy_ms * 1e-3) / 1e12);
  CK(cudaFree(p));
  CK(cudaFree(sink));
  return best;
}

struct Model {
  const char* name;
  int hq, hkv, d;
};

// The shapes people serve (#14): one layer each; Gemma-3's global (full-attention) layers.
const Model kModels[] = {{"Llama-3.1-8B", 32, 8, 128},    {"GLM-4-9B", 32, 2, 128},
                         {"Qwen2.5-7B", 28, 4, 128},      {"Llama-3.1-70B-TP8", 8, 1, 128},
                         {"SmolLM2-135M", 9, 3, 64},      {"Gemma-3-270M-global", 4, 1, 256},
                         {"Gemma-3-4B-global", 8, 4, 256}};

// The first model whose name starts with `prefix` (--only's MODEL_PREFIX), or null.
const Model* find_model(const std::string& prefix) {
  for (const Model& m : kModels)
    if (std::string(m.name).rfind(prefix, 0) == 0) return &m;
  return nullptr;
}

using bench::Opts;

constexpr int kP = 16, kRank = 8, kBudget = 2048;

// Repetitions by the size of the row (the whole grid runs in one device call).
int reps_for(double dense_bytes, bool quick) {
  if (dense_bytes > 16e9) return 3;
  if (dense_bytes > 4e9) return 5;
  return quick ? 7 : 11;
}

// One row's data on the device: K/V (random bf16), a block table with the sequences
// interleaved over the pool (block j of sequence b is j*B+b), every length ctx (the last page
// partial unless ctx is a multiple of 16; with T tokens a sequence, the B rows are B / T
// sequences whose T rows share its table and end at ctx - T + 1 ... ctx), block ids, the
// quant summaries of every page (built on the GPU, bulk), a query and an output. Both the
// flat and the two-level rows run on it; freed with the row.
struct RowData {
  int64_t pages, blocks;
  size_t kv_bytes, nb;
  CacheLayout L;
  SummaryLayout sl;
  cudaStream_t st{};
  void *k = nullptr, *v = nullptr;
  int32_t *dbt = nullptr, *dlens = nullptr, *dids = nullptr;
  std::vector<int32_t> lens;
  SummaryView s;
  float *q = nullptr, *out = nullptr;
  BatchView batch{};
  KvCacheView cache{};

  RowData(const Model& m, int64_t ctx, int B, int T = 1)
      : pages((ctx + kP - 1) / kP),
        blocks(pages * (B / T)),
        kv_bytes(size_t(blocks) * kP * m.hkv * m.d * 2),
        nb(size_t(blocks) * m.hkv),
        L{blocks, kP, m.hkv, m.d, DType::bf16},
        sl(summary_layout_for(L, kRank, Precision::quant)),
        lens(size_t(B), int32_t(ctx)) {
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    CK(cudaMalloc(&k, kv_bytes));
    CK(cudaMalloc(&v, kv_bytes));
    fill_bf16<<<4096, 256, 0, st>>>((uint16_t*)k, kv_bytes / 2, 1);
    fill_bf16<<<4096, 256, 0, st>>>((uint16_t*)v, kv_bytes / 2, 2);
    std::vector<int32_t> bt(size_t(B) * pages);
    std::vector<int32_t> ids(static_cast<size_t>(blocks));
    const int S = B / T;  // sequences
    for (int b = 0; b < B; ++b) {
      for (int64_t j = 0; j < pages; ++j) bt[size_t(b * pages + j)] = int32_t(j * S + b / T);
      lens[size_t(b)] = int32_t(ctx - (T - 1 - b % T));
    }
    for (int64_t i = 0; i < blocks; ++i) ids[size_t(i)] = int32_t(i);
    CK(cudaMalloc(&dbt, bt.size() * 4));
    CK(cudaMalloc(&dlens, lens.size() * 4));
    CK(cudaMalloc(&dids, ids.size() * 4));
    CK(cudaMemcpy(dbt, bt.data(), bt.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dlens, lens.data(), lens.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dids, ids.data(), ids.size() * 4, cudaMemcpyHostToDevice));
    batch = BatchView{dbt, pages, dlens, B, int(pages)};
    cache = KvCacheView{k, v, L};
    s.layout = sl;
    CK(cudaMalloc(&s.mu_q, nb * m.d));
    CK(cudaMalloc(&s.mu_scale, nb * 4));
    CK(cudaMalloc(&s.basis_q, nb * kRank * m.d / 2));
    CK(cudaMalloc(&s.basis_scale, nb * basis_scales_per_head(sl) * 4));  // [nb, r, d / g]
    CK(cudaMalloc(&s.coeff_q, nb * kP * kRank));
    CK(cudaMalloc(&s.coeff_scale, nb * kRank * 4));
    CK(cudaMalloc(&q, size_t(B) * m.hq * m.d * 4));
    CK(cudaMalloc(&out, size_t(B) * m.hq * m.d * 4));
    fill_f32<<<256, 256, 0, st>>>(q, size_t(B) * m.hq * m.d, 3);
  }
  // Summaries of every page from K, with `builder` (the caller keeps it for the
  // incremental build) or a throw-away one.
  void build_summaries(cuda::SummaryBuilder& builder) {
    builder.build(cache, dids, blocks, s, st);
    CK(cudaStreamSynchronize(st));
  }
  void build_summaries() {
    cuda::SummaryBuilder builder(L, sl, cuda::Solver::warp_jacobi, blocks);
    build_summaries(builder);
  }
  ~RowData() {
    for (void* p : {k, v, (void*)dbt, (void*)dlens, (void*)dids, (void*)s.mu_q, (void*)s.mu_scale,
                    (void*)s.basis_q, (void*)s.basis_scale, (void*)s.coeff_q, (void*)s.coeff_scale,
                    (void*)q, (void*)out})
      CK(cudaFree(p));
    CK(cudaStreamDestroy(st));
  }
  RowData(const RowData&) = delete;
  RowData& operator=(const RowData&) = delete;
};

// Why a row cannot run here ("" if it can): its shape (the int32 lengths and block ids the
// kernels take, the plan's batch limit) or device memory (K + V + summaries + workspace, with
// 1 GiB to spare). Every row the bench is asked for either runs or prints this reason.
std::string row_problem(const Model& m, int64_t ctx, int B, int T = 1) {
  if (ctx < 1) return "context below one token";
  if (ctx > INT32_MAX - kP) return "context above 2^31 - 17 tokens (int32 lengths)";
  if (B < 1 || B > 65535) return "batch outside [1, 65535] (the plan's max_batch)";
  if (T < 1 || B % T != 0)
    return "--tokens-per-seq must divide the batch (rows = sequences x tokens)";
  if (ctx < T) return "context below --tokens-per-seq";
  const int64_t pages = (ctx + kP - 1) / kP, blocks = pages * (B / T);
  if (blocks * m.hkv >= (int64_t(1) << 31)) return "blocks x KV heads >= 2^31";
  const double gib = double(1 << 30);
  const size_t kv_bytes = size_t(blocks) * kP * m.hkv * m.d * 2;  // one of K or V (bf16)
  const CacheLayout L{blocks, kP, m.hkv, m.d, DType::bf16};
  const size_t summ = size_t(blocks) * m.hkv *
                      summary_bytes_per_page(summary_layout_for(L, kRank, Precision::quant));
  // Decoder workspace (scores, partials, candidates) and the index arrays, roughly.
  const size_t ws = size_t(B) * pages * 4 * (2 * size_t(m.hq) + 2 * m.hkv) + size_t(blocks) * 12 +
                    (size_t(64) << 20);
  const size_t need = 2 * kv_bytes + summ + ws;
  size_t free_b = 0, total_b = 0;
  CK(cudaMemGetInfo(&free_b, &total_b));
  if (need + (size_t(1) << 30) <= free_b) return "";
  char why[256];
  std::snprintf(why, sizeof why,
                "needs %.1f GiB (K+V %.1f, summaries %.1f, workspace %.1f) of %.1f GiB free "
                "(%.1f GiB device)",
                need / gib, 2 * kv_bytes / gib, summ / gib, ws / gib, free_b / gib, total_b / gib);
  return why;
}

void print_skip(const Model& m, int64_t ctx, int B, const std::string& why, const Opts& o) {
  std::printf("%-19s %8lld %5d | skipped: %s\n", m.name, (long long)ctx, B, why.c_str());
  if (o.csv)
    std::fprintf(o.csv, "%s,%lld,%d,skipped: %s\n", m.name, (long long)ctx, B, why.c_str());
  std::fflush(stdout);
}

// --pipeline's sub-batch sizes for a batch of B: "K" (K equal parts, K dividing B) or a comma
// list of positive sizes summing to B; empty when it is neither.
std::vector<int> pipeline_sizes(const std::string& arg, int B) {
  std::vector<int> v;
  size_t pos = 0;
  while (pos <= arg.size()) {
    const size_t end = std::min(arg.find(',', pos), arg.size());
    const std::string part = arg.substr(pos, end - pos);
    if (part.empty() || part.size() > 6 ||
        part.find_first_not_of("0123456789") != std::string::npos)
      return {};
    v.push_back(std::atoi(part.c_str()));
    pos = end + 1;
  }
  if (v.size() == 1) {
    const int K = v[0];
    if (K < 2 || B % K != 0) return {};
    return std::vector<int>(size_t(K), B / K);
  }
  int64_t sum = 0;
  for (int x : v) {
    if (x < 1) return {};
    sum += x;
  }
  return sum == B ? v : std::vector<int>{};
}

// The step over sub-batches of the given sizes (--pipeline; sub_batch_step.h), timed: `prio`
// puts the second stream (selection + attention) at the device's highest priority, kept in the
// graph (node priorities), so its blocks are placed first as scoring blocks retire. The median
// step time (one graph, L2 flushed) and the largest |difference| from `ref` (the plain step's
// output).
struct PipelineTime {
  double ms = 0, max_diff = 0;
};
PipelineTime time_pipelined(const RowData& D, const cuda::Plan& plan, int hq,
                            const std::vector<int>& sizes, bool prio, int reps,
                            const std::vector<float>& ref) {
  cuda_bench::SubBatchStep step(plan, sizes);
  int least = 0, greatest = 0;
  CK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  cudaStream_t lo, hi;
  CK(cudaStreamCreateWithPriority(&lo, cudaStreamNonBlocking, least));
  CK(cudaStreamCreateWithPriority(&hi, cudaStreamNonBlocking, prio ? greatest : least));
  const cudaStream_t st = D.st;
  Graph g([&] { step.run(D.cache, D.s, D.batch, D.q, hq, D.out, st, lo, hi); }, st,
          prio ? cudaGraphInstantiateFlagUseNodePriority : 0);
  PipelineTime t;
  t.ms = median_ms([&] { g.launch(st); }, st, reps);
  std::vector<float> got(ref.size());
  CK(cudaMemcpy(got.data(), D.out, got.size() * 4, cudaMemcpyDeviceToHost));
  for (size_t i = 0; i < got.size(); ++i)
    t.max_diff = std::max(t.max_diff, double(std::fabs(got[i] - ref[i])));
  CK(cudaStreamDestroy(lo));
  CK(cudaStreamDestroy(hi));
  return t;
}

// Pieces of the bucketed step's mechanism, for its cost breakdown (time_buckets): a one-block
// kernel that reads a length (as the bucket choice does), and one that also sets a graph
// conditional from it (always 0: the one body of a SWITCH of size 1).
__global__ void read_len_kernel(const int32_t* lens, int32_t* sink) {
  if (threadIdx.x == 0 && lens[0] == -12345) *sink = 1;
}
__global__ void set_zero_kernel(cudaGraphConditionalHandle h, const int32_t* lens) {
  if (threadIdx.x == 0) cudaGraphSetConditional(h, lens[0] == -12345 ? 1u : 0u);
}

// Captures body() as the only body of a SWITCH node on the graph being captured on st, after
// set_zero_kernel when `set`, else with the node's default value 0.
template <class Body>
void capture_switch(cudaStream_t st, const int32_t* lens, bool set, Body body) {
  cudaStreamCaptureStatus cs;
  cudaGraph_t graph;
  CK(cudaStreamGetCaptureInfo(st, &cs, nullptr, &graph, nullptr, nullptr, nullptr));
  cudaGraphConditionalHandle h;
  CK(cudaGraphConditionalHandleCreate(&h, graph, 0u, cudaGraphCondAssignDefault));
  if (set) set_zero_kernel<<<1, 32, 0, st>>>(h, lens);
  const cudaGraphNode_t* deps;
  const cudaGraphEdgeData* edges;
  size_t n = 0;
  CK(cudaStreamGetCaptureInfo(st, &cs, nullptr, &graph, &deps, &edges, &n));
  cudaGraphNodeParams np{};
  np.type = cudaGraphNodeTypeConditional;
  np.conditional.handle = h;
  np.conditional.type = cudaGraphCondTypeSwitch;
  np.conditional.size = 1;
  cudaGraphNode_t node;
  CK(cudaGraphAddNode(&node, graph, deps, edges, n, &np));
  cudaStream_t side;
  CK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
  CK(cudaStreamBeginCaptureToGraph(side, np.conditional.phGraph_out[0], nullptr, nullptr, 0,
                                   cudaStreamCaptureModeRelaxed));
  body(side);
  cudaGraph_t g;
  CK(cudaStreamEndCapture(side, &g));
  CK(cudaStreamDestroy(side));
  CK(cudaStreamUpdateCaptureDependencies(st, &node, nullptr, 1, cudaStreamSetCaptureDependencies));
}

// The step over K length buckets (--buckets; locks/cuda/length_buckets.h), captured with
// decode_bucketed and timed beside the plain step's graph (before and after it); its output
// compared with the plain step's bit for bit.
void time_buckets(cuda::Decoder& dec, const RowData& D, const QueryView& qv,
                  const AttentionOutput& ao, int k, int reps, double t_dense, Graph& g_plain) {
  const cudaStream_t st = D.st;
  const cuda::LengthBuckets bk =
      cuda::plan_length_buckets(dec.decode_plan().params, std::min(k, cuda::kMaxLengthBuckets), 1);
  void* ws = nullptr;
  CK(cudaMalloc(&ws, bk.workspace_bytes));
  const size_t n = size_t(D.batch.batch_size) * qv.num_q_heads * D.L.head_dim;
  std::vector<float> ref(n), got(n);
  const double t_before = median_ms([&] { g_plain.launch(st); }, st, reps);
  CK(cudaStreamSynchronize(st));
  CK(cudaMemcpy(ref.data(), ao.out, n * 4, cudaMemcpyDeviceToHost));
  Graph g(
      [&] {
        cuda::decode_bucketed(bk, {ws, bk.workspace_bytes}, D.cache, D.s, D.batch, qv, ao, nullptr,
                              st);
      },
      st);
  const double t_b = median_ms([&] { g.launch(st); }, st, reps);
  CK(cudaStreamSynchronize(st));
  CK(cudaMemcpy(got.data(), ao.out, n * 4, cudaMemcpyDeviceToHost));
  const bool bucket_same = std::memcmp(ref.data(), got.data(), n * 4) == 0;
  // The vLLM plugin's form: the selection over the buckets (score_select_bucketed), then the
  // attention outside the SWITCH node (it does not depend on the plan's rows).
  const int cap = bk.plans[bk.count - 1].capacity;
  const size_t sel_n = size_t(D.batch.batch_size) * D.L.num_kv_heads;
  int32_t *pages = nullptr, *counts = nullptr;
  CK(cudaMalloc(&pages, sel_n * cap * 4));
  CK(cudaMalloc(&counts, sel_n * 4));
  const Selection sel{pages, counts, cap};
  Graph g_sel(
      [&] {
        cuda::score_select_bucketed(bk, {ws, bk.workspace_bytes}, D.s, D.batch, qv, sel, st);
        dec.attend(D.cache, D.batch, qv, &sel, ao, st);
      },
      st);
  const double t_sel = median_ms([&] { g_sel.launch(st); }, st, reps);
  CK(cudaStreamSynchronize(st));
  CK(cudaMemcpy(got.data(), ao.out, n * 4, cudaMemcpyDeviceToHost));
  const bool sel_same = std::memcmp(ref.data(), got.data(), n * 4) == 0;
  const double t_after = median_ms([&] { g_plain.launch(st); }, st, reps);
  std::string sizes;
  for (int i = 0; i < bk.count; ++i)
    sizes += (i ? "," : "") + std::to_string(bk.plans[i].params.max_blocks_per_seq);
  std::printf(
      "  length buckets (%d plans of %s pages a row): %.4f ms = %.2fx dense; the plain step "
      "%.4f / %.4f ms (before / after); output %s the plain step's\n",
      bk.count, sizes.c_str(), t_b, t_dense / t_b, t_before, t_after,
      bucket_same ? "bit for bit" : "DIFFERS FROM");
  std::printf(
      "  the plugin's form (score_select_bucketed, then the attention outside the node): %.4f ms; "
      "output %s the plain step's\n",
      t_sel, sel_same ? "bit for bit" : "DIFFERS FROM");
  CK(cudaFree(pages));
  CK(cudaFree(counts));
  // What the mechanism costs: the plain step after a one-block kernel; inside a SWITCH node of
  // one body (its default value); and inside one set by a kernel (the bucketed step's form
  // with one bucket).
  int32_t* sink = nullptr;
  CK(cudaMalloc(&sink, 4));
  auto plain = [&](cudaStream_t s2) { dec.run(D.cache, D.s, D.batch, qv, ao, s2); };
  Graph g_read(
      [&] {
        read_len_kernel<<<1, 32, 0, st>>>(D.batch.seq_lens, sink);
        plain(st);
      },
      st);
  Graph g_sw([&] { capture_switch(st, D.batch.seq_lens, false, plain); }, st);
  Graph g_set([&] { capture_switch(st, D.batch.seq_lens, true, plain); }, st);
  const double t_read = median_ms([&] { g_read.launch(st); }, st, reps);
  const double t_sw = median_ms([&] { g_sw.launch(st); }, st, reps);
  const double t_set = median_ms([&] { g_set.launch(st); }, st, reps);
  const double t_plain = median_ms([&] { g_plain.launch(st); }, st, reps);
  std::printf(
      "  the mechanism, the plain step %.4f ms: after a one-block kernel %.4f; as the one body of "
      "a SWITCH node %.4f; of a SWITCH set by a kernel %.4f\n",
      t_plain, t_read, t_sw, t_set);
  CK(cudaFree(sink));
  CK(cudaFree(ws));
}

void run_row(const Model& m, int64_t ctx, int B, const Opts& o) {
  const int T = o.tokens_per_seq;
  if (const std::string why = row_problem(m, ctx, B, T); !why.empty())
    return print_skip(m, ctx, B, why, o);
  RowData D(m, ctx, B, T);
  if (o.row_tokens > 0) {  // shorter rows in a plan for ctx (main checked T == 1, N <= ctx)
    for (int32_t& n : D.lens) n = int32_t(o.row_tokens);
    CK(cudaMemcpy(D.dlens, D.lens.data(), D.lens.size() * 4, cudaMemcpyHostToDevice));
  }
  const int64_t pages = D.pages, blocks = D.blocks;
  const size_t nb = D.nb, kv_bytes = D.kv_bytes;  // (page, KV head) pairs; one of K or V
  const CacheLayout& L = D.L;
  const SummaryLayout& sl = D.sl;
  // The summaries a step reads: every full page's (a partial last page has none); each row
  // reads its own (T rows of a sequence read its summaries T times).
  size_t full_pages = 0;
  for (int32_t n : D.lens) full_pages += size_t(n / kP);
  const size_t summ = full_pages * m.hkv * summary_bytes_per_page(sl);
  // The dense kernel: every row its whole cache (with --row-tokens, the rows' N tokens of it).
  const double dense_bytes =
      2.0 * kv_bytes * T * (o.row_tokens > 0 ? double(o.row_tokens) / double(ctx) : 1.0);
  const int reps = reps_for(dense_bytes, o.quick);
  cuda::SummaryBuilder builder(L, sl, cuda::Solver::warp_jacobi, blocks);
  D.build_summaries(builder);
  const cudaStream_t st = D.st;
  const KvCacheView& cache = D.cache;
  const BatchView& batch = D.batch;
  const SummaryView& s = D.s;
  cuda::Plan plan{L, m.hq, B, int(pages), DecodeConfig{SelectConfig{kBudget, 1, 2}, 0.0f}};
  plan.score_chunk_pages = o.score_chunk;
  plan.cfg.select.tau = o.tau;
  plan.select_chunk_pages = o.select_chunk;
  plan.select_cluster = o.select_cluster;
  plan.attn_pages_per_split = o.attn_pps;
  {
    cuda::Decoder dec(plan);
    const QueryView qv{D.q, m.hq};
    const AttentionOutput ao{D.out, nullptr};
    Graph g_locks([&] { dec.run(cache, s, batch, qv, ao, st); }, st);
    Graph g_dense([&] { dec.run_dense(cache, batch, qv, ao, st); }, st);
    const double t_locks = median_ms([&] { g_locks.launch(st); }, st, reps);
    const double t_dense = median_ms([&] { g_dense.launch(st); }, st, reps);
    if (!o.pipeline.empty()) {
      const std::vector<int> sizes = pipeline_sizes(o.pipeline, B);
      if (sizes.empty() || T != 1) {
        std::printf(
            "  pipeline: --pipeline %s takes K dividing the batch %d or sizes summing to "
            "it (one row a sequence)\n",
            o.pipeline.c_str(), B);
      } else {
        g_locks.launch(st);             // the plain step's output, the pipelines' reference
        CK(cudaStreamSynchronize(st));  // (st does not synchronise with the copy's stream)
        std::vector<float> ref(size_t(B) * m.hq * m.d);
        CK(cudaMemcpy(ref.data(), D.out, ref.size() * 4, cudaMemcpyDeviceToHost));
        for (bool prio : {false, true}) {
          const PipelineTime tp = time_pipelined(D, plan, m.hq, sizes, prio, reps, ref);
          const double t_again = median_ms([&] { g_locks.launch(st); }, st, reps);
          std::printf(
              "  pipeline of sub-batches %s (%s): %.4f ms = %.2fx dense; the step %.4f / %.4f ms "
              "(before / after); max |out - step's| %.3g\n",
              o.pipeline.c_str(),
              prio ? "selection + attention at high priority" : "equal priorities", tp.ms,
              t_dense / tp.ms, t_locks, t_again, tp.max_diff);
        }
      }
    }
    if (o.buckets > 0) time_buckets(dec, D, qv, ao, o.buckets, reps, t_dense, g_locks);
    // Verification steps (T tokens a sequence): the dense kernel over one row a sequence at
    // its full length, i.e. each cache read once (what FlashAttention with T queries reads).
    // The same one row a sequence (its last token's table, full length) serves the request
    // selection below.
    double t_dense_once = 0;
    int32_t* dlens_once = nullptr;
    BatchView once{};
    if (T > 1) {
      const int S = B / T;
      CK(cudaMalloc(&dlens_once, size_t(S) * 4));
      const std::vector<int32_t> once_lens(static_cast<size_t>(S), static_cast<int32_t>(ctx));
      CK(cudaMemcpy(dlens_once, once_lens.data(), size_t(S) * 4, cudaMemcpyHostToDevice));
      once = BatchView{D.dbt + (T - 1) * pages, int64_t(T) * pages, dlens_once, S, int(pages)};
      Graph g_once([&] { dec.run_dense(cache, once, qv, ao, st); }, st);
      t_dense_once = median_ms([&] { g_once.launch(st); }, st, reps);
    }
    // With a selection cluster the step aggregates and selects in one launch: its time is
    // sel_ms and agg_ms is 0.
    const int cluster = dec.select_cluster();
    const double t_agg = cluster ? 0.0 : median_ms([&] { dec.aggregate(batch, st); }, st, reps);
    const double t_sel = cluster ? median_ms([&] { dec.aggregate_select(batch, st); }, st, reps)
                                 : median_ms([&] { dec.select(batch, st); }, st, reps);
    // Rows shorter than the plan (--row-tokens): score() writes each row whole (-inf past its
    // full pages), which the step's scorer skips, so there the scoring stage is the step's
    // score + aggregate + select less the latter two timed alone.
    const double t_score =
        o.row_tokens > 0
            ? median_ms([&] { dec.score_select(s, batch, qv, st); }, st, reps) - t_agg - t_sel
            : median_ms([&] { dec.score(s, batch, qv, st); }, st, reps);
    const Selection sel = dec.selection();
    const double t_attn = median_ms([&] { dec.attend(cache, batch, qv, &sel, ao, st); }, st, reps);
    // Incremental summary build in the step's graph: every sequence completes a page;
    // amortised, a page completes once per 16 steps, and steps where none completes pay the
    // early-exit launch only.
    // (lengths set to the whole pages held, then one token short of them: the same pages)
    Graph g_build([&] { builder.build_filled(cache, batch, 1, s, st); }, st);
    std::vector<int32_t> lens_full(size_t(B), int32_t(pages * kP)), lens_odd(lens_full);
    for (int32_t& n : lens_odd) n -= 1;
    CK(cudaMemcpy(D.dlens, lens_full.data(), lens_full.size() * 4, cudaMemcpyHostToDevice));
    const double t_build_full = median_ms([&] { g_build.launch(st); }, st, reps);
    CK(cudaMemcpy(D.dlens, lens_odd.data(), lens_odd.size() * 4, cudaMemcpyHostToDevice));
    const double t_build_none = median_ms([&] { g_build.launch(st); }, st, reps);
    CK(cudaMemcpy(D.dlens, D.lens.data(), D.lens.size() * 4, cudaMemcpyHostToDevice));
    const double t_build_step = t_build_full / 16 + t_build_none * 15 / 16;

    // Bytes: dense reads all K+V; LOCKS must read the summaries, the selected pages
    // (budget 2048 tokens = 128 pages incl. tail/sink/recent) and the query.
    const double summ_bytes = double(summ);
    std::vector<int32_t> counts(size_t(B) * m.hkv);
    CK(cudaMemcpy(counts.data(), sel.counts, counts.size() * 4, cudaMemcpyDeviceToHost));
    double sel_pages = 0;
    for (int c : counts) sel_pages += c;
    const double sel_bytes = sel_pages * kP * m.d * 2 * 2;
    const double locks_bytes = summ_bytes + sel_bytes;
    const double floor_ms = locks_bytes / (o.ceiling * 1e12) * 1e3;
    const double dense_bw = dense_bytes / (t_dense * 1e-3) / 1e12;
    const double score_bw = summ_bytes / (t_score * 1e-3) / 1e12;
    const double attn_bw = sel_bytes / (t_attn * 1e-3) / 1e12;
    const double launch_gap = t_locks - (t_score + t_agg + t_sel + t_attn);
    const int score_chunk = dec.decode_plan().score_chunk_pages;
    std::printf(
        "%-19s %8lld %5d | %9.4f %9.4f %6.2f %6.2f %6.1f | %8.4f %7.4f %7.4f %7.4f %7.4f %7.4f | "
        "%6.1f %6.1f %6.1f %3d\n",
        m.name, (long long)ctx, B, t_dense, t_locks, t_dense / t_locks, dense_bytes / locks_bytes,
        100 * floor_ms / t_locks, t_score, t_agg, t_sel, t_attn, launch_gap, t_build_step,
        100 * dense_bw / o.ceiling, 100 * score_bw / o.ceiling, 100 * attn_bw / o.ceiling, cluster);
    if (o.row_tokens > 0)
      std::printf("  rows of %d tokens in a cache, block table and plan for %lld tokens\n",
                  o.row_tokens, (long long)ctx);
    if (T > 1)
      std::printf(
          "  verification step: %d sequences x %d tokens; the dense kernel over one row a "
          "sequence (each cache read once, %.2f GB): %.4f ms; LOCKS %.2fx time, %.2fx bytes "
          "against it\n",
          B / T, T, 2.0 * kv_bytes / 1e9, t_dense_once, t_dense_once / t_locks,
          2.0 * kv_bytes / locks_bytes);
    if (T > 1 && m.hq * T / m.hkv <= 32) {
      // spec_selection "request": score + select once a sequence from its T queries as G T
      // heads of one row (the bench's queries in token-major order: the same cost as the
      // plugin's head-major copy, other selections), the selection handed to the T token rows
      // (cuda::request_rows: each row's own last page), then the token rows' attention. The
      // sequence selects at its length, less one where that is a whole number of pages (the
      // plugin's rule: its last page is then partial, so always selected).
      const int S = B / T;
      int32_t* dlens_req = nullptr;
      CK(cudaMalloc(&dlens_req, size_t(S) * 4));
      const std::vector<int32_t> req_lens(size_t(S), int32_t(ctx % kP == 0 ? ctx - 1 : ctx));
      CK(cudaMemcpy(dlens_req, req_lens.data(), size_t(S) * 4, cudaMemcpyHostToDevice));
      const BatchView breq{once.block_table, once.block_table_stride, dlens_req, S, int(pages)};
      cuda::Plan preq{L, m.hq * T, S, int(pages), DecodeConfig{SelectConfig{kBudget, 1, 2}, 0.0f}};
      cuda::Decoder dreq(preq);
      const QueryView qreq{D.q, m.hq * T};
      const Selection sreq = dreq.selection(), srow = dec.selection();
      const RequestRows rows{dlens_req, batch.seq_lens, S, T};
      Graph g_req(
          [&] {
            dreq.score(s, breq, qreq, st);
            dreq.aggregate_select(breq, st);
            cuda::request_rows(rows, sreq, m.hkv, kP, srow, st);
            dec.attend(cache, batch, qv, &srow, ao, st);
          },
          st);
      const double t_req = median_ms([&] { g_req.launch(st); }, st, reps);
      std::printf(
          "  spec_selection 'request' (one selection a sequence, %d heads a row): %.4f ms; %.2fx "
          "the read-once dense, %.2fx the token rows' step\n",
          m.hq * T, t_req, t_dense_once / t_req, t_locks / t_req);
      CK(cudaFree(dlens_req));
    }
    if (dlens_once) CK(cudaFree(dlens_once));
    // Latency of one build_filled launch (the step's graph pays it whenever a page fills).
    // Amortised over 16 steps: sequences filling pages on the same step pay one full launch
    // per 16 steps; staggered ones (ragged serving) pay min(B, 16) of them.
    const double f = std::min(B, 16) / 16.0;
    const double t_build_stag = f * t_build_full + (1 - f) * t_build_none;
    std::printf(
        "  build_filled launch (%d x %d KV heads): %.1f us with a page completing, %.1f us with "
        "none; amortised %.2f%% of the step (aligned), %.2f%% (staggered); dense %.2f GB, LOCKS "
        "%.1f MB, floor %.4f ms; scoring blocks of %d pages; attention splits of %d pages\n",
        B, m.hkv, t_build_full * 1e3, t_build_none * 1e3, 100 * t_build_step / t_locks,
        100 * t_build_stag / t_locks, dense_bytes / 1e9, locks_bytes / 1e6, floor_ms, score_chunk,
        dec.decode_plan().sparse_pages_per_split);
    std::fflush(stdout);
    if (o.csv)
      std::fprintf(o.csv,
                   "%s,%lld,%d,%.5f,%.5f,%.3f,%.0f,%.0f,%.3f,%.5f,%.2f,%.3f,%.5f,%.3f,%.5f,%.5f,"
                   "%.5f,%.3f,%.5f,%.5f,%.4f,%.4f,%d,%d,%lld\n",
                   m.name, (long long)ctx, B, t_dense, t_locks, t_dense / t_locks, dense_bytes,
                   locks_bytes, dense_bytes / locks_bytes, floor_ms, 100 * floor_ms / t_locks,
                   dense_bw, t_score, score_bw, t_agg, t_sel, t_attn, attn_bw, launch_gap,
                   t_build_step, t_build_full, t_build_none, cluster, score_chunk,
                   (long long)(o.row_tokens > 0 ? o.row_tokens : ctx));

    // Bulk build after a 128K prefill (batch 1): both solvers, and cost per page.
    if (ctx == 131072 && B == 1) {
      SummaryView sw = s;
      const double t_jac = median_ms([&] { builder.build(cache, D.dids, blocks, sw, st); }, st, 3);
      cuda::SummaryBuilder cus(L, sl, cuda::Solver::cusolver, blocks);
      const double t_cus = median_ms([&] { cus.build(cache, D.dids, blocks, sw, st); }, st, 3);
      std::printf(
          "  bulk summary build after a 128K prefill (%lld pages x %d KV heads): warp Jacobi "
          "%.3f ms (%.1f ns per page-head), cuSOLVER syevjBatched %.3f ms\n",
          (long long)blocks, m.hkv, t_jac, t_jac * 1e6 / double(nb), t_cus);
    }
  }
}

// The two-level step vs flat LOCKS vs dense, one plan (params.two_level on: the flat and
// dense ops run from the same plan and workspace), CUDA graphs, L2 flushed before each.
void run_two_level_row(const Model& m, int64_t ctx, int B, int budget, const Opts& o) {
  if (const std::string why = row_problem(m, ctx, B); !why.empty())
    return print_skip(m, ctx, B, why, o);
  RowData D(m, ctx, B);
  D.build_summaries();
  const int64_t pages = D.pages;
  const size_t kv_bytes = D.kv_bytes;
  const cudaStream_t st = D.st;
  const KvCacheView& cache = D.cache;
  const BatchView& batch = D.batch;
  const SummaryView& s = D.s;
  // Super summaries of every complete group, built on the device from the row's K
  // (cuda::super_build; slot b * MG + j = group j of sequence b).
  const int S = o.group_pages, MG = int((pages + S - 1) / S);
  SuperLayout U;
  U.num_slots = int64_t(B) * MG;
  U.group_pages = S;
  U.page_size = kP;
  U.num_kv_heads = m.hkv;
  U.head_dim = m.d;
  U.rank = kRank;
  U.extent = true;
  const size_t gh = size_t(U.num_slots) * m.hkv;
  SuperView sv;
  sv.layout = U;
  std::vector<void*> sup_bufs;
  auto alloc = [&](auto*& p, size_t bytes) {
    CK(cudaMalloc((void**)&p, bytes));
    CK(cudaMemsetAsync(p, 0, bytes, st));
    sup_bufs.push_back((void*)p);
  };
  alloc(sv.mu_q, gh * m.d);
  alloc(sv.mu_scale, gh * 4);
  alloc(sv.basis_q, gh * kRank * m.d / 2);
  alloc(sv.basis_scale, gh * kRank * 4);
  alloc(sv.coord_q, gh * S * kRank);
  alloc(sv.coord_scale, gh * kRank * 4);
  alloc(sv.radius_q, gh * S);
  alloc(sv.radius_scale, gh * 4);
  alloc(sv.lo_q, gh * S * kRank);
  alloc(sv.hi_q, gh * S * kRank);
  alloc(sv.extent_scale, gh * kRank * 4);
  const int complete = int((ctx / kP) / S);
  std::vector<int32_t> gblocks, gslots;  // every complete group; then the last one a sequence
  for (int b = 0; b < B; ++b)
    for (int j = 0; j < complete; ++j) {
      gslots.push_back(b * MG + j);
      for (int pg = 0; pg < S; ++pg) gblocks.push_back(int32_t((int64_t(j) * S + pg) * B + b));
    }
  for (int b = 0; b < B && complete > 0; ++b) {
    gslots.push_back(b * MG + complete - 1);
    for (int pg = 0; pg < S; ++pg)
      gblocks.push_back(int32_t((int64_t(complete - 1) * S + pg) * B + b));
  }
  const int64_t n_all = int64_t(B) * complete, n_last = complete > 0 ? B : 0;
  int32_t *dgb = nullptr, *dgs = nullptr;
  CK(cudaMalloc(&dgb, std::max<size_t>(gblocks.size(), 1) * 4));
  CK(cudaMalloc(&dgs, std::max<size_t>(gslots.size(), 1) * 4));
  CK(cudaMemcpy(dgb, gblocks.data(), gblocks.size() * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dgs, gslots.data(), gslots.size() * 4, cudaMemcpyHostToDevice));
  const double t_sup_bulk =
      median_ms([&] { cuda::super_build(cache, dgb, dgs, n_all, sv, st); }, st, 3);
  const double t_sup_one = median_ms(
      [&] { cuda::super_build(cache, dgb + n_all * S, dgs + n_all, n_last, sv, st); }, st, 5);
  std::printf(
      "  super build (cuda::super_build, S %d, R %d, extent): all %lld groups x %d KV heads "
      "%.3f ms (%.1f us per group-head); one group a sequence (%lld x %d, the cost each %d "
      "tokens) %.1f us\n",
      S, kRank, (long long)n_all, m.hkv, t_sup_bulk,
      n_all ? t_sup_bulk * 1e3 / double(n_all * m.hkv) : 0.0, (long long)n_last, m.hkv, S * kP,
      t_sup_one * 1e3);
  CK(cudaFree(dgb));
  CK(cudaFree(dgs));
  std::vector<int32_t> tab(size_t(B) * MG);
  for (size_t i = 0; i < tab.size(); ++i) tab[i] = int32_t(i);
  int32_t* dtab;
  CK(cudaMalloc(&dtab, tab.size() * 4));
  CK(cudaMemcpy(dtab, tab.data(), tab.size() * 4, cudaMemcpyHostToDevice));
  const SuperTableView tv{dtab, MG, MG};

  DecodeParams p;
  p.cache = D.L;
  p.summary = D.sl;
  p.num_q_heads = m.hq;
  p.max_batch = B;
  p.max_blocks_per_seq = int(pages);
  p.select = SelectConfig{budget, 1, 2};
  p.two_level = true;
  p.two.alpha = o.alpha;
  if (o.flat_below >= 0) p.two.flat_below_groups = o.flat_below;
  p.super = U;
  p.score_chunk_pages = o.score_chunk;  // level 2 too (and the flat step)
  p.select_cluster = o.select_cluster;
  p.group_cluster = o.group_cluster;
  p.attn_pages_per_split = o.attn_pps;
  const DecodePlan plan = cuda::plan_decode(p);
  void* wsp;
  CK(cudaMalloc(&wsp, std::max<size_t>(plan.workspace_bytes, 256)));
  const Workspace ws{wsp, plan.workspace_bytes};
  const QueryView qv{D.q, m.hq};
  const AttentionOutput ao{D.out, nullptr};
  const int reps = reps_for(2.0 * kv_bytes, o.quick);
  double t_stage[6] = {0, 0, 0, 0, 0, 0};
  for (int k2 = 1; k2 <= 5; ++k2) {
    Graph g(
        [&] {
          cuda::decode_two_level_stages(plan, ws, cache, s, sv, tv, batch, qv, ao, nullptr, k2, st);
        },
        st);
    t_stage[k2] = median_ms([&] { g.launch(st); }, st, reps);
  }
  Graph g_two(
      [&] { cuda::decode_two_level(plan, ws, cache, s, sv, tv, batch, qv, ao, nullptr, st); }, st);
  Graph g_flat([&] { cuda::decode(plan, ws, cache, s, batch, qv, ao, nullptr, st); }, st);
  Graph g_dense([&] { cuda::decode_attention_dense(plan, ws, cache, batch, qv, ao, st); }, st);
  const double t_two = median_ms([&] { g_two.launch(st); }, st, reps);
  const double t_flat = median_ms([&] { g_flat.launch(st); }, st, reps);
  const double t_dense = median_ms([&] { g_dense.launch(st); }, st, reps);
  // The selection of the two-level step: its pages count must be the budget's.
  Graph g_sel(
      [&] { cuda::decode_two_level(plan, ws, cache, s, sv, tv, batch, qv, ao, nullptr, st); }, st);
  g_sel.launch(st);
  std::vector<int32_t> counts(size_t(B) * m.hkv);
  CK(cudaMemcpyAsync(counts.data(), (char*)wsp + plan.counts.offset, counts.size() * 4,
                     cudaMemcpyDeviceToHost, st));
  CK(cudaStreamSynchronize(st));
  double sel_pages = 0;
  for (int c : counts) sel_pages += c;
  const StepBytes sb = two_level_step_bytes(U, D.sl, p.two, p.select, ctx);
  std::printf(
      "%-13s %8lld %3d %5d | %8.4f %8.4f %8.4f | %6.2f %6.2f | %7.4f %7.4f %7.4f %7.4f %7.4f | "
      "%5d %4d %3d %6.1f %6.1f\n",
      m.name, (long long)ctx, B, budget, t_dense, t_flat, t_two, t_dense / t_flat, t_dense / t_two,
      t_stage[1], t_stage[2] - t_stage[1], t_stage[3] - t_stage[2], t_stage[4] - t_stage[3],
      t_stage[5] - t_stage[4], plan.list_cap, plan.l2_score_chunk_pages, plan.l2_select_cluster,
      sel_pages / (B * m.hkv), sb.dense / sb.total());
  std::fflush(stdout);
  if (o.csv)
    std::fprintf(o.csv, "%s,%lld,%d,%d,%.5f,%.5f,%.5f,%.5f,%.5f,%.5f,%.5f,%.5f,%d,%d,%.2f\n",
                 m.name, (long long)ctx, B, budget, t_dense, t_flat, t_two, t_stage[1],
                 t_stage[2] - t_stage[1], t_stage[3] - t_stage[2], t_stage[4] - t_stage[3],
                 t_stage[5] - t_stage[4], plan.list_cap, plan.l2_select_cluster,
                 sb.dense / sb.total());
  for (void* ptr : sup_bufs) CK(cudaFree(ptr));
  for (void* ptr : {(void*)dtab, wsp}) CK(cudaFree(ptr));
}

void run_two_level(const Opts& o) {
  std::printf(
      "\ntwo-level step (S %d, alpha %.0f, R %d extent, budget b; sink 1, recent 2; flat below %d "
      "groups)\n%-13s %8s "
      "%3s %5s | %8s %8s %8s | %6s %6s | %7s %7s %7s %7s %7s | %5s %4s %3s %6s %6s\n",
      o.group_pages, o.alpha, kRank,
      o.flat_below >= 0 ? o.flat_below : TwoLevelConfig{}.flat_below_groups, "model", "context",
      "B", "b", "dense", "flat", "two", "xflat", "xtwo", "lvl1", "choice", "lvl2", "aggsel", "attn",
      "list", "l2cp", "cl", "pages", "xbytes");
  if (o.csv)
    std::fprintf(o.csv,
                 "model,context,batch,budget,dense_ms,flat_ms,two_level_ms,level1_ms,choice_ms,"
                 "level2_ms,aggsel_ms,attn_ms,list_cap,l2_cluster,bytes_ratio\n");
  struct Row {
    const char* model;
    int64_t ctx;
    int batch;
  };
  std::vector<Row> rows = {
      {"Llama-3.1-8B", 1048576, 1}, {"GLM-4-9B", 1048576, 1}, {"Llama-3.1-8B", 131072, 8}};
  if (!o.only_model.empty()) rows = {{o.only_model.c_str(), o.only_ctx, o.only_batch}};
  for (const Row& r : rows)  // (--only names a model main() has checked)
    if (const Model* m = find_model(r.model))
      for (int budget : {512, 2048}) run_two_level_row(*m, r.ctx, r.batch, budget, o);
  std::printf(
      "\ndense / flat / two = ms per step (CUDA graphs, L2 flushed); xflat, xtwo = dense / flat, "
      "dense / two; lvl1 .. attn = the two-level step's stages (cumulative graphs, differences): "
      "level 1, group choice + page list, level-2 scoring, aggregation + selection + map, "
      "attention; list = level-2 positions a (sequence, KV head); l2cp = level-2 pages per "
      "scoring block; cl = level-2 selection cluster; pages = selected pages a row; xbytes = "
      "dense / two-level bytes of the byte model\n");
}

}  // namespace

int main(int argc, char** argv) {
  Opts o;
  // The whole command is checked before the first device call.
  if (const std::string err = bench::parse_args(argc, argv, o); !err.empty()) {
    std::fprintf(stderr,
                 "locks_bench_cuda: %s (usage: the comment at the top of bench_decode.cu)\n",
                 err.c_str());
    return 2;
  }
  if (!o.only_model.empty()) {  // --only: a model the bench knows (any context and batch: a row
                                // that cannot run says why)
    if (!find_model(o.only_model)) {
      std::printf("--only %s: no model name starts with it (models:", o.only_model.c_str());
      for (const Model& m : kModels) std::printf(" %s", m.name);
      std::printf(")\n");
      return 2;
    }
  }
  if (!o.csv_path.empty() && (o.csv = std::fopen(o.csv_path.c_str(), "w")) == nullptr) {
    std::fprintf(stderr, "locks_bench_cuda: cannot write the CSV file '%s'\n", o.csv_path.c_str());
    return 2;
  }
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs, %.1f GiB, L2 %d MiB\n", prop.name, prop.multiProcessorCount,
              prop.totalGlobalMem / double(1 << 30), prop.l2CacheSize >> 20);
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  CK(cudaMalloc(&g_flush, kFlushBytes));
  if (o.two_level) {
    run_two_level(o);
    if (o.csv) std::fclose(o.csv);
    return 0;
  }
  // Measured on every run (an --only row on another card would otherwise divide by the wrong
  // ceiling: the H100 reads ~3.1 TB/s, the H200 ~4.4).
  o.ceiling = o.ceiling > 0 ? o.ceiling : measure_read_ceiling(st);
  if (o.csv)
    std::fprintf(o.csv,
                 "model,context,batch,dense_ms,locks_ms,time_ratio,dense_bytes,locks_bytes,"
                 "bytes_ratio,floor_ms,floor_pct,dense_TBps,score_ms,score_TBps,aggregate_ms,"
                 "select_ms,sparse_attn_ms,sparse_attn_TBps,launch_ms,build_step_ms,"
                 "build_full_ms,build_none_ms,select_cluster,score_chunk_pages,row_tokens\n");
  std::printf("\n%-19s %8s %5s | %9s %9s %6s %6s %6s | %8s %7s %7s %7s %7s %7s | %6s %6s %6s %3s\n",
              "model", "context", "batch", "dense_ms", "locks_ms", "xtime", "xbytes", "floor%",
              "score_ms", "agg_ms", "sel_ms", "attn_ms", "launch", "build", "dense%", "score%",
              "attn%", "cl");
  if (!o.only_model.empty()) {
    run_row(*find_model(o.only_model), o.only_ctx, o.only_batch, o);  // (checked above)
  } else {
    struct Row {
      const char* model;
      int64_t ctx;
      int batch;
    };
    // --quick: one row per model plus the issue's headline rows.
    const Row quick_rows[] = {{"Llama-3.1-8B", 131072, 1},
                              {"Llama-3.1-8B", 131072, 8},
                              {"Llama-3.1-8B", 1048576, 1},
                              {"GLM-4-9B", 1048576, 1},
                              {"GLM-4-9B", 262144, 1},
                              {"Qwen2.5-7B", 131072, 8},
                              {"Llama-3.1-70B-TP8", 131072, 4},
                              {"SmolLM2-135M", 32768, 8},
                              {"Gemma-3-270M-global", 131072, 1},
                              {"Gemma-3-4B-global", 131072, 4}};
    if (o.quick) {
      for (const Row& r : quick_rows)
        for (const Model& m : kModels)
          if (std::strcmp(m.name, r.model) == 0) run_row(m, r.ctx, r.batch, o);
    } else {
      for (const Model& m : kModels)
        for (int64_t ctx : {32768, 131072, 262144, 1048576})
          for (int B : {1, 4, 8, 32}) run_row(m, ctx, B, o);
    }
  }
  if (o.csv) std::fclose(o.csv);
  std::printf(
      "\nxtime = dense_ms / locks_ms; xbytes = dense bytes / LOCKS minimum bytes (summaries + "
      "selected pages); floor%% = LOCKS minimum bytes at the read ceiling / locks_ms; dense%%, "
      "score%%, attn%% = achieved bandwidth / read ceiling (%.2f TB/s; attn counts the selected "
      "K+V); launch = LOCKS graph time minus the four stages timed alone; build = amortised "
      "incremental summary build per step (ms, not in locks_ms); cl = blocks per (sequence, KV "
      "head) of the one-launch aggregation + selection (0: separate launches; otherwise "
      "agg_ms is 0 and sel_ms times the one launch)\n",
      o.ceiling);
  return 0;
}
