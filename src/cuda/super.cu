// The two-level step's group choice (super_summary.h, decode_two_level in decoder.cu; level 1
// is super_score.cu):
//   select_groups_list: the group choice as a page list, a thread-block cluster of 1-8 blocks
//     per (sequence, KV head), each over a span of the row's groups (one block held a whole
//     row until v26: 21 us at 1M batch 1 on 8 of 132 SMs): share-averaging over the G heads,
//     the m best non-forced groups by the cluster radix threshold (cluster_radix.cuh) and
//     stable compaction (ties to the lower index), then the list of the kept groups' pages
//     (ascending) and the open group; optionally the listed pages' block ids (the level-2
//     scorer's per-head block table);
//   map_positions: the selection over list positions back to logical pages.
// The rules (forced groups, kept count, fallbacks) restate super_layout.cpp's on the device.
#include <cooperative_groups.h>

#include <algorithm>
#include <cmath>

#include "aggregate_common.cuh"
#include "cluster_launch.cuh"
#include "cluster_push.cuh"
#include "cluster_radix.cuh"
#include "common.cuh"
#include "kernels.cuh"
#include "locks/error.h"
#include "locks/rules.h"
#include "locks/super_summary.h"
#include "select_common.cuh"
#include "super.cuh"

namespace cg = cooperative_groups;

