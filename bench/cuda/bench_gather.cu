// locks_bench_gather: the read ceiling of the sparse attention's access pattern.
//
// The LOCKS step's attention reads, for every (sequence, KV head), the K and V rows of its
// selected pages. In vLLM's paged cache ([block, token, KV head, dim], which the kernels take)
// one head's page is 16 rows of d * 2 bytes, H * d * 2 bytes apart, in blocks whose other heads'
// rows the step may not read (each KV head selects its own pages). The dense kernel reads whole
// blocks. This bench times plain loads (no attention arithmetic) of:
//   stream   : the whole K and V, in order (the read ceiling the other benches use)
//   gather   : the selected (page, head) pieces in vLLM's layout (the sparse attention's bytes)
//   headmaj  : the same pieces if the cache were [block, KV head, token, dim] (each piece
//              d * 32 contiguous bytes)
//   blocks   : as many bytes as `gather`, as whole blocks (every head of the selected pages:
//              what a selection shared by the KV heads would read)
// so that the sparse attention's achieved bandwidth can be set against what its pattern allows
// rather than against the streaming ceiling alone.
//
// Usage: locks_bench_gather [--heads H] [--dim D] [--batch B] [--context TOKENS]
//                           [--pages-per-head N]...
// Defaults: Llama-3.1-8B's layer at 128K tokens, batch 8 (H 8, d 128), 128 pages a head (the
// bench's budget of 2048 tokens), then 512 and 2048 (the same pattern with more bytes, so that
// launch and tail costs fall out).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "bench_timing.cuh"

namespace {

constexpr int kP = 16;  // tokens a page

// One warp a piece: rows [0, 16) of `row_bytes` each at `stride` bytes, from K and from V,
// every load issued before any is used. row_bytes is a multiple of 16; a warp covers
// 512 bytes an instruction.
__global__ void gather_kernel(const char* __restrict__ k, const char* __restrict__ v,
                              const int64_t* __restrict__ base, int n_pieces, int row_bytes,
                              int64_t stride, unsigned* sink) {
  const int lane = threadIdx.x & 31;
  const int warps = (gridDim.x * blockDim.x) >> 5;
  const int chunks = kP * row_bytes / 16;  // 16-byte chunks a piece, per tensor
  unsigned acc = 0;
  for (int p = (blockIdx.x * blockDim.x + threadIdx.x) >> 5; p < n_pieces; p += warps) {
    const int64_t b0 = base[p];
    for (int c0 = 0; c0 < chunks; c0 += 32 * 8) {
      uint4 x[8], y[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const int c = c0 + i * 32 + lane;
        const int row = c * 16 / row_bytes, col = c * 16 % row_bytes;
        const int64_t off = b0 + row * stride + col;
        x[i] =
            c < chunks ? __ldcs(reinterpret_cast<const uint4*>(k + off)) : make_uint4(0, 0, 0, 0);
        y[i] =
            c < chunks ? __ldcs(reinterpret_cast<const uint4*>(v + off)) : make_uint4(0, 0, 0, 0);
      }
#pragma unroll
      for (int i = 0; i < 8; ++i) acc ^= x[i].x ^ x[i].w ^ y[i].y ^ y[i].z;
    }
  }
  if (acc == 0x12345678u) *sink = acc;  // keeps the loads
}

int arg_int(int argc, char** argv, const char* name, int def) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return std::atoi(argv[i + 1]);
  return def;
}

}  // namespace

