// Launch helper for the step's own kernels, with optional programmatic dependent launch
// (PDL, kProgrammaticLaunch below; off): with it, each kernel is launched with programmatic
// stream serialisation, so the next kernel's grid is set up and its blocks are placed while
// the previous one drains, instead of after it (the launch gap between the short kernels of
// a decode step). Every kernel launched this way calls
// pdl_wait() before touching global memory (it returns once the previous grid has finished
// and its writes are visible), then pdl_trigger() to let its own successor start early.
// Without a predecessor in the stream, or with one that never triggers, this is a plain
// launch. Also valid under stream capture (programmatic graph edges).
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include "common.cuh"

namespace locks::cuda::detail {

// Off: measured on the H200 (v11, docs/cuda_notes.md), PDL made the 128K batch 8 step no
// faster and the 1M batch 1 step 4 us slower (0.2075 -> 0.2118 ms) than plain launches.
// false: plain stream-ordered launches (griddepcontrol.wait then returns at once).
constexpr bool kProgrammaticLaunch = false;

__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;\n" ::: "memory"); }
__device__ __forceinline__ void pdl_trigger() {
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
}

template <typename... KArgs, typename... Args>
void launch_pdl(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t st,
                Args&&... args) {
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = st;
  cfg.attrs = attr;
  cfg.numAttrs = kProgrammaticLaunch ? 1 : 0;
  LOCKS_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
}

}  // namespace locks::cuda::detail