namespace locks::cuda::detail {
namespace {

constexpr int kMaxGroupCluster = 8;  // blocks a row of the group choice (portable clusters)

// The rules of super_layout.cpp for one sequence, on the device.
struct ListRules {
  int len, n_pages, C, first_end, recent_begin, F, m;  // m < 0: fallback (every page)
};

__device__ ListRules list_rules(int raw_len, int P, int S, int M, const SelectConfig& sel,
                                const TwoLevelConfig& cfg) {
  ListRules r;
  r.len = rules::trusted_len(raw_len, M, P);
  const int full = rules::full_pages(r.len, P);
  r.n_pages = rules::num_pages(r.len, P);
  r.C = full / S;
  const int listed = r.C * S;
  const int sink_end = min(min(max(sel.sink_pages, 0), full), listed);
  r.first_end = min(r.C, max(cfg.first_groups, (sink_end + S - 1) / S));
  const int recent_start = max(0, full - max(sel.recent_pages, 0));
  r.recent_begin = sel.recent_pages > 0 && recent_start < listed ? recent_start / S : r.C;
  r.F = r.first_end + (r.C - r.recent_begin) - max(0, r.first_end - r.recent_begin);
  r.m = -1;
  if (r.len == 0 || rules::selects_all(sel.budget_tokens, r.len, sel.dense_below) ||
      r.C < cfg.flat_below_groups)
    return r;
  const double want = ceil(cfg.alpha * double(rules::budget_pages(sel.budget_tokens, P)) / S);
  if (want >= r.C) return r;
  const int m = max(cfg.min_groups, int(want));
  if (m + r.F >= r.C) return r;
  r.m = m;
  return r;
}

// Groups a slice: the unit of the head LSE partials. Each slice's (max, sum) per head is
// reduced in a fixed order and the slices are merged in index order, so the LSEs, the group
// scores and the list are the same bits for every cluster size.
constexpr int kSlice = 256;
constexpr int kSlicesPerPass = kThreads / kSlice;
constexpr int kSpanMax = 4096;  // groups a block holds (keys and kept offsets in shared memory)

struct ChoiceArgs {
  const float* gh;  // [B, Hq, MG] level-1 scores
  int MG, M, Hq, P, S, L, slices_per_block;
  const int32_t* seq_lens;
  const int32_t* block_table;
  int64_t bt_stride;
  SelectConfig sel;
  TwoLevelConfig cfg;
  int32_t* page_map;     // [B, H, L]
  int32_t* list_lens;    // [B]
  int32_t* list_blocks;  // [B, H, L] or null
};

template <int kG>
struct ChoiceSmem {
  uint32_t keys[kSpanMax];  // this block's share-averaged group scores as keys
  uint16_t kept[kSpanMax];  // this block's kept groups (offsets from its first), in order
  uint64_t lse_bar;
  ClusterRadix radix;
  float2 wpart[kThreads / 32][kG];  // a warp's (max, sum) per head of the current slices
  float lse[kG];
};

// The group choice of one (sequence, KV head) over a cluster of blocks (1-8): block c owns
// the slices [c spb, (c + 1) spb) of the row's complete groups. Each block: its slices' head
// LSE partials, pushed to every block (dynamic shared memory, [slices][G] float2); the heads'
// LSEs; its groups' share-averaged scores a_j = log((1/G) sum_h exp(s_hj - LSE_h)) as keys;
// the m best non-forced groups of the row by the cluster radix threshold (ties to the lower
// index); the kept groups' list positions (the forced ones and those above / at the
// threshold, offset by the lower-ranked blocks' counts); their pages, written by the block.
// The open group's pages, the -1 padding and a fallback's list are spread over the cluster.
template <int kG>
__global__ void __launch_bounds__(kThreads, 1) group_choice_kernel(ChoiceArgs a) {
  __shared__ SelectSmem sm;
  __shared__ ChoiceSmem<kG> cs;
  extern __shared__ float2 part[];  // [n_slices][G] (max, sum)
  const cg::cluster_group cluster = cg::this_cluster();
  const int rank = int(cluster.block_rank()), n_ranks = int(cluster.num_blocks());
  const bool solo = n_ranks == 1;
  const int h = blockIdx.y, b = blockIdx.z, H = gridDim.y, G = a.Hq / H;
  const int tid = int(threadIdx.x), warp = tid >> 5, lane = tid & 31;
  cluster_radix_init(cs.radix);
  if (tid == 0) {
    push_barrier_init(&cs.lse_bar);
    push_barrier_fence_init();
  }
  __syncthreads();
  cluster.barrier_arrive();  // inits published; waited for before any push

  const int64_t row = int64_t(b) * H + h;
  int32_t* map = a.page_map + row * a.L;
  int32_t* blk = a.list_blocks ? a.list_blocks + row * a.L : nullptr;
  const int32_t* bt = a.block_table ? a.block_table + int64_t(b) * a.bt_stride : nullptr;
  const ListRules r = list_rules(a.seq_lens[b], a.P, a.S, a.M, a.sel, a.cfg);
  auto put = [&](int i, int page) {
    map[i] = page;
    if (blk) blk[i] = bt[page];
  };
  const int S = a.S, stride = n_ranks * kThreads, first = rank * kThreads + tid;
  int listed;
  if (r.m < 0) {  // fallback: every page (none for an invalid length or a list too short)
    cluster.barrier_wait();
    listed = r.n_pages <= a.L ? r.n_pages : 0;
    for (int i = first; i < listed; i += stride) put(i, i);
  } else {
    // 1. Head LSE partials of this block's slices: lane values of a head reduced per warp
    // (max, then the sum of exp), the slice's 8 warps merged in order by thread (slice, head),
    // which pushes the partial to every block.
    const int n_sl = (r.C + kSlice - 1) / kSlice;
    const int sl_begin = min(rank * a.slices_per_block, n_sl);
    const int sl_end = min(sl_begin + a.slices_per_block, n_sl);
    const int j0 = sl_begin * kSlice, n_local = max(min(r.C, sl_end * kSlice) - j0, 0);
    const float* s0 = a.gh + (int64_t(b) * a.Hq + int64_t(h) * G) * a.MG;
    if (tid == 0 && !solo) push_expect(&cs.lse_bar, uint32_t(n_sl * G) * 8u);
    cluster.barrier_wait();
    float x0[kG];  // the first pass's scores, kept for the group scores
    for (int sl0 = sl_begin; sl0 < sl_end; sl0 += kSlicesPerPass) {
      const int j = sl0 * kSlice + tid;
      float x[kG];
#pragma unroll
      for (int g = 0; g < kG; ++g)
        x[g] = g < G && j < j0 + n_local ? s0[int64_t(g) * a.MG + j] : kNegInf;
#pragma unroll
      for (int g = 0; g < kG; ++g) {
        if (sl0 == sl_begin) x0[g] = x[g];
        if (g >= G) continue;
        const float m = warp_max(x[g]);
        const float l = warp_sum(m == kNegInf || x[g] == kNegInf ? 0.0f : __expf(x[g] - m));
        if (lane == 0) cs.wpart[warp][g] = make_float2(m, l);
      }
      __syncthreads();
      for (int i = tid; i < kSlicesPerPass * G; i += kThreads) {
        const int sub = i / G, g = i % G, sl = sl0 + sub;
        if (sl >= sl_end) continue;
        float m = kNegInf, l = 0.0f;
        for (int w = 0; w < kSlice / 32; ++w) {
          const float2 p = cs.wpart[sub * (kSlice / 32) + w][g];
          lse_merge(m, l, p.x, p.y);
        }
        float2* dst = &part[sl * G + g];
        if (solo) {
          *dst = make_float2(m, l);
        } else {
          uint32_t* d = reinterpret_cast<uint32_t*>(dst);
          for (int q = 0; q < n_ranks; ++q) {
            uint64_t* bar = peer(cluster, &cs.lse_bar, q);
            push_store(peer(cluster, d, q), __float_as_uint(m), bar);
            push_store(peer(cluster, d + 1, q), __float_as_uint(l), bar);
          }
        }
      }
      __syncthreads();  // wpart reuse
    }
    if (!solo)
      push_wait(&cs.lse_bar, 0);
    else
      __syncthreads();
    // 2. Each head's LSE over the slices in index order.
    for (int g = tid; g < G; g += kThreads) {
      float m = kNegInf, l = 0.0f;
      for (int sl = 0; sl < n_sl; ++sl) lse_merge(m, l, part[sl * G + g].x, part[sl * G + g].y);
      cs.lse[g] = m == kNegInf ? kNegInf : m + logf(l);
    }
    __syncthreads();
    // 3. This block's group scores as keys (aggregate_common.cuh's arithmetic; the first
    // pass's scores still in registers).
    for (int sl0 = sl_begin; sl0 < sl_end; sl0 += kSlicesPerPass) {
      const int e = (sl0 - sl_begin) * kSlice + tid;
      if (e >= n_local) continue;
      float x[kG];
      if (sl0 == sl_begin) {
#pragma unroll
        for (int g = 0; g < kG; ++g) x[g] = x0[g];
      } else {
        load_head_scores<kG>(s0 + j0 + e, a.MG, G, x);
      }
      cs.keys[e] = float_key(group_score_of<kG>(x, cs.lse, G));
    }
    __syncthreads();
    // 4. The m best non-forced groups of the row.
    auto forced = [&](int e) { return j0 + e < r.first_end || j0 + e >= r.recent_begin; };
    auto key_of = [&](int e, bool& valid) {
      valid = !forced(e);
      return cs.keys[e];
    };
    const ClusterSplit sp =
        cluster_radix_threshold(cluster, solo, key_of, n_local, r.m, sm, cs.radix);
    const uint32_t T = sp.T;
    const int need_eq = sp.need_eq;
    // 5. The kept groups' positions: forced or above T, then the ties at T in index order.
    auto flags_of = [&](int e, bool& gt, bool& eq) {
      const bool f = forced(e);
      const uint32_t k = cs.keys[e];
      gt = f || k > T;
      eq = !f && k == T;
    };
    uint32_t own = 0;
    for (int e = tid; e < n_local; e += kThreads) {
      bool gt, eq;
      flags_of(e, gt, eq);
      own += gt ? 1u : (eq ? 1u << 16 : 0u);
    }
    uint32_t pre, agg;
    Scan(sm.scan).ExclusiveSum(own, pre, agg);  // per-block totals fit 16 bits (span <= 4096)
    uint32_t gt0, eq0;
    cluster_lower_counts(cluster, solo, agg, cs.radix, gt0, eq0);
    __syncthreads();  // Scan storage reuse
    const uint32_t off = gt0 + min(eq0, uint32_t(need_eq));
    const int n_kept = compact_flags(
        flags_of, n_local, need_eq, sm,
        [&](int e, int pos) { cs.kept[pos - int(off)] = uint16_t(e); }, gt0, eq0);
    __syncthreads();
    // 6. Pages: this block's kept groups (ascending), then the open group's, spread.
    for (int i = tid; i < n_kept * S; i += kThreads)
      put(int(off) * S + i, (j0 + cs.kept[i / S]) * S + i % S);
    const int base = (r.m + r.F) * S;
    for (int i = first; i < r.n_pages - r.C * S; i += stride) put(base + i, r.C * S + i);
    listed = base + r.n_pages - r.C * S;
  }
  for (int i = listed + first; i < a.L; i += stride) {
    map[i] = -1;
    if (blk) blk[i] = -1;
  }
  if (h == 0 && rank == 0 && tid == 0)
    a.list_lens[b] = listed == 0 ? 0 : r.len - (r.n_pages - listed) * a.P;
  if (!solo) {  // no block exits while a push it issued may be in flight
    cluster_arrive_relaxed();
    cluster_wait();
  }
}

// Selected list positions -> logical pages, in place (one block per (sequence, KV head)).
__global__ void map_positions_kernel(const int32_t* page_map, int L, int32_t* pages,
                                     const int32_t* counts, int cap) {
  const int64_t row = blockIdx.x;
  const int n = min(max(counts[row], 0), cap);
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const int32_t x = pages[row * cap + i];
    pages[row * cap + i] = x >= 0 && x < L ? page_map[row * L + x] : -1;
  }
}

}  // namespace

