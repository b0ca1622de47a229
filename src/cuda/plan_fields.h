// The CUDA plan's derived fields and workspace regions (internal to locks_cuda): what each
// region must hold for the plan's own sizes, used by plan_decode to lay the workspace out and
// by every run call to check a plan that came back from a plan vector (DecodePlan::from_ints:
// caller input, e.g. a Python int list), so that no edited field can make a kernel index past
// its region or the workspace.
#pragma once

#include <cstdint>

#include "locks/plan.h"

namespace locks::cuda::detail {

constexpr int kMaxSplits = 512;  // split-K attention splits a row, dense or sparse (plan_decode)

// Bytes each region needs for a plan's batch, heads, pages, capacity, chunk counts and
// splits (regions of steps the plan does not run: 0).
struct RegionNeeds {
  int64_t head_scores, chunk_lse, group_scores, head_lse, pages, counts, cand_key, cand_idx,
      cand_cnt, part_o, part_ml, super_scores, page_map, list_blocks, list_lens;
};
RegionNeeds region_needs(const DecodePlan& plan);

// Throws InvalidArgument (naming `where` and the field) unless the plan's CUDA choices are
// ones plan_decode makes (chunk and cluster sizes from their sets, selection chunks that
// follow from them, partials and splits that cover the pages, at most 512 splits) and every
// region holds region_needs without overlapping another.
void check_plan_fields(const DecodePlan& plan, const char* where);

}  // namespace locks::cuda::detail
