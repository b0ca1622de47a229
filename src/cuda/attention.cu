// Split-K paged decode attention (flash-decoding) on the tensor cores, bf16 or fp16 K/V,
// fp32 accumulation. One block per (split, KV head, sequence); a split is a run of
// `pages_per_split` pages (dense: logical pages in order; sparse: entries of the selection
// list); each of the 4 warps streams whole pages (16 tokens x d, K and V) through its own
// two-stage cp.async ring and keeps an online softmax for all G query heads of the KV head;
// the block merges its warps and writes one (max, sum, o) partial per query head; a merge
// kernel combines splits.
//
// Copies: every cp.async instruction covers whole 256-byte rows (d 128: 2 rows, d 64: 4), so
// each L2 request is a full 128-byte line (v11 read K as 64-byte halves of 8 lines). The
// stage is read back with ldmatrix (K) and ldmatrix.trans (V) from an XOR-swizzled layout.
// Per page and warp: S = Q K^T as mma.m16n8k16 with rows = 8 heads x {hi, lo} halves of the
// query (the query is split into two 16-bit parts, so the logits keep ~16 more bits than a
// plain bf16 query), then O += P V with rows = heads.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

#include "common.cuh"
#include "kernels.cuh"
#include "locks/error.h"
#include "ptx.cuh"