// The slice partials' buffer (dynamic shared memory).
size_t group_choice_smem(int max_groups, int G) {
  return sizeof(float2) * size_t(ceil_div(max_groups, kSlice)) * size_t(G);
}

// Static (up to ~35 KB at G 32) + the partials (up to 32 KB: 32K groups at G 32).
constexpr int kChoiceSmemMax = 96 * 1024;

static_assert(sizeof(ChoiceSmem<kMaxGroup>) + sizeof(SelectSmem) +
                      sizeof(float2) * (kMaxGroupCluster * kSpanMax / kSlice) * kMaxGroup <=
                  size_t(kChoiceSmemMax),
              "the group choice's shared memory at the most groups and the widest group");

template <int kG>
void set_choice_attrs() {
  LOCKS_CUDA_CHECK(
      cudaFuncSetAttribute(group_choice_kernel<kG>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           kChoiceSmemMax - int(sizeof(ChoiceSmem<kG>) + sizeof(SelectSmem))));
}

void prepare_super_kernels() {
  set_choice_attrs<4>();
  set_choice_attrs<8>();
  set_choice_attrs<16>();
  set_choice_attrs<kMaxGroup>();
}

int max_list_groups() { return kMaxGroupCluster * kSpanMax; }

bool group_cluster_holds(int cluster, int max_groups) {
  return cluster >= 1 && cluster <= kMaxGroupCluster && (cluster & (cluster - 1)) == 0 &&
         int64_t(cluster) * kSpanMax >= max_groups;
}

