// The host-only ops: plan (DecodeParams -> the plan vector) and supports (the capability
// query). Implemented in ops_plan.cpp.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

namespace locks_torch {

std::vector<int64_t> plan(int64_t backend, int64_t num_blocks, int64_t page_size,
                          int64_t num_kv_heads, int64_t head_dim, at::ScalarType kv_dtype,
                          int64_t rank, int64_t precision, int64_t num_q_heads, int64_t max_batch,
                          int64_t max_blocks_per_seq, int64_t budget_tokens, int64_t sink_pages,
                          int64_t recent_pages, double scale, double tau, int64_t floor_pages,
                          int64_t dense_below, int64_t group_pages, int64_t super_slots,
                          int64_t super_rank, double alpha, int64_t min_groups,
                          int64_t flat_below_groups);

std::vector<int64_t> length_buckets(at::IntArrayRef plan, int64_t max_buckets, int64_t min_pages);

std::string supports(int64_t backend, int64_t head_dim, int64_t page_size, int64_t group,
                     at::ScalarType kv_dtype, int64_t rank, int64_t precision);

}  // namespace locks_torch
