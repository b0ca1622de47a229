// decode()'s host checks and its selection, shared with decode_bucketed (length_buckets.cu),
// which checks every bucket's step before it records any of them.
#pragma once

#include "locks/contract.h"

namespace locks::cuda::detail {

// selection_out, or the plan's own regions of the workspace when it is null.
Selection decode_selection(const DecodePlan& plan, const Workspace& ws,
                           const Selection* selection_out);
// Throws (locks::Error, under `where`) what decode() would throw for these arguments.
void check_decode(const DecodePlan& plan, const Workspace& ws, const KvCacheView& cache,
                  const SummaryView& summaries, const BatchView& batch, const QueryView& q,
                  const AttentionOutput& out, const Selection* selection_out, const char* where);

}  // namespace locks::cuda::detail
