// Two-level ("hierarchical") LOCKS: a second, coarser summary per group of S consecutive
// logical pages of a sequence (a "super-page"), so that a decode step scores the groups,
// then reads the page summaries only inside the best groups (docs/study_hierarchical.md).
//
// Why: at 1M tokens the flat LOCKS step reads every page summary (836 B per 16-token page
// and KV head, 10.2% of bf16 K+V), so no flat scheme passes ~10x fewer bytes than dense.
// The super summary costs about 1/16..1/40 of the page summaries it covers.
//
// The super summary of group G (pages p = 0..S-1 of the group, P keys each), per KV head:
//   M       mean of the group's S*P keys                          int8 [d], one scale
//   W       top-R eigenvectors of the covariance of those keys about M (rows)
//                                                                  int4 [R, d], scale per row
//   a_p     coordinates of page p's centroid: a_p = W (mu_p - M)  int8 [S, R], scale per k
//   r_p     residual radius of page p's centroid: |mu_p - M - W^T a_p|   uint8 [S], one scale
//   extent (optional): per page and k, the min and max over its keys of W_k (k_i - M)
//           lo_p, hi_p                                             int8 [S, R] each, scale per k
// Storage (SoA, slot s = super-page storage id, H = num_kv_heads):
//   mu_q [slots, H, d] int8, mu_scale [slots, H]; basis_q [slots, H, R, d/2] (int4 as in
//   summary.h: low nibble = even dim), basis_scale [slots, H, R]; coord_q [slots, H, S, R],
//   coord_scale [slots, H, R]; radius_q [slots, H, S] uint8, radius_scale [slots, H];
//   lo_q, hi_q [slots, H, S, R] int8, extent_scale [slots, H, R] (extent layouts only).
// Quantization: symmetric round-to-nearest (int8 [-127, 127], int4 [-7, 7]); radii and
// extents round outward (radius up, lo down, hi up) so that a bound survives the codes. A
// zero range gives scale 0 and codes 0.
//
// Estimated log mass of page p under query q (w = W q, |q_perp|^2 = max(|q|^2 - |w|^2, 0)):
//   centroid mode: e_p = log P + scale * (q.M + w.a_p + gamma |q_perp| r_p)
//   extent mode:   e_p = log P + scale * (q.M + sum_k max(w_k hi_pk, w_k lo_pk)
//                                         + gamma |q_perp| r_p)
//   mixed mode (extent + mix): e_p = log(P exp(scale c_p) + exp(scale x_p)), c_p and x_p the
//                                 centroid and extent expressions above (page mass as its
//                                 centroid's plus its best key's bound)
// gamma = 0 is an estimate; gamma = 1 with the extent makes the centroid part an upper bound
// (within quantization) of the best key's in-basis logit. Group score = LSE_p e_p ("lse",
// the group's estimated mass) or max_p e_p ("max", its best page).
//
// Two-level selection per (sequence, KV head), budget b tokens, k = floor(b / P) slots:
//   complete groups C = floor(full_pages / S) have a super summary; the pages after them
//   (the "open" group: at most S - 1 full pages and the tail) have none and are always
//   scored at level 2, like the tail page of flat LOCKS;
//   forced groups (forced_groups): the first `first_groups` groups (attention sinks: real
//   models put much of their mass on the first tokens, which a group's summary dilutes)
//   and the groups holding a sink or a recent page; F of them, a function of the length;
//   kept groups: the forced ones plus the m = max(min_groups, ceil(alpha * k / S)) best of
//   the OTHER complete groups by the GQA share-averaged group score (score.h's rule on
//   groups; ties to the lower index), so every KV head of a sequence keeps m + F groups
//   (the same count: the CUDA step's level 2 has one page count per sequence);
//   fallback to flat (every page scored): b >= seq_len, C < flat_below_groups, or m + F >= C.
// Level 2 scores the pages of the kept groups, the open group and the tail: as a page mask
// [batch, H, max_blocks] (select_groups, then score_pages_masked, aggregate_gqa and
// select_pages; pages outside the mask score -inf), or as a compact ascending list of
// those pages (select_groups_list; decode_two_level in contract.h scores, aggregates and
// selects over list positions, then maps them back to pages: the same selection, because
// the list keeps the sink pages first, the recent pages and the tail last and ties to the
// lower position are ties to the lower page).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "locks/kv_cache.h"
#include "locks/score.h"
#include "locks/select.h"
#include "locks/summary.h"

// cuda_runtime_api.h's own spelling, so that this header needs no CUDA headers.
typedef struct CUstream_st* cudaStream_t;