namespace locks::cuda::detail {
namespace {

constexpr int kWarps = 4;

// Per warp: two pipeline stages of one page each (K tile, then V tile: 16 rows x D), each
// row's 16-byte chunks XOR-swizzled by (row & 7) so that the 8 row addresses of every
// ldmatrix phase hit distinct banks. Bytes per block: 4 warps x 2 stages x 64 D (d 256:
// 128 KB, one block per SM; its 2 x 64 KB in flight per SM are still ~4x what Little's law
// asks of the read ceiling).
constexpr int attn_smem(int D) { return kWarps * 2 * 2 * 16 * D * 2; }

// Head slices of a GQA group: groups wider than one block's m-tiles (16 heads; 8 at d 256,
// where the output accumulators alone take 128 registers) are split over n blocks per
// (split, KV head), each streaming the same pages (from L2 for all but the first).
constexpr int attn_max_heads(int d) { return d == 256 ? 8 : 16; }
HeadSlices attn_slices(int d, int group) { return head_slices(group, attn_max_heads(d)); }

struct AttnArgs {
  const void* k;
  const void* v;
  int H, Hq;
  int64_t num_blocks;    // block ids outside [0, num_blocks) are never dereferenced
  int64_t block_stride;  // elements from one block to the next (KvCacheView::block_step)
  const int32_t* block_table;
  int64_t bt_stride;
  int cap_tokens;  // row capacity, max_blocks_per_seq * 16: longer (or < 1) lengths are invalid
  const int32_t* seq_lens;
  const int32_t* sel_pages;  // null: dense
  const int32_t* sel_counts;
  int sel_cap;
  int pages_per_split;
  int n_splits;
  int n_sl, gw;    // head slices per KV head and heads per slice (attn_slices)
  const float* q;  // a contiguous fp32 query (the QV false instance)
  float qscale;    // softmax scale * log2(e)
  float* part_o;
  float* part_ml;
  QIn q16;  // the query in any dtype and row stride (the QV true instance)
};

// G 16 at d 128 (two m-tiles: 64 query and 64 accumulator registers) would take ~204
// registers, i.e. 2 blocks per SM; capped at 168 for 3 (the shared-memory limit), at the
// cost of ~6 local loads/stores a page (L1 hits). 0: no cap.
// d 256 (one m-tile): 64 query and 128 accumulator registers, one block per SM (shared
// memory), so no cap.
template <typename T, int D, int MT, bool QV>
__global__ void __launch_bounds__(kWarps * 32, D == 128 && MT == 2 ? 3 : 0)
    attn_kernel(AttnArgs a) {
  using M = Mma<T>;
  constexpr int KS = D / 16;
  constexpr int NV = D / 8;     // n-tiles of the output
  constexpr int CH = D / 8;     // 16-byte chunks a row
  constexpr int RPI = 32 / CH;  // rows a copy instruction covers (whole rows: full lines)
  constexpr int TILE = 16 * CH;
  constexpr int kRowBytes = D * int(sizeof(T));
  extern __shared__ uint4 abuf[];  // pipeline stages; reused for the warps' outputs at the end
  __shared__ float sml[kWarps][16][2];
  const int h = int(blockIdx.x) / a.n_sl, split = blockIdx.y, b = blockIdx.z;  // heads fastest
  const int G = a.Hq / a.H, g0 = (int(blockIdx.x) - h * a.n_sl) * a.gw;
  const int gc = min(a.gw, G - g0), hq0 = h * G + g0;  // this slice's query heads
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int gid = lane >> 2, tig = lane & 3;
  // Device-side values are not trusted (docs/bad_input.md): an invalid length counts as 0
  // pages, an invalid count as 0 (the merge writes such rows as NaN); an invalid page index
  // or block id is read as block 0 and poisons this split's sum.
  const int raw_len = a.seq_lens[b];
  const int len = raw_len >= 1 && raw_len <= a.cap_tokens ? raw_len : 0;
  const int n_pages = (len + 15) / 16;
  const int64_t row = int64_t(b) * a.H + h;
  const int start = split * a.pages_per_split;
  const int32_t* bt = a.block_table + int64_t(b) * a.bt_stride;
  // Logical page of this warp's page k (position start + warp + kWarps k): read from the
  // selection list before its count is known (the list is allocated up to sel_cap), so the
  // count, list and block-table loads are not three dependent latencies before the first copy.
  auto page_at = [&](int k) {
    const int pos = start + warp + kWarps * k;
    return a.sel_pages ? (pos < a.sel_cap ? a.sel_pages[row * a.sel_cap + pos] : 0) : pos;
  };
  // The block-table load is guarded by the row's extent only (not by the page count), so it
  // need not wait for seq_lens / sel_counts; entries past this warp's pages are never used.
  auto blk_at = [&](int j) { return j >= 0 && j < a.bt_stride ? bt[j] : 0; };
  const int j0 = page_at(lane);
  const int blk0 = blk_at(j0);
  const int cnt = a.sel_pages ? a.sel_counts[row] : n_pages;
  const int total = cnt >= 0 && cnt <= (a.sel_pages ? a.sel_cap : n_pages) && len > 0 ? cnt : 0;
  if (start >= total) return;  // block-uniform: the merge reads only splits < total
  const int stop = min(start + a.pages_per_split, total);
  // This warp's pages: k = 0 .. nw-1 (warp-uniform count).
  const int nw = max(0, (stop - start - warp + kWarps - 1) / kWarps);

  float o[NV][4];
#pragma unroll
  for (int n = 0; n < NV; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  float mrow[MT], lrow[MT];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) mrow[mt] = kNegInf, lrow[mt] = 0.f;

  const T* K = static_cast<const T*>(a.k);
  const T* V = static_cast<const T*>(a.v);
  // Shared addresses: this warp's stages, 2 x (K tile, V tile) of TILE 16-byte chunks.
  const unsigned wbuf =
      static_cast<unsigned>(__cvta_generic_to_shared(abuf)) + warp * 2 * 2 * TILE * 16;

  // Blocks of 32 pages at a time, lane i holding page k0 + i, and a warp-uniform mask of
  // which of them is the sequence's last, partial page: a copy waits on a block-table load
  // only once every 32 pages of a warp (never for splits of <= 128 pages).
  const int last_nv = len - 16 * (n_pages - 1);
  auto last_mask = [&](int k0, int j) {
    return __ballot_sync(kFull, k0 + lane < nw && j == n_pages - 1);
  };
  // Checked once per page, where its block id is loaded (once per 32 pages of a warp).
  bool bad = false;
  auto checked = [&](int k0, int j, int blk) {
    const bool ok = j >= 0 && j < n_pages && blk >= 0 && blk < a.num_blocks;
    bad |= !ok && k0 + lane < nw;
    return ok ? blk : 0;
  };
  int cur_blk = checked(0, j0, blk0);
  unsigned cur_last = last_mask(0, j0);
  // Copies: instruction q covers rows q RPI .. + RPI-1, lane -> (row lr, chunk lc). Row
  // r = q RPI + lr has r & 7 = (q RPI & 7) | lr, so its chunk lc lands at
  // lc ^ lr ^ (q RPI & 7): one of 8 / RPI lane offsets, plus a compile-time q RPI CH.
  const int lr = lane / CH, lc = lane % CH;
  const int64_t row_step = int64_t(RPI) * a.H * D;
  constexpr int kDst = 8 / RPI;
  unsigned dofs[kDst];
#pragma unroll
  for (int w = 0; w < kDst; ++w) dofs[w] = (lr * CH + (lc ^ lr ^ (w * RPI))) * 16;
  auto issue_tile = [&](const T* base, int64_t blk, unsigned tile) {
    const T* src = base + blk * a.block_stride + (int64_t(lr) * a.H + h) * D + lc * 8;
#pragma unroll
    for (int q = 0; q < 16 / RPI; ++q)
      cp_async16_row<kRowBytes>(tile + q * RPI * CH * 16 + dofs[q % kDst], src + q * row_step);
  };
  // Block and valid tokens of page k (issue order k = 0, 1, 2, ... exactly once each).
  auto blk_of = [&](int k, int& nv) {
    if ((k & 31) == 0 && k > 0) {
      const int j = page_at(k + lane);
      cur_blk = checked(k, j, blk_at(j));
      cur_last = last_mask(k, j);
    }
    nv = (cur_last >> (k & 31)) & 1u ? last_nv : 16;
    return __shfl_sync(kFull, cur_blk, k & 31);
  };
  int nv_cur = 0, nv_nxt = 0;
  {
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      const int blk = blk_of(k, k == 0 ? nv_cur : nv_nxt);
      if (k < nw) issue_tile(K, blk, wbuf + 2 * k * TILE * 16);
      cp_async_commit();
      if (k < nw) issue_tile(V, blk, wbuf + (2 * k + 1) * TILE * 16);
      cp_async_commit();
    }
  }
  // Query fragments (A operand, rows gid = hi part, gid + 8 = lo part of head mt*8 + gid):
  // register 2x (+1 lo) holds dims 16 s + 8 x + 2 tig, +1.
  uint32_t qa[MT][KS][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    const int g = mt * 8 + gid;
    // QV: one branch on the query's dtype per row, outside the unrolled loads (a branch per
    // element pair cost the G 16 instance a spilled register in the page loop); else the
    // contiguous fp32 query, the kernel's instructions as before the model-dtype query.
    auto frag = [&](auto tag) {
      using E = decltype(tag);
      const E* row =
          QV ? static_cast<const E*>(a.q16.p) + int64_t(b) * a.q16.stride + int64_t(hq0 + g) * D
             : reinterpret_cast<const E*>(a.q) + (int64_t(b) * a.Hq + hq0 + g) * D;
#pragma unroll
      for (int s = 0; s < KS; ++s) {
#pragma unroll
        for (int x = 0; x < 2; ++x) {
          const int dim = 16 * s + 8 * x + 2 * tig;
          float v0 = 0.f, v1 = 0.f;
          if (g < gc) {
            const float2 v = pair_to_float2(row + dim);
            v0 = v.x * a.qscale;
            v1 = v.y * a.qscale;
          }
          const float h0 = M::round(v0), h1 = M::round(v1);
          qa[mt][s][2 * x] = M::pack(h0, h1);
          qa[mt][s][2 * x + 1] = M::pack(v0 - h0, v1 - h1);
        }
      }
    };
    if (!QV || a.q16.t == DType::f32)
      frag(float{});
    else if (a.q16.t == DType::bf16)
      frag(__nv_bfloat16{});
    else
      frag(__half{});
  }
  // ldmatrix row addresses. K (non-transposed): matrix i of a k-step pair = token rows
  // nt*8 + (lane & 7), logical chunk 2 s + i, i.e. b0/b1 of steps s and s + 1.
  // Chunk 4m + (lane >> 3) lands at 4m ^ kx = 4 (m & ~1) + (kx ^ 4 (m & 1)): two lane offsets.
  const int rl = lane & 7;
  const int kx = (lane >> 3) ^ rl;
  const unsigned kofs[2] = {unsigned(rl * CH + kx) * 16, unsigned(rl * CH + (kx ^ 4)) * 16};
  // V (transposed): matrix i = token rows 8 (i & 1) + (lane & 7), chunk c + (i >> 1), i.e.
  // b0/b1 of n-tiles c and c + 1 (c even); lands at c ^ vx = 8 (c / 8) + ((c % 8) ^ vx).
  const int vrow = rl + 8 * ((lane >> 3) & 1);
  const int vx = (lane >> 4) ^ rl;
  unsigned vofs[4];
#pragma unroll
  for (int w = 0; w < 4; ++w) vofs[w] = (vrow * CH + ((2 * w) ^ vx)) * 16;

