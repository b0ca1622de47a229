// locks_bench_cuda: the LOCKS decode step vs our dense (FullKV) kernel on one GPU.
// For each model shape, context and batch: median time per step (CUDA-graph replays, L2
// flushed before each), bytes read, the ratios, each kernel's achieved bandwidth against a
// read ceiling measured here, and the summary build (incremental per step, bulk).
// Usage: locks_bench_cuda [csv_path] [--quick] [--only MODEL_PREFIX CONTEXT BATCH]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "locks/cuda/decoder.h"
#include "locks/cuda/summary_builder.h"

using namespace locks;

#define CK(x)                                                                                 \
  do {                                                                                        \
    cudaError_t e_ = (x);                                                                     \
    if (e_ != cudaSuccess) {                                                                  \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                           \
    }                                                                                         \
  } while (0)

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
// Read ceiling: every thread streams 16-byte loads; the sum is kept so nothing is elided.
__global__ void read_kernel(const uint4* __restrict__ p, size_t n, unsigned* sink) {
  uint32_t acc = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    const uint4 v = __ldcs(p + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x12345678u) *sink = acc;
}

struct Timer {
  cudaEvent_t a, b;
  Timer() {
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
  }
  ~Timer() { cudaEventDestroy(a), cudaEventDestroy(b); }
};

void* g_flush = nullptr;
const size_t kFlushBytes = size_t(256) << 20;
void flush_l2(cudaStream_t st) { CK(cudaMemsetAsync(g_flush, 0, kFlushBytes, st)); }