namespace locks {

struct SuperLayout {
  int64_t num_slots = 0;  // storage slots (super-pages) held
  int group_pages = 32;   // S: pages per super-page
  int page_size = 16;     // P
  int num_kv_heads = 1;
  int head_dim = 128;
  int rank = 8;  // R: rank of the group basis
  bool extent = true;
};

// Throws unless 2 <= S <= 256, 1 <= R <= min(32, head_dim), head_dim even, P in [2, 256].
void validate_super_layout(const SuperLayout& s);
// Bytes of one (super-page, KV head) summary, and per page it covers.
size_t super_bytes_per_group(const SuperLayout& s);
double super_bytes_per_page(const SuperLayout& s);

struct SuperView {
  SuperLayout layout;
  int8_t* mu_q = nullptr;
  float* mu_scale = nullptr;
  uint8_t* basis_q = nullptr;
  float* basis_scale = nullptr;
  int8_t* coord_q = nullptr;
  float* coord_scale = nullptr;
  uint8_t* radius_q = nullptr;
  float* radius_scale = nullptr;
  int8_t* lo_q = nullptr;  // extent only
  int8_t* hi_q = nullptr;
  float* extent_scale = nullptr;
};

// One (slot, KV head) decoded to floats: mu [d], basis [R*d], coord [S*R], radius [S], and
// lo, hi [S*R] (empty without extent). What every backend and the reference score from.
struct SuperGroupF {
  std::vector<float> mu, basis, coord, radius, lo, hi;
};
SuperGroupF super_dequantize(const SuperView& s, int64_t slot, int head);
// The same into `out`, reusing its vectors' capacity: a loop over groups allocates once.
void super_dequantize_into(const SuperView& s, int64_t slot, int head, SuperGroupF& out);

class SuperStore {
 public:
  explicit SuperStore(const SuperLayout& layout);
  SuperView view();
  const SuperLayout& layout() const { return layout_; }