  // Groups are committed K, V per page; stage k & 1; two pages (four groups) ahead.
  for (int it = 0; it < nw; ++it) {
    const unsigned sk = wbuf + (it & 1) * 2 * TILE * 16, svt = sk + TILE * 16;
    cp_async_wait<3>();  // this page's K
    __syncwarp();
    // S = Q K^T (log2 units): per n-tile of 8 tokens, all m-tiles.
    float sv[MT][2][4];
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
      uint32_t kb[KS][2];
#pragma unroll
      for (int m = 0; m < KS / 2; ++m) {
        uint32_t r[4];
        ldsm_x4<false>(r, sk + kofs[m & 1] + (nt * 8 * CH + 4 * (m & ~1)) * 16);
        kb[2 * m][0] = r[0], kb[2 * m][1] = r[1], kb[2 * m + 1][0] = r[2], kb[2 * m + 1][1] = r[3];
      }
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        float acc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
        for (int s = 0; s < KS; ++s)
          M::run(acc, qa[mt][s][0], qa[mt][s][1], qa[mt][s][2], qa[mt][s][3], kb[s][0], kb[s][1]);
        const int t0 = nt * 8 + 2 * tig;
        sv[mt][nt][0] = t0 < nv_cur ? acc[0] + acc[2] : kNegInf;
        sv[mt][nt][1] = t0 + 1 < nv_cur ? acc[1] + acc[3] : kNegInf;
      }
    }
    // Online softmax per head row; P as the A operand of P V.
    uint32_t pa[4] = {0u, 0u, 0u, 0u};
    float resc[2] = {1.f, 1.f};
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      float mx = fmaxf(fmaxf(sv[mt][0][0], sv[mt][0][1]), fmaxf(sv[mt][1][0], sv[mt][1][1]));
      mx = fmaxf(mx, __shfl_xor_sync(kFull, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(kFull, mx, 2));
      const float mn = fmaxf(mrow[mt], mx);  // finite: token 0 of every page is valid
      resc[mt] = exp2f(mrow[mt] - mn);
      mrow[mt] = mn;
      const float p00 = exp2f(sv[mt][0][0] - mn), p01 = exp2f(sv[mt][0][1] - mn);
      const float p10 = exp2f(sv[mt][1][0] - mn), p11 = exp2f(sv[mt][1][1] - mn);
      lrow[mt] = lrow[mt] * resc[mt] + (p00 + p01 + p10 + p11);
      pa[mt] = M::pack(p00, p01);      // rows gid (mt 0) / gid + 8 (mt 1), tokens 2t, 2t+1
      pa[2 + mt] = M::pack(p10, p11);  // tokens 2t + 8, 2t + 9
    }
    // This stage's K is consumed (the mma used it): refill it with page it + 2's K now.
    __syncwarp();
    int blk2 = 0;
    {
      int nv2;
      blk2 = blk_of(it + 2, nv2);
      nv_cur = nv_nxt, nv_nxt = nv2;
      if (it + 2 < nw) issue_tile(K, blk2, sk);
      cp_async_commit();
    }
    cp_async_wait<3>();  // this page's V
    __syncwarp();
    // O = O * rescale + P V.
#pragma unroll
    for (int c = 0; c < NV; c += 2) {
      uint32_t r[4];
      ldsm_x4<true>(r, svt + vofs[(c % 8) / 2] + 8 * (c / 8) * 16);
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float(&on)[4] = o[c + e];
        on[0] *= resc[0], on[1] *= resc[0];
        on[2] *= resc[1], on[3] *= resc[1];
        M::run(on, pa[0], pa[1], pa[2], pa[3], r[2 * e], r[2 * e + 1]);
      }
    }
    __syncwarp();
    if (it + 2 < nw) issue_tile(V, blk2, svt);
    cp_async_commit();
  }
  cp_async_wait<0>();
  // The stages become the warps' output buffers.
  const bool any_bad = __syncthreads_or(bad);
  static_assert(sizeof(float) * kWarps * 16 * (D + 1) <= attn_smem(D), "output staging fits");
  float(*so)[16][D + 1] = reinterpret_cast<float(*)[16][D + 1]>(abuf);

  // Merge the warps: row sums across the quad, then through shared memory.
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    lrow[mt] += __shfl_xor_sync(kFull, lrow[mt], 1);
    lrow[mt] += __shfl_xor_sync(kFull, lrow[mt], 2);
    if (tig == 0) {
      sml[warp][mt * 8 + gid][0] = mrow[mt];
      sml[warp][mt * 8 + gid][1] = lrow[mt];
    }
  }