int main(int argc, char** argv) {
  const int H = arg_int(argc, argv, "--heads", 8), d = arg_int(argc, argv, "--dim", 128);
  const int B = arg_int(argc, argv, "--batch", 8);
  const int ctx = arg_int(argc, argv, "--context", 131072);
  std::vector<int> per_head;
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], "--pages-per-head") == 0) per_head.push_back(std::atoi(argv[i + 1]));
  if (per_head.empty()) per_head = {128, 512, 2048};
  const int pages = ctx / kP;
  if (H < 1 || d < 8 || d % 8 || B < 1 || pages < 1) {
    std::fprintf(stderr, "bad shape: heads %d, dim %d (a multiple of 8), batch %d, context %d\n", H,
                 d, B, ctx);
    return 2;
  }
  for (int n : per_head)
    if (n < 1 || n > pages) {
      std::fprintf(stderr, "--pages-per-head %d outside [1, %d]\n", n, pages);
      return 2;
    }
  const int64_t blocks = int64_t(pages) * B;
  const int64_t row = int64_t(d) * 2;                   // bytes of one token's row of one head
  const size_t tensor = size_t(blocks) * kP * H * row;  // K (or V) bytes
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs; K and V %.2f GB each (%d x %d pages, %d KV heads, d %d)\n",
              prop.name, prop.multiProcessorCount, tensor / 1e9, B, pages, H, d);
  char *k = nullptr, *v = nullptr;
  unsigned* sink = nullptr;
  int64_t* dbase = nullptr;
  CK(cudaMalloc(&k, 2 * tensor));  // K, then V: one streaming read covers both
  v = k + tensor;
  CK(cudaMalloc(&bench::g_flush, bench::kFlushBytes));
  CK(cudaMalloc(&sink, 4));
  CK(cudaMemset(k, 1, tensor));
  CK(cudaMemset(v, 2, tensor));
  const size_t max_pieces =
      size_t(B) * H * size_t(*std::max_element(per_head.begin(), per_head.end()));
  CK(cudaMalloc(&dbase, std::max(max_pieces, size_t(blocks)) * 8));

  const int sms = prop.multiProcessorCount;
  const double t_stream = bench::median_ms(
      [&] { bench::read_kernel<<<sms * 8, 512>>>((const uint4*)k, 2 * tensor / 16, sink); }, 0, 9);
  const double ceil_tbs = 2.0 * tensor / (t_stream * 1e-3) / 1e12;
  std::printf("stream: %.3f ms, %.2f TB/s (the read ceiling here)\n", t_stream, ceil_tbs);

  // One warp a piece, 8 warps a block, as many blocks as pieces need (at most 64 warps an SM
  // resident: the rest queue).
  auto run = [&](const std::vector<int64_t>& base, int row_bytes, int64_t stride) {
    CK(cudaMemcpy(dbase, base.data(), base.size() * 8, cudaMemcpyHostToDevice));
    const int n = int(base.size());
    const int grid = std::min((n + 7) / 8, sms * 8);
    return bench::median_ms(
        [&] { gather_kernel<<<grid, 256>>>(k, v, dbase, n, row_bytes, stride, sink); }, 0, 9);
  };
  std::mt19937_64 rng(7);
  std::printf(
      "pages/head | MB read | gather (vLLM layout) ms, TB/s, %% of stream | headmaj ms, TB/s, %% | "
      "blocks ms, TB/s, %%\n");
  for (int n : per_head) {
    // Each (sequence, head) selects n distinct pages, ascending (as the selection writes them);
    // page j of sequence s is block j * B + s (the sequences interleaved over the pool, as in
    // locks_bench_cuda).
    std::vector<int64_t> vllm, headmaj, whole;
    std::vector<int> idx(static_cast<size_t>(pages));
    for (int s = 0; s < B; ++s)
      for (int h = 0; h < H; ++h) {
        std::iota(idx.begin(), idx.end(), 0);
        for (int i = 0; i < n; ++i)
          std::swap(idx[size_t(i)], idx[size_t(i) + rng() % size_t(pages - i)]);
        std::sort(idx.begin(), idx.begin() + n);
        for (int i = 0; i < n; ++i) {
          const int64_t blk = int64_t(idx[size_t(i)]) * B + s;
          vllm.push_back(blk * kP * H * row + h * row);     // row t at + t * H * row
          headmaj.push_back((blk * H + h) * kP * row);      // row t at + t * row
          if (h == 0) whole.push_back(blk * kP * H * row);  // all heads: the same bytes in all
        }
      }
    const double mb = 2.0 * double(vllm.size()) * kP * row / 1e6;
    const double tg = run(vllm, int(row), H * row), th = run(headmaj, int(row), row);
    const double tb = run(whole, int(H * row), H * row);
    auto tbs = [&](double ms) { return mb * 1e6 / (ms * 1e-3) / 1e12; };
    std::printf("%10d | %7.1f | %.4f %5.2f %5.1f%% | %.4f %5.2f %5.1f%% | %.4f %5.2f %5.1f%%\n", n,
                mb, tg, tbs(tg), 100 * tbs(tg) / ceil_tbs, th, tbs(th), 100 * tbs(th) / ceil_tbs,
                tb, tbs(tb), 100 * tbs(tb) / ceil_tbs);
  }
  CK(cudaFree(k));
  CK(cudaFree(bench::g_flush));
  CK(cudaFree(sink));
  CK(cudaFree(dbase));
  return 0;
}