int group_cluster_size(int max_groups, int64_t rows, int sms, int forced) {
  const int slices = ceil_div(max_groups, kSlice);
  int need = 1;  // the fewest blocks whose spans hold the row
  while (need * kSpanMax < max_groups) need *= 2;
  LOCKS_REQUIRE(need <= kMaxGroupCluster, "group choice: ", max_groups,
                " groups a sequence, more than ", max_list_groups());
  if (forced > 0) {
    LOCKS_REQUIRE(group_cluster_holds(forced, max_groups),
                  "group_cluster must be 0 or a power of two in [", need, ", ", kMaxGroupCluster,
                  "] for ", max_groups, " groups a sequence, got ", forced);
    return forced;
  }
  // More blocks a row while the grid stays within half a wave and each block keeps a group
  // per thread (2 slices): at 1M tokens (2048 groups of 32 pages) 4 blocks measured 11.2-11.9
  // us at Llama batch 1 against 12.5-12.7 for 8 (and 14.5 against 14.8 at GLM): past one group
  // a thread, more blocks add exchange latency, not parallel work (v26, docs/cuda_notes.md).
  int cs = need;
  while (cs < kMaxGroupCluster && rows * cs * 2 <= sms && slices >= cs * 2 * kSlicesPerPass)
    cs *= 2;
  return cs;
}