#pragma unroll
  for (int n = 0; n < NV; ++n) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int dim = 8 * n + 2 * tig + e;
      so[warp][gid][dim] = o[n][e];
      if (MT == 2) so[warp][gid + 8][dim] = o[n][2 + e];
    }
  }
  __syncthreads();
  __shared__ float fac[kWarps][16];  // each warp's weight in the block's merge, per head
  if (threadIdx.x < gc) {
    const int g = threadIdx.x;
    float mx = kNegInf;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) mx = fmaxf(mx, sml[w][g][0]);
    float l = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const float f = sml[w][g][0] == kNegInf ? 0.f : exp2f(sml[w][g][0] - mx);
      fac[w][g] = f;
      l += f * sml[w][g][1];
    }
    const int64_t prow = (int64_t(b) * a.Hq + hq0 + g) * a.n_splits + split;
    a.part_ml[prow * 2] = mx;
    a.part_ml[prow * 2 + 1] = any_bad ? __int_as_float(0x7fc00000) : l;  // NaN reaches the row
  }
  __syncthreads();
  for (int e = threadIdx.x; e < gc * D; e += blockDim.x) {
    const int g = e / D, dim = e % D;
    float acc = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) acc += fac[w][g] * so[w][g][dim];
    a.part_o[((int64_t(b) * a.Hq + hq0 + g) * a.n_splits + split) * D + dim] = acc;
  }
}

