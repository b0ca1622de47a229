// Which group a sequence's last `appended` tokens completed (cpu:: and cuda::
// super_build_filled), as a pure function of its length, shared by the CPU build, the kernel
// and a host test (tests/cuda/test_super_group_edge.cpp: no GPU needed).
#pragma once

#include <cstdint>

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

}  // namespace locks::detail
