// The CUDA plan's workspace regions and derived fields (internal to locks_cuda): one list of
// what each region must hold for the plan's own sizes lays the workspace out (plan_decode) and
// checks, in every run call, a plan that came back from a plan vector (DecodePlan::from_ints:
// caller input, e.g. a Python int list), so that no edited field can make a kernel index past
// its region or the workspace.
#pragma once

#include <cstdint>

#include "locks/plan.h"

namespace locks::cuda::detail {

constexpr int kMaxSplits = 512;  // split-K attention splits a row, dense or sparse (plan_decode)

// Lays the plan's workspace regions out (plan_decode, after its choices): each holds what the
// kernels index with the plan's batch, heads, pages, capacity, chunk counts and splits; the
// two-level regions only with a two-level step. Sets workspace_bytes.
void lay_out_workspace(DecodePlan& plan);

// Throws InvalidArgument (naming `where` and the field) unless the plan's CUDA choices are
// ones plan_decode makes (chunk and cluster sizes from their sets, selection chunks that
// follow from them, partials and splits that cover the pages, at most 512 splits) and every
// region holds what lay_out_workspace gives it without overlapping another.
void check_plan_fields(const DecodePlan& plan, const char* where);

}  // namespace locks::cuda::detail