// Combines the splits of one (sequence, query head): kMergeWarps warps stride over the
// splits, each lane owning D/32 dims, then the warps merge in shared memory. Dense at batch
// 1 has only Hq blocks over 256-512 splits: 16 warps with 4 loads in flight each keep the
// serial round trips per warp at <= 8.
constexpr int kMergeWarps = 16;
template <int D>
__global__ void __launch_bounds__(kMergeWarps * 32)
    merge_kernel(const float* __restrict__ part_o, const float* __restrict__ part_ml, int n_splits,
                 int pages_per_split, int H, int cap_tokens, int sel_cap,
                 const int32_t* __restrict__ seq_lens, const int32_t* __restrict__ sel_counts,
                 OutBuf out, float* __restrict__ lse) {
  constexpr int E = D / 32;  // dims per lane
  __shared__ float sm[kMergeWarps], sl[kMergeWarps], sacc[kMergeWarps][D];
  const int hq = blockIdx.x, b = blockIdx.y, Hq = gridDim.x;
  const int G = Hq / H;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  // Same validity rule as attn_kernel: a row with an invalid length or count reads no split
  // and is written as NaN (docs/bad_input.md).
  const int len = seq_lens[b];
  const int cnt = sel_counts ? sel_counts[int64_t(b) * H + hq / G] : (len + 15) / 16;
  const bool row_ok =
      len >= 1 && len <= cap_tokens && cnt >= 0 && cnt <= (sel_counts ? sel_cap : cap_tokens);
  const int total = row_ok ? cnt : 0;
  const int used = (total + pages_per_split - 1) / pages_per_split;
  const int64_t prow = (int64_t(b) * Hq + hq) * n_splits;
  float m = kNegInf, l = 0.f, acc[E];
#pragma unroll
  for (int e = 0; e < E; ++e) acc[e] = 0.f;
#pragma unroll 4
  for (int s = warp; s < used; s += kMergeWarps) {
    const float ms = part_ml[(prow + s) * 2], ls = part_ml[(prow + s) * 2 + 1];
    float o[E];
    const float* src = part_o + (prow + s) * D + lane * E;
    if constexpr (E == 8) {
      const float4 v = *reinterpret_cast<const float4*>(src);
      const float4 w = *reinterpret_cast<const float4*>(src + 4);
      o[0] = v.x, o[1] = v.y, o[2] = v.z, o[3] = v.w;
      o[4] = w.x, o[5] = w.y, o[6] = w.z, o[7] = w.w;
    } else if constexpr (E == 4) {
      const float4 v = *reinterpret_cast<const float4*>(src);
      o[0] = v.x, o[1] = v.y, o[2] = v.z, o[3] = v.w;
    } else {
      const float2 v = *reinterpret_cast<const float2*>(src);
      o[0] = v.x, o[1] = v.y;
    }
    const float mn = fmaxf(m, ms);
    const float fo = m == kNegInf ? 0.f : exp2f(m - mn), fn = ms == kNegInf ? 0.f : exp2f(ms - mn);
    l = l * fo + ls * fn;
#pragma unroll
    for (int e = 0; e < E; ++e) acc[e] = acc[e] * fo + o[e] * fn;
    m = mn;
  }
  if (lane == 0) sm[warp] = m, sl[warp] = l;
#pragma unroll
  for (int e = 0; e < E; ++e) sacc[warp][lane * E + e] = acc[e];
  __syncthreads();
  float mx = kNegInf;
#pragma unroll
  for (int w = 0; w < kMergeWarps; ++w) mx = fmaxf(mx, sm[w]);
  // A warp's weight is 0 when it saw no logit above -inf; multiplied, not skipped, so that a
  // NaN sum or output from all-NaN logits still reaches the result (NaN policy, as the other
  // merges do; identical for finite values).
  float fw[kMergeWarps];
  float lt = 0.f;
#pragma unroll
  for (int w = 0; w < kMergeWarps; ++w) {
    fw[w] = sm[w] == kNegInf ? 0.f : exp2f(sm[w] - mx);
    lt += sl[w] * fw[w];
  }
  for (int dim = threadIdx.x; dim < D; dim += blockDim.x) {
    float a = 0.f;
#pragma unroll
    for (int w = 0; w < kMergeWarps; ++w) a += sacc[w][dim] * fw[w];
    store_out(out, (int64_t(b) * Hq + hq) * D + dim, row_ok ? a / lt : __int_as_float(0x7fc00000));
  }
  if (threadIdx.x == 0 && lse)
    lse[int64_t(b) * Hq + hq] = row_ok ? (mx + log2f(lt)) * kLn2 : __int_as_float(0x7fc00000);
}

