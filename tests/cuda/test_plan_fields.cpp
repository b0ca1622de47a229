// The CUDA run calls' check of a plan's derived fields (src/cuda/plan_fields.h) as host code:
// no GPU needed, so it runs in the CPU CI too. A plan laid out the way plan_decode lays one out
// (lay_out_workspace, plan_decode's own layout) passes; each edit of a derived field, a region or
// the workspace size is refused with a message naming the plan.
#include <gtest/gtest.h>

#include <functional>
#include <iterator>
#include <string>

#include "../../src/cuda/plan_fields.h"
#include "locks/error.h"
#include "locks/summary.h"

namespace locks::cuda_test {
namespace {

using locks::cuda::detail::check_plan_fields;
using locks::cuda::detail::lay_out_workspace;

// Llama-3.1-8B shapes, 2 sequences of 1024 pages, budget 2048 (128 pages), laid out as
// plan_decode does for choices it can make (128-page score chunks, 2048-page selection chunks,
// a cluster of 2, splits of 4 sparse / 16 dense pages).
DecodePlan host_plan(bool two_level = false) {
  DecodePlan p;
  p.backend = Backend::cuda;
  DecodeParams& q = p.params;
  q.cache = {4096, 16, 8, 128, DType::bf16};
  q.summary = summary_layout_for(q.cache, 8, Precision::quant);
  q.num_q_heads = 32, q.max_batch = 2, q.max_blocks_per_seq = 1024;
  q.select = SelectConfig{2048, 1, 2};
  q.two_level = two_level;
  p.group = 4;
  p.capacity = 128;
  p.score_chunk_pages = 128, p.score_chunks = 1024 / 32;
  p.select_chunk_pages = 2048, p.select_chunks = 1, p.select_cluster = 2;
  p.sparse_pages_per_split = 4, p.sparse_splits = 32;
  p.dense_pages_per_split = 16, p.dense_splits = 64;
  if (two_level) {
    p.list_cap = 1000, p.max_groups = 32, p.group_cluster = 1;
    p.l2_score_chunk_pages = 32, p.l2_select_chunk_pages = 2048, p.l2_select_chunks = 1;
    p.l2_select_cluster = 2;
  }
  lay_out_workspace(p);
  return p;
}

bool refused(const DecodePlan& p) {
  try {
    check_plan_fields(p, "test");
  } catch (const InvalidArgument& e) {
    return std::string(e.what()).find("plan") != std::string::npos;
  }
  return false;
}

TEST(CudaPlanFields, LaidOutPlansPass) {
  EXPECT_NO_THROW(check_plan_fields(host_plan(), "test"));
  EXPECT_NO_THROW(check_plan_fields(host_plan(true), "test"));
  // Counts that cover more pages than M are accepted (the two-level step's level-2 copy of the
  // plan keeps the full plan's partials and splits over list_cap pages).
  DecodePlan p = host_plan();
  p.params.max_blocks_per_seq = 512;
  p.select_chunks = 1;
  EXPECT_NO_THROW(check_plan_fields(p, "test"));
}

TEST(CudaPlanFields, EditedFieldsAreRefused) {
  const std::function<void(DecodePlan&)> edits[] = {
      [](DecodePlan& p) { p.score_chunk_pages = 48; },
      [](DecodePlan& p) { p.score_chunks -= 1; },
      [](DecodePlan& p) { p.select_chunk_pages = 1024; },
      [](DecodePlan& p) { p.select_chunks = 2; },
      [](DecodePlan& p) { p.select_cluster = 3; },
      [](DecodePlan& p) { p.select_cluster = 32; },
      [](DecodePlan& p) { p.params.select.tau = 0.5f; },  // a cluster with the adaptive budget
      [](DecodePlan& p) { p.sparse_pages_per_split = 0; },
      [](DecodePlan& p) { p.sparse_splits -= 1; },
      [](DecodePlan& p) { p.sparse_splits = 513; },
      [](DecodePlan& p) { p.dense_pages_per_split = -16; },
      [](DecodePlan& p) { p.dense_splits = 600; },
      [](DecodePlan& p) { p.part_o.bytes -= 4; },
      [](DecodePlan& p) { p.params.max_batch = 3; },  // every region now too small
      [](DecodePlan& p) { p.params.cache.head_dim = 256; },
      [](DecodePlan& p) { p.head_scores.offset = p.part_ml.offset; },
      [](DecodePlan& p) { p.workspace_bytes -= 256; },
      [](DecodePlan& p) { p.pages.offset = -256; },
  };
  for (size_t i = 0; i < std::size(edits); ++i) {
    DecodePlan p = host_plan();
    edits[i](p);
    EXPECT_TRUE(refused(p)) << "edit " << i;
  }
  const std::function<void(DecodePlan&)> two_level_edits[] = {
      [](DecodePlan& p) { p.l2_score_chunk_pages = 40; },
      [](DecodePlan& p) { p.l2_select_chunks = 3; },
      [](DecodePlan& p) { p.l2_select_cluster = 5; },
      [](DecodePlan& p) { p.list_cap = 2048; },  // more than max_blocks_per_seq
      [](DecodePlan& p) { p.page_map.bytes -= 4; },
  };
  for (size_t i = 0; i < std::size(two_level_edits); ++i) {
    DecodePlan p = host_plan(true);
    two_level_edits[i](p);
    EXPECT_TRUE(refused(p)) << "two-level edit " << i;
  }
}

}  // namespace
}  // namespace locks::cuda_test
