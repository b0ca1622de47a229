// GQA aggregation and top-k page selection in one launch (selection alone from the group
// scores with 16 blocks a row), for grids that leave most of the GPU idle (batch 1-8 at 32K-1M
// tokens), where the two-stage path's four launches (LSE, aggregation, selection stages 1 and 2)
// and their dependent round trips, not bytes, set the time (v17, docs/cuda_notes.md).
//
// One thread-block cluster of `cs` blocks (1-16) per (KV head, sequence); block c owns pages
// [c * span, (c + 1) * span) of the row's full pages (span = ceil(full / cs) <= kSelectChunk,
// keys in shared memory). Each
// block: the LSEs of its share of the G heads from the scoring partials (lse_kernel's
// order: the same bits), pushed to every block, the group scores of its pages
// (aggregate_kernel's arithmetic: the same bits, also written to group_scores), then a radix select
// over the whole row with one 256-bin histogram per block per digit pass, added into every
// block's sum of that pass (red.async, cluster_push.cuh), and a stable compaction whose offsets
// are the counts of the lower-ranked blocks (pushed too). Same rules and ties as select.cu
// (lowest index among equal keys), so the same list.
#include <cooperative_groups.h>

#include <type_traits>

#include "aggregate_common.cuh"
#include "cluster_launch.cuh"
#include "cluster_push.cuh"
#include "cluster_radix.cuh"
#include "kernels.cuh"
#include "locks/error.h"
#include "select_common.cuh"

namespace cg = cooperative_groups;