// MT = m-tiles of 8 heads (x hi / lo) per block: 1 for slices of <= 8 heads, else 2.
// QV: the query in any dtype and row stride (a.q16), else contiguous fp32 (a.q).
template <typename T, int D, bool QV>
void launch_tq(const AttnArgs& a, dim3 grid, cudaStream_t st) {
  if (D == 256 || a.gw <= 8)
    launch_kernel(attn_kernel<T, D, 1, QV>, grid, dim3(kWarps * 32), attn_smem(D), st, a);
  else if constexpr (D != 256)
    launch_kernel(attn_kernel<T, D, 2, QV>, grid, dim3(kWarps * 32), attn_smem(D), st, a);
}
template <typename T, int D>
void launch_t(const AttnArgs& a, dim3 grid, cudaStream_t st) {
  if (a.q != nullptr)
    launch_tq<T, D, false>(a, grid, st);
  else
    launch_tq<T, D, true>(a, grid, st);
}

template <typename T, int D, bool QV = false>
const void* attn_kernel_for(int G) {
  if constexpr (D == 256) {
    return (const void*)attn_kernel<T, D, 1, QV>;
  } else {
    return attn_slices(D, G).width <= 8 ? (const void*)attn_kernel<T, D, 1, QV>
                                        : (const void*)attn_kernel<T, D, 2, QV>;
  }
}

