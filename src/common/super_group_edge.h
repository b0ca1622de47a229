// Which group a sequence's last `appended` tokens completed (cpu:: and cuda::
// super_build_filled), as a pure function of its length, shared by the CPU build, the kernel
// and a host test (tests/cuda/test_super_group_edge.cpp: no GPU needed).
#pragma once

#include <cstdint>

#include "locks/super_summary.h"

#if defined(__CUDACC__)
#define LOCKS_HOST_DEVICE __host__ __device__
#else
#define LOCKS_HOST_DEVICE
#endif

namespace locks::detail {

// len: the sequence's length after the step (untrusted: outside [1, max_blocks * page_size]
// gives -1); appended in [1, group_tokens] (checked by the caller); group_tokens = S * page
// size. Returns the index of the group whose last token is among the last `appended` ones,
// or -1 (none completed, or the group is past max_groups).
LOCKS_HOST_DEVICE inline int completed_group(int32_t len, int appended, int group_tokens,
                                             int max_blocks, int page_size, int max_groups) {
  if (len < 1 || int64_t(len) > int64_t(max_blocks) * page_size) return -1;
  const int32_t before = len > appended ? len - appended : 0;
  if (len / group_tokens == before / group_tokens) return -1;
  const int g = len / group_tokens - 1;
  return g < max_groups ? g : -1;
}

// The host checks of a super_build_filled call shared by both backends (throw
// InvalidArgument naming `where`): appended in [1, S x P], a batch with arrays, a block-table
// stride that holds its rows, a super table with a row wide enough for every complete group.
// Returns that number of groups, max_blocks_per_seq / S. (Host only: super_layout.cpp.)
int check_filled_args(const SuperLayout& l, const BatchView& batch, int appended,
                      const SuperTableView& table, const char* where);

}  // namespace locks::detail
