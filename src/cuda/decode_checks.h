// decode()'s and score_select()'s host checks, shared with the bucketed forms (length_buckets.cu),
// which check every bucket's call before they record any of them.
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

// Throws what score_select() would throw for these arguments.
void check_score_select(const DecodePlan& plan, const Workspace& ws, const SummaryView& s,
                        const BatchView& batch, const QueryView& q, const Selection& out,
                        const char* where);

}  // namespace locks::cuda::detail