void launch_select_groups_list(const float* gh, int MG, const BatchView& batch, int Hq, int H,
                               int P, int S, const SelectConfig& sel, const TwoLevelConfig& cfg,
                               int L, int cluster, int32_t* page_map, int32_t* list_lens,
                               int32_t* list_blocks, cudaStream_t st) {
  LOCKS_REQUIRE(group_cluster_holds(cluster, MG), "select_groups_list: a cluster of ", cluster,
                " blocks for ", MG, " groups");
  const int G = Hq / H;
  ChoiceArgs a{gh,
               MG,
               batch.max_blocks_per_seq,
               Hq,
               P,
               S,
               L,
               ceil_div(ceil_div(MG, kSlice), cluster),
               batch.seq_lens,
               batch.block_table,
               batch.block_table_stride,
               sel,
               cfg,
               page_map,
               list_lens,
               list_blocks};
  const ClusterLaunch cl(dim3(unsigned(cluster), unsigned(H), unsigned(batch.batch_size)), cluster,
                         st, group_choice_smem(MG, G));
  LOCKS_CUDA_CHECK(cudaLaunchKernelEx(&cl.lc,
                                      G <= 4    ? group_choice_kernel<4>
                                      : G <= 8  ? group_choice_kernel<8>
                                      : G <= 16 ? group_choice_kernel<16>
                                                : group_choice_kernel<kMaxGroup>,
                                      a));
}

void launch_map_positions(const int32_t* page_map, int L, const Selection& sel, int64_t rows,
                          cudaStream_t st) {
  launch_kernel(map_positions_kernel, dim3(unsigned(rows)), dim3(128), 0, st, page_map, L,
                sel.pages, sel.counts, sel.capacity);
}

}  // namespace locks::cuda::detail