namespace locks::cuda::detail {
namespace {

constexpr int kHeadGroups = kThreads / 128;  // heads whose LSE a block reduces at once

// The head LSEs' receive buffer and barrier (the radix exchanges: cluster_radix.cuh; Radix:
// with or without the gather's buffers).
template <typename Radix>
struct ClusterSmem {
  uint32_t keys[kSelectChunk];
  uint64_t lse_bar;
  Radix radix;
  float lse[kMaxGroup];  // every head's LSE, pushed by the block that reduced it
  float part_m[kHeadGroups][4], part_l[kHeadGroups][4];
};

struct ClusterArgs {
  const float* hs;         // head scores [B, Hq, M]
  const float* chunk_lse;  // [B, Hq, n_chunks, 2]
  int n_chunks, n_used, Hq, M, P, span, cap;
  SelectConfig cfg;
  const int32_t* seq_lens;
  float* head_lse;  // [B, Hq]
  float* gs;        // [B, Hkv, M]
  int32_t* pages;   // [B, Hkv, cap]
  int32_t* counts;  // [B, Hkv]
};

// kFused: the GQA aggregation here (kG >= G: registers for a page's head scores, 8, 16 or
// 32); otherwise the group scores are read from a.gs (aggregate_kernel ran first).
// Every exchange between the blocks is pushed (v24): the head LSEs, each radix pass's
// digit counts (red.async adds into every peer's sum buffer of that pass) and the candidate
// counts. The one ordering cluster barrier, at the start, publishes the mbarriers'
// initialisation and the cleared buffers; two relaxed ones keep blocks from exiting while
// their pushes may be in flight.
template <int kG, bool kFused>
__global__ void __launch_bounds__(kThreads, 2) aggregate_select_cluster(ClusterArgs a) {
  // The gather (cluster_radix.cuh) only where the group scores come from the separate
  // aggregation (16 blocks of up to 4096 pages a row): it costs the smaller fused clusters.
  using Radix = std::conditional_t<kFused, ClusterRadix, ClusterRadixGather>;
  __shared__ SelectSmem sm;
  __shared__ ClusterSmem<Radix> cs;
  const cg::cluster_group cluster = cg::this_cluster();
  const int rank = int(cluster.block_rank()), n_ranks = int(cluster.num_blocks());
  const int h = blockIdx.y, b = blockIdx.z, Hkv = gridDim.y, G = a.Hq / Hkv;
  const int64_t row = int64_t(b) * Hkv + h;
  // st.async / red.async need a peer (a cluster of >= 2 blocks): one block keeps its
  // values in place instead.
  const bool solo = n_ranks == 1;

  cluster_radix_init(cs.radix);
  if (threadIdx.x == 0) {
    push_barrier_init(&cs.lse_bar);
    push_barrier_fence_init();
  }
  __syncthreads();
  cluster.barrier_arrive();  // inits and cleared buffers published; waited for before any push

  const int len = a.seq_lens[b];
  // The plan's split of the row: block c, pages [c span, (c + 1) span) of M.
  const int js0 = rank * a.span, js1 = min(a.M, js0 + a.span);
  // This block's pages, [j0, j1): the plan's split where every block holds some of the row's
  // full pages; else (a row much shorter than the plan's M: a vLLM engine's max_model_len, a
  // ragged batch) the row's own full pages shared evenly, so that the cluster's blocks stay
  // busy instead of leaving the row to the first few (at 128K tokens in a 1M plan, 2 of 16
  // blocks of 4096 pages). Ranks own contiguous ranges in rank order either way, so the
  // compaction's offsets and the list are the same. Computed after the LSE phase in the fused
  // kernel: computed first (4dcbfa4), its divide waited for the length's load and put the
  // partials' loads ~50 instructions later in the SASS. Still, full rows at G 16 cost +0.9 us
  // either way against the plan's split alone (GLM-4-9B 128K b1 / b8, H100, 2026-12-07;
  // Llama-3.1-8B's rows went back to even here); the cause is not found.
  Rules r;
  int j0 = 0, j1 = 0;
  const auto split = [&] {
    r = rules_for(len, a.P, a.M, a.cfg);
    const bool by_plan = r.full > (n_ranks - 1) * a.span;
    const int span = by_plan ? a.span : (r.full + n_ranks - 1) / n_ranks;
    j0 = by_plan ? js0 : min(rank * span, r.full);
    j1 = min(r.full, j0 + span);
    return by_plan;
  };
  float* grow = a.gs + row * a.M;
  if constexpr (kFused) {
    // 1. Head LSEs: block q reduces heads q, q + cs, ... (n_used partials each, lse_kernel's
    // order) and pushes each to every block.
    if (threadIdx.x == 0 && !solo) push_expect(&cs.lse_bar, uint32_t(G) * 4u);
    // The head scores of this thread's first two pages are loaded now, in flight while the
    // LSEs are reduced and exchanged (at G <= 8 the registers allow it; 16 and 32 load later).
    // They are the plan's split's pages, loaded before the length is known: past the row's full
    // pages they may be stale (the step's scorer does not write there) and go unused.
    const float* hrow0 = a.hs + (int64_t(b) * a.Hq + h * G) * a.M;
    constexpr bool kEarly = kG <= 8;
    float x0[kEarly ? kG : 1], x1[kEarly ? kG : 1];
    const int jf = js0 + int(threadIdx.x), jf2 = jf + kThreads;
    if constexpr (kEarly) {
      if (jf < js1) {
        load_head_scores<kG>(hrow0 + jf, a.M, G, x0);
        load_head_scores<kG>(hrow0 + min(jf2, js1 - 1), a.M, G, x1);
      }
    }
    bool waited = false;
    for (int g0 = rank * kHeadGroups; g0 < G; g0 += n_ranks * kHeadGroups) {
      const int g = g0 + int(threadIdx.x) / 128, t = int(threadIdx.x) % 128, slot = g - g0;
      const int64_t hrow = int64_t(b) * a.Hq + h * G + g;
      if (g < G)
        head_lse_partial(a.chunk_lse + hrow * a.n_chunks * 2, a.n_used, t, cs.part_m[slot],
                         cs.part_l[slot]);
      __syncthreads();
      if (!waited) cluster.barrier_wait(), waited = true;
      if (g < G && t < n_ranks) {  // thread t pushes head g's LSE to block t
        const float v = head_lse_final(cs.part_m[slot], cs.part_l[slot]);
        if (t == 0) a.head_lse[hrow] = v;
        if (solo)
          cs.lse[g] = v;
        else
          push_store(peer(cluster, reinterpret_cast<uint32_t*>(&cs.lse[g]), t), __float_as_uint(v),
                     peer(cluster, &cs.lse_bar, t));
      }
      __syncthreads();
    }
    if (!waited) cluster.barrier_wait();
    if (!solo) push_wait(&cs.lse_bar, 0);

    // 2. Group scores of this block's pages, written out and kept as keys for the
    // candidates; two pages a thread at a time, both pages' loads in flight together.
    const bool by_plan = split();
    for (int j = j0 + int(threadIdx.x); j < j1; j += 2 * kThreads) {
      const int j2 = j + kThreads;
      float s0, s1;
      bool loaded = false;  // this iteration's head scores already in registers
      if constexpr (kEarly) {
        if (by_plan && j == jf) {
          s0 = group_score_of<kG>(x0, cs.lse, G);
          s1 = group_score_of<kG>(x1, cs.lse, G);
          loaded = true;
        }
      }
      if (!loaded) {
        s0 = group_score_batched<kG>(hrow0 + j, a.M, cs.lse, G);
        s1 = group_score_batched<kG>(hrow0 + min(j2, j1 - 1), a.M, cs.lse, G);
      }
      grow[j] = s0;
      cs.keys[j - j0] = float_key(s0);
      if (j2 < j1) {
        grow[j2] = s1;
        cs.keys[j2 - j0] = float_key(s1);
      }
    }
    // Past the row's full pages: -inf (score_pages' head scores there are -inf, so this is what
    // the aggregation gives; the step's scorer does not write them), without loading them; split
    // over the blocks.
    const int tail = (a.M - r.full + n_ranks - 1) / n_ranks;
    const int t0 = r.full + rank * tail, t1 = min(a.M, t0 + tail);
    for (int j = t0 + int(threadIdx.x); j < t1; j += kThreads) grow[j] = kNegInf;
  } else {
    split();
    // Only the candidates' keys are read below (pages [sink_end, recent_start)).
    const int jk = min(j1, r.recent_start);
    for (int j = j0 + int(threadIdx.x); j < jk; j += kThreads) cs.keys[j - j0] = float_key(grow[j]);
    cluster.barrier_wait();
  }
  // Every push addressed to this block so far (the LSEs) has landed.
  cluster_arrive_relaxed();
  int32_t* out = a.pages + row * a.cap;
  // Cluster-uniform from here on (r depends only on the sequence): every block takes the
  // same branches and makes the same pushes.
  if (r.all) {
    if (rank == 0) write_all_pages(r, a.cap, out, a.counts + row);
    cluster_wait();
    return;
  }
  const int n_cand = r.recent_start - r.sink_end;  // candidates: pages [sink_end, recent_start)
  const int slots = max(r.slots, 0);
  if (slots == 0 || n_cand <= 0) {
    if (rank == 0) write_list(r, 0, a.cap, out, a.counts + row);
    cluster_wait();
    return;
  }
  const int lo = max(j0, r.sink_end), hi = min(j1, r.recent_start);
  const int n = max(hi - lo, 0);  // this block's candidates: keys[lo - j0, hi - j0)
  const uint32_t* keys = cs.keys + (lo - j0);
  __syncthreads();
  auto key_of = [&](int e, bool& valid) {
    valid = true;
    return keys[e];
  };

  // 3. Radix select over the row: T and how many keys == T to take (Threshold::bound: the
  // passes stop once the current bin is taken whole). A pass's counts are pushed to every
  // block (cleared before the start barrier: no buffer is reused); in the unfused kernel
  // (Radix = ClusterRadixGather), where the first pass's bin is small, its keys are gathered
  // into every block, which also gives the offsets.
  const bool take_all = n_cand <= slots;
  ClusterSplit sp;
  if (!take_all) sp = cluster_radix_threshold(cluster, solo, key_of, n, slots, sm, cs.radix);
  const uint32_t T = sp.T;
  const int need_eq = sp.need_eq;

  // 4. Offsets: the candidates > T and == T of the lower-ranked blocks (from the gather, or
  // each block pushes its count to every block).
  uint32_t gt0 = sp.gt0, eq0 = sp.eq0;
  if (sp.offsets) {
    cluster_wait();            // (the relaxed arrive above: long since met)
    cluster_arrive_relaxed();  // every push addressed to this block has landed
  } else {
    uint32_t own = 0;
    for (int e = threadIdx.x; e < n; e += kThreads) {
      const uint32_t k = keys[e];
      own += (take_all || k > T) ? 1u : (k == T ? 1u << 16 : 0u);
    }
    uint32_t pre, agg;
    Scan(sm.scan).ExclusiveSum(own, pre, agg);  // per-block totals fit 16 bits (span <= 4096)
    cluster_wait();                             // (the relaxed arrive above: long since met)
    cluster_lower_counts(cluster, solo, agg, cs.radix, gt0, eq0);
    cluster_arrive_relaxed();  // every push addressed to this block has landed
  }
  __syncthreads();  // Scan storage reuse
  compact(
      key_of, n, take_all, T, need_eq, sm, [&](int e, int pos) { out[r.sink_end + pos] = lo + e; },
      gt0, eq0);
  if (rank == 0) write_list(r, take_all ? n_cand : slots, a.cap, out, a.counts + row);
  cluster_wait();  // no block exits while a push it issued may be in flight
}

// Whether clusters of cs blocks of the kernel that size launches (the fused one up to 8
// blocks, the gather's above) can be co-resident on this device (the non-portable sizes above
// 8 depend on the GPC layout).
bool cluster_fits(int cs) {
  const ClusterLaunch cl(dim3(unsigned(cs)), cs, nullptr);
  int n = 0;
  return cudaOccupancyMaxActiveClusters(&n,
                                        select_cluster_fused(cs)
                                            ? aggregate_select_cluster<kMaxGroup, true>
                                            : aggregate_select_cluster<1, false>,
                                        &cl.lc) == cudaSuccess &&
         n > 0;
}

}  // namespace

int select_cluster_size(int64_t max_pages, int64_t rows, int group, int sms, int forced) {
  const int64_t need = (max_pages + kSelectChunk - 1) / kSelectChunk;  // fewest blocks a row
  if (forced < 0) return 0;
  if (forced > 0) {
    LOCKS_REQUIRE(forced <= kMaxSelectCluster && (forced & (forced - 1)) == 0,
                  "select_cluster must be -1, 0 or a power of two up to ", kMaxSelectCluster,
                  ", got ", forced);
    LOCKS_REQUIRE(forced >= need, "select_cluster ", forced, " blocks of at most ", kSelectChunk,
                  " pages cannot hold ", max_pages, " pages a sequence");
    LOCKS_REQUIRE(cluster_fits(forced), "a cluster of ", forced,
                  " selection blocks cannot be resident on this device");
    return forced;
  }
  if (need > kMaxSelectCluster) return 0;  // over 16 x 4096 pages (1M tokens): two stages
  int cs = 1;
  while (cs < need) cs *= 2;
  if (!cluster_fits(cs)) return 0;
  // Large grids are parallel enough for the two-stage path (its first stage already has
  // many blocks); the one-launch kernel is for grids of up to about a wave.
  if (rows * cs > 2 * int64_t(sms)) return 0;
  // More blocks per row while the grid stays within a wave and each keeps >= 512 pages.
  while (cs < 8 && rows * cs * 2 <= sms && max_pages / (cs * 2) >= 512 && cluster_fits(cs * 2))
    cs *= 2;
  // Then 16 (not fused: the separate aggregation's group scores, v31) where a block of 8 would
  // still hold >= 4096 pages and the grid stays within a wave, or >= 2048 pages at GQA groups
  // >= 8 (a page's G head scores are the aggregation's work) within half a wave. Same-run A/B
  // on the H200 (2026-12-04, docs/cuda_notes.md v31): GLM-4-9B (G 16) 512K b1 82.7 -> 68.4 us
  // a step, b4 184.9 -> 175.8, 256K b1 60.5 -> 56.1, b2 72.3 -> 67.3; Llama-3.1-70B TP8 (G 8)
  // 512K b1 53.2 -> 44.9; Llama-3.1-8B (G 4) 512K b1 120.5 -> 117.6. Where they lose: 1024
  // pages a block (GLM 128K b1, +1.4 us), G 4 at 2048 (Llama 256K b1, +1.3), 8 rows at 2048
  // (Llama-3.1-70B TP8 256K b8, +1.6).
  const int64_t per8 = (max_pages + 7) / 8;
  if (cs == 8 && cluster_fits(16) &&
      ((per8 >= 4096 && rows * 16 <= sms) || (per8 >= 2048 && group >= 8 && rows * 32 <= sms)))
    cs = 16;
  return cs;
}

void prepare_select_kernels() {
  for (auto* k : {aggregate_select_cluster<8, true>, aggregate_select_cluster<16, true>,
                  aggregate_select_cluster<kMaxGroup, true>, aggregate_select_cluster<1, false>})
    LOCKS_CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
}

void launch_aggregate_select(const float* head_scores, const float* chunk_lse, int n_chunks,
                             int chunk_pages, const BatchView& batch, int Hq, int Hkv,
                             const SelectConfig& cfg, int P, int cluster, float* head_lse,
                             float* group_scores, const Selection& out, cudaStream_t st) {
  const int M = batch.max_blocks_per_seq;
  LOCKS_REQUIRE(
      cluster >= 1 && cluster <= kMaxSelectCluster && int64_t(cluster) * kSelectChunk >= M,
      "selection cluster of ", cluster, " blocks for ", M, " pages");
  ClusterArgs a{head_scores,
                chunk_lse,
                n_chunks,
                ceil_div(M, chunk_pages),
                Hq,
                M,
                P,
                ceil_div(M, cluster),
                out.capacity,
                cfg,
                batch.seq_lens,
                head_lse,
                group_scores,
                out.pages,
                out.counts};
  const ClusterLaunch cl(dim3(unsigned(cluster), unsigned(Hkv), unsigned(batch.batch_size)),
                         cluster, st);
  // Up to 8 blocks a row (512K tokens) the aggregation runs inside; with 16 (1M tokens), the
  // fused form measured no faster for G 4 and slower for G 16 (GLM 1M batch 1: step 119 ->
  // 127 us, v17 in docs/cuda_notes.md: 32 blocks reduce 16 heads x 4096 pages each), so the
  // wide aggregation kernel runs first and the cluster selects from its group scores.
  if (!select_cluster_fused(cluster)) {
    launch_aggregate(head_scores, chunk_lse, n_chunks, chunk_pages, batch, Hq, Hkv, head_lse,
                     group_scores, st);
    LOCKS_CUDA_CHECK(cudaLaunchKernelEx(&cl.lc, aggregate_select_cluster<1, false>, a));
    return;
  }
  const int G = Hq / Hkv;
  LOCKS_CUDA_CHECK(cudaLaunchKernelEx(&cl.lc,
                                      G <= 8    ? aggregate_select_cluster<8, true>
                                      : G <= 16 ? aggregate_select_cluster<16, true>
                                                : aggregate_select_cluster<kMaxGroup, true>,
                                      a));
}

}  // namespace locks::cuda::detail