// Median time (ms) of fn() over reps, L2 flushed before each.
template <typename F>
double median_ms(F fn, cudaStream_t st, int reps) {
  Timer t;
  std::vector<double> v;
  for (int i = 0; i < reps + 2; ++i) {
    flush_l2(st);
    CK(cudaEventRecord(t.a, st));
    fn();
    CK(cudaEventRecord(t.b, st));
    CK(cudaEventSynchronize(t.b));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, t.a, t.b));
    if (i >= 2) v.push_back(ms);
  }
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Graph {
  cudaGraphExec_t exec = nullptr;
  template <typename F>
  Graph(F fn, cudaStream_t st) {
    cudaGraph_t g;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    fn();
    CK(cudaStreamEndCapture(st, &g));
    CK(cudaGraphInstantiate(&exec, g, 0));
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

}  // namespace

int main(int argc, char** argv) {
  const char* csv_path = argc > 1 ? argv[1] : nullptr;
  bool quick = false;
  std::string only_model;
  int64_t only_ctx = 0;
  int only_batch = 0;
  for (int i = 2; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0) quick = true;
    if (std::strcmp(argv[i], "--only") == 0 && i + 3 < argc) {
      only_model = argv[i + 1];
      only_ctx = std::atoll(argv[i + 2]);
      only_batch = std::atoi(argv[i + 3]);
      i += 3;
    }
  }
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs, %.1f GiB, L2 %d MiB\n", prop.name, prop.multiProcessorCount,
              prop.totalGlobalMem / double(1 << 30), prop.l2CacheSize >> 20);
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  CK(cudaMalloc(&g_flush, kFlushBytes));
  const double ceiling = only_model.empty() ? measure_read_ceiling(st) : 4.4;
  FILE* csv = csv_path ? std::fopen(csv_path, "w") : nullptr;
  if (csv)
    std::fprintf(
        csv,
        "model,context,batch,dense_ms,locks_ms,time_ratio,dense_bytes,locks_bytes,bytes_ratio,"
        "dense_TBps,score_ms,score_TBps,aggregate_ms,aggregate_TBps,select_ms,select_TBps,"
        "sparse_attn_ms,sparse_attn_TBps,build_step_ms,build_share\n");

  const Model models[] = {{"Llama-3.1-8B", 32, 8, 128}, {"GLM-4-9B", 32, 2, 128}};
  const std::vector<int64_t> contexts =
      quick ? std::vector<int64_t>{16384, 131072}
            : std::vector<int64_t>{16384, 32768, 131072, 262144, 1048576};
  const std::vector<int> batches = quick ? std::vector<int>{1, 8} : std::vector<int>{1, 8, 32};
  const int P = 16, r = 8, budget = 2048;
  const int reps = quick ? 5 : 15;
  std::printf(
      "\n%-13s %8s %5s | %9s %9s %6s | %9s %9s %6s | %6s %6s %6s %6s %6s | %8s %6s %8s %8s %8s | "
      "%8s %6s\n",
      "model", "context", "batch", "dense_ms", "locks_ms", "xtime", "dense_MB", "locks_MB",
      "xbytes", "dense%", "score%", "agg%", "sel%", "attn%", "score_ms", "agg_ms", "sel_ms",
      "attn_ms", "launch", "build_ms", "build%");
  for (const Model& m : models)
    for (int64_t ctx : contexts)
      for (int B : batches) {
        if (!only_model.empty() &&
            (std::string(m.name).rfind(only_model, 0) != 0 || ctx != only_ctx || B != only_batch))
          continue;
        const int64_t pages = ctx / P;
        const int64_t blocks = pages * B;
        const size_t kv_bytes = size_t(blocks) * P * m.hkv * m.d * 2;  // one of K or V
        if (2 * kv_bytes > (size_t(100) << 30)) {
          std::printf("%-13s %8lld %5d | skipped: K+V %.0f GB\n", m.name, (long long)ctx, B,
                      2 * kv_bytes / 1e9);
          continue;
        }
        CacheLayout L{blocks, P, m.hkv, m.d, DType::bf16};
        void *k, *v;
        CK(cudaMalloc(&k, kv_bytes));
        CK(cudaMalloc(&v, kv_bytes));
        fill_bf16<<<4096, 256, 0, st>>>((uint16_t*)k, kv_bytes / 2, 1);
        fill_bf16<<<4096, 256, 0, st>>>((uint16_t*)v, kv_bytes / 2, 2);
        // Block table: sequences interleaved over the pool (block j of sequence b is j*B+b).
        std::vector<int32_t> bt(size_t(B) * pages);
        std::vector<int32_t> lens(static_cast<size_t>(B), int32_t(ctx));
        std::vector<int32_t> ids(static_cast<size_t>(blocks));
        for (int b = 0; b < B; ++b)
          for (int64_t j = 0; j < pages; ++j) bt[size_t(b * pages + j)] = int32_t(j * B + b);
        for (int64_t i = 0; i < blocks; ++i) ids[size_t(i)] = int32_t(i);
        int32_t *dbt, *dlens, *dids;
        CK(cudaMalloc(&dbt, bt.size() * 4));
        CK(cudaMalloc(&dlens, lens.size() * 4));
        CK(cudaMalloc(&dids, ids.size() * 4));
        CK(cudaMemcpy(dbt, bt.data(), bt.size() * 4, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(dlens, lens.data(), lens.size() * 4, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(dids, ids.data(), ids.size() * 4, cudaMemcpyHostToDevice));
        const BatchView batch{dbt, pages, dlens, B, int(pages)};
        const KvCacheView cache{k, v, L};

        // Quant summaries of every page, built on the GPU (bulk).
        SummaryLayout sl = summary_layout_for(L, r, Precision::quant);
        const size_t nb = size_t(blocks) * m.hkv;
        SummaryView s;
        s.layout = sl;
        CK(cudaMalloc(&s.mu_q, nb * m.d));
        CK(cudaMalloc(&s.mu_scale, nb * 4));
        CK(cudaMalloc(&s.basis_q, nb * r * m.d / 2));
        CK(cudaMalloc(&s.basis_scale, nb * r * 4));
        CK(cudaMalloc(&s.coeff_q, nb * P * r));
        CK(cudaMalloc(&s.coeff_scale, nb * r * 4));
        cuda::SummaryBuilder builder(L, sl, cuda::Solver::warp_jacobi, blocks);
        builder.build(cache, dids, blocks, s, st);
        CK(cudaStreamSynchronize(st));

        float* q;
        float* out;
        CK(cudaMalloc(&q, size_t(B) * m.hq * m.d * 4));
        CK(cudaMalloc(&out, size_t(B) * m.hq * m.d * 4));
        fill_f32<<<256, 256, 0, st>>>(q, size_t(B) * m.hq * m.d, 3);
        cuda::Plan plan{L, m.hq, B, int(pages), DecodeConfig{SelectConfig{budget, 1, 2}, 0.0f}};
        cuda::Decoder dec(plan);
        const QueryView qv{q, m.hq};
        const AttentionOutput ao{out, nullptr};
        Graph g_locks([&] { dec.run(cache, s, batch, qv, ao, st); }, st);
        Graph g_dense([&] { dec.run_dense(cache, batch, qv, ao, st); }, st);
        const double t_locks = median_ms([&] { g_locks.launch(st); }, st, reps);
        const double t_dense = median_ms([&] { g_dense.launch(st); }, st, reps);
        const double t_score = median_ms([&] { dec.score(s, batch, qv, st); }, st, reps);
        const double t_agg = median_ms([&] { dec.aggregate(batch, st); }, st, reps);
        const double t_sel = median_ms([&] { dec.select(batch, st); }, st, reps);
        const Selection sel = dec.selection();
        const double t_attn =
            median_ms([&] { dec.attend(cache, batch, qv, &sel, ao, st); }, st, reps);
        // Incremental summary build in the step's graph: every sequence completes a page
        // (lens are multiples of 16); amortised, a page completes once per 16 steps, and
        // steps where none completes pay the early-exit launch only.
        Graph g_build([&] { builder.build_filled(cache, batch, 1, s, st); }, st);
        const double t_build_full = median_ms([&] { g_build.launch(st); }, st, reps);
        std::vector<int32_t> lens_odd(size_t(B), int32_t(ctx - 1));
        CK(cudaMemcpy(dlens, lens_odd.data(), lens_odd.size() * 4, cudaMemcpyHostToDevice));
        const double t_build_none = median_ms([&] { g_build.launch(st); }, st, reps);
        CK(cudaMemcpy(dlens, lens.data(), lens.size() * 4, cudaMemcpyHostToDevice));
        const double t_build_step = t_build_full / 16 + t_build_none * 15 / 16;

        // Bytes: dense reads all K+V; LOCKS must read the summaries, the selected pages
        // (budget 2048 tokens = 128 pages incl. tail/sink/recent) and the query.
        const double dense_bytes = 2.0 * kv_bytes;
        const double summ_bytes = double(nb) * summary_bytes_per_page(sl);
        std::vector<int32_t> counts(size_t(B) * m.hkv);
        CK(cudaMemcpy(counts.data(), sel.counts, counts.size() * 4, cudaMemcpyDeviceToHost));
        double sel_pages = 0;
        for (int c : counts) sel_pages += c;
        const double sel_bytes = sel_pages * P * m.d * 2 * 2;
        const double locks_bytes = summ_bytes + sel_bytes;
        const double dense_bw = dense_bytes / (t_dense * 1e-3) / 1e12;
        const double score_bw = summ_bytes / (t_score * 1e-3) / 1e12;
        const double launch_gap = t_locks - (t_score + t_agg + t_sel + t_attn);
        // Bytes of the small stages: aggregation reads the head scores and writes the group
        // scores; selection reads the group scores (stage 1) and its candidates (stage 2).
        const double M_ = double(pages);
        const double agg_bytes = double(B) * M_ * 4.0 * (m.hq + m.hkv);
        const double sel_bytes_rw = double(B) * m.hkv * M_ * 4.0;
        const double agg_bw = agg_bytes / (t_agg * 1e-3) / 1e12;
        const double sel_bw = sel_bytes_rw / (t_sel * 1e-3) / 1e12;
        const double attn_bw = sel_bytes / (t_attn * 1e-3) / 1e12;
        std::printf(
            "%-13s %8lld %5d | %9.4f %9.4f %6.2f | %9.1f %9.1f %6.2f | %6.1f %6.1f %6.1f %6.1f "
            "%6.1f | %8.4f %6.4f %8.4f %8.4f %8.4f | %8.4f %6.2f\n",
            m.name, (long long)ctx, B, t_dense, t_locks, t_dense / t_locks, dense_bytes / 1e6,
            locks_bytes / 1e6, dense_bytes / locks_bytes, 100 * dense_bw / ceiling,
            100 * score_bw / ceiling, 100 * agg_bw / ceiling, 100 * sel_bw / ceiling,
            100 * attn_bw / ceiling, t_score, t_agg, t_sel, t_attn, launch_gap, t_build_step,
            100 * t_build_step / t_locks);
        // Latency of one build_filled launch (the step's graph pays it whenever a page fills).
        // Amortised over 16 steps: sequences filling pages on the same step (build%) pay one
        // full launch per 16 steps; staggered ones (ragged serving) pay min(B, 16) of them.
        const double f = std::min(B, 16) / 16.0;
        const double t_build_stag = f * t_build_full + (1 - f) * t_build_none;
        std::printf(
            "  build_filled launch (%d sequences x %d KV heads): %.1f us with every sequence "
            "completing a page, %.1f us with none; amortised %.2f%% of the step (aligned), "
            "%.2f%% (staggered)\n",
            B, m.hkv, t_build_full * 1e3, t_build_none * 1e3, 100 * t_build_step / t_locks,
            100 * t_build_stag / t_locks);
        std::fflush(stdout);
        if (csv)
          std::fprintf(
              csv,
              "%s,%lld,%d,%.5f,%.5f,%.3f,%.0f,%.0f,%.3f,%.3f,%.5f,%.3f,%.5f,%.3f,%.5f,%.3f,"
              "%.5f,%.3f,%.5f,%.4f\n",
              m.name, (long long)ctx, B, t_dense, t_locks, t_dense / t_locks, dense_bytes,
              locks_bytes, dense_bytes / locks_bytes, dense_bw, t_score, score_bw, t_agg, agg_bw,
              t_sel, sel_bw, t_attn, attn_bw, t_build_step, t_build_step / t_locks);

        // Bulk build after a 128K prefill (batch 1): both solvers, and cost per page.
        if (ctx == 131072 && B == 1) {
          const double t_jac = median_ms([&] { builder.build(cache, dids, blocks, s, st); }, st, 3);
          cuda::SummaryBuilder cus(L, sl, cuda::Solver::cusolver, blocks);
          const double t_cus = median_ms([&] { cus.build(cache, dids, blocks, s, st); }, st, 3);
          std::printf(
              "  bulk summary build after a 128K prefill (%lld pages x %d KV heads): warp Jacobi "
              "%.3f ms "
              "(%.1f ns per page-head), cuSOLVER syevjBatched %.3f ms; incremental launch %.4f ms "
              "with "
              "every sequence completing a page, %.4f ms with none\n",
              (long long)blocks, m.hkv, t_jac, t_jac * 1e6 / double(nb), t_cus, t_build_full,
              t_build_none);
        }
        for (void* p : {k, v, (void*)dbt, (void*)dlens, (void*)dids, (void*)s.mu_q,
                        (void*)s.mu_scale, (void*)s.basis_q, (void*)s.basis_scale, (void*)s.coeff_q,
                        (void*)s.coeff_scale, (void*)q, (void*)out})
          CK(cudaFree(p));
      }
  if (csv) std::fclose(csv);
  std::printf(
      "\nxtime = dense_ms / locks_ms; xbytes = dense bytes / LOCKS minimum bytes (summaries + "
      "selected pages); dense%%, score%%, agg%%, sel%%, attn%% = each kernel's achieved bandwidth "
      "/ "
      "read ceiling (%.2f TB/s; agg counts head scores read + group scores written, sel the group "
      "scores, attn the selected K+V); launch = "
      "LOCKS graph time minus the four stages timed alone; build%% = amortised incremental "
      "build / "
      "LOCKS step\n",
      ceiling);
  return 0;
}
