// cuda::request_rows (include/locks/request_rows.h): each token row's list from its request's
// selection, a warp per (row, KV head) in one launch. The lists are short (a budget's pages),
// so a warp walks its request's list in chunks of 32 entries, twice: once to count the parts of
// request_row_part and find the row's own last page, once to write them in place (ballot
// prefix counts keep the order). Every input is device data (docs/bad_input.md): nothing faults.
#include <cstdint>

#include "common.cuh"
#include "locks/contract.h"
#include "locks/request_rows.h"
#include "locks/rules.h"

namespace locks::cuda {
namespace {

constexpr unsigned kFull = 0xffffffffu;
constexpr int kWarps = 4;

__global__ void request_rows_kernel(const int32_t* __restrict__ req_lens,
                                    const int32_t* __restrict__ row_lens,
                                    const int32_t* __restrict__ req_pages,
                                    const int32_t* __restrict__ req_counts, int req_cap,
                                    int32_t* __restrict__ out_pages,
                                    int32_t* __restrict__ out_counts, int out_cap, int n_rows,
                                    int T, int H, int P) {
  const int lane = threadIdx.x & 31;
  const int64_t w = int64_t(blockIdx.x) * kWarps + (threadIdx.x >> 5);  // (row, head)
  if (w >= int64_t(n_rows) * H) return;                                 // warp-uniform
  const int r = int(w / H), h = int(w - int64_t(r) * H), s = r / T;
  const int64_t sh = int64_t(s) * H + h;
  const int32_t* in = req_pages + sh * req_cap;
  int32_t* o = out_pages + w * out_cap;
  const int len = row_lens[r], count = req_counts[sh];
  const int row_last = rules::last_page(len, P), req_last = rules::last_page(req_lens[s], P);
  int n = -1;  // the row's list length, -1 = invalid
  if (len < 1) {
    n = 0;
  } else if (count >= 0 && count <= req_cap) {
    int part0 = 0, part2 = 0;
    bool has_last = false;
    for (int i0 = 0; i0 < count; i0 += 32) {
      const int i = i0 + lane;
      const int p = i < count ? in[i] : 0;
      const int part = i < count ? rules::request_row_part(p, row_last, req_last) : 1;
      part0 += __popc(__ballot_sync(kFull, part == 0));
      part2 += __popc(__ballot_sync(kFull, part == 2));
      has_last |= __any_sync(kFull, i < count && p == row_last);
    }
    const bool add_last = !has_last && part0 + part2 < out_cap;
    const bool partial_missing = !has_last && !add_last && len % P != 0;
    if (!partial_missing) {
      n = part0 + int(add_last) + part2;
      const unsigned below = (1u << lane) - 1u;
      int at0 = 0, at2 = part0 + int(add_last);
      for (int i0 = 0; i0 < count; i0 += 32) {
        const int i = i0 + lane;
        const int p = i < count ? in[i] : 0;
        const int part = i < count ? rules::request_row_part(p, row_last, req_last) : 1;
        const unsigned b0 = __ballot_sync(kFull, part == 0), b2 = __ballot_sync(kFull, part == 2);
        if (part == 0) o[at0 + __popc(b0 & below)] = p;
        if (part == 2) o[at2 + __popc(b2 & below)] = p;
        at0 += __popc(b0);
        at2 += __popc(b2);
      }
      if (add_last && lane == 0) o[part0] = row_last;
    }
  }
  for (int i = (n < 0 ? 0 : n) + lane; i < out_cap; i += 32) o[i] = -1;
  if (lane == 0) out_counts[w] = n;
}

}  // namespace

void request_rows(const RequestRows& rows, const Selection& req, int num_kv_heads, int page_size,
                  const Selection& out, cudaStream_t stream) {
  validate_request_rows(rows, req, out, num_kv_heads, page_size);
  const int n_rows = rows.num_requests * rows.tokens_per_request;
  const int64_t warps = int64_t(n_rows) * num_kv_heads;
  const int64_t blocks = (warps + kWarps - 1) / kWarps;
  LOCKS_REQUIRE(blocks <= 0x7fffffff, "request_rows: ", n_rows, " rows x ", num_kv_heads,
                " KV heads exceed one launch");
  request_rows_kernel<<<unsigned(blocks), kWarps * 32, 0, stream>>>(
      rows.req_seq_lens, rows.row_seq_lens, req.pages, req.counts, req.capacity, out.pages,
      out.counts, out.capacity, n_rows, rows.tokens_per_request, num_kv_heads, page_size);
  LOCKS_CUDA_LAUNCHED();
}

}  // namespace locks::cuda