 private:
  SuperLayout layout_;
  std::vector<int8_t> mu_q_, coord_q_, lo_q_, hi_q_;
  std::vector<uint8_t> basis_q_, radius_q_;
  std::vector<float> mu_scale_, basis_scale_, coord_scale_, radius_scale_, extent_scale_;
};

// Which storage slot holds group g of sequence b: table[b * stride + g] (complete groups
// only are read; entries of other groups may be anything).
struct SuperTableView {
  const int32_t* table = nullptr;
  int64_t stride = 0;
  int max_groups_per_seq = 0;  // >= ceil(max_blocks_per_seq / S)
};

enum class GroupAgg : int { lse = 0, max = 1 };

// Defaults: the design chosen by measurement (docs/study_hierarchical.md): S = 32, R = 8,
// extent on, LSE, alpha = 40, i.e. 1.25 kept groups per budget page slot (m = 1.25 k): even
// when every page the budget needs lies in a different group (scattered relevance), level 2
// can still reach all of them, with a margin for the estimate's misses (alpha 32, m = k,
// was 0.013 of recall below flat LOCKS on Gemma-3's real keys, alpha 40 0.006; the target is
// 0.01); at 1M tokens this costs 1.25 k * S page summaries (4.3 MB per KV head at b = 2048),
// 1-4% of the GPU step against alpha 32, and the step stays ~60x under dense in bytes.
// min_groups = 32: below ~400-token budgets (alpha k / S < 32) level 1 would keep only a few
// groups; on Gemma-3-270M's retrieval tasks (16K and 32K, two seeds) 5-10 kept groups lost
// needles flat LOCKS finds, 16 did not always keep them, 32 did (docs/study_hierarchical.md
// "On a task suite"). 32 groups are 1,024 page summaries at level 2, little where two-level
// pays; contexts of fewer than ~35 complete groups (~18K tokens at S 32) score flat.
struct TwoLevelConfig {
  int min_groups = 32;
  double alpha = 40.0;        // kept groups cover alpha x the budget's page slots
  int flat_below_groups = 8;  // fewer complete groups than this: flat scoring
  int first_groups = 1;       // always kept, on top of the m best (>= 0)
  double gamma = 0.0;         // weight of the centroid residual radius
  GroupAgg agg = GroupAgg::lse;
  bool use_extent = true;  // needs an extent layout
  bool mix = false;        // with use_extent: the mixed estimate
};

// Throws on min_groups < 1, alpha < 1 or not finite, flat_below_groups < 0,
// first_groups < 0, gamma < 0 or not finite.
void validate_two_level(const TwoLevelConfig& cfg);

// The forced groups of a sequence of len tokens: [0, first_end) u [recent_begin, complete)
// (first groups and sink pages at the start, recent pages at the end; the two ranges may
// overlap), count = the size of that union.
struct ForcedGroups {
  int complete = 0, first_end = 0, recent_begin = 0, count = 0;
};
ForcedGroups forced_groups(const TwoLevelConfig& cfg, const SelectConfig& sel, int page_size,
                           int group_pages, int64_t len_tokens);
// The most forced groups any length can have (sizes the level-2 list).
int forced_groups_max(const TwoLevelConfig& cfg, const SelectConfig& sel, int group_pages);

// The kept "other" groups m (on top of the forced ones) by the rule above for a sequence of
// len_tokens tokens, or -1 when the step falls back to flat scoring (every page scored).
// budget_tokens >= len is the caller's (selects_all) case, also -1 here.
int groups_kept(const TwoLevelConfig& cfg, const SelectConfig& sel, int page_size, int group_pages,
                int64_t len_tokens);

// Entries per (sequence, KV head) of the level-2 page list: every page a non-fallback step
// lists ((m + F) S + the open group and tail, at most (m + F + 1) S) and every page of a
// fallback sequence (fewer than (max(m + F, flat_below_groups) + 1) S pages unless the
// budget covers it), capped by max_blocks_per_seq:
//   min(max_blocks_per_seq, (max(m_max + F_max, flat_below_groups) + 1) * S)
// with m_max = max(min_groups, ceil(alpha k / S)), F_max = forced_groups_max.
int two_level_list_capacity(const TwoLevelConfig& cfg, const SelectConfig& sel, int page_size,
                            int group_pages, int max_blocks_per_seq);

// The byte model (docs/study_hierarchical.md): what one decode step reads per (sequence,
// KV head) at len tokens, bf16 K+V and the stored codes; the kept groups m + F (groups_kept
// and forced_groups), the open group's full pages read at level 2 too. On a fallback level1 is 0
// and level2 is every page summary.
struct StepBytes {
  double level1 = 0, level2 = 0, attended = 0;
  double flat = 0;   // flat LOCKS: every page summary + attended
  double dense = 0;  // every token's K+V
  double total() const { return level1 + level2 + attended; }
};
StepBytes two_level_step_bytes(const SuperLayout& super, const SummaryLayout& pages,
                               const TwoLevelConfig& cfg, const SelectConfig& sel, int64_t len);

namespace cpu {
// Builds the super summaries of n groups: group i's pages are the physical blocks
// group_blocks[i * S .. i * S + S) (all full), written to slot slots[i], every KV head.
// Eigen's self-adjoint eigensolver on the d x d covariance, in double; each basis row is
// signed so that its largest |component| (the first of equal ones) is positive (the sign is
// free; fixing it lets backends write the same codes). Throws on
// non-finite keys, ids out of range, or a layout that does not match the cache.
void super_build(const KvCacheView& cache, const int32_t* group_blocks, const int32_t* slots,
                 int64_t n, const SuperView& out);
// Incremental: for each sequence of the batch, if its last `appended` tokens (1 <= appended
// <= S x page_size) completed a group, build that group into slot table[b][group] (the
// decode step's update, as cuda::super_build_filled). Throws on invalid lengths, block ids
// or slots (before writing anything).
void super_build_filled(const KvCacheView& cache, const BatchView& batch, int appended,
                        const SuperTableView& table, const SuperView& out);

// group_head_scores [batch, num_q_heads, max_groups_per_seq]: the group score of every
// complete group, -inf for the others.
void super_score(const SuperView& supers, const SuperTableView& table, const BatchView& batch,
                 const QueryView& q, float scale, const TwoLevelConfig& cfg,
                 float* group_head_scores);

// page_mask [batch, num_kv_heads, max_blocks_per_seq]: 1 for the pages level 2 scores (kept
// groups, the open group, the tail; every page on a fallback), 0 elsewhere.
void select_groups(const float* group_head_scores, const SuperTableView& table,
                   const BatchView& batch, int num_q_heads, int num_kv_heads, int page_size,
                   int group_pages, const SelectConfig& sel, const TwoLevelConfig& cfg,
                   uint8_t* page_mask);

// The same choice as a compact list (the CUDA step's form): page_map [batch, num_kv_heads,
// list_cap] int32, the logical pages level 2 scores in ascending order, -1 padded (every
// page on a fallback), and list_lens [batch] int32, the length in tokens of a sequence made
// of the listed pages (len - (n_pages - listed) * P: the tail page stays partial). Every KV
// head of a sequence lists the same number of pages. Throws when a sequence needs more than
// list_cap entries (two_level_list_capacity is enough).
void select_groups_list(const float* group_head_scores, const SuperTableView& table,
                        const BatchView& batch, int num_q_heads, int num_kv_heads, int page_size,
                        int group_pages, const SelectConfig& sel, const TwoLevelConfig& cfg,
                        int list_cap, int32_t* page_map, int32_t* list_lens);

// score_pages (score.h) on the masked pages only; -inf elsewhere (and at the tail page).
// page_mask [batch, num_kv_heads, max_blocks_per_seq].
void score_pages_masked(const SummaryView& summaries, const BatchView& batch, const QueryView& q,
                        float scale, const uint8_t* page_mask, float* head_scores);
}  // namespace cpu

namespace cuda {
// cpu::super_score and cpu::select_groups_list on the GPU (device pointers; the host checks
// what it can see: shapes, configs, null pointers; device arrays are trusted like a kernel's
// inputs, an invalid length lists no page). super_score: one warp per (sequence, KV head,
// group), the group's codes read once for its G query heads; ranks up to 32.
// select_groups_list: a thread-block cluster of 1-8 blocks per (sequence, KV head), each over
// a span of <= 4096 groups, so max_groups_per_seq up to 32768; cluster 0 = the plan's rule
// (DecodeParams::group_cluster), 1, 2, 4 or 8 to force one: the list is the same bits for
// every size. list_blocks (nullable): [batch, num_kv_heads, list_cap] int32, the listed
// pages' block ids (-1 where the map is -1), the level-2 step's per-head block table.
void super_score(const SuperView& supers, const SuperTableView& table, const BatchView& batch,
                 const QueryView& q, float scale, const TwoLevelConfig& cfg,
                 float* group_head_scores, cudaStream_t stream);
// cpu::super_build on the GPU (device pointers; no allocation, no host synchronisation, so
// capturable): one block per (group, KV head), the covariance in shared memory, its top-R
// eigenvectors by a 16-dimensional subspace iteration and Rayleigh-Ritz in fp32 (the codes
// agree with the CPU build's within one step where the top R + 1 eigenvalues are distinct).
// Shapes: super_build_supported (else Unsupported). Device values are trusted like a
// kernel's inputs: a group whose slot or a block id is out of range is skipped (nothing
// written); a group with a non-finite key gets every code 0 and every scale NaN.
bool super_build_supported(const SuperLayout& layout);  // P 16, S <= 64, R <= 8, d 64/128/256
void super_build(const KvCacheView& cache, const int32_t* group_blocks, const int32_t* slots,
                 int64_t n, const SuperView& out, cudaStream_t stream);
// Incremental, graph-safe (the grid depends on batch_size only): for each sequence of the
// batch (device block_table / seq_lens), if its last `appended` tokens (1 <= appended <=
// S x page_size) completed a group, build that group into slot table[b][group]. Sequences
// whose length, group slot or block ids are out of range are skipped.
void super_build_filled(const KvCacheView& cache, const BatchView& batch, int appended,
                        const SuperTableView& table, const SuperView& out, cudaStream_t stream);
void select_groups_list(const float* group_head_scores, const SuperTableView& table,
                        const BatchView& batch, int num_q_heads, int num_kv_heads, int page_size,
                        int group_pages, const SelectConfig& sel, const TwoLevelConfig& cfg,
                        int list_cap, int32_t* page_map, int32_t* list_lens, cudaStream_t stream,
                        int32_t* list_blocks = nullptr, int cluster = 0);
}  // namespace cuda

namespace ref {
// Float64 restatements (codes dequantized, arithmetic in double) of the cpu:: ops above.
double super_page_estimate(const SuperView& s, int32_t slot, int head, int page, const float* q,
                           float scale, const TwoLevelConfig& cfg);
void super_score(const SuperView& supers, const SuperTableView& table, const BatchView& batch,
                 const QueryView& q, float scale, const TwoLevelConfig& cfg,
                 double* group_head_scores);
void select_groups(const double* group_head_scores, const SuperTableView& table,
                   const BatchView& batch, int num_q_heads, int num_kv_heads, int page_size,
                   int group_pages, const SelectConfig& sel, const TwoLevelConfig& cfg,
                   uint8_t* page_mask);
void select_groups_list(const double* group_head_scores, const SuperTableView& table,
                        const BatchView& batch, int num_q_heads, int num_kv_heads, int page_size,
                        int group_pages, const SelectConfig& sel, const TwoLevelConfig& cfg,
                        int list_cap, int32_t* page_map, int32_t* list_lens);
}  // namespace ref

}  // namespace locks