template <typename T, bool QV = false>
const void* attn_kernel_for(int head_dim, int G) {
  return head_dim == 256   ? attn_kernel_for<T, 256, QV>(G)
         : head_dim == 128 ? attn_kernel_for<T, 128, QV>(G)
                           : attn_kernel_for<T, 64, QV>(G);
}

}  // namespace

void prepare_attention_kernels() {
  for (int d : limits::kHeadDims)
    for (int g : {1, 16})
      for (const void* f :
           {attn_kernel_for<__nv_bfloat16>(d, g), attn_kernel_for<__half>(d, g),
            attn_kernel_for<__nv_bfloat16, true>(d, g), attn_kernel_for<__half, true>(d, g)})
        LOCKS_CUDA_CHECK(
            cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, attn_smem(d)));
}

int attention_head_slices(int head_dim, int group) { return attn_slices(head_dim, group).n; }

int attention_blocks_per_sm(DType dtype, int head_dim, int group) {
  const void* f = dtype == DType::f16 ? attn_kernel_for<__half>(head_dim, group)
                                      : attn_kernel_for<__nv_bfloat16>(head_dim, group);
  int n = 0;
  LOCKS_CUDA_CHECK(
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, f, kWarps * 32, attn_smem(head_dim)));
  return std::max(n, 1);
}

void launch_attention(const KvCacheView& cache, const BatchView& batch, QIn q, int Hq, float scale,
                      const Selection* sel, int pps, int n_splits, float* part_o, float* part_ml,
                      OutBuf out, float* lse, cudaStream_t st) {
  const CacheLayout& L = cache.layout;
  AttnArgs a{cache.k, cache.v, L.num_kv_heads, Hq, L.num_blocks, cache.block_step(),
             batch.block_table, batch.block_table_stride, batch.max_blocks_per_seq * 16,
             batch.seq_lens, sel ? sel->pages : nullptr, sel ? sel->counts : nullptr,
             sel ? sel->capacity : 0, pps, n_splits, 1, 1,
             // a contiguous fp32 query takes the fp32 instance (q), any other the general one
             contiguous_f32(q, Hq, L.head_dim) ? static_cast<const float*>(q.p) : nullptr,
             scale * kLog2e, part_o, part_ml, q};
  const int used = sel ? ceil_div(sel->capacity, pps) : ceil_div(batch.max_blocks_per_seq, pps);
  LOCKS_REQUIRE(used <= n_splits, "attention splits ", used, " exceed the plan's ", n_splits);
  const HeadSlices hsl = attn_slices(L.head_dim, Hq / L.num_kv_heads);
  a.n_sl = hsl.n;
  a.gw = hsl.width;
  // KV heads (and their head slices) vary fastest across the grid: the blocks in flight then
  // read all heads of the same pages, i.e. whole contiguous blocks of the cache, not 256-byte
  // rows 2 KB apart.
  const dim3 grid(unsigned(L.num_kv_heads * hsl.n), unsigned(used), unsigned(batch.batch_size));
  auto by_dim = [&](auto tag) {
    using T = decltype(tag);
    if (L.head_dim == 256)
      launch_t<T, 256>(a, grid, st);
    else if (L.head_dim == 128)
      launch_t<T, 128>(a, grid, st);
    else
      launch_t<T, 64>(a, grid, st);
  };
  if (L.dtype == DType::bf16)
    by_dim(__nv_bfloat16{});
  else
    by_dim(__half{});
  const dim3 mgrid(unsigned(Hq), unsigned(batch.batch_size));
  const int32_t* counts = sel ? sel->counts : nullptr;
  auto merge = [&](auto kernel) {
    launch_kernel(kernel, mgrid, dim3(kMergeWarps * 32), 0, st, part_o, part_ml, n_splits, pps,
                  L.num_kv_heads, batch.max_blocks_per_seq * 16, sel ? sel->capacity : 0,
                  batch.seq_lens, counts, out, lse);
  };
  if (L.head_dim == 256)
    merge(merge_kernel<256>);
  else if (L.head_dim == 128)
    merge(merge_kernel<128>);
  else
    merge(merge_kernel<64>);
}

}  // namespace locks::cuda::detail
