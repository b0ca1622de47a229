// What every backend's plan_decode and run calls share: the parameter checks, workspace
// region bookkeeping and the run-time checks of a call against its plan (private to the
// libraries; the public contract is include/locks/contract.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <utility>

#include "locks/plan.h"
#include "locks/score.h"

namespace locks::detail {

// Validates params for backend (InvalidArgument / Unsupported) and fills params (scale
// resolved), backend, group and capacity.
DecodePlan plan_common(const DecodeParams& params, Backend backend);

// The product of non-negative factors, saturating at INT64_MAX: region sizes from the fields
// of a plan vector a caller handed in, which may be any ints (no overflow, no wrap to small).
inline int64_t sat_product(std::initializer_list<int64_t> factors) {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  int64_t r = 1;
  for (int64_t f : factors) {
    if (f < 0) return kMax;
    if (f == 0) return 0;
    if (r > kMax / f)
      r = kMax;
    else
      r *= f;
  }
  return r;
}

// A plan's workspace region and the bytes its run calls index there.
using RegionNeed = std::pair<const WorkspaceRegion*, int64_t>;
inline constexpr size_t kMaxRegions = 16;
// Every region of regions[0, n <= kMaxRegions) lies inside plan.workspace_bytes and holds what it
// needs, and no two non-empty regions overlap (a plan vector is caller input: plan.h, from_ints).
void check_regions(const DecodePlan& plan, const RegionNeed* regions, size_t n, const char* where);

// Hands out 256-byte aligned regions of a workspace in order.
class RegionAlloc {
 public:
  WorkspaceRegion add(int64_t bytes) {
    if (bytes <= 0) return {top_, 0};
    const WorkspaceRegion r{top_, bytes};
    top_ += (bytes + 255) / 256 * 256;
    return r;
  }
  int64_t total() const { return top_; }

 private:
  int64_t top_ = 0;
};

// Run-time checks of a call against its plan (host-visible fields only).
void check_plan_backend(const DecodePlan& plan, Backend backend, const char* where);
void check_workspace(const DecodePlan& plan, const Workspace& ws, const char* where);
void check_run_batch(const DecodePlan& plan, const BatchView& batch, const char* where);
void check_run_cache(const DecodePlan& plan, const CacheLayout& cache, const char* where);
void check_run_summary(const DecodePlan& plan, const SummaryLayout& summary, const char* where);
void check_run_query(const DecodePlan& plan, const QueryView& q, const char* where);
// Two-level runs: the super summaries' layout is the planned one (plan.params.super) and the
// super table holds the plan's groups a sequence.
void check_run_super(const DecodePlan& plan, const SuperLayout& supers,
                     const SuperTableView& super_table, const char* where);
template <typename T>
T* region_ptr(const Workspace& ws, const WorkspaceRegion& r) {
  return reinterpret_cast<T*>(static_cast<char*>(ws.data) + r.offset);
}

}  // namespace locks::detail
