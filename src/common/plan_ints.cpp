// DecodePlan::to_ints / from_ints: the plan as a fixed-length int64 vector (plan.h).
#include <cstring>
#include <limits>
#include <type_traits>

#include "locks/error.h"
#include "locks/plan.h"
#include "locks/rules.h"
#include "plan_common.h"

namespace locks {
namespace {

// Every field after the fixed head (workspace_bytes, capacity, tag, backend), in order.
// f is called with a reference to each; the same list serves both directions.
template <typename Plan, typename F>
void fields(Plan& p, F&& f) {
  auto& c = p.params.cache;
  f(c.num_blocks), f(c.page_size), f(c.num_kv_heads), f(c.head_dim), f(c.dtype);
  auto& s = p.params.summary;
  f(s.num_blocks), f(s.page_size), f(s.num_kv_heads), f(s.head_dim), f(s.rank), f(s.precision);
  f(s.basis_group);
  f(p.params.num_q_heads), f(p.params.max_batch), f(p.params.max_blocks_per_seq);
  f(p.params.select.budget_tokens), f(p.params.select.sink_pages), f(p.params.select.recent_pages);
  f(p.params.select.tau), f(p.params.select.floor_pages);
  f(p.params.scale), f(p.params.score_chunk_pages), f(p.params.select_chunk_pages);
  f(p.params.select_cluster), f(p.select_cluster);
  f(p.group), f(p.threads), f(p.score_chunks), f(p.score_chunk_pages), f(p.select_chunks),
      f(p.select_chunk_pages), f(p.dense_pages_per_split), f(p.dense_splits),
      f(p.sparse_pages_per_split), f(p.sparse_splits);
  for (auto* r : {&p.head_scores, &p.group_scores, &p.pages, &p.counts, &p.chunk_lse, &p.head_lse,
                  &p.cand_key, &p.cand_idx, &p.cand_cnt, &p.part_o, &p.part_ml, &p.scratch})
    f(r->offset), f(r->bytes);
  // v5: the two-level step.
  auto& t = p.params.two;
  f(p.params.two_level), f(t.min_groups), f(t.alpha), f(t.flat_below_groups), f(t.first_groups);
  f(t.gamma), f(t.agg), f(t.use_extent), f(t.mix);
  auto& u = p.params.super;
  f(u.num_slots), f(u.group_pages), f(u.page_size), f(u.num_kv_heads), f(u.head_dim), f(u.rank);
  f(u.extent);
  f(p.list_cap), f(p.max_groups), f(p.l2_score_chunk_pages), f(p.l2_select_chunks),
      f(p.l2_select_chunk_pages), f(p.l2_select_cluster);
  for (auto* r : {&p.super_scores, &p.page_map, &p.list_blocks, &p.list_lens})
    f(r->offset), f(r->bytes);
  // v6: the minimum context.
  f(p.params.select.dense_below);
  // v7: the group choice's cluster size.
  f(p.params.group_cluster), f(p.group_cluster);
  // v8: the forced attention split.
  f(p.params.attn_pages_per_split);
}

constexpr int kHead = 4;
constexpr int kFields = 23 + 2 + 10 + 24 + 16 + 6 + 8 + 1 + 2 + 1;
static_assert(kHead + kFields <= int(DecodePlan::kNumInts), "kNumInts too small");

template <typename T>
int64_t to_int(const T& x) {
  if constexpr (std::is_same_v<T, float>) {
    uint32_t u;
    std::memcpy(&u, &x, 4);
    return int64_t(u);
  } else if constexpr (std::is_same_v<T, double>) {
    int64_t u;
    std::memcpy(&u, &x, 8);
    return u;
  } else {
    return static_cast<int64_t>(x);
  }
}

template <typename T>
void from_int(int64_t v, T& x) {
  if constexpr (std::is_same_v<T, float>) {
    const auto u = static_cast<uint32_t>(v);
    std::memcpy(&x, &u, 4);
  } else if constexpr (std::is_same_v<T, double>) {
    std::memcpy(&x, &v, 8);
  } else if constexpr (std::is_enum_v<T>) {
    x = static_cast<T>(v);
  } else {
    LOCKS_REQUIRE(
        v >= int64_t(std::numeric_limits<T>::min()) && v <= int64_t(std::numeric_limits<T>::max()),
        "plan field value ", v, " out of range");
    x = static_cast<T>(v);
  }
}

}  // namespace

std::vector<int64_t> DecodePlan::to_ints() const {
  std::vector<int64_t> v(kNumInts, 0);
  v[kIntWorkspaceBytes] = int64_t(workspace_bytes);
  v[kIntCapacity] = capacity;
  v[kIntTag] = kTag;
  v[kIntBackend] = int64_t(backend);
  size_t i = kHead;
  fields(*this, [&](const auto& x) { v[i++] = to_int(x); });
  return v;
}

DecodePlan DecodePlan::from_ints(const int64_t* v, size_t n) {
  LOCKS_REQUIRE(v != nullptr && n == kNumInts, "a plan vector has ", kNumInts, " elements, got ",
                n);
  LOCKS_REQUIRE(v[kIntTag] == kTag, "not a plan vector (tag ", v[kIntTag], ")");
  DecodePlan p;
  LOCKS_REQUIRE(v[kIntWorkspaceBytes] >= 0, "negative workspace_bytes");
  p.workspace_bytes = size_t(v[kIntWorkspaceBytes]);
  from_int(v[kIntCapacity], p.capacity);
  LOCKS_REQUIRE(v[kIntBackend] == 0 || v[kIntBackend] == 1, "unknown backend code ",
                v[kIntBackend]);
  p.backend = static_cast<Backend>(v[kIntBackend]);
  size_t i = kHead;
  fields(p, [&](auto& x) { from_int(v[i++], x); });
  for (size_t j = i; j < n; ++j)  // room for later fields: a vector written by this version
    LOCKS_REQUIRE(v[j] == 0, "plan vector element ", j, " must be 0 (unused), got ", v[j]);
  // Consistency: the parameters pass every check plan_decode makes (plan_common: layouts,
  // select rules, the backend's shape support, the two-level rules), and the fields derived
  // from them are plan_common's. Regions are the backend's to check against what its run
  // calls index (cpu: check_call; cuda: check_plan_fields); here only inside the workspace.
  const DecodeParams& q = p.params;
  LOCKS_REQUIRE(q.scale > 0.0f, "plan vector scale ", q.scale, " is not a resolved scale");
  DecodePlan base;
  try {
    base = detail::plan_common(q, p.backend);
  } catch (const InvalidArgument&) {
    throw;
  } catch (const Error& e) {  // Unsupported: a vector no plan_decode wrote
    throw InvalidArgument(std::string("plan vector: ") + e.what());
  }
  LOCKS_REQUIRE(p.threads >= 1, "plan vector threads ", p.threads, " < 1");
  LOCKS_REQUIRE(p.group == base.group, "plan vector group ", p.group,
                " is not num_q_heads / num_kv_heads = ", base.group);
  LOCKS_REQUIRE(p.capacity == base.capacity, "plan vector capacity ", p.capacity,
                " is not the budget rule's");
  if (q.two_level)
    LOCKS_REQUIRE(p.list_cap == base.list_cap && p.max_groups == base.max_groups &&
                      p.group_cluster >= 0 && p.group_cluster <= 8 &&
                      (p.group_cluster & (p.group_cluster - 1)) == 0,
                  "inconsistent two-level fields in the plan vector");
  auto inside = [&](const WorkspaceRegion& r) {
    LOCKS_REQUIRE(r.offset >= 0 && r.bytes >= 0 && r.offset % 256 == 0 &&
                      uint64_t(r.offset) + uint64_t(r.bytes) <= p.workspace_bytes,
                  "plan vector region outside the workspace");
  };
  for (const WorkspaceRegion* r :
       {&p.head_scores, &p.group_scores, &p.pages, &p.counts, &p.chunk_lse, &p.head_lse,
        &p.cand_key, &p.cand_idx, &p.cand_cnt, &p.part_o, &p.part_ml, &p.scratch})
    inside(*r);
  if (q.two_level)
    for (const WorkspaceRegion* r : {&p.super_scores, &p.page_map, &p.list_blocks, &p.list_lens})
      inside(*r);
  return p;
}

}  // namespace locks