namespace locks::cuda {

void super_score(const SuperView& supers, const SuperTableView& table, const BatchView& batch,
                 const QueryView& q, float scale, const TwoLevelConfig& cfg,
                 float* group_head_scores, cudaStream_t stream) {
  const SuperLayout& l = supers.layout;
  validate_super_layout(l);
  validate_two_level(cfg);
  LOCKS_REQUIRE(!cfg.use_extent || l.extent, "use_extent needs a super layout with extent");
  LOCKS_REQUIRE(batch.batch_size >= 1 && batch.max_blocks_per_seq >= 1 && batch.seq_lens,
                "super_score: empty batch or null seq_lens");
  LOCKS_REQUIRE(q.q != nullptr && q.num_q_heads >= l.num_kv_heads &&
                    q.num_q_heads % l.num_kv_heads == 0 && dtype_known(q.dtype),
                "super_score: q is null, of an unknown dtype, or num_q_heads ", q.num_q_heads,
                " is not a multiple of num_kv_heads ", l.num_kv_heads);
  LOCKS_REQUIRE(std::isfinite(scale) && scale > 0.0f, "scale must be positive and finite");
  LOCKS_REQUIRE(group_head_scores != nullptr, "group_head_scores is null");
  LOCKS_REQUIRE(supers.mu_q && supers.mu_scale && supers.basis_q && supers.basis_scale &&
                    supers.coord_q && supers.coord_scale && supers.radius_q && supers.radius_scale,
                "super summary arrays are null");
  LOCKS_REQUIRE(!l.extent || (supers.lo_q && supers.hi_q && supers.extent_scale),
                "extent arrays are null");
  const int S = l.group_pages;
  LOCKS_REQUIRE(
      table.table != nullptr &&
          table.max_groups_per_seq >= (batch.max_blocks_per_seq + S - 1) / S &&
          table.stride >= table.max_groups_per_seq,
      "super table is null or holds ", table.max_groups_per_seq,
      " groups, need ceil(max_blocks_per_seq / S) = ", (batch.max_blocks_per_seq + S - 1) / S);
  LOCKS_REQUIRE(q.stride == 0 || q.stride >= int64_t(q.num_q_heads) * l.head_dim,
                "super_score: q.stride ", q.stride, " is below num_q_heads * head_dim");
  detail::launch_super_score(supers, table, batch, detail::q_in(q, l.head_dim), q.num_q_heads,
                             scale, cfg, group_head_scores, stream);
}

void select_groups_list(const float* group_head_scores, const SuperTableView& table,
                        const BatchView& batch, int num_q_heads, int num_kv_heads, int page_size,
                        int group_pages, const SelectConfig& sel, const TwoLevelConfig& cfg,
                        int list_cap, int32_t* page_map, int32_t* list_lens, cudaStream_t stream,
                        int32_t* list_blocks, int cluster) {
  validate_select(sel, page_size);
  validate_two_level(cfg);
  LOCKS_REQUIRE(group_pages >= 2 && group_pages <= 256, "group_pages must be in [2, 256], got ",
                group_pages);
  LOCKS_REQUIRE(num_kv_heads >= 1 && num_q_heads >= num_kv_heads &&
                    num_q_heads % num_kv_heads == 0 &&
                    num_q_heads / num_kv_heads <= detail::kMaxGroup,
                "num_q_heads (", num_q_heads, ") must be a multiple of num_kv_heads (",
                num_kv_heads, "), group <= ", detail::kMaxGroup);
  LOCKS_REQUIRE(batch.batch_size >= 1 && batch.max_blocks_per_seq >= 1 && batch.seq_lens,
                "select_groups_list: empty batch or null seq_lens");
  LOCKS_REQUIRE(group_head_scores && page_map && list_lens, "null argument");
  LOCKS_REQUIRE(!list_blocks || batch.block_table, "list_blocks needs batch.block_table");
  const int S = group_pages, MG = table.max_groups_per_seq;
  LOCKS_REQUIRE(
      MG >= (batch.max_blocks_per_seq + S - 1) / S, "super table holds ", MG,
      " groups, need ceil(max_blocks_per_seq / S) = ", (batch.max_blocks_per_seq + S - 1) / S);
  LOCKS_REQUIRE(
      list_cap >= two_level_list_capacity(cfg, sel, page_size, S, batch.max_blocks_per_seq),
      "list_cap ", list_cap, " < two_level_list_capacity ",
      two_level_list_capacity(cfg, sel, page_size, S, batch.max_blocks_per_seq));
  static const bool prepared = (detail::prepare_super_kernels(), true);
  (void)prepared;
  const int cs = detail::group_cluster_size(MG, int64_t(batch.batch_size) * num_kv_heads,
                                            detail::current_device_sms(), cluster);
  detail::launch_select_groups_list(group_head_scores, MG, batch, num_q_heads, num_kv_heads,
                                    page_size, S, sel, cfg, list_cap, cs, page_map, list_lens,
                                    list_blocks, stream);
}

}  // namespace locks::cuda
